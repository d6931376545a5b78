package router

var (
	_ Policy    = (*LLMD)(nil)
	_ Explainer = (*LLMD)(nil)
)

// LLMD is llm-d's default scheduling profile (llm-d/llm-d-router, formerly
// llm-d-inference-scheduler): three weighted scorers summed, then the
// max-score picker.
//
//	S(e) = 3·prefix(e) + 2·queue(e) + 2·kvutil(e)
//	prefix(e) = m/T                      (prefix-cache-scorer, matchLengthWeight α = 0)
//	queue(e)  = (qmax − q)/(qmax − qmin)  over the candidates, 1 if all q are equal
//	kvutil(e) = 1 − KV usage
//
// The pick is the argmax of S; ties are broken uniformly at random (seeded).
//
// Sources (llm-d/llm-d-router @520af47): the weights queue 2, kv-cache-
// utilization 2, prefix-cache 3 are the ones loadDefaultConfig uses when no
// config is given (pkg/epp/config/loader/defaults.go) and the Helm chart's
// default-plugins.yaml (config/charts/epplib/templates/_config.yaml); no picker
// is configured there, so the system default max-score-picker is injected.
// Score sum: pkg/epp/scheduling/scheduler_profile.go (S = Σ wᵢ·clamp(sᵢ, 0, 1)).
// Under pkg/epp/framework/plugins/: the scorers scheduling/scorer/prefix/plugin.go
// (m/T), scheduling/scorer/queuedepth/queue.go (q = WaitingQueueSize) and
// scheduling/scorer/kvcacheutilization/kvcache_utilization.go, and the picker
// scheduling/picker/maxscore/picker.go (shuffle, then stable sort by score). The precise-prefix sample configs use 2/1/1 instead
// (deploy/config/epp-precise-prefix-cache-config.yaml), which is the
// "precise-prefix-cache:2,queue-depth:1,kv-utilization:1" BLIS reports; set
// the weight fields to reproduce it.
//
// Departures:
//   - m is our shared KV index's prediction (PredictedCachedTokens/BlockSize)
//     and T = ceil(PromptTokens/BlockSize). llm-d's default prefix scorer
//     keeps its own approximate LRU of routed prompts, hashed in blocks of
//     max(64, engine block size); the precise producer reads KV events, which
//     is closer to what our index does.
//   - q is Engine.Waiting and the KV usage Engine.KVCacheUsage, as scraped,
//     which is what llm-d reads. Before a replica's first scrape
//     (Engine.Valid false) llm-d would score its zero-valued metrics (our
//     reading, not checked against a live EPP); we fall back to the
//     gateway's exact counters instead: q = Load.Pending (dispatched, first
//     token not seen: the engine's waiting queue plus the prefills in
//     progress) and KV usage = ceil(Load.InFlightPromptTokens/BlockSize) /
//     KVCapacityBlocks (0 when the capacity is unknown), clamped to [0, 1].
//   - The tie-break draws from the policy's seeded source, not a global one.
type LLMD struct {
	// PrefixWeight, QueueWeight and KVUtilizationWeight weight the three
	// scorers (defaults 3, 2, 2).
	PrefixWeight        float64
	QueueWeight         float64
	KVUtilizationWeight float64

	blockSize int
	rng       policyRNG
	ex        *Explanation // set on the copy Explain picks with
}

// NewLLMD returns llm-d's default profile with its default weights.
func NewLLMD(o Options) *LLMD {
	o = o.withDefaults()
	return &LLMD{
		PrefixWeight:        3,
		QueueWeight:         2,
		KVUtilizationWeight: 2,
		blockSize:           o.BlockSize,
		rng:                 subRNG(o.Seed, "llmd"),
	}
}

func (*LLMD) Name() string { return "llmd" }

// llmdQueue is the queue depth the queue scorer reads.
func llmdQueue(c *Candidate) int {
	if c.Load.Engine.Valid {
		return c.Load.Engine.Waiting
	}
	return c.Load.Pending
}

// kvUsage is the KV cache usage fraction the kv-cache-utilization scorer reads.
func (p *LLMD) kvUsage(c *Candidate) float64 {
	if c.Load.Engine.Valid {
		return peerClamp01(c.Load.Engine.KVCacheUsage)
	}
	if c.KVCapacityBlocks <= 0 {
		return 0
	}
	return peerClamp01(float64(peerCeilDiv(c.Load.InFlightPromptTokens, p.blockSize)) / float64(c.KVCapacityBlocks))
}

// scoreTerms is S(c) given the queue range over the candidates; with ex
// set it also records S's parts as candidate i's terms.
func (p *LLMD) scoreTerms(prompt int, c *Candidate, qmin, qmax int, ex *Explanation, i int) float64 {
	m, t := peerBlocks(prompt, c.PredictedCachedTokens, p.blockSize)
	prefix := peerMatchRatio(m, t)
	if tb := peerTierBlocks(c, m, t, p.blockSize); tb > 0 && t > 0 {
		// The precise prefix scorer weights a CPU-tier block 0.8 of a GPU one.
		prefix += llmdCPUTierWeight * float64(tb) / float64(t)
	}
	queue := 1.0
	if qmax != qmin {
		queue = peerClamp01(float64(qmax-llmdQueue(c)) / float64(qmax-qmin))
	}
	kv := 1 - p.kvUsage(c)
	s := p.PrefixWeight*prefix + p.QueueWeight*queue + p.KVUtilizationWeight*kv
	if ex != nil {
		p.explainCandidate(ex, i, c, m, t, prefix, queue, kv, s)
	}
	return s
}

// score is S(c) given the queue range over the candidates.
func (p *LLMD) score(prompt int, c *Candidate, qmin, qmax int) float64 {
	return p.scoreTerms(prompt, c, qmin, qmax, nil, 0)
}

func (p *LLMD) Pick(req *Request, cands []Candidate) int {
	ex := p.ex
	prompt := peerPromptTokens(req)
	qmin, qmax := llmdQueue(&cands[0]), llmdQueue(&cands[0])
	for i := 1; i < len(cands); i++ {
		q := llmdQueue(&cands[i])
		qmin, qmax = min(qmin, q), max(qmax, q)
	}
	best, ties := 0, 1
	bestScore := p.scoreTerms(prompt, &cands[0], qmin, qmax, ex, 0)
	for i := 1; i < len(cands); i++ {
		switch s := p.scoreTerms(prompt, &cands[i], qmin, qmax, ex, i); {
		case s > bestScore:
			best, bestScore, ties = i, s, 1
		case s == bestScore:
			ties++
			if p.rng.IntN(ties) == 0 { // reservoir sampling over the ties
				best = i
			}
		}
	}
	if ex != nil {
		ex.term("prefix_weight", p.PrefixWeight)
		ex.term("queue_weight", p.QueueWeight)
		ex.term("kv_utilization_weight", p.KVUtilizationWeight)
		ex.term("queue_min", float64(qmin))
		ex.term("queue_max", float64(qmax))
		ex.term("ties", float64(ties))
	}
	return best
}

func (p *LLMD) explainCandidate(ex *Explanation, i int, c *Candidate, m, t int, prefix, queue, kv, s float64) {
	ex.cterm(i, "matched_blocks", float64(m))
	ex.cterm(i, "prompt_blocks", float64(t))
	ex.cterm(i, "queue_depth", float64(llmdQueue(c)))
	ex.cterm(i, "kv_usage", p.kvUsage(c))
	ex.cterm(i, "prefix", prefix)
	ex.cterm(i, "queue", queue)
	ex.cterm(i, "kv_utilization", kv)
	ex.Candidates[i].Score = Num(s)
}

// Explain reports each candidate's three scorers and
// S = prefix_weight*prefix + queue_weight*queue +
// kv_utilization_weight*kv_utilization. The winner is what Pick returns on
// a copy of the policy whose source is a copy of this one's.
func (p *LLMD) Explain(req *Request, cands []Candidate) Explanation {
	ex := newExplanation(p.Name(), "max score", cands)
	cp := *p
	cp.rng, cp.ex = p.rng.clone(), &ex
	ex.Winner = cp.Pick(req, cands)
	ties, _ := ex.Term("ties")
	ex.Why = ex.compared("weighted score (prefix, queue, kv-utilization)", "", false, int(ties))
	return ex
}
