package router

import (
	"fmt"
	"math"
)

var (
	_ Policy    = (*AIBrix)(nil)
	_ Explainer = (*AIBrix)(nil)
)

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
	rng       policyRNG
	ex        *Explanation // set on the copy Explain picks with
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
	ex := p.ex
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
	if ex != nil {
		p.explainPool(imbalanced, minR, maxR, mean, sd, limit)
	}

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
		if ex != nil {
			ex.Candidates[i].Score = Num(pct)
		}
		if best < 0 || pct > bestPct || pct == bestPct && r < bestR {
			best, bestPct, bestR = i, pct, r
		}
	}
	if best >= 0 {
		if ex != nil {
			ex.term("prefix_step", 1)
		}
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
	if ex != nil {
		ex.term("prefix_step", 0)
		ex.term("ties", float64(ties))
	}
	return best
}

func (p *AIBrix) explainPool(imbalanced bool, minR, maxR int, mean, sd, limit float64) {
	ex := p.ex
	ex.term("imbalanced", b2f(imbalanced))
	ex.term("min_running", float64(minR))
	ex.term("max_running", float64(maxR))
	ex.term("imbalance_abs_count", float64(p.ImbalanceAbsCount))
	ex.term("mean_running", mean)
	ex.term("sd_running", sd)
	ex.term("std_dev_factor", p.StdDevFactor)
	ex.term("running_limit", limit)
}

// Explain reports the pool's running-request spread, mean, σ and limit,
// each candidate's r and match%, and which filters left it out (guards
// imbalance: not among the least loaded of an imbalanced pool;
// sigma_limit: r above mean + k·σ). Score is match% for the candidates the
// prefix step considered (it takes the highest, ties to lower r), else,
// in the least-request fallback, r (the lowest, ties at random). The
// winner is what Pick returns on a copy of the policy whose source is a
// copy of this one's.
func (p *AIBrix) Explain(req *Request, cands []Candidate) Explanation {
	ex := newExplanation(p.Name(), "", cands)
	cp := *p
	cp.rng, cp.ex = p.rng.clone(), &ex
	ex.Winner = cp.Pick(req, cands)
	step, _ := ex.Term("prefix_step")
	matched := step == 1
	imb, _ := ex.Term("imbalanced")
	minR, _ := ex.Term("min_running")
	limit, _ := ex.Term("running_limit")
	ex.Objective = "max match_pct (then min running)"
	if !matched {
		ex.Objective = "min running (least-request fallback)"
	}
	prompt := peerPromptTokens(req)
	for i := range cands {
		r := p.running(&cands[i])
		m, t := peerBlocks(prompt, cands[i].PredictedCachedTokens, p.blockSize)
		pct := 0
		if t > 0 {
			pct = 100 * m / t
		}
		ex.cterm(i, "running", float64(r))
		ex.cterm(i, "matched_blocks", float64(m))
		ex.cterm(i, "prompt_blocks", float64(t))
		ex.cterm(i, "match_pct", float64(pct))
		if imb == 1 && float64(r) != minR {
			ex.guard(i, "imbalance")
		}
		if float64(r) > limit {
			ex.guard(i, "sigma_limit")
		}
		if !matched {
			ex.Candidates[i].Score = Num(r)
		}
	}
	w := ex.Winner
	if matched {
		ex.Why = fmt.Sprintf("the longest match among the candidates within the load limits: %s, %d%% of the prompt's blocks, %d running (limit %s)",
			ex.label(w), int(ex.Candidates[w].Score), p.running(&cands[w]), fmtNum(limit, ""))
	} else {
		ex.Why = fmt.Sprintf("no candidate within the load limits matches a block: least request, %s with %d running", ex.label(w), p.running(&cands[w]))
		if ties, _ := ex.Term("ties"); ties > 1 {
			ex.Why += fmt.Sprintf(" (a tie of %d, broken at random)", int(ties))
		}
	}
	return ex
}
