package gateway

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/router"
)

// Request is what the core knows of a request when it arrives.
type Request struct {
	// ID is the caller's id, echoed in decisions.
	ID      uint64
	Session uint64
	// PromptTokens is the prompt's length; PromptKnown says it is exact
	// (tokenized) rather than estimated from the body's size.
	PromptTokens int
	PromptKnown  bool
	// BlockHashes are the prompt's full blocks (nil when not tokenized).
	// The core keeps a reference until the request ends: do not modify.
	BlockHashes []kvblock.Hash
	// MaxTokens is the request's max_tokens (0: none given).
	MaxTokens int
	// Sequences are the sequences the engine runs for the request (0 or
	// 1: one): its n choices, as vLLM samples them from one prompt, times
	// the prompts of a batched completion. Admission weighs the prompt's
	// full blocks once and each sequence's tail and output; an answer's
	// completion tokens are their sum.
	Sequences int
	// PrefillOnly says the request generates nothing (an embedding): it
	// is weighed as its prompt alone, whatever MaxTokens and
	// DefaultMaxTokens say, never prefilled remotely, and its answer does
	// not teach the core the answers' lengths.
	PrefillOnly bool
	// LocalPrefill says the request is never prefilled remotely: its API
	// has no KV hand-over (vLLM's Responses API takes no
	// kv_transfer_params).
	LocalPrefill bool
	// Priority is the request's class (higher is served first), capped at
	// Queue.MaxPriority; negative counts as 0.
	Priority int
	// Tenant is the fairness flow ("" is one flow like any other) and
	// TenantWeight its share of its class (default 1).
	Tenant       string
	TenantWeight int
	// Bytes is the request's size, for the queue's byte bound.
	Bytes int64
	// Timeout shortens Queue.Timeout for this request (0: the queue's).
	Timeout time.Duration
	// NoQueue rejects the request at once instead of queueing it.
	NoQueue bool
	// Allowed, when not nil, restricts the request to these replicas (by
	// index): no other is eligible for it, and when none of them is
	// healthy it is rejected with 503 (ReasonNoReplica), whatever the
	// others' health. An empty, non-nil Allowed admits no replica. The
	// core keeps a reference until the request ends: do not modify. Nil
	// (every replica) is what the simulator uses.
	Allowed []int
}

// Ticket names a request inside the core from Submit until it ends. The zero
// Ticket names nothing.
type Ticket uint64

// Kind is what a decision says.
type Kind uint8

// The decision kinds.
const (
	// Dispatched: send the request to Decision.Replica now.
	Dispatched Kind = iota + 1
	// Queued: the request waits; a later call's decisions name it again.
	Queued
	// Rejected: the request ends here with Status, Reason and RetryAfter.
	Rejected
)

func (k Kind) String() string {
	switch k {
	case Dispatched:
		return "dispatched"
	case Queued:
		return "queued"
	case Rejected:
		return "rejected"
	}
	return "unknown"
}

// Reject reasons.
const (
	ReasonQueueFull    = "queue_full"
	ReasonQueueTimeout = "queue_timeout"
	ReasonNoReplica    = "no_replica"
	ReasonTooLong      = "too_long"
	ReasonSLOShed      = "slo_shed"
	ReasonNoCapacity   = "no_capacity"
)

// Decision is what the core decided for one request.
type Decision struct {
	Kind   Kind
	Ticket Ticket
	ID     uint64
	// Replica, Name and PredictedCachedTokens say where a dispatched
	// request goes and what the index expects there; Weight is the KV
	// blocks reserved for it.
	Replica               int
	Name                  string
	PredictedCachedTokens int
	Weight                int
	// Queued is the time the request waited in the queue.
	Queued time.Duration
	// Status (an HTTP status), Reason and RetryAfter describe a rejection.
	Status     int
	Reason     string
	RetryAfter time.Duration
	// Shadow is what the shadow policy (Config.ShadowPolicy) would have
	// picked for a dispatched request (shadow.go); its Policy is "" without
	// one.
	Shadow ShadowPick
	// Prefill is the prefill replica of a dispatched request that
	// prefills remotely (P/D, pd.go), -1 for one that prefills on Replica;
	// PrefillName names it and PrefillCachedTokens is what the index
	// expects cached there. The caller sends the prefill there, calls
	// PrefillDone (or PrefillFailed) when it answers, then sends the
	// request to Replica, which decodes it.
	Prefill             int
	PrefillName         string
	PrefillCachedTokens int
	// PredictedTierTokens is what the index expects the replica to load
	// back from its lower KV tiers, right after PredictedCachedTokens.
	PredictedTierTokens int
}

// MaxSequences bounds the sequences a request is weighed as.
const MaxSequences = 1 << 20

// Usage is what the engine reported of a request it served.
type Usage struct {
	// Known is false when the engine reported nothing (a stream without
	// its usage chunk).
	Known            bool
	PromptTokens     int
	CachedTokens     int
	CompletionTokens int
}

// Report is one scrape of an engine's own metrics.
type Report struct {
	Running, Waiting int
	KVUsage          float64
	// NumGPUBlocks is the engine's KV capacity (0: not reported).
	NumGPUBlocks int
	// Cumulative counters, for restart detection: any going backwards, or
	// the capacity changing, means the engine restarted with an empty cache.
	PrefixQueries, PrefixHits, Preemptions int64
}

// ReplicaConfig configures one replica.
type ReplicaConfig struct {
	Name string
	// MaxInFlight and MaxPending cap the requests in flight and those
	// waiting for their first byte (0: no cap).
	MaxInFlight, MaxPending int
	// CapacityBlocks is the replica's KV capacity from the configuration
	// (0: the engine's report, else Config.DefaultCapacityBlocks).
	CapacityBlocks int
	// Role is what the replica serves under P/D (pd.go); RoleBoth, the
	// zero value, serves everything.
	Role Role
}

// ReplicaState is a snapshot of the core's view of one replica.
type ReplicaState struct {
	Name            string
	Gone            bool
	Healthy         bool
	Load            router.Load
	ReportAge       time.Duration // -1 without a report
	Report          Report
	CapacityBlocks  int
	ReservedBlocks  int
	PeakReserved    int
	PeakInFlight    int
	Failures        int
	Ejections       int
	EjectedUntil    time.Duration
	EjectedNow      bool
	Restarts        int
	KVEventsApplied int64
}

type state uint8

const (
	stFree state = iota
	stQueued
	stPending   // dispatched, no first byte yet
	stStreaming // first byte seen
)

type entry struct {
	idx      int32
	gen      uint32
	st       state
	req      Request
	arrived  time.Duration
	deadline time.Duration
	prio     int
	replica  int
	dec      router.Decision
	weight   int
	tail     int // blocks beyond the prompt's full ones: its last partial block and max_tokens
	tried    []int32
	shadow   shadowNote // the shadow's view of the current dispatch, until its first byte
	// pend is the prefill tokens the attempt counts on its replica
	// (PendingPrefillTokens): the uncached prompt, 0 while it prefills
	// remotely.
	pend int
	// prefill is the replica of a remote prefill in progress (-1: none),
	// pdec its routing decision and pfill its pending prefill tokens there.
	prefill int
	pdec    router.Decision
	pfill   int
}

type replica struct {
	cfg      ReplicaConfig
	gone     bool
	load     router.Load
	report   Report
	reportAt time.Duration
	reported bool
	capRep   int // capacity from the engine's report
	// health
	failures     int
	ejections    int
	ejectedUntil time.Duration
	restarts     int
	kv           kvTranslator
	kvApplied    int64
	peakReserved int
	peakInFlight int
	// tail sums the in-flight requests' tail blocks (entry.tail); with the
	// index's pinned prompt blocks it is their exact KV demand.
	tail int
}

// Core is the gateway core for one served model. It is not safe for
// concurrent use: the caller serialises (the simulator is one goroutine;
// live holds one lock around every call).
type Core struct {
	cfg    Config
	rt     *router.Router
	ledger Ledger
	// reserver is ledger when it is a Reserver (nil otherwise): try then
	// reserves with TryAdd.
	reserver Reserver
	bs       int
	salt     kvblock.Hash
	models   []string

	reps    []*replica
	views   []router.Replica
	entries []entry
	free    []int32
	q       queue
	out     []Decision
	cur     *entry
	admitFn router.Admit
	evbuf   []engine.KVEvent
	gate    poolGate
	// why is the check of the last admit call that decided (admission.go).
	why admitWhy
	// shadow asks a second policy about every decision (shadow.go); nil
	// without Config.ShadowPolicy.
	shadow *shadow
	// rreq is try's request to the router, kept here: the router hands it
	// to the policy (an interface call), so a local would escape.
	rreq router.Request

	out_ outputEstimate
	pd   pdState
	pds  PDStats

	// drain rate: the times of the last dispatches from the queue.
	drained  [32]time.Duration
	nDrained int
	alive    liveFunc
}

// New validates cfg and builds a core with no replicas.
func New(cfg Config) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Router.DefaultCapacityBlocks == 0 {
		cfg.Router.DefaultCapacityBlocks = cfg.DefaultCapacityBlocks
	}
	rt, err := router.New(cfg.Router)
	if err != nil {
		return nil, err
	}
	c := &Core{cfg: cfg, rt: rt, ledger: cfg.Ledger, bs: rt.BlockSize(), salt: kvblock.Salt(cfg.Model, "", ""), models: []string{cfg.Model}}
	if c.ledger == nil {
		c.ledger = NewLocalLedger()
	}
	c.reserver, _ = c.ledger.(Reserver)
	c.admitFn = c.admit
	c.alive = c.queuedTicket
	c.out_.q, c.out_.min = cfg.OutputQuantile, cfg.OutputMinSamples
	if cfg.ShadowPolicy != "" {
		if err := c.SetShadow(cfg.ShadowPolicy); err != nil {
			return nil, err
		}
	}
	if err := c.pd.init(cfg); err != nil {
		return nil, err
	}
	return c, nil
}

// Router returns the core's router (its policy and index).
func (c *Core) Router() *router.Router { return c.rt }

// Config returns the core's configuration.
func (c *Core) Config() Config { return c.cfg }

// Salt is the hash salt of the model's prompts without a cache_salt.
func (c *Core) Salt() kvblock.Hash { return c.salt }

// AddReplica registers a replica and returns its index; a replica of that
// name that was removed comes back under its old index.
func (c *Core) AddReplica(rc ReplicaConfig) (int, error) {
	if rc.Name == "" {
		return -1, errors.New("replica: a name is required")
	}
	if rc.MaxInFlight < 0 || rc.MaxPending < 0 || rc.CapacityBlocks < 0 {
		return -1, fmt.Errorf("replica %s: caps and capacity must be zero or positive", rc.Name)
	}
	for i, r := range c.reps {
		if r.cfg.Name == rc.Name {
			r.gone = false
			r.cfg = rc
			c.setView(i)
			// RemoveReplica made the index forget its capacity too.
			if capb := c.capacity(r); capb > 0 {
				c.rt.SetCapacity(i, capb)
			}
			return i, nil
		}
	}
	i := len(c.reps)
	c.reps = append(c.reps, &replica{cfg: rc})
	c.views = append(c.views, router.Replica{})
	c.pd.views = append(c.pd.views, router.Replica{})
	c.setView(i)
	if capb := c.capacity(c.reps[i]); capb > 0 {
		c.rt.SetCapacity(i, capb)
	}
	return i, nil
}

// setView sets the fixed fields of replica i's view for the router.
func (c *Core) setView(i int) {
	r := c.reps[i]
	c.views[i] = router.Replica{
		Candidate:   router.Candidate{Replica: i, Name: r.cfg.Name},
		Models:      c.models,
		MaxInFlight: r.cfg.MaxInFlight,
		MaxPending:  r.cfg.MaxPending,
	}
	c.pd.on = slices.ContainsFunc(c.reps, func(r *replica) bool { return r.cfg.Role == RolePrefill && !r.gone })
}

// removeReplica is RemoveReplica (trace.go) without the trace.
func (c *Core) removeReplica(now time.Duration, i int) []Decision {
	c.out = c.out[:0]
	if r := c.rep(i); r != nil && !r.gone {
		r.gone = true
		r.kv.reset()
		c.rt.Forget(i)
	}
	c.drain(now) // requests only it could have taken are refused now
	return c.out
}

// poke is Poke (trace.go) without the trace.
func (c *Core) poke(now time.Duration) []Decision {
	c.out = c.out[:0]
	c.drain(now)
	return c.out
}

// Replicas is the number of replicas ever added.
func (c *Core) Replicas() int { return len(c.reps) }

// ReplicaIndex finds a replica by name.
func (c *Core) ReplicaIndex(name string) (int, bool) {
	for i, r := range c.reps {
		if r.cfg.Name == name {
			return i, true
		}
	}
	return -1, false
}

func (c *Core) rep(i int) *replica {
	if i < 0 || i >= len(c.reps) {
		return nil
	}
	return c.reps[i]
}

// capacity is a replica's KV capacity in blocks (0: unknown).
func (c *Core) capacity(r *replica) int {
	switch {
	case r.cfg.CapacityBlocks > 0:
		return r.cfg.CapacityBlocks
	case r.capRep > 0:
		return r.capRep
	}
	return c.cfg.DefaultCapacityBlocks
}

// State returns a snapshot of replica i's view.
func (c *Core) State(now time.Duration, i int) ReplicaState {
	r := c.rep(i)
	if r == nil {
		return ReplicaState{}
	}
	s := ReplicaState{
		Name: r.cfg.Name, Gone: r.gone, Healthy: c.healthy(now, r), Load: r.load, ReportAge: -1, Report: r.report,
		CapacityBlocks: c.capacity(r), ReservedBlocks: c.ledger.Reserved(i), PeakReserved: r.peakReserved, PeakInFlight: r.peakInFlight,
		Failures: r.failures, Ejections: r.ejections, EjectedUntil: r.ejectedUntil, EjectedNow: now < r.ejectedUntil,
		Restarts: r.restarts, KVEventsApplied: r.kvApplied,
	}
	if r.reported {
		s.ReportAge = now - r.reportAt
		s.Load.Engine = c.engineLoad(now, r)
	}
	return s
}

// Queued is the number of requests waiting.
func (c *Core) Queued() int { return c.q.live }

// ClassDepth is the requests waiting in one priority class of the queue.
type ClassDepth struct {
	Priority int `json:"priority"`
	Requests int `json:"requests"`
}

// QueuedByClass appends to dst the requests waiting per priority class,
// highest priority first; classes with none waiting are left out.
func (c *Core) QueuedByClass(dst []ClassDepth) []ClassDepth {
	for _, q := range c.q.classes {
		if q.live > 0 {
			dst = append(dst, ClassDepth{Priority: q.prio, Requests: q.live})
		}
	}
	return dst
}

// QueuedBytes is the bytes of the requests waiting.
func (c *Core) QueuedBytes() int64 { return c.q.bytes }

func (c *Core) healthy(now time.Duration, r *replica) bool {
	return !r.gone && now >= r.ejectedUntil
}

// anyHealthy reports whether some replica could ever take a request now
// (a prefill-only one cannot: it decodes nothing).
func (c *Core) anyHealthy(now time.Duration) bool {
	for _, r := range c.reps {
		if c.healthy(now, r) && decodeCapable(r) {
			return true
		}
	}
	return false
}

// engineLoad is the replica's last report as the router sees it: aged, and
// missing once older than MaxAge.
func (c *Core) engineLoad(now time.Duration, r *replica) router.EngineLoad {
	if !r.reported {
		return router.EngineLoad{}
	}
	age := now - r.reportAt
	if c.cfg.MaxAge > 0 && age > c.cfg.MaxAge {
		return router.EngineLoad{}
	}
	return router.EngineLoad{Valid: true, Age: age, Running: r.report.Running, Waiting: r.report.Waiting, KVCacheUsage: r.report.KVUsage}
}

// ticket helpers

func (c *Core) entryOf(t Ticket) *entry {
	if t == 0 {
		return nil
	}
	i := int(uint32(t)) - 1
	if i < 0 || i >= len(c.entries) {
		return nil
	}
	e := &c.entries[i]
	if e.st == stFree || e.gen != uint32(t>>32) {
		return nil
	}
	return e
}

func (c *Core) ticketOf(e *entry) Ticket {
	return Ticket(uint64(e.gen)<<32 | uint64(e.idx+1))
}

func (c *Core) queuedTicket(t Ticket) bool {
	e := c.entryOf(t)
	return e != nil && e.st == stQueued
}

func (c *Core) alloc() *entry {
	var i int32
	if n := len(c.free); n > 0 {
		i = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		if len(c.entries) == cap(c.entries) {
			// Grow by copying: tickets are indices, so nothing points in.
			ne := make([]entry, len(c.entries), max(64, 2*cap(c.entries)))
			copy(ne, c.entries)
			c.entries = ne
		}
		c.entries = c.entries[:len(c.entries)+1]
		i = int32(len(c.entries) - 1)
	}
	e := &c.entries[i]
	e.idx = i
	e.gen++
	e.prefill = -1
	return e
}

func (c *Core) release(e *entry) {
	i := e.idx
	e.st = stFree
	e.req = Request{}
	e.dec = router.Decision{}
	e.tried = e.tried[:0]
	e.weight = 0
	e.shadow = shadowNote{}
	e.pend, e.prefill, e.pdec, e.pfill = 0, -1, router.Decision{}, 0
	c.free = append(c.free, i)
}

// submit is Submit (trace.go) without the trace.
func (c *Core) submit(now time.Duration, req Request) (Decision, []Decision) {
	c.out = c.out[:0]
	if _, long := c.tooLong(req); long {
		return Decision{Kind: Rejected, ID: req.ID, Status: http.StatusBadRequest, Reason: ReasonTooLong}, c.out
	}
	e := c.alloc()
	e.st = stQueued
	e.req = req
	e.arrived = now
	e.replica = -1
	e.prio = min(max(req.Priority, 0), c.cfg.Queue.MaxPriority)
	if c.cfg.Admission == AdmitTokenFlow {
		e.prio, e.req.Tenant = 0, "" // one global FIFO queue
	}
	timeout := c.cfg.Queue.Timeout
	if req.Timeout > 0 && req.Timeout < timeout {
		timeout = req.Timeout
	}
	e.deadline = now + timeout
	d := c.place(now, e, false)
	return d, c.out
}

// place dispatches e now if it may jump no queued request and a replica
// admits it, else queues or rejects it.
func (c *Core) place(now time.Duration, e *entry, front bool) Decision {
	t := c.ticketOf(e)
	if c.q.ahead(e.prio) == 0 || front {
		if d, ok := c.try(now, e); ok {
			return d
		}
	}
	if status, reason := c.refusal(now, e); reason != "" {
		return c.reject(now, e, status, reason)
	}
	e.st = stQueued
	c.q.push(t, e.prio, e.req.Tenant, e.req.TenantWeight, front)
	c.q.bytes += e.req.Bytes
	c.q.dl.Push(e.deadline, t)
	c.drain(now) // the new request may be the head now (another tenant's turn)
	if e.st == stQueued {
		return Decision{Kind: Queued, Ticket: t, ID: e.req.ID}
	}
	// drain dispatched or rejected it: hand its decision back directly.
	for i, d := range c.out {
		if d.Ticket == t {
			c.out = append(c.out[:i], c.out[i+1:]...)
			return d
		}
	}
	return Decision{Kind: Queued, Ticket: t, ID: e.req.ID}
}

// refusal is why place refuses e, which no replica admits now, instead of
// queueing it: its status and reason, "" when it queues.
func (c *Core) refusal(now time.Duration, e *entry) (int, string) {
	if !c.anyUntried(now, e) {
		return c.unavailableStatus(now, e), ReasonNoReplica
	}
	switch {
	case e.req.NoQueue || c.cfg.Queue.MaxRequests == 0:
		return http.StatusTooManyRequests, ReasonNoCapacity
	case c.q.live >= c.cfg.Queue.MaxRequests || c.q.bytes+e.req.Bytes > c.cfg.Queue.MaxBytes:
		return http.StatusTooManyRequests, ReasonQueueFull
	}
	if c.cfg.Queue.ShedOnSLO {
		if rate := c.drainRate(); rate > 0 {
			wait := time.Duration(float64(c.q.ahead(e.prio)+1) / rate * float64(time.Second))
			if now+wait > e.deadline {
				return http.StatusTooManyRequests, ReasonSLOShed
			}
		}
	}
	return 0, ""
}

// unavailableStatus is the status of a request no replica takes: 429 while
// a replica it may go to is healthy, else 503.
func (c *Core) unavailableStatus(now time.Duration, e *entry) int {
	if e.req.Allowed == nil {
		if c.anyHealthy(now) {
			return http.StatusTooManyRequests
		}
		return http.StatusServiceUnavailable
	}
	for _, i := range e.req.Allowed {
		if r := c.rep(i); r != nil && c.healthy(now, r) && decodeCapable(r) {
			return http.StatusTooManyRequests
		}
	}
	return http.StatusServiceUnavailable
}

// anyUntried reports whether a healthy replica e may go to and has not
// tried exists.
func (c *Core) anyUntried(now time.Duration, e *entry) bool {
	for i, r := range c.reps {
		if c.healthy(now, r) && !tried(e, i) && allowed(e, i) && decodeCapable(r) {
			return true
		}
	}
	return false
}

// allowed reports whether e may go to replica i (Request.Allowed).
func allowed(e *entry, i int) bool {
	return e.req.Allowed == nil || slices.Contains(e.req.Allowed, i)
}

func tried(e *entry, i int) bool {
	for _, t := range e.tried {
		if int(t) == i {
			return true
		}
	}
	return false
}

func (c *Core) reject(now time.Duration, e *entry, status int, reason string) Decision {
	d := Decision{Kind: Rejected, Ticket: c.ticketOf(e), ID: e.req.ID, Status: status, Reason: reason}
	d.Queued = now - e.arrived
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		d.RetryAfter = c.retryAfter(e.prio)
	}
	c.release(e)
	return d
}

// retryAfter estimates when a request of class prio could be served, from
// the queue ahead of it and the measured drain rate; at least 1s, at most
// the queue timeout.
func (c *Core) retryAfter(prio int) time.Duration {
	ra := time.Second
	if rate := c.drainRate(); rate > 0 {
		ra = time.Duration(math.Ceil(float64(c.q.ahead(prio)+1)/rate)) * time.Second
	}
	return min(max(ra, time.Second), max(c.cfg.Queue.Timeout.Round(time.Second), time.Second))
}

// drainRate is the queue's recent dispatch rate per second (0: unknown).
func (c *Core) drainRate() float64 {
	n := min(c.nDrained, len(c.drained))
	if n < 2 {
		return 0
	}
	last := c.drained[(c.nDrained-1)%len(c.drained)]
	first := c.drained[(c.nDrained-n)%len(c.drained)]
	if last <= first {
		return 0
	}
	return float64(n-1) / (last - first).Seconds()
}

// try routes e among the replicas that admit it and dispatches it there.
func (c *Core) try(now time.Duration, e *entry) (Decision, bool) {
	if !c.gate.open(c, now) {
		return Decision{}, false
	}
	c.refresh(now, e, c.views)
	c.rreq = router.Request{ID: e.req.ID, Model: c.cfg.Model, Session: e.req.Session, Priority: e.prio, PromptTokens: e.req.PromptTokens, BlockHashes: e.req.BlockHashes}
	c.cur = e
	var admit router.Admit
	if c.cfg.Admission != AdmitNone {
		admit = c.admitFn
	}
	d, err := c.rt.RouteAdmitted(now, &c.rreq, c.views, admit)
	reserved := false // TryAdd put the weight in the ledger already
	if err == nil && c.reserver != nil {
		d, reserved, err = c.reserve(now, e, d, admit)
	}
	var sp ShadowPick
	if err == nil && c.shadow != nil {
		sp = c.shadowPick(now, e, d.Replica)
	}
	var pd router.Decision
	remote := false
	if err == nil && c.pd.on {
		pd, remote = c.remote(now, e, d)
	}
	c.cur = nil
	c.rreq.BlockHashes = nil // keep no reference past the call
	if err != nil {
		return Decision{}, false
	}
	if e.req.BlockHashes == nil {
		d.PredictedCachedTokens = 0
	}
	r := c.reps[d.Replica]
	w := c.weight(e, d.PredictedCachedTokens)
	queued := now - e.arrived
	e.st = stPending
	e.replica = d.Replica
	e.dec = d
	e.weight = w
	e.tail = c.tailBlocks(e)
	r.tail += e.tail
	e.tried = append(e.tried, int32(d.Replica))
	e.pend = e.req.PromptTokens - d.PredictedCachedTokens
	dec := Decision{Kind: Dispatched, Ticket: c.ticketOf(e), ID: e.req.ID, Replica: d.Replica, Name: r.cfg.Name,
		PredictedCachedTokens: d.PredictedCachedTokens, Weight: w, Queued: queued, Shadow: sp, Prefill: -1}
	if e.req.BlockHashes != nil {
		dec.PredictedTierTokens = d.PredictedTierTokens
	}
	if remote {
		c.startPrefill(e, pd)
		e.pend = 0 // the decode replica computes the prompt's last token only
		dec.Prefill, dec.PrefillName, dec.PrefillCachedTokens = pd.Replica, c.reps[pd.Replica].cfg.Name, e.pdec.PredictedCachedTokens
		c.pds.Remote++
	} else if c.pd.on {
		c.pds.Local++
	}
	if !reserved {
		c.ledger.Add(d.Replica, w)
	}
	r.peakReserved = max(r.peakReserved, c.ledger.Reserved(d.Replica))
	l := &r.load
	l.InFlight++
	l.Pending++
	l.PendingPromptTokens += e.req.PromptTokens
	l.PendingPrefillTokens += e.pend
	l.InFlightPromptTokens += e.req.PromptTokens
	r.peakInFlight = max(r.peakInFlight, l.InFlight)
	return dec, true
}

// refresh sets what moves in views (the replicas' views for the router)
// for routing e at now: loads, engine reports, capacities, and whether e
// may go there. The fixed fields (index, name, models, caps) are set when a
// replica is added.
func (c *Core) refresh(now time.Duration, e *entry, views []router.Replica) {
	for i, r := range c.reps {
		v := &views[i]
		v.Load = r.load
		v.Load.Engine = c.engineLoad(now, r)
		v.KVCapacityBlocks = c.capacity(r)
		v.Healthy = c.healthy(now, r) && !tried(e, i) && allowed(e, i) && decodeCapable(r)
	}
}

// reserve is try's check-and-reserve with a Reserver: it asks TryAdd for
// the weight of e on d's replica, and when TryAdd refuses (another gateway
// took the room since admit read the ledger) that replica does not admit e
// in this attempt: what routing recorded there is undone (the index's pins
// or speculation) and routing runs again without it. Each refusal leaves
// one more replica out, so each is asked at most once. It reports whether
// the weight is in the ledger (false: try adds it, as without a Reserver).
func (c *Core) reserve(now time.Duration, e *entry, d router.Decision, admit router.Admit) (router.Decision, bool, error) {
	for range len(c.reps) {
		limit, weighs := c.ledgerLimit(c.reps[d.Replica])
		if !weighs {
			return d, false, nil
		}
		cached := d.PredictedCachedTokens
		if e.req.BlockHashes == nil {
			cached = 0
		}
		if c.reserver.TryAdd(d.Replica, c.weight(e, cached), limit) {
			return d, true, nil
		}
		c.rt.Abandon(d)
		c.views[d.Replica].Healthy = false
		var err error
		if d, err = c.rt.RouteAdmitted(now, &c.rreq, c.views, admit); err != nil {
			return d, false, err
		}
	}
	// Unreachable (every replica was left out), but leave nothing behind.
	c.rt.Abandon(d)
	return d, false, router.ErrNoCandidates
}

// ledgerLimit is what admit compares the ledger's part of replica r's
// demand against (capacity x overcommit for kv, the capacity for
// tokenflow), in whole blocks, and whether admission weighs r's requests
// against the ledger at all (kv or tokenflow, with r's capacity known).
func (c *Core) ledgerLimit(r *replica) (int, bool) {
	capb := c.capacity(r)
	if capb <= 0 {
		return 0, false
	}
	switch c.cfg.Admission {
	case AdmitKV:
		// admit refuses float64(used) > capb*overcommit: for a whole
		// number of blocks, used > the floor.
		return int(math.Floor(float64(capb) * c.cfg.Overcommit)), true
	case AdmitTokenFlow:
		return capb, true
	}
	return 0, false
}

// tooLong reports whether req cannot fit the engines' context (MaxModelLen,
// else ContextLen; limit 0: none known): its known prompt plus max_tokens,
// at least one token, is longer.
func (c *Core) tooLong(req Request) (limit int, long bool) {
	limit = c.cfg.MaxModelLen
	if limit == 0 {
		limit = c.cfg.ContextLen
	}
	out := max(req.MaxTokens, 1)
	if req.PrefillOnly {
		out = 0
	}
	return limit, limit > 0 && req.PromptKnown && req.PromptTokens+out > limit
}

// maxTokens is the output e is weighed with.
func (c *Core) maxTokens(e *entry) int {
	switch {
	case e.req.PrefillOnly:
		return 0
	case e.req.MaxTokens > 0:
		return e.req.MaxTokens
	case c.cfg.DefaultMaxTokens > 0:
		return c.cfg.DefaultMaxTokens
	case c.cfg.MaxModelLen > 0:
		return max(0, c.cfg.MaxModelLen-e.req.PromptTokens)
	}
	return 0
}

// outTokens is the output e is reserved for: its max_tokens, or less once
// the answers' lengths are known (OutputQuantile; never for tokenflow).
// With no bound at all (no max_tokens, no DefaultMaxTokens, no
// MaxModelLen) it is the answers' quantile once known, else nothing.
func (c *Core) outTokens(e *entry) int {
	mt := c.maxTokens(e)
	est, ok := c.out_.get()
	switch {
	case e.req.PrefillOnly:
		return 0
	case !ok || c.cfg.Admission == AdmitTokenFlow:
		return mt
	case mt == 0:
		return est
	}
	return min(mt, est)
}

// weight is the KV blocks e adds on a replica predicted to hold cached of
// its prompt tokens: every block of prompt and output but the cached ones
// (tokenflow: no cache credit).
func (c *Core) weight(e *entry, cached int) int {
	total := c.fullBlocks(e) + c.tailBlocks(e)
	if c.cfg.Admission == AdmitTokenFlow {
		cached = 0
	}
	return max(1, total-cached/c.bs)
}

// fullBlocks is the number of full blocks of e's prompt.
func (c *Core) fullBlocks(e *entry) int {
	if e.req.BlockHashes != nil {
		return len(e.req.BlockHashes)
	}
	return e.req.PromptTokens / c.bs
}

// tailBlocks is what e needs beyond its prompt's full blocks: each of its
// sequences' tail.
func (c *Core) tailBlocks(e *entry) int {
	return seqs(e.req) * c.seqTail(e)
}

// seqTail is what one of e's sequences needs beyond the prompt's full
// blocks (which its sequences share).
func (c *Core) seqTail(e *entry) int {
	return max(0, (e.req.PromptTokens+c.outTokens(e)+c.bs-1)/c.bs-c.fullBlocks(e))
}

// seqs is the sequences req has the engine run (Sequences), at least
// one; one for an embedding.
func seqs(req Request) int {
	if req.PrefillOnly {
		return 1
	}
	return min(max(1, req.Sequences), MaxSequences)
}

// firstByte is FirstByte (trace.go) without the trace.
func (c *Core) firstByte(now time.Duration, t Ticket, cached int) []Decision {
	c.out = c.out[:0]
	e := c.entryOf(t)
	if e == nil || e.st != stPending {
		return c.out
	}
	r := c.reps[e.replica]
	c.unpend(r, e)
	e.st = stStreaming
	if e.shadow.on {
		c.shadowMeasured(now, e)
	}
	if cached >= 0 {
		c.reconcile(e, cached)
	}
	// The request is no longer pending (MaxPending, dynamo's prefill
	// tokens): that frees capacity even when cached is not known yet.
	c.drain(now)
	return c.out
}

func (c *Core) unpend(r *replica, e *entry) {
	l := &r.load
	l.Pending = max(0, l.Pending-1)
	l.PendingPromptTokens = max(0, l.PendingPromptTokens-e.req.PromptTokens)
	l.PendingPrefillTokens = max(0, l.PendingPrefillTokens-e.pend)
	e.pend = 0
}

// reconcile resizes e's reservation to what the engine really found cached.
func (c *Core) reconcile(e *entry, cached int) {
	if c.cfg.Admission == AdmitTokenFlow {
		return // no cache credit
	}
	// Only the cache credit changes: the output stays what admission
	// reserved (the output estimate may have moved since).
	w := max(1, e.weight+e.dec.PredictedCachedTokens/c.bs-cached/c.bs)
	if w != e.weight {
		c.ledger.Add(e.replica, w-e.weight)
		e.weight = w
	}
}

// finished is Finished (trace.go) without the trace.
func (c *Core) finished(now time.Duration, t Ticket, u Usage, held []kvblock.Hash) []Decision {
	c.out = c.out[:0]
	e := c.entryOf(t)
	if e == nil || (e.st != stPending && e.st != stStreaming) {
		return c.out
	}
	r := c.reps[e.replica]
	if e.st == stPending {
		c.unpend(r, e)
	}
	if u.Known && !e.req.PrefillOnly {
		n := seqs(e.req)
		c.out_.add((u.CompletionTokens + n - 1) / n) // one sequence's
	}
	c.endAttempt(r, e)
	c.rt.Finished(e.dec, held)
	c.release(e)
	c.drain(now)
	return c.out
}

func (c *Core) endAttempt(r *replica, e *entry) {
	l := &r.load
	l.InFlight = max(0, l.InFlight-1)
	l.InFlightPromptTokens = max(0, l.InFlightPromptTokens-e.req.PromptTokens)
	c.ledger.Add(e.replica, -e.weight)
	e.weight = 0
	r.tail = max(0, r.tail-e.tail)
	e.tail = 0
}

// takeBack undoes a dispatched attempt that failed before its first byte.
func (c *Core) takeBack(now time.Duration, e *entry, fault bool) {
	if e.prefill >= 0 {
		c.endPrefill(e)
		c.rt.Abandon(e.pdec)
		e.pdec = router.Decision{}
	}
	r := c.reps[e.replica]
	if e.st == stPending {
		c.unpend(r, e)
	}
	c.endAttempt(r, e)
	c.rt.Abandon(e.dec)
	e.dec = router.Decision{}
	e.shadow = shadowNote{}
	if fault {
		c.failure(now, e.replica)
	}
}

// retry is Retry (trace.go) without the trace.
func (c *Core) retry(now time.Duration, t Ticket, fault bool) (Decision, []Decision) {
	c.out = c.out[:0]
	e := c.entryOf(t)
	if e != nil && e.st == stStreaming {
		// A stream that started is never replayed: the request ends here,
		// as with Fail, so nothing it held leaks.
		return Decision{Kind: Rejected, Ticket: t, ID: e.req.ID, Status: http.StatusBadGateway, Reason: ReasonNoReplica}, c.fail(now, t, fault)
	}
	if e == nil || e.st != stPending {
		return Decision{Kind: Rejected, Ticket: t, Status: http.StatusBadGateway, Reason: ReasonNoReplica}, c.out
	}
	c.takeBack(now, e, fault)
	e.st = stQueued
	d := c.place(now, e, true)
	if d.Kind == Rejected && d.Reason == ReasonNoReplica {
		d.Status = http.StatusBadGateway
	}
	c.drain(now)
	return d, c.out
}

// fail is Fail (trace.go) without the trace.
func (c *Core) fail(now time.Duration, t Ticket, fault bool) []Decision {
	c.out = c.out[:0]
	e := c.entryOf(t)
	if e == nil || (e.st != stPending && e.st != stStreaming) {
		return c.out
	}
	if e.st == stPending {
		c.takeBack(now, e, fault)
	} else {
		r := c.reps[e.replica]
		c.endAttempt(r, e)
		c.rt.Finished(e.dec, e.req.BlockHashes)
		if fault {
			c.failure(now, e.replica)
		}
	}
	c.release(e)
	c.drain(now)
	return c.out
}

// abort is Abort (trace.go) without the trace.
func (c *Core) abort(now time.Duration, t Ticket) []Decision {
	c.out = c.out[:0]
	e := c.entryOf(t)
	if e == nil {
		return c.out
	}
	switch e.st {
	case stQueued:
		c.q.remove(e.prio, e.req.Tenant, e.req.Bytes)
		c.release(e)
		c.q.compact(c.alive)
		c.drain(now) // it may have been the head that blocked the line
		return c.out
	case stPending:
		c.takeBack(now, e, false)
	case stStreaming:
		r := c.reps[e.replica]
		c.endAttempt(r, e)
		c.rt.Finished(e.dec, e.req.BlockHashes)
	}
	c.release(e)
	c.drain(now)
	return c.out
}

// advance is Advance (trace.go) without the trace.
func (c *Core) advance(now time.Duration) []Decision {
	c.out = c.out[:0]
	for {
		it, ok := c.q.dl.Top()
		if !ok || it.At > now {
			break
		}
		c.q.dl.Pop()
		e := c.entryOf(it.V)
		if e == nil || e.st != stQueued || e.deadline != it.At {
			continue
		}
		c.q.remove(e.prio, e.req.Tenant, e.req.Bytes)
		c.out = append(c.out, c.reject(now, e, c.unavailableStatus(now, e), ReasonQueueTimeout))
	}
	c.q.compact(c.alive)
	c.drain(now)
	return c.out
}

// NextDeadline is when the core next needs Advance: the nearest queue
// deadline, or the end of an ejection while requests wait.
func (c *Core) NextDeadline(now time.Duration) (time.Duration, bool) {
	at, ok := time.Duration(0), false
	for {
		it, has := c.q.dl.Top()
		if !has {
			break
		}
		if e := c.entryOf(it.V); e == nil || e.st != stQueued || e.deadline != it.At {
			c.q.dl.Pop()
			continue
		}
		at, ok = it.At, true
		break
	}
	if c.q.live > 0 {
		for _, r := range c.reps {
			if !r.gone && r.ejectedUntil > now && (!ok || r.ejectedUntil < at) {
				at, ok = r.ejectedUntil, true
			}
		}
	}
	return at, ok
}

// drain dispatches queued requests, head first, while a replica admits the
// head. Its decisions are appended to c.out.
func (c *Core) drain(now time.Duration) {
	for c.q.live > 0 {
		t, cls, ok := c.q.peek(c.alive)
		if !ok {
			return
		}
		e := c.entryOf(t)
		d, ok := c.try(now, e)
		if !ok {
			if !c.anyUntried(now, e) {
				c.q.pop(cls, e.req.Bytes)
				e.st = stQueued
				c.out = append(c.out, c.reject(now, e, c.unavailableStatus(now, e), ReasonNoReplica))
				continue
			}
			return
		}
		c.q.pop(cls, e.req.Bytes)
		c.drained[c.nDrained%len(c.drained)] = now
		c.nDrained++
		c.out = append(c.out, d)
	}
}

// report is Report (trace.go) without the trace.
func (c *Core) report(now time.Duration, i int, rep Report) []Decision {
	c.out = c.out[:0]
	r := c.rep(i)
	if r == nil {
		return c.out
	}
	if r.reported && restarted(r.report, rep) {
		r.restarts++
		r.kv.reset()
		c.rt.Restarted(i)
	}
	r.report, r.reportAt, r.reported = rep, now, true
	if rep.NumGPUBlocks > 0 && rep.NumGPUBlocks != r.capRep {
		r.capRep = rep.NumGPUBlocks
		if r.cfg.CapacityBlocks == 0 {
			c.rt.SetCapacity(i, rep.NumGPUBlocks)
		}
	}
	c.drain(now)
	return c.out
}

// restarted reports whether an engine's counters went backwards or its
// capacity changed between two reports.
func restarted(prev, cur Report) bool {
	if cur.PrefixQueries < prev.PrefixQueries || cur.PrefixHits < prev.PrefixHits || cur.Preemptions < prev.Preemptions {
		return true
	}
	return cur.NumGPUBlocks != 0 && prev.NumGPUBlocks != 0 && cur.NumGPUBlocks != prev.NumGPUBlocks
}

// kvEvents is KVEvents (trace.go) without the trace.
func (c *Core) kvEvents(now time.Duration, i int, evs []KVEvent) {
	r := c.rep(i)
	if r == nil || r.gone || c.rt.IndexMode() != router.IndexEvents {
		return
	}
	c.evbuf = r.kv.translate(evs, c.cfg.Model, c.salt, c.bs, c.evbuf[:0])
	if len(c.evbuf) > 0 {
		c.rt.KVEvents(i, c.evbuf)
	}
	r.kvApplied += int64(len(evs))
	clear(c.evbuf)
}

// Resync forgets what the index believed of replica i: its event stream
// had a gap or a reset. The index rebuilds from new events.
func (c *Core) Resync(i int) {
	if r := c.rep(i); r != nil {
		r.kv.reset()
		c.rt.Restarted(i)
	}
}

// Failure counts a failure of replica i (a request that could not reach
// it, or a failed probe); it returns true when this ejected the replica.
func (c *Core) Failure(now time.Duration, i int) bool {
	if c.rep(i) == nil {
		return false
	}
	return c.failure(now, i)
}

func (c *Core) failure(now time.Duration, i int) bool {
	r := c.reps[i]
	h := c.cfg.Health
	r.failures++
	if r.failures < h.EjectAfter || now < r.ejectedUntil {
		return false
	}
	// Never eject more than the allowed share of the replicas.
	ejected, total := 0, 0
	for _, o := range c.reps {
		if o.gone {
			continue
		}
		total++
		if now < o.ejectedUntil {
			ejected++
		}
	}
	if float64(ejected+1) > h.MaxEjectedShare*float64(total) {
		return false
	}
	d := h.EjectTime << min(r.ejections, 20)
	if d > h.MaxEjectTime || d <= 0 {
		d = h.MaxEjectTime
	}
	r.ejections++
	r.ejectedUntil = now + d
	r.failures = 0
	return true
}

// Success resets replica i's consecutive failures.
func (c *Core) Success(i int) {
	if r := c.rep(i); r != nil {
		r.failures = 0
	}
}
