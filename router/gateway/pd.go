package gateway

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/router"
)

// Role is what a replica serves when prefill and decode are disaggregated
// (P/D): a prefill replica computes prompts whose KV then moves to a decode
// replica, which generates the answer; a replica of both roles does either
// and serves ordinary (aggregated) requests.
type Role uint8

// The roles.
const (
	RoleBoth Role = iota
	RolePrefill
	RoleDecode
)

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return "both"
}

// ParseRole reads a role's name: "prefill", "decode", "both" or "" (both).
func ParseRole(s string) (Role, error) {
	switch s {
	case "", "both":
		return RoleBoth, nil
	case "prefill":
		return RolePrefill, nil
	case "decode":
		return RoleDecode, nil
	}
	return RoleBoth, fmt.Errorf("unknown role %q (allowed: prefill, decode, both)", s)
}

// The P/D deciders (PDConfig.Decider): whether a request whose decode
// replica is chosen prefills on a prefill replica (remotely) or where it
// decodes (locally).
const (
	// DecideAuto is the decider of the model's policy's own P/D design:
	// dynamo for dynamo, cost for cost_model, threshold (llm-d's pd
	// profile) for every other policy.
	DecideAuto = "auto"
	// DecideNever prefills every request locally: the prefill replicas idle.
	DecideNever = "never"
	// DecideAlways prefills every request remotely while a prefill replica
	// can take it.
	DecideAlways = "always"
	// DecideThreshold is llm-d's prefix-based decider
	// (prefix-based-pd-decider): remotely when the prompt's tokens not
	// cached on the chosen decode replica reach NonCachedTokens and the
	// prompt has at least MinPromptTokens.
	DecideThreshold = "threshold"
	// DecideDynamo is NVIDIA Dynamo's conditional disaggregation
	// (isl_bounding): locally when the uncached prompt is under
	// DynamoISLBound tokens and under DynamoISLRatio of the prompt,
	// remotely otherwise.
	DecideDynamo = "dynamo"
	// DecideCost is inferrail's: remotely when the uncached prompt reaches
	// NonCachedTokens and the cost model's time to first token through the
	// best prefill replica (its queue and prefill, plus the KV transfer) is
	// below that of prefilling on the decode replica plus the stall a local
	// prefill imposes on the requests decoding there (its compute time,
	// once for each of them).
	DecideCost = "cost"
)

// Deciders lists the P/D deciders.
func Deciders() []string {
	return []string{DecideAuto, DecideThreshold, DecideCost, DecideDynamo, DecideAlways, DecideNever}
}

// decider is the decider d names for the model's policy: d itself, or for
// auto (and "") the policy's own.
func decider(d, policy string) string {
	if d != "" && d != DecideAuto {
		return d
	}
	switch policy {
	case "dynamo":
		return DecideDynamo
	case "cost_model":
		return DecideCost
	}
	return DecideThreshold
}

// PDConfig configures disaggregated prefill/decode. It matters only when
// some replica has RolePrefill.
type PDConfig struct {
	// Decider decides remote or local prefill (Deciders; "" is auto).
	Decider string
	// NonCachedTokens is the threshold and cost deciders' least uncached
	// prompt (on the decode replica) worth a remote prefill. Default 16
	// (the value llm-d's shipped P/D configurations use).
	NonCachedTokens int
	// MinPromptTokens is the threshold decider's least prompt (0: any).
	MinPromptTokens int
	// PrefillPolicy picks the prefill replica among the prefill pool
	// (router.Names). "" (the default) is the model's policy, as llm-d
	// scores prefill and decode pods with the same scorers and Dynamo's
	// prefill router is its KV router.
	PrefillPolicy string
	// KVBytesPerToken and Transfer price a KV transfer for the cost
	// decider as the engines' profile does (engine.Config.TransferTime:
	// base latency + tokens x bytes / bandwidth; the zero Transfer is
	// the engine's defaults).
	KVBytesPerToken float64
	Transfer        engine.PDTransfer
	// DynamoISLBound and DynamoISLRatio are Dynamo's isl_bounding limits
	// (2048 tokens and 0.7).
	DynamoISLBound int
	DynamoISLRatio float64
}

// DefaultPDConfig returns P/D's defaults: each policy's own decider
// (auto) at llm-d's threshold of 16 tokens, prefill picked by the model's
// policy, the default engine's KV size over inference-sim's NIXL link
// defaults (25 GB/s, 0.05 ms).
func DefaultPDConfig() PDConfig {
	return PDConfig{
		Decider: DecideAuto, NonCachedTokens: 16,
		KVBytesPerToken: engine.DefaultConfig().KVBytesPerToken, Transfer: engine.DefaultPDTransfer(),
		DynamoISLBound: 2048, DynamoISLRatio: 0.7,
	}
}

func (p *PDConfig) validate(opts router.Options) error {
	var errs []error
	if p.Decider != "" && !slices.Contains(Deciders(), p.Decider) {
		errs = append(errs, fmt.Errorf("pd.decider: unknown decider %q (allowed: %s)", p.Decider, strings.Join(Deciders(), ", ")))
	}
	if p.NonCachedTokens < 0 {
		errs = append(errs, fmt.Errorf("pd.non_cached_tokens: must be zero or positive, got %d", p.NonCachedTokens))
	}
	if p.MinPromptTokens < 0 {
		errs = append(errs, fmt.Errorf("pd.min_prompt_tokens: must be zero or positive, got %d", p.MinPromptTokens))
	}
	if p.PrefillPolicy != "" {
		if _, err := router.NewPolicy(p.PrefillPolicy, opts); err != nil {
			errs = append(errs, fmt.Errorf("pd.prefill_policy: %w", err))
		}
	}
	if !(p.KVBytesPerToken >= 0) || math.IsInf(p.KVBytesPerToken, 0) {
		errs = append(errs, fmt.Errorf("pd.kv_bytes_per_token: must be zero (unknown) or positive, got %v", p.KVBytesPerToken))
	}
	if t := p.Transfer; t != (engine.PDTransfer{}) && (!(t.BandwidthGBps > 0) || math.IsInf(t.BandwidthGBps, 0) || !(t.BaseLatencyMs >= 0)) {
		errs = append(errs, fmt.Errorf("pd.transfer: bandwidth_gbps must be positive and base_latency_ms zero or positive, got %v and %v", t.BandwidthGBps, t.BaseLatencyMs))
	}
	if p.DynamoISLBound < 0 || !(p.DynamoISLRatio >= 0 && p.DynamoISLRatio <= 1) {
		errs = append(errs, fmt.Errorf("pd.dynamo_isl_bound %d and dynamo_isl_ratio %v: must be zero or positive, the ratio in [0, 1]", p.DynamoISLBound, p.DynamoISLRatio))
	}
	return errors.Join(errs...)
}

// transferMs is the modelled KV transfer time of tokens, in milliseconds.
func (p *PDConfig) transferMs(tokens int) float64 {
	e := engine.Config{KVBytesPerToken: p.KVBytesPerToken, PDTransfer: p.Transfer}
	return float64(e.TransferTime(tokens)) / 1e6
}

// pdState is the core's P/D machinery: the prefill policy and the prefill
// replicas' views.
type pdState struct {
	on      bool   // some replica has RolePrefill
	decider string // the decider in use (auto resolved)
	pol     router.Policy
	cost    *router.CostModel
	views   []router.Replica
}

func (s *pdState) init(cfg Config) error {
	s.decider = decider(cfg.PD.Decider, cfg.Router.Policy)
	name := cfg.PD.PrefillPolicy
	if name == "" {
		name = cfg.Router.Policy
	}
	pol, err := router.NewPolicy(name, cfg.Router.Options)
	if err != nil {
		return fmt.Errorf("pd.prefill_policy: %w", err)
	}
	cm, err := router.NewPolicy("cost_model", cfg.Router.Options)
	if err != nil {
		return err
	}
	s.pol, s.cost = pol, cm.(*router.CostModel)
	return nil
}

// PDStats returns what P/D did so far.
func (c *Core) PDStats() PDStats { return c.pds }

// decodeCapable says whether r may take a request's decode (and a local
// prefill): any replica but a prefill-only one.
func decodeCapable(r *replica) bool { return r.cfg.Role != RolePrefill }

// remote decides, for e routed to decode replica d, whether it prefills
// remotely and where: the prefill replica's decision, or ok=false for a
// local prefill. A prefill decision is recorded in the index (pinned on the
// prefill replica until PrefillDone).
func (c *Core) remote(now time.Duration, e *entry, d router.Decision) (router.Decision, bool) {
	p := &c.cfg.PD
	dec := c.pd.decider
	if !c.pd.on || dec == DecideNever || e.req.PrefillOnly || e.req.LocalPrefill { // an embedding has no decode to hand over
		return router.Decision{}, false
	}
	prompt := e.req.PromptTokens
	cached := d.PredictedCachedTokens
	if e.req.BlockHashes == nil {
		cached = 0
	}
	uncached := prompt - cached
	switch dec {
	case DecideAlways:
	case DecideDynamo:
		if uncached < p.DynamoISLBound && float64(uncached) < p.DynamoISLRatio*float64(prompt) {
			return router.Decision{}, false
		}
	default: // threshold, cost
		if uncached < p.NonCachedTokens || prompt < p.MinPromptTokens {
			return router.Decision{}, false
		}
	}
	views := c.pd.views
	any := false
	for i, r := range c.reps {
		v := &views[i]
		*v = c.views[i]
		v.Healthy = r.cfg.Role == RolePrefill && !r.gone && c.healthy(now, r) && allowed(e, i)
		any = any || v.Healthy
	}
	if !any {
		return router.Decision{}, false
	}
	pd, err := c.rt.RouteWith(now, &c.rreq, views, nil, c.pd.pol)
	if err != nil {
		return router.Decision{}, false
	}
	if dec == DecideCost {
		local := c.views[d.Replica].Candidate
		local.PredictedCachedTokens = cached
		pc := views[pd.Replica].Candidate
		pc.PredictedCachedTokens = pd.PredictedCachedTokens
		if e.req.BlockHashes == nil {
			pc.PredictedCachedTokens = 0
		}
		far := c.pd.cost.EstimateTTFT(prompt, &pc) + p.transferMs(uncached)
		near := c.pd.cost.EstimateTTFT(prompt, &local)
		// A local prefill stalls each request decoding on the decode
		// replica for as long as it computes: a remote one is worth up to
		// that much more time to first token, summed over them.
		if d := local.Load.InFlight - local.Load.Pending; d > 0 {
			near += float64(d) * float64(c.rt.Options().Profile.PrefillTime(uncached, cached)) / 1e6
		}
		if far >= near {
			c.rt.Abandon(pd)
			return router.Decision{}, false
		}
	}
	return pd, true
}

// startPrefill counts e's remote prefill on its prefill replica.
func (c *Core) startPrefill(e *entry, pd router.Decision) {
	if e.req.BlockHashes == nil {
		pd.PredictedCachedTokens = 0
	}
	e.prefill = pd.Replica
	e.pdec = pd
	e.pfill = e.req.PromptTokens - pd.PredictedCachedTokens
	l := &c.reps[pd.Replica].load
	l.InFlight++
	l.Pending++
	l.PendingPromptTokens += e.req.PromptTokens
	l.PendingPrefillTokens += e.pfill
	l.InFlightPromptTokens += e.req.PromptTokens
	r := c.reps[pd.Replica]
	r.peakInFlight = max(r.peakInFlight, l.InFlight)
}

// endPrefill takes e's remote prefill off its prefill replica.
func (c *Core) endPrefill(e *entry) {
	l := &c.reps[e.prefill].load
	l.InFlight = max(0, l.InFlight-1)
	l.Pending = max(0, l.Pending-1)
	l.PendingPromptTokens = max(0, l.PendingPromptTokens-e.req.PromptTokens)
	l.PendingPrefillTokens = max(0, l.PendingPrefillTokens-e.pfill)
	l.InFlightPromptTokens = max(0, l.InFlightPromptTokens-e.req.PromptTokens)
	e.prefill = -1
	e.pfill = 0
}

// prefillDone is PrefillDone (trace.go) without the trace.
func (c *Core) prefillDone(now time.Duration, t Ticket) []Decision {
	c.out = c.out[:0]
	e := c.entryOf(t)
	if e == nil || e.st != stPending || e.prefill < 0 {
		return c.out
	}
	p := e.prefill
	c.endPrefill(e)
	c.pds.Done++
	// The prefill replica computed the prompt and keeps it cached.
	c.rt.Finished(e.pdec, e.req.BlockHashes)
	e.pdec = router.Decision{}
	c.Success(p)
	c.drain(now)
	return c.out
}

// prefillFailed is PrefillFailed (trace.go) without the trace.
func (c *Core) prefillFailed(now time.Duration, t Ticket, fault bool) []Decision {
	c.out = c.out[:0]
	e := c.entryOf(t)
	if e == nil || e.st != stPending || e.prefill < 0 {
		return c.out
	}
	p := e.prefill
	c.endPrefill(e)
	c.pds.Failed++
	c.rt.Abandon(e.pdec)
	e.pdec = router.Decision{}
	if fault {
		c.failure(now, p)
	}
	// The decode replica prefills it now.
	cached := e.dec.PredictedCachedTokens
	e.pend = e.req.PromptTokens - cached
	c.reps[e.replica].load.PendingPrefillTokens += e.pend
	c.drain(now)
	return c.out
}

// PDStats is what P/D did so far.
type PDStats struct {
	// Remote counts requests dispatched with a remote prefill, Local those
	// the decider kept local while a prefill replica existed.
	Remote, Local int64
	// Done and Failed count remote prefills that finished and that failed
	// (the request then prefilled on its decode replica).
	Done, Failed int64
}
