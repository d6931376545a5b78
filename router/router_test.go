package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
)

func fleetOf(n int) []Replica {
	reps := make([]Replica, n)
	for i := range reps {
		reps[i] = Replica{Candidate: Candidate{Replica: i, Name: fmt.Sprintf("r%d", i)}, Healthy: true, Models: []string{"m"}}
	}
	return reps
}

func promptOf(id uint64, tokens int) *Request {
	h := kvblock.AppendSegmentHashes(nil, kvblock.Salt("m", "", ""), []kvblock.Segment{{ID: id, Len: tokens}}, 16, -1)
	return &Request{Model: "m", PromptTokens: tokens, BlockHashes: h}
}

func TestRouteRecordsPredictsAndTakesBack(t *testing.T) {
	r, err := New(Config{Policy: "cost_model"})
	if err != nil {
		t.Fatal(err)
	}
	reps := fleetOf(4)
	req := promptOf(1, 1600) // exactly 100 blocks
	d, err := r.Route(0, req, reps)
	if err != nil || d.PredictedCachedTokens != 0 {
		t.Fatalf("first route: %+v %v", d, err)
	}
	// The same prompt again goes to the same replica, predicted one block
	// short of fully cached (the engine recomputes the last token).
	d2, _ := r.Route(time.Second, req, reps)
	if d2.Replica != d.Replica || d2.PredictedCachedTokens != 1584 {
		t.Fatalf("second route: %+v, first went to %d", d2, d.Replica)
	}
	// A decision taken back before anything else touched its blocks leaves
	// nothing behind.
	other := promptOf(2, 1600)
	d3, _ := r.Route(2*time.Second, other, reps)
	before := r.Index().Blocks(d3.Replica)
	r.Abandon(d3)
	if n := r.Index().Blocks(d3.Replica); n != before-100 {
		t.Fatalf("%d blocks after taking back a 100-block record, %d before", n, before)
	}
	if d4, _ := r.Route(3*time.Second, other, reps); d4.PredictedCachedTokens != 0 {
		t.Fatalf("abandoned prompt still predicted: %+v", d4)
	}
}

func TestRouteOnlyToEligibleReplicas(t *testing.T) {
	r, _ := New(Config{Policy: "round_robin"})
	reps := fleetOf(4)
	reps[0].Healthy = false
	reps[2].Models = []string{"other"}
	for i := range 20 {
		d, err := r.Route(time.Duration(i), promptOf(uint64(i), 64), reps)
		if err != nil || d.Replica == 0 || d.Replica == 2 {
			t.Fatalf("routed to %d (%v)", d.Replica, err)
		}
	}
	reps[1].Healthy, reps[3].Healthy = false, false
	if _, err := r.Route(0, promptOf(1, 64), reps); err != ErrNoCandidates {
		t.Fatalf("no eligible replica: %v", err)
	}
}

func TestEventsModeFollowsTheEngine(t *testing.T) {
	r, _ := New(Config{Policy: "kv_aware", Index: IndexEvents, SpeculationTTL: time.Second})
	reps := fleetOf(2)
	req := promptOf(7, 320)
	d, _ := r.Route(0, req, reps)
	// Before any event, the decision itself predicts siblings' hits.
	if d2, _ := r.Route(time.Millisecond, req, reps); d2.Replica != d.Replica || d2.PredictedCachedTokens != 304 {
		t.Fatalf("sibling before events: %+v", d2)
	}
	// Unconfirmed speculation expires.
	if d3, _ := r.Route(2*time.Second, promptOf(8, 32), reps); d3.PredictedCachedTokens != 0 {
		t.Fatalf("unexpected prediction %+v", d3)
	}
	if n := r.Index().Blocks(0) + r.Index().Blocks(1); n != 2 { // only the last route's 2 blocks remain
		t.Fatalf("speculation did not expire: %d blocks", n)
	}
	// Events are the truth: stored blocks are predicted, removed ones not.
	r.KVEvents(1, []engine.KVEvent{{Kind: engine.BlockStored, BlockHashes: req.BlockHashes[:10]}})
	r.KVEvents(1, []engine.KVEvent{{Kind: engine.BlockRemoved, BlockHashes: req.BlockHashes[5:10]}})
	if d4, _ := r.Route(3*time.Second, req, reps); d4.Replica != 1 || d4.PredictedCachedTokens != 80 {
		t.Fatalf("after events: %+v", d4)
	}
	r.KVEvents(1, []engine.KVEvent{{Kind: engine.AllBlocksCleared}})
	if r.Index().Blocks(1) != 0 {
		t.Fatal("AllBlocksCleared left blocks")
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := New(Config{Policy: "cost_model", Index: "exact"}); err == nil {
		t.Fatal("unknown index mode accepted")
	}
	if _, err := New(Config{Policy: "nope"}); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

// BenchmarkRoute measures the router's work for one request: the routing
// decision (eligibility, index lookup of a 512-block prompt over every
// replica, the policy, recording and pinning the decision) and its
// completion (releasing the pins, recording the exchange), on an index that
// already holds 32 such prompts, a full 16,384-block replica's worth.
func BenchmarkRoute(b *testing.B) {
	for _, pol := range []string{"round_robin", "cost_model", "llmd"} {
		for _, n := range []int{8, 64} {
			b.Run(fmt.Sprintf("%s/%d", pol, n), func(b *testing.B) {
				r, _ := New(Config{Policy: pol})
				reps := fleetOf(n)
				prompts := make([]*Request, 32)
				for i := range prompts {
					prompts[i] = promptOf(uint64(i+1), 8192)
				}
				for i := range 4 * n {
					p := prompts[i%len(prompts)]
					d, _ := r.Route(0, p, reps)
					r.Finished(d, p.BlockHashes)
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					p := prompts[i%len(prompts)]
					d, _ := r.Route(time.Duration(i), p, reps)
					r.Finished(d, p.BlockHashes)
					i++
				}
			})
		}
	}
}
