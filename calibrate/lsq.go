package calibrate

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/gonum/mat"

	"github.com/inferrail/inferrail/engine"
)

// CoefNames are the profile's coefficients in the order of Row.X, as YAML
// names them, then the client-side overhead of a TTFT measurement (HTTP,
// tokenization, streaming), which is fitted but is no part of the profile.
var CoefNames = [NumCoefs]string{"step_fixed_ms", "prefill_token_us", "prefill_pair_ns", "decode_seq_us", "decode_ctx_token_ns", "ttft_overhead_ms"}

// NumCoefs is the number of fitted coefficients: the profile's five and the
// TTFT overhead.
const NumCoefs = 6

// Row is one linear observation of the latency model: a measured time Y (ms)
// equals X · (step_fixed_ms, prefill_token_us, prefill_pair_ns,
// decode_seq_us, decode_ctx_token_ns). X holds, in order: the number of
// steps, prefill tokens / 1e3, prefill pairs / 1e6, decode sequence-steps /
// 1e3, decode context tokens / 1e6 (so that the coefficients come out in
// the profile's units), and 1 for a TTFT measurement (its fixed overhead).
type Row struct {
	X [NumCoefs]float64 `json:"x"`
	Y float64           `json:"y_ms"`
	// Probe indexes the measurement the row came from.
	Probe int `json:"probe"`
}

// PrefillRow models a request alone on an idle engine: u new prompt tokens
// after c cached ones, prefilled in chunks of at most budget tokens (0: one
// chunk); its TTFT is the sum of the chunks' step times.
func PrefillRow(u, c, budget int) Row {
	r := Row{X: [NumCoefs]float64{5: 1}}
	if budget <= 0 {
		budget = u
	}
	for done := 0; done < u; {
		n := min(budget, u-done)
		ctx := c + done
		r.X[0]++
		r.X[1] += float64(n) / 1e3
		r.X[2] += float64(n) * (float64(ctx) + float64(n)/2) / 1e6
		done += n
	}
	return r
}

// DecodeRow models one decode step of b sequences reading ctx context tokens
// in all (each sequence's prompt plus the tokens it has generated).
func DecodeRow(b int, ctx float64) Row {
	return Row{X: [NumCoefs]float64{1, 0, 0, float64(b) / 1e3, ctx / 1e6, 0}}
}

// Coefficient is one fitted coefficient with its standard error.
type Coefficient struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	StdErr float64 `json:"std_err"`
	// Clamped reports that the unconstrained fit was negative and the
	// coefficient was fixed at zero.
	Clamped bool `json:"clamped,omitempty"`
}

// LinearFit is the result of FitRows.
type LinearFit struct {
	Profile      engine.Profile `json:"profile"`
	Coefficients []Coefficient  `json:"coefficients"`
	Rows         int            `json:"rows"`
	// RelRMS is the root mean square of the relative residuals (pred-y)/y
	// of the rows fitted (outliers left out).
	RelRMS float64 `json:"rel_rms"`
	// Outliers indexes the rows left out of the fit as too far off it.
	Outliers []int `json:"outliers,omitempty"`
	// Condition is the condition number of the weighted design matrix with
	// unit-norm columns.
	Condition float64 `json:"condition"`
}

// MaxVIF is the largest variance inflation factor FitRows accepts: beyond it
// a coefficient's feature is so close to a combination of the others that
// the design cannot tell them apart.
const MaxVIF = 1e4

// featureHints say what probes make each coefficient identifiable.
var featureHints = [NumCoefs]string{
	"add decode probes (any batch) or cold prompts longer than max_num_batched_tokens, so the number of steps varies independently of the token counts",
	"add single cold prompts of several lengths (for example 64 to 4096 tokens)",
	"add long cold prompts (several thousand tokens) and cached-prefix probes with a long cached prefix and a short new suffix",
	"add concurrent decode probes with several batch sizes (for example 1, 8, 32) at similar total context",
	"add concurrent decode probes with several context lengths (short and long prompts) at the same batch size",
	"add cold prompts longer than max_num_batched_tokens (several chunks) next to short ones",
}

// Measurement noise assumed by FitRows: a row's time y (ms) is taken to
// carry a relative error of RelNoise and an absolute one of AbsNoiseMs
// (timer, HTTP and scheduling jitter of the client and the server), so its
// standard deviation is sqrt((RelNoise*y)² + AbsNoiseMs²). Weighting by
// 1/y alone would let a 0.5 ms jitter on a 12 ms TTFT outweigh a long
// prefill that alone separates prefill_pair from prefill_token.
const (
	RelNoise   = 0.005
	AbsNoiseMs = 0.5
)

// rowSD is the standard deviation FitRows assumes for a row measuring y ms.
func rowSD(y float64) float64 { return math.Hypot(RelNoise*y, AbsNoiseMs) }

// FitRows fits the five coefficients (and the TTFT overhead) by weighted
// least squares, each row weighted by the inverse of its assumed standard
// deviation (see RelNoise): relative for long measurements, absolute for
// short ones. It refuses a design that cannot identify every coefficient: a
// feature no row exercises, or one whose variance inflation factor exceeds
// MaxVIF, is reported with the probes to add. A coefficient that comes out
// negative is fixed at zero and the rest refitted.
func FitRows(rows []Row) (*LinearFit, error) {
	const p = NumCoefs
	if len(rows) < p+1 {
		return nil, fmt.Errorf("least squares needs more than %d measurements, got %d; run a bigger design", p, len(rows))
	}
	for i, r := range rows {
		if !(r.Y > 0) || math.IsInf(r.Y, 0) {
			return nil, fmt.Errorf("measurement %d: time %v ms must be positive and finite", i, r.Y)
		}
	}
	n := len(rows)
	x := mat.NewDense(n, p, nil)
	target := mat.NewVecDense(n, nil)
	for i, r := range rows {
		sd := rowSD(r.Y)
		for j := range p {
			x.Set(i, j, r.X[j]/sd)
		}
		target.SetVec(i, r.Y/sd)
	}
	// Identifiability: unit-norm columns, then each column against the rest.
	norms := make([]float64, p)
	for j := range p {
		norms[j] = mat.Norm(x.ColView(j), 2)
		if norms[j] == 0 {
			return nil, fmt.Errorf("%s is not identifiable: no measurement exercises it; %s", CoefNames[j], featureHints[j])
		}
	}
	xs := mat.NewDense(n, p, nil)
	for i := range n {
		for j := range p {
			xs.Set(i, j, x.At(i, j)/norms[j])
		}
	}
	var svd mat.SVD
	if !svd.Factorize(xs, mat.SVDNone) {
		return nil, errors.New("least squares: singular value decomposition failed")
	}
	cond := svd.Cond()
	var bad []string
	for j := range p {
		if v := vif(xs, j); v > MaxVIF {
			bad = append(bad, fmt.Sprintf("%s (variance inflation %.3g): %s", CoefNames[j], v, featureHints[j]))
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("the design cannot identify every coefficient (condition number %.3g); %s", cond, strings.Join(bad, "; "))
	}

	// Leave out rows far off the fit (a step the server started late, a
	// descheduled client: delays that only ever add time, tens of ms on a
	// loaded machine). The first cut is against a least-absolute-deviations
	// fit, which a few such rows cannot pull far (least squares would, and
	// then cut good rows instead); then least squares on the rest, cutting
	// again while rows stand out.
	keep := make([]bool, n)
	for i := range keep {
		keep[i] = true
	}
	var outliers []int
	if start, ok := ladFit(x, target); ok {
		outliers = outlierRows(x, target, keep, start, n/5)
		for _, i := range outliers {
			keep[i] = false
		}
	}
	var beta, se [p]float64
	var clamped [p]bool
	for round := 0; ; round++ {
		var err error
		beta, se, clamped, err = solveClamped(x, target, keep)
		if err != nil {
			return nil, err
		}
		if round == maxOutlierRounds {
			break
		}
		drop := outlierRows(x, target, keep, beta, max(0, n/5-len(outliers)))
		if len(drop) == 0 {
			break
		}
		for _, i := range drop {
			keep[i] = false
		}
		outliers = append(outliers, drop...)
	}
	slices.Sort(outliers)
	fit := &LinearFit{Rows: n, Condition: cond, Outliers: outliers}
	var ss float64
	for i, r := range rows {
		if !keep[i] {
			continue
		}
		pred := 0.0
		for j := range p {
			pred += r.X[j] * beta[j]
		}
		d := (pred - r.Y) / r.Y
		ss += d * d
	}
	fit.RelRMS = math.Sqrt(ss / float64(n-len(outliers)))
	fit.Profile = fromCoefs(beta[:5])
	for j := range p {
		fit.Coefficients = append(fit.Coefficients, Coefficient{Name: CoefNames[j], Value: beta[j], StdErr: se[j], Clamped: clamped[j]})
	}
	if fit.Profile.StepFixedMs <= 0 || fit.Profile.PrefillTokenUs <= 0 {
		return fit, fmt.Errorf("least squares gave step_fixed_ms %.4g and prefill_token_us %.4g, both must be positive: the measurements do not follow the latency model (check the engine was idle and the prompt lengths)", fit.Profile.StepFixedMs, fit.Profile.PrefillTokenUs)
	}
	return fit, nil
}

// Outlier rejection in FitRows: a row whose residual exceeds OutlierZ
// times the larger of its assumed standard deviation and the robust spread
// of all residuals (1.4826 x their median absolute value, in units of the
// assumed deviations) is left out, at most a fifth of the rows, over at
// most maxOutlierRounds refits.
const (
	OutlierZ         = 3.0
	maxOutlierRounds = 3
)

// ladFit returns the least-absolute-deviations fit of x·beta = target,
// by iteratively reweighted least squares (every coefficient free); ok is
// false when the system cannot be solved.
func ladFit(x *mat.Dense, target *mat.VecDense) (beta [NumCoefs]float64, ok bool) {
	n, p := x.Dims()
	var all [NumCoefs]bool
	for j := range all {
		all[j] = true
	}
	beta, _, err := solveActive(x, target, all)
	if err != nil {
		return beta, false
	}
	xw := mat.NewDense(n, p, nil)
	tw := mat.NewVecDense(n, nil)
	for range 100 {
		for i := range n {
			pred := 0.0
			for j := range p {
				pred += x.At(i, j) * beta[j]
			}
			// Weight 1/|r| (rows scaled by its root); residuals are in
			// units of the assumed deviation, so 1e-3 is far below noise.
			w := 1 / math.Sqrt(max(math.Abs(target.AtVec(i)-pred), 1e-3))
			for j := range p {
				xw.Set(i, j, x.At(i, j)*w)
			}
			tw.SetVec(i, target.AtVec(i)*w)
		}
		next, _, err := solveActive(xw, tw, all)
		if err != nil {
			return beta, true
		}
		moved := 0.0
		for j := range p {
			moved = max(moved, math.Abs(next[j]-beta[j])/(1+math.Abs(beta[j])))
		}
		beta = next
		if moved < 1e-9 {
			break
		}
	}
	return beta, true
}

// solveClamped fits the kept rows, fixing at zero, one at a time, the most
// negative coefficient until none is negative.
func solveClamped(x *mat.Dense, target *mat.VecDense, keep []bool) (beta, se [NumCoefs]float64, clamped [NumCoefs]bool, err error) {
	n, p := x.Dims()
	var idx []int
	for i := range n {
		if keep[i] {
			idx = append(idx, i)
		}
	}
	xs := mat.NewDense(len(idx), p, nil)
	ts := mat.NewVecDense(len(idx), nil)
	for k, i := range idx {
		xs.SetRow(k, x.RawRowView(i))
		ts.SetVec(k, target.AtVec(i))
	}
	var active [NumCoefs]bool
	for j := range active {
		active[j] = true
	}
	for {
		beta, se, err = solveActive(xs, ts, active)
		if err != nil {
			return beta, se, clamped, err
		}
		worst, wv := -1, 0.0
		for j := range NumCoefs {
			if active[j] && beta[j] < wv {
				worst, wv = j, beta[j]
			}
		}
		if worst < 0 {
			return beta, se, clamped, nil
		}
		active[worst], clamped[worst] = false, true
	}
}

// outlierRows returns up to most kept rows whose weighted residual (in
// units of their assumed standard deviation) is beyond OutlierZ times the
// larger of 1 and the residuals' robust spread, the worst first.
func outlierRows(x *mat.Dense, target *mat.VecDense, keep []bool, beta [NumCoefs]float64, most int) []int {
	if most <= 0 {
		return nil
	}
	n, p := x.Dims()
	type res struct {
		i int
		z float64
	}
	var rs []res
	var abs []float64
	for i := range n {
		if !keep[i] {
			continue
		}
		pred := 0.0
		for j := range p {
			pred += x.At(i, j) * beta[j]
		}
		z := math.Abs(target.AtVec(i) - pred)
		rs = append(rs, res{i, z})
		abs = append(abs, z)
	}
	if len(rs) <= NumCoefs+1 {
		return nil
	}
	slices.Sort(abs)
	spread := 1.4826 * abs[len(abs)/2]
	limit := OutlierZ * max(1, spread)
	slices.SortFunc(rs, func(a, b res) int { return cmp.Compare(b.z, a.z) })
	var out []int
	for _, r := range rs {
		if r.z <= limit || len(out) == most || len(rs)-len(out) <= NumCoefs+1 {
			break
		}
		out = append(out, r.i)
	}
	return out
}

// solveActive solves the least squares x·beta = target (both already
// weighted) over the active columns, returning the coefficients and their
// standard errors.
func solveActive(x *mat.Dense, target *mat.VecDense, active [NumCoefs]bool) (beta, se [NumCoefs]float64, err error) {
	n, _ := x.Dims()
	var cols []int
	for j, a := range active {
		if a {
			cols = append(cols, j)
		}
	}
	k := len(cols)
	if k == 0 {
		return beta, se, errors.New("least squares: every coefficient came out negative")
	}
	a := mat.NewDense(n, k, nil)
	for i := range n {
		for c, j := range cols {
			a.Set(i, c, x.At(i, j))
		}
	}
	var qr mat.QR
	qr.Factorize(a)
	var b mat.VecDense
	if err := qr.SolveVecTo(&b, false, target); err != nil {
		return beta, se, fmt.Errorf("least squares: %w", err)
	}
	var resid mat.VecDense
	resid.MulVec(a, &b)
	resid.SubVec(&resid, target)
	rss := mat.Dot(&resid, &resid)
	dof := max(n-k, 1)
	sigma2 := rss / float64(dof)
	var ata, inv mat.Dense
	ata.Mul(a.T(), a)
	if err := inv.Inverse(&ata); err != nil {
		return beta, se, fmt.Errorf("least squares: %w", err)
	}
	for c, j := range cols {
		beta[j] = b.AtVec(c)
		se[j] = math.Sqrt(math.Max(sigma2*inv.At(c, c), 0))
	}
	return beta, se, nil
}

// vif is column j's variance inflation factor 1/(1-R²) from regressing it
// (without intercept, as the model has none) on the other columns.
func vif(x *mat.Dense, j int) float64 {
	n, p := x.Dims()
	others := mat.NewDense(n, p-1, nil)
	y := mat.NewVecDense(n, nil)
	for i := range n {
		c := 0
		for k := range p {
			if k == j {
				y.SetVec(i, x.At(i, k))
				continue
			}
			others.Set(i, c, x.At(i, k))
			c++
		}
	}
	var svd mat.SVD
	if !svd.Factorize(others, mat.SVDThin) {
		return math.Inf(1)
	}
	var b mat.Dense
	rank := svd.Rank(1e-12)
	if rank == 0 {
		return 1
	}
	svd.SolveTo(&b, y, rank)
	var pred mat.VecDense
	pred.MulVec(others, b.ColView(0))
	pred.SubVec(y, &pred)
	rss := mat.Dot(&pred, &pred)
	tss := mat.Dot(y, y)
	if tss == 0 {
		return math.Inf(1)
	}
	if rss <= tss*1e-15 {
		return math.Inf(1)
	}
	return tss / rss
}
