package router

import (
	"math"
	"math/rand/v2"
)

var _ Policy = (*AIBrix)(nil)

// AIBrix is the prefix-cache router of AIBrix's gateway (vllm-project/aibrix,
// pkg/plugins/gateway/algorithms/prefix_cache.go, getTargetPodFromMatchedPods
// and getTargetPodListOnLoadImbalance; mean and σ in algorithms/util.go; the
// fallback selectTargetPodWithLeastRequestCount in algorithms/least_request.go).
// With r(c) the candidate's running requests:
//
//  1. If max r − min r > 8, keep only the candidates with r = min r.
//  2. match%(c) = ⌊100·m/T⌋ (integer percent, as AIBrix's index reports it).
//     Among the kept candidates that match at least one block, order by
//     match% descending, then r ascending, then index, and pick the first
//     whose r ≤ mean + k·σ, mean and σ taken over all candidates' r (σ is the
//     sample standard deviation, n − 1 in the denominator, 0 for one
//     candidate; k = 1).
//  3. If none qualifies, least-request: the minimum r over all candidates,
//     ties broken uniformly at random (seeded).
//
// Defaults are the code's (AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT
// = 8, AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR = 1); the README's 16
// and 2 are not what the code uses.
//
// Departures:
//   - r is Engine.Running (vllm:num_requests_running) when the replica has
//     been scraped, and the gateway's exact Load.InFlight before its first
//     scrape. AIBrix itself reads RealtimeNumRequestsRunning, a counter its
//     gateway increments on routing and decrements on completion
//     (pkg/cache/cache_trace.go), i.e. our Load.InFlight; set
//     UseGatewayCount to reproduce that exactly.
//   - AIBrix shuffles the matched pods before its stable sort, so ties in
//     (match%, r) are random; ours go to the lower index.
//   - m is the shared KV index's prediction; AIBrix hashes the prompt in
//     blocks of its own (4 tokens by default, full blocks only) into a table
//     filled from its routing decisions (or, opt-in, KV events). T here is
//     ceil(PromptTokens/BlockSize).
type AIBrix struct {
	// ImbalanceAbsCount is the running-request spread above which only the
	// least-loaded candidates are considered (default 8).
	ImbalanceAbsCount int
	// StdDevFactor is k in r ≤ mean + k·σ (default 1).
	StdDevFactor float64
	// UseGatewayCount makes r the gateway's in-flight count always, as
	// AIBrix's own gateway counter is (default false: the scraped
	// Engine.Running when valid).
	UseGatewayCount bool

	blockSize int
	rng       *rand.Rand
}

// NewAIBrix returns AIBrix's prefix-cache router with the code defaults.
func NewAIBrix(o Options) *AIBrix {
	o = o.withDefaults()
	return &AIBrix{
		ImbalanceAbsCount: 8,
		StdDevFactor:      1,
		blockSize:         o.BlockSize,
		rng:               subRNG(o.Seed, "aibrix"),
	}
}

func (*AIBrix) Name() string { return "aibrix" }

// running is r(c).
func (p *AIBrix) running(c *Candidate) int {
	if c.Load.Engine.Valid && !p.UseGatewayCount {
		return c.Load.Engine.Running
	}
	return c.Load.InFlight
}

func (p *AIBrix) Pick(req *Request, cands []Candidate) int {
	n := len(cands)
	minR, maxR, sum := math.MaxInt, math.MinInt, 0.0
	for i := range cands {
		r := p.running(&cands[i])
		minR, maxR = min(minR, r), max(maxR, r)
		sum += float64(r)
	}
	imbalanced := maxR-minR > p.ImbalanceAbsCount
	mean := sum / float64(n)
	sd := 0.0
	if n > 1 {
		ss := 0.0
		for i := range cands {
			d := float64(p.running(&cands[i])) - mean
			ss += d * d
		}
		sd = math.Sqrt(ss / float64(n-1))
	}
	limit := mean + p.StdDevFactor*sd

	// The first candidate in (match% desc, r asc, index asc) order that passes
	// the σ guard is the minimum of that order among those that pass it.
	prompt := peerPromptTokens(req)
	best, bestPct, bestR := -1, 0, 0
	for i := range cands {
		r := p.running(&cands[i])
		if imbalanced && r != minR {
			continue
		}
		m, t := peerBlocks(prompt, cands[i].PredictedCachedTokens, p.blockSize)
		if m == 0 || float64(r) > limit {
			continue
		}
		pct := 100 * m / t
		if best < 0 || pct > bestPct || pct == bestPct && r < bestR {
			best, bestPct, bestR = i, pct, r
		}
	}
	if best >= 0 {
		return best
	}

	// Least-request fallback, ties at random.
	best, ties := -1, 0
	for i := range cands {
		if p.running(&cands[i]) != minR {
			continue
		}
		ties++
		if ties == 1 || p.rng.IntN(ties) == 0 {
			best = i
		}
	}
	return best
}
