package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/inferrail/inferrail/results"
)

// Report is what `inferrail bench --json` prints and --out writes as
// summary.json: the summary's fields, flat as `inferrail sim --json` prints
// them (so the two compare, and scripts that read a summary read this),
// except that what bench cannot know is null rather than 0; then what only
// a run against a real server has: the send lag, the failures by reason,
// and warnings.
type Report struct {
	results.Summary
	// HitRate replaces the summary's hit_rate: null when the server
	// reported no cached tokens (see Output.HitRateKnown), and PerReplica
	// its per_replica with their hit_rate and cached_tokens null then too.
	HitRate    *float64        `json:"hit_rate"`
	PerReplica []ReplicaReport `json:"per_replica"`
	// PredictedHitRate and Prediction replace the summary's: over the
	// requests whose answer carried a prediction (Prediction.Requests of
	// them), null when none did.
	PredictedHitRate *float64     `json:"predicted_hit_rate"`
	Prediction       *Predictions `json:"prediction"`
	// CachedReported is Output.CachedReported.
	CachedReported int             `json:"cached_tokens_reported"`
	SendLag        results.Latency `json:"send_lag_ms"`
	// Errors and ErrorExamples are Output's ({} rather than null).
	Errors        map[string]int    `json:"errors"`
	ErrorExamples map[string]string `json:"error_examples"`
	// Warnings is Output.Warnings ([] rather than null).
	Warnings []string `json:"warnings"`
	WallS    float64  `json:"wall_s"`
}

// ReplicaReport is a replica's summary with its cached tokens and hit rate
// null when the server reported no cached tokens.
type ReplicaReport struct {
	results.ReplicaSummary
	CachedTokens *int64   `json:"cached_tokens"`
	HitRate      *float64 `json:"hit_rate"`
}

// Report returns o's summary with its send lag, errors and warnings, for
// JSON.
func (o *Output) Report() Report {
	r := Report{
		Summary:        o.Summary,
		CachedReported: o.CachedReported,
		SendLag:        o.SendLag,
		Errors:         o.Errors,
		ErrorExamples:  o.ErrorExamples,
		Warnings:       o.Warnings(),
		WallS:          o.WallS,
	}
	if r.Errors == nil {
		r.Errors = map[string]int{} // {} rather than null
	}
	if r.ErrorExamples == nil {
		r.ErrorExamples = map[string]string{}
	}
	if r.Warnings == nil {
		r.Warnings = []string{}
	}
	known := o.HitRateKnown()
	if known {
		r.HitRate = &r.Summary.HitRate
	}
	r.PerReplica = make([]ReplicaReport, len(o.Summary.PerReplica))
	for i, rs := range o.Summary.PerReplica {
		r.PerReplica[i].ReplicaSummary = rs
		if known {
			r.PerReplica[i].CachedTokens = &r.PerReplica[i].ReplicaSummary.CachedTokens
			r.PerReplica[i].HitRate = &r.PerReplica[i].ReplicaSummary.HitRate
		}
	}
	if o.Predictions.Requests > 0 {
		p := o.Predictions
		r.Prediction, r.PredictedHitRate = &p, &p.PredictedHitRate
	}
	return r
}

// NoPredictions is what bench says of predictions when the server sent none.
const NoPredictions = "no predictions (the server sent no x-inferrail-predicted-cached-tokens header)"

// Warnings says what in o's numbers the server left bench unable to know,
// one line each: no cached tokens in any answer's usage (so no hit rate),
// or in only some.
func (o *Output) Warnings() []string {
	var w []string
	switch done := o.Summary.Completed; {
	case done > 0 && o.CachedReported == 0:
		w = append(w, "no answer's usage carried prompt_tokens_details.cached_tokens, so the hit rate is unknown "+
			"(vLLM reports it when started with --enable-prompt-tokens-details)")
	case o.CachedReported > 0 && o.CachedReported < done:
		w = append(w, fmt.Sprintf("%d of %d answers' usage carried no prompt_tokens_details.cached_tokens: the hit rate counts "+
			"their prompts as uncached (start every vLLM with --enable-prompt-tokens-details)", done-o.CachedReported, done))
	}
	return w
}

// WriteText writes o as `inferrail bench` prints it: one row of the
// summary (what bench cannot know says unknown), a legend, the predictions,
// the gateway's rejections and per-tenant lines if any, the send lag and
// the errors by reason. Warnings are not in it (they go to stderr).
func (o *Output) WriteText(w io.Writer) error {
	s := &o.Summary
	var b strings.Builder
	fmt.Fprintf(&b, "%s on %s, seed %d, against %s\n", s.Policy, s.Workload, s.Seed, baseNames(s))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ok/req\tfailed\tttft p50/99\ttpot p50/99\titl p50/99\te2e p99\thit\tslo\tgood/s")
	hit := "unknown"
	if o.HitRateKnown() {
		hit = fmtPct(s.HitRate)
	}
	fmt.Fprintf(tw, "%d/%d\t%d\t%s/%s\t%s/%s\t%s/%s\t%s\t%s\t%s\t%s\n",
		s.Completed, s.Requests, s.Failed,
		fmtMs(s.TTFT.P50), fmtMs(s.TTFT.P99), fmtMs(s.TPOT.P50), fmtMs(s.TPOT.P99),
		fmtMs(s.ITL.P50), fmtMs(s.ITL.P99), fmtMs(s.E2E.P99),
		hit, fmtPct(s.SLOAttainment), strconv.FormatFloat(s.GoodputRPS, 'f', 2, 64))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("bench: format: %w", err)
	}
	fmt.Fprintf(&b, "latencies in ms from each request's schedule; hit: %% of prompt tokens the server found cached;\n"+
		"slo: requests meeting the SLO (TTFT p99 %s ms, TPOT p99 %s ms); good/s: goodput in req/s\n",
		fmtMs(s.SLOTTFTP99Ms), fmtMs(s.SLOTPOTP99Ms))
	if p := o.Predictions; p.Requests == 0 {
		b.WriteString("predictions: " + NoPredictions + "\n")
	} else {
		fmt.Fprintf(&b, "predictions (%d of %d completed requests): predicted hit %s, found %s; exact %s, over %s, under %s; "+
			"mean error %s tokens (absolute %s)\n",
			p.Requests, s.Completed, fmtPct(p.PredictedHitRate), fmtPct(p.HitRate),
			fmtPct(p.Exact), fmtPct(p.Over), fmtPct(p.Under),
			strconv.FormatFloat(p.MeanErrorTokens, 'f', -1, 64), strconv.FormatFloat(p.MeanAbsErrorTokens, 'f', -1, 64))
	}
	if s.RejectedTotal > 0 {
		fmt.Fprintf(&b, "rejected by the gateway: %d (%s); queue p50/p99 %s/%s ms\n",
			s.RejectedTotal, counts(s.Rejected), fmtMs(s.QueueMs.P50), fmtMs(s.QueueMs.P99))
	}
	if len(s.PerTenant) > 0 {
		b.WriteString("per tenant:\n")
		if err := results.WriteTenantTable(&b, s); err != nil {
			return fmt.Errorf("bench: format: %w", err)
		}
	}
	fmt.Fprintf(&b, "send lag: p50 %.3f ms, p99 %.3f ms; wall %.1f s\n", o.SendLag.P50, o.SendLag.P99, o.WallS)
	if len(o.Errors) > 0 {
		b.WriteString("errors by reason (every request, warmup included):\n")
		for _, reason := range slices.Sorted(maps.Keys(o.Errors)) {
			fmt.Fprintf(&b, "  %s: %d", reason, o.Errors[reason])
			if ex := o.ErrorExamples[reason]; ex != "" {
				fmt.Fprintf(&b, " (first: %s)", ex)
			}
			b.WriteString("\n")
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("bench: format: %w", err)
	}
	return nil
}

// baseNames is the server the run loaded, as the summary names its one
// replica.
func baseNames(s *results.Summary) string {
	if len(s.PerReplica) == 1 {
		return s.PerReplica[0].Replica
	}
	return "the server"
}

// counts formats counts by key, "a 1, b 2".
func counts(m map[string]int) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+" "+strconv.Itoa(m[k]))
	}
	return strings.Join(parts, ", ")
}

// fmtMs formats milliseconds with about three significant digits, as the
// simulator's table does.
func fmtMs(ms float64) string {
	switch {
	case ms >= 100:
		return strconv.FormatFloat(ms, 'f', 0, 64)
	case ms >= 10:
		return strconv.FormatFloat(ms, 'f', 1, 64)
	default:
		return strconv.FormatFloat(ms, 'f', 2, 64)
	}
}

// fmtPct formats a fraction as a percentage with one decimal.
func fmtPct(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }
