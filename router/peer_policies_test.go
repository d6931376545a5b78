package router

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"pgregory.net/rapid"
)

// peerPolicies builds the five peer policies with the given seed.
func peerPolicies(seed uint64) []Policy {
	o := Options{Seed: seed}
	return []Policy{NewLLMD(o), NewDynamo(o), NewSGLang(o), NewAIBrix(o), NewPreble(o)}
}

func TestPeerNames(t *testing.T) {
	want := []string{"llmd", "dynamo", "sglang", "aibrix", "preble"}
	for i, p := range peerPolicies(1) {
		if p.Name() != want[i] {
			t.Errorf("policy %d: Name() = %q, want %q", i, p.Name(), want[i])
		}
	}
}

// peerScraped returns an engine view that has been scraped.
func peerScraped(running, waiting int, kv float64) EngineLoad {
	return EngineLoad{Valid: true, Running: running, Waiting: waiting, KVCacheUsage: kv}
}

type peerCase struct {
	name  string
	req   Request
	cands []Candidate
	want  int
}

func runPeerCases(t *testing.T, mk func() Policy, cases []peerCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := mk().Pick(&tc.req, tc.cands); got != tc.want {
				t.Fatalf("picked %d, want %d", got, tc.want)
			}
		})
	}
}

func TestLLMDScore(t *testing.T) {
	p := NewLLMD(Options{})
	// prompt 1024 tokens = 64 blocks; 512 cached = 32 blocks: prefix 0.5.
	c := Candidate{PredictedCachedTokens: 512, Load: Load{Engine: peerScraped(0, 5, 0.25)}}
	// queue: (10 − 5)/(10 − 0) = 0.5; kv: 0.75.
	if got, want := p.score(1024, &c, 0, 10), 3*0.5+2*0.5+2*0.75; got != want {
		t.Errorf("score = %v, want %v", got, want)
	}
	// All queues equal: the queue scorer gives 1.
	if got, want := p.score(1024, &c, 5, 5), 3*0.5+2*1+2*0.75; got != want {
		t.Errorf("score with equal queues = %v, want %v", got, want)
	}
	// Zero-token prompt: prefix 0.
	if got, want := p.score(0, &c, 5, 5), 2*1+2*0.75; got != want {
		t.Errorf("score for an empty prompt = %v, want %v", got, want)
	}
	// Before the first scrape: q = Pending, KV = ceil(800/16)/100 = 0.5.
	u := Candidate{KVCapacityBlocks: 100, Load: Load{Pending: 5, InFlightPromptTokens: 800}}
	if got, want := p.score(1024, &u, 0, 10), 2*0.5+2*0.5; got != want {
		t.Errorf("unscraped score = %v, want %v", got, want)
	}
	// Unknown capacity: KV usage 0.
	u.KVCapacityBlocks = 0
	if got, want := p.score(1024, &u, 0, 10), 2*0.5+2*1.0; got != want {
		t.Errorf("unscraped score, unknown capacity = %v, want %v", got, want)
	}
}

func TestLLMDPick(t *testing.T) {
	req := Request{PromptTokens: 1024} // 64 blocks
	runPeerCases(t, func() Policy { return NewLLMD(Options{Seed: 7}) }, []peerCase{
		{
			name: "prefers the cached replica at equal load",
			req:  req,
			cands: []Candidate{
				{Load: Load{Engine: peerScraped(4, 0, 0.5)}},
				{PredictedCachedTokens: 960, Load: Load{Engine: peerScraped(4, 0, 0.5)}},
				{Load: Load{Engine: peerScraped(4, 0, 0.5)}},
			},
			want: 1,
		},
		{
			// Cached: 3·0.5 + 2·0 + 2·0.7 = 2.9; empty: 0 + 2·1 + 2·0.7 = 3.4.
			name: "half a prefix loses to a much shorter queue",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 512, Load: Load{Engine: peerScraped(8, 10, 0.3)}},
				{Load: Load{Engine: peerScraped(8, 0, 0.3)}},
			},
			want: 1,
		},
		{
			// Cached: 3·0.9375 + 0 + 1.4 = 4.2125 beats 3.4.
			name: "a near-full prefix beats the shorter queue",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 960, Load: Load{Engine: peerScraped(8, 10, 0.3)}},
				{Load: Load{Engine: peerScraped(8, 0, 0.3)}},
			},
			want: 0,
		},
		{
			name: "kv utilization breaks an otherwise even choice",
			req:  req,
			cands: []Candidate{
				{Load: Load{Engine: peerScraped(8, 2, 0.9)}},
				{Load: Load{Engine: peerScraped(8, 2, 0.2)}},
			},
			want: 1,
		},
		{
			name: "unscraped replicas are judged by the gateway's pending count",
			req:  req,
			cands: []Candidate{
				{Load: Load{Pending: 6}},
				{Load: Load{Pending: 1}},
			},
			want: 1,
		},
		{
			name:  "single candidate, empty prompt",
			req:   Request{},
			cands: []Candidate{{}},
			want:  0,
		},
	})
}

// TestPeerTiesAreSeededAndSpread checks that the randomised tie-breaks
// reach every tied candidate and replay with the seed.
func TestPeerTiesAreSeededAndSpread(t *testing.T) {
	for _, mk := range []func(uint64) Policy{
		func(s uint64) Policy { return NewLLMD(Options{Seed: s}) },
		func(s uint64) Policy { return NewDynamo(Options{Seed: s}) },
		func(s uint64) Policy { return NewAIBrix(Options{Seed: s}) },
	} {
		a, b := mk(3), mk(3)
		t.Run(a.Name(), func(t *testing.T) {
			cands := make([]Candidate, 4)
			req := &Request{PromptTokens: 100}
			seen := make([]int, len(cands))
			for i := range 400 {
				x, y := a.Pick(req, cands), b.Pick(req, cands)
				if x != y {
					t.Fatalf("pick %d: %d vs %d with the same seed", i, x, y)
				}
				seen[x]++
			}
			for i, n := range seen {
				if n < 50 {
					t.Errorf("tied candidate %d picked %d times of 400", i, n)
				}
			}
		})
	}
}

func TestDynamoCost(t *testing.T) {
	p := NewDynamo(Options{}) // B = 16
	const prompt = 160        // T = 10
	for _, tc := range []struct {
		name string
		c    Candidate
		want float64
	}{
		// max(0, (320+160)/16 − 6) + (100 + 10) = 24 + 110.
		{"busy and cached", Candidate{PredictedCachedTokens: 96, Load: Load{PendingPrefillTokens: 320, InFlightPromptTokens: 1600}}, 134},
		// 160/16 + (0 + 10).
		{"idle", Candidate{}, 20},
		// (10 − 9) + (10 + 10).
		{"cached, one request in flight", Candidate{PredictedCachedTokens: 144, Load: Load{InFlightPromptTokens: 160}}, 21},
		// ceil(17/16) = 2 active blocks: 10 + (2 + 10).
		{"partial active block rounds up", Candidate{Load: Load{InFlightPromptTokens: 17}}, 22},
		// (8 + 160)/16 = 10.5: fractional prefill blocks.
		{"fractional queued prefill", Candidate{Load: Load{PendingPrefillTokens: 8}}, 20.5},
	} {
		if got := p.cost(prompt, &tc.c, 0); got != tc.want {
			t.Errorf("%s: cost = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := p.cost(0, &Candidate{}, 0); got != 0 {
		t.Errorf("empty prompt, idle replica: cost = %v, want 0", got)
	}

	// Active-request weight: + w·InFlight.
	w := NewDynamo(Options{})
	w.ActiveRequestWeight = 2
	if got := w.cost(prompt, &Candidate{Load: Load{InFlight: 3}}, 0); got != 26 {
		t.Errorf("w_req=2, 3 in flight: cost = %v, want 26", got)
	}
	// Decay d = 1: 10 excess blocks / T = 10 → decay 1/2, credit 0.5·8 = 4:
	// (160+160)/16 − 4 + (0 + 10) = 26.
	d := NewDynamo(Options{})
	d.CreditDecay = 1
	if got := d.cost(prompt, &Candidate{PredictedCachedTokens: 128, Load: Load{PendingPrefillTokens: 160}}, 0); got != 26 {
		t.Errorf("decay: cost = %v, want 26", got)
	}
	// The prefill term never goes negative: credit 3·9 = 27 > 10.
	c := NewDynamo(Options{})
	c.OverlapCredit = 3
	if got := c.cost(prompt, &Candidate{PredictedCachedTokens: 144}, 0); got != 10 {
		t.Errorf("clamped prefill: cost = %v, want 10", got)
	}
}

func TestDynamoPick(t *testing.T) {
	req := Request{PromptTokens: 160}
	runPeerCases(t, func() Policy { return NewDynamo(Options{Seed: 1}) }, []peerCase{
		{
			name: "idle beats cached-but-busy",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 96, Load: Load{PendingPrefillTokens: 320, InFlightPromptTokens: 1600}},
				{},
			},
			want: 1,
		},
		{
			// 20 vs 21: one active block outweighs 9 cached blocks minus one.
			name: "argmin of the cost numbers",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 144, Load: Load{InFlightPromptTokens: 160}},
				{},
			},
			want: 1,
		},
		{
			name: "cache wins at equal load",
			req:  req,
			cands: []Candidate{
				{Load: Load{InFlightPromptTokens: 160}},
				{PredictedCachedTokens: 144, Load: Load{InFlightPromptTokens: 160}},
			},
			want: 1,
		},
		{
			name:  "single candidate",
			req:   Request{},
			cands: []Candidate{{Load: Load{InFlight: 3}}},
			want:  0,
		},
	})
}

func TestSGLangPick(t *testing.T) {
	req := Request{PromptTokens: 1000}
	load := func(n int) Load { return Load{InFlight: n} }
	runPeerCases(t, func() Policy { return NewSGLang(Options{}) }, []peerCase{
		{
			// 100 − 10 = 90 > 64 and 100 > 15: imbalanced, cache ignored.
			name: "imbalanced goes to the least loaded",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 992, Load: load(100)},
				{Load: load(10)},
				{Load: load(50)},
				{Load: load(10)},
			},
			want: 1,
		},
		{
			name: "spread within the absolute threshold stays cache-aware",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 992, Load: load(64)},
				{Load: load(0)},
			},
			want: 0,
		},
		{
			// 300 − 210 = 90 > 64 but 300 ≤ 1.5·210.
			name: "spread within the relative threshold stays cache-aware",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 992, Load: load(300)},
				{Load: load(210)},
			},
			want: 0,
		},
		{
			name: "match rate above the threshold takes the best match",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 160, IndexedBlocks: 1, Load: load(0)},
				{PredictedCachedTokens: 400, IndexedBlocks: 900, Load: load(3)},
			},
			want: 1,
		},
		{
			name: "equal matches: the lower load",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 400, Load: load(5)},
				{PredictedCachedTokens: 400, Load: load(3)},
				{PredictedCachedTokens: 400, Load: load(3)},
			},
			want: 1,
		},
		{
			// 288/1000 = 0.288 ≤ 0.3.
			name: "below the threshold: the smallest tree",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 288, IndexedBlocks: 500, Load: load(0)},
				{IndexedBlocks: 200, Load: load(9)},
				{IndexedBlocks: 300, Load: load(1)},
			},
			want: 1,
		},
		{
			name: "exactly at the threshold is not above it",
			req:  Request{PromptTokens: 160},
			cands: []Candidate{
				{PredictedCachedTokens: 48, IndexedBlocks: 500},
				{IndexedBlocks: 100},
			},
			want: 1,
		},
		{
			name: "equal trees: the lower load",
			req:  req,
			cands: []Candidate{
				{IndexedBlocks: 100, Load: load(4)},
				{IndexedBlocks: 100, Load: load(2)},
				{IndexedBlocks: 300, Load: load(0)},
			},
			want: 1,
		},
		{
			name: "empty prompt: the smallest tree",
			req:  Request{},
			cands: []Candidate{
				{IndexedBlocks: 10},
				{IndexedBlocks: 5},
			},
			want: 1,
		},
	})
}

func TestAIBrixPick(t *testing.T) {
	req := Request{PromptTokens: 1600} // 100 blocks
	run := func(n int) Load { return Load{Engine: peerScraped(n, 0, 0)} }
	runPeerCases(t, func() Policy { return NewAIBrix(Options{Seed: 1}) }, []peerCase{
		{
			// 20 − 5 = 15 > 8: only the two candidates with 5 running count.
			name: "imbalance restricts to the least-running candidates",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 1440, Load: run(20)},
				{Load: run(5)},
				{PredictedCachedTokens: 160, Load: run(5)},
				{PredictedCachedTokens: 1440, Load: run(11)},
			},
			want: 2,
		},
		{
			// 13 − 5 = 8 is not > 8; mean 9, σ = 5.66: 13 ≤ 14.66.
			name: "a spread of exactly 8 is balanced",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 1440, Load: run(13)},
				{Load: run(5)},
			},
			want: 0,
		},
		{
			// mean 3.6, sample σ = √12.8 = 3.58: limit 7.18 < 10.
			name: "the σ guard skips a hot cached replica",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 1440, Load: run(10)},
				{Load: run(2)},
				{PredictedCachedTokens: 160, Load: run(2)},
				{Load: run(2)},
				{Load: run(2)},
			},
			want: 2,
		},
		{
			name: "higher match% first, whatever the load",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 320, Load: run(1)},
				{PredictedCachedTokens: 640, Load: run(4)},
			},
			want: 1,
		},
		{
			name: "equal match%: fewer running first, then the index",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 640, Load: run(4)},
				{PredictedCachedTokens: 640, Load: run(2)},
				{PredictedCachedTokens: 640, Load: run(2)},
			},
			want: 1,
		},
		{
			// T = 200, m = 1: match% rounds to 0 but the replica did match.
			name: "one matched block counts even at 0%",
			req:  Request{PromptTokens: 3200},
			cands: []Candidate{
				{Load: run(0)},
				{PredictedCachedTokens: 16, Load: run(1)},
			},
			want: 1,
		},
		{
			name: "unscraped replicas use the gateway's in-flight count",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 1440, Load: Load{InFlight: 20}},
				{PredictedCachedTokens: 160, Load: Load{InFlight: 5}},
			},
			want: 1,
		},
		{
			name:  "single candidate, empty prompt",
			req:   Request{},
			cands: []Candidate{{Load: run(3)}},
			want:  0,
		},
	})
}

func TestAIBrixFallbackAndSignal(t *testing.T) {
	// No candidate within the guard matches: least-request among the minima.
	p := NewAIBrix(Options{Seed: 5})
	cands := []Candidate{
		{PredictedCachedTokens: 1440, Load: Load{Engine: peerScraped(10, 0, 0)}},
		{Load: Load{Engine: peerScraped(2, 0, 0)}},
		{Load: Load{Engine: peerScraped(3, 0, 0)}},
		{Load: Load{Engine: peerScraped(2, 0, 0)}},
		{Load: Load{Engine: peerScraped(2, 0, 0)}},
	}
	seen := map[int]bool{}
	for range 100 {
		i := p.Pick(&Request{PromptTokens: 1600}, cands)
		if cands[i].Load.Engine.Running != 2 {
			t.Fatalf("fallback picked %d with %d running", i, cands[i].Load.Engine.Running)
		}
		seen[i] = true
	}
	if len(seen) != 3 {
		t.Errorf("fallback reached %v, want all three least-loaded candidates", seen)
	}

	// UseGatewayCount: the scrape says 20 running but the gateway 0.
	cands = []Candidate{
		{PredictedCachedTokens: 1440, Load: Load{InFlight: 0, Engine: peerScraped(20, 0, 0)}},
		{Load: Load{InFlight: 5, Engine: peerScraped(0, 0, 0)}},
	}
	if got := p.Pick(&Request{PromptTokens: 1600}, cands); got != 1 {
		t.Errorf("with the scraped count: picked %d, want 1", got)
	}
	p.UseGatewayCount = true
	if got := p.Pick(&Request{PromptTokens: 1600}, cands); got != 0 {
		t.Errorf("with the gateway count: picked %d, want 0", got)
	}
}

func TestPrebleCost(t *testing.T) {
	p := NewPreble(Options{}) // engine.DefaultConfig().Latency
	prof := engine.DefaultConfig().Latency
	if prof.StepFixedMs != 12 || prof.PrefillTokenUs != 90 || prof.PrefillPairNs != 3.3 || prof.DecodeSeqUs != 150 {
		t.Skipf("default profile changed (%+v); the pinned numbers below assume the original", prof)
	}
	// queued P(0,0) = 12 ms; miss P(1000,0) = 12 + 90 + 3.3e-6·1000·500 ms
	// = 103.65 ms; decode 2·150 µs = 0.3 ms.
	c := Candidate{Load: Load{InFlight: 2}}
	if got, want := p.cost(1000, &c), 115950*time.Microsecond; got != want {
		t.Errorf("cost = %v, want %v", got, want)
	}
	// 600 cached: miss P(400, 600) = 12 + 36 + 3.3e-6·400·800 ms = 49.056 ms;
	// queued P(500, 0) = 12 + 45 + 3.3e-6·500·250 ms = 57.4125 ms.
	c = Candidate{PredictedCachedTokens: 600, Load: Load{PendingPrefillTokens: 500}}
	if got, want := p.cost(1000, &c), 106468500*time.Nanosecond; got != want {
		t.Errorf("cost = %v, want %v", got, want)
	}
	// A prediction beyond the prompt is capped at the prompt.
	c = Candidate{PredictedCachedTokens: 5000}
	if got, want := p.cost(1000, &c), 24*time.Millisecond; got != want {
		t.Errorf("over-predicted cost = %v, want %v", got, want)
	}
}

func TestPreblePick(t *testing.T) {
	req := Request{PromptTokens: 1024} // 64 blocks
	runPeerCases(t, func() Policy { return NewPreble(Options{}) }, []peerCase{
		{
			name: "exploit: least loaded of the longest matches",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 768, Load: Load{InFlight: 10}},
				{PredictedCachedTokens: 768, Load: Load{InFlight: 3}},
				{PredictedCachedTokens: 256, Load: Load{InFlight: 0}},
				{PredictedCachedTokens: 768, Load: Load{InFlight: 3}},
			},
			want: 1,
		},
		{
			// Exploit ignores the queue: the long match wins despite 20k
			// queued prefill tokens.
			name: "exploit ignores queued prefill",
			req:  req,
			cands: []Candidate{
				{Load: Load{InFlight: 0}},
				{PredictedCachedTokens: 576, Load: Load{InFlight: 1, PendingPrefillTokens: 20000}},
			},
			want: 1,
		},
		{
			// 32/64 = 0.5 is not above 0.5: explore, and the long queue loses.
			name: "half a match explores by cost",
			req:  req,
			cands: []Candidate{
				{PredictedCachedTokens: 512, Load: Load{InFlight: 1, PendingPrefillTokens: 20000}},
				{Load: Load{InFlight: 0}},
			},
			want: 1,
		},
		{
			name: "explore: a partial match wins at equal load",
			req:  req,
			cands: []Candidate{
				{Load: Load{InFlight: 2}},
				{PredictedCachedTokens: 256, Load: Load{InFlight: 2}},
			},
			want: 1,
		},
		{
			name: "explore: decode load breaks an otherwise even choice",
			req:  req,
			cands: []Candidate{
				{Load: Load{InFlight: 9}},
				{Load: Load{InFlight: 2}},
				{Load: Load{InFlight: 2}},
			},
			want: 1,
		},
		{
			name:  "single candidate, empty prompt",
			req:   Request{},
			cands: []Candidate{{Load: Load{InFlight: 1}}},
			want:  0,
		},
	})
}

// genPeerCands draws candidates with every field the peer policies read,
// including unscraped replicas and predictions longer than the prompt.
func genPeerCands(t *rapid.T, prompt int) []Candidate {
	n := rapid.IntRange(1, 24).Draw(t, "n")
	c := make([]Candidate, n)
	for i := range c {
		c[i] = Candidate{
			Replica:               i,
			PredictedCachedTokens: 16 * rapid.IntRange(0, prompt/16+2).Draw(t, "cachedBlocks"),
			KVCapacityBlocks:      rapid.IntRange(0, 4096).Draw(t, "capacity"),
			IndexedBlocks:         rapid.IntRange(0, 5000).Draw(t, "indexed"),
			Load: Load{
				InFlight:             rapid.IntRange(0, 200).Draw(t, "inflight"),
				Pending:              rapid.IntRange(0, 50).Draw(t, "pending"),
				PendingPrefillTokens: rapid.IntRange(0, 50000).Draw(t, "pendingPrefill"),
				InFlightPromptTokens: rapid.IntRange(0, 200000).Draw(t, "inflightPrompt"),
				Engine: EngineLoad{
					Valid:        rapid.Bool().Draw(t, "valid"),
					Running:      rapid.IntRange(0, 200).Draw(t, "running"),
					Waiting:      rapid.IntRange(0, 50).Draw(t, "waiting"),
					KVCacheUsage: rapid.Float64Range(0, 1).Draw(t, "kv"),
				},
			},
		}
	}
	return c
}

// TestPeerPoliciesValidAndDeterministic: every pick is a valid index, and two
// policies built with the same seed make the same picks.
func TestPeerPoliciesValidAndDeterministic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		seed := rapid.Uint64().Draw(t, "seed")
		a, b := peerPolicies(seed), peerPolicies(seed)
		for range rapid.IntRange(1, 8).Draw(t, "rounds") {
			prompt := rapid.IntRange(0, 4000).Draw(t, "prompt")
			req := &Request{PromptTokens: prompt}
			cands := genPeerCands(t, prompt)
			for i := range a {
				x, err := Pick(a[i], req, cands)
				if err != nil {
					t.Fatal(err)
				}
				if y := b[i].Pick(req, cands); x != y {
					t.Fatalf("%s: picked %d and %d with the same seed", a[i].Name(), x, y)
				}
			}
		}
	})
}

// TestPeerPoliciesOptimise checks the policies' own objectives on random
// inputs: llm-d takes a maximum score, Dynamo a minimum cost, SGLang the
// least loaded when imbalanced, Preble a minimum cost when it explores, and
// AIBrix a replica within its σ guard or a least-loaded one.
func TestPeerPoliciesOptimise(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		o := Options{Seed: rapid.Uint64().Draw(t, "seed")}
		prompt := rapid.IntRange(0, 4000).Draw(t, "prompt")
		req := &Request{PromptTokens: prompt}
		cands := genPeerCands(t, prompt)

		l := NewLLMD(o)
		qmin, qmax := math.MaxInt, math.MinInt
		for i := range cands {
			q := llmdQueue(&cands[i])
			qmin, qmax = min(qmin, q), max(qmax, q)
		}
		got := l.score(prompt, &cands[l.Pick(req, cands)], qmin, qmax)
		for i := range cands {
			if s := l.score(prompt, &cands[i], qmin, qmax); s > got {
				t.Fatalf("llmd: picked score %v, candidate %d has %v", got, i, s)
			}
		}

		d := NewDynamo(o)
		minPending := math.MaxInt
		for i := range cands {
			minPending = min(minPending, cands[i].Load.PendingPrefillTokens)
		}
		cost := d.cost(prompt, &cands[d.Pick(req, cands)], minPending)
		for i := range cands {
			if c := d.cost(prompt, &cands[i], minPending); c < cost {
				t.Fatalf("dynamo: picked cost %v, candidate %d has %v", cost, i, c)
			}
		}

		s := NewSGLang(o)
		minL, maxL := math.MaxInt, math.MinInt
		for i := range cands {
			minL, maxL = min(minL, cands[i].Load.InFlight), max(maxL, cands[i].Load.InFlight)
		}
		if maxL-minL > 64 && float64(maxL) > 1.5*float64(minL) {
			if got := cands[s.Pick(req, cands)].Load.InFlight; got != minL {
				t.Fatalf("sglang: imbalanced (%d..%d) but picked load %d", minL, maxL, got)
			}
		}

		p := NewPreble(o)
		bestM, t0 := 0, 0
		for i := range cands {
			m, tt := peerBlocks(prompt, cands[i].PredictedCachedTokens, p.blockSize)
			bestM, t0 = max(bestM, m), tt
		}
		if peerMatchRatio(bestM, t0) <= p.ExploitThreshold {
			cost := p.cost(prompt, &cands[p.Pick(req, cands)])
			for i := range cands {
				if c := p.cost(prompt, &cands[i]); c < cost {
					t.Fatalf("preble: picked cost %v, candidate %d has %v", cost, i, c)
				}
			}
		}

		a := NewAIBrix(o)
		var rs []float64
		minR := math.MaxInt
		for i := range cands {
			r := a.running(&cands[i])
			rs = append(rs, float64(r))
			minR = min(minR, r)
		}
		mean, sd := 0.0, 0.0
		for _, r := range rs {
			mean += r / float64(len(rs))
		}
		if len(rs) > 1 {
			for _, r := range rs {
				sd += (r - mean) * (r - mean)
			}
			sd = math.Sqrt(sd / float64(len(rs)-1))
		}
		r := a.running(&cands[a.Pick(req, cands)])
		if r != minR && float64(r) > mean+sd+1e-9 {
			t.Fatalf("aibrix: picked %d running, min %d, guard %v", r, minR, mean+sd)
		}
	})
}

func TestPeerPoliciesDoNotAllocate(t *testing.T) {
	cands := benchPeerCands(64)
	req := &Request{PromptTokens: 2000}
	for _, p := range peerPolicies(1) {
		if n := testing.AllocsPerRun(100, func() { p.Pick(req, cands) }); n != 0 {
			t.Errorf("%s: %v allocations per pick", p.Name(), n)
		}
	}
}

// benchPeerCands returns n candidates with a fixed spread of caches and loads.
func benchPeerCands(n int) []Candidate {
	r := rand.New(rand.NewPCG(1, 2))
	c := make([]Candidate, n)
	for i := range c {
		c[i] = Candidate{
			Replica:               i,
			PredictedCachedTokens: 16 * r.IntN(125),
			KVCapacityBlocks:      4096,
			IndexedBlocks:         r.IntN(4096),
			Load: Load{
				InFlight:             r.IntN(64),
				Pending:              r.IntN(8),
				PendingPrefillTokens: r.IntN(8000),
				InFlightPromptTokens: r.IntN(60000),
				Engine:               peerScraped(r.IntN(64), r.IntN(8), r.Float64()),
			},
		}
	}
	return c
}

func benchPeer(b *testing.B, mk func(Options) Policy) {
	for _, n := range []int{8, 64} {
		b.Run("cands="+strconv.Itoa(n), func(b *testing.B) {
			p := mk(Options{Seed: 1})
			cands := benchPeerCands(n)
			req := &Request{PromptTokens: 2000}
			b.ReportAllocs()
			for b.Loop() {
				p.Pick(req, cands)
			}
		})
	}
}

func BenchmarkPeerLLMD(b *testing.B) {
	benchPeer(b, func(o Options) Policy { return NewLLMD(o) })
}

func BenchmarkPeerDynamo(b *testing.B) {
	benchPeer(b, func(o Options) Policy { return NewDynamo(o) })
}

func BenchmarkPeerSGLang(b *testing.B) {
	benchPeer(b, func(o Options) Policy { return NewSGLang(o) })
}

func BenchmarkPeerAIBrix(b *testing.B) {
	benchPeer(b, func(o Options) Policy { return NewAIBrix(o) })
}

func BenchmarkPeerPreble(b *testing.B) {
	benchPeer(b, func(o Options) Policy { return NewPreble(o) })
}

func TestDynamoUsesDistinctActiveBlocks(t *testing.T) {
	p := NewDynamo(Options{Seed: 1})
	req := &Request{PromptTokens: 1600} // T = 100 blocks
	// Replica 0 holds the prompt (m = 99) and runs requests sharing it: 300
	// distinct active blocks, though their prompts sum to 6,400 blocks.
	hot := Candidate{Replica: 0, PredictedCachedTokens: 1584, ActiveBlocks: 300, Load: Load{InFlight: 4, InFlightPromptTokens: 4 * 25600}}
	cold := Candidate{Replica: 1, ActiveBlocks: 150, Load: Load{InFlight: 1, InFlightPromptTokens: 2400}}
	// hot: prefill max(0, 100-99) = 1, decode 300 + 1 = 301 -> 302
	// cold: prefill 100, decode 150 + 100 = 250 -> 350
	if got := p.Pick(req, []Candidate{hot, cold}); got != 0 {
		t.Fatalf("picked %d; shared active prefixes must count once", got)
	}
	if c := p.cost(1600, &hot, 0); c != 302 {
		t.Fatalf("hot cost %v, want 302", c)
	}
}
