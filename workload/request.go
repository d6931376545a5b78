package workload

import (
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// Request is one inference request offered to the fleet. Sources hand out
// fresh Requests; callers must treat them as read-only.
type Request struct {
	// ID is unique in a run, assigned by the source in creation order
	// starting at 1.
	ID uint64
	// Arrival is the time the request arrives, since the run's start.
	Arrival time.Duration
	// Model names the model the request asks for.
	Model string
	// Session is the closed-loop session the request belongs to: a w2
	// chat session or a w3 agent task; 0 means none (open-loop requests,
	// including w5 batches). Sessions number from 1 in creation order.
	Session uint64
	// Turn is the 0-based turn (w3: step) of the request in its session;
	// 0 for open-loop requests.
	Turn int
	// Tenant is the request's fairness flow, like the OpenAI `user` field;
	// "" means none. Drawn from Config.Mix ("" without a mix); every turn
	// of a session has its session's tenant.
	Tenant string
	// Priority is the scheduling priority: higher is more important, 0 is
	// the default. Drawn from Config.Mix with Tenant (0 without a mix).
	Priority int
	// Prompt is the whole prompt as a segment chain.
	Prompt []kvblock.Segment
	// MaxTokens is the request's max_tokens.
	MaxTokens int
	// OutputTokens is the true output length the engine will generate,
	// in [1, MaxTokens].
	OutputTokens int
	// Output is the answer's content: Output.Len == OutputTokens. A later
	// turn that resends this answer uses this exact segment.
	Output kvblock.Segment
}

// PromptTokens returns the number of tokens in the prompt.
func (r *Request) PromptTokens() int { return kvblock.TotalLen(r.Prompt) }

// Source produces a run's requests. The simulator calls Next for open-loop
// arrivals (non-decreasing Arrival; once Next reports false it keeps doing
// so) and Done when a request completes (ok) or fails; a closed-loop source
// may answer Done with the session's next turn, whose Arrival is later than
// at (at + think time). Sources are not safe for concurrent use.
type Source interface {
	// Next returns the next open-loop arrival, or false when there are no
	// more.
	Next() (*Request, bool)
	// Done reports that req finished at time at, successfully when ok. It
	// returns the follow-up request it causes, if any.
	Done(req *Request, at time.Duration, ok bool) (*Request, bool)
}

// TakesAhead reports whether src's arrivals may be taken from Next ahead of
// their time: its Done causes no follow-up and changes nothing Next depends
// on (an open-loop source), and each request Next returns is its own (not
// overwritten by the next call). A source says so with a method
// TakesAhead() bool; any other is taken to depend on Done.
func TakesAhead(src Source) bool {
	a, ok := src.(interface{ TakesAhead() bool })
	return ok && a.TakesAhead()
}
