package calibrate

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/results"
)

// LogOptions configure FitLog.
type LogOptions struct {
	// Holdout is the fraction of requests, the last by arrival, kept out of
	// the fit and scored on their own; 0 fits on every request.
	Holdout float64
	// Start is the profile the search starts from; the zero Profile means
	// the roofline preset of the log's model and GPU when known, else
	// engine.DefaultConfig's.
	Start engine.Profile
	// MaxEvaluations bounds the number of log replays; 0 means 400.
	MaxEvaluations int
	// Validate are whole runs the fitted profile (and both baselines)
	// predict without being fitted to them: the cross-run check.
	Validate []*Log
	// Progress, when set, receives a line now and then.
	Progress io.Writer
}

func (o *LogOptions) validate() error {
	if math.IsNaN(o.Holdout) || o.Holdout < 0 || o.Holdout >= 1 {
		return fmt.Errorf("holdout: must be at least 0 and below 1 (a fraction of the requests), got %v", o.Holdout)
	}
	if o.MaxEvaluations < 0 {
		return fmt.Errorf("max evaluations: must be 0 (default) or positive, got %d", o.MaxEvaluations)
	}
	if o.Start != (engine.Profile{}) {
		c := engine.DefaultConfig()
		c.Latency = o.Start
		if err := c.Validate(); err != nil {
			return fmt.Errorf("start profile: %w", err)
		}
	}
	for i, v := range o.Validate {
		if v == nil || len(v.Requests) == 0 {
			return fmt.Errorf("validate log %d: has no requests", i+1)
		}
	}
	return nil
}

// QuantileError compares one quantile of the measured and the predicted
// latency distributions (seconds; RelErr is (predicted-measured)/measured).
type QuantileError struct {
	Measured  float64 `json:"measured_s"`
	Predicted float64 `json:"predicted_s"`
	RelErr    float64 `json:"rel_err"`
}

// Quantiles holds the p50, p90 and p99 comparisons of one latency.
type Quantiles struct {
	P50 QuantileError `json:"p50"`
	P90 QuantileError `json:"p90"`
	P99 QuantileError `json:"p99"`
}

// LoadBand scores the requests that met one level of load: a third of the
// scored requests by the number in the engine when each arrived.
type LoadBand struct {
	MinInSystem int     `json:"min_in_system"`
	MaxInSystem int     `json:"max_in_system"`
	Requests    int     `json:"requests"`
	TTFTMAPE    float64 `json:"ttft_mape"`
	E2EMAPE     float64 `json:"e2e_mape"`
}

// ErrorReport scores predictions over a set of requests. MAPEs are mean
// absolute percentage errors, in percent, per request; the phases split TTFT
// into queueing (queued to scheduled) and scheduled-to-first-token, and E2E
// into TTFT and TPOT ((E2E-TTFT)/(output-1), requests of two or more
// tokens). Queue and scheduled-to-first-token errors are relative to at
// least 10 ms (phaseFloor), TTFT and E2E to at least 1 ms.
type ErrorReport struct {
	Requests int     `json:"requests"`
	TTFTMAPE float64 `json:"ttft_mape"`
	E2EMAPE  float64 `json:"e2e_mape"`
	// QueueMAPE and SchedToFirstMAPE are 0 and Phases false when the log
	// has no scheduled_ts.
	Phases           bool    `json:"phases"`
	QueueMAPE        float64 `json:"queue_mape"`
	SchedToFirstMAPE float64 `json:"sched_to_first_mape"`
	// SchedToFirstRatio is the median of predicted over measured
	// scheduled-to-first-token time: the bias the MAPE's tail hides.
	SchedToFirstRatio float64 `json:"sched_to_first_median_ratio"`
	TPOTMAPE          float64 `json:"tpot_mape"`
	// QueueShare is the share of the measured TTFT that is queueing: near 1,
	// the run tests throughput more than the step model.
	QueueShare float64    `json:"queue_share"`
	TTFT       Quantiles  `json:"ttft"`
	E2E        Quantiles  `json:"e2e"`
	ByLoad     []LoadBand `json:"by_load,omitempty"`
}

// FittedTerm is one fitted term with its 95% confidence interval, from the
// Jacobian of the per-request log errors at the optimum (Gauss-Newton:
// covariance s^2 (J'J)^-1, which treats requests as independent, so the
// interval is if anything too narrow). Identified is false when the
// interval spans more than a factor IdentifiedFactor either side: the
// log does not pin the term down, and a value anywhere in the interval
// fits alike.
type FittedTerm struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	// Bounded is false when the logs do not bound the term at all (it
	// trades off freely against others); Lo and Hi are then 0.
	Bounded    bool    `json:"bounded"`
	Lo         float64 `json:"lo95"`
	Hi         float64 `json:"hi95"`
	Identified bool    `json:"identified"`
}

// IdentifiedFactor is the widest 95% interval, as a factor either side of
// the value, of a coefficient called identified.
const IdentifiedFactor = 1.5

// Baseline is a profile that is not the fit, scored the same way.
type Baseline struct {
	Name    string         `json:"name"`
	Profile engine.Profile `json:"profile"`
	Fit     ErrorReport    `json:"fit"`
	Holdout *ErrorReport   `json:"holdout,omitempty"`
	// Validation scores the LogOptions.Validate runs, in order.
	Validation []ErrorReport `json:"validation,omitempty"`
}

// RunReport scores one whole run the fit did not see.
type RunReport struct {
	Log    string      `json:"log"`
	Report ErrorReport `json:"report"`
}

// LogFit is the result of FitLog.
type LogFit struct {
	Log string `json:"log"`
	// Logs are every fitted log (Log is the first).
	Logs  []string `json:"logs"`
	Notes []string `json:"notes,omitempty"`
	// Config is the first log's engine configuration with the fitted profile.
	Config  engine.Config  `json:"config"`
	Profile engine.Profile `json:"profile"`
	// Coefficients are the fitted terms with their intervals.
	Coefficients []FittedTerm `json:"coefficients"`
	// Start is the profile the search started from; StartFit scores it.
	Start    engine.Profile `json:"start_profile"`
	StartFit ErrorReport    `json:"start_fit"`
	// Baselines are the unfitted start profile ("preset": the roofline of
	// the log's model and GPU; "default" when either is unknown; "start"
	// for LogOptions.Start) and the start profile with one fitted scale
	// factor on its five step coefficients ("scale"), scored as the fit is.
	Baselines   []Baseline   `json:"baselines"`
	ScaleFactor float64      `json:"scale_factor"`
	HoldoutFrac float64      `json:"holdout_fraction"`
	Fit         ErrorReport  `json:"fit"`
	Holdout     *ErrorReport `json:"holdout,omitempty"`
	Validation  []RunReport  `json:"validation,omitempty"`
	Objective   string       `json:"objective"`
	Iterations  int          `json:"iterations"`
	Evaluations int          `json:"evaluations"`
	WallS       float64      `json:"wall_s"`
}

// objectiveName describes the objective FitLog minimises.
const objectiveName = "mean |ln(predicted/measured)| of TTFT, plus that of E2E, plus that of scheduled-to-first-token time where logged, per request, averaged over the fitted logs"

// FitLog fits the latency profile to one request log; see FitLogs.
func FitLog(l *Log, opts LogOptions) (*LogFit, error) {
	return FitLogs([]*Log{l}, opts)
}

// FitLogs fits the latency profile (the five step coefficients and the two
// output-lag terms) to request logs: it replays each log's arrivals through
// the engine model configured from its meta.json and minimises the mean
// absolute log ratio of predicted to measured TTFT and end-to-end latency.
// The log ratio is symmetric: predicting half or twice the measured latency
// costs the same, so the fit cannot win by collapsing the engine's speed
// (relative error costs at most 100% for an under-prediction). The search
// runs on the logarithms of the terms (so they stay positive): a scan of one
// common scale factor from the start profile, refined by golden section (the
// "scale" baseline), then Nelder-Mead over all seven. Every replay covers the
// whole log, so held-out requests see the real queue; only the first
// 1-Holdout of each log's requests by arrival are scored in the objective.
func FitLogs(logs []*Log, opts LogOptions) (*LogFit, error) {
	began := time.Now()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if len(logs) == 0 {
		return nil, errors.New("no log to fit")
	}
	runs := make([]*logRun, len(logs))
	for i, l := range logs {
		if l == nil || len(l.Requests) == 0 {
			return nil, errors.New("the log has no requests")
		}
		n := len(l.Requests)
		nFit := int(math.Round(float64(n) * (1 - opts.Holdout)))
		if nFit < 1 {
			return nil, fmt.Errorf("%s: holdout %v leaves no request to fit of %d; lower it", l.Name, opts.Holdout, n)
		}
		runs[i] = &logRun{rp: newReplayer(l), nFit: nFit}
	}
	first := logs[0]
	start := opts.Start
	startName := "start" // the caller's start profile
	if start == (engine.Profile{}) {
		start, startName = engine.DefaultConfig().Latency, "default"
		if first.Meta != nil {
			if g, ok := findGPU(first.GPU); ok {
				if r := logRoofline(first.Meta, g); r != nil {
					start, startName = r.Config.Latency, "preset"
				}
			}
		}
	}
	maxEval := opts.MaxEvaluations
	if maxEval == 0 {
		maxEval = 400
	}
	evals := 0
	var evalErr error
	objective := func(p engine.Profile) float64 {
		evals++
		total := 0.0
		for _, r := range runs {
			if err := r.rp.run(p); err != nil {
				evalErr = err
				return math.Inf(1)
			}
			t, e, s := r.rp.logErrors(0, r.nFit)
			total += t + e + s
		}
		return total / float64(len(runs))
	}
	for _, r := range runs {
		if err := r.rp.run(start); err != nil {
			return nil, err
		}
	}
	fit := &LogFit{Log: first.Name, Start: start, HoldoutFrac: opts.Holdout, Objective: objectiveName}
	for _, l := range logs {
		fit.Logs = append(fit.Logs, l.Name)
		fit.Notes = append(fit.Notes, l.Notes...)
	}

	// Scan a common scale factor: k = 2^(i/4), i in -12..12, then refine
	// ln k by golden section within a step either side.
	best, bestK := math.Inf(1), 1.0
	for i := -12; i <= 12; i++ {
		k := math.Exp2(float64(i) / 4)
		if v := objective(scale(start, k)); v < best {
			best, bestK = v, k
		}
	}
	if math.IsInf(best, 1) {
		return nil, fmt.Errorf("no scaled start profile replays the log: %w", evalErr)
	}
	bestK, best = goldenScale(func(k float64) float64 { return objective(scale(start, k)) }, bestK, best)
	scaled := scale(start, bestK)
	fit.ScaleFactor = round4(bestK)

	x0 := toLog(withLagStart(scaled))
	problem := optimize.Problem{Func: func(x []float64) float64 { return objective(fromLog(x)) }}
	settings := &optimize.Settings{
		FuncEvaluations: max(maxEval-evals, 10),
		Converger:       &optimize.FunctionConverge{Absolute: 1e-5, Relative: 1e-5, Iterations: 60},
	}
	if opts.Progress != nil {
		settings.Recorder = &progressRecorder{w: opts.Progress, every: 50}
	}
	res, err := optimize.Minimize(problem, x0, settings, &optimize.NelderMead{SimplexSize: 0.5})
	if err != nil && res == nil {
		return nil, fmt.Errorf("nelder-mead: %w", err)
	}
	bestP := scaled
	if res != nil && res.F < best {
		bestP = fromLog(res.X)
		fit.Iterations = res.Stats.MajorIterations
	}
	bestP = roundProfile(bestP)
	fit.Coefficients = coefficientIntervals(runs, bestP)
	fit.Profile = bestP
	fit.Config = first.Config
	fit.Config.Latency = bestP

	// Score the fit, then the baselines, on the same requests.
	score := func(p engine.Profile) (ErrorReport, *ErrorReport, []ErrorReport, error) {
		var fitRep, hold ErrorReport
		var holdP *ErrorReport
		var reps, holds []ErrorReport
		for _, r := range runs {
			if err := r.rp.run(p); err != nil {
				return fitRep, nil, nil, err
			}
			reps = append(reps, r.rp.report(0, r.nFit))
			if r.nFit < len(r.rp.log.Requests) {
				holds = append(holds, r.rp.report(r.nFit, len(r.rp.log.Requests)))
			}
		}
		fitRep = mergeReports(reps)
		if len(holds) > 0 {
			hold = mergeReports(holds)
			holdP = &hold
		}
		var val []ErrorReport
		for _, v := range opts.Validate {
			rp := newReplayer(v)
			if err := rp.run(p); err != nil {
				return fitRep, nil, nil, fmt.Errorf("validate %s: %w", v.Name, err)
			}
			val = append(val, rp.report(0, len(v.Requests)))
		}
		return fitRep, holdP, val, nil
	}
	var val []ErrorReport
	if fit.Fit, fit.Holdout, val, err = score(bestP); err != nil {
		return nil, err
	}
	for i, v := range opts.Validate {
		fit.Validation = append(fit.Validation, RunReport{Log: v.Name, Report: val[i]})
	}
	for _, b := range []struct {
		name string
		p    engine.Profile
	}{{startName, start}, {"scale", roundProfile(scaled)}} {
		bl := Baseline{Name: b.name, Profile: b.p}
		if bl.Fit, bl.Holdout, bl.Validation, err = score(b.p); err != nil {
			return nil, err
		}
		fit.Baselines = append(fit.Baselines, bl)
	}
	fit.StartFit = fit.Baselines[0].Fit
	fit.Evaluations = evals
	fit.WallS = math.Round(time.Since(began).Seconds()*100) / 100
	return fit, nil
}

// logRun is one fitted log: its replayer and how many of its requests are fitted.
type logRun struct {
	rp   *replayer
	nFit int
}

// goldenScale refines the scale factor k (found by a scan in steps of
// 2^(1/4)) by golden-section search on ln k within one step either side.
func goldenScale(f func(float64) float64, k, fk float64) (float64, float64) {
	const phi = 0.6180339887498949
	a, b := math.Log(k)-math.Ln2/4, math.Log(k)+math.Ln2/4
	c, d := b-phi*(b-a), a+phi*(b-a)
	fc, fd := f(math.Exp(c)), f(math.Exp(d))
	for range 10 {
		if fc < fd {
			b, d, fd = d, c, fc
			c = b - phi*(b-a)
			fc = f(math.Exp(c))
		} else {
			a, c, fc = c, d, fd
			d = a + phi*(b-a)
			fd = f(math.Exp(d))
		}
	}
	if fc < fk && fc <= fd {
		return math.Exp(c), fc
	}
	if fd < fk {
		return math.Exp(d), fd
	}
	return k, fk
}

// withLagStart gives the output-lag terms a starting point for the search
// when the profile has none: one step of lag (vLLM's asynchronous
// scheduling) and 1 ms of output processing.
func withLagStart(p engine.Profile) engine.Profile {
	if p.OutputLagSteps == 0 {
		p.OutputLagSteps = 1
	}
	if p.OutputDelayMs == 0 {
		p.OutputDelayMs = 1
	}
	return p
}

// coefficientIntervals estimates each term's 95% interval at p from the
// Jacobian of the fitted requests' log errors with respect to the logs of
// the terms, by central differences of +-10%.
func coefficientIntervals(runs []*logRun, p engine.Profile) []FittedTerm {
	x := toLog(p)
	k := len(x)
	resid := func(x []float64) []float64 {
		var out []float64
		for _, r := range runs {
			if r.rp.run(fromLog(x)) != nil {
				return nil
			}
			out = r.rp.appendResiduals(out, 0, r.nFit)
		}
		return out
	}
	r0 := resid(x)
	out := make([]FittedTerm, k)
	vals := coefSlice(p)
	for i := range out {
		out[i] = FittedTerm{Name: logTermNames[i], Value: vals[i]}
	}
	m := len(r0)
	if m <= k {
		return out
	}
	const h = 0.1
	jac := mat.NewDense(m, k, nil)
	for j := range k {
		xp, xm := slices.Clone(x), slices.Clone(x)
		xp[j] += h
		xm[j] -= h
		rp, rm := resid(xp), resid(xm)
		if len(rp) != m || len(rm) != m {
			return out
		}
		for i := range m {
			jac.Set(i, j, (rp[i]-rm[i])/(2*h))
		}
	}
	ss := 0.0
	for _, v := range r0 {
		ss += v * v
	}
	s2 := ss / float64(m-k)
	// The covariance's diagonal from the singular value decomposition of J:
	// var_i = s^2 sum_j (V_ij / sigma_j)^2. A direction J barely sees (a
	// singular value below 1e-6 of the largest) makes every term with a
	// share in it unbounded: those terms trade off against each other.
	var svd mat.SVD
	if !svd.Factorize(jac, mat.SVDThin) {
		return out
	}
	sv := svd.Values(nil)
	var v mat.Dense
	svd.VTo(&v)
	for i := range out {
		variance := 0.0
		for j, sj := range sv {
			vij := v.At(i, j)
			if sj <= 1e-6*sv[0] {
				if math.Abs(vij) > 1e-3 {
					variance = math.Inf(1)
					break
				}
				continue
			}
			variance += vij * vij / (sj * sj)
		}
		variance *= s2
		if math.IsInf(variance, 0) || math.IsNaN(variance) {
			continue
		}
		sd := math.Sqrt(variance)
		if 1.96*sd > math.Log(1e3) {
			continue // three orders of magnitude either side: no bound worth a number
		}
		out[i].Bounded = true
		out[i].Lo = round4(vals[i] * math.Exp(-1.96*sd))
		out[i].Hi = round4(vals[i] * math.Exp(1.96*sd))
		out[i].Identified = 1.96*sd <= math.Log(IdentifiedFactor)
	}
	return out
}

func baseName(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' || p[i] == '\\' {
			return p[i+1:]
		}
	}
	return p
}

// progressRecorder prints the best objective every few iterations.
type progressRecorder struct {
	w     io.Writer
	every int
	iters int
}

func (r *progressRecorder) Init() error { return nil }

func (r *progressRecorder) Record(loc *optimize.Location, op optimize.Operation, st *optimize.Stats) error {
	if op != optimize.MajorIteration {
		return nil
	}
	r.iters++
	if r.iters%r.every == 0 {
		fmt.Fprintf(r.w, "calibrate: iteration %d, %d replays, objective %.4f\n", st.MajorIterations, st.FuncEvaluations, loc.F)
	}
	return nil
}

// logTermNames name the fitted terms in order, as the profile YAML does.
var logTermNames = []string{"step_fixed_ms", "prefill_token_us", "prefill_pair_ns", "decode_seq_us", "decode_ctx_token_ns", "output_lag_steps", "output_delay_ms"}

// The fitted terms in a fixed order, for the optimisers.
func coefSlice(p engine.Profile) []float64 {
	return []float64{p.StepFixedMs, p.PrefillTokenUs, p.PrefillPairNs, p.DecodeSeqUs, p.DecodeCtxTokenNs, p.OutputLagSteps, p.OutputDelayMs}
}

func fromCoefSlice(c []float64) engine.Profile {
	return engine.Profile{StepFixedMs: c[0], PrefillTokenUs: c[1], PrefillPairNs: c[2], DecodeSeqUs: c[3], DecodeCtxTokenNs: c[4], OutputLagSteps: c[5], OutputDelayMs: c[6]}
}

// coefFloor keeps a zero term searchable on a log scale; a term at its
// floor is effectively zero.
var coefFloor = []float64{0.01, 0.01, 0.001, 0.01, 0.01, 0.001, 0.001}

// coefCeil bounds the search where the profile's validation does.
var coefCeil = []float64{math.Inf(1), math.Inf(1), math.Inf(1), math.Inf(1), math.Inf(1), 8, math.Inf(1)}

func toLog(p engine.Profile) []float64 {
	c := coefSlice(p)
	x := make([]float64, len(c))
	for i, v := range c {
		x[i] = math.Log(math.Max(v, coefFloor[i]))
	}
	return x
}

func fromLog(x []float64) engine.Profile {
	c := make([]float64, len(x))
	for i, v := range x {
		c[i] = math.Min(math.Exp(math.Max(math.Min(v, 30), -30)), coefCeil[i])
	}
	return fromCoefSlice(c)
}

// scale multiplies the five step coefficients by k; the output-lag terms
// stay.
func scale(p engine.Profile, k float64) engine.Profile {
	q := p
	q.StepFixedMs *= k
	q.PrefillTokenUs *= k
	q.PrefillPairNs *= k
	q.DecodeSeqUs *= k
	q.DecodeCtxTokenNs *= k
	return q
}

func quantiles(meas, pred []float64) Quantiles {
	slices.Sort(meas)
	slices.Sort(pred)
	q := func(p float64) QuantileError {
		m, pr := results.Quantile(meas, p), results.Quantile(pred, p)
		return QuantileError{Measured: round4(m), Predicted: round4(pr), RelErr: round4((pr - m) / math.Max(m, ttftFloor))}
	}
	return Quantiles{P50: q(0.5), P90: q(0.9), P99: q(0.99)}
}

func round4(x float64) float64 {
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return math.Round(x*1e4) / 1e4
}

// The five step coefficients in a fixed order, for least squares (lsq.go).
func coefs(p engine.Profile) [5]float64 {
	return [5]float64{p.StepFixedMs, p.PrefillTokenUs, p.PrefillPairNs, p.DecodeSeqUs, p.DecodeCtxTokenNs}
}

func fromCoefs(c []float64) engine.Profile {
	return engine.Profile{StepFixedMs: c[0], PrefillTokenUs: c[1], PrefillPairNs: c[2], DecodeSeqUs: c[3], DecodeCtxTokenNs: c[4]}
}

// Interval renders the term's 95% interval: "LO to HI", or "unbounded"
// when the logs do not bound it.
func (c FittedTerm) Interval() string {
	if !c.Bounded {
		return "unbounded"
	}
	return fmt.Sprintf("%.3g to %.3g", c.Lo, c.Hi)
}
