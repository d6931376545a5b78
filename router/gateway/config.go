package gateway

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/inferrail/inferrail/router"
)

// Admission names an admission rule.
type Admission string

// The admission modes.
const (
	// AdmitNone dispatches every request at once to an eligible replica.
	AdmitNone Admission = "none"
	// AdmitKV weighs each request in the KV blocks it will add on each
	// replica (its uncached prompt plus max_tokens) and admits it where the
	// replica's reserved blocks plus that weight fit its capacity times
	// Overcommit, corrected by the scraped KV usage; a replica with nothing
	// reserved always takes its next request.
	AdmitKV Admission = "kv"
	// AdmitLLMDUtilization is llm-d flow control's utilization detector:
	// the pool is saturated when the mean over replicas of
	// max(waiting/5, kv_usage/0.8) reaches 1 (a stale or missing report
	// counts as 1); replicas scoring below 1 are preferred.
	AdmitLLMDUtilization Admission = "llmd-utilization"
	// AdmitLLMDConcurrency is llm-d flow control's concurrency detector in
	// requests mode: the pool is saturated when its requests in flight reach
	// LLMDMaxConcurrency per replica; a replica at that count takes no more.
	AdmitLLMDConcurrency Admission = "llmd-concurrency"
	// AdmitDynamo is NVIDIA Dynamo's router queue: a replica whose active
	// prefill tokens exceed DynamoQueueThreshold x max_num_batched_tokens is
	// busy; requests queue while every replica is.
	AdmitDynamo Admission = "dynamo"
	// AdmitTokenFlow is the TokenFlow gateway's rule: weight = prompt +
	// max_tokens tokens (no cache credit) against each replica's KV capacity
	// in tokens, one global FIFO queue (priorities and tenants ignored).
	AdmitTokenFlow Admission = "tokenflow"
)

// Admissions lists the admission modes.
func Admissions() []string {
	return []string{string(AdmitNone), string(AdmitKV), string(AdmitLLMDUtilization), string(AdmitLLMDConcurrency), string(AdmitDynamo), string(AdmitTokenFlow)}
}

// ParseAdmission checks an admission mode's name.
func ParseAdmission(s string) (Admission, error) {
	for _, a := range Admissions() {
		if s == a {
			return Admission(s), nil
		}
	}
	return "", fmt.Errorf("unknown admission mode %q (allowed: %s)", s, strings.Join(Admissions(), ", "))
}

// DefaultOvercommit is the share of a replica's KV capacity that kv
// admission may reserve: reservations count every request's whole
// max_tokens, which few requests use, so a little over 1 still leaves the
// engine room. Chosen from simulation (README "Admission and the queue"):
// the highest value that gives no preemption on W1, W2 and W7 at the
// default profile.
const DefaultOvercommit = 1.0

// Limits of the configuration.
const (
	// MaxPriorityLimit bounds the priority classes (and so a header's value).
	MaxPriorityLimit = 1000
	// MaxQueueRequests bounds Queue.MaxRequests.
	MaxQueueRequests = 1 << 20
)

// Queue configures the queue of requests no replica can admit yet.
type Queue struct {
	// MaxRequests bounds the requests queued; one more gets 429
	// queue_full. 0 disables queueing: a request no replica admits is
	// rejected at once. Default 1024.
	MaxRequests int
	// MaxBytes bounds the request bytes queued (Request.Bytes). Default
	// 256 MiB.
	MaxBytes int64
	// Timeout is how long a request may wait; past it, 429 queue_timeout
	// (503 when no replica is healthy). Default 30s.
	Timeout time.Duration
	// MaxPriority caps a request's priority class (higher is served
	// first). Default 10.
	MaxPriority int
	// ShedOnSLO rejects a request at once (429 slo_shed) when its
	// estimated wait, from the measured drain rate, exceeds its deadline.
	ShedOnSLO bool
}

// Health configures passive ejection: failures (of requests or probes)
// count, and a replica that fails EjectAfter times in a row is taken out
// for a time that doubles with each ejection, never more than
// MaxEjectedShare of the replicas at once.
type Health struct {
	EjectAfter      int
	EjectTime       time.Duration
	MaxEjectTime    time.Duration
	MaxEjectedShare float64
}

// Peers holds the parameters of the peers' admission rules, at their
// published defaults.
type Peers struct {
	// LLMDQueueThreshold and LLMDKVThreshold are the utilization
	// detector's thresholds (llm-d: 5 and 0.8); LLMDStaleness is the age
	// past which a report counts as saturated (llm-d: 200ms).
	LLMDQueueThreshold float64
	LLMDKVThreshold    float64
	LLMDStaleness      time.Duration
	// LLMDMaxConcurrency is the concurrency detector's per-replica cap
	// (llm-d: 100).
	LLMDMaxConcurrency int
	// DynamoQueueThreshold is Dynamo's router queue threshold, in units
	// of max_num_batched_tokens (Dynamo's original default: 4).
	DynamoQueueThreshold float64
}

// Config configures a Core (one served model).
type Config struct {
	// Model is the served model's name.
	Model string
	// Router configures the routing policy and the KV index.
	Router router.Config
	// ShadowPolicy names a policy (router.Names) that every decision also
	// asks, with the same candidates and state, without effect on routing:
	// its picks, their agreement with the real ones and cost_model's
	// estimates of both are in each Decision.Shadow and in ShadowStats
	// (shadow.go). "" (the default) asks none.
	ShadowPolicy string
	// Admission is the admission rule. Default AdmitKV.
	Admission Admission
	// Overcommit scales each replica's KV capacity for kv admission, in
	// (0, 4]. Default DefaultOvercommit.
	Overcommit float64
	// OutputQuantile makes kv admission reserve, for a request's output,
	// this quantile of the answer lengths the engines reported for the
	// model's last requests (at most its max_tokens) instead of its whole
	// max_tokens; 0 reserves max_tokens. Default 0.75.
	OutputQuantile float64
	// OutputMinSamples is how many answers are seen before the quantile is
	// used. Default 64.
	OutputMinSamples int
	// DefaultMaxTokens is the output a request without max_tokens is
	// weighed with; 0 means MaxModelLen minus its prompt (vLLM's default),
	// or with MaxModelLen 0 too the OutputQuantile estimate once known
	// (nothing before).
	DefaultMaxTokens int
	// MaxModelLen is the engines' context length: a request whose known
	// prompt plus max_tokens exceeds it is rejected (too_long). 0: unchecked.
	MaxModelLen int
	// ContextLen is the engines' context length as they report it (live
	// reads it from their /v1/models when max_model_len is not
	// configured). With MaxModelLen 0 it rejects as MaxModelLen does, but
	// it does not weigh a request without max_tokens: that is left to
	// DefaultMaxTokens and the answers' quantile, as with no length at
	// all, so that a gateway that learns the length does not start
	// reserving whole contexts. 0: none.
	ContextLen int
	// DefaultCapacityBlocks is the KV capacity of a replica whose
	// capacity is neither configured nor reported (0: unknown, and kv
	// admission does not limit it).
	DefaultCapacityBlocks int
	// MaxAge is the age past which an engine report counts as missing
	// (0: never).
	MaxAge time.Duration
	// Queue bounds the queue.
	Queue Queue
	// Health configures ejection.
	Health Health
	// Peers parameterises the peers' admission rules.
	Peers Peers
	// Trace, when set, is called after every call that changes the core
	// (Submit, FirstByte, Finished, Retry, Fail, Abort, Advance, Report,
	// RemoveReplica, Poke, KVEvents) with its inputs and decisions, for
	// recording a run and replaying it.
	Trace func(TraceEvent)
	// Ledger holds the replicas' reservations; nil: a local one. Several
	// cores (gateways) sharing one ledger see each other's reservations.
	Ledger Ledger
	// PD configures disaggregated prefill/decode (pd.go), used when some
	// replica has RolePrefill.
	PD PDConfig
}

// DefaultConfig returns the defaults of every field but Model and Router.
func DefaultConfig() Config {
	return Config{
		Admission:        AdmitKV,
		Overcommit:       DefaultOvercommit,
		OutputQuantile:   0.75,
		OutputMinSamples: 64,
		MaxAge:           500 * time.Millisecond,
		Queue:            Queue{MaxRequests: 1024, MaxBytes: 256 << 20, Timeout: 30 * time.Second, MaxPriority: 10},
		Health:           Health{EjectAfter: 3, EjectTime: time.Second, MaxEjectTime: 30 * time.Second, MaxEjectedShare: 0.5},
		Peers: Peers{
			LLMDQueueThreshold: 5, LLMDKVThreshold: 0.8, LLMDStaleness: 200 * time.Millisecond,
			LLMDMaxConcurrency: 100, DynamoQueueThreshold: 4,
		},
		PD: DefaultPDConfig(),
	}
}

// Validate checks c; every message names the setting.
func (c *Config) Validate() error {
	var errs []error
	if c.ShadowPolicy != "" {
		if _, err := router.NewPolicy(c.ShadowPolicy, c.Router.Options); err != nil {
			errs = append(errs, fmt.Errorf("shadow_policy: %w", err))
		}
	}
	if err := c.PD.validate(c.Router.Options); err != nil {
		errs = append(errs, err)
	}
	if _, err := ParseAdmission(string(c.Admission)); err != nil {
		errs = append(errs, fmt.Errorf("admission: %w", err))
	}
	if !(c.Overcommit > 0 && c.Overcommit <= 4) || math.IsNaN(c.Overcommit) {
		errs = append(errs, fmt.Errorf("overcommit: must be in (0, 4], got %v", c.Overcommit))
	}
	if !(c.OutputQuantile >= 0 && c.OutputQuantile <= 1) {
		errs = append(errs, fmt.Errorf("output_quantile: must be in [0, 1], got %v", c.OutputQuantile))
	}
	if c.OutputMinSamples < 1 || c.OutputMinSamples > 512 {
		errs = append(errs, fmt.Errorf("output_min_samples: must be between 1 and 512, got %d", c.OutputMinSamples))
	}
	if c.DefaultMaxTokens < 0 {
		errs = append(errs, fmt.Errorf("default_max_tokens: must be zero or positive, got %d", c.DefaultMaxTokens))
	}
	if c.MaxModelLen < 0 {
		errs = append(errs, fmt.Errorf("max_model_len: must be zero or positive, got %d", c.MaxModelLen))
	}
	if c.ContextLen < 0 {
		errs = append(errs, fmt.Errorf("context length: must be zero or positive, got %d", c.ContextLen))
	}
	if c.DefaultCapacityBlocks < 0 {
		errs = append(errs, fmt.Errorf("kv_capacity_blocks: must be zero or positive, got %d", c.DefaultCapacityBlocks))
	}
	if c.MaxAge < 0 {
		errs = append(errs, fmt.Errorf("max_age: must be zero or positive, got %v", c.MaxAge))
	}
	q := c.Queue
	if q.MaxRequests < 0 || q.MaxRequests > MaxQueueRequests {
		errs = append(errs, fmt.Errorf("queue.max_requests: must be between 0 and %d, got %d", MaxQueueRequests, q.MaxRequests))
	}
	if q.MaxBytes <= 0 {
		errs = append(errs, fmt.Errorf("queue.max_bytes: must be positive, got %d", q.MaxBytes))
	}
	if q.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("queue.timeout: must be positive, got %v", q.Timeout))
	}
	if q.MaxPriority < 0 || q.MaxPriority > MaxPriorityLimit {
		errs = append(errs, fmt.Errorf("queue.max_priority: must be between 0 and %d, got %d", MaxPriorityLimit, q.MaxPriority))
	}
	h := c.Health
	if h.EjectAfter < 1 {
		errs = append(errs, fmt.Errorf("health.eject_after: must be at least 1, got %d", h.EjectAfter))
	}
	if h.EjectTime <= 0 || h.MaxEjectTime < h.EjectTime {
		errs = append(errs, fmt.Errorf("health.eject_time %v and max_eject_time %v: must be positive, max at least eject_time", h.EjectTime, h.MaxEjectTime))
	}
	if !(h.MaxEjectedShare >= 0 && h.MaxEjectedShare <= 1) {
		errs = append(errs, fmt.Errorf("health.max_ejected_share: must be in [0, 1], got %v", h.MaxEjectedShare))
	}
	p := c.Peers
	if !(p.LLMDQueueThreshold > 0) {
		errs = append(errs, fmt.Errorf("peers.llmd_queue_threshold: must be positive, got %v", p.LLMDQueueThreshold))
	}
	if !(p.LLMDKVThreshold > 0) {
		errs = append(errs, fmt.Errorf("peers.llmd_kv_threshold: must be positive, got %v", p.LLMDKVThreshold))
	}
	if p.LLMDStaleness <= 0 {
		errs = append(errs, fmt.Errorf("peers.llmd_staleness: must be positive, got %v", p.LLMDStaleness))
	}
	if p.LLMDMaxConcurrency < 1 {
		errs = append(errs, fmt.Errorf("peers.llmd_max_concurrency: must be at least 1, got %d", p.LLMDMaxConcurrency))
	}
	if !(p.DynamoQueueThreshold > 0) {
		errs = append(errs, fmt.Errorf("peers.dynamo_queue_threshold: must be positive, got %v", p.DynamoQueueThreshold))
	}
	return errors.Join(errs...)
}
