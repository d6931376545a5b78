package router

// Helpers shared by the peer policies (peer_*.go): the re-implementations of
// the scoring rules of llm-d, Dynamo, SGLang, AIBrix and Preble that the
// simulator runs side by side with our own policies. The formulas and their
// sources are summarised in /work/shared/reference/peers.md, section 2.

// peerPromptTokens returns the request's prompt length, 0 for a nil request
// or a negative count.
func peerPromptTokens(req *Request) int {
	if req == nil || req.PromptTokens < 0 {
		return 0
	}
	return req.PromptTokens
}

// peerCeilDiv returns ceil(a/b) for a >= 0, b > 0.
func peerCeilDiv(a, b int) int {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// peerBlocks returns the prompt's total blocks T = ceil(prompt/bs) and the
// candidate's matched blocks m = cached/bs (whole blocks), with m clamped to
// [0, T] so that a bad prediction cannot give a ratio above 1.
func peerBlocks(prompt, cached, bs int) (m, t int) {
	t = peerCeilDiv(prompt, bs)
	if cached > 0 {
		m = min(cached/bs, t)
	}
	return m, t
}

// peerMatchRatio returns m/T, 0 when the prompt has no blocks.
func peerMatchRatio(m, t int) float64 {
	if t <= 0 {
		return 0
	}
	return float64(m) / float64(t)
}

// peerClamp01 clamps x to [0, 1]; NaN counts as 0.
func peerClamp01(x float64) float64 {
	if !(x > 0) {
		return 0
	}
	if x > 1 {
		return 1
	}
	return x
}

// peerTierBlocks is the candidate's blocks in its lower KV tiers right
// after its m matched GPU blocks, at most t-m.
func peerTierBlocks(c *Candidate, m, t, bs int) int {
	if c.PredictedTierTokens <= 0 {
		return 0
	}
	return min(c.PredictedTierTokens/bs, max(0, t-m))
}

// llmdCPUTierWeight is llm-d's precise prefix scorer's weight of a CPU-tier
// block against a GPU one.
const llmdCPUTierWeight = 0.8
