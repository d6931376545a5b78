package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Explainer is a policy that can say why it picks what it picks. Every
// registered policy implements it (TestEveryPolicyExplains). Explain runs the
// same scoring code as Pick over the same request and candidates, so the
// winner it reports is the candidate Pick would return now, and the terms
// it reports are the numbers Pick compared. It has no side effects: a policy
// with state that Pick advances (round robin's cursor, the random draws of
// random, p2c and every tie-break, cost_model's session memory) explains
// from a copy of that state (the random source's PCG is copied and drawn
// from; the cursor and the session memory are read, never written), so the
// picks that follow are those that would have followed without it.
type Explainer interface {
	Explain(req *Request, cands []Candidate) Explanation
}

// Explanation is a policy's reasoning for one request over one candidate set.
type Explanation struct {
	// Policy is the policy's name.
	Policy string `json:"policy"`
	// Objective says how the policy compares the candidates' Score:
	// "min <what>" or "max <what>", or "rule" when it follows a rule
	// (round robin's cursor, SGLang's regimes) and Score may be null.
	Objective string `json:"objective"`
	// Terms are the policy-wide numbers of the decision: weights, bounds,
	// the cursor, the random draws, the regime.
	Terms []Term `json:"terms"`
	// Candidates are the candidates in the order the policy saw them.
	Candidates []CandidateExplanation `json:"candidates"`
	// Winner is the index into Candidates of the pick.
	Winner int `json:"winner"`
	// Why says in a sentence why the winner won.
	Why string `json:"why"`
}

// Term is one named number of a decision. Counts are whole numbers; times
// end in _ms; shares and rates are in [0, 1].
type Term struct {
	Name  string `json:"name"`
	Value Num    `json:"value"`
}

// CandidateExplanation is one candidate as the policy saw it (its load
// snapshot with its age, its predicted cached tokens) and scored it.
type CandidateExplanation struct {
	Replica int    `json:"replica"`
	Name    string `json:"name"`
	// The gateway's own counters (exact, current).
	InFlight             int `json:"in_flight"`
	Pending              int `json:"pending"`
	PendingPromptTokens  int `json:"pending_prompt_tokens"`
	PendingPrefillTokens int `json:"pending_prefill_tokens"`
	InFlightPromptTokens int `json:"in_flight_prompt_tokens"`
	// Engine is the engine's last scrape as the policy saw it, nil when
	// there is none (never scraped, or too old).
	Engine                *EngineView `json:"engine"`
	PredictedCachedTokens int         `json:"predicted_cached_tokens"`
	KVCapacityBlocks      int         `json:"kv_capacity_blocks"`
	IndexedBlocks         int         `json:"indexed_blocks"`
	ActiveBlocks          int         `json:"active_blocks"`
	// Terms are the policy's numbers for this candidate; Score the one it
	// compares (Explanation.Objective), null when it compares none.
	Terms []Term `json:"terms"`
	// Guards name the guards and filters that fired for this candidate:
	// cost_model's bounded_load (skipped), kv_pressure (inflated),
	// placement (charged for evictions), session_slack (kept for its
	// session); prefix_hash's load_bound; aibrix's imbalance and
	// sigma_limit.
	Guards []string `json:"guards"`
	Score  Num      `json:"score"`
	// EstimatedTTFTMs is cost_model's estimate of the request's time to
	// first token on this candidate (before its guards), whatever the
	// policy: so that estimates of different policies' picks compare.
	EstimatedTTFTMs Num  `json:"estimated_ttft_ms"`
	Winner          bool `json:"winner"`
}

// EngineView is a candidate's last engine scrape.
type EngineView struct {
	AgeMs        float64 `json:"age_ms"`
	Running      int     `json:"running"`
	Waiting      int     `json:"waiting"`
	KVCacheUsage float64 `json:"kv_cache_usage"`
}

// Num is a float64 that survives JSON: infinities encode as the strings
// "inf" and "-inf", NaN (no value) as null.
type Num float64

// MarshalJSON implements json.Marshaler.
func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	switch {
	case math.IsNaN(f):
		return []byte("null"), nil
	case math.IsInf(f, 1):
		return []byte(`"inf"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-inf"`), nil
	}
	return json.Marshal(f)
}

// UnmarshalJSON implements json.Unmarshaler.
func (n *Num) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "null":
		*n = Num(math.NaN())
		return nil
	case `"inf"`:
		*n = Num(math.Inf(1))
		return nil
	case `"-inf"`:
		*n = Num(math.Inf(-1))
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("a number, \"inf\", \"-inf\" or null, got %.40s", b)
	}
	*n = Num(f)
	return nil
}

// none is the Score of a candidate a rule-based policy gives no number.
var none = Num(math.NaN())

// Term returns the value of the policy-wide term called name.
func (ex *Explanation) Term(name string) (float64, bool) { return termOf(ex.Terms, name) }

// Term returns the value of the candidate's term called name.
func (c *CandidateExplanation) Term(name string) (float64, bool) { return termOf(c.Terms, name) }

func termOf(ts []Term, name string) (float64, bool) {
	for _, t := range ts {
		if t.Name == name {
			return float64(t.Value), true
		}
	}
	return 0, false
}

// newExplanation starts the explanation of policy over cands: every
// candidate's state, no terms yet, no score.
func newExplanation(policy, objective string, cands []Candidate) Explanation {
	ex := Explanation{Policy: policy, Objective: objective, Terms: []Term{}, Candidates: make([]CandidateExplanation, len(cands))}
	for i := range cands {
		ex.Candidates[i] = Describe(&cands[i])
	}
	return ex
}

// Describe returns a candidate's state as an explanation shows it, with no
// terms and no score.
func Describe(c *Candidate) CandidateExplanation {
	ce := CandidateExplanation{
		Replica: c.Replica, Name: c.Name,
		InFlight: c.Load.InFlight, Pending: c.Load.Pending, PendingPromptTokens: c.Load.PendingPromptTokens,
		PendingPrefillTokens: c.Load.PendingPrefillTokens, InFlightPromptTokens: c.Load.InFlightPromptTokens,
		PredictedCachedTokens: c.PredictedCachedTokens, KVCapacityBlocks: c.KVCapacityBlocks,
		IndexedBlocks: c.IndexedBlocks, ActiveBlocks: c.ActiveBlocks,
		Terms: []Term{}, Guards: []string{}, Score: none, EstimatedTTFTMs: none,
	}
	if e := c.Load.Engine; e.Valid {
		ce.Engine = &EngineView{AgeMs: float64(e.Age) / float64(time.Millisecond), Running: e.Running, Waiting: e.Waiting, KVCacheUsage: e.KVCacheUsage}
	}
	return ce
}

// term adds a policy-wide term.
func (ex *Explanation) term(name string, v float64) {
	ex.Terms = append(ex.Terms, Term{name, Num(v)})
}

// cterm adds a term of candidate i.
func (ex *Explanation) cterm(i int, name string, v float64) {
	c := &ex.Candidates[i]
	c.Terms = append(c.Terms, Term{name, Num(v)})
}

// guard records that a guard fired for candidate i.
func (ex *Explanation) guard(i int, name string) {
	c := &ex.Candidates[i]
	c.Guards = append(c.Guards, name)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// label names candidate i for a sentence: its name, else its replica index.
func (ex *Explanation) label(i int) string {
	if n := ex.Candidates[i].Name; n != "" {
		return n
	}
	return "replica " + strconv.Itoa(ex.Candidates[i].Replica)
}

// runnerUp is the candidate other than the winner with the best finite
// score (lowest when min), -1 when there is none.
func (ex *Explanation) runnerUp(min bool) int {
	best := -1
	for i := range ex.Candidates {
		s := float64(ex.Candidates[i].Score)
		if i == ex.Winner || math.IsNaN(s) || math.IsInf(s, 0) {
			continue
		}
		if b := best; b < 0 || (min && s < float64(ex.Candidates[b].Score)) || (!min && s > float64(ex.Candidates[b].Score)) {
			best = i
		}
	}
	return best
}

// compared is the usual Why of a scored choice: "lowest <what> 41.2 on a;
// b was 58.0", with a note when the winner won a tie.
func (ex *Explanation) compared(what, unit string, min bool, ties int) string {
	w := float64(ex.Candidates[ex.Winner].Score)
	dir := "highest"
	if min {
		dir = "lowest"
	}
	s := fmt.Sprintf("%s %s %s on %s", dir, what, fmtNum(w, unit), ex.label(ex.Winner))
	if ties > 1 {
		s += fmt.Sprintf(" (a tie of %d, broken at random)", ties)
	}
	if r := ex.runnerUp(min); r >= 0 {
		s += fmt.Sprintf("; %s was %s", ex.label(r), fmtNum(float64(ex.Candidates[r].Score), unit))
	} else if len(ex.Candidates) == 1 {
		s += "; the only candidate"
	}
	return s
}

func fmtNum(v float64, unit string) string {
	var s string
	switch a := math.Abs(v); {
	case math.IsInf(v, 0):
		s = strconv.FormatFloat(v, 'f', -1, 64)
	case a == 0 || (a >= 0.01 && a < 1e6):
		s = strings.TrimSuffix(strings.TrimRight(strconv.FormatFloat(v, 'f', 3, 64), "0"), ".")
	default:
		s = strconv.FormatFloat(v, 'g', 4, 64)
	}
	if unit != "" {
		s += " " + unit
	}
	return s
}

// Estimator is cost_model's estimate of a request's time to first token
// on a candidate (before its guards), for every policy: the explanation and
// shadow mode price any policy's pick with it, so estimates compare.
type Estimator struct{ opts Options }

// NewEstimator returns the estimator of engines described by o (its
// profile, step budget).
func NewEstimator(o Options) Estimator { return Estimator{opts: o.withDefaults()} }

// TTFTMs is the estimated time to first token, in milliseconds, of a
// request of prompt tokens on c.
func (e Estimator) TTFTMs(prompt int, c *Candidate) float64 { return ttftMs(&e.opts, prompt, c, nil) }

// ttftTerms are the parts of cost_model's TTFT estimate (CostModel doc):
// what it sums and what it sums them from.
type ttftTerms struct {
	cached                int
	u, tokens, steps      float64
	decoding, decodingCtx float64
	step                  float64 // one step's time: fixed + decode load
	linear                float64 // prefill_token x (queued + own uncached tokens)
	pair                  float64 // the request's own attention term
	tier                  float64 // prompt tokens loaded back from the lower KV tiers
	load                  float64 // their load time
	ttft                  float64
}

// ttftMs is the one implementation of cost_model's estimate: Pick, the
// estimator and Explain all call it. With out set it also stores the
// estimate's parts there.
func ttftMs(o *Options, prompt int, c *Candidate, out *ttftTerms) float64 {
	pr := &o.Profile
	cached := min(c.PredictedCachedTokens, prompt)
	tier := 0
	if o.TierLoadNsPerToken > 0 {
		// Blocks found in a lower tier load back instead of computing.
		tier = min(max(0, c.PredictedTierTokens), prompt-cached)
	}
	u := float64(prompt - cached - tier)
	tokens := float64(c.Load.PendingPrefillTokens) + u
	steps := math.Max(1, math.Ceil(tokens/float64(o.MaxNumBatchedTokens)))
	decoding := float64(max(0, c.Load.InFlight-c.Load.Pending))
	decodingCtx := float64(max(0, c.Load.InFlightPromptTokens-c.Load.PendingPromptTokens))
	step := pr.StepFixedMs + float64(pr.DecodeSeqUs*decoding)/1e3 + float64(pr.DecodeCtxTokenNs*decodingCtx)/1e6
	linear := float64(pr.PrefillTokenUs*tokens) / 1e3
	pair := float64(pr.PrefillPairNs*u*(float64(cached+tier)+u/2)) / 1e6
	ttft := float64(steps*step) + linear + pair
	load := 0.0
	if tier > 0 {
		load = float64(o.TierLoadNsPerToken*float64(tier)) / 1e6
		ttft += load
	}
	if out != nil {
		*out = ttftTerms{cached: cached, u: u, tokens: tokens, steps: steps, decoding: decoding, decodingCtx: decodingCtx,
			step: step, linear: linear, pair: pair, tier: float64(tier), load: load, ttft: ttft}
	}
	return ttft
}

// explainTTFT adds candidate i's estimate terms: the exact parts it sums
// (steps, step_ms, prefill_linear_ms, prefill_pair_ms: ttft_ms = steps *
// step_ms + prefill_linear_ms + prefill_pair_ms) and their reading as
// queued prefill, own prefill, decode load and step overhead (which sum to
// it up to rounding).
func (ex *Explanation) explainTTFT(i int, o *Options, t ttftTerms) {
	pr := &o.Profile
	ex.cterm(i, "queued_prefill_ms", float64(pr.PrefillTokenUs*(t.tokens-t.u))/1e3)
	ex.cterm(i, "own_prefill_ms", float64(pr.PrefillTokenUs*t.u)/1e3+t.pair)
	ex.cterm(i, "decode_load_ms", t.steps*(t.step-pr.StepFixedMs))
	ex.cterm(i, "step_overhead_ms", t.steps*pr.StepFixedMs)
	ex.cterm(i, "uncached_tokens", t.u)
	ex.cterm(i, "decoding", t.decoding)
	ex.cterm(i, "steps", t.steps)
	ex.cterm(i, "step_ms", t.step)
	ex.cterm(i, "prefill_linear_ms", t.linear)
	ex.cterm(i, "prefill_pair_ms", t.pair)
	if t.tier > 0 {
		// ttft_ms adds the load; its implied weight of a tier block
		// against a GPU one is 1 - load / what computing it would cost.
		ex.cterm(i, "tier_tokens", t.tier)
		ex.cterm(i, "tier_load_ms", t.load)
	}
	ex.cterm(i, "ttft_ms", t.ttft)
}

// ErrNoExplanation is returned for a policy that does not implement
// Explainer (a wrapper installed with SetPolicy).
var ErrNoExplanation = errors.New("router: the policy cannot explain its choices")

// Explain asks p why it picks what it picks for req among cands, without
// side effects, and prices every candidate with est. The winner is what
// Pick would return now.
func Explain(p Policy, req *Request, cands []Candidate, est Estimator) (Explanation, error) {
	if len(cands) == 0 {
		return Explanation{}, ErrNoCandidates
	}
	x, ok := p.(Explainer)
	if !ok {
		return Explanation{}, fmt.Errorf("%w: %s", ErrNoExplanation, p.Name())
	}
	ex := x.Explain(req, cands)
	if ex.Winner < 0 || ex.Winner >= len(cands) || len(ex.Candidates) != len(cands) {
		return Explanation{}, fmt.Errorf("router: policy %s explained candidate %d of %d", p.Name(), ex.Winner, len(cands))
	}
	prompt := 0
	if req != nil {
		prompt = req.PromptTokens
	}
	for i := range ex.Candidates {
		ex.Candidates[i].EstimatedTTFTMs = Num(est.TTFTMs(prompt, &cands[i]))
	}
	ex.Candidates[ex.Winner].Winner = true
	return ex, nil
}
