package results

import "time"

// Outcome is how a request ended.
type Outcome string

// The possible outcomes of a request.
const (
	// OutcomeOK: the request produced all its output tokens.
	OutcomeOK Outcome = "ok"
	// OutcomeFailed: the request was rejected or failed (e.g. it could never
	// fit in the KV cache).
	OutcomeFailed Outcome = "failed"
	// OutcomeAborted: the request was still in flight when the run stopped,
	// or was cancelled.
	OutcomeAborted Outcome = "aborted"
)

// Record is one request's life. Times are durations since the start of the
// run.
//
// FirstToken is meaningful only when HasFirstToken is set, and End only when
// Outcome is OutcomeOK.
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
// request was dispatched (Replica >= 0).
func (r *Record) Queue() time.Duration { return r.Dispatch - r.Arrival }
