package router

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// Compile-time checks that our policies implement Policy.
var (
	_ Policy    = (*PrefixHash)(nil)
	_ Policy    = (*KVAware)(nil)
	_ Policy    = (*CostModel)(nil)
	_ Explainer = (*PrefixHash)(nil)
	_ Explainer = (*KVAware)(nil)
	_ Explainer = (*CostModel)(nil)
)

// PrefixHash is consistent hashing on the prompt's leading blocks with
// bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with
// Bounded Loads", 2018).
//
// The key is the chained hash of block min(KeyBlocks, blocks)-1, which names
// the whole leading prefix; prompts without a full block are keyed by their
// id. Each candidate owns VirtualNodes points on a ring; the request walks
// clockwise from its key and takes the first candidate whose load after
// taking it stays within the bound
//
//	in_flight + 1 <= ceil(Bound * (sum of in_flight + 1) / candidates)
//
// so a hot prefix spills to the next replicas on the ring instead of melting
// one. Such a candidate always exists for Bound >= 1.
type PrefixHash struct {
	KeyBlocks    int     // leading blocks that form the key (8)
	VirtualNodes int     // ring points per replica (64)
	Bound        float64 // load bound factor c >= 1 (1.25)

	ring    []ringPoint
	members []int // replica ids the ring was built for, in candidate order
}

type ringPoint struct {
	pos  uint64
	cand int // index into the candidate slice the ring was built for
}

// NewPrefixHash returns prefix_hash with its defaults.
func NewPrefixHash(Options) *PrefixHash {
	return &PrefixHash{KeyBlocks: 8, VirtualNodes: 64, Bound: 1.25}
}

func (*PrefixHash) Name() string { return "prefix_hash" }

// builtFor reports whether the cached ring was built for cands.
func (p *PrefixHash) builtFor(cands []Candidate) bool {
	same := len(p.members) == len(cands)
	for i := 0; same && i < len(cands); i++ {
		same = p.members[i] == cands[i].Replica
	}
	return same
}

func (p *PrefixHash) build(cands []Candidate) {
	if p.builtFor(cands) {
		return
	}
	p.members = p.members[:0]
	p.ring = p.ring[:0]
	for i, c := range cands {
		p.members = append(p.members, c.Replica)
		for v := range p.VirtualNodes {
			pos := kvblock.Mix64(uint64(c.Replica)<<20 ^ uint64(v) ^ 0x5851F42D4C957F2D)
			p.ring = append(p.ring, ringPoint{pos: pos, cand: i})
		}
	}
	slices.SortFunc(p.ring, func(a, b ringPoint) int {
		switch {
		case a.pos < b.pos:
			return -1
		case a.pos > b.pos:
			return 1
		}
		return a.cand - b.cand
	})
}

// LoadBound is the most requests in flight a candidate may have after
// taking one more, under bound factor c.
func LoadBound(c float64, cands []Candidate) int {
	total := 0
	for _, x := range cands {
		total += x.Load.InFlight
	}
	return int(math.Ceil(c * float64(total+1) / float64(len(cands))))
}

// key is the ring position of req: its leading prefix's hash, else its id's.
func (p *PrefixHash) key(req *Request) uint64 {
	if n := len(req.BlockHashes); n > 0 {
		return req.BlockHashes[min(p.KeyBlocks, n)-1].Lo
	}
	return kvblock.Mix64(req.ID + 0x9E3779B97F4A7C15)
}

// walk is Pick's rule on ring (built for cands): it walks clockwise from
// key and returns the first candidate within the load bound, the ring
// index the walk started at and how many points it passed over.
func (p *PrefixHash) walk(ring []ringPoint, key uint64, bound int, cands []Candidate) (pick, start, steps int) {
	start, _ = slices.BinarySearchFunc(ring, key, func(pt ringPoint, k uint64) int {
		switch {
		case pt.pos < k:
			return -1
		case pt.pos > k:
			return 1
		}
		return 0
	})
	for i := range ring {
		pt := ring[(start+i)%len(ring)]
		if cands[pt.cand].Load.InFlight+1 <= bound {
			return pt.cand, start, i
		}
	}
	return leastInFlight(cands), start, len(ring) // unreachable for Bound >= 1
}

func (p *PrefixHash) Pick(req *Request, cands []Candidate) int {
	p.build(cands)
	pick, _, _ := p.walk(p.ring, p.key(req), LoadBound(p.Bound, cands), cands)
	return pick
}

// Explain walks the ring as Pick does. The ring Pick caches is read when it
// was built for these candidates, else one is built aside (the cache is not
// touched). Score is each candidate's rank on the walk (0: the first met).
func (p *PrefixHash) Explain(req *Request, cands []Candidate) Explanation {
	ring := p.ring
	if !p.builtFor(cands) {
		q := &PrefixHash{VirtualNodes: p.VirtualNodes}
		q.build(cands)
		ring = q.ring
	}
	ex := newExplanation(p.Name(), "min ring_rank within load bound", cands)
	key, bound := p.key(req), LoadBound(p.Bound, cands)
	pick, start, steps := p.walk(ring, key, bound, cands)
	ex.Winner = pick
	ex.term("key", float64(key>>11)) // the top 53 bits: a float64 holds them exactly
	ex.term("load_bound", float64(bound))
	ex.term("bound_factor", p.Bound)
	ex.term("ring_start", float64(start))
	ex.term("ring_steps", float64(steps))
	rank := make([]int, len(cands))
	for i := range rank {
		rank[i] = -1
	}
	met := 0
	for i := 0; i < len(ring) && met < len(cands); i++ {
		if c := ring[(start+i)%len(ring)].cand; rank[c] < 0 {
			rank[c] = met
			met++
		}
	}
	var skipped []string
	for i := range cands {
		over := cands[i].Load.InFlight+1 > bound
		ex.cterm(i, "in_flight", float64(cands[i].Load.InFlight))
		ex.cterm(i, "over_bound", b2f(over))
		ex.cterm(i, "ring_rank", float64(rank[i]))
		ex.Candidates[i].Score = Num(rank[i])
		if over {
			ex.guard(i, "load_bound")
			if rank[i] < rank[pick] {
				skipped = append(skipped, ex.label(i))
			}
		}
	}
	ex.Why = fmt.Sprintf("first on the ring from the prompt's key within the load bound (%d in flight after it)", bound)
	if len(skipped) > 0 {
		ex.Why += fmt.Sprintf("; passed over %v, at the bound", skipped)
	}
	return ex
}

func leastInFlight(cands []Candidate) int {
	best := 0
	for i := 1; i < len(cands); i++ {
		if cands[i].Load.InFlight < cands[best].Load.InFlight {
			best = i
		}
	}
	return best
}

// KVAware scores each candidate by its predicted cache hit and its load:
//
//	score = HitWeight * predicted_cached / prompt_tokens
//	      - LoadWeight * in_flight / (max in_flight + 1)
//
// and takes the highest score, ties uniformly at random. Both terms are in
// [0, 1], so with the default weights (2, 1) a full hit outweighs any load
// difference and a partial one is traded against it.
type KVAware struct {
	HitWeight, LoadWeight float64
	rng                   policyRNG
	ex                    *Explanation // set on the copy Explain picks with
}

// NewKVAware returns kv_aware with its defaults.
func NewKVAware(o Options) *KVAware {
	return &KVAware{HitWeight: 2, LoadWeight: 1, rng: subRNG(o.Seed, "kv_aware")}
}

func (*KVAware) Name() string { return "kv_aware" }

// kvTerms are KVAware's two terms for one candidate and its score: the
// weighted hit, the weighted load, hit - load.
func (p *KVAware) kvTerms(prompt float64, c *Candidate, maxLoad int) (hit, load, score float64) {
	hit = float64(p.HitWeight * float64(c.PredictedCachedTokens) / prompt)
	load = float64(p.LoadWeight * float64(c.Load.InFlight) / float64(maxLoad+1))
	return hit, load, hit - load
}

func (p *KVAware) Pick(req *Request, cands []Candidate) int {
	maxLoad := 0
	for _, c := range cands {
		maxLoad = max(maxLoad, c.Load.InFlight)
	}
	prompt := float64(max(req.PromptTokens, 1))
	best, ties := 0, 0
	bestScore := math.Inf(-1)
	for i := range cands {
		hit, load, s := p.kvTerms(prompt, &cands[i], maxLoad)
		if p.ex != nil {
			p.ex.cterm(i, "hit_term", hit)
			p.ex.cterm(i, "load_term", load)
			p.ex.Candidates[i].Score = Num(s)
		}
		switch {
		case s > bestScore:
			best, bestScore, ties = i, s, 1
		case s == bestScore:
			ties++
			if p.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if p.ex != nil {
		p.ex.term("hit_weight", p.HitWeight)
		p.ex.term("load_weight", p.LoadWeight)
		p.ex.term("max_in_flight", float64(maxLoad))
		p.ex.term("prompt_tokens", prompt)
		p.ex.term("ties", float64(ties))
	}
	return best
}

// Explain reports each candidate's hit and load terms,
// hit_term = hit_weight * predicted_cached / prompt_tokens and
// load_term = load_weight * in_flight / (max_in_flight + 1), score =
// hit_term - load_term. The winner is what Pick returns on a copy of the
// policy whose source is a copy of this one's.
func (p *KVAware) Explain(req *Request, cands []Candidate) Explanation {
	ex := newExplanation(p.Name(), "max score", cands)
	cp := *p
	cp.rng, cp.ex = p.rng.clone(), &ex
	ex.Winner = cp.Pick(req, cands)
	ties, _ := ex.Term("ties")
	ex.Why = ex.compared("score (hit - load)", "", false, int(ties))
	return ex
}

// CostModel sends each request to the candidate with the lowest estimated
// time to first token: the prefill work queued ahead of it there plus its own
// uncached prefill, priced with the engine profile, as the engine will run
// them (chunks of max_num_batched_tokens per step, each step also carrying
// the replica's decoding requests):
//
//	c      = predicted cached tokens,  u = prompt_tokens - c
//	tokens = pending_prefill_tokens + u        (FIFO: queued prefills first)
//	steps  = max(1, ceil(tokens / max_num_batched_tokens))
//	step   = step_fixed + decode_seq*decoding + decode_ctx_token*decoding_ctx
//	ttft   = steps*step + prefill_token*tokens + prefill_pair*u*(c + u/2)
//	cost   = ttft + PlaceWeight * fullness * P(u, c)
//
// where P(u, c) is this request's own prefill time and fullness how much
// more of its KV capacity the index holds on this replica than on the
// emptiest candidate: a miss on a fuller cache evicts prefixes that later
// requests will miss, so new prefixes go where there is room. pending_prefill_tokens, decoding (in flight minus pending) and
// decoding_ctx (their prompt tokens) are the gateway's own exact counters.
// Guards keep a hot prefix from melting one replica:
//   - bounded load: candidates whose in-flight count would exceed
//     max(BoundFloor, ceil(Bound * (sum in_flight + 1) / candidates)) are
//     skipped. The floor keeps the guard out of lightly loaded fleets,
//     where the bound is one or two requests and would push a session off
//     the replica holding its prefix while the queue terms already price
//     the load (on a long-prompt, heavy-reuse trace on 16 replicas it cost
//     6% of the hit rate and 13% of TTFT p99);
//   - KV pressure, off by default (KVPenalty 1): a replica whose scraped KV
//     usage is above KVHigh has its estimate inflated by up to KVPenalty x
//     (at 100% usage). It was on (4x) until measured: it changed nothing on
//     W1-W6 and the long-prompt traces, and under overload (W7 without
//     admission) it cost 15% of TTFT p99 (250 s against 219 s), because in
//     a burst every replica is full and the scraped usage, up to a scrape
//     interval old, tilts the estimates without measuring the queue.
//
// With SessionAffinity, a session's turn stays on the replica of its
// previous turn unless that estimate exceeds the best by more than SessionSlack.
// Ties go to fewer requests in flight, then at random.
type CostModel struct {
	Bound        float64 // 3
	BoundFloor   int     // 8
	KVHigh       float64 // 0.9
	KVPenalty    float64 // 1 (off)
	SessionSlack float64 // 0.25
	// PlaceWeight charges a choice for the cached prefixes it will evict:
	// PlaceWeight * fullness * the request's own prefill time, where
	// fullness is the share of its KV capacity the index holds on the
	// replica beyond what it holds on the emptiest candidate.
	// It spreads new prefixes over the replicas whose caches have room.
	PlaceWeight float64 // 0.5

	opts     Options
	rng      policyRNG
	sessions map[uint64]int // session -> replica of its last turn
	est      []float64
	ex       *Explanation // set on the copy Explain picks with
}

// maxSessions bounds the session-affinity memory; it is cleared when full.
const maxSessions = 1 << 20

// NewCostModel returns cost_model with its defaults.
func NewCostModel(o Options) *CostModel {
	o = o.withDefaults()
	p := &CostModel{Bound: 3, BoundFloor: 8, KVHigh: 0.9, KVPenalty: 1, SessionSlack: 0.25, PlaceWeight: 0.5, opts: o, rng: subRNG(o.Seed, "cost_model")}
	if o.SessionAffinity {
		p.sessions = make(map[uint64]int)
	}
	return p
}

func (*CostModel) Name() string { return "cost_model" }

// EstimateTTFT returns the modelled time to first token, in milliseconds, of
// a request with prompt tokens on candidate c (before the guards).
func (p *CostModel) EstimateTTFT(prompt int, c *Candidate) float64 {
	return ttftMs(&p.opts, prompt, c, nil)
}

func (p *CostModel) Pick(req *Request, cands []Candidate) int {
	bound := max(LoadBound(p.Bound, cands), p.BoundFloor)
	minIndexed := math.MaxInt
	for i := range cands {
		minIndexed = min(minIndexed, cands[i].IndexedBlocks)
	}
	var t ttftTerms
	var out *ttftTerms
	if p.ex != nil {
		out = &t
	}
	p.est = p.est[:0]
	best, ties := -1, 0
	for i := range cands {
		c := &cands[i]
		e := ttftMs(&p.opts, req.PromptTokens, c, out)
		full, place := 0.0, 0.0
		if p.PlaceWeight > 0 && c.KVCapacityBlocks > 0 {
			cached := min(c.PredictedCachedTokens, req.PromptTokens)
			full = math.Min(1, float64(c.IndexedBlocks-minIndexed)/float64(c.KVCapacityBlocks))
			place = float64(p.PlaceWeight * full * float64(p.opts.Profile.PrefillTime(req.PromptTokens-cached, cached)) / 1e6)
			e += place
		}
		factor := 1.0
		if u := c.Load.Engine.KVCacheUsage; c.Load.Engine.Valid && u > p.KVHigh {
			factor = 1 + (p.KVPenalty-1)*math.Min(1, (u-p.KVHigh)/(1-p.KVHigh))
			e *= factor
		}
		over := c.Load.InFlight+1 > bound
		if over {
			e = math.Inf(1)
		}
		if p.ex != nil {
			p.explainCandidate(i, t, full, place, factor, over, e)
		}
		p.est = append(p.est, e)
		switch {
		case best < 0 || e < p.est[best] || (e == p.est[best] && c.Load.InFlight < cands[best].Load.InFlight):
			best, ties = i, 1
		case e == p.est[best] && c.Load.InFlight == cands[best].Load.InFlight:
			ties++
			if p.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if p.ex != nil {
		p.explainPolicy(bound, minIndexed, ties, best)
	}
	if p.sessions != nil && req.Session != 0 {
		prev, ok := p.sessions[req.Session]
		if p.ex != nil {
			p.explainSession(prev, ok)
		}
		if ok {
			for i, c := range cands {
				if c.Replica == prev && p.est[i] <= p.est[best]*(1+p.SessionSlack) {
					best = i
					if p.ex != nil {
						p.ex.guard(i, "session_slack")
					}
					break
				}
			}
		}
		if p.ex != nil {
			return best // explaining: the session memory is not written
		}
		if len(p.sessions) >= maxSessions {
			clear(p.sessions)
		}
		p.sessions[req.Session] = cands[best].Replica
	}
	return best
}

// explainCandidate records candidate i's terms: its TTFT estimate's parts,
// the placement charge (fullness x place_weight x own prefill), the KV
// pressure factor and the load bound; est_ms = (ttft_ms + place_ms) x
// kv_factor, or inf over the bound.
func (p *CostModel) explainCandidate(i int, t ttftTerms, full, place, factor float64, over bool, e float64) {
	ex := p.ex
	ex.explainTTFT(i, &p.opts, t)
	ex.cterm(i, "fullness", full)
	ex.cterm(i, "place_ms", place)
	ex.cterm(i, "kv_factor", factor)
	ex.cterm(i, "over_bound", b2f(over))
	ex.cterm(i, "est_ms", e)
	ex.Candidates[i].Score = Num(e)
	if over {
		ex.guard(i, "bounded_load")
	}
	if factor != 1 {
		ex.guard(i, "kv_pressure")
	}
	if place > 0 {
		ex.guard(i, "placement")
	}
}

func (p *CostModel) explainPolicy(bound, minIndexed, ties, best int) {
	ex := p.ex
	ex.term("load_bound", float64(bound))
	ex.term("bound_factor", p.Bound)
	ex.term("bound_floor", float64(p.BoundFloor))
	ex.term("kv_high", p.KVHigh)
	ex.term("kv_penalty", p.KVPenalty)
	ex.term("place_weight", p.PlaceWeight)
	ex.term("min_indexed_blocks", float64(minIndexed))
	ex.term("ties", float64(ties))
	ex.term("best_by_estimate", float64(best))
}

func (p *CostModel) explainSession(prev int, ok bool) {
	p.ex.term("session_slack", p.SessionSlack)
	if !ok {
		prev = -1
	}
	p.ex.term("session_prev_replica", float64(prev))
}

// Explain reports each candidate's estimate and guards. The winner is what
// Pick returns on a copy of the policy whose source is a copy of this
// one's; the copy reads the session memory and does not write it.
func (p *CostModel) Explain(req *Request, cands []Candidate) Explanation {
	ex := newExplanation(p.Name(), "min est_ms", cands)
	cp := *p
	cp.rng, cp.ex, cp.est = p.rng.clone(), &ex, make([]float64, 0, len(cands))
	best := cp.Pick(req, cands)
	ex.Winner = best
	byEstF, _ := ex.Term("best_by_estimate")
	tiesF, _ := ex.Term("ties")
	byEst, ties, est := int(byEstF), int(tiesF), cp.est
	switch {
	case best != byEst:
		ex.Why = fmt.Sprintf("session %d stays on %s: estimated %s, within session slack %s of the best, %s on %s",
			req.Session, ex.label(best), fmtNum(est[best], "ms"), strconv.FormatFloat(p.SessionSlack, 'f', -1, 64), fmtNum(est[byEst], "ms"), ex.label(byEst))
	case math.IsInf(est[best], 1):
		ex.Why = "every candidate is over the load bound: " + ex.compared("estimated TTFT", "ms", true, ties)
	default:
		ex.Why = ex.compared("estimated TTFT", "ms", true, ties)
	}
	return ex
}
