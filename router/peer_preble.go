package router

import (
	"fmt"
	"math"
	"time"

	"github.com/inferrail/inferrail/engine"
)

var (
	_ Policy    = (*Preble)(nil)
	_ Explainer = (*Preble)(nil)
)

// Preble is the E2 (exploit/explore) global scheduler of Preble (ICLR'25;
// WukLab/preble, multi_node/global_scheduler_with_time.py,
// GlobalSchedulerWithTime.runtime_selector), in the form AIBrix ports it
// (vllm-project/aibrix, pkg/plugins/gateway/algorithms/prefix_cache_preble.go):
//
// Exploit: if the best match ratio over the candidates, max m/T, is above
// 0.5 (Preble: the request's new tokens are fewer than its cached ones),
// route among the candidates with the longest match to the least loaded one
// (Load.InFlight; ties: lower index).
//
// Explore: otherwise route to the candidate with the lowest estimated cost
// (ties: lower index), all in modelled time:
//
//	cost = P(Load.PendingPrefillTokens, 0)    window load L: prefill work already queued there
//	     + P(PromptTokens − cached, cached)   this request's miss cost
//	     + Load.InFlight · DecodeSeqUs        decode load
//
// where P(u, c) = Profile.PrefillTime(u, c) and cached = PredictedCachedTokens.
//
// Departures:
//   - Preble (and AIBrix's port) price prefill with hard-coded fits for
//     Mistral-7B on A6000/V100 GPUs. We use the engine profile the simulated
//     fleet runs (Options.Profile), so that Preble's cost model is exactly as
//     right as every other policy's view of the engines; a fit for another
//     GPU would handicap it for reasons that have nothing to do with routing.
//   - Preble's load L is a 3-minute sliding-window histogram of the prefix
//     tree nodes each GPU serves (count × miss rate × prefill time, shared
//     among the GPUs holding the node). Our gateway keeps no such history; the
//     prefill work still queued at the replica is its stand-in. Pricing that
//     queue as one prompt of PendingPrefillTokens overstates its attention
//     term (quadratic in u), which only matters under long queues.
//   - Preble's decode term is active requests × expected output length ×
//     time per output token. Requests carry no output length here, so we
//     charge the marginal step cost of each in-flight sequence instead.
//   - The eviction cost M (off by default in Preble's code), its
//     post-assignment rebalancing and autoscaling of hot prefixes, and
//     AIBrix's port's load-imbalance restriction (the same > 8 rule as its
//     prefix-cache router) are not modelled.
//   - Matches come from the shared KV index's prediction, not Preble's own
//     global radix tree of routed prompts.
type Preble struct {
	// ExploitThreshold is the match ratio above which Preble exploits the
	// cache (default 0.5).
	ExploitThreshold float64

	blockSize int
	profile   engine.Profile
	ex        *Explanation // set on the copy Explain picks with
}

// NewPreble returns Preble's E2 scheduler priced with o.Profile.
func NewPreble(o Options) *Preble {
	o = o.withDefaults()
	return &Preble{ExploitThreshold: 0.5, blockSize: o.BlockSize, profile: o.Profile}
}

func (*Preble) Name() string { return "preble" }

// prebleCost is the explore-regime cost of one candidate and its parts.
type prebleCost struct {
	queued, miss, decode, cost time.Duration
}

// cost is the explore-regime cost of sending a prompt of prompt tokens to
// c; with out set it also stores the cost's parts there.
func (p *Preble) costTerms(prompt int, c *Candidate, out *prebleCost) time.Duration {
	cached := min(max(0, c.PredictedCachedTokens), prompt)
	queued := p.profile.PrefillTime(max(0, c.Load.PendingPrefillTokens), 0)
	miss := p.profile.PrefillTime(prompt-cached, cached)
	decode := time.Duration(math.Round(float64(max(0, c.Load.InFlight)) * p.profile.DecodeSeqUs * 1e3))
	if out != nil {
		*out = prebleCost{queued: queued, miss: miss, decode: decode, cost: queued + miss + decode}
	}
	return queued + miss + decode
}

// cost is the explore-regime cost of sending a prompt of prompt tokens to c.
func (p *Preble) cost(prompt int, c *Candidate) time.Duration { return p.costTerms(prompt, c, nil) }

func (p *Preble) Pick(req *Request, cands []Candidate) int {
	prompt := peerPromptTokens(req)
	longest, bestM, bestT := 0, 0, 0
	for i := range cands {
		m, t := peerBlocks(prompt, cands[i].PredictedCachedTokens, p.blockSize)
		bestT = t
		if m > bestM || m == bestM && cands[i].Load.InFlight < cands[longest].Load.InFlight {
			longest, bestM = i, m
		}
	}
	if p.ex != nil {
		p.ex.term("best_match_ratio", peerMatchRatio(bestM, bestT))
	}
	if peerMatchRatio(bestM, bestT) > p.ExploitThreshold {
		if p.ex != nil {
			p.ex.term("exploit", 1)
		}
		return longest
	}

	var x prebleCost
	var out *prebleCost
	if p.ex != nil {
		p.ex.term("exploit", 0)
		out = &x
	}
	best := 0
	bestCost := p.costTerms(prompt, &cands[0], out)
	if p.ex != nil {
		p.explainCost(0, x)
	}
	for i := 1; i < len(cands); i++ {
		c := p.costTerms(prompt, &cands[i], out)
		if p.ex != nil {
			p.explainCost(i, x)
		}
		if c < bestCost {
			best, bestCost = i, c
		}
	}
	return best
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (p *Preble) explainCost(i int, x prebleCost) {
	ex := p.ex
	ex.cterm(i, "queued_ms", ms(x.queued))
	ex.cterm(i, "miss_ms", ms(x.miss))
	ex.cterm(i, "decode_ms", ms(x.decode))
	ex.cterm(i, "cost_ms", ms(x.cost))
	ex.Candidates[i].Score = Num(ms(x.cost))
}

// Explain reports the regime (exploit when the best match ratio is above
// the threshold) and, exploring, each candidate's cost =
// queued_ms + miss_ms + decode_ms (Score, the lowest wins, ties to the
// lower index); exploiting, Score is each candidate's matched blocks (the
// most win, ties to fewer in flight). The winner is what Pick returns on a
// copy of the policy.
func (p *Preble) Explain(req *Request, cands []Candidate) Explanation {
	ex := newExplanation(p.Name(), "", cands)
	cp := *p
	cp.ex = &ex
	pick := cp.Pick(req, cands)
	ex.Winner = pick
	e, _ := ex.Term("exploit")
	exploit := e == 1
	ratio, _ := ex.Term("best_match_ratio")
	ex.term("exploit_threshold", p.ExploitThreshold)
	prompt := peerPromptTokens(req)
	for i := range cands {
		m, t := peerBlocks(prompt, cands[i].PredictedCachedTokens, p.blockSize)
		ex.cterm(i, "matched_blocks", float64(m))
		ex.cterm(i, "prompt_blocks", float64(t))
		ex.cterm(i, "in_flight", float64(cands[i].Load.InFlight))
		if exploit {
			ex.Candidates[i].Score = Num(m)
		}
	}
	if exploit {
		ex.Objective = "max matched_blocks (exploit), then min in_flight"
		ex.Why = fmt.Sprintf("exploit: the best match ratio %s is above %g: the least loaded of the longest matches, %s",
			fmtNum(ratio, ""), p.ExploitThreshold, ex.label(pick))
	} else {
		ex.Objective = "min cost_ms (explore)"
		ex.Why = "explore: the best match ratio " + fmtNum(ratio, "") + " is not above " + fmt.Sprint(p.ExploitThreshold) + ": " + ex.compared("cost", "ms", true, 1)
	}
	return ex
}
