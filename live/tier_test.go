package live

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvevents"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/gateway"
)

// With kv_tiers in the model's profile, live keeps a tier index as the
// simulator does: a prompt whose blocks left a replica's GPU cache for its
// CPU tier is credited for them (tier_tokens in /admin/explain) and
// cost_model prices their load back (tier_load_ms); without tiers in the
// profile, nothing is.
func TestTierIndexFromProfile(t *testing.T) {
	for _, tiers := range []bool{true, false} {
		ec := testEngineConfig()
		ec.NumGPUBlocks = 64 // four 400-token prompts and answers overflow it
		if tiers {
			ec.KVTiers = engine.KVTiers{CPUBlocks: 1024, CPULink: "pcie-gen4"}
		}
		c := testConfig(t, newUpstream(t, server.Config{Engine: ec}))
		c.Models[0].Profile = profileFile(t, ec)
		g := startGateway(t, c)
		first := words(1000, 400)
		for i, p := range []string{first, words(3000, 400), words(5000, 400), words(7000, 400), words(9000, 400)} {
			if _, _, err := g.complete(context.Background(), p, 2); err != nil {
				t.Fatalf("tiers %v, prompt %d: %v", tiers, i, err)
			}
		}
		// The tier_tokens term is there only when some are credited.
		tierTokens, load, cached := explainTier(t, g, first)
		if !tiers {
			if tierTokens != 0 {
				t.Fatalf("no tiers in the profile, yet %v tier tokens", tierTokens)
			}
			continue
		}
		if cached >= 400 {
			t.Fatalf("the first prompt is still predicted in the GPU cache (%d tokens): nothing was evicted", cached)
		}
		if tierTokens < 16 || load <= 0 {
			t.Fatalf("evicted to the CPU tier, the first prompt should be credited tier tokens with a load time; got %v tokens, %v ms", tierTokens, load)
		}
	}
}

// explainTier is the tier tokens and load /admin/explain credits prompt
// with on g's one replica, and its predicted GPU-cached tokens.
func explainTier(t *testing.T, g *testGateway, prompt string) (tier, load float64, cached int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "sim", "prompt": prompt, "max_tokens": 2})
	status, b := explainCall(t, g, "", body, nil)
	var ex gateway.Explanation
	if err := json.Unmarshal(b, &ex); status != 200 || err != nil || len(ex.Candidates) != 1 {
		t.Fatalf("explain: %d %v: %s", status, err, b)
	}
	tier, _ = ex.Candidates[0].Term("tier_tokens")
	load, _ = ex.Candidates[0].Term("tier_load_ms")
	return tier, load, ex.Candidates[0].PredictedCachedTokens
}

// Events mode: the engine's BlockStored events of medium CPU (its GPU
// cache offloading what it evicts) feed the tier index when the profile
// has kv_tiers; they were dropped before.
func TestTierIndexFromEvents(t *testing.T) {
	ec := testEngineConfig()
	ec.NumGPUBlocks = 64
	ec.KVTiers = engine.KVTiers{CPUBlocks: 1024, CPULink: "pcie-gen4"}
	kc := kvevents.DefaultConfig()
	kc.EnableKVCacheEvents, kc.Endpoint, kc.ForceBind, kc.Topic = true, "tcp://127.0.0.1:0", true, "kv"
	u, pub := publishingEngine(t, ec, kc)
	c := testConfig(t, u)
	c.Models[0].Profile = profileFile(t, ec)
	c.Models[0].Index = config.IndexEvents
	c.Models[0].Replicas[0].KVEvents, c.Models[0].Replicas[0].KVEventsTopic = pub.Addr(), "kv"
	g := startGateway(t, c)
	waitUntil(t, "KV events from the engine", 20*time.Second, func() bool {
		g.complete(context.Background(), words(100, 40), 2)
		time.Sleep(50 * time.Millisecond)
		return g.replicaViews()[0].IndexBlocks > 0
	})
	first := words(1000, 400)
	for i, p := range []string{first, words(3000, 400), words(5000, 400), words(7000, 400), words(9000, 400)} {
		if _, _, err := g.complete(context.Background(), p, 2); err != nil {
			t.Fatalf("prompt %d: %v", i, err)
		}
	}
	var tier, load float64
	var cached int
	defer func() {
		if t.Failed() {
			t.Logf("last explained: %v tier tokens, %v ms to load them, %d tokens on the GPU", tier, load, cached)
		}
	}()
	waitUntil(t, "the first prompt credited in the CPU tier", 10*time.Second, func() bool {
		tier, load, cached = explainTier(t, g, first)
		return tier >= 16 && load > 0 && cached < 400
	})
}
