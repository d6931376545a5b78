package engine

import (
	"fmt"
	"math"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// StatsInterval is how often vLLM's data-parallel coordinator publishes the
// ranks' waiting and running counts to the API server's load balancer
// (vllm/v1/engine/coordinator.py, DPCoordinator: min_stats_update_interval_ms
// is 100 with the internal load balancer).
const StatsInterval = 100 * time.Millisecond

// Group is one data-parallel deployment: Config.Ranks() engine ranks behind
// vLLM's internal load balancer, seen from outside as one engine (one
// address, one /metrics page, one replica to a router). It has the methods
// of Engine and is driven the same way; with one rank every call goes
// straight to that rank's Engine.
//
// Requests. Add picks a rank as vLLM's API server does and the request
// keeps its id on that rank: ids are the group's, results carry them, and
// Abort finds the rank. Every rank has the limits of Config (max_num_seqs,
// max_num_batched_tokens, num_gpu_blocks and admissibility are per rank).
//
// Load balancing models DPLBAsyncMPClient.get_core_engine_for_request
// (vllm/v1/engine/core_client.py, read at commit 364631ab07d2): the rank
// with the lowest 4*waiting + running over the counts the coordinator last
// published, scanning from the client's start index (0 with one API
// server) so that ties go to the first rank from there; the chosen rank's
// waiting count is raised by one locally until the next publication. The
// coordinator publishes every StatsInterval; here the counts are refreshed
// from the ranks' own counts at each multiple of StatsInterval of virtual
// time (lazily: the first call at or after a boundary reads them before it
// changes anything, which is the ranks' state at the boundary, since a rank
// changes only inside a call). vLLM's coordinator skips a publication when
// no rank's counts changed (and then publishes every 4 s); here every
// boundary refreshes, which differs only in dropping the local increments
// sooner. Newer vLLM (commit 00080ee13c7a) scores max(inflight,
// waiting+running) plus a KV-pressure penalty on waiting and rotates the
// start index after each pick; the rule here is the earlier one.
//
// Stepping. Without ExpertParallel the ranks are independent engines:
// NextStep is the earliest rank's and Step runs that rank's step, returning
// its Result (several ranks may be mid-step at once, so results come in the
// order of their starts, not their ends). With ExpertParallel the ranks run
// in lockstep, as vLLM runs an expert-parallel MoE model (every rank takes
// part in each forward pass; a rank without requests runs a dummy batch
// while any rank has work): one group step starts every rank at the same
// time, lasts as long as the slowest rank's step (a dummy batch costs
// StepFixedMs), and its Result merges the ranks' outputs (emissions,
// preemptions, admissions, KV events, batch features summed) in rank order,
// its tokens reaching the API server at the group's OutputAt.
//
// KV events. Each rank has its own prefix cache, but a router indexes the
// group as one replica: a hash is reported stored when the first rank
// stores it and removed when the last rank holding it evicts it (a count
// of holders per medium and hash: the GPU caches and each lower tier,
// CPU and disk, are counted apart), so the index never forgets a block
// some rank still has. A rank's BlockStored run that other ranks already
// hold in part is split around those hashes, each piece with its own
// parent hash. ResetPrefixCache clears every rank or none.
//
// Metrics are summed over ranks as vLLM's /metrics page of a DP deployment
// adds up per-engine series (running, waiting, blocks, counters);
// KVCacheUsage is used over total blocks. Steps counts the group's steps (a
// lockstep step once); BusyTime is the ranks' mean busy time (in lockstep,
// the time the group was stepping), so busy/elapsed stays within [0, 1].
//
// A Group is not safe for concurrent use.
type Group struct {
	cfg   Config
	ranks []*Engine
	one   *Engine // the only rank, when there is one: every call goes to it
	now   time.Duration

	owner map[RequestID]int32 // each request's rank

	// The load balancer's view: counts as last published, plus local
	// increments; refreshed at lbNext.
	lb      []lbCount
	lbNext  time.Duration
	lbStart int

	// Lockstep state (ExpertParallel).
	lockstep   bool
	busyUntil  time.Duration
	lastOutput time.Duration
	dummy      time.Duration // an idle rank's step: StepFixedMs
	busy       time.Duration
	res        Result // the merged result of a lockstep step

	steps int64 // group steps that ran

	// KV events: holders per hash (GPU caches in held, each other medium
	// in heldIn), and the group's events of the last call.
	held   map[kvblock.Hash]int32
	heldIn map[string]map[kvblock.Hash]int32
	events []KVEvent
}

type lbCount struct{ waiting, running int }

// NewGroup returns an idle group of cfg.Ranks() engines, each with cfg.
// cfg is validated.
func NewGroup(cfg Config) (*Group, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine config: %w", err)
	}
	n := cfg.Ranks()
	g := &Group{cfg: cfg, ranks: make([]*Engine, n)}
	for i := range g.ranks {
		e, err := New(cfg)
		if err != nil {
			return nil, err
		}
		g.ranks[i] = e
	}
	if n == 1 {
		g.one = g.ranks[0]
		return g, nil
	}
	g.init()
	return g, nil
}

// init sets up the state of several ranks (or of one, in tests that drive
// the general path).
func (g *Group) init() {
	g.owner = make(map[RequestID]int32)
	g.lb = make([]lbCount, len(g.ranks))
	g.lockstep = g.cfg.ExpertParallel
	g.dummy = g.cfg.Latency.StepTime(Batch{})
	if g.cfg.EnableKVEvents {
		g.held = make(map[kvblock.Hash]int32)
	}
}

// Config returns the group's configuration.
func (g *Group) Config() Config { return g.cfg }

// Ranks returns the number of engine ranks.
func (g *Group) Ranks() int { return len(g.ranks) }

// Rank returns rank i's engine, to read (its Metrics, its Config); driving
// it directly breaks the group.
func (g *Group) Rank(i int) *Engine { return g.ranks[i] }

// RankOf returns the rank serving request id, while it is in the group.
func (g *Group) RankOf(id RequestID) (int, bool) {
	if g.one != nil {
		_, ok := g.one.seqs[id]
		return 0, ok
	}
	r, ok := g.owner[id]
	return int(r), ok
}

func (g *Group) tell(now time.Duration) {
	if now > g.now {
		g.now = now
	}
	if g.now >= g.lbNext {
		// The coordinator published since the last call: the ranks have not
		// changed since that call, so their counts now are those at the
		// boundary.
		for i, e := range g.ranks {
			g.lb[i] = lbCount{waiting: e.waiting.len(), running: len(e.running)}
		}
		g.lbNext = (g.now/StatsInterval + 1) * StatsInterval
	}
}

// pick returns the rank vLLM's load balancer sends the next request to.
func (g *Group) pick() int {
	n := len(g.lb)
	best, bestScore := g.lbStart%n, math.MaxInt
	for i := range n {
		idx := (g.lbStart + i) % n
		if score := 4*g.lb[idx].waiting + g.lb[idx].running; score < bestScore {
			best, bestScore = idx, score
		}
	}
	return best
}

// Add enqueues req at time now on the rank the load balancer picks. It
// fails as Engine.Add does (the limits are per rank), and if the id is in
// use on any rank.
func (g *Group) Add(now time.Duration, req Request) error {
	if g.one != nil {
		return g.one.Add(now, req)
	}
	g.tell(now)
	if _, dup := g.owner[req.ID]; dup {
		return fmt.Errorf("%w: %d", ErrDuplicateID, req.ID)
	}
	r := g.pick()
	if err := g.ranks[r].Add(now, req); err != nil {
		return err
	}
	g.owner[req.ID] = int32(r)
	g.lb[r].waiting++ // one API server: client_count is 1
	return nil
}

// Abort removes a request from its rank at once (see Engine.Abort).
func (g *Group) Abort(now time.Duration, id RequestID) error {
	if g.one != nil {
		return g.one.Abort(now, id)
	}
	g.tell(now)
	r, ok := g.owner[id]
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownID, id)
	}
	delete(g.owner, id)
	return g.ranks[r].Abort(now, id)
}

// NextStep returns when the group wants to step next: the earliest rank's
// next step, or in lockstep the end of the group's step (or now) while any
// rank has work; ok=false when no rank has work.
func (g *Group) NextStep() (time.Duration, bool) {
	if g.one != nil {
		return g.one.NextStep()
	}
	if g.lockstep {
		// Every rank steps together, as soon as any rank can: a rank with
		// work is due now, unless it has loads from a lower tier in flight
		// and may only wait for them (then its NextStep says when).
		var at time.Duration
		ok := false
		for _, e := range g.ranks {
			if !e.hasWork() {
				continue
			}
			if len(e.loads) == 0 {
				return max(g.now, g.busyUntil), true
			}
			if t, _ := e.NextStep(); !ok || t < at {
				at, ok = t, true
			}
		}
		if !ok {
			return 0, false
		}
		return max(at, g.now, g.busyUntil), true
	}
	var at time.Duration
	ok := false
	for _, e := range g.ranks {
		if t, has := e.NextStep(); has && (!ok || t < at) {
			at, ok = t, true
		}
	}
	if !ok {
		return 0, false
	}
	// A rank not told the latest time (the call went to another) cannot
	// step before it either.
	return max(at, g.now), true
}

// Step runs the group's next step starting at now (or when it is due, if
// later) and returns what it did; the result is valid until the next call.
// Without ExpertParallel it runs the step of the rank due first (the lowest
// rank among those due together; if that rank schedules nothing, the next
// rank due by now); in lockstep every rank steps.
func (g *Group) Step(now time.Duration) *Result {
	if g.one != nil {
		return g.one.Step(now)
	}
	g.tell(now)
	if g.lockstep {
		return g.stepLockstep()
	}
	first, at := -1, time.Duration(0)
	for i, e := range g.ranks {
		if t, ok := e.NextStep(); ok && (first < 0 || t < at) {
			first, at = i, t
		}
	}
	if first < 0 {
		first = 0 // no rank has work: an empty step, as on one engine
	}
	g.events = g.events[:0]
	res := g.ranks[first].Step(g.now)
	if g.held != nil {
		g.events = g.filterEvents(g.events, res.Events)
	}
	for i := first + 1; res.Scheduled == 0 && i < len(g.ranks); i++ {
		if t, ok := g.ranks[i].NextStep(); ok && t <= max(g.now, at) {
			res = g.ranks[i].Step(g.now)
			if g.held != nil {
				// The holders count every rank's events, an empty step's too.
				g.events = g.filterEvents(g.events, res.Events)
			}
		}
	}
	if g.held != nil {
		res.Events = g.events
	}
	g.forgetFinished(res.Emitted)
	if res.Scheduled > 0 {
		g.steps++
	}
	return res
}

// stepLockstep runs one step of every rank together.
func (g *Group) stepLockstep() *Result {
	start := max(g.now, g.busyUntil)
	res := &g.res
	*res = Result{Start: start, Emitted: res.Emitted[:0], Preempted: res.Preempted[:0], Admitted: res.Admitted[:0]}
	g.events = g.events[:0]
	var d time.Duration
	for _, e := range g.ranks {
		if !e.hasWork() {
			d = max(d, g.dummy)
			continue
		}
		r := e.Step(start)
		d = max(d, r.Duration, g.dummy)
		res.Scheduled += r.Scheduled
		res.Batch.PrefillTokens += r.Batch.PrefillTokens
		res.Batch.PrefillPairs += r.Batch.PrefillPairs
		res.Batch.DecodeSeqs += r.Batch.DecodeSeqs
		res.Batch.DecodeCtxTokens += r.Batch.DecodeCtxTokens
		res.Emitted = append(res.Emitted, r.Emitted...)
		res.Preempted = append(res.Preempted, r.Preempted...)
		res.Admitted = append(res.Admitted, r.Admitted...)
		if g.held != nil {
			g.events = g.filterEvents(g.events, r.Events)
		} else {
			g.events = append(g.events, r.Events...)
		}
	}
	res.Events = g.events
	g.forgetFinished(res.Emitted)
	if res.Scheduled == 0 {
		// Nothing ran: no time passes (as with one engine).
		res.OutputAt = max(start, g.lastOutput)
		return res
	}
	res.Duration = d
	g.busyUntil = start + d
	res.OutputAt = g.cfg.Latency.OutputAt(g.busyUntil, d, g.lastOutput)
	g.lastOutput = res.OutputAt
	g.steps++
	g.busy += d
	return res
}

func (g *Group) forgetFinished(ems []Emission) {
	for i := range ems {
		if ems[i].Finished {
			delete(g.owner, ems[i].ID)
		}
	}
}

// filterEvents appends to out what the group reports of one rank's events:
// stored hashes no other rank holds, removed hashes no other rank holds.
func (g *Group) filterEvents(out, evs []KVEvent) []KVEvent {
	for _, ev := range evs {
		switch ev.Kind {
		case BlockStored, BlockRemoved:
			stored := ev.Kind == BlockStored
			held := g.holders(ev.Medium)
			from := -1 // start of the current run of reported hashes
			for k, h := range ev.BlockHashes {
				c := held[h]
				var report bool
				if stored {
					held[h] = c + 1
					report = c == 0
				} else {
					report = c <= 1
					if report {
						delete(held, h)
					} else {
						held[h] = c - 1
					}
				}
				switch {
				case report && from < 0:
					from = k
				case !report && from >= 0:
					out = append(out, subEvent(ev, from, k))
					from = -1
				}
			}
			if from >= 0 {
				out = append(out, subEvent(ev, from, len(ev.BlockHashes)))
			}
		default:
			out = append(out, ev)
		}
	}
	return out
}

// holders returns the holder counts of a medium.
func (g *Group) holders(medium string) map[kvblock.Hash]int32 {
	if medium == MediumGPU {
		return g.held
	}
	m, ok := g.heldIn[medium]
	if !ok {
		if g.heldIn == nil {
			g.heldIn = make(map[string]map[kvblock.Hash]int32)
		}
		m = make(map[kvblock.Hash]int32)
		g.heldIn[medium] = m
	}
	return m
}

// subEvent is ev narrowed to its hashes [from, to): a stored run that starts
// inside ev has the hash before it as its parent.
func subEvent(ev KVEvent, from, to int) KVEvent {
	if from == 0 && to == len(ev.BlockHashes) {
		return ev
	}
	sub := ev
	sub.BlockHashes = ev.BlockHashes[from:to:to]
	if ev.Kind == BlockStored && from > 0 {
		sub.ParentBlockHash, sub.HasParent = ev.BlockHashes[from-1], true
	}
	return sub
}

// ResetPrefixCache drops every rank's cached blocks, as vLLM's
// /reset_prefix_cache does on each engine. It fails (false), resetting no
// rank, while any rank has a block in use. With KV events on, one
// AllBlocksCleared reports the group's reset.
func (g *Group) ResetPrefixCache() (bool, []KVEvent) {
	if g.one != nil {
		return g.one.ResetPrefixCache()
	}
	for _, e := range g.ranks {
		if e.pool.nfree != len(e.pool.blocks) {
			return false, nil
		}
	}
	for _, e := range g.ranks {
		e.ResetPrefixCache()
	}
	g.events = g.events[:0]
	if g.held != nil {
		clear(g.held)
		for _, m := range g.heldIn {
			clear(m)
		}
		g.events = append(g.events, KVEvent{Kind: AllBlocksCleared, Medium: MediumGPU})
		if g.cfg.KVTiers.CPUBlocks > 0 {
			g.events = append(g.events, KVEvent{Kind: AllBlocksCleared, Medium: MediumCPU})
			if g.cfg.KVTiers.DiskBlocks > 0 {
				g.events = append(g.events, KVEvent{Kind: AllBlocksCleared, Medium: MediumDisk})
			}
		}
	}
	return true, g.events
}

// Len returns the number of requests in the group (waiting or running).
func (g *Group) Len() int {
	if g.one != nil {
		return g.one.Len()
	}
	return len(g.owner)
}

// Metrics returns the group's counters and gauges, summed over ranks (see
// Group).
func (g *Group) Metrics() Metrics { return g.metrics((*Engine).Metrics) }

// LoadMetrics is Metrics without CachedBlocks (0): it does not wait for
// the insertions the ranks' steps handed off (HandOffStores), which are
// all that CachedBlocks needs and no load figure does, so a simulator's
// scrape between steps leaves them to the goroutine applying them.
func (g *Group) LoadMetrics() Metrics { return g.metrics((*Engine).loadMetrics) }

func (g *Group) metrics(of func(*Engine) Metrics) Metrics {
	if g.one != nil {
		return of(g.one)
	}
	var m Metrics
	var busy time.Duration
	for _, e := range g.ranks {
		r := of(e)
		m.Running += r.Running
		m.Waiting += r.Waiting
		m.NumGPUBlocks += r.NumGPUBlocks
		m.UsedBlocks += r.UsedBlocks
		m.CachedBlocks += r.CachedBlocks
		m.PrefixCacheQueries += r.PrefixCacheQueries
		m.PrefixCacheHits += r.PrefixCacheHits
		m.CPUHitTokens += r.CPUHitTokens
		m.DiskHitTokens += r.DiskHitTokens
		m.CPUBlocks += r.CPUBlocks
		m.DiskBlocks += r.DiskBlocks
		m.KVLoads += r.KVLoads
		m.KVLoadTime += r.KVLoadTime
		m.RemoteKVTokens += r.RemoteKVTokens
		m.Preemptions += r.Preemptions
		m.PromptTokens += r.PromptTokens
		m.GenerationTokens += r.GenerationTokens
		m.RequestsFinished += r.RequestsFinished
		m.RequestsAborted += r.RequestsAborted
		busy += r.BusyTime
	}
	m.KVCacheUsage = float64(m.UsedBlocks) / float64(m.NumGPUBlocks)
	m.Steps = g.steps
	m.BusyTime = busy / time.Duration(len(g.ranks))
	if g.lockstep {
		m.BusyTime = g.busy
	}
	return m
}

// RankMetrics returns rank i's own counters and gauges, as vLLM's /metrics
// reports them under the label engine="i".
func (g *Group) RankMetrics(i int) Metrics { return g.ranks[i].Metrics() }
