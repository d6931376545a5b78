package results

import (
	"bytes"
	"strings"
	"testing"
)

func TestFormatTable(t *testing.T) {
	a := Summarize(syntheticRecords(4000, 16), syntheticOptions(16))
	a.Policy, a.Workload, a.Seed = "prefix-aware", "agentic", 3
	b := Summarize(handRecords(), handOptions())
	b.Policy, b.Workload, b.Seed = "round-robin", "chat", 1

	var buf bytes.Buffer
	if err := FormatTable(&buf, []Summary{a, b}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	t.Logf("\n%s", out)
	for _, want := range []string{"policy", "prefix-aware", "round-robin", "4/6", "2920", "replica-p", "r1 3 16.7% 25.0%"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if len(line) > tableWidth {
			t.Errorf("line %d is %d columns wide: %q", i+1, len(line), line)
		}
		if strings.HasSuffix(line, " ") {
			t.Errorf("line %d has trailing spaces: %q", i+1, line)
		}
	}

	var again bytes.Buffer
	if err := FormatTable(&again, []Summary{a, b}); err != nil || again.String() != out {
		t.Errorf("FormatTable is not deterministic (err %v)", err)
	}
}

// TestFormatTableAdmission: a run with admission says what the gateway
// queued and refused; one without says nothing of it.
func TestFormatTableAdmission(t *testing.T) {
	a := Summarize(handRecords(), handOptions())
	a.Policy, a.Workload = "cost_model", "w7"
	var plain bytes.Buffer
	if err := FormatTable(&plain, []Summary{a}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain.String(), "admission") {
		t.Fatalf("no admission, yet the table speaks of it:\n%s", plain.String())
	}
	a.Admission = "kv"
	a.RejectedTotal = 5
	a.Rejected = map[string]int{"queue_timeout": 3, "queue_full": 2}
	a.PeakReservedOverCapacity = 0.98
	var buf bytes.Buffer
	if err := FormatTable(&buf, []Summary{a}); err != nil {
		t.Fatal(err)
	}
	want := "rejected 5 (queue_full 2, queue_timeout 3), peak reserved 98.0% of capacity"
	if !strings.Contains(buf.String(), "cost_model admission kv: queue p50/p99") || !strings.Contains(buf.String(), want) {
		t.Fatalf("table lacks the admission line %q:\n%s", want, buf.String())
	}
}

// A summary past its exact limit says how far its percentiles may be off;
// an exact one says nothing of it.
func TestFormatTableSketched(t *testing.T) {
	recs := syntheticRecords(3000, 4)
	opts := syntheticOptions(4)
	exact := Summarize(recs, opts)
	opts.ExactLimit = 1000
	sketched := Summarize(recs, opts)
	exact.Policy, sketched.Policy = "exact", "sketched"
	var buf bytes.Buffer
	if err := FormatTable(&buf, []Summary{exact, sketched}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, "sketched: percentiles within 0.4% of the exact ones") || strings.Contains(out, "exact: percentiles within") {
		t.Fatalf("table:\n%s", out)
	}
}
