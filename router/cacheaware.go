package router

import (
	"github.com/inferrail/inferrail/engine/kvblock"
	"math"
	"math/rand/v2"
	"slices"
)

// Compile-time checks that our policies implement Policy.
var (
	_ Policy = (*PrefixHash)(nil)
	_ Policy = (*KVAware)(nil)
	_ Policy = (*CostModel)(nil)
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

func (p *PrefixHash) build(cands []Candidate) {
	same := len(p.members) == len(cands)
	for i := 0; same && i < len(cands); i++ {
		same = p.members[i] == cands[i].Replica
	}
	if same {
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

func (p *PrefixHash) Pick(req *Request, cands []Candidate) int {
	p.build(cands)
	var key uint64
	if n := len(req.BlockHashes); n > 0 {
		key = req.BlockHashes[min(p.KeyBlocks, n)-1].Lo
	} else {
		key = kvblock.Mix64(req.ID + 0x9E3779B97F4A7C15)
	}
	bound := LoadBound(p.Bound, cands)
	start, _ := slices.BinarySearchFunc(p.ring, key, func(pt ringPoint, k uint64) int {
		switch {
		case pt.pos < k:
			return -1
		case pt.pos > k:
			return 1
		}
		return 0
	})
	for i := range p.ring {
		pt := p.ring[(start+i)%len(p.ring)]
		if cands[pt.cand].Load.InFlight+1 <= bound {
			return pt.cand
		}
	}
	return leastInFlight(cands) // unreachable for Bound >= 1
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
	rng                   *rand.Rand
}

// NewKVAware returns kv_aware with its defaults.
func NewKVAware(o Options) *KVAware {
	return &KVAware{HitWeight: 2, LoadWeight: 1, rng: subRNG(o.Seed, "kv_aware")}
}

func (*KVAware) Name() string { return "kv_aware" }

func (p *KVAware) Pick(req *Request, cands []Candidate) int {
	maxLoad := 0
	for _, c := range cands {
		maxLoad = max(maxLoad, c.Load.InFlight)
	}
	prompt := float64(max(req.PromptTokens, 1))
	best, ties := 0, 0
	bestScore := math.Inf(-1)
	for i, c := range cands {
		s := p.HitWeight*float64(c.PredictedCachedTokens)/prompt - p.LoadWeight*float64(c.Load.InFlight)/float64(maxLoad+1)
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
	return best
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
	rng      *rand.Rand
	sessions map[uint64]int // session -> replica of its last turn
	est      []float64
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
	pr := p.opts.Profile
	cached := min(c.PredictedCachedTokens, prompt)
	u := float64(prompt - cached)
	tokens := float64(c.Load.PendingPrefillTokens) + u
	steps := math.Max(1, math.Ceil(tokens/float64(p.opts.MaxNumBatchedTokens)))
	decoding := float64(max(0, c.Load.InFlight-c.Load.Pending))
	decodingCtx := float64(max(0, c.Load.InFlightPromptTokens-c.Load.PendingPromptTokens))
	step := pr.StepFixedMs + float64(pr.DecodeSeqUs*decoding)/1e3 + float64(pr.DecodeCtxTokenNs*decodingCtx)/1e6
	return float64(steps*step) + float64(pr.PrefillTokenUs*tokens)/1e3 + float64(pr.PrefillPairNs*u*(float64(cached)+u/2))/1e6
}

func (p *CostModel) Pick(req *Request, cands []Candidate) int {
	bound := max(LoadBound(p.Bound, cands), p.BoundFloor)
	minIndexed := math.MaxInt
	for i := range cands {
		minIndexed = min(minIndexed, cands[i].IndexedBlocks)
	}
	p.est = p.est[:0]
	best, ties := -1, 0
	for i := range cands {
		c := &cands[i]
		e := p.EstimateTTFT(req.PromptTokens, c)
		if p.PlaceWeight > 0 && c.KVCapacityBlocks > 0 {
			cached := min(c.PredictedCachedTokens, req.PromptTokens)
			full := math.Min(1, float64(c.IndexedBlocks-minIndexed)/float64(c.KVCapacityBlocks))
			e += p.PlaceWeight * full * float64(p.opts.Profile.PrefillTime(req.PromptTokens-cached, cached)) / 1e6
		}
		if u := c.Load.Engine.KVCacheUsage; c.Load.Engine.Valid && u > p.KVHigh {
			e *= 1 + (p.KVPenalty-1)*math.Min(1, (u-p.KVHigh)/(1-p.KVHigh))
		}
		if c.Load.InFlight+1 > bound {
			e = math.Inf(1)
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
	if p.sessions != nil && req.Session != 0 {
		if prev, ok := p.sessions[req.Session]; ok {
			for i, c := range cands {
				if c.Replica == prev && p.est[i] <= p.est[best]*(1+p.SessionSlack) {
					best = i
					break
				}
			}
		}
		if len(p.sessions) >= maxSessions {
			clear(p.sessions)
		}
		p.sessions[req.Session] = cands[best].Replica
	}
	return best
}
