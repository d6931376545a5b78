package router

import (
	"testing"

	"github.com/inferrail/inferrail/engine"
)

// Approximate mode: a prompt pushed out of the GPU's shadow LRU by newer
// ones is still in the tiers' (GPU plus tier capacity), and predicted
// there right after what the GPU still holds.
func TestTierIndexApproximate(t *testing.T) {
	r, err := New(Config{Policy: "round_robin", TierBlocks: 200})
	if err != nil {
		t.Fatal(err)
	}
	r.SetCapacity(0, 100)
	reps := fleetOf(1)
	a := promptOf(1, 80*16)
	d, _ := r.Route(0, a, reps)
	r.Finished(d, a.BlockHashes)
	for id := uint64(2); id <= 3; id++ {
		p := promptOf(id, 80*16)
		d, _ := r.Route(0, p, reps)
		r.Finished(d, p.BlockHashes)
	}
	d, _ = r.Route(0, a, reps)
	if d.PredictedCachedTokens != 0 || d.PredictedTierTokens != 79*16 {
		t.Errorf("evicted prompt: GPU %d, tier %d tokens; want 0 and %d (all but the last block)", d.PredictedCachedTokens, d.PredictedTierTokens, 79*16)
	}
	// Without tiers nothing is predicted there.
	plain, _ := New(Config{Policy: "round_robin"})
	plain.SetCapacity(0, 100)
	d, _ = plain.Route(0, a, reps)
	if d.PredictedTierTokens != 0 {
		t.Errorf("no tiers: %d tier tokens", d.PredictedTierTokens)
	}
}

// Events mode: GPU events feed the main index, CPU and disk events the
// tier index; the tier prediction continues the GPU prefix.
func TestTierIndexEvents(t *testing.T) {
	r, err := New(Config{Policy: "round_robin", Index: IndexEvents, TierBlocks: 1000})
	if err != nil {
		t.Fatal(err)
	}
	reps := fleetOf(1)
	p := promptOf(7, 40*16)
	h := p.BlockHashes
	r.KVEvents(0, []engine.KVEvent{
		{Kind: engine.BlockStored, BlockHashes: h[:10], BlockSize: 16, Medium: engine.MediumGPU},
		{Kind: engine.BlockStored, BlockHashes: h[10:20], BlockSize: 16, Medium: engine.MediumCPU},
		{Kind: engine.BlockStored, BlockHashes: h[20:25], BlockSize: 16, Medium: engine.MediumDisk},
	})
	check := func(what string, gpu, tier int) {
		t.Helper()
		c := r.Candidates(0, p, reps, nil)
		if len(c) != 1 || c[0].PredictedCachedTokens != gpu*16 || c[0].PredictedTierTokens != tier*16 {
			t.Errorf("%s: %+v, want %d GPU and %d tier blocks", what, c, gpu, tier)
		}
	}
	check("stored", 10, 15)
	r.KVEvents(0, []engine.KVEvent{{Kind: engine.BlockRemoved, BlockHashes: h[10:11], Medium: engine.MediumCPU}})
	check("first CPU block removed", 10, 0)
	r.KVEvents(0, []engine.KVEvent{{Kind: engine.AllBlocksCleared}})
	check("cleared", 0, 0)

	// A router without tiers never counts a CPU event as a GPU block.
	g, _ := New(Config{Policy: "round_robin", Index: IndexEvents})
	g.KVEvents(0, []engine.KVEvent{{Kind: engine.BlockStored, BlockHashes: h[:10], BlockSize: 16, Medium: engine.MediumCPU}})
	if c := g.Candidates(0, p, reps, nil); c[0].PredictedCachedTokens != 0 {
		t.Errorf("a CPU event counted on the GPU: %+v", c)
	}
}

// cost_model prices tier tokens at their load time, not as a prefill; the
// peers weight a tier block below a GPU one and above none.
func TestTierCredit(t *testing.T) {
	o := Options{TierLoadNsPerToken: 200}.withDefaults()
	cm := NewCostModel(o)
	none := Candidate{Replica: 0}
	tier := Candidate{Replica: 1, PredictedTierTokens: 4000}
	gpu := Candidate{Replica: 2, PredictedCachedTokens: 4000}
	en, et, eg := cm.EstimateTTFT(5000, &none), cm.EstimateTTFT(5000, &tier), cm.EstimateTTFT(5000, &gpu)
	if !(eg < et && et < en) {
		t.Errorf("cost_model estimates: GPU hit %v, tier hit %v, none %v; want GPU < tier < none", eg, et, en)
	}
	// The tier tokens cost exactly their load over the GPU hit (the
	// attention term is the same: both are context of the uncached part).
	if got, want := et-eg, 4000*200/1e6; got < want-1e-9 || got > want+1e-9 {
		t.Errorf("tier hit costs %v ms over a GPU hit, want the load, %v", got, want)
	}
	if e := NewCostModel(Options{}).EstimateTTFT(5000, &tier); e != NewCostModel(Options{}).EstimateTTFT(5000, &none) {
		t.Errorf("without a load price a tier hit is credited: %v", e)
	}
	for _, name := range []string{"dynamo", "llmd"} {
		p, _ := NewPolicy(name, Options{})
		req := &Request{Model: "m", PromptTokens: 5000}
		cands := []Candidate{none, tier}
		if i := p.Pick(req, cands); i != 1 {
			t.Errorf("%s picks %d between no hit and a tier hit", name, i)
		}
		cands = []Candidate{tier, gpu}
		if i := p.Pick(req, cands); i != 1 {
			t.Errorf("%s picks %d between a tier hit and a GPU hit", name, i)
		}
	}
}
