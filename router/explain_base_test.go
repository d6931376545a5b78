package router

// This file keeps, for tests only, every policy's Pick as it was before the
// explain refactor (commit 5fdff20), drawing from seed.Rand directly: the
// refactored policies must pick what these pick, bit for bit and draw for
// draw (TestPickUnchangedByExplainRefactor), and BenchmarkPickBeforeAfter
// times both in one process, so the comparison does not depend on what
// else the machine runs.

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/seed"
)

type (
	oldRoundRobin   struct{ next uint64 }
	oldRandom       struct{ rng *rand.Rand }
	oldLeastRequest struct{ rng *rand.Rand }
	oldP2C          struct{ rng *rand.Rand }
	oldPrefixHash   struct{ *PrefixHash }
	oldKVAware      struct {
		*KVAware
		rng *rand.Rand
	}
	oldCostModel struct {
		*CostModel
		rng      *rand.Rand
		sessions map[uint64]int
		est      []float64
	}
	oldLLMD struct {
		*LLMD
		rng *rand.Rand
	}
	oldDynamo struct {
		*Dynamo
		rng *rand.Rand
	}
	oldSGLang struct{ *SGLang }
	oldAIBrix struct {
		*AIBrix
		rng *rand.Rand
	}
	oldPreble struct{ *Preble }
)

// oldPicker is a pre-refactor policy.
type oldPicker interface {
	Pick(req *Request, cands []Candidate) int
}

// oldPolicy builds the pre-refactor version of the registered policy name
// with o, seeded as the registry seeded it.
func oldPolicy(name string, o Options) oldPicker {
	o = o.withDefaults()
	rng := func(n string) *rand.Rand { return seed.Rand(o.Seed, "router/"+n) }
	switch name {
	case "round_robin":
		return &oldRoundRobin{}
	case "random":
		return &oldRandom{rng("random")}
	case "least_request":
		return &oldLeastRequest{rng("least_request")}
	case "p2c":
		return &oldP2C{rng("p2c")}
	case "prefix_hash":
		return &oldPrefixHash{NewPrefixHash(o)}
	case "kv_aware":
		return &oldKVAware{NewKVAware(o), rng("kv_aware")}
	case "cost_model":
		p := &oldCostModel{CostModel: NewCostModel(o), rng: rng("cost_model")}
		if o.SessionAffinity {
			p.sessions = make(map[uint64]int)
		}
		return p
	case "llmd":
		return &oldLLMD{NewLLMD(o), rng("llmd")}
	case "dynamo":
		return &oldDynamo{NewDynamo(o), rng("dynamo")}
	case "sglang":
		return &oldSGLang{NewSGLang(o)}
	case "aibrix":
		p := NewAIBrix(o)
		p.UseGatewayCount = true
		return &oldAIBrix{p, rng("aibrix")}
	case "preble":
		return &oldPreble{NewPreble(o)}
	}
	return nil
}

func (p *oldRoundRobin) Pick(_ *Request, cands []Candidate) int {
	i := int(p.next % uint64(len(cands)))
	p.next++
	return i
}

func (p *oldRandom) Pick(_ *Request, cands []Candidate) int { return p.rng.IntN(len(cands)) }

func (p *oldLeastRequest) Pick(_ *Request, cands []Candidate) int {
	best, ties := 0, 1
	for i := 1; i < len(cands); i++ {
		switch d := cands[i].Load.InFlight - cands[best].Load.InFlight; {
		case d < 0:
			best, ties = i, 1
		case d == 0:
			ties++
			if p.rng.IntN(ties) == 0 { // reservoir sampling over the ties
				best = i
			}
		}
	}
	return best
}

func (p *oldP2C) Pick(_ *Request, cands []Candidate) int {
	n := len(cands)
	if n == 1 {
		return 0
	}
	a := p.rng.IntN(n)
	b := p.rng.IntN(n - 1)
	if b >= a {
		b++
	}
	if cands[b].Load.InFlight < cands[a].Load.InFlight {
		return b
	}
	return a
}

func (p *oldPrefixHash) Pick(req *Request, cands []Candidate) int {
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

func (p *oldKVAware) Pick(req *Request, cands []Candidate) int {
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

func (p *oldCostModel) oldEstimateTTFT(prompt int, c *Candidate) float64 {
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

func (p *oldCostModel) Pick(req *Request, cands []Candidate) int {
	bound := max(LoadBound(p.Bound, cands), p.BoundFloor)
	minIndexed := math.MaxInt
	for i := range cands {
		minIndexed = min(minIndexed, cands[i].IndexedBlocks)
	}
	p.est = p.est[:0]
	best, ties := -1, 0
	for i := range cands {
		c := &cands[i]
		e := p.oldEstimateTTFT(req.PromptTokens, c)
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

func (p *oldLLMD) oldScore(prompt int, c *Candidate, qmin, qmax int) float64 {
	m, t := peerBlocks(prompt, c.PredictedCachedTokens, p.blockSize)
	prefix := peerMatchRatio(m, t)
	queue := 1.0
	if qmax != qmin {
		queue = peerClamp01(float64(qmax-llmdQueue(c)) / float64(qmax-qmin))
	}
	kv := 1 - p.kvUsage(c)
	return p.PrefixWeight*prefix + p.QueueWeight*queue + p.KVUtilizationWeight*kv
}

func (p *oldLLMD) Pick(req *Request, cands []Candidate) int {
	prompt := peerPromptTokens(req)
	qmin, qmax := llmdQueue(&cands[0]), llmdQueue(&cands[0])
	for i := 1; i < len(cands); i++ {
		q := llmdQueue(&cands[i])
		qmin, qmax = min(qmin, q), max(qmax, q)
	}
	best, ties := 0, 1
	bestScore := p.oldScore(prompt, &cands[0], qmin, qmax)
	for i := 1; i < len(cands); i++ {
		switch s := p.oldScore(prompt, &cands[i], qmin, qmax); {
		case s > bestScore:
			best, bestScore, ties = i, s, 1
		case s == bestScore:
			ties++
			if p.rng.IntN(ties) == 0 { // reservoir sampling over the ties
				best = i
			}
		}
	}
	return best
}

func (p *oldDynamo) oldCost(prompt int, c *Candidate, minPending int) float64 {
	bs := float64(p.blockSize)
	m, t := peerBlocks(prompt, c.PredictedCachedTokens, p.blockSize)
	pending := max(0, c.Load.PendingPrefillTokens)
	decay := 1.0
	if p.CreditDecay > 0 && t > 0 {
		excess := float64(max(0, pending-minPending)) / bs
		decay = 1 / (1 + p.CreditDecay*excess/float64(t))
	}
	credit := p.OverlapCredit * decay * float64(m)
	raw := float64(pending+prompt) / bs
	var decode float64
	if c.ActiveBlocks > 0 {
		// Distinct active blocks, and the request adds the ones it does not
		// find (cached blocks it shares count once, as in Dynamo).
		decode = float64(c.ActiveBlocks + t - m)
	} else {
		decode = float64(peerCeilDiv(c.Load.InFlightPromptTokens, p.blockSize) + t)
	}
	return p.PrefillLoadScale*max(0, raw-credit) + decode + p.ActiveRequestWeight*float64(max(0, c.Load.InFlight))
}

func (p *oldDynamo) Pick(req *Request, cands []Candidate) int {
	prompt := peerPromptTokens(req)
	minPending := max(0, cands[0].Load.PendingPrefillTokens)
	for i := 1; i < len(cands); i++ {
		minPending = min(minPending, max(0, cands[i].Load.PendingPrefillTokens))
	}
	best, ties := 0, 1
	bestCost := p.oldCost(prompt, &cands[0], minPending)
	for i := 1; i < len(cands); i++ {
		switch c := p.oldCost(prompt, &cands[i], minPending); {
		case c < bestCost:
			best, bestCost, ties = i, c, 1
		case c == bestCost:
			ties++
			if p.rng.IntN(ties) == 0 { // reservoir sampling over the ties
				best = i
			}
		}
	}
	return best
}

func (p *oldSGLang) Pick(req *Request, cands []Candidate) int {
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

func (p *oldAIBrix) Pick(req *Request, cands []Candidate) int {
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

func (p *oldPreble) oldCost(prompt int, c *Candidate) time.Duration {
	cached := min(max(0, c.PredictedCachedTokens), prompt)
	queued := p.profile.PrefillTime(max(0, c.Load.PendingPrefillTokens), 0)
	miss := p.profile.PrefillTime(prompt-cached, cached)
	decode := time.Duration(math.Round(float64(max(0, c.Load.InFlight)) * p.profile.DecodeSeqUs * 1e3))
	return queued + miss + decode
}

func (p *oldPreble) Pick(req *Request, cands []Candidate) int {
	prompt := peerPromptTokens(req)
	longest, bestM, bestT := 0, 0, 0
	for i := range cands {
		m, t := peerBlocks(prompt, cands[i].PredictedCachedTokens, p.blockSize)
		bestT = t
		if m > bestM || m == bestM && cands[i].Load.InFlight < cands[longest].Load.InFlight {
			longest, bestM = i, m
		}
	}
	if peerMatchRatio(bestM, bestT) > p.ExploitThreshold {
		return longest
	}

	best := 0
	bestCost := p.oldCost(prompt, &cands[0])
	for i := 1; i < len(cands); i++ {
		if c := p.oldCost(prompt, &cands[i]); c < bestCost {
			best, bestCost = i, c
		}
	}
	return best
}
