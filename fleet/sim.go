package fleet

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/workload"
)

// Config configures one simulated run.
type Config struct {
	// Seed seeds the workload and the router; the same seed gives the same
	// run, bit for bit.
	Seed uint64
	// Workload selects and parameterises the request stream (its Seed is
	// replaced by Seed).
	Workload workload.Config
	// Source, when set, replaces Workload as the request stream (a trace
	// replay): it is called once per run with the run's seed. SourceName
	// names it in summaries.
	Source     func(seed uint64) (workload.Source, error)
	SourceName string
	// Policy names the routing policy (router.Names).
	Policy string
	// Replicas is the number of engines in the fleet.
	Replicas int
	// Engine configures every engine (scheduler limits, KV cache, latency profile).
	Engine engine.Config
	// ScrapeInterval is how often the gateway reads each engine's metrics;
	// the router sees engine numbers up to this old.
	ScrapeInterval time.Duration
	// Warmup excludes requests that arrive before it from the summary.
	Warmup time.Duration
	// SLO is the latency objective for attainment and goodput.
	SLO results.SLO
	// Index picks how the router learns what each engine has cached:
	// IndexApproximate (from its own routing decisions) or IndexEvents (from
	// the engines' KV events, plus predictions recorded at routing time until
	// the events confirm them).
	Index IndexMode
	// KVEventDelay is how late KV events reach the router.
	KVEventDelay time.Duration
	// SpeculationTTL is how long, in events mode, a routing decision stands
	// in for the BlockStored events it predicts before it is dropped.
	SpeculationTTL time.Duration
	// SessionAffinity turns on cost_model's session affinity.
	SessionAffinity bool
	// Progress, when set, is called now and then during the run and once at the end.
	Progress func(Progress)
}

// Progress reports how far a run is.
type Progress struct {
	Created   int           // requests created so far
	Finished  int           // requests completed or failed
	Target    int           // requests the run will create, 0 if bounded by duration only
	Simulated time.Duration // virtual time reached
	Horizon   time.Duration // the duration bound, 0 if none
	Done      bool
}

// IndexMode selects the KV index's source of truth (see router.IndexMode).
type IndexMode = router.IndexMode

// The index modes.
const (
	IndexApproximate = router.IndexApproximate
	IndexEvents      = router.IndexEvents
)

// IndexModes lists the valid index modes.
func IndexModes() []string { return router.IndexModes() }

// DefaultConfig returns the defaults of `inferrail sim`: W1 on four default
// engines, round robin, 100 ms scrapes, the default SLO.
func DefaultConfig() Config {
	w, _ := workload.DefaultConfig("w1")
	return Config{
		Seed:           1,
		Workload:       w,
		Policy:         "round_robin",
		Replicas:       4,
		Engine:         engine.DefaultConfig(),
		ScrapeInterval: 100 * time.Millisecond,
		SLO:            results.DefaultSLO(),
		Index:          IndexApproximate,
		KVEventDelay:   50 * time.Millisecond,
		SpeculationTTL: 2 * time.Second,
	}
}

// MaxReplicas bounds the fleet size of one simulation.
const MaxReplicas = 4096

// Validate checks c once; every message names the setting and what is allowed.
func (c *Config) Validate() error {
	var errs []error
	if c.Replicas < 1 || c.Replicas > MaxReplicas {
		errs = append(errs, fmt.Errorf("replicas: must be between 1 and %d, got %d", MaxReplicas, c.Replicas))
	}
	if c.ScrapeInterval <= 0 {
		errs = append(errs, fmt.Errorf("scrape-interval: must be positive, got %v", c.ScrapeInterval))
	}
	if c.Index != IndexApproximate && c.Index != IndexEvents {
		errs = append(errs, fmt.Errorf("index: must be one of %s, got %q", strings.Join(IndexModes(), ", "), c.Index))
	}
	if c.KVEventDelay < 0 {
		errs = append(errs, fmt.Errorf("kv-event-delay: must be zero or positive, got %v", c.KVEventDelay))
	}
	if c.SpeculationTTL < 0 {
		errs = append(errs, fmt.Errorf("speculation-ttl: must be zero or positive, got %v", c.SpeculationTTL))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("warmup: must be zero or positive, got %v", c.Warmup))
	}
	if _, err := router.New(c.Policy, router.Options{}); err != nil {
		errs = append(errs, fmt.Errorf("policy: %w", err))
	}
	if err := c.SLO.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Engine.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("profile: %w", err))
	}
	if c.Source == nil {
		w := c.Workload
		w.Seed = c.Seed
		if err := w.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("workload: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Output is everything a run produced.
type Output struct {
	Summary results.Summary
	// Records holds one record per request, in arrival order.
	Records []results.Record
	// Engines holds each engine's final counters.
	Engines []engine.Metrics
}

// replica is one engine and the gateway's view of it.
type replica struct {
	name      string
	eng       *engine.Engine
	load      router.Load
	scrapedAt time.Duration
	stepping  bool               // a step-end event is in the heap
	pending   []engine.Emission  // outputs of the step in progress
	kvBatches [][]engine.KVEvent // KV events on their way to the router, oldest first
	queries   int64              // prefix-cache queries at the last scrape (restart detection)
}

// reqState is a request in flight.
type reqState struct {
	w         *workload.Request
	rec       int // index into sim.records
	hashes    []kvblock.Hash
	replica   int
	lastToken time.Duration
	measured  bool
	predicted int // cached tokens predicted on the chosen replica
	decision  router.Decision
}

type memoKey struct {
	parent kvblock.Hash
	seg    kvblock.Segment
}

// sim is one run's state.
type sim struct {
	cfg      Config
	src      workload.Source
	reps     []*replica
	heap     eventHeap
	reqs     reqTable
	hashFree [][]kvblock.Hash // hash slices of finished requests, for reuse
	records  []results.Record
	itl      *results.Histogram
	rt       *router.Router
	views    []router.Replica
	salts    map[string]kvblock.Hash
	memo     map[memoKey][]kvblock.Hash
	segsBuf  []kvblock.Segment
	live     int // requests created and not finished, plus a pending open-loop arrival
	finished int
	events   int64
	now      time.Duration
}

// memoLimit bounds the memo of segments' block hashes (it is cleared when
// full): about 40 MB with 512-token segments of 16-token blocks.
const memoLimit = 1 << 16

// Simulate runs one simulation to completion: every request the workload
// creates is routed, served and recorded.
func Simulate(cfg Config) (*Output, error) {
	wall := time.Now()
	s, err := newSim(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.run(); err != nil {
		return nil, err
	}
	// A replay that stopped on a bad record or an I/O error must say so.
	if e, ok := s.src.(interface{ Err() error }); ok && e.Err() != nil {
		return nil, fmt.Errorf("%s: %w", cfg.SourceName, e.Err())
	}
	return s.output(time.Since(wall)), nil
}

func newSim(cfg Config) (*sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	wcfg := cfg.Workload
	wcfg.Seed = cfg.Seed
	var src workload.Source
	var err error
	if cfg.Source != nil {
		src, err = cfg.Source(cfg.Seed)
	} else {
		src, err = workload.New(wcfg)
	}
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	rt, err := router.NewRouter(router.Config{
		Policy: cfg.Policy,
		Options: router.Options{
			Seed:                cfg.Seed,
			BlockSize:           cfg.Engine.BlockSize,
			Profile:             cfg.Engine.Latency,
			MaxNumBatchedTokens: cfg.Engine.MaxNumBatchedTokens,
			SessionAffinity:     cfg.SessionAffinity,
		},
		Index:                 cfg.Index,
		SpeculationTTL:        cfg.SpeculationTTL,
		DefaultCapacityBlocks: cfg.Engine.NumGPUBlocks,
	})
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	s := &sim{
		cfg:   cfg,
		src:   src,
		rt:    rt,
		reqs:  reqTable{sparse: make(map[uint64]*reqState)},
		itl:   results.NewHistogram(),
		salts: make(map[string]kvblock.Hash),
		memo:  make(map[memoKey][]kvblock.Hash),
	}
	s.reps = make([]*replica, cfg.Replicas)
	s.views = make([]router.Replica, cfg.Replicas)
	ecfg := cfg.Engine
	ecfg.EnableKVEvents = cfg.Index == IndexEvents
	for i := range s.reps {
		rt.SetCapacity(i, cfg.Engine.NumGPUBlocks)
		eng, err := engine.New(ecfg)
		if err != nil {
			return nil, fmt.Errorf("replica %d: %w", i, err)
		}
		s.reps[i] = &replica{name: fmt.Sprintf("replica-%d", i), eng: eng}
		s.views[i] = router.Replica{
			Candidate: router.Candidate{Replica: i, Name: s.reps[i].name, KVCapacityBlocks: cfg.Engine.NumGPUBlocks},
			Healthy:   true,
			Models:    []string{wcfg.Model},
		}
		// Scrapes are spread over the interval, as independent scrapers are.
		phase := cfg.ScrapeInterval * time.Duration(i) / time.Duration(cfg.Replicas)
		s.heap.push(event{at: phase, kind: evScrape, replica: int32(i)})
	}
	s.pullArrival()
	return s, nil
}

// pullArrival puts the source's next open-loop arrival in the heap.
func (s *sim) pullArrival() {
	if r, ok := s.src.Next(); ok {
		s.live++
		s.heap.push(event{at: r.Arrival, kind: evArrival, replica: -1, req: &reqState{w: r}})
	}
}

func (s *sim) run() error {
	progressEvery := int64(1 << 14)
	for s.heap.len() > 0 {
		ev := s.heap.pop()
		if ev.at < s.now {
			return fmt.Errorf("simulation went back in time: event at %v after %v", ev.at, s.now)
		}
		s.now = ev.at
		s.events++
		switch ev.kind {
		case evArrival:
			if ev.replica == -1 {
				s.pullArrival()
			}
			s.arrive(ev.req)
		case evStepEnd:
			if err := s.stepEnd(int(ev.replica)); err != nil {
				return err
			}
		case evScrape:
			s.scrape(int(ev.replica))
		case evKVEvents:
			s.applyKVEvents(int(ev.replica))
		}
		if s.cfg.Progress != nil && s.events%progressEvery == 0 {
			s.cfg.Progress(s.progress(false))
		}
	}
	if s.live != 0 {
		return fmt.Errorf("simulation ended with %d requests unfinished", s.live)
	}
	if s.cfg.Progress != nil {
		s.cfg.Progress(s.progress(true))
	}
	return nil
}

func (s *sim) progress(done bool) Progress {
	target := s.cfg.Workload.Requests
	if s.cfg.Source != nil {
		target = 0 // a replay's length is known only at its end
	}
	return Progress{
		Created:   len(s.records),
		Finished:  s.finished,
		Target:    target,
		Simulated: s.now,
		Horizon:   s.cfg.Workload.Duration,
		Done:      done,
	}
}

func (s *sim) salt(model string) kvblock.Hash {
	h, ok := s.salts[model]
	if !ok {
		h = kvblock.Salt(model, "", "")
		s.salts[model] = h
	}
	return h
}

// hashes derives the block hashes of a request's whole sequence (prompt,
// then output), memoising the blocks of a shared leading segment.
func (s *sim) hashes(w *workload.Request) []kvblock.Hash {
	bs := s.cfg.Engine.BlockSize
	salt := s.salt(w.Model)
	s.segsBuf = append(append(s.segsBuf[:0], w.Prompt...), w.Output)
	var out []kvblock.Hash
	if n := len(s.hashFree); n > 0 {
		out = s.hashFree[n-1][:0]
		s.hashFree = s.hashFree[:n-1]
	} else {
		out = make([]kvblock.Hash, 0, (w.PromptTokens()+w.OutputTokens)/bs)
	}
	// Prompts are chains of segments that recur (system prompts, documents,
	// a trace's hash ids): the full blocks inside a segment depend only on
	// the hash before it and the segment, so they are memoised per (parent,
	// segment) while segments start on block boundaries. The last prompt
	// segment (a question, a user turn) is usually unique and not memoised.
	parent, segs := salt, s.segsBuf
	for i := 0; i < len(w.Prompt)-1; i++ {
		seg := segs[i]
		full := seg.Len / bs
		if full == 0 {
			return kvblock.AppendSegmentHashesFrom(out, parent, segs[i:], bs, 0, -1)
		}
		key := memoKey{parent: parent, seg: seg}
		hs, ok := s.memo[key]
		if !ok {
			if len(s.memo) >= memoLimit {
				clear(s.memo)
			}
			hs = kvblock.AppendSegmentHashesFrom(nil, parent, segs[i:i+1], bs, 0, -1)
			s.memo[key] = hs
		}
		out = append(out, hs...)
		parent = hs[len(hs)-1]
		if seg.Len%bs != 0 {
			// The segment ends inside a block: hash on from its last full block.
			return kvblock.AppendSegmentHashesFrom(out, parent, segs[i:], bs, full, -1)
		}
	}
	return kvblock.AppendSegmentHashesFrom(out, parent, segs[max(len(w.Prompt)-1, 0):], bs, 0, -1)
}

// arrive routes a request and hands it to the chosen engine.
func (s *sim) arrive(rs *reqState) {
	w := rs.w
	rs.measured = w.Arrival >= s.cfg.Warmup
	rs.rec = len(s.records)
	rs.replica = -1
	s.records = append(s.records, results.Record{
		ID: w.ID, Session: w.Session, Turn: w.Turn, Replica: -1,
		Arrival: w.Arrival, PromptTokens: w.PromptTokens(), Outcome: results.OutcomeFailed,
	})
	rec := &s.records[rs.rec]
	// The gateway knows the engines' limits (vLLM publishes max_model_len)
	// and refuses what no replica could serve before routing it.
	if s.cfg.Engine.Admissible(rec.PromptTokens, w.OutputTokens, w.MaxTokens) != nil {
		s.fail(rs)
		return
	}
	hashes := s.hashes(w)
	bs := s.cfg.Engine.BlockSize
	rreq := router.Request{
		ID: w.ID, Model: w.Model, Session: w.Session, Priority: w.Priority,
		PromptTokens: rec.PromptTokens, BlockHashes: hashes[:min(len(hashes), rec.PromptTokens/bs)],
	}
	for i, r := range s.reps {
		v := &s.views[i]
		v.Load = r.load
		if v.Load.Engine.Valid {
			v.Load.Engine.Age = s.now - r.scrapedAt
		}
	}
	d, err := s.rt.Route(s.now, &rreq, s.views)
	if err != nil {
		s.fail(rs)
		return
	}
	rep := s.reps[d.Replica]
	rec.Dispatch = s.now
	rec.Replica = d.Replica
	rec.PredictedCachedTokens = d.PredictedCachedTokens
	err = rep.eng.Add(s.now, engine.Request{
		ID:           engine.RequestID(w.ID),
		PromptTokens: rec.PromptTokens,
		OutputTokens: w.OutputTokens,
		MaxTokens:    w.MaxTokens,
		BlockHashes:  hashes,
	})
	if err != nil {
		// The engine refused it (too long, too large) before computing
		// anything: the client gets an error and the index forgets the record.
		s.rt.Abandon(d)
		s.fail(rs)
		return
	}
	rs.replica = d.Replica
	rs.hashes = hashes
	rs.predicted = d.PredictedCachedTokens
	rs.decision = d
	s.reqs.put(w.ID, rs)
	rep.load.InFlight++
	rep.load.Pending++
	rep.load.PendingPromptTokens += rec.PromptTokens
	rep.load.PendingPrefillTokens += rec.PromptTokens - rs.predicted
	rep.load.InFlightPromptTokens += rec.PromptTokens
	if !rep.stepping {
		rep.stepping = true
		s.heap.push(event{at: s.now, kind: evStepEnd, replica: int32(d.Replica)})
	}
}

func (s *sim) fail(rs *reqState) {
	s.live--
	s.finished++
	s.followUp(rs.w, false)
}

// followUp tells the source a request ended and schedules what it causes.
func (s *sim) followUp(w *workload.Request, ok bool) {
	if next, more := s.src.Done(w, s.now, ok); more {
		s.live++
		at := max(next.Arrival, s.now)
		s.heap.push(event{at: at, kind: evArrival, replica: -2, req: &reqState{w: next}})
	}
}

// maxEmptySteps bounds consecutive steps that schedule nothing (after a
// request preempted itself the next step readmits it).
const maxEmptySteps = 1000

// stepEnd delivers the outputs of replica i's finished step and starts the next.
func (s *sim) stepEnd(i int) error {
	rep := s.reps[i]
	s.deliver(rep)
	for range maxEmptySteps {
		if _, ok := rep.eng.NextStep(); !ok {
			rep.stepping = false
			return nil
		}
		res := rep.eng.Step(s.now)
		if res.Duration == 0 {
			continue
		}
		rep.pending = append(rep.pending[:0], res.Emitted...)
		if len(res.Events) > 0 {
			// The engine reuses its event slice; the hash slices inside are fresh.
			rep.kvBatches = append(rep.kvBatches, append([]engine.KVEvent(nil), res.Events...))
			s.heap.push(event{at: res.End() + s.cfg.KVEventDelay, kind: evKVEvents, replica: int32(i)})
		}
		s.heap.push(event{at: res.End(), kind: evStepEnd, replica: int32(i)})
		return nil
	}
	return fmt.Errorf("%s made no progress in %d steps", rep.name, maxEmptySteps)
}

// deliver applies the tokens of a step that ended now.
func (s *sim) deliver(rep *replica) {
	for _, em := range rep.pending {
		rs := s.reqs.get(uint64(em.ID))
		rec := &s.records[rs.rec]
		if em.Output == 1 {
			rec.FirstToken, rec.HasFirstToken = s.now, true
			rec.CachedTokens = em.CachedTokens
			rep.load.Pending--
			rep.load.PendingPromptTokens -= rec.PromptTokens
			rep.load.PendingPrefillTokens -= rec.PromptTokens - rs.predicted
		} else if rs.measured {
			s.itl.Add(s.now - rs.lastToken)
		}
		rs.lastToken = s.now
		if em.Finished {
			rec.End = s.now
			rec.OutputTokens = em.Output
			rec.Preemptions = em.Preemptions
			rec.Outcome = results.OutcomeOK
			rep.load.InFlight--
			rep.load.InFlightPromptTokens -= rec.PromptTokens
			// The proxy has seen the whole exchange: the engine now holds the
			// prompt and the answer (all but its last token).
			held := min(len(rs.hashes), (rec.PromptTokens+em.Output-1)/s.cfg.Engine.BlockSize)
			s.rt.Finished(rs.decision, rs.hashes[:held])
			rs.decision = router.Decision{}
			s.reqs.del(uint64(em.ID))
			// The engine has let go of the request: its hashes can be reused,
			// unless the index's speculation queue may still hold them.
			if s.cfg.Index != IndexEvents && len(s.hashFree) < 1024 {
				s.hashFree = append(s.hashFree, rs.hashes)
			}
			rs.hashes = nil
			s.live--
			s.finished++
			s.followUp(rs.w, true)
		}
	}
	rep.pending = rep.pending[:0]
}

// applyKVEvents feeds a replica's oldest batch of KV events to the index.
func (s *sim) applyKVEvents(i int) {
	rep := s.reps[i]
	batch := rep.kvBatches[0]
	rep.kvBatches[0] = nil
	rep.kvBatches = rep.kvBatches[1:]
	s.rt.KVEvents(i, batch)
}

// restarted reports whether an engine's prefix-cache counters went backwards
// since the last scrape: it restarted, and its cache is empty.
func restarted(prevQueries, queries int64) bool { return queries < prevQueries }

// scrape refreshes the gateway's copy of an engine's own metrics.
func (s *sim) scrape(i int) {
	rep := s.reps[i]
	m := rep.eng.Metrics()
	if restarted(rep.queries, m.PrefixCacheQueries) {
		s.rt.Restarted(i)
	}
	rep.queries = m.PrefixCacheQueries
	rep.load.Engine = router.EngineLoad{Valid: true, Running: m.Running, Waiting: m.Waiting, KVCacheUsage: m.KVCacheUsage}
	rep.scrapedAt = s.now
	if s.live > 0 {
		s.heap.push(event{at: s.now + s.cfg.ScrapeInterval, kind: evScrape, replica: int32(i)})
	}
}

func (s *sim) output(wall time.Duration) *Output {
	infos := make([]results.ReplicaInfo, len(s.reps))
	engines := make([]engine.Metrics, len(s.reps))
	for i, r := range s.reps {
		engines[i] = r.eng.Metrics()
		infos[i] = results.ReplicaInfo{Name: r.name, Busy: engines[i].BusyTime}
	}
	sum := results.Summarize(s.records, results.SummaryOptions{
		Warmup:       s.cfg.Warmup,
		SLO:          s.cfg.SLO,
		Replicas:     infos,
		ITL:          s.itl,
		SimulatedEnd: s.now,
	})
	sum.Workload = s.cfg.Workload.Workload
	sum.RateRPS = s.cfg.Workload.Rate
	if s.cfg.Source != nil {
		// A replay offers what its arrivals offer.
		sum.Workload = s.cfg.SourceName
		sum.RateRPS = 0
		if n := len(s.records); n > 1 && s.records[n-1].Arrival > 0 {
			sum.RateRPS = math.Round(float64(n-1)/s.records[n-1].Arrival.Seconds()*1e4) / 1e4
		}
	}
	sum.Policy = s.cfg.Policy
	sum.Replicas = len(s.reps)
	sum.Seed = s.cfg.Seed
	sum.SimulatedS = s.now.Seconds()
	sum.SimEvents = s.events
	sum.SimWallS = math.Round(wall.Seconds()*1000) / 1000
	return &Output{Summary: sum, Records: s.records, Engines: engines}
}

// reqTable finds in-flight requests by id: a slice for the dense ids that
// workloads assign (1, 2, 3, ...), a map for any others.
type reqTable struct {
	dense  []*reqState
	sparse map[uint64]*reqState
}

// maxDenseGap bounds how far past the dense slice an id may be to extend it.
const maxDenseGap = 1 << 16

func (t *reqTable) put(id uint64, rs *reqState) {
	if id < uint64(len(t.dense))+maxDenseGap {
		for uint64(len(t.dense)) <= id {
			t.dense = append(t.dense, nil)
		}
		t.dense[id] = rs
		return
	}
	t.sparse[id] = rs
}

func (t *reqTable) get(id uint64) *reqState {
	if id < uint64(len(t.dense)) {
		if rs := t.dense[id]; rs != nil {
			return rs
		}
	}
	return t.sparse[id]
}

func (t *reqTable) del(id uint64) {
	if id < uint64(len(t.dense)) && t.dense[id] != nil {
		t.dense[id] = nil
		return
	}
	delete(t.sparse, id)
}
