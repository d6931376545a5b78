package results

import "time"

// Outcome is how a request ended.
type Outcome string

// The possible outcomes of a request.
const (
	// OutcomeOK: the request produced all its output tokens.
	OutcomeOK Outcome = "ok"
	// OutcomeFailed: the request failed (e.g. it could never fit in the KV
	// cache). A request the gateway refused on purpose is OutcomeRejected.
	OutcomeFailed Outcome = "failed"
	// OutcomeAborted: the request was still in flight when the run stopped,
	// or was cancelled.
	OutcomeAborted Outcome = "aborted"
	// OutcomeRejected: the gateway refused the request (queue full, queue
	// timeout, no replica, too long...); Record.Reject says why. A rejected
	// request was never dispatched and is not a failure of an engine.
	OutcomeRejected Outcome = "rejected"
)

// Reasons for a rejection, the usual values of Record.Reject. Any other
// non-empty string is allowed.
const (
	RejectQueueFull    = "queue_full"    // the gateway's queue was full
	RejectQueueTimeout = "queue_timeout" // the request waited in the queue too long
	RejectNoReplica    = "no_replica"    // no replica could take the request
	RejectTooLong      = "too_long"      // the request exceeds what any replica serves
	RejectSLOShed      = "slo_shed"      // shed to protect the latency objective
	// RejectRateLimited: the request's tenant (API key) was over its rate
	// limit, answered at once with a 429; Record.RateLimit says which.
	RejectRateLimited = "rate_limited"
	// RejectUnknown is what Summarize counts a rejected request with an
	// empty Reject under.
	RejectUnknown = "unknown"
)

// Reasons for an engine failure, the usual values of Record.Fail. An engine
// that refuses a request it can never serve uses RejectTooLong's reason too
// (prompt + max_tokens over max_model_len).
const (
	// FailTooLarge: the request's KV footprint is more than the engine's
	// whole KV cache.
	FailTooLarge = "too_large"
	// FailEngine: the engine refused or lost the request for another reason.
	FailEngine = "engine_error"
)

// Record is one request's life. Times are durations since the start of the
// run.
//
// FirstToken is meaningful only when HasFirstToken is set, and End only when
// Outcome is OutcomeOK. A rejected request (OutcomeRejected) was never
// dispatched: Summarize ignores its Replica and Dispatch.
type Record struct {
	ID      uint64
	Session uint64
	Turn    int

	// Replica is the index of the replica that served the request, or -1 if
	// the request was never dispatched.
	Replica int

	Arrival    time.Duration // the request reached the router
	Dispatch   time.Duration // the router handed it to a replica
	FirstToken time.Duration // the first output token was produced
	End        time.Duration // the last output token was produced

	HasFirstToken bool

	PromptTokens          int // prompt length in tokens
	CachedTokens          int // prompt tokens served from the replica's prefix cache
	PredictedCachedTokens int // prompt tokens the router expected to be cached
	OutputTokens          int // output tokens produced
	Preemptions           int // times the request was preempted

	Outcome Outcome
	// Reject is the reason the gateway refused the request, one of the
	// Reject* constants such as RejectQueueFull; "" unless Outcome is
	// OutcomeRejected.
	Reject string
	// RateLimit is the tenant limit that refused a rate_limited request:
	// rpm, tpm, concurrency or too_large (tenancy/limit's reasons); "" for
	// any other request.
	RateLimit string
	// Fail is the reason a request that reached an engine failed
	// (OutcomeFailed), e.g. RejectTooLong or FailTooLarge; "" when unknown
	// and for any other outcome.
	Fail string
	// RetryAfter is the Retry-After a rejection came with (the limiter's
	// for rate_limited, the gateway's for a full queue or a deadline); 0
	// when there was none.
	RetryAfter time.Duration

	// Priority and Tenant classify the request for per-class reporting
	// (Summary.ByPriority); 0 and "" when the workload has no classes.
	Priority int
	Tenant   string

	// Remote says the request prefilled on another replica than Replica
	// (disaggregated prefill/decode): PrefillReplica prefilled it and
	// Transfer is how long its KV took to reach Replica. CachedTokens is
	// then the prefill replica's. Not in the parquet trace format.
	Remote         bool
	PrefillReplica int
	Transfer       time.Duration
}

// TTFT is the time to first token, FirstToken-Arrival. It is meaningful only
// when HasFirstToken is set.
func (r *Record) TTFT() time.Duration { return r.FirstToken - r.Arrival }

// E2E is the end-to-end latency, End-Arrival. It is meaningful only when the
// outcome is OutcomeOK.
func (r *Record) E2E() time.Duration { return r.End - r.Arrival }

// TPOT is the mean time per output token after the first,
// (End-FirstToken)/(OutputTokens-1). It is defined (ok is true) only for a
// completed request with a first token and more than one output token.
func (r *Record) TPOT() (time.Duration, bool) {
	if r.Outcome != OutcomeOK || !r.HasFirstToken || r.OutputTokens <= 1 {
		return 0, false
	}
	return (r.End - r.FirstToken) / time.Duration(r.OutputTokens-1), true
}

// Queue is the router wait, Dispatch-Arrival. It is meaningful only when the
// request was dispatched (Replica >= 0 and Outcome is not OutcomeRejected).
func (r *Record) Queue() time.Duration { return r.Dispatch - r.Arrival }

// dispatched reports whether the request was handed to a replica: it has a
// replica and was not rejected.
func (r *Record) dispatched() bool { return r.Replica >= 0 && r.Outcome != OutcomeRejected }

// rejectReason is the key Summary.Rejected counts a rejected request under.
func (r *Record) rejectReason() string {
	if r.Reject == "" {
		return RejectUnknown
	}
	return r.Reject
}

// failReason is the key Summary.FailedBy counts a request that did not
// complete under: a rejection's reason, an engine failure's Fail, else its
// outcome (failed, aborted). It is "" for a completed request.
func (r *Record) failReason() string {
	switch {
	case r.Outcome == OutcomeOK:
		return ""
	case r.Outcome == OutcomeRejected:
		return r.rejectReason()
	case r.Fail != "":
		return r.Fail
	case r.Outcome == "":
		return string(OutcomeFailed)
	}
	return string(r.Outcome)
}
