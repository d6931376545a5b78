package router

var _ Policy = (*SGLang)(nil)

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
}

// NewSGLang returns SGLang's cache_aware policy with the CLI defaults.
func NewSGLang(Options) *SGLang {
	return &SGLang{CacheThreshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5}
}

func (*SGLang) Name() string { return "sglang" }

func (p *SGLang) Pick(req *Request, cands []Candidate) int {
	minI, maxLoad := 0, cands[0].Load.InFlight
	for i := 1; i < len(cands); i++ {
		l := cands[i].Load.InFlight
		if l < cands[minI].Load.InFlight {
			minI = i
		}
		maxLoad = max(maxLoad, l)
	}
	minLoad := cands[minI].Load.InFlight
	if maxLoad-minLoad > p.BalanceAbsThreshold && float64(maxLoad) > p.BalanceRelThreshold*float64(minLoad) {
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
	if prompt := peerPromptTokens(req); prompt > 0 {
		rate := float64(min(max(0, cands[best].PredictedCachedTokens), prompt)) / float64(prompt)
		if rate > p.CacheThreshold {
			return best
		}
	}

	smallest := 0
	for i := 1; i < len(cands); i++ {
		c, s := &cands[i], &cands[smallest]
		if c.IndexedBlocks < s.IndexedBlocks ||
			c.IndexedBlocks == s.IndexedBlocks && c.Load.InFlight < s.Load.InFlight {
			smallest = i
		}
	}
	return smallest
}
