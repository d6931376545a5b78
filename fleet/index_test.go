package fleet

import (
	"github.com/inferrail/inferrail/router/gateway"
	"slices"
	"testing"

	"github.com/inferrail/inferrail/engine/kvblock"
)

func TestEventFedIndexPredictsExactly(t *testing.T) {
	c := smallConfig(t, "w1", 800)
	c.Policy = "cost_model"
	c.Index = IndexEvents
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	p := out.Summary.Prediction
	if p.Exact < 0.95 {
		t.Fatalf("event-fed predictions exact for %.3f of requests, want >= 0.95 (%+v)", p.Exact, p)
	}
}

// On shared prompts the cache-aware policies beat round robin at every one
// of three seeds (TTFT p99 at most 0.7x, its median at most 0.5x: one
// 1,500-request run's p99 moves by tens of percent with the seed).
func TestCacheAwareBeatsRoundRobinOnSharedPrompts(t *testing.T) {
	if raceEnabled {
		t.Skip("simulations on one goroutine: the run without the race detector checks them")
	}
	run := func(policy string, seed uint64) (p99, hit float64) {
		c := smallConfig(t, "w1", 1500)
		c.Policy = policy
		c.Seed, c.Workload.Seed = seed, seed
		out, err := Simulate(c)
		if err != nil {
			t.Fatal(err)
		}
		return out.Summary.TTFT.P99, out.Summary.HitRate
	}
	for _, p := range []string{"cost_model", "kv_aware"} {
		var ratios []float64
		for seed := uint64(1); seed <= 3; seed++ {
			rrP99, rrHit := run("round_robin", seed)
			p99, hit := run(p, seed)
			ratios = append(ratios, p99/rrP99)
			if hit < 0.8 || hit <= rrHit || p99 > 0.7*rrP99 {
				t.Errorf("%s, seed %d: TTFT p99 %.0f ms, hit %.3f; round robin %.0f ms, %.3f", p, seed, p99, hit, rrP99, rrHit)
			}
		}
		slices.Sort(ratios)
		if ratios[1] > 0.5 {
			t.Errorf("%s: median TTFT p99 %.2fx round robin's over seeds 1-3 (%.2f), want at most 0.5x", p, ratios[1], ratios)
		}
	}
}

// Requests no engine could serve are refused before routing and leave
// nothing in the index (the router's take-back path is tested in router).
func TestRefusedRequestsLeaveNothingBehind(t *testing.T) {
	c := smallConfig(t, "w6", 40)
	c.Engine.MaxModelLen = 1500 // every w6 prompt + 1024 max tokens is too long
	c.Workload.W6.InputMinTokens = 600
	s, err := newSim(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.run(); err != nil {
		t.Fatal(err)
	}
	for i := range s.reps {
		if n := s.gws[0].core.Router().Index().Blocks(i); n != 0 {
			t.Fatalf("replica %d: index kept %d blocks of refused requests", i, n)
		}
	}
	if s.finished != 40 {
		t.Fatalf("%d of 40 requests ended", s.finished)
	}
}

func TestRestartedEngineIsForgotten(t *testing.T) {
	s, err := newSim(smallConfig(t, "w1", 10))
	if err != nil {
		t.Fatal(err)
	}
	hashes := kvblock.AppendSegmentHashes(nil, kvblock.Salt("m", "", ""), []kvblock.Segment{{ID: 1, Len: 160}}, 16, -1)
	core := s.gws[0].core
	idx := core.Router().Index()
	idx.Record(0, hashes)
	idx.Record(1, hashes)
	// Replica 0's last report read higher counters than its engine's now:
	// it restarted.
	core.Report(0, 0, gateway.Report{PrefixQueries: 1 << 40})
	s.live = 1
	s.scrape(0, 0)
	s.scrape(0, 1)
	if idx.Blocks(0) != 0 || idx.Blocks(1) != 10 {
		t.Fatalf("after replica 0 restarted: blocks %d and %d, want 0 and 10", idx.Blocks(0), idx.Blocks(1))
	}
}
