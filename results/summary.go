package results

import (
	"fmt"
	"time"
)

// SLO is a latency service-level objective on per-request percentiles.
type SLO struct {
	TTFTP99 time.Duration // bound on the 99th percentile of time to first token
	TPOTP99 time.Duration // bound on the 99th percentile of time per output token
}

// DefaultSLO returns the default objective: TTFT p99 <= 2s, TPOT p99 <= 100ms.
func DefaultSLO() SLO {
	return SLO{TTFTP99: 2 * time.Second, TPOTP99: 100 * time.Millisecond}
}

// Validate reports an error if a bound is not positive.
func (s SLO) Validate() error {
	if s.TTFTP99 <= 0 {
		return fmt.Errorf("slo: ttft p99 must be positive, got %v", s.TTFTP99)
	}
	if s.TPOTP99 <= 0 {
		return fmt.Errorf("slo: tpot p99 must be positive, got %v", s.TPOTP99)
	}
	return nil
}

// ReplicaInfo describes one replica of the fleet for Summarize.
type ReplicaInfo struct {
	Name string
	// Busy is the time the engine spent executing steps over the whole run:
	// any step, however small (one decoding sequence keeps it busy). For a
	// data-parallel group it is the mean over its ranks.
	Busy time.Duration
	// Filled is the step time weighted by the share of the step's token
	// budget (max_num_batched_tokens) the step used: the sum over steps of
	// duration x scheduled tokens / budget, where a step's scheduled tokens
	// are its prefill tokens plus one per decoding sequence. It is at most
	// Busy; for a data-parallel group it is the mean over its ranks.
	Filled time.Duration

	// PeakReservedBlocks is the most KV-cache blocks the engine held
	// reserved at once over the whole run, PeakRunning the most requests it
	// ran at once, and CapacityBlocks the size of its KV cache in blocks (0
	// if unknown).
	PeakReservedBlocks int
	PeakRunning        int
	CapacityBlocks     int
}

// SummaryOptions parameterises Summarize.
type SummaryOptions struct {
	// Warmup excludes records with Arrival < Warmup from every statistic
	// (busy fractions and replica peaks, which come from Replicas, excepted).
	Warmup time.Duration
	// SLO is the objective for attainment and goodput. A zero field takes its
	// value from DefaultSLO.
	SLO SLO
	// Replicas has one entry per replica; Record.Replica indexes it.
	Replicas []ReplicaInfo
	// ITL holds the inter-token gaps of measured requests, gathered by the
	// caller; nil leaves Summary.ITL zero.
	ITL *Histogram
	// SimulatedEnd is the end of the simulated run, the denominator of busy
	// fractions.
	SimulatedEnd time.Duration
	// OfferedRate is the rate the workload was configured to offer, in
	// requests per second, for the steady-state check (SteadyRate); 0 when
	// unknown (a trace replay) or not comparable (a run that leaves tenants
	// out), and the check then leaves the rate alone.
	OfferedRate float64
	// Reasons says what failure reasons (Summary.FailedBy's keys) mean in
	// this run, e.g. too_long: "prompt + max_tokens over max_model_len
	// 32768"; a reason without an entry is explained by ReasonMeaning.
	Reasons map[string]string
	// ExactLimit is the most records whose percentiles are exact; past it
	// they come from sketches within PercentileError (see Accumulator). 0
	// or less means DefaultExactLimit.
	ExactLimit int
}

// ReplicaSummary is one replica's share of a run.
type ReplicaSummary struct {
	Replica string `json:"replica"`
	// Role is the replica's P/D role (prefill, decode), set by the
	// caller; omitted for a replica that serves both.
	Role string `json:"role,omitempty"`
	// Requests counts measured requests dispatched to the replica, whatever
	// their outcome; rejected requests were never dispatched.
	Requests int `json:"requests"`
	// PromptTokens, CachedTokens and HitRate cover the replica's measured
	// completed requests, like Summary.HitRate.
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	HitRate      float64 `json:"hit_rate"`
	// BusyFraction is ReplicaInfo.Busy over SummaryOptions.SimulatedEnd:
	// the share of the whole run (warmup and drain included) in which the
	// engine was running a step, any step. With continuous batching one
	// request in flight keeps an engine busy, so it nears 1 at any load
	// that rarely leaves an engine empty; it says the engine had work, not
	// how much of its capacity the work used (see TokenBudgetUse).
	BusyFraction float64 `json:"busy_fraction"`
	// TokenBudgetUse is ReplicaInfo.Filled over SummaryOptions.SimulatedEnd:
	// the share of the engine's step token budget (max_num_batched_tokens
	// per step) that its steps filled, averaged over the whole run, an idle
	// moment counting as empty. It measures prefill and batch width, not
	// memory bandwidth: decode-heavy traffic can saturate an engine (TPOT
	// rises) with a low value.
	TokenBudgetUse float64 `json:"token_budget_use"`
	// PeakReservedBlocks, PeakRunning and CapacityBlocks are copied from
	// ReplicaInfo (whole run, warmup included).
	PeakReservedBlocks int `json:"peak_reserved_blocks"`
	PeakRunning        int `json:"peak_running"`
	CapacityBlocks     int `json:"capacity_blocks"`
	// Preemptions sums the preemptions of the measured requests dispatched
	// to the replica.
	Preemptions int `json:"preemptions"`
}

// ClassSummary is one priority class's share of a run: the measured requests
// with that Record.Priority.
type ClassSummary struct {
	Priority  int `json:"priority"`
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Rejected  int `json:"rejected"` // requests with OutcomeRejected
	// TTFTP99Ms is the p99 time to first token of the class's requests with
	// a first token, whatever their outcome, like Summary.TTFT.
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
	// QueueP99Ms is the p99 router wait of the class's dispatched requests,
	// like Summary.QueueMs.
	QueueP99Ms float64 `json:"queue_p99_ms"`
}

// TenantSummary is one tenant's share of a run: the measured requests with
// that Record.Tenant, counted and timed as Summary counts and times them all.
type TenantSummary struct {
	Tenant    string `json:"tenant"`
	Requests  int    `json:"requests"`
	Completed int    `json:"completed"`
	// Failed counts the tenant's requests that did not complete, and
	// FailedBy splits them by reason: a rejection's Record.Reject
	// (rate_limited, queue_full, ...; RejectUnknown when empty), an engine
	// failure's Record.Fail, else the outcome (failed, aborted), as in
	// Summary.FailedBy. FailedBy is never nil (it encodes as {}).
	Failed   int            `json:"failed"`
	FailedBy map[string]int `json:"failed_by"`
	// TTFTP50Ms and TTFTP99Ms are over the tenant's requests with a first
	// token that were not rejected, like Summary.TTFT; E2EP99Ms over its
	// completed requests, like Summary.E2E.
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
	E2EP99Ms  float64 `json:"e2e_p99_ms"`
}

// Summary condenses one run. Latencies are in milliseconds, rounded to 6
// significant digits, as are durations, throughputs and rates per second;
// fractions in [0, 1] are rounded to 4 decimal places. No field is ever NaN.
type Summary struct {
	Workload string `json:"workload"` // set by the caller
	Policy   string `json:"policy"`   // set by the caller
	// Admission is the gateway's admission rule, Gateways the number of
	// gateways and Ledger whether they shared their reservations; set by
	// the caller ("" and 0 where it does not apply, e.g. bench).
	Admission string  `json:"admission,omitempty"`
	Gateways  int     `json:"gateways,omitempty"`
	Ledger    string  `json:"ledger,omitempty"`
	Replicas  int     `json:"replicas"` // len(SummaryOptions.Replicas)
	Seed      uint64  `json:"seed"`     // set by the caller
	RateRPS   float64 `json:"rate_rps"` // offered rate, set by the caller

	// TenantLimits says whether the workload's per-tenant rate limits were
	// applied ("on") or not ("off"); WithoutTenants lists the tenants left
	// out of the run (the baseline of an isolation experiment). Set by the
	// caller; omitted when the workload has no tenant limits and leaves no
	// tenant out.
	TenantLimits   string   `json:"tenant_limits,omitempty"`
	WithoutTenants []string `json:"without_tenants,omitempty"`

	// Requests counts measured requests: those arriving at or after warmup.
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	// Failed counts measured requests that did not complete: failed,
	// aborted, rejected, or any other outcome than ok. It is EngineFailed +
	// RejectedTotal.
	Failed int `json:"failed"`
	// EngineFailed counts measured requests that did not complete for any
	// reason other than a gateway rejection: failed, aborted, or any outcome
	// other than ok and rejected.
	EngineFailed int `json:"engine_failed"`
	// RejectedTotal counts measured requests the gateway refused
	// (OutcomeRejected), and Rejected splits them by Record.Reject (an empty
	// reason counts as RejectUnknown). Summarize always sets Rejected to a
	// non-nil map, so that it encodes as {} rather than null.
	RejectedTotal int            `json:"rejected_total"`
	Rejected      map[string]int `json:"rejected"`
	// FailedBy splits Failed by reason: a rejection's Record.Reject
	// (too_long, queue_full, ...; RejectUnknown when empty), an engine
	// failure's Record.Fail (too_long, too_large, ...), else the outcome
	// (failed, aborted). It is never nil (it encodes as {}).
	FailedBy map[string]int `json:"failed_by"`
	// FailureReasons says what each reason of FailedBy means in this run
	// (SummaryOptions.Reasons, else ReasonMeaning), e.g. too_long: "prompt +
	// max_tokens over max_model_len 32768"; omitted when nothing failed.
	// FailureText puts both in one line.
	FailureReasons map[string]string `json:"failure_reasons,omitempty"`

	// WindowS is the measured window: from the first to the last measured
	// arrival (measured requests are those arriving at or after warmup, so
	// all of them arrive in it). The drain tail after the last arrival, in
	// which the fleet finishes what it holds and no new load comes, is not
	// in it. Goodput is counted over it.
	WindowS float64 `json:"window_s"`
	// DurationS is the measured span: the window and its drain tail, from
	// the first measured arrival to the later of the last measured
	// completion and the last measured arrival. Throughput and output
	// tokens per second are over it: what the fleet got through, however
	// long it took.
	DurationS        float64 `json:"duration_s"`
	ThroughputRPS    float64 `json:"throughput_rps"`      // completed / duration
	OutputTokensPerS float64 `json:"output_tokens_per_s"` // output tokens of completed requests / duration

	TTFT Latency `json:"ttft_ms"` // measured requests with a first token, whatever their outcome
	TPOT Latency `json:"tpot_ms"` // completed requests with a defined TPOT
	ITL  Latency `json:"itl_ms"`  // from SummaryOptions.ITL, nearest-rank percentiles
	E2E  Latency `json:"e2e_ms"`  // completed requests
	// QueueMs is the router wait, Dispatch-Arrival, of measured requests that
	// were dispatched (Replica >= 0); rejected requests, never dispatched,
	// are left out whatever their Replica.
	QueueMs Latency `json:"queue_ms"`
	// PercentileError is 0 (omitted) when every percentile of the summary
	// is exact: the run had at most SummaryOptions.ExactLimit records
	// (DefaultExactLimit, 1,048,576, unless set). Past that limit the
	// percentiles (these, ByPriority's, PerTenant's and the steady-state
	// check's) come from sketches and it is their relative error bound,
	// PercentileError (0.004: each is within 0.4% of the exact value).
	// Means, counts and rates stay exact. ITL's percentiles always come
	// from its Histogram.
	PercentileError float64 `json:"percentile_error,omitempty"`

	// HitRate is sum CachedTokens / sum PromptTokens over measured completed
	// requests; PredictedHitRate is the same with PredictedCachedTokens.
	HitRate          float64 `json:"hit_rate"`
	PredictedHitRate float64 `json:"predicted_hit_rate"`
	// Prediction compares, request by request, the router's predicted cached
	// tokens with what the engine really found cached (completed requests).
	Prediction Prediction `json:"prediction"`

	SLOTTFTP99Ms float64 `json:"slo_ttft_p99_ms"`
	SLOTPOTP99Ms float64 `json:"slo_tpot_p99_ms"`
	// SLOAttainment is the share of measured requests that completed with
	// TTFT <= SLO.TTFTP99 and TPOT <= SLO.TPOTP99 (or TPOT undefined). A
	// completed request without a first token uses its E2E as TTFT. Rejected
	// requests count in the denominator: they do not meet the SLO.
	SLOAttainment float64 `json:"slo_attainment"`
	// SLOMet: at least one request completed, and the TTFT and TPOT p99s are
	// within the SLO.
	SLOMet bool `json:"slo_met"`
	// GoodputRPS is the number of requests meeting the SLO (as in
	// SLOAttainment) per second of the measured window (WindowS): when
	// every request meets the SLO it is the rate the window offered.
	GoodputRPS float64 `json:"goodput_rps"`
	// Steady compares the two halves of the measured window and warns
	// when the run looks too short for its answer (see SteadyState).
	Steady SteadyState `json:"steady_state"`

	Preemptions int              `json:"preemptions"` // over measured requests
	PerReplica  []ReplicaSummary `json:"per_replica"`
	// PD is what disaggregated prefill/decode did (set by the caller; nil
	// and omitted without prefill replicas), Tiers the hit rate by KV tier
	// (nil and omitted without lower tiers).
	PD    *PDSummary   `json:"pd,omitempty"`
	Tiers *TierSummary `json:"kv_tiers,omitempty"`
	// PeakReservedOverCapacity is the largest PeakReservedBlocks /
	// CapacityBlocks over the replicas, rounded like the fractions; replicas
	// of unknown capacity count as 0.
	PeakReservedOverCapacity float64 `json:"peak_reserved_over_capacity"`
	// ByPriority breaks the measured requests down by Record.Priority, one
	// entry per priority present, by descending priority. It is nil (and
	// omitted from JSON) when every measured request has priority 0.
	ByPriority []ClassSummary `json:"by_priority,omitempty"`
	// PerTenant breaks the measured requests down by Record.Tenant, one
	// entry per tenant present, by tenant name (requests without a tenant,
	// if any, first, under ""). It is nil (and omitted from JSON) when no
	// measured request has a tenant.
	PerTenant []TenantSummary `json:"per_tenant,omitempty"`

	SimulatedS float64 `json:"simulated_s"` // SummaryOptions.SimulatedEnd
	SimWallS   float64 `json:"sim_wall_s"`  // wall-clock time of the simulation, set by the caller
	SimEvents  int64   `json:"sim_events"`  // events processed, set by the caller
}

// Summarize reduces a run's records to a Summary. It fills every field except
// Workload, Policy, Seed, RateRPS, SimWallS and SimEvents, which the caller
// sets. Records whose Replica is outside opts.Replicas count in the totals
// but in no ReplicaSummary. A rejected record counts in Requests, Failed,
// RejectedTotal, Rejected and ByPriority only: its Replica, Dispatch and
// first token are ignored. recs is not modified. Percentiles are exact for
// up to opts.ExactLimit records and within PercentileError past it, as an
// Accumulator fed the same records computes them.
func Summarize(recs []Record, opts SummaryOptions) Summary {
	a := NewAccumulator(opts)
	for i := range recs {
		a.Add(&recs[i])
	}
	return a.Summary(opts)
}

// Prediction is the accuracy of the router's cached-token predictions.
type Prediction struct {
	// Exact, Over and Under are the shares of requests whose prediction
	// equalled, exceeded or fell short of the engine's cached tokens.
	Exact float64 `json:"exact"`
	Over  float64 `json:"over"`
	Under float64 `json:"under"`
	// MeanErrorTokens is the mean of predicted minus cached tokens;
	// MeanAbsErrorTokens the mean of its absolute value.
	MeanErrorTokens    float64 `json:"mean_error_tokens"`
	MeanAbsErrorTokens float64 `json:"mean_abs_error_tokens"`
}

type predictionAcc struct {
	n, exact, over, under int64
	sum, abs              int64
}

func (a *predictionAcc) add(diff int) {
	a.n++
	switch {
	case diff == 0:
		a.exact++
	case diff > 0:
		a.over++
	default:
		a.under++
	}
	a.sum += int64(diff)
	a.abs += int64(max(diff, -diff))
}

func (a *predictionAcc) summary() Prediction {
	if a.n == 0 {
		return Prediction{}
	}
	n := float64(a.n)
	return Prediction{
		Exact:              roundFrac(float64(a.exact) / n),
		Over:               roundFrac(float64(a.over) / n),
		Under:              roundFrac(float64(a.under) / n),
		MeanErrorTokens:    roundSig(float64(a.sum) / n),
		MeanAbsErrorTokens: roundSig(float64(a.abs) / n),
	}
}
