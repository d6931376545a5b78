package traces

import (
	"errors"
	"fmt"
	"time"
)

// Record is one request of a trace, in the project's own schema.
type Record struct {
	// ID is the request's id in the trace (its line number when the trace has none).
	ID uint64
	// Arrival is when the request arrived, relative to the trace's start (the
	// first record's timestamp is not necessarily 0).
	Arrival time.Duration
	// Session groups the turns of one conversation; 0 when unknown.
	Session uint64
	// Parent is the request this one continues (Bailian's parent_chat_id); 0 when none.
	Parent uint64
	// Turn is the request's 0-based turn in its session, when known.
	Turn int
	// Model names the model asked for ("" when the trace does not say).
	Model    string
	Priority int
	// InputTokens and OutputTokens are the prompt and completion lengths.
	InputTokens  int
	OutputTokens int
	// BlockSize is how many tokens each HashIDs entry covers (512 for
	// Mooncake, 16 for Bailian); 0 when the trace carries no block identity.
	BlockSize int
	// HashIDs name the prompt's blocks in order: equal ids mean identical
	// blocks with identical prefixes. The last one may cover a partial block.
	HashIDs []uint64
	// Measured is what a recording of live traffic measured for this
	// request; nil for traces that describe only the load.
	Measured *Measured
}

// Measured is one recorded request's outcome as the proxy saw it. Tenant
// and user identities are salted hashes, never the names themselves.
type Measured struct {
	// Tenant is the salted hash of the request's tenant (0 = none).
	Tenant uint64
	// Queue is the time from arrival to dispatch (admission queue wait).
	Queue time.Duration
	// TTFT, TPOT and E2E are the measured time to first token, time per
	// output token after the first, and end-to-end latency. TPOT is 0 when
	// fewer than two tokens came back.
	TTFT, TPOT, E2E time.Duration
	// Replica names the replica that served the final try ("" = none).
	Replica string
	// Outcome is "ok" or the failure reason (results.Failure* names).
	Outcome string
	// CachedTokens is the engine's usage.prompt_tokens_details.cached_tokens
	// (-1 when the engine did not report it).
	CachedTokens int
	// PredictedCachedTokens is the router's prediction for the chosen
	// replica.
	PredictedCachedTokens int
	// Policy is the routing policy that chose the replica.
	Policy string
}

// Reader streams a trace's records. Next returns io.EOF after the last one.
type Reader interface {
	Next() (Record, error)
}

// LineError is a malformed record: it names the file and line.
type LineError struct {
	File string
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// ErrBadRecord marks records a reader could not use; with SkipBad they are
// counted and skipped instead of failing the read.
var ErrBadRecord = errors.New("bad record")

// Options configure readers.
type Options struct {
	// SkipBad counts and skips malformed records instead of failing.
	SkipBad bool
	// Model fills Record.Model when the trace does not name one.
	Model string
}

// Validate checks a record's invariants: positive lengths, non-negative
// arrival, and block ids consistent with the input length.
func (r *Record) Validate() error {
	switch {
	case r.InputTokens <= 0:
		return fmt.Errorf("%w: input length %d must be positive", ErrBadRecord, r.InputTokens)
	case r.OutputTokens < 0:
		return fmt.Errorf("%w: output length %d must not be negative", ErrBadRecord, r.OutputTokens)
	case r.Arrival < 0:
		return fmt.Errorf("%w: arrival %v before the trace's start", ErrBadRecord, r.Arrival)
	case r.BlockSize < 0:
		return fmt.Errorf("%w: block size %d", ErrBadRecord, r.BlockSize)
	}
	if r.BlockSize > 0 && len(r.HashIDs) > 0 {
		if need := (r.InputTokens + r.BlockSize - 1) / r.BlockSize; len(r.HashIDs) != need {
			return fmt.Errorf("%w: %d hash ids for %d input tokens in blocks of %d (want %d)", ErrBadRecord, len(r.HashIDs), r.InputTokens, r.BlockSize, need)
		}
	}
	return nil
}
