package router

var (
	_ Policy    = (*Dynamo)(nil)
	_ Explainer = (*Dynamo)(nil)
)

// Dynamo is the cost function of Dynamo's KV router (ai-dynamo/dynamo,
// lib/kv-router/src/scheduling/selector/default.rs; defaults from
// docs/components/router/router-configuration.md), at temperature 0:
//
//	credit  = c·decay·m                               (device-tier overlap only)
//	decay   = 1 / (1 + d·((P − Pmin)/B)/T)             (1 when d = 0)
//	raw     = (P + PromptTokens)/B                     (active + incoming prompt blocks)
//	decode  = ActiveBlocks + T − m                      (active + incoming blocks;
//	          ceil(Load.InFlightPromptTokens/B) + T when ActiveBlocks is 0)
//	cost    = scale·max(0, raw − credit) + decode + w_req·Load.InFlight
//
// with P = Load.PendingPrefillTokens (the router-tracked active prefill
// tokens: uncached prompt tokens of requests still in prefill), Pmin its
// minimum over the candidates, B the block size, m matched blocks and
// T = ceil(PromptTokens/B). Defaults: c = 1 (overlap_score_credit),
// d = 0 (overlap_score_credit_decay), scale = 1 (prefill_load_scale),
// w_req = 0 (decode_active_request_weight). The pick is the argmin, ties
// broken uniformly at random (seeded), as Dynamo's minimum_cost_index does.
//
// Departures:
//   - raw follows Dynamo's host code, (active prefill tokens + isl)/B as a
//     fraction; peers.md's "active + incoming prompt blocks" would add T
//     instead. The incoming term is the same for every candidate, so the
//     choice is unchanged either way.
//   - Dynamo's active decode blocks are the distinct blocks of the worker's
//     active sequences (a prefix shared by several requests counts once), and
//     the incoming request adds only the blocks it does not share with them.
//     With the approximate index we have the same distinct count
//     (Candidate.ActiveBlocks, the blocks in-flight requests pin) and the
//     request adds T - m (the blocks it does not find cached there, a close
//     stand-in for "not shared with active sequences"). Without it (events
//     mode) we fall back to the sum of in-flight prompt tokens, where shared
//     prefixes count once per request and the request adds all T blocks.
//     Output blocks are not tracked (Dynamo tracks them only when enabled).
//   - There are no host, disk or shared-cache tiers in our fleet, so their
//     credits (0.75, 0.25, shared multiplier) are always zero.
//   - Temperature > 0 (softmax sampling), busy thresholds, queueing and
//     preferred-taint multipliers are not modelled.
//   - m is our shared KV index's prediction; Dynamo's comes from its own
//     event-driven radix tree. They agree when both see the same events.
type Dynamo struct {
	// OverlapCredit is c, the credit per matched device block (default 1).
	OverlapCredit float64
	// HostCacheHitWeight credits a block found in a lower KV tier
	// (Candidate.PredictedTierTokens) at this share of a device block
	// (Dynamo's --router-host-cache-hit-weight, 0.75).
	HostCacheHitWeight float64
	// CreditDecay is d, the overload decay of the credit (default 0: off).
	CreditDecay float64
	// PrefillLoadScale weighs the prefill term against decode blocks (default 1).
	PrefillLoadScale float64
	// ActiveRequestWeight charges blocks per active request (default 0).
	ActiveRequestWeight float64

	blockSize int
	rng       policyRNG
	ex        *Explanation // set on the copy Explain picks with
}

// NewDynamo returns Dynamo's KV router cost function with its defaults.
func NewDynamo(o Options) *Dynamo {
	o = o.withDefaults()
	return &Dynamo{
		OverlapCredit:      1,
		HostCacheHitWeight: 0.75,
		PrefillLoadScale:   1,
		blockSize:          o.BlockSize,
		rng:                subRNG(o.Seed, "dynamo"),
	}
}

func (*Dynamo) Name() string { return "dynamo" }

// dynamoTerms are the parts of one candidate's cost.
type dynamoTerms struct {
	m, t, pending      int
	decay, credit, raw float64
	decode, prefill    float64 // decode blocks; max(0, raw - credit)
	requests, cost     float64
}

// cost is Dynamo's cost for c, minPending being Pmin over the
// candidates; with out set it also stores the cost's parts there.
func (p *Dynamo) costTerms(prompt int, c *Candidate, minPending int, out *dynamoTerms) float64 {
	bs := float64(p.blockSize)
	m, t := peerBlocks(prompt, c.PredictedCachedTokens, p.blockSize)
	pending := max(0, c.Load.PendingPrefillTokens)
	decay := 1.0
	if p.CreditDecay > 0 && t > 0 {
		excess := float64(max(0, pending-minPending)) / bs
		decay = 1 / (1 + p.CreditDecay*excess/float64(t))
	}
	credit := p.OverlapCredit * decay * (float64(m) + p.HostCacheHitWeight*float64(peerTierBlocks(c, m, t, p.blockSize)))
	raw := float64(pending+prompt) / bs
	var decode float64
	if c.ActiveBlocks > 0 {
		// Distinct active blocks, and the request adds the ones it does not
		// find (cached blocks it shares count once, as in Dynamo).
		decode = float64(c.ActiveBlocks + t - m)
	} else {
		decode = float64(peerCeilDiv(c.Load.InFlightPromptTokens, p.blockSize) + t)
	}
	prefill := max(0, raw-credit)
	requests := float64(max(0, c.Load.InFlight))
	cost := p.PrefillLoadScale*prefill + decode + p.ActiveRequestWeight*requests
	if out != nil {
		*out = dynamoTerms{m: m, t: t, pending: pending, decay: decay, credit: credit, raw: raw, decode: decode, prefill: prefill, requests: requests, cost: cost}
	}
	return cost
}

// cost is Dynamo's cost for c, minPending being Pmin over the candidates.
func (p *Dynamo) cost(prompt int, c *Candidate, minPending int) float64 {
	return p.costTerms(prompt, c, minPending, nil)
}

func (p *Dynamo) Pick(req *Request, cands []Candidate) int {
	prompt := peerPromptTokens(req)
	minPending := max(0, cands[0].Load.PendingPrefillTokens)
	for i := 1; i < len(cands); i++ {
		minPending = min(minPending, max(0, cands[i].Load.PendingPrefillTokens))
	}
	var x dynamoTerms
	var out *dynamoTerms
	if p.ex != nil {
		out = &x
	}
	best, ties := 0, 1
	bestCost := p.costTerms(prompt, &cands[0], minPending, out)
	if p.ex != nil {
		p.explainCandidate(0, x)
	}
	for i := 1; i < len(cands); i++ {
		c := p.costTerms(prompt, &cands[i], minPending, out)
		if p.ex != nil {
			p.explainCandidate(i, x)
		}
		switch {
		case c < bestCost:
			best, bestCost, ties = i, c, 1
		case c == bestCost:
			ties++
			if p.rng.IntN(ties) == 0 { // reservoir sampling over the ties
				best = i
			}
		}
	}
	if p.ex != nil {
		p.ex.term("overlap_credit", p.OverlapCredit)
		p.ex.term("credit_decay", p.CreditDecay)
		p.ex.term("prefill_load_scale", p.PrefillLoadScale)
		p.ex.term("active_request_weight", p.ActiveRequestWeight)
		p.ex.term("min_pending_prefill_tokens", float64(minPending))
		p.ex.term("ties", float64(ties))
	}
	return best
}

func (p *Dynamo) explainCandidate(i int, x dynamoTerms) {
	ex := p.ex
	ex.cterm(i, "matched_blocks", float64(x.m))
	ex.cterm(i, "prompt_blocks", float64(x.t))
	ex.cterm(i, "pending_prefill_tokens", float64(x.pending))
	ex.cterm(i, "decay", x.decay)
	ex.cterm(i, "credit", x.credit)
	ex.cterm(i, "raw_prefill_blocks", x.raw)
	ex.cterm(i, "prefill_blocks", x.prefill)
	ex.cterm(i, "decode_blocks", x.decode)
	ex.cterm(i, "active_requests", x.requests)
	ex.Candidates[i].Score = Num(x.cost)
}

// Explain reports each candidate's cost terms, cost =
// prefill_load_scale*prefill_blocks + decode_blocks +
// active_request_weight*active_requests with prefill_blocks =
// max(0, raw_prefill_blocks - credit). The winner is what Pick returns on
// a copy of the policy whose source is a copy of this one's.
func (p *Dynamo) Explain(req *Request, cands []Candidate) Explanation {
	ex := newExplanation(p.Name(), "min cost", cands)
	cp := *p
	cp.rng, cp.ex = p.rng.clone(), &ex
	ex.Winner = cp.Pick(req, cands)
	ties, _ := ex.Term("ties")
	ex.Why = ex.compared("cost (prefill + decode blocks)", "blocks", true, int(ties))
	return ex
}
