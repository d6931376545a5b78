package compare

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/workload"
)

func baseConfig(t *testing.T, wl string, requests int) fleet.Config {
	t.Helper()
	c := fleet.DefaultConfig()
	w, err := workload.DefaultConfig(wl)
	if err != nil {
		t.Fatal(err)
	}
	c.Workload = w
	c.Workload.Requests = requests
	c.Workload.Rate = fleet.DefaultRate(wl, c.Replicas)
	return c
}

func TestSameResultsWhateverTheParallelism(t *testing.T) {
	spec := Spec{
		Base:     baseConfig(t, "w1", 300),
		Policies: []string{"round_robin", "p2c", "cost_model"},
		Seeds:    []uint64{1, 2},
		Rates:    []float64{2, 3},
	}
	var outs [][]byte
	for _, par := range []int{1, 2, 5} {
		spec.Parallel = par
		pts, err := Run(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(Summaries(pts))
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, b)
		if len(pts) != 12 || pts[0].Policy != "round_robin" || pts[0].Rate != 2 || pts[1].Seed != 2 || pts[11].Policy != "cost_model" {
			t.Fatalf("points out of order: %v %v %v", pts[0].Policy, pts[1].Seed, pts[11].Policy)
		}
	}
	for i := 1; i < len(outs); i++ {
		if string(outs[i]) != string(outs[0]) {
			t.Fatal("results differ with the parallelism")
		}
	}
}

func TestBadSpecFailsBeforeRunning(t *testing.T) {
	spec := Spec{Base: baseConfig(t, "w1", 100), Policies: []string{"round_robin", "fastest"}, Seeds: []uint64{1}, Rates: []float64{-1}}
	started := false
	spec.Progress = func(int, int) { started = true }
	_, err := Run(context.Background(), spec)
	if err == nil || !strings.Contains(err.Error(), "fastest") || !strings.Contains(err.Error(), "rates") {
		t.Fatalf("error %v should name the unknown policy and the bad rate", err)
	}
	if started {
		t.Fatal("a simulation ran before validation failed")
	}
}

// fakeRun answers with a latency that falls with fleet size: TTFT p99 is
// 10 s / replicas, so a 2 s SLO is met from 5 replicas on (6 for the
// "slower" policy, never for "hopeless").
func fakeRun(probed map[string][]int) runner {
	return func(_ context.Context, jobs []job, progress func(int, int)) ([]Point, error) {
		out := make([]Point, len(jobs))
		for i, j := range jobs {
			ttft := 10000.0 / float64(j.replicas)
			switch j.Policy {
			case "slower":
				ttft *= 1.2
			case "hopeless":
				ttft = 1e9
			}
			out[i] = Point{Policy: j.Policy, Label: j.Label, Seed: j.seed, Replicas: j.replicas, Summary: results.Summary{
				Requests: 10, Completed: 10, TTFT: results.Latency{P99: ttft}, TPOT: results.Latency{P99: 20},
			}}
			if j.seed == 1 {
				probed[j.Policy] = append(probed[j.Policy], j.replicas)
			}
			progress(i+1, len(jobs))
		}
		return out, nil
	}
}

func TestCapacitySearchFindsTheKnownAnswer(t *testing.T) {
	s := CapacitySpec{
		Base:        baseConfig(t, "w1", 10),
		Policies:    []string{"round_robin", "cost_model", "p2c"},
		Seeds:       []uint64{1, 2, 3},
		Rate:        5,
		MaxReplicas: 16,
	}
	s.Base.SLO = results.SLO{TTFTP99: 2 * time.Second, TPOTP99: 100 * time.Millisecond}
	probed := map[string][]int{}
	// The policy names are real (Validate checks them); fakeRun keys on
	// them: relabel two as "slower" and "hopeless" inside the fake.
	run := fakeRun(probed)
	relabel := func(ctx context.Context, jobs []job, progress func(int, int)) ([]Point, error) {
		for i := range jobs {
			switch jobs[i].Policy {
			case "cost_model":
				jobs[i].Policy = "slower"
			case "p2c":
				jobs[i].Policy = "hopeless"
			}
		}
		return run(ctx, jobs, progress)
	}
	res, err := capacity(context.Background(), s, relabel)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"round_robin": 5, "cost_model": 6, "p2c": 0}
	for _, r := range res {
		if r.Replicas != want[r.Policy] {
			t.Errorf("%s: %d replicas, want %d (points %+v)", r.Policy, r.Replicas, want[r.Policy], r.Points)
		}
	}
	// Binary search: at most 1 + log2(16) probes per policy.
	if n := len(probed["round_robin"]); n > 5 {
		t.Errorf("round_robin probed %d sizes: %v", n, probed["round_robin"])
	}
	if !reflect.DeepEqual(probed["hopeless"], []int{16}) {
		t.Errorf("a policy failing at the maximum should stop there, probed %v", probed["hopeless"])
	}
}

func TestCapacityOnARealFleetIsMonotoneInLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates")
	}
	base := baseConfig(t, "w6", 400)
	base.Warmup = 20 * time.Second
	need := func(rate float64) int {
		res, err := Capacity(context.Background(), CapacitySpec{Base: base, Policies: []string{"round_robin"}, Seeds: []uint64{1, 2, 3}, Rate: rate, MaxReplicas: 12})
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Replicas
	}
	low, high := need(4), need(16)
	if low < 1 || high <= low {
		t.Fatalf("replicas needed: %d at 4 req/s, %d at 16 req/s", low, high)
	}
}

func TestPolicyListAllCoversEveryPolicyOnce(t *testing.T) {
	all := PolicyList("all")
	if all[0] != "round_robin" || len(all) != len(routerNames()) {
		t.Fatalf("all = %v", all)
	}
	seen := map[string]bool{}
	for _, p := range all {
		if seen[p] {
			t.Fatalf("%s twice", p)
		}
		seen[p] = true
	}
	if got := PolicyList(" p2c, cost_model ,"); !reflect.DeepEqual(got, []string{"p2c", "cost_model"}) {
		t.Fatalf("list parsing: %v", got)
	}
}

func routerNames() []string { return router.Names() }
