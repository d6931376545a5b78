package router

import "fmt"

var (
	_ Policy    = (*SGLang)(nil)
	_ Explainer = (*SGLang)(nil)
)

// SGLang is the cache_aware policy of SGLang's router (sgl-project/sglang,
// sgl-router/src/policies/cache_aware.rs; lightseekorg/smg keeps it in
// model_gateway/src/policies/cache_aware.rs), with the Python CLI defaults
// (bindings/python/src/smg/router_args.py): cache_threshold 0.3,
// balance_abs_threshold 64, balance_rel_threshold 1.5. With load = the
// gateway's in-flight count (Load.InFlight):
//
//   - Imbalanced iff (max − min > 64) AND (max > 1.5·min): route to the
//     least-loaded candidate (ties: lower index).
//   - Otherwise take the best-matching candidate (most PredictedCachedTokens;
//     ties: lower load, then lower index) and its match_rate =
//     PredictedCachedTokens/PromptTokens. If match_rate > 0.3 route to it;
//     else route to the candidate with the smallest tree (IndexedBlocks;
//     ties: lower load, then lower index), SGLang's get_smallest_tenant.
//
// Departures:
//   - SGLang matches characters (HTTP) or tokens (gRPC) on a radix tree of
//     its own that it fills with every routed prompt (an approximate index
//     that never sees evictions, pruned by a timer to max_tree_size). We use
//     the shared KV index's prediction and its per-replica block count, so
//     both the match and the tree size reflect what the engines report.
//   - The Rust struct defaults differ (0.5, 32, 1.1); we use the CLI's, which
//     is what a deployment started from the command line gets.
//   - SMG's optional KV-usage imbalance triggers (off by default) and its
//     min-load fallback below the threshold are not modelled; this is SG's
//     smallest-tree fallback. Its tie-breaks by processed count are replaced
//     by the candidate index.
type SGLang struct {
	// CacheThreshold is the match rate above which the best match wins (0.3).
	CacheThreshold float64
	// BalanceAbsThreshold and BalanceRelThreshold define imbalance (64, 1.5).
	BalanceAbsThreshold int
	BalanceRelThreshold float64

	ex *Explanation // set on the copy Explain picks with
}

// NewSGLang returns SGLang's cache_aware policy with the CLI defaults.
func NewSGLang(Options) *SGLang {
	return &SGLang{CacheThreshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5}
}

func (*SGLang) Name() string { return "sglang" }

// The regimes of SGLang's rule, as Explain reports them (term regime).
const (
	sglangImbalanced = iota // route to the least loaded
	sglangCacheHit          // route to the best match
	sglangSmallest          // route to the smallest tree
)

func (p *SGLang) Pick(req *Request, cands []Candidate) int {
	ex := p.ex
	minI, maxLoad := 0, cands[0].Load.InFlight
	for i := 1; i < len(cands); i++ {
		l := cands[i].Load.InFlight
		if l < cands[minI].Load.InFlight {
			minI = i
		}
		maxLoad = max(maxLoad, l)
	}
	minLoad := cands[minI].Load.InFlight
	if ex != nil {
		ex.term("min_load", float64(minLoad))
		ex.term("max_load", float64(maxLoad))
	}
	if maxLoad-minLoad > p.BalanceAbsThreshold && float64(maxLoad) > p.BalanceRelThreshold*float64(minLoad) {
		if ex != nil {
			ex.term("regime", sglangImbalanced)
		}
		return minI
	}

	best := 0
	for i := 1; i < len(cands); i++ {
		c, b := &cands[i], &cands[best]
		if c.PredictedCachedTokens > b.PredictedCachedTokens ||
			c.PredictedCachedTokens == b.PredictedCachedTokens && c.Load.InFlight < b.Load.InFlight {
			best = i
		}
	}
	if ex != nil {
		ex.term("best_match", float64(best))
	}
	if prompt := peerPromptTokens(req); prompt > 0 {
		rate := float64(min(max(0, cands[best].PredictedCachedTokens), prompt)) / float64(prompt)
		if ex != nil {
			ex.term("best_match_rate", rate)
		}
		if rate > p.CacheThreshold {
			if ex != nil {
				ex.term("regime", sglangCacheHit)
			}
			return best
		}
	} else if ex != nil {
		ex.term("best_match_rate", 0)
	}

	smallest := 0
	for i := 1; i < len(cands); i++ {
		c, s := &cands[i], &cands[smallest]
		if c.IndexedBlocks < s.IndexedBlocks ||
			c.IndexedBlocks == s.IndexedBlocks && c.Load.InFlight < s.Load.InFlight {
			smallest = i
		}
	}
	if ex != nil {
		ex.term("regime", sglangSmallest)
	}
	return smallest
}

// Explain reports the regime the rule took (0 imbalanced: least loaded;
// 1 cache hit: best match; 2 smallest tree) and what it compared: the
// loads, each candidate's match rate, the trees' sizes. Score is the
// number the regime compared: in_flight (min), predicted cached tokens
// (max, ties to fewer in flight) or indexed blocks (min, ties to fewer in
// flight). The winner is what Pick returns on a copy of the policy.
func (p *SGLang) Explain(req *Request, cands []Candidate) Explanation {
	ex := newExplanation(p.Name(), "", cands)
	cp := *p
	cp.ex = &ex
	ex.Winner = cp.Pick(req, cands)
	ex.term("balance_abs_threshold", float64(p.BalanceAbsThreshold))
	ex.term("balance_rel_threshold", p.BalanceRelThreshold)
	ex.term("cache_threshold", p.CacheThreshold)
	r, _ := ex.Term("regime")
	regime := int(r)
	ex.Objective = [...]string{"min in_flight (imbalanced)", "max predicted_cached_tokens (cache hit)", "min indexed_blocks (smallest tree)"}[regime]
	prompt := peerPromptTokens(req)
	for i := range cands {
		c := &cands[i]
		rate := 0.0
		if prompt > 0 {
			rate = float64(min(max(0, c.PredictedCachedTokens), prompt)) / float64(prompt)
		}
		ex.cterm(i, "load", float64(c.Load.InFlight))
		ex.cterm(i, "match_rate", rate)
		ex.cterm(i, "tree_blocks", float64(c.IndexedBlocks))
		switch regime {
		case sglangImbalanced:
			ex.Candidates[i].Score = Num(c.Load.InFlight)
		case sglangCacheHit:
			ex.Candidates[i].Score = Num(c.PredictedCachedTokens)
		default:
			ex.Candidates[i].Score = Num(c.IndexedBlocks)
		}
	}
	minL, _ := ex.Term("min_load")
	maxL, _ := ex.Term("max_load")
	rate, _ := ex.Term("best_match_rate")
	switch regime {
	case sglangImbalanced:
		ex.Why = fmt.Sprintf("the pool is imbalanced (loads %g to %g: spread over %d and max over %g x min): the least loaded, %s",
			minL, maxL, p.BalanceAbsThreshold, p.BalanceRelThreshold, ex.label(ex.Winner))
	case sglangCacheHit:
		ex.Why = fmt.Sprintf("balanced; the best match %s holds %s of the prompt, above the cache threshold %g",
			ex.label(ex.Winner), fmtNum(rate, ""), p.CacheThreshold)
	default:
		ex.Why = fmt.Sprintf("balanced; the best match holds %s of the prompt, not above the cache threshold %g: the smallest tree, %s (%d blocks)",
			fmtNum(rate, ""), p.CacheThreshold, ex.label(ex.Winner), cands[ex.Winner].IndexedBlocks)
	}
	return ex
}
