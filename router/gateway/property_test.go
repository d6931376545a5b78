package gateway

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/router"
)

// The property tests drive a Core with random sequences of calls and keep a
// model of every request (queued, pending, streaming, ended), of each
// replica's counters and reservations, and of each (class, tenant) line of
// the queue, and check the core against it after every call.

type opKind uint8

const (
	opSubmit opKind = iota
	opFirstByte
	opFinished
	opRetry
	opFail
	opAbort
	opAdvance
	opReport
	opFailure
	opSuccess
	opRemove
	opAdd
	opStale // a lifecycle call on a request that already ended
)

func (k opKind) String() string {
	return [...]string{"Submit", "FirstByte", "Finished", "Retry", "Fail", "Abort", "Advance", "Report", "Failure", "Success", "RemoveReplica", "AddReplica", "Stale"}[k]
}

// drains reports whether a call of kind k must leave nothing a drain at the
// same time would still dispatch or reject. AddReplica, RemoveReplica and
// Failure are not told the time (or return no decisions) and so cannot.
func (k opKind) drains() bool {
	switch k {
	case opFailure, opSuccess, opRemove, opAdd:
		return false
	}
	return true
}

type op struct {
	kind opKind
	dt   time.Duration // time passing before the call
	pick int           // which request or replica
	req  Request
	seg  uint64 // the prompt's content (0: no block hashes)
	// cachedExtra: FirstByte's cached tokens are the prediction plus this
	// (-1: not known).
	cachedExtra int
	heldExtra   int
	usage       Usage
	fault       bool
	rep         Report
	backwards   bool // the report's counters go backwards (a restart)
	// settle: call Advance at the same time before the call and after it,
	// the second must find nothing to do (work conservation).
	settle bool
}

type scenario struct {
	cfg  Config
	reps [6]ReplicaConfig
	n    int // replicas at the start
	ops  []op
}

var propPolicies = []string{"round_robin", "least_request", "cost_model", "kv_aware", "llmd"}

func genScenario(t *rapid.T, admissions []Admission, maxOps int) scenario {
	var sc scenario
	cfg := testConfig(rapid.SampledFrom(propPolicies).Draw(t, "policy"))
	cfg.Router.Options.Seed = rapid.Uint64().Draw(t, "seed")
	cfg.Router.Options.MaxNumBatchedTokens = 256
	cfg.Admission = rapid.SampledFrom(admissions).Draw(t, "admission")
	cfg.Overcommit = rapid.SampledFrom([]float64{0.5, 1, 1.5}).Draw(t, "overcommit")
	cfg.OutputQuantile = rapid.SampledFrom([]float64{0, 0.5, 0.75, 1}).Draw(t, "output_quantile")
	cfg.OutputMinSamples = rapid.SampledFrom([]int{1, 4, 64}).Draw(t, "output_min_samples")
	cfg.DefaultMaxTokens = rapid.SampledFrom([]int{0, 64}).Draw(t, "default_max_tokens")
	cfg.MaxModelLen = rapid.SampledFrom([]int{0, 1024}).Draw(t, "max_model_len")
	cfg.ContextLen = rapid.SampledFrom([]int{0, 512, 2048}).Draw(t, "context_len")
	cfg.MaxAge = rapid.SampledFrom([]time.Duration{0, 300 * time.Millisecond}).Draw(t, "max_age")
	cfg.Queue.MaxRequests = rapid.SampledFrom([]int{0, 1, 3, 8, 30}).Draw(t, "max_requests")
	cfg.Queue.MaxBytes = int64(rapid.IntRange(500, 8000).Draw(t, "max_bytes"))
	cfg.Queue.Timeout = time.Duration(rapid.IntRange(300, 5000).Draw(t, "timeout_ms")) * time.Millisecond
	cfg.Queue.MaxPriority = rapid.IntRange(0, 3).Draw(t, "max_priority")
	cfg.Queue.ShedOnSLO = rapid.Bool().Draw(t, "shed")
	cfg.Health.EjectAfter = rapid.IntRange(1, 3).Draw(t, "eject_after")
	cfg.Health.EjectTime = time.Duration(rapid.IntRange(50, 1000).Draw(t, "eject_ms")) * time.Millisecond
	cfg.Health.MaxEjectTime = cfg.Health.EjectTime * time.Duration(rapid.SampledFrom([]int{1, 4}).Draw(t, "eject_max"))
	cfg.Health.MaxEjectedShare = rapid.SampledFrom([]float64{0, 0.5, 1}).Draw(t, "eject_share")
	cfg.Peers.LLMDMaxConcurrency = rapid.IntRange(1, 3).Draw(t, "llmd_concurrency")
	cfg.Peers.DynamoQueueThreshold = rapid.SampledFrom([]float64{0.5, 1, 2}).Draw(t, "dynamo_threshold")
	sc.cfg = cfg
	for i := range sc.reps {
		sc.reps[i] = ReplicaConfig{
			Name:           fmt.Sprintf("r%d", i),
			CapacityBlocks: rapid.IntRange(20, 300).Draw(t, "capacity"),
			MaxInFlight:    rapid.SampledFrom([]int{0, 0, 1, 3}).Draw(t, "max_in_flight"),
			MaxPending:     rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(t, "max_pending"),
		}
	}
	sc.n = rapid.IntRange(1, 6).Draw(t, "replicas")
	n := rapid.IntRange(maxOps/4, maxOps).Draw(t, "n_ops")
	sc.ops = rapid.SliceOfN(rapid.Custom(genOp), n, n).Draw(t, "ops")
	return sc
}

func genOp(t *rapid.T) op {
	var o op
	w := rapid.IntRange(0, 99).Draw(t, "kind")
	switch {
	case w < 30:
		o.kind = opSubmit
	case w < 40:
		o.kind = opFirstByte
	case w < 52:
		o.kind = opFinished
	case w < 57:
		o.kind = opRetry
	case w < 61:
		o.kind = opFail
	case w < 66:
		o.kind = opAbort
	case w < 76:
		o.kind = opAdvance
	case w < 83:
		o.kind = opReport
	case w < 88:
		o.kind = opFailure
	case w < 90:
		o.kind = opSuccess
	case w < 93:
		o.kind = opRemove
	case w < 96:
		o.kind = opAdd
	default:
		o.kind = opStale
	}
	o.dt = time.Duration(rapid.SampledFrom([]int{0, 0, 1, 10, 50, 200, 700, 2000}).Draw(t, "dt_ms")) * time.Millisecond
	o.pick = rapid.IntRange(0, 1<<20).Draw(t, "pick")
	o.settle = rapid.IntRange(0, 3).Draw(t, "settle") == 0
	switch o.kind {
	case opSubmit:
		p := rapid.IntRange(1, 600).Draw(t, "prompt")
		o.req = Request{
			PromptTokens: p,
			PromptKnown:  rapid.IntRange(0, 9).Draw(t, "known") > 0,
			MaxTokens:    rapid.SampledFrom([]int{0, 1, 16, 100, 300}).Draw(t, "max_tokens"),
			PrefillOnly:  rapid.IntRange(0, 7).Draw(t, "prefill_only") == 0,
			Priority:     rapid.IntRange(-1, 4).Draw(t, "priority"),
			Tenant:       rapid.SampledFrom([]string{"", "a", "b", "c"}).Draw(t, "tenant"),
			TenantWeight: rapid.IntRange(0, 3).Draw(t, "tenant_weight"),
			Bytes:        int64(rapid.IntRange(0, 800).Draw(t, "bytes")),
			Timeout:      time.Duration(rapid.SampledFrom([]int{0, 0, 100, 1000, 6000}).Draw(t, "req_timeout_ms")) * time.Millisecond,
			NoQueue:      rapid.IntRange(0, 9).Draw(t, "no_queue") == 0,
			Session:      uint64(rapid.IntRange(0, 3).Draw(t, "session")),
		}
		if o.req.PromptKnown && rapid.IntRange(0, 3).Draw(t, "hashed") > 0 {
			o.seg = uint64(rapid.IntRange(1, 5).Draw(t, "segment"))
		}
	case opFirstByte:
		o.cachedExtra = rapid.SampledFrom([]int{-1, 0, 5, 16, 100, 1000}).Draw(t, "cached_extra")
	case opFinished:
		o.heldExtra = rapid.SampledFrom([]int{0, 0, 16, 100}).Draw(t, "held_extra")
		if rapid.Bool().Draw(t, "usage_known") {
			o.usage = Usage{Known: true, CompletionTokens: rapid.IntRange(0, 400).Draw(t, "completion")}
		}
	case opRetry, opFail:
		o.fault = rapid.Bool().Draw(t, "fault")
	case opReport:
		o.rep = Report{
			Running:      rapid.IntRange(0, 10).Draw(t, "running"),
			Waiting:      rapid.IntRange(0, 10).Draw(t, "waiting"),
			KVUsage:      rapid.Float64Range(0, 1).Draw(t, "kv_usage"),
			NumGPUBlocks: rapid.SampledFrom([]int{0, 100, 200}).Draw(t, "num_gpu_blocks"),
		}
		o.backwards = rapid.IntRange(0, 5).Draw(t, "backwards") == 0
	}
	return o
}

type mstate uint8

const (
	mNew mstate = iota
	mQueued
	mPending
	mStreaming
	mRetrying // Retry called: its attempt is taken back
	mEnded
)

type lineKey struct {
	prio   int
	tenant string
}

type mreq struct {
	t         Ticket
	req       Request
	seg       uint64
	st        mstate
	line      lineKey
	submitted time.Duration
	deadline  time.Duration
	replica   int
	weight    int
	predicted int
	tried     map[int]bool
}

type runner struct {
	t        *rapid.T
	sc       *scenario
	cfg      Config
	c        *Core
	now      time.Duration
	step     int
	cur      opKind
	reqs     []*mreq
	byT      map[Ticket]*mreq
	seen     map[Ticket]bool
	lines    map[lineKey][]*mreq
	added    int
	gone     [6]bool
	reported [6][3]int64 // the last reported counters
	log      []Decision
	// answers counts the known usages Finished was told (the output
	// estimate's samples).
	answers int
	// longest is the longest of those answers (what an output estimate
	// can reach).
	longest int
	// dispatched: the requests this call dispatched, for strict priority
	// (a retried request, re-routed at once, is exempt).
	dispatched []*mreq
	exempt     *mreq
	// subjDecided: the call's subject was decided (at most once a call).
	subjDecided bool
}

func (r *runner) fatalf(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("op %d (%v) at %v: %s", r.step, r.cur, r.now, fmt.Sprintf(format, args...))
}

func newRunner(t *rapid.T, sc *scenario) *runner {
	c, err := New(sc.cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := &runner{t: t, sc: sc, cfg: c.Config(), c: c, byT: map[Ticket]*mreq{}, seen: map[Ticket]bool{}, lines: map[lineKey][]*mreq{}}
	for range sc.n {
		r.addNew()
	}
	return r
}

func (r *runner) addNew() {
	i, err := r.c.AddReplica(r.sc.reps[r.added])
	if err != nil || i != r.added {
		r.fatalf("AddReplica(%s) = %d, %v", r.sc.reps[r.added].Name, i, err)
	}
	r.added++
}

// maxTokens and weight restate the documented weight: every block of the
// prompt and max_tokens but the cached ones (tokenflow: no cache credit).
func (r *runner) maxTokens(q Request) int {
	switch {
	case q.PrefillOnly: // an embedding: its prompt alone
		return 0
	case q.MaxTokens > 0:
		return q.MaxTokens
	case r.cfg.DefaultMaxTokens > 0:
		return r.cfg.DefaultMaxTokens
	case r.cfg.MaxModelLen > 0:
		return max(0, r.cfg.MaxModelLen-q.PromptTokens)
	}
	return 0
}

func (r *runner) weightOut(m *mreq, cached, out int) int {
	if r.cfg.Admission == AdmitTokenFlow {
		cached = 0
	}
	total := (m.req.PromptTokens + out + 15) / 16
	return max(1, total-cached/16)
}

func (r *runner) weight(m *mreq, cached int) int { return r.weightOut(m, cached, r.maxTokens(m.req)) }

// learns reports whether the core may reserve less than max_tokens for the
// output once it has seen answers (OutputQuantile).
func (r *runner) learns() bool {
	return r.cfg.OutputQuantile > 0 && r.cfg.Admission != AdmitTokenFlow && r.answers > 0
}

// checkWeight checks a reservation of m predicted (or found) to hold cached
// of its prompt: exactly the prompt's uncached blocks and max_tokens, or,
// once answers are learned, between the prompt's alone and that (and with
// no bound on the output at all, up to the longest answer learned).
func (r *runner) checkWeight(m *mreq, cached, w int, what string) {
	hi := r.weight(m, cached)
	lo := hi
	if r.learns() && !m.req.PrefillOnly {
		lo = r.weightOut(m, cached, 0)
		if r.maxTokens(m.req) == 0 {
			hi = r.weightOut(m, cached, r.longest)
		}
	}
	if w < lo || w > hi {
		r.fatalf("%s of id %d (prompt %d, max_tokens %d, cached %d): weight %d, want [%d, %d]", what, m.req.ID, m.req.PromptTokens, r.maxTokens(m.req), cached, w, lo, hi)
	}
}

func (r *runner) healthy(i int) bool { return r.c.State(r.now, i).Healthy }

func (r *runner) anyHealthy() bool {
	for i := range r.added {
		if r.healthy(i) {
			return true
		}
	}
	return false
}

type repCounts struct {
	inFlight, pending, pendingPrompt, pendingPrefill, inFlightPrompt, reserved, reservations int
}

func (r *runner) counts(i int) repCounts {
	var k repCounts
	for _, m := range r.reqs {
		if (m.st != mPending && m.st != mStreaming) || m.replica != i {
			continue
		}
		k.inFlight++
		k.inFlightPrompt += m.req.PromptTokens
		k.reserved += m.weight
		k.reservations++
		if m.st == mPending {
			k.pending++
			k.pendingPrompt += m.req.PromptTokens
			k.pendingPrefill += m.req.PromptTokens - m.predicted
		}
	}
	return k
}

func (r *runner) pickReq(pick int, ok func(*mreq) bool) *mreq {
	var c []*mreq
	for _, m := range r.reqs {
		if ok(m) {
			c = append(c, m)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[pick%len(c)]
}

func (r *runner) removeFromLine(m *mreq) {
	l := r.lines[m.line]
	i := slices.Index(l, m)
	if i < 0 {
		r.fatalf("ticket %v queued but not in its line", m.t)
	}
	r.lines[m.line] = slices.Delete(l, i, i+1)
}

// decide applies one decision to the model and checks it. subj is the
// request the call was about (Submit's or Retry's), which alone may be
// decided without being queued; submit says the call was a Submit.
func (r *runner) decide(d Decision, subj *mreq, submit bool) {
	r.log = append(r.log, d)
	m := r.byT[d.Ticket]
	if m == nil {
		r.fatalf("decision %+v names an unknown ticket", d)
	}
	if m != subj && m.st != mQueued {
		r.fatalf("decision %+v for a request in state %d (decided twice?)", d, m.st)
	}
	if m == subj {
		if r.subjDecided {
			r.fatalf("decision %+v: the call's request decided twice", d)
		}
		r.subjDecided = true
	}
	if d.ID != m.req.ID {
		r.fatalf("decision %+v: ID, want %d", d, m.req.ID)
	}
	switch d.Kind {
	case Dispatched:
		if m.st == mQueued {
			if l := r.lines[m.line]; len(l) == 0 || l[0] != m {
				if len(l) == 0 {
					r.fatalf("dispatched queued ticket %v missing from its line", m.t)
				}
				r.fatalf("FIFO: dispatched ticket %v (id %d) of line %+v before id %d", m.t, m.req.ID, m.line, l[0].req.ID)
			}
			r.lines[m.line] = r.lines[m.line][1:]
		} else if submit && len(r.lines[m.line]) > 0 {
			r.fatalf("FIFO: new request id %d dispatched ahead of %d queued in its line %+v", m.req.ID, len(r.lines[m.line]), m.line)
		}
		i := d.Replica
		if i < 0 || i >= r.added || r.gone[i] || !r.healthy(i) {
			r.fatalf("dispatched %+v to an unknown, gone or unhealthy replica", d)
		}
		if m.tried[i] {
			r.fatalf("dispatched %+v to a replica it already tried", d)
		}
		if d.Name != r.sc.reps[i].Name {
			r.fatalf("dispatched %+v: name, want %s", d, r.sc.reps[i].Name)
		}
		k, rc := r.counts(i), r.sc.reps[i]
		if rc.MaxInFlight > 0 && k.inFlight >= rc.MaxInFlight || rc.MaxPending > 0 && k.pending >= rc.MaxPending {
			r.fatalf("dispatched %+v past the replica's caps (%+v, in flight %d, pending %d)", d, rc, k.inFlight, k.pending)
		}
		p := d.PredictedCachedTokens
		if p < 0 || p%16 != 0 || p > max(0, (m.req.PromptTokens-1)/16*16) || m.req.BlockHashes == nil && p != 0 {
			r.fatalf("dispatched %+v: impossible prediction for a %d-token prompt (hashed %v)", d, m.req.PromptTokens, m.req.BlockHashes != nil)
		}
		r.checkWeight(m, p, d.Weight, "dispatch")
		if d.Queued != r.now-m.submitted {
			r.fatalf("dispatched %+v: queued, want %v", d, r.now-m.submitted)
		}
		m.st, m.replica, m.weight, m.predicted = mPending, i, d.Weight, p
		m.tried[i] = true
		if m != r.exempt {
			r.dispatched = append(r.dispatched, m)
		}
	case Queued:
		if m != subj {
			r.fatalf("Queued %+v for a request the call was not about", d)
		}
		m.st = mQueued
		if submit {
			r.lines[m.line] = append(r.lines[m.line], m)
		} else {
			r.lines[m.line] = append([]*mreq{m}, r.lines[m.line]...) // a retry: the head of its line
		}
	case Rejected:
		if m.st == mQueued {
			r.removeFromLine(m)
		}
		r.checkRejection(d, m)
		m.st = mEnded
	default:
		r.fatalf("decision %+v: unknown kind", d)
	}
}

func (r *runner) checkRejection(d Decision, m *mreq) {
	if d.Reason == "" {
		r.fatalf("rejection %+v without a reason", d)
	}
	switch d.Status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		hi := max(time.Second, r.cfg.Queue.Timeout.Round(time.Second))
		if d.RetryAfter < time.Second || d.RetryAfter > hi || d.RetryAfter%time.Second != 0 {
			r.fatalf("rejection %+v: retry-after not whole seconds in [1s, %v]", d, hi)
		}
	case http.StatusBadGateway, http.StatusBadRequest:
	default:
		r.fatalf("rejection %+v: status", d)
	}
	if d.Queued != r.now-m.submitted {
		r.fatalf("rejection %+v: queued, want %v", d, r.now-m.submitted)
	}
	switch d.Reason {
	case ReasonNoCapacity, ReasonQueueFull, ReasonSLOShed:
		if d.Status != http.StatusTooManyRequests {
			r.fatalf("rejection %+v: status, want 429", d)
		}
	}
	switch d.Reason {
	case ReasonQueueTimeout:
		if r.cur != opAdvance {
			r.fatalf("queue_timeout %+v outside Advance", d)
		}
		if m.deadline > r.now {
			r.fatalf("queue_timeout %+v before its deadline %v", d, m.deadline)
		}
		if want := map[bool]int{true: 429, false: 503}[r.anyHealthy()]; d.Status != want {
			r.fatalf("queue_timeout %+v: status, want %d", d, want)
		}
	case ReasonNoReplica:
		if r.cur == opRetry && m.st == mRetrying {
			if d.Status != http.StatusBadGateway {
				r.fatalf("retry's no_replica %+v: status, want 502", d)
			}
		} else if want := map[bool]int{true: 429, false: 503}[r.anyHealthy()]; d.Status != want {
			r.fatalf("no_replica %+v: status, want %d", d, want)
		}
		for i := range r.added {
			if r.healthy(i) && !m.tried[i] {
				r.fatalf("no_replica %+v though healthy replica %d is untried", d, i)
			}
		}
	case ReasonNoCapacity:
		if !m.req.NoQueue && r.cfg.Queue.MaxRequests != 0 {
			r.fatalf("no_capacity %+v for a request that may queue", d)
		}
	case ReasonQueueFull, ReasonSLOShed:
		// queue_full is checked by the caller, which knows the queue
		// before the call.
		if d.Reason == ReasonSLOShed && !r.cfg.Queue.ShedOnSLO {
			r.fatalf("slo_shed %+v without ShedOnSLO", d)
		}
	default:
		r.fatalf("rejection %+v: unexpected reason", d)
	}
}

func (r *runner) decideAll(ds []Decision) {
	for _, d := range slices.Clone(ds) {
		r.decide(d, nil, false)
	}
}

func (r *runner) tooLong(q Request) bool {
	limit := r.cfg.MaxModelLen
	if limit == 0 {
		limit = r.cfg.ContextLen // the engines' own length: checked, never weighed
	}
	out := max(q.MaxTokens, 1)
	if q.PrefillOnly {
		out = 0
	}
	return limit > 0 && q.PromptKnown && q.PromptTokens+out > limit
}

func (r *runner) lineOf(q Request) lineKey {
	if r.cfg.Admission == AdmitTokenFlow {
		return lineKey{}
	}
	return lineKey{min(max(q.Priority, 0), r.cfg.Queue.MaxPriority), q.Tenant}
}

func (r *runner) run(o op) {
	r.now += o.dt
	r.dispatched, r.exempt = r.dispatched[:0], nil
	if o.settle && o.kind.drains() {
		r.cur = opAdvance
		r.decideAll(r.c.Advance(r.now))
		r.checkInvariants()
		r.dispatched = r.dispatched[:0]
	}
	r.cur = o.kind
	r.subjDecided = false
	r.apply(o)
	r.checkInvariants()
	if o.settle && o.kind.drains() {
		r.cur = opAdvance
		r.dispatched = r.dispatched[:0]
		ds := slices.Clone(r.c.Advance(r.now))
		r.decideAll(ds)
		timedOut := slices.ContainsFunc(ds, func(d Decision) bool { return d.Reason == ReasonQueueTimeout })
		if !timedOut && len(ds) > 0 {
			r.fatalf("%v left work a drain at the same time does: %+v", o.kind, ds)
		}
		r.checkInvariants()
	}
}

// apply makes one call and applies its decisions to the model.
func (r *runner) apply(o op) {
	switch o.kind {
	case opSubmit:
		q := o.req
		q.ID = uint64(r.step + 1)
		if o.seg != 0 {
			q.BlockHashes = hashesOf(o.seg, q.PromptTokens)
		}
		timeout := r.cfg.Queue.Timeout
		if q.Timeout > 0 {
			timeout = min(timeout, q.Timeout)
		}
		m := &mreq{req: q, seg: o.seg, line: r.lineOf(q), submitted: r.now, deadline: r.now + timeout, replica: -1, tried: map[int]bool{}}
		queued, bytes := r.c.Queued(), r.c.QueuedBytes()
		d, others := r.c.Submit(r.now, q)
		if d.Kind == Rejected && d.Reason == ReasonTooLong {
			if !r.tooLong(q) || d.Ticket != 0 || d.Status != http.StatusBadRequest || len(others) != 0 || d.ID != q.ID {
				r.fatalf("too_long %+v (others %v) for %+v", d, others, q)
			}
			r.log = append(r.log, d)
			return
		}
		if r.tooLong(q) {
			r.fatalf("request %+v longer than max_model_len %d (context %d) not rejected: %+v", q, r.cfg.MaxModelLen, r.cfg.ContextLen, d)
		}
		if d.Ticket == 0 || r.seen[d.Ticket] {
			r.fatalf("Submit gave ticket %v (zero or reused)", d.Ticket)
		}
		m.t = d.Ticket
		r.seen[m.t], r.byT[m.t] = true, m
		r.reqs = append(r.reqs, m)
		// Other requests the drain dispatched came before this one in its
		// line: apply them first.
		for _, od := range slices.Clone(others) {
			r.decide(od, m, true)
		}
		r.decide(d, m, true)
		if !r.subjDecided {
			r.fatalf("Submit's own decision %+v not applied", d)
		}
		switch d.Reason {
		case ReasonQueueFull:
			if !(queued >= r.cfg.Queue.MaxRequests || bytes+q.Bytes > r.cfg.Queue.MaxBytes) {
				r.fatalf("queue_full %+v with %d queued (%d bytes) of %d (%d)", d, queued, bytes, r.cfg.Queue.MaxRequests, r.cfg.Queue.MaxBytes)
			}
		case ReasonNoReplica:
			if r.anyHealthy() {
				r.fatalf("new request rejected %+v with a healthy replica", d)
			}
		}
	case opFirstByte:
		m := r.pickReq(o.pick, func(m *mreq) bool { return m.st == mPending })
		if m == nil {
			return
		}
		m.st = mStreaming
		cached := -1
		if o.cachedExtra >= 0 {
			// At least what was predicted, so the reservation only shrinks.
			cached = min(m.predicted+o.cachedExtra, m.req.PromptTokens)
		}
		before := r.c.State(r.now, m.replica).ReservedBlocks
		ds := slices.Clone(r.c.FirstByte(r.now, m.t, cached))
		// The reconciled reservation: what the replica's changed by, less
		// what the drain dispatched there.
		w := r.c.State(r.now, m.replica).ReservedBlocks - before + m.weight
		for _, d := range ds {
			if d.Kind == Dispatched && d.Replica == m.replica {
				w -= d.Weight
			}
		}
		if cached < 0 && w != m.weight {
			r.fatalf("FirstByte without cached changed id %d's reservation %d to %d", m.req.ID, m.weight, w)
		}
		if cached >= 0 {
			r.checkWeight(m, cached, w, "reconciled reservation")
			if w > m.weight {
				r.fatalf("FirstByte found %d cached of id %d, predicted %d, and grew its reservation %d to %d", cached, m.req.ID, m.predicted, m.weight, w)
			}
		}
		m.weight = w
		r.decideAll(ds)
	case opFinished:
		m := r.pickReq(o.pick, func(m *mreq) bool { return m.st == mPending || m.st == mStreaming })
		if m == nil {
			return
		}
		m.st = mEnded
		held := m.req.BlockHashes
		if m.seg != 0 && o.heldExtra > 0 {
			held = hashesOf(m.seg, m.req.PromptTokens+o.heldExtra)
		}
		if o.usage.Known && o.usage.CompletionTokens > 0 && !m.req.PrefillOnly {
			r.answers++
			r.longest = max(r.longest, o.usage.CompletionTokens)
		}
		r.decideAll(r.c.Finished(r.now, m.t, o.usage, held))
	case opRetry:
		m := r.pickReq(o.pick, func(m *mreq) bool { return m.st == mPending })
		if m == nil {
			return
		}
		m.st = mRetrying
		r.exempt = m
		d, others := r.c.Retry(r.now, m.t, o.fault)
		others = slices.Clone(others)
		// The retried request heads its line: apply its decision first.
		r.decide(d, m, false)
		for _, od := range others {
			r.decide(od, nil, false)
		}
	case opFail:
		m := r.pickReq(o.pick, func(m *mreq) bool { return m.st == mPending || m.st == mStreaming })
		if m == nil {
			return
		}
		m.st = mEnded
		r.decideAll(r.c.Fail(r.now, m.t, o.fault))
	case opAbort:
		m := r.pickReq(o.pick, func(m *mreq) bool { return m.st == mQueued || m.st == mPending || m.st == mStreaming })
		if m == nil {
			return
		}
		if m.st == mQueued {
			r.removeFromLine(m)
		}
		m.st = mEnded
		r.decideAll(r.c.Abort(r.now, m.t))
	case opAdvance:
		r.decideAll(r.c.Advance(r.now))
		for _, m := range r.reqs {
			if m.st == mQueued && m.deadline <= r.now {
				r.fatalf("ticket %v still queued past its deadline %v", m.t, m.deadline)
			}
		}
	case opReport:
		i := o.pick % r.added
		k := &r.reported[i]
		for j := range k {
			if o.backwards && k[j] > 0 {
				k[j] -= int64(1 + o.pick%3)
				k[j] = max(0, k[j])
			} else {
				k[j] += int64(o.pick % 7)
			}
		}
		rep := o.rep
		rep.PrefixQueries, rep.PrefixHits, rep.Preemptions = k[0], k[1], k[2]
		r.decideAll(r.c.Report(r.now, i, rep))
	case opFailure:
		i := o.pick % r.added
		ej := r.c.Failure(r.now, i)
		r.log = append(r.log, Decision{ID: uint64(i), Reason: fmt.Sprint("failure ", ej)})
		if ej {
			ejected, total := 0, 0
			for j := range r.added {
				if !r.gone[j] {
					total++
					if r.c.State(r.now, j).EjectedNow {
						ejected++
					}
				}
			}
			if float64(ejected) > r.cfg.Health.MaxEjectedShare*float64(total) {
				r.fatalf("ejected %d of %d replicas, share %v", ejected, total, r.cfg.Health.MaxEjectedShare)
			}
		}
	case opSuccess:
		r.c.Success(o.pick % r.added)
	case opRemove:
		i := o.pick % r.added
		r.gone[i] = true
		r.decideAll(r.c.RemoveReplica(r.now, i))
	case opAdd:
		var removed []int
		for i := range r.added {
			if r.gone[i] {
				removed = append(removed, i)
			}
		}
		switch {
		case len(removed) > 0 && (o.pick%2 == 0 || r.added == len(r.sc.reps)):
			i := removed[o.pick%len(removed)]
			if got, err := r.c.AddReplica(r.sc.reps[i]); err != nil || got != i {
				r.fatalf("re-adding %s: %d, %v", r.sc.reps[i].Name, got, err)
			}
			r.gone[i] = false
		case r.added < len(r.sc.reps):
			r.addNew()
		}
	case opStale:
		m := r.pickReq(o.pick, func(m *mreq) bool { return m.st == mEnded })
		if m == nil {
			return
		}
		var out []Decision
		switch o.pick % 5 {
		case 0:
			out = r.c.FirstByte(r.now, m.t, 0)
		case 1:
			out = r.c.Finished(r.now, m.t, Usage{}, nil)
		case 2:
			out = r.c.Fail(r.now, m.t, true)
		case 3:
			out = r.c.Abort(r.now, m.t)
		case 4:
			var d Decision
			d, out = r.c.Retry(r.now, m.t, true)
			if d.Kind != Rejected {
				r.fatalf("Retry of an ended request: %+v", d)
			}
		}
		if len(out) != 0 {
			r.fatalf("a call on ended ticket %v decided %+v", m.t, out)
		}
	}
}

// checkInvariants compares the core with the model after a call.
func (r *runner) checkInvariants() {
	r.t.Helper()
	for i := range r.added {
		s := r.c.State(r.now, i)
		k := r.counts(i)
		l := s.Load
		got := repCounts{l.InFlight, l.Pending, l.PendingPromptTokens, l.PendingPrefillTokens, l.InFlightPromptTokens, s.ReservedBlocks, k.reservations}
		if got != k {
			r.fatalf("replica %d: counters %+v, model %+v", i, got, k)
		}
		if s.Gone != r.gone[i] {
			r.fatalf("replica %d: gone %v, model %v", i, s.Gone, r.gone[i])
		}
		if s.Healthy != (!s.Gone && !s.EjectedNow) || s.EjectedNow != (r.now < s.EjectedUntil) {
			r.fatalf("replica %d: healthy %v, gone %v, ejected now %v (until %v)", i, s.Healthy, s.Gone, s.EjectedNow, s.EjectedUntil)
		}
		capb := float64(r.sc.reps[i].CapacityBlocks)
		switch r.cfg.Admission {
		case AdmitKV:
			if k.reservations > 1 && float64(s.ReservedBlocks) > capb*r.cfg.Overcommit {
				r.fatalf("replica %d: %d blocks reserved by %d requests > capacity %v x %v", i, s.ReservedBlocks, k.reservations, capb, r.cfg.Overcommit)
			}
		case AdmitTokenFlow:
			if k.reservations > 1 && float64(s.ReservedBlocks) > capb {
				r.fatalf("replica %d: %d blocks reserved by %d requests > capacity %v", i, s.ReservedBlocks, k.reservations, capb)
			}
		case AdmitLLMDConcurrency:
			if l.InFlight > r.cfg.Peers.LLMDMaxConcurrency {
				r.fatalf("replica %d: %d in flight > %d", i, l.InFlight, r.cfg.Peers.LLMDMaxConcurrency)
			}
		}
	}
	queued, bytes, minDL := 0, int64(0), time.Duration(-1)
	for _, m := range r.reqs {
		if m.st == mQueued {
			queued++
			bytes += m.req.Bytes
			if minDL < 0 || m.deadline < minDL {
				minDL = m.deadline
			}
		}
	}
	if r.c.Queued() != queued || r.c.QueuedBytes() != bytes {
		r.fatalf("Queued() = %d (%d bytes), model %d (%d bytes)", r.c.Queued(), r.c.QueuedBytes(), queued, bytes)
	}
	n := 0
	for _, l := range r.lines {
		n += len(l)
	}
	if n != queued {
		r.fatalf("model lines hold %d, %d queued", n, queued)
	}
	// Strict priority: nothing this call dispatched jumped a request of a
	// higher class that is still queued.
	for _, d := range r.dispatched {
		for _, m := range r.reqs {
			if m.st == mQueued && m.line.prio > d.line.prio {
				r.fatalf("priority %d request id %d dispatched while priority %d id %d waits", d.line.prio, d.req.ID, m.line.prio, m.req.ID)
			}
		}
	}
	at, ok := r.c.NextDeadline(r.now)
	switch {
	case queued == 0 && ok:
		r.fatalf("NextDeadline = %v with nothing queued", at)
	case queued > 0 && (!ok || at > minDL):
		r.fatalf("NextDeadline = %v, %v; earliest queued deadline %v", at, ok, minDL)
	case queued > 0 && at < minDL:
		ej := false
		for i := range r.added {
			s := r.c.State(r.now, i)
			ej = ej || !s.Gone && s.EjectedUntil == at && at > r.now
		}
		if !ej {
			r.fatalf("NextDeadline = %v before the earliest deadline %v and no ejection ends then", at, minDL)
		}
	}
	r.log = append(r.log, Decision{Reason: "next", Queued: at, ID: uint64(queued)})
}

// finish aborts every request still live and checks the core is empty.
func (r *runner) finish() {
	r.cur = opAbort
	for {
		m := r.pickReq(0, func(m *mreq) bool { return m.st == mQueued || m.st == mPending || m.st == mStreaming })
		if m == nil {
			break
		}
		if m.st == mQueued {
			r.removeFromLine(m)
		}
		m.st = mEnded
		r.dispatched = r.dispatched[:0]
		r.decideAll(r.c.Abort(r.now, m.t))
		r.checkInvariants()
	}
	for i := range r.added {
		s := r.c.State(r.now, i)
		if s.Load != (router.Load{Engine: s.Load.Engine}) || s.ReservedBlocks != 0 {
			r.fatalf("replica %d not empty once every request ended: %+v, %d reserved", i, s.Load, s.ReservedBlocks)
		}
	}
	if r.c.Queued() != 0 || r.c.QueuedBytes() != 0 {
		r.fatalf("queue not empty once every request ended: %d (%d bytes)", r.c.Queued(), r.c.QueuedBytes())
	}
	for _, m := range r.reqs {
		if m.st != mEnded {
			r.fatalf("ticket %v never ended", m.t)
		}
	}
}

func runScenario(t *rapid.T, sc *scenario) []Decision {
	r := newRunner(t, sc)
	for i, o := range sc.ops {
		r.step = i
		r.run(o)
	}
	r.step = len(sc.ops)
	r.finish()
	return r.log
}

// TestPropertyCore drives cores under every admission mode with random
// calls and checks, after each: the counters and reservations against the
// model; that kv (tokenflow) admission never reserves more than capacity x
// overcommit (capacity) on a replica holding more than one request; that
// every decision names a live ticket in a state that allows it (so each
// request ends once); FIFO inside each (class, tenant); strict priority; the
// rejections' reasons, statuses and Retry-After; queue deadlines and
// NextDeadline; that every call that is told the time leaves nothing a drain
// would do; and, replaying the calls on a second core, determinism.
func TestPropertyCore(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t, []Admission{AdmitKV, AdmitKV, AdmitKV, AdmitTokenFlow, AdmitNone, AdmitLLMDConcurrency, AdmitLLMDUtilization, AdmitDynamo}, 150)
		a := runScenario(t, &sc)
		b := runScenario(t, &sc)
		if !slices.Equal(a, b) {
			for i := range min(len(a), len(b)) {
				if a[i] != b[i] {
					t.Fatalf("not deterministic: decision %d is %+v then %+v", i, a[i], b[i])
				}
			}
			t.Fatalf("not deterministic: %d then %d decisions", len(a), len(b))
		}
	})
}

// TestPropertyKVAdmission is TestPropertyCore under kv admission only, with
// longer runs.
func TestPropertyKVAdmission(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t, []Admission{AdmitKV}, 300)
		runScenario(t, &sc)
	})
}

// TestPropertyFairShare: k tenants of one class, backlogged, with weights
// w_i, on one replica that takes one request at a time. Over every prefix
// of the dispatches (while all stay backlogged) each tenant's count is
// within one quantum (w_i) of its weighted share, and every window of
// 2*sum(w) dispatches serves each at least w_i times (no starvation).
func TestPropertyFairShare(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(2, 5).Draw(t, "tenants")
		weights := rapid.SliceOfN(rapid.IntRange(1, 5), k, k).Draw(t, "weights")
		prio := rapid.IntRange(0, 3).Draw(t, "priority")
		sum := 0
		for _, w := range weights {
			sum += w
		}
		rounds := rapid.IntRange(2, 6).Draw(t, "rounds")
		// Every tenant has more than the window's worth queued.
		per := (rounds + 2) * sum
		cfg := testConfig("round_robin")
		cfg.Queue.MaxRequests = MaxQueueRequests
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c.AddReplica(ReplicaConfig{Name: "r0", MaxInFlight: 1})
		blocker, _ := c.Submit(0, Request{ID: 1 << 40, PromptTokens: 10, PromptKnown: true, Tenant: "blocker"})
		if blocker.Kind != Dispatched {
			t.Fatalf("blocker: %+v", blocker)
		}
		left := make([]int, k)
		for i := range left {
			left[i] = per
		}
		tenantOf := map[uint64]int{}
		for id := uint64(0); ; id++ {
			var open []int
			for i, n := range left {
				if n > 0 {
					open = append(open, i)
				}
			}
			if len(open) == 0 {
				break
			}
			i := open[rapid.IntRange(0, len(open)-1).Draw(t, "who")]
			left[i]--
			tenantOf[id] = i
			d, _ := c.Submit(time.Duration(id), Request{ID: id, PromptTokens: 10, PromptKnown: true, Priority: prio, Tenant: fmt.Sprint("t", i), TenantWeight: weights[i]})
			if d.Kind != Queued {
				t.Fatalf("backlog request %d: %+v", id, d)
			}
		}
		var order []int
		cur := blocker.Ticket
		now := time.Second
		noise := uint64(1 << 41)
		for len(order) < rounds*sum {
			// Now and then a burst of other tenants' requests that leave
			// (aborted) before their turn, enough to compact the queue
			// with the turn anywhere in the round.
			if rapid.IntRange(0, 7).Draw(t, "noise") == 0 {
				var ts []Ticket
				for range c.Queued() + 100 {
					noise++
					d, _ := c.Submit(now, Request{ID: noise, PromptTokens: 10, PromptKnown: true, Priority: prio, Tenant: fmt.Sprint("noise", noise%97), TenantWeight: int(noise % 3)})
					ts = append(ts, d.Ticket)
				}
				for _, tk := range ts {
					if ds := c.Abort(now, tk); len(ds) != 0 {
						t.Fatalf("abort of a queued request dispatched %+v", ds)
					}
				}
			}
			ds := c.Finished(now, cur, Usage{}, nil)
			if len(ds) != 1 || ds[0].Kind != Dispatched {
				t.Fatalf("after finishing one request: %+v", ds)
			}
			cur = ds[0].Ticket
			order = append(order, tenantOf[ds[0].ID])
			now += time.Millisecond
		}
		count := make([]int, k)
		for n, who := range order {
			count[who]++
			for i, w := range weights {
				share := float64((n+1)*w) / float64(sum)
				if d := float64(count[i]) - share; d > float64(w) || d < -float64(w) {
					t.Fatalf("after %d dispatches tenant %d (weight %d of %d) had %d, share %.1f: order %v", n+1, i, w, sum, count[i], share, order)
				}
			}
		}
		win := 2 * sum
		for s := 0; s+win <= len(order); s++ {
			got := make([]int, k)
			for _, who := range order[s : s+win] {
				got[who]++
			}
			for i, w := range weights {
				if got[i] < w {
					t.Fatalf("window [%d, %d): tenant %d (weight %d) served %d times: order %v", s, s+win, i, w, got[i], order)
				}
			}
		}
	})
}

// TestPropertyStrictPriority: one replica, uniform requests, random
// priorities, arrivals and completions: whenever a request is dispatched,
// nothing of a higher class is still waiting, and the dispatch order is
// (class descending, then arrival) among those waiting together.
func TestPropertyStrictPriority(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := testConfig("round_robin")
		cfg.Queue.MaxPriority = 5
		cfg.Queue.Timeout = time.Hour
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		slots := rapid.IntRange(1, 3).Draw(t, "slots")
		c.AddReplica(ReplicaConfig{Name: "r0", MaxInFlight: slots})
		type qd struct {
			id   uint64
			prio int
		}
		var waiting []qd
		var running []Ticket
		prioOf := map[uint64]int{}
		check := func(ds []Decision) {
			for _, d := range ds {
				if d.Kind != Dispatched {
					t.Fatalf("unexpected %+v", d)
				}
				i := slices.IndexFunc(waiting, func(q qd) bool { return q.id == d.ID })
				if i < 0 {
					t.Fatalf("dispatched %+v was not waiting", d)
				}
				// The first waiting request of the highest class goes first.
				best := 0
				for j, q := range waiting {
					if q.prio > waiting[best].prio {
						best = j
					}
				}
				if best != i {
					t.Fatalf("dispatched id %d (priority %d) before id %d (priority %d)", d.ID, prioOf[d.ID], waiting[best].id, waiting[best].prio)
				}
				waiting = slices.Delete(waiting, i, i+1)
				running = append(running, d.Ticket)
			}
		}
		n := rapid.IntRange(1, 200).Draw(t, "steps")
		now := time.Duration(0)
		for id := range uint64(n) {
			now += time.Millisecond
			if len(running) > 0 && rapid.IntRange(0, 2).Draw(t, "finish") == 0 {
				j := rapid.IntRange(0, len(running)-1).Draw(t, "which")
				tk := running[j]
				running = slices.Delete(running, j, j+1)
				check(c.Finished(now, tk, Usage{}, nil))
				continue
			}
			p := rapid.IntRange(0, 5).Draw(t, "priority")
			prioOf[id] = p
			d, others := c.Submit(now, Request{ID: id, PromptTokens: 32, PromptKnown: true, MaxTokens: 16, Priority: p})
			if len(others) != 0 {
				t.Fatalf("submit dispatched others: %+v", others)
			}
			switch d.Kind {
			case Dispatched:
				for _, q := range waiting {
					if q.prio >= p {
						t.Fatalf("new id %d (priority %d) dispatched while id %d (priority %d) waits", id, p, q.id, q.prio)
					}
				}
				running = append(running, d.Ticket)
			case Queued:
				waiting = append(waiting, qd{id, p})
			default:
				t.Fatalf("submit: %+v", d)
			}
		}
	})
}
