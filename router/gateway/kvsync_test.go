package gateway

import (
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/router"
)

func eventsCore(t *testing.T, n int) *Core {
	t.Helper()
	cfg := testConfig("kv_aware")
	cfg.Router.Index = router.IndexEvents
	cfg.Router.SpeculationTTL = time.Millisecond
	return newCore(t, cfg, n, ReplicaConfig{})
}

// depth is how many leading blocks of hashes the core's index places on
// replica.
func depth(c *Core, replica int, hashes []kvblock.Hash) int {
	d := make([]int, 1)
	c.Router().Index().Lookup(hashes, []int{replica}, d)
	return d[0]
}

// kvTokens is a 4-block prompt's tokens and the core's hashes of them.
func kvTokens(c *Core) ([]uint32, []kvblock.Hash) {
	tokens := kvblock.AppendSegmentTokens(nil, []kvblock.Segment{{ID: 7, Len: 64}})
	return tokens, kvblock.AppendHashes(nil, c.Salt(), tokens, 16)
}

func stored(tokens []uint32, parent uint64, hasParent bool, ids ...uint64) KVEvent {
	return KVEvent{Kind: engine.BlockStored, Blocks: ids, TokenIDs: tokens, Parent: parent, HasParent: hasParent}
}

// Engine events carry the engine's own block ids and the tokens: the core
// recomputes its own hashes from them, so its index finds the prompt.
func TestKVEventsTranslation(t *testing.T) {
	c := eventsCore(t, 2)
	if c.Salt() != kvblock.Salt(testModel, "", "") {
		t.Fatal("salt")
	}
	tokens, ours := kvTokens(c)
	idx := c.Router().Index()

	c.KVEvents(0, 0, []KVEvent{stored(tokens[:32], 0, false, 1001, 1002)})
	if d := depth(c, 0, ours); d != 2 || idx.Blocks(0) != 2 {
		t.Fatalf("after storing blocks 0-1: depth %d, %d blocks", d, idx.Blocks(0))
	}
	c.KVEvents(0, 0, []KVEvent{stored(tokens[32:48], 1002, true, 1003)})
	if d := depth(c, 0, ours); d != 3 {
		t.Fatalf("after storing block 2 under 1002: depth %d", d)
	}
	// Skipped: a parent never seen (events from before the subscription),
	// tokens that are not a whole number of blocks, another block size.
	c.KVEvents(0, 0, []KVEvent{
		stored(tokens[48:64], 9999, true, 2001),
		stored(tokens[:16], 0, false, 2002, 2003),
		{Kind: engine.BlockStored, Blocks: []uint64{2004}, TokenIDs: tokens[:32], BlockSize: 32},
		{Kind: engine.BlockStored, Blocks: []uint64{2005}, Own: ours[:2]},
	})
	if idx.Blocks(0) != 3 {
		t.Fatalf("skipped events stored blocks: %d", idx.Blocks(0))
	}
	// The engine's block size, stated, is fine.
	c.KVEvents(0, 0, []KVEvent{{Kind: engine.BlockStored, Blocks: []uint64{1004}, TokenIDs: tokens[48:64], Parent: 1003, HasParent: true, BlockSize: 16}})
	if d := depth(c, 0, ours); d != 4 {
		t.Fatalf("depth %d after the fourth block", d)
	}
	// (The count is of events received, the skipped ones included.)
	if s := c.State(0, 0); s.KVEventsApplied != 7 {
		t.Fatalf("%d events applied", s.KVEventsApplied)
	}
	// Replica 1's ids are its own.
	c.KVEvents(0, 1, []KVEvent{stored(tokens[:16], 0, false, 1001)})
	// Removal goes through the map; unknown ids are ignored.
	c.KVEvents(0, 0, []KVEvent{{Kind: engine.BlockRemoved, Blocks: []uint64{1002, 5555}}})
	if d := depth(c, 0, ours); d != 1 || idx.Blocks(0) != 3 {
		t.Fatalf("after removing block 1: depth %d, %d blocks", d, idx.Blocks(0))
	}
	c.KVEvents(0, 0, []KVEvent{{Kind: engine.BlockRemoved, Blocks: []uint64{1002}}})
	if idx.Blocks(0) != 3 {
		t.Fatal("a second removal of the same id removed something")
	}
	if d := depth(c, 1, ours); d != 1 {
		t.Fatalf("replica 1: depth %d", d)
	}
	// AllBlocksCleared: nothing left, and the old ids are forgotten (a child
	// of one is skipped).
	c.KVEvents(0, 0, []KVEvent{{Kind: engine.AllBlocksCleared}})
	if idx.Blocks(0) != 0 || depth(c, 1, ours) != 1 {
		t.Fatalf("after clearing: %d blocks on 0, depth %d on 1", idx.Blocks(0), depth(c, 1, ours))
	}
	c.KVEvents(0, 0, []KVEvent{stored(tokens[16:32], 1001, true, 1010)})
	if idx.Blocks(0) != 0 {
		t.Fatal("a child of a block stored before the clear was placed")
	}
	// A stored block's chain, routed: the prediction follows the events.
	c.KVEvents(0, 0, []KVEvent{stored(tokens, 0, false, 1, 2, 3, 4)})
	q := Request{ID: 1, PromptTokens: 80, PromptKnown: true, BlockHashes: ours}
	if d := submit(t, c, time.Second, q, Dispatched); d.Replica != 0 || d.PredictedCachedTokens != 64 {
		t.Fatalf("%+v: want replica 0, 64 tokens predicted", d)
	}
}

// The simulated engine hashes as the core does: its events carry the
// hashes themselves.
func TestKVEventsOwnHashes(t *testing.T) {
	c := eventsCore(t, 1)
	_, ours := kvTokens(c)
	ev := FromEngine(engine.KVEvent{Kind: engine.BlockStored, BlockHashes: ours[:2], BlockSize: 16, Medium: engine.MediumGPU})
	if len(ev.Blocks) != 2 || ev.Blocks[0] != ours[0].Lo || ev.Blocks[1] != ours[1].Lo || ev.HasParent {
		t.Fatalf("%+v", ev)
	}
	c.KVEvents(0, 0, []KVEvent{ev})
	if d := depth(c, 0, ours); d != 2 {
		t.Fatalf("depth %d", d)
	}
	c.KVEvents(0, 0, []KVEvent{FromEngine(engine.KVEvent{Kind: engine.BlockStored, BlockHashes: ours[2:], ParentBlockHash: ours[1], HasParent: true})})
	if d := depth(c, 0, ours); d != 4 {
		t.Fatalf("depth %d", d)
	}
	c.KVEvents(0, 0, []KVEvent{FromEngine(engine.KVEvent{Kind: engine.BlockRemoved, BlockHashes: ours[1:2]})})
	if d := depth(c, 0, ours); d != 1 || c.Router().Index().Blocks(0) != 3 {
		t.Fatalf("after removal: depth %d", d)
	}
	c.KVEvents(0, 0, []KVEvent{FromEngine(engine.KVEvent{Kind: engine.AllBlocksCleared})})
	if c.Router().Index().Blocks(0) != 0 {
		t.Fatal("not cleared")
	}
}

// Resync, a restart and removal all forget the replica's ids; approximate
// mode ignores events.
func TestKVEventsForget(t *testing.T) {
	c := eventsCore(t, 2)
	tokens, ours := kvTokens(c)
	idx := c.Router().Index()
	for _, forget := range []func(){
		func() { c.Resync(0) },
		func() {
			c.Report(0, 0, Report{PrefixQueries: 10})
			c.Report(0, 0, Report{PrefixQueries: 1})
		},
	} {
		c.KVEvents(0, 0, []KVEvent{stored(tokens[:32], 0, false, 1, 2)})
		if idx.Blocks(0) != 2 {
			t.Fatal(idx.Blocks(0))
		}
		forget()
		if idx.Blocks(0) != 0 {
			t.Fatal("blocks left")
		}
		c.KVEvents(0, 0, []KVEvent{stored(tokens[32:48], 2, true, 3)})
		if idx.Blocks(0) != 0 {
			t.Fatal("a child of a forgotten id was placed")
		}
		c.Report(0, 0, Report{}) // the next restart's reference
	}
	c.RemoveReplica(0, 1)
	c.KVEvents(0, 1, []KVEvent{stored(tokens[:32], 0, false, 1, 2)})
	if idx.Blocks(1) != 0 || c.State(0, 1).KVEventsApplied != 0 {
		t.Fatal("a removed replica's events applied")
	}
	c.KVEvents(0, 5, []KVEvent{stored(tokens[:32], 0, false, 1, 2)}) // unknown replica: ignored

	a := newCore(t, testConfig("kv_aware"), 1, ReplicaConfig{})
	a.KVEvents(0, 0, []KVEvent{stored(tokens[:32], 0, false, 1, 2)})
	if a.Router().Index().Blocks(0) != 0 || a.State(0, 0).KVEventsApplied != 0 {
		t.Fatal("approximate mode applied events")
	}
	_ = ours
}

// Events of a lower tier (vLLM's medium CPU or DISK) never count as GPU
// blocks; they feed the router's tier index when it has one, and an
// offloaded block's own id map keeps the GPU's removal from losing it.
func TestKVEventsByMedium(t *testing.T) {
	c := eventsCore(t, 1)
	tokens, ours := kvTokens(c)
	idx := c.Router().Index()
	cpu := stored(tokens[:32], 0, false, 1001, 1002)
	cpu.Medium = engine.MediumCPU
	c.KVEvents(0, 0, []KVEvent{cpu})
	if d := depth(c, 0, ours); d != 0 || idx.Blocks(0) != 0 {
		t.Fatalf("CPU events counted on the GPU: depth %d, %d blocks", d, idx.Blocks(0))
	}

	cfg := testConfig("round_robin")
	cfg.Router.Index = router.IndexEvents
	cfg.Router.TierBlocks = 100
	tc := newCore(t, cfg, 1, ReplicaConfig{})
	gpu := stored(tokens[:16], 0, false, 1001)
	c2 := stored(tokens[16:32], 1001, true, 1002)
	c2.Medium = engine.MediumCPU
	tc.KVEvents(0, 0, []KVEvent{gpu, c2})
	// The GPU evicts block 0 after block 1 went to the CPU: the CPU's copy
	// of block 1 stays.
	tc.KVEvents(0, 0, []KVEvent{{Kind: engine.BlockRemoved, Blocks: []uint64{1001}}})
	req := &router.Request{Model: testModel, PromptTokens: 48, BlockHashes: ours[:3]}
	views := []router.Replica{{Candidate: router.Candidate{Replica: 0, Name: "r0"}, Healthy: true, Models: []string{testModel}}}
	cands := tc.Router().Candidates(0, req, views, nil)
	if len(cands) != 1 || cands[0].PredictedCachedTokens != 0 || cands[0].PredictedTierTokens != 0 {
		t.Fatalf("after the GPU lost block 0: %+v (the tier's block 1 does not start the prompt)", cands)
	}
	tc.KVEvents(0, 0, []KVEvent{gpu})
	cands = tc.Router().Candidates(0, req, views, nil)
	if cands[0].PredictedCachedTokens != 16 || cands[0].PredictedTierTokens != 16 {
		t.Fatalf("block 0 back on the GPU, block 1 on the CPU: %+v", cands)
	}
}

// An offloaded block's CPU event names no parent and, from vLLM, no tokens:
// it takes the hash its engine id has on the GPU (vLLM offloads before it
// evicts), or had until a removal earlier in the same batch (the simulated
// engine evicts, then offloads). An id the core never placed is skipped,
// and a removal does not reach past its batch.
func TestKVEventsOffloadedBlocks(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Router.Index = router.IndexEvents
	cfg.Router.TierBlocks = 100
	tokens, _ := kvTokens(newCore(t, cfg, 1, ReplicaConfig{}))
	views := []router.Replica{{Candidate: router.Candidate{Replica: 0, Name: "r0"}, Healthy: true, Models: []string{testModel}}}
	cpu := func(ids ...uint64) KVEvent {
		return KVEvent{Kind: engine.BlockStored, Blocks: ids, Medium: engine.MediumCPU}
	}
	gone := KVEvent{Kind: engine.BlockRemoved, Blocks: []uint64{1001, 1002}}
	for _, tc := range []struct {
		name    string
		batches [][]KVEvent
		tier    int // tokens the tier index should hold of the prompt
	}{
		{"offloaded before evicted", [][]KVEvent{{stored(tokens[:32], 0, false, 1001, 1002)}, {cpu(1001, 1002)}, {gone}}, 32},
		{"evicted then offloaded, one batch", [][]KVEvent{{stored(tokens[:32], 0, false, 1001, 1002)}, {gone, cpu(1001, 1002)}}, 32},
		{"evicted, offloaded in a later batch", [][]KVEvent{{stored(tokens[:32], 0, false, 1001, 1002)}, {gone}, {cpu(1001, 1002)}}, 0},
		{"never on the GPU", [][]KVEvent{{cpu(1001, 1002)}}, 0},
		{"one known, one not", [][]KVEvent{{stored(tokens[:16], 0, false, 1001)}, {cpu(1001, 1002)}, {gone}}, 16},
	} {
		c := newCore(t, cfg, 1, ReplicaConfig{})
		_, ours := kvTokens(c)
		for _, b := range tc.batches {
			c.KVEvents(0, 0, b)
		}
		req := &router.Request{Model: testModel, PromptTokens: 64, BlockHashes: ours}
		cands := c.Router().Candidates(0, req, views, nil)
		if len(cands) != 1 || cands[0].PredictedCachedTokens != 0 || cands[0].PredictedTierTokens != tc.tier {
			t.Fatalf("%s: %+v, want %d tier tokens and none on the GPU", tc.name, cands, tc.tier)
		}
	}
}

// A prefix the engine stored under a cache_salt or a LoRA adapter is keyed
// as the core keys such a request: a request with the same salt finds it,
// the plain model's prompt with the same tokens does not.
func TestKVEventsSaltedPrefixes(t *testing.T) {
	c := eventsCore(t, 1)
	tokens, plain := kvTokens(c)
	salted := kvblock.AppendHashes(nil, kvblock.Salt(testModel, "", "s1"), tokens, 16)
	adapter := kvblock.AppendHashes(nil, kvblock.Salt(testModel, "a1", ""), tokens, 16)
	both := kvblock.AppendHashes(nil, kvblock.Salt(testModel, "a1", "s1"), tokens, 16)
	ev := stored(tokens[:32], 0, false, 1, 2)
	ev.CacheSalt = "s1"
	c.KVEvents(0, 0, []KVEvent{ev})
	// A child of a salted block follows its chain.
	c.KVEvents(0, 0, []KVEvent{stored(tokens[32:48], 2, true, 3)})
	if d := depth(c, 0, salted); d != 3 {
		t.Fatalf("the salted prompt: depth %d, want 3", d)
	}
	if d := depth(c, 0, plain); d != 0 {
		t.Fatalf("the plain prompt found %d blocks stored under a cache_salt", d)
	}
	ev = stored(tokens[:16], 0, false, 10)
	ev.LoRA = "a1"
	c.KVEvents(0, 0, []KVEvent{ev})
	ev = stored(tokens[:16], 0, false, 20)
	ev.LoRA, ev.CacheSalt = "a1", "s1"
	c.KVEvents(0, 0, []KVEvent{ev})
	if depth(c, 0, adapter) != 1 || depth(c, 0, both) != 1 || depth(c, 0, plain) != 0 {
		t.Fatalf("adapter %d, adapter and salt %d, plain %d: want 1, 1, 0", depth(c, 0, adapter), depth(c, 0, both), depth(c, 0, plain))
	}
}
