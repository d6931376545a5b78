package calibrate

import (
	"errors"
	"fmt"
	"math"
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
	// RelRMS is the root mean square of the relative residuals (pred-y)/y.
	RelRMS float64 `json:"rel_rms"`
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

// FitRows fits the five coefficients by ordinary least squares on relative
// errors (each row weighted by 1/y, so short and long measurements count
// alike). It refuses a design that cannot identify every coefficient: a
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
	for i, r := range rows {
		for j := range p {
			x.Set(i, j, r.X[j]/r.Y)
		}
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

	var active [p]bool
	for j := range active {
		active[j] = true
	}
	var beta, se [p]float64
	var clamped [p]bool
	for {
		var err error
		beta, se, err = solveActive(x, active)
		if err != nil {
			return nil, err
		}
		worst, wv := -1, 0.0
		for j := range p {
			if active[j] && beta[j] < wv {
				worst, wv = j, beta[j]
			}
		}
		if worst < 0 {
			break
		}
		active[worst], clamped[worst] = false, true
	}
	fit := &LinearFit{Rows: n, Condition: cond}
	var ss float64
	for _, r := range rows {
		pred := 0.0
		for j := range p {
			pred += r.X[j] * beta[j]
		}
		d := (pred - r.Y) / r.Y
		ss += d * d
	}
	fit.RelRMS = math.Sqrt(ss / float64(n))
	fit.Profile = fromCoefs(beta[:5])
	for j := range p {
		fit.Coefficients = append(fit.Coefficients, Coefficient{Name: CoefNames[j], Value: beta[j], StdErr: se[j], Clamped: clamped[j]})
	}
	if fit.Profile.StepFixedMs <= 0 || fit.Profile.PrefillTokenUs <= 0 {
		return fit, fmt.Errorf("least squares gave step_fixed_ms %.4g and prefill_token_us %.4g, both must be positive: the measurements do not follow the latency model (check the engine was idle and the prompt lengths)", fit.Profile.StepFixedMs, fit.Profile.PrefillTokenUs)
	}
	return fit, nil
}

// solveActive solves the weighted least squares (target 1 for every row of
// x, which is already divided by y) over the active columns, returning the
// coefficients and their standard errors.
func solveActive(x *mat.Dense, active [NumCoefs]bool) (beta, se [NumCoefs]float64, err error) {
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
	ones := mat.NewVecDense(n, nil)
	for i := range n {
		ones.SetVec(i, 1)
	}
	var qr mat.QR
	qr.Factorize(a)
	var b mat.VecDense
	if err := qr.SolveVecTo(&b, false, ones); err != nil {
		return beta, se, fmt.Errorf("least squares: %w", err)
	}
	var resid mat.VecDense
	resid.MulVec(a, &b)
	resid.SubVec(&resid, ones)
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
