package workload

import "fmt"

// Lengths are the mean token counts of a workload's requests.
type Lengths struct {
	Prompt float64 // mean prompt tokens
	Output float64 // mean output tokens (the true lengths, not max_tokens)
	// Requests is how many requests the means are over.
	Requests int
}

// MeanLengths draws the first n requests of c's workload (Next, and the
// follow-ups Done returns as if every request completed at its arrival,
// taken in arrival order, so that a chat's later, longer turns count) and
// returns their mean prompt and output lengths. The draw runs at a fixed
// rate of 1 req/s, so that the run's length and rate do not change them;
// c's seed picks the requests.
func MeanLengths(c Config, n int) (Lengths, error) {
	if n < 1 {
		return Lengths{}, fmt.Errorf("mean lengths: want at least one request, got %d", n)
	}
	c.Requests, c.Duration, c.Rate = n, 0, 1
	src, err := New(c)
	if err != nil {
		return Lengths{}, err
	}
	var (
		l       Lengths
		pending []*Request // follow-ups not yet taken
		next    *Request   // the next open-loop arrival, if any
		open    = true
	)
	for l.Requests < n {
		if next == nil && open {
			next, open = src.Next()
			if !open {
				next = nil
			}
		}
		// The earliest of the next open-loop arrival and the follow-ups.
		k := -1
		for i, p := range pending {
			if k < 0 || p.Arrival < pending[k].Arrival {
				k = i
			}
		}
		var r *Request
		switch {
		case k >= 0 && (next == nil || pending[k].Arrival < next.Arrival):
			r = pending[k]
			pending = append(pending[:k], pending[k+1:]...)
		case next != nil:
			r, next = next, nil
		default:
			if l.Requests == 0 {
				return Lengths{}, fmt.Errorf("mean lengths: workload %s made no request", c.Workload)
			}
			l.Prompt /= float64(l.Requests)
			l.Output /= float64(l.Requests)
			return l, nil
		}
		l.Requests++
		l.Prompt += float64(r.PromptTokens())
		l.Output += float64(r.OutputTokens)
		if f, ok := src.Done(r, r.Arrival, true); ok {
			pending = append(pending, f)
		}
	}
	l.Prompt /= float64(l.Requests)
	l.Output /= float64(l.Requests)
	return l, nil
}
