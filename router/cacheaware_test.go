package router

import (
	"testing"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

func genLoadedCands(t *rapid.T, prompt int) []Candidate {
	n := rapid.IntRange(1, 12).Draw(t, "n")
	c := make([]Candidate, n)
	for i := range c {
		pending := rapid.IntRange(0, 4).Draw(t, "pending")
		c[i] = Candidate{
			Replica: i,
			Load: Load{
				InFlight:             pending + rapid.IntRange(0, 20).Draw(t, "decoding"),
				Pending:              pending,
				PendingPromptTokens:  pending * 1000,
				PendingPrefillTokens: pending * rapid.IntRange(0, 1000).Draw(t, "prefill"),
				InFlightPromptTokens: rapid.IntRange(0, 50000).Draw(t, "ctx"),
				Engine:               EngineLoad{Valid: rapid.Bool().Draw(t, "valid"), KVCacheUsage: rapid.Float64Range(0, 1).Draw(t, "kv")},
			},
			PredictedCachedTokens: 16 * rapid.IntRange(0, prompt/16).Draw(t, "hit"),
		}
	}
	return c
}

func hashesFor(id uint64, blocks int) []kvblock.Hash {
	return kvblock.AppendSegmentHashes(nil, kvblock.Salt("m", "", ""), []kvblock.Segment{{ID: id, Len: 16 * blocks}}, 16, -1)
}

func TestBoundedLoadIsNeverExceeded(t *testing.T) {
	for _, name := range []string{"prefix_hash", "cost_model"} {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				p, _ := NewPolicy(name, Options{Seed: rapid.Uint64().Draw(t, "seed")})
				bound := map[string]float64{"prefix_hash": 1.25, "cost_model": 3}[name]
				for range 4 {
					prompt := rapid.IntRange(1, 8000).Draw(t, "prompt")
					c := genLoadedCands(t, prompt)
					req := &Request{ID: rapid.Uint64().Draw(t, "id"), PromptTokens: prompt, BlockHashes: hashesFor(rapid.Uint64Range(1, 3).Draw(t, "prefix"), prompt/16)}
					got := c[p.Pick(req, c)].Load.InFlight + 1
					lim := LoadBound(bound, c)
					if name == "cost_model" {
						lim = max(lim, NewCostModel(Options{}).BoundFloor)
					}
					if got > lim {
						t.Fatalf("picked a replica that ends with %d in flight, bound %d", got, lim)
					}
				}
			})
		})
	}
}

func TestPrefixHashIsStickyAndSpreads(t *testing.T) {
	p := NewPrefixHash(Options{})
	cands := make([]Candidate, 8)
	for i := range cands {
		cands[i].Replica = i
	}
	seen := map[int]bool{}
	for prefix := uint64(1); prefix <= 64; prefix++ {
		req := &Request{PromptTokens: 4096, BlockHashes: hashesFor(prefix, 256)}
		first := p.Pick(req, cands)
		for range 3 {
			if again := p.Pick(req, cands); again != first {
				t.Fatalf("prefix %d moved from %d to %d with no load", prefix, first, again)
			}
		}
		seen[first] = true
	}
	if len(seen) < 6 {
		t.Fatalf("64 prefixes landed on only %d of 8 replicas", len(seen))
	}
	// A hot prefix spills once its replica exceeds the bound.
	req := &Request{PromptTokens: 4096, BlockHashes: hashesFor(7, 256)}
	home := p.Pick(req, cands)
	cands[home].Load.InFlight = 10
	if p.Pick(req, cands) == home {
		t.Fatal("hot replica over the bound kept the prefix")
	}
}

// In a lightly loaded fleet the bounded-load guard does not push a request
// off the replica holding its prefix: with 16 replicas and 3 requests in
// flight the plain bound would be 1.
func TestCostModelBoundFloor(t *testing.T) {
	p := NewCostModel(Options{})
	req := &Request{PromptTokens: 8000}
	cands := make([]Candidate, 16)
	for i := range cands {
		cands[i].Replica = i
	}
	cands[5].PredictedCachedTokens = 7984
	cands[5].Load = Load{InFlight: 2, InFlightPromptTokens: 3000}
	cands[9].Load = Load{InFlight: 1, InFlightPromptTokens: 1000}
	if got := p.Pick(req, cands); got != 5 {
		t.Fatalf("picked %d, want 5, the replica with the prefix (bound %d without the floor)", got, LoadBound(p.Bound, cands))
	}
	// Past the floor the guard holds.
	cands[5].Load.InFlight = 40
	if got := p.Pick(req, cands); got == 5 {
		t.Fatal("a replica far over the bound kept the request")
	}
}

func TestCostModelTradesCacheAgainstQueue(t *testing.T) {
	p := NewCostModel(Options{})
	req := &Request{PromptTokens: 4000}
	cached := Candidate{Replica: 0, PredictedCachedTokens: 3984}
	cold := Candidate{Replica: 1}
	if got := p.Pick(req, []Candidate{cold, cached}); got != 1 {
		t.Fatalf("equal queues: picked %d, want the cached replica", got)
	}
	// A modest queue on the cached replica is still cheaper than a cold prefill...
	cached.Load = Load{InFlight: 1, Pending: 1, PendingPromptTokens: 2000, PendingPrefillTokens: 2000, InFlightPromptTokens: 2000}
	if got := p.Pick(req, []Candidate{cold, cached}); got != 1 {
		t.Fatalf("small queue: picked %d, want the cached replica", got)
	}
	// ...but not a long one.
	cached.Load = Load{InFlight: 3, Pending: 3, PendingPromptTokens: 20000, PendingPrefillTokens: 20000, InFlightPromptTokens: 20000}
	if got := p.Pick(req, []Candidate{cold, cached}); got != 0 {
		t.Fatalf("long queue: picked %d, want the cold replica", got)
	}
	// The estimate is the profile's prefill time when nothing is queued.
	e := p.EstimateTTFT(4000, &Candidate{})
	// 2 steps x 12 ms + 0.09 ms x 4000 + 3.3e-6 x 4000 x 2000 = 24 + 360 + 26.4
	if d := e - 410.4; d > 1e-9 || d < -1e-9 {
		t.Fatalf("estimate %v ms, want 410.4", e)
	}
	// KV pressure, when enabled, makes a full replica less attractive than
	// a slightly worse one; by default it is off.
	full := Candidate{Replica: 0, PredictedCachedTokens: 2000, Load: Load{Engine: EngineLoad{Valid: true, KVCacheUsage: 1}}}
	roomy := Candidate{Replica: 1, PredictedCachedTokens: 1000}
	if got := p.Pick(req, []Candidate{full, roomy}); got != 0 {
		t.Fatalf("KV pressure off: picked %d, want the replica with more cached", got)
	}
	p.KVPenalty = 4
	if got := p.Pick(req, []Candidate{full, roomy}); got != 1 {
		t.Fatalf("KV pressure guard: picked %d", got)
	}
}

func TestCostModelSessionAffinity(t *testing.T) {
	p := NewCostModel(Options{SessionAffinity: true})
	req := &Request{Session: 9, PromptTokens: 1000}
	a := Candidate{Replica: 0}
	b := Candidate{Replica: 1, Load: Load{InFlight: 1, Pending: 0, InFlightPromptTokens: 1000}}
	if got := p.Pick(req, []Candidate{b, a}); got != 1 {
		t.Fatalf("first turn picked %d", got)
	}
	// Next turn: replica 0 is now slightly busier, but within the slack.
	a.Load = Load{InFlight: 2, InFlightPromptTokens: 2000}
	if got := p.Pick(req, []Candidate{b, a}); got != 1 {
		t.Fatalf("session left its replica for a marginal gain: picked %d", got)
	}
}

func TestKVAwarePrefersTheHit(t *testing.T) {
	p := NewKVAware(Options{Seed: 1})
	req := &Request{PromptTokens: 1000}
	c := []Candidate{{Replica: 0}, {Replica: 1, PredictedCachedTokens: 800}, {Replica: 2, PredictedCachedTokens: 400}}
	if got := p.Pick(req, c); got != 1 {
		t.Fatalf("picked %d", got)
	}
	c[1].Load.InFlight = 10 // the hit replica is the busiest: 2*0.8-10/11 < 2*0.4
	if got := p.Pick(req, c); got != 2 {
		t.Fatalf("picked %d with the hit replica overloaded", got)
	}
}

func TestPoliciesOnlySeeEligibleReplicas(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 10).Draw(t, "n")
		reps := make([]Replica, n)
		for i := range reps {
			models := []string{"other"}
			if rapid.Bool().Draw(t, "serves") {
				models = append(models, "m")
			}
			reps[i] = Replica{
				Candidate:   Candidate{Replica: i, Load: Load{InFlight: rapid.IntRange(0, 5).Draw(t, "inflight")}},
				Healthy:     rapid.Bool().Draw(t, "healthy"),
				Models:      models,
				MaxInFlight: rapid.IntRange(0, 5).Draw(t, "cap"),
			}
		}
		cands := Eligible("m", reps, nil)
		for _, name := range Names() {
			p, _ := NewPolicy(name, Options{Seed: 3})
			i, err := Pick(p, &Request{PromptTokens: 100}, cands)
			if len(cands) == 0 {
				if err != ErrNoCandidates {
					t.Fatalf("%s: no eligible replica but err %v", name, err)
				}
				continue
			}
			r := reps[cands[i].Replica]
			if !r.Healthy || r.Models[len(r.Models)-1] != "m" || (r.MaxInFlight > 0 && r.Load.InFlight >= r.MaxInFlight) {
				t.Fatalf("%s picked ineligible replica %+v", name, r)
			}
		}
	})
}
