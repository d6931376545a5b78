package results

import (
	"strings"
	"testing"
	"time"
)

// stream is n requests, one every gap, each with the TTFT and end-to-end
// time its arrival gives (a function of its index).
func stream(n int, gap time.Duration, ttft, e2e func(i int) time.Duration) []Record {
	recs := make([]Record, n)
	for i := range recs {
		at := time.Duration(i) * gap
		recs[i] = Record{ID: uint64(i), Replica: 0, Arrival: at, Dispatch: at, FirstToken: at + ttft(i), End: at + e2e(i),
			HasFirstToken: true, PromptTokens: 100, OutputTokens: 50, Outcome: OutcomeOK}
	}
	return recs
}

func steadyOpts(offered float64) SummaryOptions {
	return SummaryOptions{Replicas: []ReplicaInfo{{Name: "r"}}, OfferedRate: offered}
}

func constant(d time.Duration) func(int) time.Duration { return func(int) time.Duration { return d } }

// TestSteadyStateCheck: a run whose latencies climb, whose backlog grows or
// whose arrivals fall short of the configured rate is told it looks too
// short for its answer; a steady run is not.
func TestSteadyStateCheck(t *testing.T) {
	const n = 2000
	gap := 100 * time.Millisecond // 10 req/s
	cases := []struct {
		name    string
		recs    []Record
		offered float64
		warn    string // "" for no warning
	}{
		{"steady", stream(n, gap, constant(300*ms), constant(3*s)), 10, ""},
		// The first half slower (a cold cache warming up): no warning.
		{"settling", stream(n, gap, func(i int) time.Duration {
			if i < n/2 {
				return 900 * ms
			}
			return 300 * ms
		}, constant(3*s)), 10, ""},
		// A queue building up: every request waits 10 ms longer than the
		// one before it.
		{"climbing", stream(n, gap, func(i int) time.Duration { return 100*ms + time.Duration(i)*10*ms },
			func(i int) time.Duration { return 2*s + time.Duration(i)*10*ms }), 10, "TTFT p99 rose from"},
		// A rise too small to matter against the 2 s TTFT bound.
		{"small rise", stream(n, gap, func(i int) time.Duration { return 20*ms + time.Duration(i)*50*time.Microsecond },
			constant(3*s)), 10, ""},
		// Time to first token steady, but answers take longer and longer:
		// requests pile up.
		{"backlog", stream(n, gap, constant(300*ms), func(i int) time.Duration { return 2*s + time.Duration(i)*50*ms }), 10,
			"a growing backlog"},
		// The requests came at 10 req/s against 14 configured (a closed loop
		// still ramping up).
		{"short of the rate", stream(n, gap, constant(300*ms), constant(3*s)), 14, "against the 14 configured"},
		{"rate unknown", stream(n, gap, constant(300*ms), constant(3*s)), 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := Summarize(c.recs, steadyOpts(c.offered)).Steady
			if !st.Checked {
				t.Fatalf("not checked: %+v", st)
			}
			if c.warn == "" && st.Warning != "" {
				t.Errorf("warning %q for a steady run: %+v", st.Warning, st)
			}
			if c.warn != "" && !strings.Contains(st.Warning, c.warn) {
				t.Errorf("warning %q, want one saying %q: %+v", st.Warning, c.warn, st)
			}
		})
	}
}

// TestSteadyStateNeedsRequests: with fewer than SteadyMinRequests per half
// the check is not made, and says so.
func TestSteadyStateNeedsRequests(t *testing.T) {
	recs := stream(2*SteadyMinRequests-2, 100*ms, func(i int) time.Duration { return time.Duration(i) * 100 * ms }, constant(s))
	st := Summarize(recs, steadyOpts(10)).Steady
	if st.Checked || st.Warning != "" {
		t.Errorf("checked with too few requests: %+v", st)
	}
}

// TestFormatTableWarnsWhenNotSteady: the text table carries the warning.
func TestFormatTableWarnsWhenNotSteady(t *testing.T) {
	recs := stream(2000, 100*ms, func(i int) time.Duration { return 100*ms + time.Duration(i)*10*ms }, constant(30*s))
	sum := Summarize(recs, steadyOpts(10))
	sum.Policy = "dynamo"
	var b strings.Builder
	if err := FormatTable(&b, []Summary{sum}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "dynamo: warning: not steady: TTFT p99 rose from") {
		t.Errorf("table lacks the warning:\n%s", b.String())
	}
}
