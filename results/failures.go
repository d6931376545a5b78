package results

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// reasonMeaning explains the failure reasons in general terms; a run's own
// SummaryOptions.Reasons may say more (the limit it hit).
var reasonMeaning = map[string]string{
	RejectQueueFull:        "the gateway's queue was full",
	RejectQueueTimeout:     "waited in the gateway's queue past its timeout",
	RejectNoReplica:        "no replica could take the request",
	RejectTooLong:          "prompt + max_tokens over max_model_len",
	RejectSLOShed:          "shed because its expected wait exceeded its deadline",
	RejectRateLimited:      "over its tenant's rate limit",
	RejectUnknown:          "rejected, no reason recorded",
	"no_capacity":          "no replica had KV capacity for it",
	FailTooLarge:           "needs more KV blocks than an engine's whole cache",
	FailEngine:             "the engine refused it",
	string(OutcomeFailed):  "failed, no reason recorded",
	string(OutcomeAborted): "still in flight when the run stopped, or cancelled",
}

// ReasonMeaning says in words what a failure reason (a key of
// Summary.FailedBy) means; an unknown reason means itself.
func ReasonMeaning(reason string) string {
	if m, ok := reasonMeaning[reason]; ok {
		return m
	}
	return reason
}

// failureReasons is Summary.FailureReasons: the meaning of each reason that
// failed a request, from the run's own reasons, else ReasonMeaning; nil when
// nothing failed.
func failureReasons(failedBy map[string]int, own map[string]string) map[string]string {
	if len(failedBy) == 0 {
		return nil
	}
	out := make(map[string]string, len(failedBy))
	for reason := range failedBy {
		if m, ok := own[reason]; ok && m != "" {
			out[reason] = m
		} else {
			out[reason] = ReasonMeaning(reason)
		}
	}
	return out
}

// byCount orders the reasons of counts by descending count, then name.
func byCount(counts map[string]int) []string {
	keys := make([]string, 0, len(counts))
	for k, n := range counts {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c := cmp.Compare(counts[b], counts[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return keys
}

// failedBy is FailedBy, or for a summary without it (written before it
// existed, or built by hand) Rejected and EngineFailed under "failed".
func (s *Summary) failedBy() map[string]int {
	if len(s.FailedBy) > 0 || s.Failed == 0 {
		return s.FailedBy
	}
	m := make(map[string]int, len(s.Rejected)+1)
	for k, n := range s.Rejected {
		m[k] += n
	}
	if s.EngineFailed > 0 {
		m[string(OutcomeFailed)] += s.EngineFailed
	}
	return m
}

// meaning is what reason means in s.
func (s *Summary) meaning(reason string) string {
	if m := s.FailureReasons[reason]; m != "" {
		return m
	}
	return ReasonMeaning(reason)
}

// FailureText says in one line how many measured requests failed and why,
// e.g. "846 failed: prompt + max_tokens over max_model_len 32768
// (too_long)", or with several reasons "900 failed: 846 prompt + max_tokens
// over max_model_len 32768 (too_long), 54 the gateway's queue was full
// (queue_full)", by descending count. It is "" when every request
// completed.
func (s *Summary) FailureText() string {
	if s.Failed == 0 {
		return ""
	}
	by := s.failedBy()
	keys := byCount(by)
	if len(keys) == 0 {
		return fmt.Sprintf("%d failed", s.Failed)
	}
	if len(keys) == 1 {
		return fmt.Sprintf("%d failed: %s (%s)", s.Failed, s.meaning(keys[0]), keys[0])
	}
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s (%s)", by[k], s.meaning(k), k)
	}
	return fmt.Sprintf("%d failed: %s", s.Failed, strings.Join(parts, ", "))
}

// FailureNote is one failure reason across several runs: what it means and
// how many requests it failed in each run.
type FailureNote struct {
	Reason  string
	Meaning string // as the first run with the reason explains it
	// Runs counts the runs with the reason, of Of runs; Min and Max are the
	// fewest and most requests it failed in one run (Min is 0 when some run
	// had none of it).
	Runs, Of int
	Min, Max int
}

// String is the note in words, e.g. "too_long: prompt + max_tokens over
// max_model_len 32768: 846 requests in every run" or "queue_full: the
// gateway's queue was full: 0-54 requests per run (in 4 of 6 runs)".
func (n FailureNote) String() string {
	count := fmt.Sprintf("%d-%d requests per run", n.Min, n.Max)
	if n.Min == n.Max {
		count = fmt.Sprintf("%d %s per run", n.Max, pluralWord(n.Max, "request", "requests"))
	}
	switch {
	case n.Of == 1:
		count = fmt.Sprintf("%d %s", n.Max, pluralWord(n.Max, "request", "requests"))
	case n.Runs == n.Of:
		count += fmt.Sprintf(" (all %d runs)", n.Of)
	default:
		count += fmt.Sprintf(" (in %d of %d runs)", n.Runs, n.Of)
	}
	return n.Reason + ": " + n.Meaning + ": " + count
}

func pluralWord(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// FailureNotes gathers the failure reasons of several runs (a comparison's
// summaries), one note per reason, by descending total, so that a table of
// runs can say once why requests failed instead of on every row. It is nil
// when every request of every run completed.
func FailureNotes(sums []Summary) []FailureNote {
	totals := map[string]int{}
	by := make([]map[string]int, len(sums))
	for i := range sums {
		by[i] = sums[i].failedBy()
		for k, n := range by[i] {
			totals[k] += n
		}
	}
	var out []FailureNote
	for _, k := range byCount(totals) {
		n := FailureNote{Reason: k, Of: len(sums), Min: -1}
		for i := range sums {
			c := by[i][k]
			if c > 0 {
				n.Runs++
				if n.Meaning == "" {
					n.Meaning = sums[i].meaning(k)
				}
			}
			if n.Min < 0 || c < n.Min {
				n.Min = c
			}
			n.Max = max(n.Max, c)
		}
		out = append(out, n)
	}
	return out
}
