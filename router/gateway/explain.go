package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/router"
)

// Explanation is what the core would decide for a request now, and why:
// every replica's state, eligibility and admission verdict, the policy's
// reasoning over the replicas that admit it (router.Explanation's terms,
// per candidate and policy-wide), the verdict and its sentence. Its JSON
// is the schema of live's POST /admin/explain and of sim --explain-out's
// records (docs/explain-shadow.md).
type Explanation struct {
	Model string `json:"model"`
	// AtMs is the core's time of the explanation, in milliseconds.
	AtMs      float64            `json:"at_ms"`
	Request   ExplainedRequest   `json:"request"`
	Admission ExplainedAdmission `json:"admission"`
	// Policy, Objective and Terms are the policy's (router.Explanation).
	Policy    string        `json:"policy"`
	Objective string        `json:"objective"`
	Terms     []router.Term `json:"terms"`
	// Candidates are every replica of the model but removed ones, by index.
	Candidates []ExplainedCandidate `json:"candidates"`
	// Winner is where the request would go, nil when nothing admits it.
	Winner *ExplainedWinner `json:"winner"`
	// Why says the verdict and the policy's reason in a sentence.
	Why string `json:"why"`
	// Shadow is the shadow policy's reasoning over the same candidates
	// (Config.ShadowPolicy), nil without one or without a winner.
	Shadow *ExplainedShadow `json:"shadow,omitempty"`
}

// ExplainedRequest is the request as the core saw it.
type ExplainedRequest struct {
	ID           uint64 `json:"id"`
	PromptTokens int    `json:"prompt_tokens"`
	// PromptKnown says the prompt was tokenized (else its length is an
	// estimate from the body's size and nothing is predicted cached).
	PromptKnown  bool `json:"prompt_known"`
	PromptBlocks int  `json:"prompt_blocks"`
	MaxTokens    int  `json:"max_tokens"`
	// Sequences are the sequences the request runs when above one (its
	// n, times its prompts when batched).
	Sequences int `json:"sequences,omitempty"`
	// PrefillOnly: an embedding, weighed as its prompt alone.
	PrefillOnly bool `json:"prefill_only,omitempty"`
	// Priority is the class after capping at the queue's max_priority.
	Priority int    `json:"priority"`
	Tenant   string `json:"tenant"`
	Session  uint64 `json:"session"`
}

// The verdicts of an explanation.
const (
	VerdictDispatch = "dispatch"
	VerdictQueue    = "queue"
	VerdictReject   = "reject"
)

// ExplainedAdmission is the core's verdict on the request.
type ExplainedAdmission struct {
	// Mode is the admission rule (Config.Admission).
	Mode string `json:"mode"`
	// Verdict is dispatch, queue or reject; Status and Reason those of a
	// rejection (the core's Reason* values).
	Verdict string `json:"verdict"`
	Status  int    `json:"status,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// PoolOpen is false when a pool-wide rule (llm-d's saturation
	// detectors) holds every request back.
	PoolOpen bool `json:"pool_open"`
	// QueuedAhead counts the queued requests of its class or a higher
	// one: while there are any, a new request queues behind them.
	QueuedAhead int `json:"queued_ahead"`
	// OutputTokens is the output its weight reserves for each of its
	// sequences (max_tokens, or the learned quantile of answer lengths).
	OutputTokens int `json:"output_tokens"`
}

// ExplainedCandidate is one replica: its state as the policy sees it
// (router.CandidateExplanation: load snapshot with its age, prediction,
// and the policy's terms when the policy considered it), whether it is
// eligible and whether it admits the request, with the numbers admission
// weighed.
type ExplainedCandidate struct {
	router.CandidateExplanation
	Healthy bool `json:"healthy"`
	// Eligible: healthy, serving the model, under its caps, allowed for
	// the request; Excluded says why not (ejected, max_in_flight,
	// max_pending, not_allowed).
	Eligible bool   `json:"eligible"`
	Excluded string `json:"excluded,omitempty"`
	// Admitted says admission lets it take the request; Admission names
	// the check that decided (docs/explain-shadow.md lists them).
	Admitted  bool   `json:"admitted"`
	Admission string `json:"admission,omitempty"`
	// WeightBlocks is the request's KV weight there (its blocks but the
	// predicted cached ones), ReservedBlocks what admission holds there
	// already, CapacityBlocks its capacity (0: unknown).
	WeightBlocks   int `json:"weight_blocks"`
	ReservedBlocks int `json:"reserved_blocks"`
	CapacityBlocks int `json:"capacity_blocks"`
	// Considered says the policy scored it (it was eligible and admitted).
	Considered bool `json:"considered"`
}

// ExplainedWinner is where the request would go.
type ExplainedWinner struct {
	Replica               int        `json:"replica"`
	Name                  string     `json:"name"`
	PredictedCachedTokens int        `json:"predicted_cached_tokens"`
	WeightBlocks          int        `json:"weight_blocks"`
	EstimatedTTFTMs       router.Num `json:"estimated_ttft_ms"`
}

// ExplainedShadow is the shadow policy's reasoning over the candidates the
// real one considered.
type ExplainedShadow struct {
	router.Explanation
	// WinnerReplica is the shadow's pick (Explanation.Winner indexes its
	// candidates); Agree says it is the real winner.
	WinnerReplica int  `json:"winner_replica"`
	Agree         bool `json:"agree"`
}

// Explain says what the core would decide for req at now and why, with no
// side effect: nothing is dispatched, reserved, queued or recorded, and the
// policies explain from copies of their state (router.Explainer). Its
// verdict is the decision Submit would return at now (a Reserver's TryAdd,
// which other gateways' reservations may refuse, aside), and its winner the
// replica Submit would dispatch to.
func (c *Core) Explain(now time.Duration, req Request) Explanation {
	e := &entry{req: req, arrived: now, replica: -1}
	e.prio = min(max(req.Priority, 0), c.cfg.Queue.MaxPriority)
	if c.cfg.Admission == AdmitTokenFlow {
		e.prio, e.req.Tenant = 0, ""
	}
	timeout := c.cfg.Queue.Timeout
	if req.Timeout > 0 && req.Timeout < timeout {
		timeout = req.Timeout
	}
	e.deadline = now + timeout
	ex := Explanation{
		Model: c.cfg.Model, AtMs: float64(now) / float64(time.Millisecond), Policy: c.rt.Policy().Name(), Terms: []router.Term{},
		Request: ExplainedRequest{ID: req.ID, PromptTokens: req.PromptTokens, PromptKnown: req.PromptKnown, PromptBlocks: len(req.BlockHashes),
			MaxTokens: req.MaxTokens, PrefillOnly: req.PrefillOnly, Priority: e.prio, Tenant: e.req.Tenant, Session: req.Session},
		Admission:  ExplainedAdmission{Mode: string(c.cfg.Admission), OutputTokens: c.outTokens(e), QueuedAhead: c.q.ahead(e.prio)},
		Candidates: []ExplainedCandidate{},
	}
	if n := seqs(req); n > 1 {
		ex.Request.Sequences = n
	}
	if limit, long := c.tooLong(req); long {
		ex.Admission.Verdict, ex.Admission.Status, ex.Admission.Reason = VerdictReject, http.StatusBadRequest, ReasonTooLong
		ex.Why = fmt.Sprintf("reject (400 %s): the prompt (%d tokens) plus max_tokens exceeds max_model_len %d", ReasonTooLong, req.PromptTokens, limit)
		return ex
	}
	ex.Admission.PoolOpen = c.gate.open(c, now)

	// The views and candidates try would offer the router, in copies.
	views := append([]router.Replica(nil), c.views...)
	c.refresh(now, e, views)
	rreq := router.Request{ID: req.ID, Model: c.cfg.Model, Session: req.Session, Priority: e.prio, PromptTokens: req.PromptTokens, BlockHashes: req.BlockHashes}
	eligible := c.rt.Candidates(now, &rreq, views, nil)
	byReplica := make(map[int]int, len(eligible))
	for i := range eligible {
		byReplica[eligible[i].Replica] = i
	}

	c.cur = e
	var admitted []router.Candidate
	at := make(map[int]int) // replica -> index in ex.Candidates
	for i, r := range c.reps {
		if r.gone {
			continue
		}
		ec := ExplainedCandidate{Healthy: c.healthy(now, r), CapacityBlocks: c.capacity(r), ReservedBlocks: c.ledger.Reserved(i)}
		k, ok := byReplica[i]
		if !ok {
			ec.CandidateExplanation = router.Describe(&views[i].Candidate)
			ec.Excluded = c.excluded(now, e, i, &views[i])
		} else {
			cand := eligible[k]
			ec.CandidateExplanation = router.Describe(&cand)
			ec.Eligible = true
			cached := cand.PredictedCachedTokens
			if req.BlockHashes == nil {
				cached = 0
			}
			ec.WeightBlocks = c.weight(e, cached)
			switch {
			case !ex.Admission.PoolOpen:
				ec.Admission = "pool_saturated"
			case c.cfg.Admission == AdmitNone:
				ec.Admitted, ec.Admission = true, whyNames[whyNoRule]
			default:
				ec.Admitted = c.admit(&cand)
				ec.Admission = whyNames[c.why]
			}
			if ec.Admitted {
				admitted = append(admitted, cand)
			}
		}
		at[i] = len(ex.Candidates)
		ex.Candidates = append(ex.Candidates, ec)
	}
	c.cur = nil

	var pex router.Explanation
	explained := false
	if len(admitted) > 0 {
		var err error
		if pex, err = router.Explain(c.rt.Policy(), &rreq, admitted, c.rt.Estimator()); err == nil {
			explained = true
			ex.Objective, ex.Terms = pex.Objective, pex.Terms
			for _, pc := range pex.Candidates {
				ec := &ex.Candidates[at[pc.Replica]]
				ec.CandidateExplanation = pc
				ec.Considered = true
			}
			w := &admitted[pex.Winner]
			cached := w.PredictedCachedTokens
			if req.BlockHashes == nil {
				cached = 0
			}
			ex.Winner = &ExplainedWinner{Replica: w.Replica, Name: w.Name, PredictedCachedTokens: cached, WeightBlocks: c.weight(e, cached),
				EstimatedTTFTMs: pex.Candidates[pex.Winner].EstimatedTTFTMs}
		} else {
			pex.Why = "the policy does not explain its choice: " + err.Error()
		}
		if explained && c.shadow != nil {
			if sex, err := router.Explain(c.shadow.pol, &rreq, admitted, c.shadow.est); err == nil {
				wr := admitted[sex.Winner].Replica
				ex.Shadow = &ExplainedShadow{Explanation: sex, WinnerReplica: wr, Agree: wr == ex.Winner.Replica}
			}
		}
	}

	ahead := ex.Admission.QueuedAhead
	switch {
	case ahead == 0 && ex.Winner != nil:
		ex.Admission.Verdict = VerdictDispatch
		ex.Why = fmt.Sprintf("dispatch to %s (weight %d blocks): %s", ex.Winner.Name, ex.Winner.WeightBlocks, pex.Why)
	case ahead == 0 && len(admitted) > 0:
		ex.Admission.Verdict = VerdictDispatch
		ex.Why = "dispatch to one of the replicas that admit it: " + pex.Why
	default:
		status, reason := c.refusal(now, e)
		if reason != "" {
			ex.Admission.Verdict, ex.Admission.Status, ex.Admission.Reason = VerdictReject, status, reason
		} else {
			ex.Admission.Verdict = VerdictQueue
		}
		ex.Why = c.notNow(&ex, ahead, len(admitted) > 0, explained, pex.Why)
	}
	return ex
}

// notNow is the sentence of a verdict other than dispatch.
func (c *Core) notNow(ex *Explanation, ahead int, anyAdmits, explained bool, policyWhy string) string {
	a := &ex.Admission
	var s string
	if a.Verdict == VerdictReject {
		s = fmt.Sprintf("reject (%d %s)", a.Status, a.Reason)
	} else {
		s = "queue"
	}
	switch {
	case ahead > 0:
		s += fmt.Sprintf(": %d queued requests of its class or higher are ahead of it", ahead)
		if anyAdmits && explained {
			s += fmt.Sprintf("; going now, it would go to %s: %s", ex.Winner.Name, policyWhy)
		}
	case !a.PoolOpen:
		s += fmt.Sprintf(": the pool is saturated (%s)", a.Mode)
	default:
		var refused []string
		eligible := 0
		for _, ec := range ex.Candidates {
			if ec.Eligible {
				eligible++
				refused = append(refused, fmt.Sprintf("%s %s", label(&ec), ec.Admission))
			}
		}
		if eligible == 0 {
			s += ": no replica is eligible"
		} else {
			s += ": no replica admits it (" + strings.Join(refused, ", ") + ")"
		}
	}
	return s
}

func label(ec *ExplainedCandidate) string {
	if ec.Name != "" {
		return ec.Name
	}
	return fmt.Sprintf("replica %d", ec.Replica)
}

// excluded says why replica i (view v) is not eligible for e.
func (c *Core) excluded(now time.Duration, e *entry, i int, v *router.Replica) string {
	r := c.reps[i]
	switch {
	case now < r.ejectedUntil:
		return "ejected"
	case !decodeCapable(r):
		return "prefill_only"
	case !allowed(e, i):
		return "not_allowed"
	case tried(e, i):
		return "tried"
	case v.MaxInFlight > 0 && v.Load.InFlight >= v.MaxInFlight:
		return "max_in_flight"
	case v.MaxPending > 0 && v.Load.Pending >= v.MaxPending:
		return "max_pending"
	}
	return "not_serving"
}

// whyNames names admit's checks in explanations.
var whyNames = [...]string{
	whyNoRule:          "no_admission",
	whyUnknownCapacity: "unknown_capacity",
	whyEmpty:           "empty_replica",
	whyFits:            "fits",
	whyOverCapacity:    "over_capacity",
	whyOverReserved:    "over_reserved",
	whyOverEngine:      "over_engine_usage",
	whyFitsReserved:    "fits",
	whyFitsPinned:      "fits",
	whyOverPinned:      "over_pinned",
	whyLLMDUnsaturated: "unsaturated",
	whyLLMDSaturated:   "saturated",
	whyLLMDUnder:       "under_concurrency",
	whyLLMDAtCap:       "at_concurrency",
	whyDynamoFree:      "prefill_under_threshold",
	whyDynamoBusy:      "prefill_busy",
}

// Sampled reports whether the request with id is among a share p of
// requests, by a hash of its id: the same ids are sampled in every run,
// whatever else happens in it.
func Sampled(id uint64, p float64) bool {
	switch {
	case !(p > 0):
		return false
	case p >= 1:
		return true
	}
	return float64(kvblock.Mix64(id^0x6A09E667F3BCC908)>>11) < p*(1<<53)
}
