// The notes under the results and capacity tables: failures by reason and
// runs that look too short for their answer.

package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/results"
)

// TestResultsSayWhatFailed: the results table has a failed column, and the
// reasons are given once below it, with what they mean in the runs.
func TestResultsSayWhatFailed(t *testing.T) {
	in := synthetic(clearShapes())
	for i := range in.Runs {
		s := &in.Runs[i].Summary
		if s.Policy == "kv_aware" {
			s.Completed -= 846
			s.Failed = 846
			s.RejectedTotal = 846
			s.Rejected = map[string]int{results.RejectTooLong: 846}
			s.FailedBy = map[string]int{results.RejectTooLong: 846}
			s.FailureReasons = map[string]string{results.RejectTooLong: "prompt + max_tokens over max_model_len 32768"}
		}
	}
	var b bytes.Buffer
	if err := Markdown(&b, in, nil); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	if !strings.Contains(md, "| Goodput (req/s) | Failed | Preemptions |") {
		t.Errorf("results table lacks a failed column:\n%s", md)
	}
	if !strings.Contains(md, " | 846 | 0 |\n") || !strings.Contains(md, " | 0 | 12 |\n") {
		t.Errorf("failed counts missing from the rows:\n%s", md)
	}
	want := "- too_long: prompt + max_tokens over max_model_len 32768: 0-846 requests per run (in 2 of 6 runs)"
	if strings.Count(md, "prompt + max_tokens over max_model_len 32768") != 1 || !strings.Contains(md, want) {
		t.Errorf("want the reason once, as %q:\n%s", want, md)
	}
}

// TestResultsWarnWhenNotSteady: runs that look too short for their answer
// are named under the results table, one line per policy.
func TestResultsWarnWhenNotSteady(t *testing.T) {
	in := synthetic(clearShapes())
	for i := range in.Runs {
		if in.Runs[i].Summary.Policy == "round_robin" {
			in.Runs[i].Summary.Steady.Warning = "not steady: TTFT p99 rose from 500 ms in the first half of the measured window to 1900 ms in the second; a longer run may give another answer"
		}
	}
	var b bytes.Buffer
	if err := Markdown(&b, in, nil); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	if !strings.Contains(md, "- `round_robin`, seeds 1, 2 (the first: not steady: TTFT p99 rose from 500 ms") || strings.Count(md, "not steady:") != 1 {
		t.Errorf("want one steady-state line for round_robin:\n%s", md)
	}
}

// TestCapacitySaysWhatFailedAndWhatIsUnsure: a capacity table marks the
// fleet sizes whose runs failed requests or look unsteady, and the report
// gives the reasons and the warnings.
func TestCapacitySaysWhatFailedAndWhatIsUnsure(t *testing.T) {
	in := Input{Setup: Setup{Title: "cap", Workload: "trace:conversation_trace.jsonl", Seeds: []uint64{1}}, Capacity: &Capacity{
		RateRPS: 3.4, MaxReplicas: 16,
		Rows: []CapacityRow{
			{Policy: "cost_model", Replicas: 0, Points: []CapacityPoint{{Replicas: 16, TTFTP99Ms: 900, TPOTP99Ms: 30, Failed: 846}}},
			{Policy: "dynamo", Replicas: 5, Points: []CapacityPoint{{Replicas: 5, TTFTP99Ms: 1900, TPOTP99Ms: 30, Met: true, Unsteady: 1}}},
		},
		Failures: []string{"too_long: prompt + max_tokens over max_model_len 32768: 846 requests per run (all 4 runs)"},
		Warnings: []string{"dynamo: 5 replicas may be too few: 1 of 1 seeds' runs at 5 replicas are not steady"},
	}}
	var b bytes.Buffer
	if err := Markdown(&b, in, nil); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{"900 / 30.0 ✗ (846 failed)", "1,900 / 30.0 ✓ ⚠", "- too_long: prompt + max_tokens over max_model_len 32768: 846 requests per run",
		"- dynamo: 5 replicas may be too few"} {
		if !strings.Contains(md, want) {
			t.Errorf("capacity section lacks %q:\n%s", want, md)
		}
	}
}
