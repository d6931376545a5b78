package live

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/fleet/remote"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
)

// Encoder turns a request's prompt into the token ids the engine will see.
type Encoder interface {
	// EncodeCompletion tokenizes a /v1/completions prompt.
	EncodeCompletion(prompt string) []uint32
	// EncodeChat renders and tokenizes a /v1/chat/completions body.
	EncodeChat(body []byte) ([]uint32, error)
}

// replica is one upstream engine as the proxy reaches it. Its fields never
// change once it is registered (but for the marks below, each guarded as it
// says); everything the gateway knows of its state
// (counters, caps, health, reports, removal) is in the model's core.
type replica struct {
	idx      int // the core's index
	name     string
	base     *url.URL
	kvEvents string
	kvReplay string
	kvTopic  string
	kvBind   bool
	group    string // DNS group, "" for a listed replica
	role     gateway.Role
	// auth is its model's upstreamAuth.
	auth *atomic.Pointer[string]

	// retired is set (under the model's mu) when a reload took the
	// replica out for good; onDrained runs once its last request in
	// flight has ended (reload.go).
	retired   bool
	onDrained func()
	// forgotten: its metric series were dropped (metrics.forget; guarded
	// by metrics.fmu): no observation brings them back.
	forgotten bool
	// series are its metric series, resolved once per policy
	// (metrics.series).
	series atomic.Pointer[replicaSeries]

	// What the log last said of the replica (guarded by the model's mu),
	// so each change is logged once.
	loggedEjections int
	loggedEjected   bool
	probeFailing    bool
	scrapeFailing   bool
	scrapeFails     int // consecutive failed scrapes
	// servedName is the model_name its /metrics page last reported ("":
	// none); modelMissing is set while it answers 404 to the model's
	// requests (read without mu on the request path, changed under it).
	servedName   string
	modelMissing atomic.Bool
	// What its /v1/models said of the model's context (maxlen.go; guarded
	// by the model's mu): ctxLen its max_model_len (0: not yet), ctxAsked
	// when it was last asked, ctxAsking while a question is out,
	// ctxRestarts the engine's restarts counted when it answered (a
	// restarted engine is asked again), ctxFailing whether the log said
	// its answers fail.
	ctxLen      int
	ctxAsked    time.Time
	ctxAsking   bool
	ctxRestarts int
	ctxFailing  bool
}

// replicaSpec describes a replica to register.
type replicaSpec struct {
	name, url                   string
	maxConcurrency, maxPending  int
	capacity                    int
	kvEvents, kvReplay, kvTopic string
	kvBind                      bool
	group                       string
	role                        gateway.Role
}

// model is one served model: a thin wrapper around its gateway core. The
// core is not safe for concurrent use, so mu serialises every call to it;
// this file is the only one that takes mu (a reload's changes, prepared in
// reload.go, are applied here too), and every core call is told the
// time read under it (so the core's clock never goes backwards).
//
// A request whose Submit (or Retry) is Queued waits on a channel of its own
// (waiters); every core call hands the decisions it returns for queued
// requests to their channels before it unlocks. One goroutine per model
// (runDeadlines) sleeps until the core's next deadline and calls Advance;
// calls that bring the deadline closer nudge it.
type model struct {
	name string
	// policy names the routing policy at start, reloaded the one a reload
	// set since (under mu); read them with policyName.
	policy   string
	reloaded atomic.Pointer[string]
	index    router.IndexMode
	// kvListen is the endpoint bound for the replicas' engines to publish
	// their KV events on, each on its own topic ("" none: kvmux.go).
	kvListen  string
	enc       Encoder
	blockSize int
	// admission is the core's rule at start (the startup notes'); a reload
	// may change the core's.
	admission gateway.Admission
	// maxModelLen is the engines' context in tokens (contextLen): the
	// configured max_model_len, which never changes, else (learnLen) the
	// smallest the replicas' /v1/models gave, 0 until one has.
	// promptBytes bounds the prompts tokenized at the edge (promptLimit),
	// derived from it by tokenize (config.Tokenize.PromptBytesFor).
	maxModelLen atomic.Int64
	learnLen    bool
	promptBytes atomic.Int64
	tokenize    config.Tokenize
	salt        kvblock.Hash
	dns         []config.DNSGroup
	// defaults of a discovered replica
	maxConcurrency, maxPending, capacity int
	start                                time.Time
	nudge                                chan struct{}
	// pdTimeout bounds a remote prefill (pd.prefill_timeout; a reload
	// sets it), in nanoseconds.
	pdTimeout atomic.Int64
	// maxN is max_n, the largest n a request may ask for (a reload sets
	// it).
	maxN atomic.Int64
	// upstreamAuth is the Authorization value every request to the
	// model's engines carries (api_key_file: "Bearer KEY"); nil for none.
	// A reload swaps it.
	upstreamAuth atomic.Pointer[string]
	// series are its metric series, resolved once (metrics.model).
	series atomic.Pointer[modelSeries]

	mu      sync.Mutex
	core    *gateway.Core
	reps    []*replica // by core index
	byName  map[string]*replica
	waiters map[gateway.Ticket]chan granted
	nextID  uint64
	// armed and armedAt are the deadline runDeadlines sleeps until.
	armed   bool
	armedAt time.Duration

	// lastOK is when (Unix nanoseconds) a replica last passed a probe or
	// started an answer: readiness.
	lastOK atomic.Int64
	// log receives the replicas' state changes.
	log *slog.Logger
}

// contextLen is the engines' context in tokens now (0: unknown).
func (m *model) contextLen() int { return int(m.maxModelLen.Load()) }

// promptLimit is the longest prompt, in bytes, tokenized at the edge now.
func (m *model) promptLimit() int { return int(m.promptBytes.Load()) }

// prefillTimeout bounds a remote prefill now.
func (m *model) prefillTimeout() time.Duration {
	if d := time.Duration(m.pdTimeout.Load()); d > 0 {
		return d
	}
	return time.Minute
}

// policyName is the model's routing policy now.
func (m *model) policyName() string {
	if p := m.reloaded.Load(); p != nil {
		return *p
	}
	return m.policy
}

// watch logs r's ejection and readmission, once per change. Call it with
// mu held after a call that may change them.
func (m *model) watch(r *replica, now time.Duration) {
	st := m.core.State(now, r.idx)
	switch {
	case st.Ejections > r.loggedEjections:
		r.loggedEjections, r.loggedEjected = st.Ejections, true
		m.log.Warn("replica ejected", "model", m.name, "replica", r.name, "for", (st.EjectedUntil - now).Round(time.Millisecond).String(), "ejections", st.Ejections)
	case r.loggedEjected && !st.EjectedNow:
		r.loggedEjected = false
		m.log.Info("replica readmitted", "model", m.name, "replica", r.name)
	}
}

// alive records that a replica passed a probe or started an answer.
func (m *model) alive() { m.lastOK.Store(time.Now().UnixNano()) }

// ready reports whether a replica was alive within window of now.
func (m *model) ready(now time.Time, window time.Duration) bool {
	t := m.lastOK.Load()
	return t != 0 && now.UnixNano()-t <= int64(window)
}

// granted is a decision for a queued request, with its replica (and its
// prefill replica under P/D) resolved.
type granted struct {
	d        gateway.Decision
	rep, pre *replica
}

// newModel builds the core of one served model from its configuration; ec
// is the engines' profile (cost_model's estimates, the index's default
// capacity).
// upstreamAuth reads mc's api_key_file: the Authorization value its
// engines ask for, nil without one.
func upstreamAuth(mc *config.Model) (*string, error) {
	if mc.APIKeyFile == "" {
		return nil, nil
	}
	key, err := config.ReadSecret(mc.APIKeyFile)
	if err != nil {
		return nil, fmt.Errorf("model %s: api_key_file: %w", mc.Name, err)
	}
	v := "Bearer " + key
	return &v, nil
}

// authorization is the Authorization value every request to r carries
// (its model's api_key_file), "" for none.
func (r *replica) authorization() string {
	if r == nil || r.auth == nil {
		return ""
	}
	if v := r.auth.Load(); v != nil {
		return *v
	}
	return ""
}

func newModel(c *config.Config, mc *config.Model, enc Encoder, ec engine.Config, start time.Time, trace func(gateway.TraceEvent), log *slog.Logger, led gateway.Ledger) (*model, error) {
	g := gatewayConfig(c, mc, ec)
	g.Trace = trace
	g.Ledger = led // nil: the core's own
	core, err := gateway.New(g)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", mc.Name, err)
	}
	m := &model{
		name: mc.Name, policy: mc.Policy, index: router.IndexMode(mc.Index), enc: enc,
		blockSize: mc.BlockSize, admission: g.Admission, learnLen: g.MaxModelLen == 0, tokenize: c.Tokenize, salt: core.Salt(), dns: mc.DNS,
		maxConcurrency: mc.MaxConcurrency, maxPending: mc.MaxPending, capacity: mc.KVCapacityBlocks,
		start: start, nudge: make(chan struct{}, 1), log: log,
		core: core, byName: map[string]*replica{}, waiters: map[gateway.Ticket]chan granted{},
	}
	m.kvListen = mc.KVEventsListen
	if p := c.EPP.Pool; p.Name != "" && p.KVEventsListen != "" && (p.Model == mc.Name || p.Model == "" && len(c.Models) == 1) {
		m.kvListen = p.KVEventsListen
	}
	m.pdTimeout.Store(int64(mc.PD.PrefillTimeout))
	m.maxN.Store(int64(mc.MaxN))
	auth, err := upstreamAuth(mc)
	if err != nil {
		return nil, err
	}
	m.upstreamAuth.Store(auth)
	m.maxModelLen.Store(int64(g.MaxModelLen))
	m.promptBytes.Store(int64(c.Tokenize.PromptBytes(mc)))
	for j := range mc.Replicas {
		r := &mc.Replicas[j]
		conc, pending := mc.Limits(r)
		if _, err := m.add(replicaSpec{
			name: r.Name, url: r.URL, maxConcurrency: conc, maxPending: pending, capacity: mc.KVCapacity(r),
			kvEvents: r.KVEvents, kvReplay: r.KVEventsReplay, kvTopic: r.KVEventsTopic, kvBind: r.KVEventsBind,
			role: roleOf(r.Role),
		}); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// gatewayConfig is the gateway core's configuration of model mc (but its
// trace and ledger); ec is the engines' profile (cost_model's estimates,
// the index's default capacity).
func gatewayConfig(c *config.Config, mc *config.Model, ec engine.Config) gateway.Config {
	g := gateway.DefaultConfig()
	g.Model = mc.Name
	g.ShadowPolicy = mc.ShadowPolicy
	g.Router = router.Config{
		Policy: mc.Policy,
		Options: router.Options{
			Seed:                c.Seed,
			BlockSize:           mc.BlockSize,
			Profile:             ec.Latency,
			MaxNumBatchedTokens: ec.MaxNumBatchedTokens,
			SessionAffinity:     mc.SessionAffinity,
			TierLoadNsPerToken:  ec.TierLoadNsPerToken(),
		},
		Index:          router.IndexMode(mc.Index),
		SpeculationTTL: 2 * time.Second,
		// The engines' lower KV tiers (the profile's kv_tiers): the index
		// credits a prompt's blocks offloaded there, and cost_model prices
		// their load back, as in the simulator.
		TierBlocks: ec.LowerTierBlocks(),
		// The index's assumption until an engine reports its capacity;
		// admission assumes nothing (its capacity is the configured one,
		// else the engine's report).
		DefaultCapacityBlocks: ec.NumGPUBlocks,
	}
	g.Admission = gateway.Admission(mc.Admission)
	g.Overcommit = mc.Overcommit
	g.OutputQuantile = mc.OutputQuantile
	g.DefaultMaxTokens = mc.DefaultMaxTokens
	g.MaxModelLen = mc.MaxModelLen
	g.MaxAge = c.Scrape.MaxAge
	g.Queue = gateway.Queue{
		MaxRequests: mc.Queue.MaxRequests, MaxBytes: int64(mc.Queue.MaxBytes), Timeout: mc.Queue.Timeout,
		MaxPriority: mc.MaxPriority, ShedOnSLO: mc.Queue.ShedOnSLO,
	}
	g.Health = gateway.Health{EjectAfter: c.Health.EjectAfter, EjectTime: c.Health.EjectTime, MaxEjectTime: c.Health.MaxEjectTime, MaxEjectedShare: c.Health.MaxEjectedShare}
	g.PD.Decider, g.PD.NonCachedTokens, g.PD.MinPromptTokens = mc.PD.Decider, mc.PD.NonCachedTokens, mc.PD.MinPromptTokens
	pdTransfer(&g.PD, ec)
	return g
}

// roleOf reads a validated role ("" is both).
func roleOf(s string) gateway.Role {
	r, _ := gateway.ParseRole(s)
	return r
}

// weighs reports whether the model's admission weighs requests against KV
// capacity.
func (m *model) weighs() bool {
	return m.admission == gateway.AdmitKV || m.admission == gateway.AdmitTokenFlow
}

// unweighed lists the replicas kv admission cannot weigh yet: no configured
// capacity (they are admitted without KV weighing until a scrape reports
// their num_gpu_blocks), and whether discovered ones will be too.
func (m *model) unweighed() (names []string, groups bool) {
	if !m.weighs() {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.reps {
		if m.core.State(m.now(), r.idx).CapacityBlocks == 0 {
			names = append(names, r.name)
		}
	}
	return names, len(m.dns) > 0 && m.capacity == 0
}

// now is the core's time. Call it with mu held.
func (m *model) now() time.Duration { return time.Since(m.start) }

// add registers a replica with the core, or brings back a removed one.
func (m *model) add(sp replicaSpec) (*replica, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addLocked(sp)
}

// addLocked is add with mu held.
func (m *model) addLocked(sp replicaSpec) (*replica, error) {
	u, err := url.Parse(sp.url)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("model %s: replica %q: url %q must be an absolute http(s) URL", m.name, sp.name, sp.url)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	name := sp.name
	if name == "" {
		name = u.Host
	}
	i, err := m.core.AddReplica(gateway.ReplicaConfig{Name: name, MaxInFlight: sp.maxConcurrency, MaxPending: sp.maxPending, CapacityBlocks: sp.capacity, Role: sp.role})
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", m.name, err)
	}
	r, ok := m.byName[name]
	if !ok {
		if i != len(m.reps) {
			return nil, fmt.Errorf("model %s: replica %s: the core gave index %d, want %d", m.name, name, i, len(m.reps))
		}
		r = &replica{idx: i, name: name, base: u, kvEvents: sp.kvEvents, kvReplay: sp.kvReplay, kvTopic: sp.kvTopic, kvBind: sp.kvBind, group: sp.group, role: sp.role, auth: &m.upstreamAuth}
		m.reps = append(m.reps, r)
		m.byName[name] = r
	}
	// A replica back from removal (or new) may take queued requests now:
	// it is in m.reps first, so their decisions resolve to it.
	m.deliver(m.core.Poke(m.now()))
	return r, nil
}

// dropMissing takes out of rotation for good the replicas of DNS group
// group that want does not list; their requests in flight end normally.
func (m *model) dropMissing(group string, want map[string]bool) (removed []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for _, r := range m.reps {
		if r.group == group && !want[r.name] && !m.core.State(now, r.idx).Gone {
			m.deliver(m.core.RemoveReplica(m.now(), r.idx))
			removed = append(removed, r.name)
		}
	}
	if len(removed) > 0 {
		m.settleContextLen(now)
	}
	return removed
}

// modelReload is what a reload changes in one model, prepared and
// checked before anything changes (reload.go).
type modelReload struct {
	core   gateway.Config
	policy string
	// pdTimeout is pd.prefill_timeout.
	pdTimeout time.Duration
	// maxN is max_n.
	maxN int
	// auth is api_key_file's Authorization value, read again.
	auth *string
	// remove are the listed replicas taken out for good, update the staying
	// ones whose caps change, add the new ones.
	remove []*replica
	update []replicaSpec
	add    []replicaSpec
	// drained runs once a removed replica's last request in flight ended.
	drained func(*replica)
}

// reconfigure applies a prepared reload under one hold of mu: the core's
// settings, then the replicas removed (no new request goes there, those in
// flight end there), updated in place (counters, health and index kept)
// and added. It returns the replicas added.
func (m *model) reconfigure(p *modelReload) ([]*replica, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if m.learnLen { // a reload keeps what the engines said
		p.core.ContextLen = m.contextLen()
	}
	o, err := m.core.Reconfigure(now, p.core)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", m.name, err)
	}
	m.deliver(o)
	policy := p.policy
	m.reloaded.Store(&policy)
	if p.pdTimeout > 0 {
		m.pdTimeout.Store(int64(p.pdTimeout))
	}
	if p.maxN > 0 {
		m.maxN.Store(int64(p.maxN))
	}
	m.upstreamAuth.Store(p.auth)
	for _, r := range p.remove {
		m.deliver(m.core.DetachReplica(now, r.idx))
		r.retired = true
		if m.byName[r.name] == r {
			delete(m.byName, r.name)
		}
		if p.drained != nil {
			r.onDrained = func() { p.drained(r) }
		}
		m.drained(r, now)
	}
	if len(p.remove) > 0 {
		m.settleContextLen(now)
	}
	for _, sp := range p.update {
		if _, err := m.addLocked(sp); err != nil {
			return nil, err
		}
	}
	var added []*replica
	for _, sp := range p.add {
		r, err := m.addLocked(sp)
		if err != nil {
			return added, err
		}
		added = append(added, r)
	}
	m.deliver(m.core.Poke(now))
	m.rearm(now)
	return added, nil
}

// drained runs r's onDrained, once, when a reload retired r and its last
// request in flight has ended. Call it with mu held.
func (m *model) drained(r *replica, now time.Duration) {
	if r == nil || !r.retired || r.onDrained == nil || m.core.State(now, r.idx).Load.InFlight > 0 {
		return
	}
	f := r.onDrained
	r.onDrained = nil
	go f()
}

// listed returns the configured replicas in service: neither discovered
// nor retired by a reload.
func (m *model) listed() []*replica {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*replica
	for _, r := range m.reps {
		if r.group == "" && !r.retired {
			out = append(out, r)
		}
	}
	return out
}

// coreConfig is the core's configuration now.
func (m *model) coreConfig() gateway.Config {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.core.Config()
}

// checkReload reports whether the core would take g (reload.go).
func (m *model) checkReload(g gateway.Config) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.core.CheckReconfigure(g)
}

// lookup finds a replica by name.
func (m *model) lookup(name string) *replica {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byName[name]
}

// live returns the replicas discovery has not removed.
func (m *model) live() []*replica {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	var out []*replica
	for _, r := range m.reps {
		if !m.core.State(now, r.idx).Gone {
			out = append(out, r)
		}
	}
	return out
}

// attempt is one request's life in the core, from Submit to its end: its
// ticket, and the replica of its current dispatch. Exactly one of Finished,
// Fail, Abort or Retry ends each dispatch; done says the core no longer
// knows the ticket (ended, or rejected), so nothing is called twice and the
// handler's deferred release can end whatever is still held.
type attempt struct {
	t   gateway.Ticket
	ch  chan granted // the waiter while queued
	rep *replica     // nil until dispatched
	// pre is the prefill replica of a dispatch that prefills remotely
	// (P/D), nil otherwise or once the prefill has ended in the core.
	pre  *replica
	dec  gateway.Decision
	done bool
	// submitted is set once Submit ran; queued sums the waits in the queue,
	// the last of which began at queuedAt.
	submitted bool
	queued    time.Duration
	queuedAt  time.Time
	// watched: the watch of its background response ends it
	// (endWatched), not the handler.
	watched bool
}

// take applies a decision to a: a dispatch names the replica, a rejection
// ends the ticket. Call it with mu held, or with a granted's replica.
func (a *attempt) take(d gateway.Decision, rep, pre *replica) {
	a.t = d.Ticket
	switch d.Kind {
	case gateway.Dispatched:
		a.rep, a.pre, a.dec = rep, pre, d
	case gateway.Rejected:
		a.rep, a.pre, a.done = nil, nil, true
	}
}

// resolve returns the replicas of a decision: its replica and, when it
// prefills remotely, its prefill replica. Call it with mu held.
func (m *model) resolve(d gateway.Decision) (rep, pre *replica) {
	if d.Kind != gateway.Dispatched {
		return nil, nil
	}
	rep = m.reps[d.Replica]
	if d.Prefill >= 0 && d.Prefill < len(m.reps) {
		pre = m.reps[d.Prefill]
	}
	return rep, pre
}

// submit hands a new request to the core. A Queued decision registers a's
// waiter before the lock is released, so no later decision is missed.
func (m *model) submit(a *attempt, req gateway.Request) gateway.Decision {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.nextID++
	req.ID = m.nextID
	d, others := m.core.Submit(now, req)
	a.submitted = true
	m.settle(a, d, now)
	m.deliver(others)
	m.rearm(now)
	return d
}

// retry takes a's dispatch back (it failed before its first byte; fault:
// the replica is to blame) and routes the request again among the replicas
// it has not tried.
func (m *model) retry(a *attempt, fault bool) gateway.Decision {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a.done || a.rep == nil {
		return gateway.Decision{Kind: gateway.Rejected, Ticket: a.t, Status: 502, Reason: gateway.ReasonNoReplica}
	}
	now := m.now()
	d, others := m.core.Retry(now, a.t, fault)
	if fault {
		m.watch(a.rep, now)
	}
	m.drained(a.rep, now)
	m.dropPrefill(a, now)
	a.rep = nil
	m.settle(a, d, now)
	m.deliver(others)
	m.rearm(now)
	return d
}

// settle applies a decision of Submit or Retry to a. Call it with mu held.
func (m *model) settle(a *attempt, d gateway.Decision, now time.Duration) {
	if d.Kind == gateway.Queued {
		// The wait is counted from the core's own clock reading, so that
		// x-inferrail-queued-ms is never short of the queue's timeout.
		a.queuedAt = m.start.Add(now)
		a.t = d.Ticket
		a.ch = make(chan granted, 1)
		m.waiters[d.Ticket] = a.ch
		return
	}
	rep, pre := m.resolve(d)
	a.take(d, rep, pre)
}

// deliver hands the decisions a core call returned for queued requests to
// their waiters. Every queued ticket has one (registered under the same
// lock hold as its Queued decision, removed only by abort, which also
// takes the ticket out of the core), and each channel gets one send into
// its buffer of one, so no send blocks. Call it with mu held.
func (m *model) deliver(decs []gateway.Decision) {
	for _, d := range decs {
		ch, ok := m.waiters[d.Ticket]
		if !ok {
			continue
		}
		delete(m.waiters, d.Ticket)
		rep, pre := m.resolve(d)
		select {
		case ch <- granted{d, rep, pre}:
		default:
		}
	}
}

// rearm nudges runDeadlines when the core's next deadline is now earlier
// than the one it sleeps until. Call it with mu held.
func (m *model) rearm(now time.Duration) {
	at, ok := m.core.NextDeadline(now)
	if !ok || (m.armed && at >= m.armedAt) {
		return
	}
	m.armed, m.armedAt = true, at
	select {
	case m.nudge <- struct{}{}:
	default:
	}
}

// runDeadlines sleeps until the core's next deadline (a queued request's
// timeout, or the end of an ejection while requests wait) and calls
// Advance, until stop is closed. It never polls: with no deadline it waits
// for a nudge.
func (m *model) runDeadlines(stop <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		m.mu.Lock()
		now := m.now()
		at, ok := m.core.NextDeadline(now)
		m.armed, m.armedAt = ok, at
		m.mu.Unlock()
		var fire <-chan time.Time
		if ok {
			t.Reset(at - now)
			fire = t.C
		}
		select {
		case <-stop:
			t.Stop()
			return
		case <-m.nudge:
			t.Stop()
		case <-fire:
			m.mu.Lock()
			m.deliver(m.core.Advance(m.now()))
			m.mu.Unlock()
		}
	}
}

// poke lets the core dispatch what room freed elsewhere now admits (another
// gateway's release in a shared ledger).
func (m *model) poke() {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.deliver(m.core.Poke(now))
	m.rearm(now)
}

// prefillDone records that a's remote prefill answered with the KV's
// transfer parameters: its prefill replica's part ends.
func (m *model) prefillDone(a *attempt) {
	m.alive()
	m.mu.Lock()
	defer m.mu.Unlock()
	if a.done || a.rep == nil || a.pre == nil {
		return
	}
	now := m.now()
	pre := a.pre
	a.pre = nil
	m.deliver(m.core.PrefillDone(now, a.t))
	m.drained(pre, now)
	m.rearm(now)
}

// prefillFailed records that a's remote prefill failed (fault: the prefill
// replica is to blame): the request prefills on its decode replica now.
func (m *model) prefillFailed(a *attempt, fault bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a.done || a.rep == nil || a.pre == nil {
		return
	}
	now := m.now()
	pre := a.pre
	a.pre = nil
	m.deliver(m.core.PrefillFailed(now, a.t, fault))
	if fault {
		m.watch(pre, now)
	}
	m.drained(pre, now)
	m.rearm(now)
}

// dropPrefill forgets a's prefill replica once the core ended its request
// (Fail and Abort end a remote prefill in progress too). Call it with mu
// held.
func (m *model) dropPrefill(a *attempt, now time.Duration) {
	if a.pre != nil {
		m.drained(a.pre, now)
		a.pre = nil
	}
}

// firstByte records the first byte of a's response.
func (m *model) firstByte(a *attempt) {
	m.alive()
	m.mu.Lock()
	defer m.mu.Unlock()
	if a.done || a.rep == nil {
		return
	}
	now := m.now()
	m.deliver(m.core.FirstByte(now, a.t, -1))
}

// finish ends a served request: the replica holds held (the prompt's and
// answer's full blocks) now, and it answered well.
func (m *model) finish(a *attempt, held []kvblock.Hash, u gateway.Usage) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a.done || a.rep == nil {
		return
	}
	a.done = true
	now := m.now()
	m.core.Success(a.rep.idx)
	m.deliver(m.core.Finished(now, a.t, u, held))
	m.drained(a.rep, now)
	m.rearm(now)
}

// hasQueued reports whether requests wait in m's queue.
func (m *model) hasQueued() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.core.Queued() > 0
}

// watched hands a served request's end to the watch of its background
// response (bgwatch.go): it stays in the core, on its replica, until
// endWatched; the handler's end (abort) leaves it.
func (m *model) watched(a *attempt) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a.watched = true
}

// endWatched ends a request whose background response ended (u its usage,
// Known false when its end was not seen): the replica holds held.
func (m *model) endWatched(a *attempt, held []kvblock.Hash, u gateway.Usage) {
	m.mu.Lock()
	a.watched = false
	m.mu.Unlock()
	m.finish(a, held, u)
}

// fail ends a request that failed and is not retried (fault: the replica
// is to blame, which counts toward its ejection); ok says the replica
// answered as it should (a client error), which resets its failures.
func (m *model) fail(a *attempt, fault, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a.done || a.rep == nil {
		return
	}
	a.done = true
	now := m.now()
	if ok {
		m.core.Success(a.rep.idx)
	}
	m.deliver(m.core.Fail(now, a.t, fault))
	if fault {
		m.watch(a.rep, now)
	}
	m.drained(a.rep, now)
	m.dropPrefill(a, now)
	m.rearm(now)
}

// abort ends a request whose client went away (or that the handler gives
// up), queued or dispatched; ok says its replica did nothing wrong. It is a
// no-op once a's ticket ended, so the handler defers it.
func (m *model) abort(a *attempt, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a.done || !a.submitted || a.watched {
		return
	}
	a.done = true
	delete(m.waiters, a.t)
	now := m.now()
	if ok && a.rep != nil {
		m.core.Success(a.rep.idx)
	}
	m.deliver(m.core.Abort(now, a.t))
	m.drained(a.rep, now)
	m.dropPrefill(a, now)
	m.rearm(now)
}

// report applies a scrape of r's engine metrics; the core detects restarts
// from the counters.
func (m *model) report(r *replica, l remote.Load) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.deliver(m.core.Report(now, r.idx, gateway.Report{
		Running: l.Running, Waiting: l.Waiting, KVUsage: l.KVUsage, NumGPUBlocks: l.NumGPUBlocks,
		PrefixQueries: l.PrefixQueries, PrefixHits: l.PrefixHits, Preemptions: l.Preemptions,
	}))
	m.rearm(now)
}

// probe applies an active health check: a failure counts toward ejection
// (within the share cap), a pass resets the count.
func (m *model) probe(r *replica, ok bool, err error) {
	if ok {
		m.alive()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if ok {
		m.core.Success(r.idx)
		if r.probeFailing {
			r.probeFailing = false
			m.log.Info("replica probe passing again", "model", m.name, "replica", r.name)
		}
		m.watch(r, now)
		return
	}
	if !r.probeFailing {
		r.probeFailing = true
		m.log.Warn("replica probe failing", "model", m.name, "replica", r.name, "error", errCause(err))
	}
	m.core.Failure(now, r.idx)
	m.watch(r, now)
	m.rearm(now)
}

// scrapeFailsLogged is how many scrapes in a row must fail before the log
// says so: one slow scrape under load is not a change worth a line.
const scrapeFailsLogged = 3

// scraped logs r's scrapes failing (3 in a row) and recovering, once per
// change, and keeps the model name its page reports (served).
func (m *model) scraped(r *replica, err error, served string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		r.servedName = served
		r.scrapeFails = 0
		if r.scrapeFailing {
			r.scrapeFailing = false
			m.log.Info("replica metrics scrape recovered", "model", m.name, "replica", r.name)
		}
		return
	}
	r.scrapeFails++
	if r.scrapeFails >= scrapeFailsLogged && !r.scrapeFailing {
		r.scrapeFailing = true
		m.log.Warn("replica metrics scrape failing", "model", m.name, "replica", r.name, "error", errCause(err), "in_a_row", r.scrapeFails)
	}
}

// askContextLen reports whether r's /v1/models is to be asked for the
// model's max_model_len now, and if so marks it asked: the length is not
// configured, no question to r is out, r has not answered since its
// engine last restarted, and, when r has not answered the last question,
// none was asked of it within retry.
func (m *model) askContextLen(r *replica, at time.Time, retry time.Duration) bool {
	if !m.learnLen {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.core.State(m.now(), r.idx)
	if r.ctxAsking || st.Gone || r.retired || (r.ctxLen > 0 && r.ctxRestarts == st.Restarts) {
		return false
	}
	if (r.ctxFailing || r.ctxLen == 0) && !r.ctxAsked.IsZero() && at.Sub(r.ctxAsked) < retry {
		return false
	}
	r.ctxAsking, r.ctxAsked = true, at
	return true
}

// learnedContextLen records r's answer to askContextLen's question (its
// max_model_len n, or err) and, when the smallest of the replicas'
// answers changed, gives it to the core (requests longer are refused) and
// to the edge (the tokenization bound). A failure is logged once until r
// answers.
func (m *model) learnedContextLen(r *replica, n int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	r.ctxAsking = false
	if err != nil {
		if !r.ctxFailing {
			r.ctxFailing = true
			m.log.Warn("replica's /v1/models gives no max_model_len: prompts are not checked against the context until a replica's does (or set max_model_len)",
				"model", m.name, "replica", r.name, "error", errCause(err))
		}
		return
	}
	r.ctxFailing = false
	r.ctxLen, r.ctxRestarts = n, m.core.State(now, r.idx).Restarts
	m.settleContextLen(now)
}

// settleContextLen gives the core and the edge the smallest max_model_len
// the model's replicas (those still in rotation) gave, when it changed: at
// an answer, and when a replica leaves. Call it with mu held.
func (m *model) settleContextLen(now time.Duration) {
	if !m.learnLen {
		return
	}
	least := 0
	var said []string
	for _, o := range m.reps {
		if o.ctxLen == 0 || o.retired || m.core.State(now, o.idx).Gone {
			continue
		}
		said = append(said, o.name+" "+strconv.Itoa(o.ctxLen))
		if least == 0 || o.ctxLen < least {
			least = o.ctxLen
		}
	}
	was := m.contextLen()
	if least == was {
		return
	}
	g := m.core.Config()
	g.ContextLen = least
	o, rerr := m.core.Reconfigure(now, g)
	if rerr != nil { // the core took its own configuration with one length changed
		m.log.Error("max_model_len learned from the replicas could not be applied", "model", m.name, "max_model_len", least, "error", rerr)
		return
	}
	m.deliver(o)
	m.rearm(now)
	// Logged before the edge sees the length: whoever reads the new
	// length can find the line that explains it.
	m.log.Info("max_model_len learned from the replicas' /v1/models (the smallest they gave)", "model", m.name, "max_model_len", least, "was", was, "replicas", strings.Join(said, ", "))
	m.maxModelLen.Store(int64(least))
	m.promptBytes.Store(int64(m.tokenize.PromptBytesFor(least)))
}

// answered logs, once per change, r answering 404 to the model's
// requests, the sign of an engine that serves the model under another name
// (vLLM's --served-model-name; the gateway forwards the configured name),
// and its answering again.
func (m *model) answered(r *replica, status int) {
	missing := status == http.StatusNotFound
	if !missing && (status != http.StatusOK || !r.modelMissing.Load()) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.modelMissing.Load() == missing {
		return
	}
	r.modelMissing.Store(missing)
	if !missing {
		m.log.Info("replica serves the model again", "model", m.name, "replica", r.name)
		return
	}
	args := []any{"model", m.name, "replica", r.name}
	if r.servedName != "" && r.servedName != m.name {
		args = append(args, "engine_model_name", r.servedName)
	}
	args = append(args, "hint", "the gateway forwards the configured model name; name the model as the engine serves it (vLLM --served-model-name) and give other names as aliases")
	m.log.Warn("replica answers 404 to this model: the engine does not serve it under this name", args...)
}

// kvEvents feeds r's KV events to the index.
func (m *model) kvEvents(r *replica, evs []gateway.KVEvent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.core.KVEvents(m.now(), r.idx, evs)
}

// resync forgets what the index believed of r (its event stream had a gap
// or a reset).
func (m *model) resync(r *replica) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.core.Resync(r.idx)
}

// inFlight is r's requests in flight as the core counts them.
func (m *model) inFlight(r *replica) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.core.State(m.now(), r.idx).Load.InFlight
}

// candidates counts the replicas a decision can be offered now (healthy,
// not ejected, not removed), before caps and admission.
func (m *model) candidates() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	n := 0
	for _, r := range m.reps {
		if st := m.core.State(now, r.idx); st.Healthy && !st.Gone {
			n++
		}
	}
	return n
}

// healthy reports whether some replica takes requests now.
func (m *model) healthy() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for _, r := range m.reps {
		if m.core.State(now, r.idx).Healthy {
			return true
		}
	}
	return false
}

// replicaSnap is one replica's state for the admin views and metrics.
type replicaSnap struct {
	rep         *replica
	st          gateway.ReplicaState
	indexBlocks int
	ctxLen      int // the max_model_len its /v1/models gave (0: none yet)
}

// modelSnap is a model's state for the admin views and metrics.
type modelSnap struct {
	reps        []replicaSnap // not removed by discovery
	queued      int
	queuedBytes int64
	byClass     []gateway.ClassDepth // queued per priority class, highest first
	indexBytes  int64
	at          time.Duration // the core's time of the snapshot
}

// explain says what the core would decide for req now, and why, deciding
// nothing (POST /admin/explain).
func (m *model) explain(req gateway.Request) gateway.Explanation {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.core.Explain(m.now(), req)
}

// shadowStats is the core's shadow tally; ok is false without a shadow
// policy.
func (m *model) shadowStats() (gateway.ShadowStats, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.core.ShadowStats()
}

func (m *model) snapshot() modelSnap {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	s := modelSnap{queued: m.core.Queued(), queuedBytes: m.core.QueuedBytes(), byClass: m.core.QueuedByClass(nil), indexBytes: m.core.Router().Index().Bytes(), at: now}
	for _, r := range m.reps {
		st := m.core.State(now, r.idx)
		if st.Gone {
			continue
		}
		s.reps = append(s.reps, replicaSnap{rep: r, st: st, indexBlocks: m.core.Router().Index().Blocks(r.idx), ctxLen: r.ctxLen})
	}
	return s
}
