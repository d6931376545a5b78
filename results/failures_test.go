package results

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// tooLongRun is a replay in which some prompts are over the engine's
// max_model_len, as the Mooncake conversation trace's are: the gateway
// refuses them (too_long), and an engine refuses one too large for its cache.
func tooLongRun() ([]Record, SummaryOptions) {
	var recs []Record
	for i := range 20 {
		at := time.Duration(i) * s
		r := Record{ID: uint64(i), Replica: 0, Arrival: at, Dispatch: at, FirstToken: at + 100*ms, End: at + 2*s,
			HasFirstToken: true, PromptTokens: 1000, OutputTokens: 20, Outcome: OutcomeOK}
		switch {
		case i%5 == 1:
			r = Record{ID: uint64(i), Replica: -1, Arrival: at, PromptTokens: 40000, Outcome: OutcomeRejected, Reject: RejectTooLong}
		case i == 7:
			r = Record{ID: uint64(i), Replica: -1, Arrival: at, Dispatch: at, PromptTokens: 30000, Outcome: OutcomeFailed, Fail: FailTooLarge}
		}
		recs = append(recs, r)
	}
	return recs, SummaryOptions{Replicas: []ReplicaInfo{{Name: "r0"}}, SimulatedEnd: 25 * s,
		Reasons: map[string]string{RejectTooLong: "prompt + max_tokens over max_model_len 32768"}}
}

// TestFailuresHaveReasons: a run that fails requests says how many, by
// reason, and what each reason means in this run, in the summary and in
// its JSON.
func TestFailuresHaveReasons(t *testing.T) {
	recs, opts := tooLongRun()
	got := Summarize(recs, opts)
	if got.Failed != 5 || got.FailedBy[RejectTooLong] != 4 || got.FailedBy[FailTooLarge] != 1 || len(got.FailedBy) != 2 {
		t.Fatalf("failed %d by %v, want 5: too_long 4, too_large 1", got.Failed, got.FailedBy)
	}
	if m := got.FailureReasons[RejectTooLong]; m != "prompt + max_tokens over max_model_len 32768" {
		t.Errorf("too_long means %q, want the run's own words", m)
	}
	if m := got.FailureReasons[FailTooLarge]; m != ReasonMeaning(FailTooLarge) || m == FailTooLarge {
		t.Errorf("too_large means %q, want the general meaning", m)
	}
	want := "5 failed: 4 prompt + max_tokens over max_model_len 32768 (too_long), 1 needs more KV blocks than an engine's whole cache (too_large)"
	if txt := got.FailureText(); txt != want {
		t.Errorf("FailureText() = %q, want %q", txt, want)
	}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"failed_by": {`, `"too_long": 4`, `"failure_reasons": {`, `"too_long": "prompt + max_tokens over max_model_len 32768"`} {
		if !strings.Contains(buf.String(), k) {
			t.Errorf("JSON lacks %s:\n%s", k, buf.String())
		}
	}

	// One reason: the line names it once.
	recs = recs[:5]
	one := Summarize(recs, opts)
	if txt := one.FailureText(); txt != "1 failed: prompt + max_tokens over max_model_len 32768 (too_long)" {
		t.Errorf("one reason: FailureText() = %q", txt)
	}
	// Nothing failed: nothing to say, and no reasons in the JSON.
	ok := Summarize(recs[:1], opts)
	if ok.FailureText() != "" || ok.FailureReasons != nil || ok.FailedBy == nil {
		t.Errorf("no failure: text %q, reasons %v, failed_by %v", ok.FailureText(), ok.FailureReasons, ok.FailedBy)
	}
}

// TestFormatTablePrintsFailures: the text table says why requests failed.
func TestFormatTablePrintsFailures(t *testing.T) {
	recs, opts := tooLongRun()
	sum := Summarize(recs, opts)
	sum.Policy, sum.Workload = "cost_model", "trace:conversation_trace.jsonl"
	var buf bytes.Buffer
	if err := FormatTable(&buf, []Summary{sum}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, "cost_model: 5 failed: 4 prompt + max_tokens over max_model_len 32768 (too_long),") {
		t.Errorf("table lacks the failures line:\n%s", out)
	}
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if len(line) > tableWidth {
			t.Errorf("line %d is %d columns wide: %q", i+1, len(line), line)
		}
	}
}

// TestFailureNotes: a comparison's runs say once per reason why requests
// failed, with the spread over runs.
func TestFailureNotes(t *testing.T) {
	recs, opts := tooLongRun()
	a := Summarize(recs, opts)
	b := Summarize(recs[:5], opts) // too_long 1, no too_large
	c := Summarize(recs[:1], opts) // nothing failed
	notes := FailureNotes([]Summary{a, b, c})
	if len(notes) != 2 {
		t.Fatalf("notes %v, want one per reason", notes)
	}
	want := []string{
		"too_long: prompt + max_tokens over max_model_len 32768: 0-4 requests per run (in 2 of 3 runs)",
		"too_large: needs more KV blocks than an engine's whole cache: 0-1 requests per run (in 1 of 3 runs)",
	}
	for i, n := range notes {
		if n.String() != want[i] {
			t.Errorf("note %d = %q, want %q", i, n, want[i])
		}
	}
	same := FailureNotes([]Summary{b, b})
	if len(same) != 1 || same[0].String() != "too_long: prompt + max_tokens over max_model_len 32768: 1 request per run (all 2 runs)" {
		t.Errorf("same in every run: %v", same)
	}
	if FailureNotes([]Summary{c}) != nil {
		t.Error("notes for runs without failures")
	}
	// A summary written before FailedBy existed still says what it can.
	old := Summary{Failed: 3, EngineFailed: 1, RejectedTotal: 2, Rejected: map[string]int{RejectQueueFull: 2}}
	if n := FailureNotes([]Summary{old}); len(n) != 2 || n[0].Reason != RejectQueueFull || n[1].Reason != "failed" {
		t.Errorf("old summary: %v", n)
	}
}

// TestGoodputOverTheMeasuredWindow: goodput counts the requests meeting the
// SLO per second of the measured window, from the first to the last
// measured arrival, not of the drain after it. A fleet meeting the SLO for
// every request offered 6 req/s has a goodput of 6 req/s, however long its
// last requests take to finish.
func TestGoodputOverTheMeasuredWindow(t *testing.T) {
	var recs []Record
	const n = 6001 // every 1/6 s for 1000 s
	for i := range n {
		at := time.Duration(i) * s / 6
		e2e := 2 * s
		if i >= n-60 {
			e2e = 60 * s // a long drain: the last ten seconds' answers take a minute
		}
		recs = append(recs, Record{ID: uint64(i), Replica: 0, Arrival: at, Dispatch: at, FirstToken: at + 200*ms,
			End: at + e2e, HasFirstToken: true, PromptTokens: 100, OutputTokens: 2000, Outcome: OutcomeOK})
	}
	got := Summarize(recs, SummaryOptions{Replicas: []ReplicaInfo{{Name: "r"}}, SimulatedEnd: 1060 * s,
		SLO: SLO{TTFTP99: 2 * s, TPOTP99: time.Second}})
	if got.SLOAttainment != 1 {
		t.Fatalf("attainment %v, want every request within the SLO", got.SLOAttainment)
	}
	if got.WindowS != 1000 || got.DurationS != 1060 {
		t.Errorf("window %v s, span %v s; want 1000 (first to last arrival) and 1060 (to the last end)", got.WindowS, got.DurationS)
	}
	if got.GoodputRPS != 6.001 {
		t.Errorf("goodput %v req/s, want 6001 requests / 1000 s = 6.001 (offered 6)", got.GoodputRPS)
	}
	if got.ThroughputRPS >= got.GoodputRPS {
		t.Errorf("throughput %v, over the span with its drain, should be below goodput %v", got.ThroughputRPS, got.GoodputRPS)
	}
}
