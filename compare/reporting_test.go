// What comparisons and capacity searches report: the rate the runs ran at,
// each error once, failures by reason and answers whose runs are not steady.

package compare

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/workload"
)

var errBoom = errors.New("boom: the trace cannot be read")

// TestReportYAMLShowsTheRateItRan: the workload YAML embedded in a report
// gives the rate the runs ran at, not the base configuration's: the
// searched rate of a capacity search, the main rate of a sweep.
func TestReportYAMLShowsTheRateItRan(t *testing.T) {
	base := baseConfig(t, "w1", 100) // its rate: 3.2, the default of 4 replicas
	caps := &CapacityReport{
		Spec: CapacitySpec{Base: base, Policies: []string{"round_robin"}, Seeds: []uint64{1}, Rate: 6.4, MaxReplicas: 8},
		Results: []CapacityResult{{Policy: "round_robin", Label: "round_robin", Replicas: 6,
			Points: []SizePoint{{Replicas: 6, TTFTP99Ms: 900, TPOTP99Ms: 30, Met: true}}}},
	}
	dir := t.TempDir()
	if _, err := Write(dir, Spec{Base: base, Seeds: []uint64{1}}, nil, caps, Meta{Title: "capacity"}); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "\nrate: 6.4\n") || strings.Contains(string(md), "\nrate: 3.2\n") {
		t.Errorf("capacity report at 6.4 req/s: its workload YAML says %q", yamlRate(string(md)))
	}

	s := Spec{Base: base, Policies: []string{"round_robin"}, Seeds: []uint64{1}, Rates: []float64{5, 7}}
	pts := []Point{
		{Policy: "round_robin", Label: "round_robin", Seed: 1, Rate: 5, Replicas: 4, Summary: results.Summary{Policy: "round_robin", Requests: 1, Completed: 1}},
		{Policy: "round_robin", Label: "round_robin", Seed: 1, Rate: 7, Replicas: 4, Summary: results.Summary{Policy: "round_robin", Requests: 1, Completed: 1}},
	}
	in, err := reportInput(s, pts, nil, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(in.Setup.WorkloadYAML, "\nrate: 5\n") {
		t.Errorf("sweep whose main rate is 5 req/s: its workload YAML says %q", yamlRate("\n"+in.Setup.WorkloadYAML))
	}
}

func yamlRate(md string) string {
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "rate:") {
			return l
		}
	}
	return "(no rate)"
}

// TestUnknownPolicyReportedOnce: a bad policy list names each problem once.
func TestUnknownPolicyReportedOnce(t *testing.T) {
	for _, policies := range [][]string{{"foo"}, {"foo", "round_robin"}, {"round_robin", "foo"}} {
		s := Spec{Base: baseConfig(t, "w1", 100), Policies: policies, Seeds: []uint64{1}}
		err := s.Validate()
		if err == nil {
			t.Fatalf("%v: no error", policies)
		}
		if n := strings.Count(err.Error(), `unknown policy "foo"`); n != 1 {
			t.Errorf("%v: the unknown policy is reported %d times: %v", policies, n, err)
		}
	}
}

// TestRunReportsARepeatedFailureOnce: when every simulation fails the same
// way, the error says it once and counts the others.
func TestRunReportsARepeatedFailureOnce(t *testing.T) {
	base := baseConfig(t, "w1", 100)
	base.Source = func(uint64) (workload.Source, error) { return nil, errBoom }
	base.SourceName = "trace:boom"
	_, err := Run(context.Background(), Spec{Base: base, Policies: []string{"round_robin", "cost_model"}, Seeds: []uint64{1, 2, 3}})
	if err == nil {
		t.Fatal("no error")
	}
	if n := strings.Count(err.Error(), errBoom.Error()); n != 1 {
		t.Errorf("the failure is reported %d times: %v", n, err)
	}
	if !strings.Contains(err.Error(), "and 5 more of 6 simulations failed") {
		t.Errorf("error %v does not count the other failures", err)
	}
}

// TestCapacityNamesFailuresAndUnsteadyAnswers: a search whose runs fail
// requests says why, once; an answer whose runs look too short for it is
// flagged as possibly too low.
func TestCapacityNamesFailuresAndUnsteadyAnswers(t *testing.T) {
	s := CapacitySpec{Base: baseConfig(t, "w1", 10), Policies: []string{"round_robin"}, Seeds: []uint64{1, 2, 3}, Rate: 5, MaxReplicas: 8}
	s.Base.SLO = results.SLO{TTFTP99: 2 * time.Second, TPOTP99: 100 * time.Millisecond}
	run := func(_ context.Context, jobs []job, progress func(int, int)) ([]Point, error) {
		out := make([]Point, len(jobs))
		for i, j := range jobs {
			sum := results.Summary{Requests: 10, Completed: 10, TTFT: results.Latency{P99: 10000 / float64(j.replicas)},
				TPOT: results.Latency{P99: 20}, FailedBy: map[string]int{}}
			if j.replicas == 4 { // too small a fleet: the gateway's queue overflows
				sum.Completed, sum.Failed = 8, 2
				sum.FailedBy = map[string]int{results.RejectQueueFull: 2}
				sum.FailureReasons = map[string]string{results.RejectQueueFull: "the gateway's queue was full (1024 requests)"}
			}
			if j.replicas == 5 && j.seed == 2 {
				sum.Steady.Warning = "not steady: TTFT p99 rose from 500 ms in the first half of the measured window to 1900 ms in the second; a longer run may give another answer"
			}
			out[i] = Point{Policy: j.Policy, Label: j.Label, Seed: j.seed, Replicas: j.replicas, Summary: sum}
			progress(i+1, len(jobs))
		}
		return out, nil
	}
	res, err := capacity(context.Background(), s, run)
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if r.Replicas != 5 {
		t.Fatalf("answer %d, want 5 (points %+v)", r.Replicas, r.Points)
	}
	if !strings.Contains(r.Warning, "5 replicas may be too few: 1 of 3 seeds' runs at 5 replicas are not steady: TTFT p99 rose") {
		t.Errorf("warning %q", r.Warning)
	}
	rep := &CapacityReport{Spec: s, Results: res}
	notes := rep.FailureNotes()
	if len(notes) != 1 || !strings.Contains(notes[0].String(), "queue_full: the gateway's queue was full (1024 requests): 0-2 requests per run (in 3 of 12 runs)") {
		t.Errorf("failure notes %v", notes)
	}
	for _, p := range r.Points {
		if (p.Replicas == 4) != (p.Failed == 2) {
			t.Errorf("point %+v: failed %d", p, p.Failed)
		}
	}
	dir := t.TempDir()
	if _, err := Write(dir, Spec{Base: s.Base, Seeds: s.Seeds}, nil, rep, Meta{Title: "capacity"}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"report.md", "capacity.json"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"may be too few", "queue_full: the gateway's queue was full (1024 requests)"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("%s lacks %q", f, want)
			}
		}
	}
}

// TestCapacityOfATraceReportsTheRateItsArrivalsOffer: a trace replay runs at
// its own arrival times, so capacity.json names the trace and gives the rate
// its arrivals offered, not the unused --rate; the GPUs saved are the
// report's rule (report.Capacity.GPUsSaved).
func TestCapacityOfATraceReportsTheRateItsArrivalsOffer(t *testing.T) {
	base := baseConfig(t, "w1", 100)
	base.Source = func(uint64) (workload.Source, error) { return nil, errBoom } // never run here
	base.SourceName = "conversation_trace.jsonl"
	caps := &CapacityReport{
		Spec: CapacitySpec{Base: base, Policies: []string{"round_robin", "cost_model"}, Seeds: []uint64{1}, Rate: 3.2, MaxReplicas: 8},
		Results: []CapacityResult{
			{Policy: "round_robin", Label: "round_robin", Replicas: 6, Points: []SizePoint{{Replicas: 6, Met: true, RateRPS: 1.75}}},
			{Policy: "cost_model", Label: "cost_model", Replicas: 4, Points: []SizePoint{{Replicas: 4, Met: true, RateRPS: 1.75}}},
		},
	}
	j := caps.summary()
	if j.Trace != "conversation_trace.jsonl" || j.RateRPS != 1.75 {
		t.Errorf("capacity.json of a trace: trace %q, rate_rps %v; want the trace's name and 1.75 (what its arrivals offered)", j.Trace, j.RateRPS)
	}
	if saved, perFour, ok := caps.Savings("cost_model"); !ok || saved != 2 || perFour != 4.0*2/6 {
		t.Errorf("cost_model saves %d (%v per four, ok %v) against round robin's 6; want 2 (%v)", saved, perFour, ok, 4.0*2/6)
	}
	if p := j.Policies[1]; p.Saved == nil || *p.Saved != 2 {
		t.Errorf("capacity.json gpus_saved of cost_model: %v, want 2", p.Saved)
	}
	if j.Requests != 100 || j.DurationS != 0 || j.WarmupS != base.Warmup.Seconds() {
		t.Errorf("capacity.json run length: requests %d, duration_s %v, warmup_s %v; want 100, 0, %v", j.Requests, j.DurationS, j.WarmupS, base.Warmup.Seconds())
	}
	caps.Spec.Base.Workload.Requests, caps.Spec.Base.Workload.Duration, caps.Spec.Base.Warmup = 0, 25*time.Minute, 5*time.Minute
	if j := caps.summary(); j.Requests != 0 || j.DurationS != 1500 || j.WarmupS != 300 {
		t.Errorf("capacity.json of a 25-minute run after 5 of warm-up: requests %d, duration_s %v, warmup_s %v", j.Requests, j.DurationS, j.WarmupS)
	}
	caps.Spec.Base.Source = nil
	if got := caps.OfferedRate(); got != 3.2 {
		t.Errorf("a workload search's offered rate: %v, want the searched 3.2", got)
	}
}
