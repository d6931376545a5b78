package router

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/seed"
	"pgregory.net/rapid"
)

// genRichCands draws 1 to max candidates with everything a policy reads,
// from small ranges so that ties happen: loads, scrapes (some missing, some
// over cost_model's KV threshold), predictions up to the prompt, index and
// capacity sizes.
func genRichCands(t *rapid.T, prompt, maxN int) []Candidate {
	n := rapid.IntRange(1, maxN).Draw(t, "n")
	perm := rapid.Permutation(func() []int {
		ids := make([]int, 2*maxN)
		for i := range ids {
			ids[i] = i
		}
		return ids
	}()).Draw(t, "ids")
	c := make([]Candidate, n)
	maxBlocks := max(0, (prompt-1)/16)
	for i := range c {
		inflight := rapid.IntRange(0, 12).Draw(t, "inflight")
		pending := rapid.IntRange(0, inflight).Draw(t, "pending")
		pendPrompt := pending * rapid.IntRange(0, 3000).Draw(t, "pendprompt")
		x := Candidate{
			Replica: perm[i],
			Name:    "r" + strconv.Itoa(perm[i]),
			Load: Load{
				InFlight: inflight, Pending: pending, PendingPromptTokens: pendPrompt,
				PendingPrefillTokens: rapid.IntRange(0, pendPrompt).Draw(t, "pendprefill"),
				InFlightPromptTokens: pendPrompt + (inflight-pending)*rapid.IntRange(0, 3000).Draw(t, "ctx"),
			},
			PredictedCachedTokens: 16 * rapid.IntRange(0, maxBlocks).Draw(t, "cachedblocks"),
			KVCapacityBlocks:      rapid.SampledFrom([]int{0, 512, 4096}).Draw(t, "capacity"),
			IndexedBlocks:         rapid.IntRange(0, 600).Draw(t, "indexed"),
			ActiveBlocks:          rapid.IntRange(0, 300).Draw(t, "active"),
		}
		if rapid.Bool().Draw(t, "scraped") {
			x.Load.Engine = EngineLoad{Valid: true, Age: 0, Running: rapid.IntRange(0, 12).Draw(t, "running"),
				Waiting: rapid.IntRange(0, 6).Draw(t, "waiting"), KVCacheUsage: float64(rapid.IntRange(0, 20).Draw(t, "kv")) / 20}
		}
		c[i] = x
	}
	return c
}

// genRichRequest draws a request: a prompt of 0 to 4,000 tokens with its
// blocks (a few distinct prefixes), a session among a few.
func genRichRequest(t *rapid.T) *Request {
	prompt := rapid.IntRange(0, 4000).Draw(t, "prompt")
	hs := make([]kvblock.Hash, prompt/16)
	prefix := rapid.Uint64Range(0, 3).Draw(t, "prefix")
	for i := range hs {
		hs[i] = kvblock.Hash{Lo: kvblock.Mix64(prefix<<32 | uint64(i))}
	}
	return &Request{ID: rapid.Uint64().Draw(t, "id"), Session: rapid.Uint64Range(0, 3).Draw(t, "session"), PromptTokens: prompt, BlockHashes: hs}
}

func TestEveryPolicyExplains(t *testing.T) {
	for _, name := range Names() {
		p, err := NewPolicy(name, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := p.(Explainer); !ok {
			t.Errorf("%s does not implement Explainer", name)
		}
	}
}

// The policies' streams are seed.Rand's, so a run picks what it picked
// before they kept their PCG.
func TestPolicyRNGIsSeedRand(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.Uint64().Draw(t, "seed")
		name := rapid.SampledFrom(Names()).Draw(t, "name")
		a, b := subRNG(s, name), seed.Rand(s, "router/"+name)
		for i := range 16 {
			peek := a.peek().Uint64()
			if x, y := a.Uint64(), b.Uint64(); x != y || peek != x {
				t.Fatalf("draw %d: %d, peeked %d, seed.Rand %d", i, x, peek, y)
			}
		}
	})
}

// Every policy picks what it picked before the explain refactor, draw for
// draw over a run of decisions, with Explain called between them at random
// (it must not move any state Pick depends on).
func TestPickUnchangedByExplainRefactor(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				o := Options{Seed: rapid.Uint64().Draw(t, "seed"), SessionAffinity: rapid.Bool().Draw(t, "affinity")}
				p, _ := NewPolicy(name, o)
				old := oldPolicy(name, o)
				for step := range rapid.IntRange(1, 40).Draw(t, "steps") {
					req := genRichRequest(t)
					cands := genRichCands(t, req.PromptTokens, 12)
					if rapid.Bool().Draw(t, "explain") {
						p.(Explainer).Explain(req, cands)
					}
					if got, want := p.Pick(req, cands), old.Pick(req, cands); got != want {
						t.Fatalf("step %d: picked %d, before the refactor %d", step, got, want)
					}
				}
			})
		})
	}
}

// warm makes some decisions with p, so its cursor, draws and sessions are
// wherever a run left them.
func warm(t *rapid.T, p Policy) {
	for range rapid.IntRange(0, 10).Draw(t, "warm") {
		req := genRichRequest(t)
		p.Pick(req, genRichCands(t, req.PromptTokens, 8))
	}
}

// tuned returns name built with o, with its tunables drawn away from their
// defaults sometimes, so that guards that are off by default fire.
func tuned(t *rapid.T, name string, o Options) Policy {
	p, _ := NewPolicy(name, o)
	if !rapid.Bool().Draw(t, "tune") {
		return p
	}
	switch x := p.(type) {
	case *CostModel:
		x.KVPenalty = rapid.SampledFrom([]float64{1, 2, 4}).Draw(t, "kvpenalty")
		x.PlaceWeight = rapid.SampledFrom([]float64{0, 0.5, 2}).Draw(t, "place")
		x.BoundFloor = rapid.IntRange(0, 8).Draw(t, "floor")
		x.Bound = rapid.SampledFrom([]float64{1, 1.25, 3}).Draw(t, "bound")
	case *Dynamo:
		x.CreditDecay = rapid.SampledFrom([]float64{0, 0.5, 2}).Draw(t, "decay")
		x.ActiveRequestWeight = rapid.SampledFrom([]float64{0, 1, 8}).Draw(t, "wreq")
		x.PrefillLoadScale = rapid.SampledFrom([]float64{1, 0.5, 2}).Draw(t, "scale")
	case *KVAware:
		x.HitWeight = rapid.SampledFrom([]float64{0, 1, 2, 5}).Draw(t, "hitw")
		x.LoadWeight = rapid.SampledFrom([]float64{0, 1, 3}).Draw(t, "loadw")
	case *LLMD:
		x.PrefixWeight = rapid.SampledFrom([]float64{3, 2, 0}).Draw(t, "pw")
		x.QueueWeight = rapid.SampledFrom([]float64{2, 1}).Draw(t, "qw")
	case *PrefixHash:
		x.Bound = rapid.SampledFrom([]float64{1, 1.25, 2}).Draw(t, "phbound")
	case *SGLang:
		x.BalanceAbsThreshold = rapid.IntRange(0, 8).Draw(t, "abs")
		x.CacheThreshold = rapid.SampledFrom([]float64{0, 0.3, 0.9}).Draw(t, "threshold")
	case *AIBrix:
		x.ImbalanceAbsCount = rapid.IntRange(0, 8).Draw(t, "imbalance")
	case *Preble:
		x.ExploitThreshold = rapid.SampledFrom([]float64{0, 0.5, 0.9}).Draw(t, "exploit")
	}
	return p
}

// For every policy: the explained winner is the real pick for the same
// state, explaining twice says the same, and the reported terms reproduce
// the score the policy compared (recomputed by each policy's formula from
// the terms alone) and the winner (the best score under the objective).
func TestExplainMatchesPickAndTermsReproduceScore(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				o := Options{Seed: rapid.Uint64().Draw(t, "seed"), SessionAffinity: rapid.Bool().Draw(t, "affinity")}
				p := tuned(t, name, o)
				warm(t, p)
				req := genRichRequest(t)
				cands := genRichCands(t, req.PromptTokens, 16)
				ex, err := Explain(p, req, cands, NewEstimator(o))
				if err != nil {
					t.Fatal(err)
				}
				again, _ := Explain(p, req, cands, NewEstimator(o))
				a, _ := json.Marshal(ex)
				b, _ := json.Marshal(again)
				if string(a) != string(b) {
					t.Fatalf("explaining twice differs:\n%s\n%s", a, b)
				}
				checkTerms(t, p, req, cands, &ex)
				if got := p.Pick(req, cands); got != ex.Winner {
					t.Fatalf("explained winner %d (%s), Pick %d", ex.Winner, ex.Why, got)
				}
				if ex.Why == "" || !ex.Candidates[ex.Winner].Winner {
					t.Fatalf("no why or winner flag: %+v", ex)
				}
			})
		})
	}
}

func term(t *rapid.T, ts []Term, name string) float64 {
	for _, x := range ts {
		if x.Name == name {
			return float64(x.Value)
		}
	}
	t.Fatalf("no term %q in %v", name, ts)
	return 0
}

func same(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }

func near(a, b float64) bool {
	return a == b || math.Abs(a-b) <= 1e-9*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// bestIs checks that the winner's score is the best of the scored
// candidates under min or max.
func bestIs(t *rapid.T, ex *Explanation, minimise bool) {
	w := float64(ex.Candidates[ex.Winner].Score)
	for i, c := range ex.Candidates {
		s := float64(c.Score)
		if math.IsNaN(s) {
			continue
		}
		if (minimise && s < w) || (!minimise && s > w) {
			t.Fatalf("candidate %d scores %v, better than the winner %d's %v (%s)", i, s, ex.Winner, w, ex.Objective)
		}
	}
}

// checkTerms recomputes, per policy, each candidate's score from its terms
// and the policy-wide terms, and the winner from the scores.
func checkTerms(t *rapid.T, p Policy, req *Request, cands []Candidate, ex *Explanation) {
	n := len(cands)
	for i := range cands {
		c := &ex.Candidates[i]
		if c.Replica != cands[i].Replica || c.InFlight != cands[i].Load.InFlight || c.PredictedCachedTokens != cands[i].PredictedCachedTokens {
			t.Fatalf("candidate %d's state %+v is not %+v", i, c, cands[i])
		}
		if (c.Engine != nil) != cands[i].Load.Engine.Valid {
			t.Fatalf("candidate %d's engine view %+v for %+v", i, c.Engine, cands[i].Load.Engine)
		}
	}
	switch x := p.(type) {
	case *RoundRobin:
		if ex.Winner != int(term(t, ex.Terms, "cursor"))%n {
			t.Fatalf("winner %d, cursor %v", ex.Winner, ex.Terms)
		}
	case *Random:
		if ex.Winner != int(term(t, ex.Terms, "draw")) {
			t.Fatalf("winner %d, draw %v", ex.Winner, ex.Terms)
		}
	case *LeastRequest:
		for i, c := range ex.Candidates {
			if float64(c.Score) != term(t, c.Terms, "in_flight") || c.InFlight != cands[i].Load.InFlight {
				t.Fatalf("candidate %d: score %v, terms %v", i, c.Score, c.Terms)
			}
		}
		bestIs(t, ex, true)
	case *P2C:
		a, b := int(term(t, ex.Terms, "draw_a")), int(term(t, ex.Terms, "draw_b"))
		want := 0
		if n > 1 {
			if a == b || a < 0 || b < 0 || a >= n || b >= n {
				t.Fatalf("draws %d, %d of %d", a, b, n)
			}
			want = a
			if term(t, ex.Candidates[b].Terms, "in_flight") < term(t, ex.Candidates[a].Terms, "in_flight") {
				want = b
			}
		}
		if ex.Winner != want {
			t.Fatalf("winner %d, draws %d %d", ex.Winner, a, b)
		}
	case *PrefixHash:
		bound := term(t, ex.Terms, "load_bound")
		best := -1
		for i, c := range ex.Candidates {
			over := term(t, c.Terms, "in_flight")+1 > bound
			if over != (term(t, c.Terms, "over_bound") == 1) || float64(c.Score) != term(t, c.Terms, "ring_rank") {
				t.Fatalf("candidate %d: terms %v, score %v, bound %v", i, c.Terms, c.Score, bound)
			}
			if !over && (best < 0 || c.Score < ex.Candidates[best].Score) {
				best = i
			}
		}
		if best != ex.Winner {
			t.Fatalf("the first within the bound on the ring is %d, winner %d", best, ex.Winner)
		}
	case *KVAware:
		hw, lw := term(t, ex.Terms, "hit_weight"), term(t, ex.Terms, "load_weight")
		maxLoad, prompt := term(t, ex.Terms, "max_in_flight"), term(t, ex.Terms, "prompt_tokens")
		for i, c := range ex.Candidates {
			hit, load := term(t, c.Terms, "hit_term"), term(t, c.Terms, "load_term")
			if hit != float64(hw*float64(c.PredictedCachedTokens)/prompt) || load != float64(lw*float64(c.InFlight)/(maxLoad+1)) || float64(c.Score) != hit-load {
				t.Fatalf("candidate %d: score %v, terms %v", i, c.Score, c.Terms)
			}
		}
		bestIs(t, ex, false)
	case *CostModel:
		slack := 0.0
		if x.sessions != nil && req.Session != 0 {
			slack = term(t, ex.Terms, "session_slack")
		}
		best := math.Inf(1)
		for i, c := range ex.Candidates {
			ttft := term(t, c.Terms, "ttft_ms")
			if got := float64(term(t, c.Terms, "steps")*term(t, c.Terms, "step_ms")) + term(t, c.Terms, "prefill_linear_ms") + term(t, c.Terms, "prefill_pair_ms"); got != ttft {
				t.Fatalf("candidate %d: ttft_ms %v, its parts sum to %v", i, ttft, got)
			}
			if got := term(t, c.Terms, "queued_prefill_ms") + term(t, c.Terms, "own_prefill_ms") + term(t, c.Terms, "decode_load_ms") + term(t, c.Terms, "step_overhead_ms"); !near(got, ttft) {
				t.Fatalf("candidate %d: ttft_ms %v, its reading sums to %v", i, ttft, got)
			}
			if ttft != float64(c.EstimatedTTFTMs) {
				t.Fatalf("candidate %d: ttft_ms %v, the estimator %v", i, ttft, c.EstimatedTTFTMs)
			}
			e := (ttft + term(t, c.Terms, "place_ms")) * term(t, c.Terms, "kv_factor")
			if term(t, c.Terms, "over_bound") == 1 {
				e = math.Inf(1)
			}
			if e != float64(c.Score) || e != term(t, c.Terms, "est_ms") {
				t.Fatalf("candidate %d: score %v, recomputed %v from %v", i, c.Score, e, c.Terms)
			}
			if over := c.InFlight+1 > int(term(t, ex.Terms, "load_bound")); over != (term(t, c.Terms, "over_bound") == 1) {
				t.Fatalf("candidate %d: over_bound %v with bound %v", i, c.Terms, ex.Terms)
			}
			best = math.Min(best, e)
		}
		w := &ex.Candidates[ex.Winner]
		kept := false
		for _, g := range w.Guards {
			kept = kept || g == "session_slack"
		}
		if kept {
			if !(float64(w.Score) <= best*(1+slack)) {
				t.Fatalf("kept for its session at %v, best %v, slack %v", w.Score, best, slack)
			}
		} else if float64(w.Score) != best {
			t.Fatalf("winner scores %v, best %v", w.Score, best)
		}
	case *LLMD:
		pw, qw, kw := term(t, ex.Terms, "prefix_weight"), term(t, ex.Terms, "queue_weight"), term(t, ex.Terms, "kv_utilization_weight")
		for i, c := range ex.Candidates {
			prefix, queue, kv := term(t, c.Terms, "prefix"), term(t, c.Terms, "queue"), term(t, c.Terms, "kv_utilization")
			m, tb := term(t, c.Terms, "matched_blocks"), term(t, c.Terms, "prompt_blocks")
			if tb > 0 && prefix != m/tb || kv != 1-term(t, c.Terms, "kv_usage") || float64(c.Score) != pw*prefix+qw*queue+kw*kv {
				t.Fatalf("candidate %d: score %v, terms %v", i, c.Score, c.Terms)
			}
		}
		bestIs(t, ex, false)
	case *Dynamo:
		scale, wreq := term(t, ex.Terms, "prefill_load_scale"), term(t, ex.Terms, "active_request_weight")
		for i, c := range ex.Candidates {
			pre := term(t, c.Terms, "prefill_blocks")
			if pre != max(0, term(t, c.Terms, "raw_prefill_blocks")-term(t, c.Terms, "credit")) ||
				float64(c.Score) != scale*pre+term(t, c.Terms, "decode_blocks")+wreq*term(t, c.Terms, "active_requests") {
				t.Fatalf("candidate %d: score %v, terms %v", i, c.Score, c.Terms)
			}
		}
		bestIs(t, ex, true)
	case *SGLang:
		minL, maxL := term(t, ex.Terms, "min_load"), term(t, ex.Terms, "max_load")
		imbalanced := maxL-minL > term(t, ex.Terms, "balance_abs_threshold") && maxL > term(t, ex.Terms, "balance_rel_threshold")*minL
		regime := int(term(t, ex.Terms, "regime"))
		switch {
		case imbalanced != (regime == sglangImbalanced):
			t.Fatalf("loads %v..%v: regime %d", minL, maxL, regime)
		case regime == sglangCacheHit && !(term(t, ex.Terms, "best_match_rate") > term(t, ex.Terms, "cache_threshold")),
			regime == sglangSmallest && term(t, ex.Terms, "best_match_rate") > term(t, ex.Terms, "cache_threshold"):
			t.Fatalf("regime %d with terms %v", regime, ex.Terms)
		}
		w := &ex.Candidates[ex.Winner]
		for i, c := range ex.Candidates {
			load, rate, tree := term(t, c.Terms, "load"), term(t, c.Terms, "match_rate"), term(t, c.Terms, "tree_blocks")
			better := false
			switch regime {
			case sglangImbalanced:
				better = load < minL || float64(c.Score) != load
			case sglangCacheHit:
				better = c.Score > w.Score || c.Score == w.Score && c.InFlight < w.InFlight
				if rate > term(t, ex.Terms, "best_match_rate") {
					better = true
				}
			default:
				better = c.Score < w.Score || c.Score == w.Score && c.InFlight < w.InFlight || float64(c.Score) != tree
			}
			if better {
				t.Fatalf("candidate %d (%v, score %v) beats the winner %d (score %v) in regime %d", i, c.Terms, c.Score, ex.Winner, w.Score, regime)
			}
		}
	case *AIBrix:
		limit := term(t, ex.Terms, "running_limit")
		if !near(limit, term(t, ex.Terms, "mean_running")+term(t, ex.Terms, "std_dev_factor")*term(t, ex.Terms, "sd_running")) {
			t.Fatalf("limit %v from %v", limit, ex.Terms)
		}
		w := &ex.Candidates[ex.Winner]
		if term(t, ex.Terms, "prefix_step") == 1 {
			for i, c := range ex.Candidates {
				if math.IsNaN(float64(c.Score)) {
					continue
				}
				if float64(c.Score) != term(t, c.Terms, "match_pct") || term(t, c.Terms, "running") > limit || len(c.Guards) > 0 {
					t.Fatalf("candidate %d scored with terms %v, guards %v", i, c.Terms, c.Guards)
				}
				if c.Score > w.Score || c.Score == w.Score && term(t, c.Terms, "running") < term(t, w.Terms, "running") {
					t.Fatalf("candidate %d beats the winner: %v against %v", i, c.Terms, w.Terms)
				}
			}
		} else if term(t, w.Terms, "running") != term(t, ex.Terms, "min_running") {
			t.Fatalf("fallback winner runs %v, min %v", w.Terms, ex.Terms)
		}
	case *Preble:
		if term(t, ex.Terms, "exploit") == 1 {
			bestIs(t, ex, false)
		} else {
			for i, c := range ex.Candidates {
				if !near(float64(c.Score), term(t, c.Terms, "queued_ms")+term(t, c.Terms, "miss_ms")+term(t, c.Terms, "decode_ms")) {
					t.Fatalf("candidate %d: score %v, terms %v", i, c.Score, c.Terms)
				}
			}
			bestIs(t, ex, true)
		}
	default:
		t.Fatalf("no check of %s's terms", p.Name())
	}
}

// Explain leaves a policy as it found it: a twin built with the same seed
// and fed the same decisions, never explained, picks the same afterwards.
func TestExplainHasNoSideEffects(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				o := Options{Seed: rapid.Uint64().Draw(t, "seed"), SessionAffinity: true}
				p, _ := NewPolicy(name, o)
				twin, _ := NewPolicy(name, o)
				for step := range rapid.IntRange(1, 20).Draw(t, "steps") {
					req := genRichRequest(t)
					cands := genRichCands(t, req.PromptTokens, 8)
					for range rapid.IntRange(0, 3).Draw(t, "explains") {
						if _, err := Explain(p, req, cands, NewEstimator(o)); err != nil {
							t.Fatal(err)
						}
					}
					if a, b := p.Pick(req, cands), twin.Pick(req, cands); a != b {
						t.Fatalf("step %d: the explained policy picked %d, its twin %d", step, a, b)
					}
				}
			})
		})
	}
}

func TestExplainErrors(t *testing.T) {
	p, _ := NewPolicy("cost_model", Options{})
	if _, err := Explain(p, &Request{}, nil, NewEstimator(Options{})); err != ErrNoCandidates {
		t.Fatalf("no candidates: %v", err)
	}
	type wrapped struct{ Policy }
	_, err := Explain(wrapped{p}, &Request{}, make([]Candidate, 2), NewEstimator(Options{}))
	if err == nil || !strings.Contains(err.Error(), "cost_model") {
		t.Fatalf("a policy without Explain: %v", err)
	}
}

func TestNumJSON(t *testing.T) {
	for _, v := range []float64{0, -1.5, 1e300, math.Inf(1), math.Inf(-1), math.NaN(), 41.25} {
		b, err := json.Marshal(Num(v))
		if err != nil {
			t.Fatal(err)
		}
		var back Num
		if err := json.Unmarshal(b, &back); err != nil || !same(float64(back), v) {
			t.Fatalf("%v -> %s -> %v (%v)", v, b, back, err)
		}
	}
	var n Num
	if err := json.Unmarshal([]byte(`"fast"`), &n); err == nil {
		t.Fatal("a string that is no number accepted")
	}
}

// A cost_model explanation reads as the issue asks: the winner's estimate
// against the runner-up's, the guards that fired named.
func TestCostModelWhy(t *testing.T) {
	p := NewCostModel(Options{})
	cands := []Candidate{
		{Replica: 0, Name: "a", PredictedCachedTokens: 1984, Load: Load{InFlight: 1}},
		{Replica: 1, Name: "b", Load: Load{InFlight: 0}},
		{Replica: 2, Name: "c", Load: Load{InFlight: 9, PendingPrefillTokens: 9000}},
	}
	p.BoundFloor, p.Bound = 0, 1
	ex, err := Explain(p, &Request{PromptTokens: 2000}, cands, NewEstimator(Options{}))
	if err != nil {
		t.Fatal(err)
	}
	if ex.Winner != 0 || !strings.HasPrefix(ex.Why, "lowest estimated TTFT") || !strings.Contains(ex.Why, "; b was") {
		t.Fatalf("why: %q (winner %d)", ex.Why, ex.Winner)
	}
	if g := ex.Candidates[2].Guards; len(g) != 1 || g[0] != "bounded_load" || !math.IsInf(float64(ex.Candidates[2].Score), 1) {
		t.Fatalf("c: guards %v, score %v", g, ex.Candidates[2].Score)
	}
	b, err := json.Marshal(ex)
	if err != nil || !strings.Contains(string(b), `"score":"inf"`) {
		t.Fatalf("json: %s (%v)", b, err)
	}
}

// BenchmarkPickBeforeAfter times every policy's Pick before the explain
// refactor (old) and after (new) in one process, on the candidates of
// BenchmarkPickAll.
func BenchmarkPickBeforeAfter(b *testing.B) {
	for _, name := range Ordered() {
		for _, n := range []int{8, 64} {
			for _, v := range []string{"old", "new"} {
				b.Run(name+"/"+strconv.Itoa(n)+"/"+v, func(b *testing.B) {
					o := Options{Seed: 1, SessionAffinity: true}
					var p oldPicker = oldPolicy(name, o)
					if v == "new" {
						p, _ = NewPolicy(name, o)
					}
					cands := benchPeerCands(n)
					req := benchRequest()
					b.ReportAllocs()
					for b.Loop() {
						p.Pick(req, cands)
					}
				})
			}
		}
	}
}

// BenchmarkExplain times one explanation (off the hot path: /admin/explain,
// sim --explain-sample).
func BenchmarkExplain(b *testing.B) {
	for _, name := range Ordered() {
		b.Run(name+"/8", func(b *testing.B) {
			p, _ := NewPolicy(name, Options{Seed: 1, SessionAffinity: true})
			cands := benchPeerCands(8)
			req := benchRequest()
			est := NewEstimator(Options{})
			b.ReportAllocs()
			for b.Loop() {
				Explain(p, req, cands, est)
			}
		})
	}
}

// BenchmarkPickRatio times old and new Pick interleaved, in blocks of 64
// picks each (which goes first alternating), so that both see the same
// load on a shared machine; it reports each one's median ns per pick and
// new/old.
func BenchmarkPickRatio(b *testing.B) {
	for _, name := range Ordered() {
		for _, n := range []int{8, 64} {
			b.Run(name+"/"+strconv.Itoa(n), func(b *testing.B) {
				o := Options{Seed: 1, SessionAffinity: true}
				old := oldPolicy(name, o)
				p, _ := NewPolicy(name, o)
				cands := benchPeerCands(n)
				req := benchRequest()
				var to, tn []float64
				b.ReportAllocs()
				flip := false
				for b.Loop() {
					// Alternate which goes first, so neither gains from order.
					first, second := old, oldPicker(p)
					if flip {
						first, second = second, first
					}
					t0 := time.Now()
					for range 64 {
						first.Pick(req, cands)
					}
					t1 := time.Now()
					for range 64 {
						second.Pick(req, cands)
					}
					t2 := time.Now()
					a, c := float64(t1.Sub(t0))/64, float64(t2.Sub(t1))/64
					if flip {
						a, c = c, a
					}
					to, tn = append(to, a), append(tn, c)
					flip = !flip
				}
				slices.Sort(to)
				slices.Sort(tn)
				mo, mn := to[len(to)/2], tn[len(tn)/2]
				b.ReportMetric(mo, "old-ns/pick")
				b.ReportMetric(mn, "new-ns/pick")
				b.ReportMetric(mn/mo, "new/old")
			})
		}
	}
}
