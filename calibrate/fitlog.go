package calibrate

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

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

// ErrorReport scores predictions over a set of requests.
type ErrorReport struct {
	Requests int `json:"requests"`
	// TTFTMAPE and E2EMAPE are mean absolute percentage errors, in percent.
	TTFTMAPE float64   `json:"ttft_mape"`
	E2EMAPE  float64   `json:"e2e_mape"`
	TTFT     Quantiles `json:"ttft"`
	E2E      Quantiles `json:"e2e"`
}

// LogFit is the result of FitLog.
type LogFit struct {
	Log   string   `json:"log"`
	Notes []string `json:"notes,omitempty"`
	// Config is the log's engine configuration with the fitted profile.
	Config  engine.Config  `json:"config"`
	Profile engine.Profile `json:"profile"`
	// Start is the profile the search started from; StartFit scores it.
	Start       engine.Profile `json:"start_profile"`
	StartFit    ErrorReport    `json:"start_fit"`
	HoldoutFrac float64        `json:"holdout_fraction"`
	Fit         ErrorReport    `json:"fit"`
	// Holdout scores the held-out requests (nil without a holdout).
	Holdout     *ErrorReport `json:"holdout,omitempty"`
	Iterations  int          `json:"iterations"`
	Evaluations int          `json:"evaluations"`
	WallS       float64      `json:"wall_s"`
}

// FitLog fits the five latency coefficients to a request log: it replays the
// logged arrivals through the engine model configured from the log's
// meta.json and minimises the sum of the mean relative errors of TTFT and of
// end-to-end latency over the fitted requests. The search runs on the
// logarithms of the coefficients (so they stay positive): first a scan of one
// common scale factor from the start profile, then Nelder-Mead. Every replay
// covers the whole log, so held-out requests see the real queue; only the
// first 1-Holdout of the requests by arrival are scored in the objective.
func FitLog(l *Log, opts LogOptions) (*LogFit, error) {
	began := time.Now()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if l == nil || len(l.Requests) == 0 {
		return nil, errors.New("the log has no requests")
	}
	n := len(l.Requests)
	nFit := int(math.Round(float64(n) * (1 - opts.Holdout)))
	if nFit < 1 {
		return nil, fmt.Errorf("holdout %v leaves no request to fit of %d; lower it", opts.Holdout, n)
	}
	start := opts.Start
	if start == (engine.Profile{}) {
		start = engine.DefaultConfig().Latency
		if l.Meta != nil {
			if r, _ := logRoofline(l.Meta, baseName(l.Name)); r != nil {
				start = r.Config.Latency
			}
		}
	}
	maxEval := opts.MaxEvaluations
	if maxEval == 0 {
		maxEval = 400
	}

	rp := newReplayer(l)
	evals := 0
	var evalErr error
	objective := func(p engine.Profile) float64 {
		evals++
		if err := rp.run(p); err != nil {
			evalErr = err
			return math.Inf(1)
		}
		t, e := rp.errors(0, nFit)
		return t + e
	}
	// Start: the start profile must replay.
	if err := rp.run(start); err != nil {
		return nil, err
	}
	fit := &LogFit{Log: l.Name, Notes: l.Notes, Start: start, HoldoutFrac: opts.Holdout}
	fit.StartFit = rp.report(0, nFit)

	// Scan a common scale factor: k = 2^(i/4), i in -12..12.
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
	x0 := toLog(scale(start, bestK))
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
	bestP := scale(start, bestK)
	if res != nil && res.F < best {
		bestP = fromLog(res.X)
		fit.Iterations = res.Stats.MajorIterations
	}
	bestP = roundProfile(bestP)
	if err := rp.run(bestP); err != nil {
		return nil, err
	}
	fit.Profile = bestP
	fit.Config = l.Config
	fit.Config.Latency = bestP
	fit.Fit = rp.report(0, nFit)
	if nFit < n {
		h := rp.report(nFit, n)
		fit.Holdout = &h
	}
	fit.Evaluations = evals
	fit.WallS = math.Round(time.Since(began).Seconds()*100) / 100
	return fit, nil
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

// The coefficients in a fixed order, for the optimisers and least squares.
func coefs(p engine.Profile) [5]float64 {
	return [5]float64{p.StepFixedMs, p.PrefillTokenUs, p.PrefillPairNs, p.DecodeSeqUs, p.DecodeCtxTokenNs}
}

func fromCoefs(c []float64) engine.Profile {
	return engine.Profile{StepFixedMs: c[0], PrefillTokenUs: c[1], PrefillPairNs: c[2], DecodeSeqUs: c[3], DecodeCtxTokenNs: c[4]}
}

// coefFloor keeps a zero coefficient searchable on a log scale.
var coefFloor = [5]float64{0.01, 0.01, 0.001, 0.01, 0.01}

func toLog(p engine.Profile) []float64 {
	c := coefs(p)
	x := make([]float64, 5)
	for i, v := range c {
		x[i] = math.Log(math.Max(v, coefFloor[i]))
	}
	return x
}

func fromLog(x []float64) engine.Profile {
	var c [5]float64
	for i, v := range x {
		c[i] = math.Exp(math.Max(math.Min(v, 30), -30))
	}
	return fromCoefs(c[:])
}

func scale(p engine.Profile, k float64) engine.Profile {
	c := coefs(p)
	for i := range c {
		c[i] *= k
	}
	return fromCoefs(c[:])
}

// report scores the last replay over requests [lo, hi).
func (r *replayer) report(lo, hi int) ErrorReport {
	t, e := r.errors(lo, hi)
	rep := ErrorReport{Requests: hi - lo, TTFTMAPE: round4(100 * t), E2EMAPE: round4(100 * e)}
	mt, pt, me, pe := make([]float64, 0, hi-lo), make([]float64, 0, hi-lo), make([]float64, 0, hi-lo), make([]float64, 0, hi-lo)
	for i := lo; i < hi; i++ {
		q := r.log.Requests[i]
		mt, me = append(mt, q.TTFT), append(me, q.E2E)
		pt, pe = append(pt, r.first[i].Seconds()), append(pe, r.last[i].Seconds())
	}
	rep.TTFT = quantiles(mt, pt)
	rep.E2E = quantiles(me, pe)
	return rep
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
