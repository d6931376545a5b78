package fleet

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/lane"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/tenancy/limit"
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
	// Replicas is the number of engines in the fleet, every pool counted.
	Replicas int
	// PrefillReplicas and DecodeReplicas are how many of them are
	// prefill-only and decode-only (disaggregated prefill/decode, pd.go);
	// the rest serve both. 0 and 0: an aggregated fleet.
	PrefillReplicas int
	DecodeReplicas  int
	// PD configures the gateways' P/D decision (its decider, threshold
	// and prefill policy; the transfer's pricing comes from Engine).
	PD gateway.PDConfig
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
	// Admission is the gateways' admission rule (gateway.Admissions).
	Admission gateway.Admission
	// Overcommit scales the replicas' KV capacity for kv admission.
	Overcommit float64
	// OutputQuantile is the quantile of observed answer lengths kv
	// admission reserves for a request's output (0: its max_tokens).
	OutputQuantile float64
	// QueueTimeout bounds a request's wait in a gateway's queue.
	QueueTimeout time.Duration
	// QueueMaxRequests bounds each gateway's queue (0: no queue, a request
	// no replica admits is rejected at once).
	QueueMaxRequests int
	// MaxPriority caps the requests' priority classes.
	MaxPriority int
	// MaxModelLen is the gateways' configured max_model_len (live's): it
	// refuses longer requests and weighs a request without max_tokens as
	// it minus its prompt. 0, live's default: the gateways read the
	// engines' own length (Engine.MaxModelLen), as live reads it from
	// their /v1/models, to refuse longer requests only.
	MaxModelLen int
	// Gateways is the number of gateway cores in front of the fleet, each
	// with its own view, index and scrape phase; requests reach them by
	// session (or request id), as a sticky load balancer would spread them.
	Gateways int
	// Ledger says whether the gateways share one reservation ledger
	// (LedgerShared) or keep one each (LedgerIndependent).
	Ledger string
	// NoLimits turns the tenants' rate limits (Workload.Tenants) off:
	// every request goes to its gateway, as without a rate limiter. The
	// isolation experiment runs a workload both ways (see tenancy.go for
	// how limits are applied; they apply to synthetic workloads, not to a
	// Source).
	NoLimits bool
	// Trace, when set, receives every call into each gateway's core (g is
	// the gateway), in order: a recording of the run's gateway decisions.
	Trace func(g int, ev gateway.TraceEvent)
	// Progress, when set, is called now and then during the run and once at the end.
	Progress func(Progress)
	// ShadowPolicy names a policy every gateway also asks about each
	// decision, without effect on routing (gateway.Config.ShadowPolicy);
	// Output.Shadow holds each gateway's tally. "": none.
	ShadowPolicy string
	// ExplainSample is the share of requests, sampled by id, whose routing
	// decision on arrival is explained to Explain (explain.go), in [0, 1].
	ExplainSample float64
	// Explain receives the sampled explanations, in arrival order; an
	// error stops the run and Simulate returns it.
	Explain func(gateway.Explanation) error

	// KeepRecords fills Output.Records with every request's record: memory
	// that grows with the run (about 220 bytes a request, on top of what
	// the summary keeps below its exact limit). DefaultConfig sets it, for
	// short runs and tests that read records; a long run leaves it off and
	// streams them through Record (see records.go).
	KeepRecords bool
	// Record, when set, is called with each request's record in arrival
	// order, as soon as the request and every request that arrived before
	// it have ended (sim --out writes requests.parquet from it). The
	// record is valid during the call only. An error stops the run and
	// Simulate returns it.
	Record func(*results.Record) error
	// ExactLimit is the number of requests up to which the summary's
	// percentiles are exact (results.SummaryOptions.ExactLimit; 0 or less:
	// results.DefaultExactLimit, 1,048,576); past it they come from
	// sketches within results.PercentileError and the summary stops
	// growing with the run.
	ExactLimit int
	// TwoCores gives a second goroutine (internal/lane) the gateways' KV
	// index bookkeeping (router.Config.Lane) while the engines step, when
	// the process may use more than one core (GOMAXPROCS > 1): a run takes
	// about a quarter less time, with the same bytes. It suits a
	// simulation running alone (sim sets it); where simulations already run
	// one per core (compare, the tests), the second goroutines only take
	// turns with the others' first ones, so it is off by default. It
	// changes no result, so a sweep's plan does not store it.
	TwoCores bool `json:"-"`
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

// The ledger modes of several gateways (Config.Ledger).
const (
	LedgerShared      = "shared"
	LedgerIndependent = "independent"
)

// MaxGateways bounds Config.Gateways.
const MaxGateways = 64

// DefaultConfig returns the defaults of `inferrail sim`: W1 on four default
// engines, round robin, 100 ms scrapes, the default SLO.
func DefaultConfig() Config {
	w, _ := workload.DefaultConfig("w1")
	gw := gateway.DefaultConfig()
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
		// The lab's default is no admission, so runs compare with the
		// published reports; live defaults to kv.
		Admission:        gateway.AdmitNone,
		Overcommit:       gateway.DefaultOvercommit,
		OutputQuantile:   gw.OutputQuantile,
		QueueTimeout:     gw.Queue.Timeout,
		QueueMaxRequests: gw.Queue.MaxRequests,
		MaxPriority:      gw.Queue.MaxPriority,
		Gateways:         1,
		Ledger:           LedgerShared,
		KeepRecords:      true,
		PD:               gw.PD,
	}
}

// MaxReplicas bounds the fleet size of one simulation.
const MaxReplicas = 4096

// MinScrapeInterval bounds how often the router scrapes each engine: every
// replica is scraped once an interval, and below a millisecond the
// simulation does little else.
const MinScrapeInterval = time.Millisecond

// Validate checks c once; every message names the setting and what is allowed.
func (c *Config) Validate() error {
	var errs []error
	if c.Replicas < 1 || c.Replicas > MaxReplicas {
		errs = append(errs, fmt.Errorf("replicas: must be between 1 and %d, got %d", MaxReplicas, c.Replicas))
	}
	if c.MaxModelLen < 0 {
		errs = append(errs, fmt.Errorf("max_model_len: must be zero (the engines' own) or positive, got %d", c.MaxModelLen))
	}
	if err := c.validatePD(); err != nil {
		errs = append(errs, err)
	}
	if c.ScrapeInterval < MinScrapeInterval {
		errs = append(errs, fmt.Errorf("scrape-interval: must be at least %v, got %v (every replica is scraped once an interval; below %v the simulation does little else)", MinScrapeInterval, c.ScrapeInterval, MinScrapeInterval))
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
	if _, err := router.NewPolicy(c.Policy, router.Options{}); err != nil {
		errs = append(errs, fmt.Errorf("policy: %w", err))
	}
	if err := c.validateExplain(); err != nil {
		errs = append(errs, err)
	}
	if c.Gateways < 1 || c.Gateways > MaxGateways {
		errs = append(errs, fmt.Errorf("gateways: must be between 1 and %d, got %d", MaxGateways, c.Gateways))
	}
	if c.Ledger != LedgerShared && c.Ledger != LedgerIndependent {
		errs = append(errs, fmt.Errorf("ledger: must be %s or %s, got %q", LedgerShared, LedgerIndependent, c.Ledger))
	}
	gc := c.gatewayConfig(nil)
	if err := gc.Validate(); err != nil {
		errs = append(errs, err)
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
		} else if err := workload.CheckLength(w.Requests, w.Duration, w.Rate); err != nil {
			errs = append(errs, fmt.Errorf("workload: %w", err))
		} else if w.Duration > 0 && c.Warmup >= w.Duration {
			errs = append(errs, fmt.Errorf("warmup: must be shorter than the run's duration (%v), got %v (requests arriving in the warmup are not measured)", w.Duration, c.Warmup))
		}
	}
	return errors.Join(errs...)
}

// Output is everything a run produced.
type Output struct {
	Summary results.Summary
	// Records holds one record per request, in arrival order, when
	// Config.KeepRecords is set; nil otherwise.
	Records []results.Record
	// Engines holds each engine's final counters.
	Engines []engine.Metrics
	// Shadow holds each gateway's shadow tally (Config.ShadowPolicy), nil
	// without a shadow policy.
	Shadow []gateway.ShadowStats
}

// gatewayConfig is the gateway core of one simulated gateway.
func (c *Config) gatewayConfig(ledger gateway.Ledger) gateway.Config {
	g := gateway.DefaultConfig()
	g.Model = c.Workload.Model
	g.Router = router.Config{
		Policy: c.Policy,
		Options: router.Options{
			Seed:                c.Seed,
			BlockSize:           c.Engine.BlockSize,
			Profile:             c.Engine.Latency,
			MaxNumBatchedTokens: c.Engine.MaxNumBatchedTokens,
			SessionAffinity:     c.SessionAffinity,
			TierLoadNsPerToken:  c.Engine.TierLoadNsPerToken(),
		},
		Index:          c.Index,
		SpeculationTTL: c.SpeculationTTL,
		TierBlocks:     c.Engine.LowerTierBlocks(),
	}
	g.ShadowPolicy = c.ShadowPolicy
	g.Admission = c.Admission
	g.Overcommit = c.Overcommit
	g.OutputQuantile = c.OutputQuantile
	g.MaxModelLen, g.ContextLen = c.MaxModelLen, c.Engine.MaxModelLen
	g.DefaultCapacityBlocks = c.Engine.NumGPUBlocks * c.Engine.Ranks()
	g.Queue.Timeout = c.QueueTimeout
	g.Queue.MaxRequests = c.QueueMaxRequests
	g.Queue.MaxPriority = c.MaxPriority
	// A report is as old as the scrape interval at most; the live default
	// (500 ms) only drops reports when scraping stalls.
	g.MaxAge = max(g.MaxAge, 5*c.ScrapeInterval)
	g.Ledger = ledger
	g.PD = c.PD
	g.PD.KVBytesPerToken = c.Engine.KVBytesPerToken
	g.PD.Transfer = c.Engine.PDTransfer
	return g
}

// replica is one engine (a data-parallel group of engine ranks behind one
// address) and what the fleet measures of it.
type replica struct {
	name string
	eng  *engine.Group
	// stepAt holds the times of the replica's evStepEnd events in the heap:
	// one per step in progress (several with independent data-parallel
	// ranks) and a kick after a dispatch to an idle rank.
	stepAt []time.Duration
	// outs are the emissions of steps on their way to the API server, by
	// OutputAt (each step's own evOutput event, or the step's end event
	// when OutputAt is its end); kvBatches the KV events on their way to
	// the gateways, by when they arrive. Both pop in the heap's order.
	outs      timedQueue[[]engine.Emission]
	kvBatches timedQueue[[]engine.KVEvent]
	spare     [][]engine.Emission // emission buffers for reuse
	// peakReserved is the most KV blocks all gateways together had
	// reserved on the replica (their ledgers' sum).
	peakReserved int
	peakRunning  int
	// filled is the replica's step time weighted by the share of the token
	// budget each step used, summed over its ranks (results.ReplicaInfo.Filled
	// times the ranks).
	filled float64
}

// gw is one gateway: its core and when it asked to be woken.
type gw struct {
	core *gateway.Core
	wake time.Duration // the pending evGateway event's time, -1 if none
}

// reqState is a request in the fleet.
type reqState struct {
	w      *workload.Request
	rec    int // sequence number of its record in sim.records
	hashes []kvblock.Hash
	// inPrep is set when the preparer's spare work claimed the request
	// for hashing, and prepared once its hashes are in; hashing, parent
	// and seg keep the place of hashes in progress (prepare.go).
	inPrep    bool
	prepared  atomic.Bool
	hashing   bool
	parent    kvblock.Hash
	seg       int
	replica   int
	lastToken time.Duration
	measured  bool
	gateway   int
	ticket    gateway.Ticket
	// lim and res are the tenant's limiter and reservation, until the
	// request ends (nil when its tenant has no limits).
	lim *limit.Local
	res *limit.Reservation
	// prefill is the replica of a remote prefill (P/D, pd.go), decode the
	// replica it decodes on, transferTokens the KV it moves and xferStart
	// when the move started.
	prefill, decode int
	transferTokens  int
	xferStart       time.Duration
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
	gws      []*gw
	ledgers  []gateway.Ledger  // one shared, or one per gateway
	kvEv     []gateway.KVEvent // a batch of KV events as the gateways take them
	heap     eventHeap
	reqs     reqTable
	records  recordWindow         // the records not yet retired (records.go)
	acc      *results.Accumulator // the summary, as records retire
	kept     []results.Record     // every record, with Config.KeepRecords
	created  int                  // records created
	lastArr  time.Duration        // the arrival of the last record created
	err      error                // the first error of Config.Record
	itl      *results.Histogram
	lane     *lane.Lane                // the second core's (Config.TwoCores); nil without
	handed   atomic.Int64              // the engines' insertion lists handed to it, not yet applied
	prep     *preparer                 // the source's arrivals and their block hashes (prepare.go)
	buckets  map[string][]limit.Bucket // each limited tenant's bucket
	limiters []*limit.Local            // one shared, or one per gateway; nil without limits
	links    []*link                   // each prefill replica's KV link (pd.go); nil entries for the others
	linkBase time.Duration             // a KV transfer's base latency
	xfer     *results.Histogram        // measured requests' KV transfer times
	// transferredBytes sums the KV the links moved.
	transferredBytes float64
	live             int // requests created and not finished, plus a pending open-loop arrival
	finished         int
	events           int64
	now              time.Duration
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
	err = s.run()
	s.prep.stop()
	if err != nil {
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
	s := &sim{
		cfg:  cfg,
		src:  src,
		reqs: reqTable{sparse: make(map[uint64]*reqState)},
		itl:  results.NewHistogram(),
		prep: newPreparer(src, cfg.Engine.BlockSize),
		acc:  results.NewAccumulator(results.SummaryOptions{Warmup: cfg.Warmup, SLO: cfg.SLO, ExactLimit: cfg.ExactLimit}),
	}
	if cfg.TwoCores && runtime.GOMAXPROCS(0) > 1 {
		s.lane = new(lane.Lane)
	}
	var shared gateway.Ledger
	if cfg.Ledger == LedgerShared {
		shared = gateway.NewLocalLedger()
	}
	s.gws = make([]*gw, cfg.Gateways)
	for g := range s.gws {
		ledger := shared
		if ledger == nil {
			ledger = gateway.NewLocalLedger()
		}
		if shared == nil || g == 0 {
			s.ledgers = append(s.ledgers, ledger)
		}
		gc := cfg.gatewayConfig(ledger)
		gc.Router.Lane = s.lane
		if cfg.Trace != nil {
			g := g
			gc.Trace = func(ev gateway.TraceEvent) { cfg.Trace(g, ev) }
		}
		core, err := gateway.New(gc)
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		s.gws[g] = &gw{core: core, wake: -1}
	}
	s.reps = make([]*replica, cfg.Replicas)
	ecfg := cfg.Engine
	ecfg.EnableKVEvents = cfg.Index == IndexEvents
	for i := range s.reps {
		eng, err := engine.NewGroup(ecfg)
		if err != nil {
			return nil, fmt.Errorf("replica %d: %w", i, err)
		}
		if s.lane != nil {
			eng.HandOffStores(&s.handed)
		}
		s.reps[i] = &replica{name: fmt.Sprintf("replica-%d", i), eng: eng}
		for _, g := range s.gws {
			if _, err := g.core.AddReplica(gateway.ReplicaConfig{Name: s.reps[i].name, Role: cfg.role(i)}); err != nil {
				return nil, err
			}
		}
	}
	// Scrapes are spread over the interval, as independent scrapers are:
	// each gateway scrapes each replica at its own phase.
	n := time.Duration(cfg.Replicas * cfg.Gateways)
	for i := range s.reps {
		for g := range s.gws {
			phase := cfg.ScrapeInterval * time.Duration(i*cfg.Gateways+g) / n
			s.heap.push(event{at: phase, kind: evScrape, replica: int32(i), gateway: int32(g)})
		}
	}
	if cfg.PrefillReplicas > 0 {
		s.links = make([]*link, cfg.Replicas)
		// The link's bytes per second; a transfer's base latency is added at its end.
		bw := cfg.Engine.PDTransfer.Resolved().BandwidthGBps * 1e9
		for i := range cfg.PrefillReplicas {
			s.links[i] = &link{bw: bw, next: -1}
		}
		s.linkBase = cfg.Engine.TransferTime(0)
		s.xfer = results.NewHistogram()
	}
	if err := s.newLimiters(); err != nil {
		return nil, err
	}
	if s.lane != nil {
		s.lane.SetSpare(s.spare(workload.TakesAhead(src)))
	}
	s.pullArrival()
	return s, nil
}

// spare is the second core's spare work (lane.Lane.SetSpare): the prefix
// cache insertions the engines' steps handed off (engine.Group.
// HandOffStores), which the next step on each engine needs, then hashing
// arrivals ahead when the source allows it.
func (s *sim) spare(ahead bool) func() bool {
	engs := make([]*engine.Group, len(s.reps))
	for i, r := range s.reps {
		engs[i] = r.eng
	}
	return func() bool {
		if s.handed.Load() > 0 {
			for _, e := range engs {
				if e.ApplyStores() {
					return true
				}
			}
		}
		return ahead && s.prep.spare()
	}
}

// pullArrival puts the source's next open-loop arrival in the heap.
func (s *sim) pullArrival() {
	if rs := s.prep.next(); rs != nil {
		s.live++
		s.heap.push(event{at: rs.w.Arrival, kind: evArrival, replica: -1, req: rs})
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
			if err := s.arrive(ev.req); err != nil {
				return err
			}
		case evStepEnd:
			if err := s.stepEnd(int(ev.replica)); err != nil {
				return err
			}
		case evScrape:
			s.scrape(int(ev.gateway), int(ev.replica))
		case evKVEvents:
			s.applyKVEvents(int(ev.replica))
		case evOutput:
			s.deliverDue(s.reps[ev.replica])
		case evTransfer:
			s.linkEvent(int(ev.replica), ev.at)
		case evDecodeAdd:
			s.decodeAdd(ev.req)
		case evGateway:
			g := s.gws[ev.gateway]
			if g.wake == ev.at {
				g.wake = -1
				s.decided(int(ev.gateway), g.core.Advance(s.now))
			}
		}
		if s.err != nil {
			return s.err
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
	if len(s.cfg.Workload.WithoutTenants) > 0 && s.cfg.Workload.Duration > 0 {
		// Requests counts the left-out tenants' too, which never reach the
		// fleet: the duration tells better how far the run is.
		target = 0
	}
	return Progress{
		Created:   s.created,
		Finished:  s.finished,
		Target:    target,
		Simulated: s.now,
		Horizon:   s.cfg.Workload.Duration,
		Done:      done,
	}
}

// gatewayOf is the gateway a request reaches: by session, so a chat's
// turns meet the same gateway, else by id.
func (s *sim) gatewayOf(w *workload.Request) int {
	if len(s.gws) == 1 {
		return 0
	}
	k := w.ID
	if w.Session != 0 {
		k = w.Session
	}
	return int(kvblock.Mix64(k) % uint64(len(s.gws)))
}

// arrive hands a request to its gateway, once its tenant's rate limit
// admits it.
func (s *sim) arrive(rs *reqState) error {
	w := rs.w
	rs.measured = w.Arrival >= s.cfg.Warmup
	rs.replica = -1
	rs.prefill = -1
	rs.rec = s.records.push(results.Record{
		ID: w.ID, Session: w.Session, Turn: w.Turn, Replica: -1, Priority: w.Priority, Tenant: w.Tenant,
		Arrival: w.Arrival, PromptTokens: w.PromptTokens(), Outcome: results.OutcomeFailed,
	})
	s.created++
	s.lastArr = w.Arrival
	rec := s.records.at(rs.rec)
	rs.gateway = s.gatewayOf(w)
	if s.limiters != nil {
		ok, err := s.admitTenant(rs, rec)
		if err != nil {
			return err
		}
		if !ok { // a 429 at once: the gateway never sees it
			s.prep.recycle(rs.hashes) // prepared ahead, never used
			rs.hashes = nil
			s.end(rs, false)
			return nil
		}
	}
	hashes := s.prep.hashesOf(rs)
	bs := s.cfg.Engine.BlockSize
	rs.hashes = hashes
	s.reqs.put(w.ID, rs)
	g := s.gws[rs.gateway]
	req := gateway.Request{
		ID: w.ID, Session: w.Session, PromptTokens: rec.PromptTokens, PromptKnown: true,
		BlockHashes: hashes[:min(len(hashes), rec.PromptTokens/bs)], MaxTokens: w.MaxTokens,
		Priority: w.Priority, Tenant: w.Tenant,
	}
	s.explain(rs.gateway, req)
	d, others := g.core.Submit(s.now, req)
	s.decide(rs.gateway, d)
	s.decided(rs.gateway, others)
	return nil
}

// decided applies the decisions a gateway call returned.
func (s *sim) decided(g int, ds []gateway.Decision) {
	for _, d := range ds {
		s.decide(g, d)
	}
	s.schedule(g)
}

// schedule asks to be woken at the gateway's next deadline.
func (s *sim) schedule(g int) {
	gw := s.gws[g]
	at, ok := gw.core.NextDeadline(s.now)
	if !ok || (gw.wake >= 0 && gw.wake <= at) {
		return
	}
	gw.wake = max(at, s.now)
	s.heap.push(event{at: gw.wake, kind: evGateway, gateway: int32(g), replica: -3})
}

// decide carries out one decision of gateway g.
func (s *sim) decide(g int, d gateway.Decision) {
	rs := s.reqs.get(d.ID)
	if rs == nil {
		return
	}
	switch d.Kind {
	case gateway.Queued:
		rs.ticket = d.Ticket
		s.schedule(g)
	case gateway.Rejected:
		rec := s.records.at(rs.rec)
		rec.Outcome = results.OutcomeRejected
		rec.Reject = d.Reason
		rec.RetryAfter = d.RetryAfter
		s.finishTenant(rs, 0) // no engine answered: nothing was computed
		s.end(rs, false)
	case gateway.Dispatched:
		s.dispatch(g, rs, d)
	}
}

// dispatch hands a request to the engine its gateway chose (its prefill
// first, when it prefills remotely: pd.go).
func (s *sim) dispatch(g int, rs *reqState, d gateway.Decision) {
	rec := s.records.at(rs.rec)
	rs.ticket = d.Ticket
	rec.Dispatch = s.now
	rec.Replica = d.Replica
	// The engine counts what it loads back from its tiers as cached.
	rec.PredictedCachedTokens = d.PredictedCachedTokens + d.PredictedTierTokens
	if d.Prefill >= 0 && s.dispatchPrefill(g, rs, d) {
		return
	}
	s.addDecode(rs, d.Replica, false)
}

// addDecode adds rs to replica i, the one it decodes on (remote: its
// prompt's KV came from a prefill replica, pd.go; else it prefills there
// too).
func (s *sim) addDecode(rs *reqState, i int, remote bool) {
	w := rs.w
	rec := s.records.at(rs.rec)
	err := s.reps[i].eng.Add(s.now, engine.Request{
		ID:            engine.RequestID(w.ID),
		PromptTokens:  rec.PromptTokens,
		OutputTokens:  w.OutputTokens,
		MaxTokens:     w.MaxTokens,
		BlockHashes:   rs.hashes,
		RemotePrefill: remote,
	})
	if err != nil {
		// The engine refused it (too long, too large) before computing
		// anything: the client gets an error and the gateway takes it back.
		rec.Fail = failReason(err)
		rec.Replica = -1
		others := s.gws[rs.gateway].core.Fail(s.now, rs.ticket, false)
		s.end(rs, false)
		s.decided(rs.gateway, others)
		return
	}
	rs.replica = i
	s.notePeak(i)
	s.kick(i)
}

// kick starts replica i's step now if the rank that took a request can
// start now and no step event of the replica is due now anyway.
func (s *sim) kick(i int) {
	rep := s.reps[i]
	if at, ok := rep.eng.NextStep(); ok && at <= s.now && !slices.Contains(rep.stepAt, s.now) {
		s.pushStep(i, s.now)
	}
}

// pushStep schedules a step event of replica i at time at.
func (s *sim) pushStep(i int, at time.Duration) {
	rep := s.reps[i]
	rep.stepAt = append(rep.stepAt, at)
	s.heap.push(event{at: at, kind: evStepEnd, replica: int32(i)})
}

// notePeak records replica i's reservations over every gateway's ledger.
func (s *sim) notePeak(i int) {
	n := 0
	for _, l := range s.ledgers {
		n += l.Reserved(i)
	}
	s.reps[i].peakReserved = max(s.reps[i].peakReserved, n)
}

// end finishes a request's life in the fleet. A completed request's
// tenant is charged what it used (prompt + completion); a request that
// failed after reaching an engine keeps its estimate (its reservation, if
// not finished already).
func (s *sim) end(rs *reqState, ok bool) {
	if rs.res != nil {
		used := limit.UsageUnknown
		if ok {
			rec := s.records.at(rs.rec)
			used = rec.PromptTokens + rec.OutputTokens
		}
		s.finishTenant(rs, used)
	}
	s.reqs.del(rs.w.ID)
	// The engine has let go of the request: its hashes can be reused,
	// unless the index's speculation queue may still hold them.
	if ok && s.cfg.Index != IndexEvents {
		s.prep.recycle(rs.hashes)
	}
	rs.hashes = nil
	s.live--
	s.finished++
	s.retire(rs.rec)
	s.followUp(rs.w, ok)
}

// followUp tells the source a request ended and schedules what it causes.
func (s *sim) followUp(w *workload.Request, ok bool) {
	if next, more := s.prep.done(w, s.now, ok); more {
		s.live++
		at := max(next.Arrival, s.now)
		s.heap.push(event{at: at, kind: evArrival, replica: -2, req: &reqState{w: next}})
	}
}

// maxEmptySteps bounds consecutive steps that schedule nothing (after a
// request preempted itself the next step readmits it).
const maxEmptySteps = 1000

// stepEnd delivers the outputs due at replica i's step end and starts every
// step due now (one per data-parallel rank that is free; one for the group
// in lockstep).
func (s *sim) stepEnd(i int) error {
	rep := s.reps[i]
	// The event counts as pending while outputs are delivered, so that a
	// request they cause and dispatch here does not kick the replica again.
	s.deliverDue(rep)
	if k := slices.Index(rep.stepAt, s.now); k >= 0 {
		rep.stepAt = slices.Delete(rep.stepAt, k, k+1)
	}
	for empty := 0; ; {
		at, ok := rep.eng.NextStep()
		if !ok {
			return nil
		}
		if at > s.now {
			// The engine waits for something other than a step in
			// progress (a load from a lower KV tier): wake it then.
			if !slices.Contains(rep.stepAt, at) {
				s.pushStep(i, at)
			}
			return nil
		}
		res := rep.eng.Step(s.now)
		if res.Duration == 0 {
			if empty++; empty == maxEmptySteps {
				return fmt.Errorf("%s made no progress in %d steps", rep.name, maxEmptySteps)
			}
			continue
		}
		end := res.End()
		rep.filled += res.Duration.Seconds() * float64(res.Batch.PrefillTokens+res.Batch.DecodeSeqs) / float64(s.cfg.Engine.MaxNumBatchedTokens)
		if len(res.Events) > 0 {
			// The engine reuses its event slice; the hash slices inside are fresh.
			rep.kvBatches.push(end+s.cfg.KVEventDelay, append([]engine.KVEvent(nil), res.Events...))
			s.heap.push(event{at: end + s.cfg.KVEventDelay, kind: evKVEvents, replica: int32(i)})
		}
		s.pushStep(i, end)
		if len(res.Emitted) > 0 {
			var buf []engine.Emission
			if n := len(rep.spare); n > 0 {
				buf, rep.spare = rep.spare[n-1], rep.spare[:n-1]
			}
			rep.outs.push(res.OutputAt, append(buf, res.Emitted...))
			if res.OutputAt != end {
				// Output lag: the tokens reach the API server after the step
				// (the step's end event delivers them otherwise).
				s.heap.push(event{at: res.OutputAt, kind: evOutput, replica: int32(i)})
			}
		}
	}
}

// deliverDue applies, in order, the tokens of replica rep that have reached
// the API server by now.
func (s *sim) deliverDue(rep *replica) {
	for {
		if at, ok := rep.outs.front(); !ok || at > s.now {
			return
		}
		ems := rep.outs.pop()
		s.deliver(ems)
		rep.spare = append(rep.spare, ems[:0])
	}
}

// deliver applies the tokens of one step at the time they reach the API server.
func (s *sim) deliver(ems []engine.Emission) {
	for i := range ems {
		em := &ems[i]
		if em.ID&prefillBit != 0 {
			s.prefilled(s.reqs.get(uint64(em.ID&^prefillBit)), em)
			continue
		}
		rs := s.reqs.get(uint64(em.ID))
		if em.Output == 1 {
			rec := s.records.at(rs.rec)
			rec.FirstToken, rec.HasFirstToken = s.now, true
			if !rec.Remote {
				rec.CachedTokens = em.CachedTokens
			}
			// A gateway learns what the engine found cached only from the
			// usage at the end, as live does.
			s.decided(rs.gateway, s.gws[rs.gateway].core.FirstByte(s.now, rs.ticket, -1))
		} else if rs.measured {
			s.itl.Add(s.now - rs.lastToken)
		}
		rs.lastToken = s.now
		if em.Finished {
			// Most tokens are neither a first nor a last one: the record
			// and the gateway are looked up for those only.
			rec := s.records.at(rs.rec)
			core := s.gws[rs.gateway].core
			rec.End = s.now
			rec.OutputTokens = em.Output
			rec.Preemptions = em.Preemptions
			rec.Outcome = results.OutcomeOK
			// The proxy has seen the whole exchange: the engine now holds the
			// prompt and the answer (all but its last token).
			held := min(len(rs.hashes), (rec.PromptTokens+em.Output-1)/s.cfg.Engine.BlockSize)
			others := core.Finished(s.now, rs.ticket, gateway.Usage{Known: true, PromptTokens: rec.PromptTokens, CachedTokens: em.CachedTokens, CompletionTokens: em.Output}, rs.hashes[:held])
			s.end(rs, true)
			s.decided(rs.gateway, others)
		}
	}
}

// applyKVEvents feeds a replica's oldest batch of KV events to every gateway.
func (s *sim) applyKVEvents(i int) {
	batch := s.reps[i].kvBatches.pop()
	s.kvEv = s.kvEv[:0]
	for _, ev := range batch {
		s.kvEv = append(s.kvEv, gateway.FromEngine(ev))
	}
	for _, g := range s.gws {
		g.core.KVEvents(s.now, i, s.kvEv)
	}
}

// scrape refreshes gateway g's copy of engine i's own metrics.
func (s *sim) scrape(g, i int) {
	rep := s.reps[i]
	m := rep.eng.LoadMetrics()
	rep.peakRunning = max(rep.peakRunning, m.Running)
	s.decided(g, s.gws[g].core.Report(s.now, i, gateway.Report{
		Running: m.Running, Waiting: m.Waiting, KVUsage: m.KVCacheUsage, NumGPUBlocks: m.NumGPUBlocks,
		PrefixQueries: m.PrefixCacheQueries, PrefixHits: m.PrefixCacheHits, Preemptions: m.Preemptions,
	}))
	if s.live > 0 {
		s.heap.push(event{at: s.now + s.cfg.ScrapeInterval, kind: evScrape, replica: int32(i), gateway: int32(g)})
	}
}

func (s *sim) output(wall time.Duration) *Output {
	infos := make([]results.ReplicaInfo, len(s.reps))
	engines := make([]engine.Metrics, len(s.reps))
	for i, r := range s.reps {
		engines[i] = r.eng.Metrics()
		filled := time.Duration(r.filled / float64(s.cfg.Engine.Ranks()) * float64(time.Second))
		infos[i] = results.ReplicaInfo{Name: r.name, Busy: engines[i].BusyTime, Filled: filled,
			PeakReservedBlocks: r.peakReserved, PeakRunning: r.peakRunning, CapacityBlocks: engines[i].NumGPUBlocks}
	}
	sum := s.acc.Summary(results.SummaryOptions{
		Replicas:     infos,
		ITL:          s.itl,
		SimulatedEnd: s.now,
		Reasons:      s.cfg.FailureReasons(),
		OfferedRate:  s.cfg.offeredRate(),
	})
	sum.Workload = s.cfg.Workload.Workload
	sum.RateRPS = s.cfg.Workload.Rate
	if s.cfg.Source != nil {
		// A replay offers what its arrivals offer.
		sum.Workload = s.cfg.SourceName
		sum.RateRPS = 0
		if n := s.created; n > 1 && s.lastArr > 0 {
			sum.RateRPS = math.Round(float64(n-1)/s.lastArr.Seconds()*1e4) / 1e4
		}
	}
	sum.Policy = s.cfg.Policy
	sum.Admission = string(s.cfg.Admission)
	sum.Gateways = s.cfg.Gateways
	if s.cfg.Gateways > 1 {
		sum.Ledger = s.cfg.Ledger
	}
	sum.Replicas = len(s.reps)
	sum.TenantLimits = s.cfg.limitsState()
	if s.cfg.Source == nil && len(s.cfg.Workload.WithoutTenants) > 0 {
		sum.WithoutTenants = slices.Clone(s.cfg.Workload.WithoutTenants)
	}
	for i := range sum.PerReplica {
		if r := s.cfg.role(i); r != gateway.RoleBoth {
			sum.PerReplica[i].Role = r.String()
		}
	}
	sum.PD = s.pdSummary(&sum)
	sum.Tiers = tierSummary(s.cfg.Engine, engines)
	sum.Seed = s.cfg.Seed
	sum.SimulatedS = s.now.Seconds()
	sum.SimEvents = s.events
	sum.SimWallS = math.Round(wall.Seconds()*1000) / 1000
	return &Output{Summary: sum, Records: s.kept, Engines: engines, Shadow: s.shadowStats()}
}

// offeredRate is the rate the run's arrivals should come at, for the
// steady-state check (results.SummaryOptions.OfferedRate): the rate of a
// closed-loop workload (workload.ClosedLoop), whose sessions take a while to
// ramp up to it. It is 0 (unchecked) for a trace replay, which offers what
// it offers, for a run that leaves tenants out, and for open-loop
// workloads, whose arrivals hold their rate from the start (Poisson
// arrivals fall short of it by chance only; w5's batches and w7's bursts
// by more, without any ramp).
func (c *Config) offeredRate() float64 {
	if c.Source != nil || !workload.ClosedLoop(c.Workload.Workload) || len(c.Workload.WithoutTenants) > 0 {
		return 0
	}
	return c.Workload.Rate
}

// failReason is the Record.Fail of a request an engine refused.
func failReason(err error) string {
	switch {
	case errors.Is(err, engine.ErrTooLong):
		return results.RejectTooLong
	case errors.Is(err, engine.ErrTooLarge):
		return results.FailTooLarge
	}
	return results.FailEngine
}

// contextLimit is the length past which a gateway refuses a request: the
// configured max_model_len, else the engines'.
func (c *Config) contextLimit() int {
	if c.MaxModelLen > 0 {
		return c.MaxModelLen
	}
	return c.Engine.MaxModelLen
}

// FailureReasons says what the reasons requests fail for mean in a run of
// c, with the limits they hit (results.SummaryOptions.Reasons), e.g.
// too_long: "prompt + max_tokens over max_model_len 32768".
func (c *Config) FailureReasons() map[string]string {
	m := map[string]string{
		results.RejectTooLong: fmt.Sprintf("prompt + max_tokens over max_model_len %d", c.contextLimit()),
		results.FailTooLarge: fmt.Sprintf("prompt + output need more KV blocks than an engine's %d (of %d tokens)",
			c.Engine.NumGPUBlocks, c.Engine.BlockSize),
		results.RejectQueueTimeout: fmt.Sprintf("waited in the gateway's queue past its timeout, %v", c.QueueTimeout),
	}
	if c.QueueMaxRequests > 0 {
		m[results.RejectQueueFull] = fmt.Sprintf("the gateway's queue was full (%d requests)", c.QueueMaxRequests)
	} else {
		m[results.RejectQueueFull] = "no replica admitted it at once and the gateway has no queue (queue max 0)"
	}
	return m
}

// reqTable finds in-flight requests by id: a slice for the dense ids that
// workloads assign (1, 2, 3, ...), a map for any others. The slice starts
// at the oldest dense id still in flight (base), so it spans the requests
// in flight, not the whole run.
type reqTable struct {
	base   uint64 // the id of dense[0]
	dense  []*reqState
	sparse map[uint64]*reqState
}

// maxDenseGap bounds how far past the dense slice an id may be to extend it.
const maxDenseGap = 1 << 16

func (t *reqTable) put(id uint64, rs *reqState) {
	// An id below base wraps around to a huge i and goes to the map.
	if i := id - t.base; i < uint64(len(t.dense))+maxDenseGap {
		for uint64(len(t.dense)) <= i {
			t.dense = append(t.dense, nil)
		}
		t.dense[i] = rs
		return
	}
	t.sparse[id] = rs
}

func (t *reqTable) get(id uint64) *reqState {
	if i := id - t.base; i < uint64(len(t.dense)) {
		if rs := t.dense[i]; rs != nil {
			return rs
		}
	}
	return t.sparse[id]
}

func (t *reqTable) del(id uint64) {
	if i := id - t.base; i < uint64(len(t.dense)) && t.dense[i] != nil {
		t.dense[i] = nil
		// Let go of the ids before the oldest one in flight.
		for len(t.dense) > 0 && t.dense[0] == nil {
			t.dense = t.dense[1:]
			t.base++
		}
		return
	}
	delete(t.sparse, id)
}
