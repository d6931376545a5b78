package results

import (
	"cmp"
	"maps"
	"slices"
	"time"
)

// DefaultExactLimit is the exact limit of a summary when
// SummaryOptions.ExactLimit is not set: runs of up to 1,048,576 records
// get exact percentiles.
const DefaultExactLimit = 1 << 20

// maxDenseReplica bounds the replica indices an Accumulator counts in a
// slice; larger ones (no fleet has so many) go to a map.
const maxDenseReplica = 1 << 16

// Accumulator computes a run's Summary from its records one at a time, as
// they arrive, without holding them: what Summarize does over a slice, for
// runs too long to keep every record (a 10 M-request replay).
//
// Counts, sums, means, hit rates, failures by reason, SLO attainment,
// goodput and the per-replica, per-priority and per-tenant counts are exact
// whatever the run's length. Percentiles need the values themselves: the
// accumulator keeps them while it has seen at most the exact limit of
// records (SummaryOptions.ExactLimit, DefaultExactLimit by default), and
// then its summary is Summarize's, bit for bit. When one record more
// arrives it moves them into sketches (log-linear histograms, a few
// kilobytes each) for good, and from then on every percentile is within
// PercentileError of the exact one, relative, which the summary says in
// Summary.PercentileError; the steady-state check keeps time bins instead
// of records (SteadyState.BinS). Its memory is then bounded by the number
// of replicas, priorities and tenants, not by the number of records.
//
// The summary does not depend on the order records are added in. An
// Accumulator is not safe for concurrent use.
type Accumulator struct {
	warmup time.Duration
	slo    SLO
	limit  int
	n      int  // records added
	exact  bool // values are kept, not sketched

	s                         Summary // the counts of Summary
	first, last, lastArrival  time.Duration
	prompt, cached, predicted int64
	outTokens                 int64
	good                      int
	pred                      predictionAcc
	classes                   bool // a measured request has a non-zero priority
	tenants                   bool // a measured request has a tenant

	ttft, tpot, e2e, queue dist
	per                    []ReplicaSummary        // by replica index, below maxDenseReplica
	perSparse              map[int]*ReplicaSummary // the others
	byClass                map[int]*classAcc
	byTenant               map[string]*tenantAcc
	steady                 steadyAcc
}

// NewAccumulator returns an empty accumulator for a run summarised with
// opts: it reads opts.Warmup, opts.SLO and opts.ExactLimit; Summary reads
// the rest.
func NewAccumulator(opts SummaryOptions) *Accumulator {
	slo := opts.SLO
	def := DefaultSLO()
	if slo.TTFTP99 == 0 {
		slo.TTFTP99 = def.TTFTP99
	}
	if slo.TPOTP99 == 0 {
		slo.TPOTP99 = def.TPOTP99
	}
	limit := opts.ExactLimit
	if limit <= 0 {
		limit = DefaultExactLimit
	}
	a := &Accumulator{
		warmup:   opts.Warmup,
		slo:      slo,
		limit:    limit,
		exact:    true,
		byClass:  map[int]*classAcc{},
		byTenant: map[string]*tenantAcc{},
	}
	a.s.Rejected = map[string]int{}
	a.s.FailedBy = map[string]int{}
	return a
}

// Exact reports whether the summary's percentiles are still exact: at
// most the exact limit of records were added.
func (a *Accumulator) Exact() bool { return a.exact }

// Add counts one record; r is not kept.
func (a *Accumulator) Add(r *Record) {
	a.n++
	if a.exact && a.n > a.limit {
		a.sketchAll()
	}
	a.steady.add(r, a.warmup)
	if r.Arrival < a.warmup {
		return
	}
	s := &a.s
	if s.Requests == 0 || r.Arrival < a.first {
		a.first = r.Arrival
	}
	if s.Requests == 0 || r.Arrival > a.last {
		a.last = r.Arrival
	}
	a.lastArrival = max(a.lastArrival, r.Arrival)
	s.Requests++
	s.Preemptions += r.Preemptions
	a.classes = a.classes || r.Priority != 0
	a.tenants = a.tenants || r.Tenant != ""
	a.addClass(r)
	a.addTenant(r)

	if r.Outcome == OutcomeRejected {
		s.Failed++
		s.FailedBy[r.failReason()]++
		s.RejectedTotal++
		s.Rejected[r.rejectReason()]++
		return
	}
	var rs *ReplicaSummary
	if r.Replica >= 0 {
		a.queue.add(r.Queue())
		rs = a.replica(r.Replica)
		rs.Requests++
		rs.Preemptions += r.Preemptions
	}
	if r.HasFirstToken {
		a.ttft.add(r.TTFT())
	}
	if r.Outcome != OutcomeOK {
		s.Failed++
		s.FailedBy[r.failReason()]++
		s.EngineFailed++
		return
	}

	s.Completed++
	a.last = max(a.last, r.End)
	a.e2e.add(r.E2E())
	a.outTokens += int64(r.OutputTokens)
	a.prompt += int64(r.PromptTokens)
	a.cached += int64(r.CachedTokens)
	a.predicted += int64(r.PredictedCachedTokens)
	a.pred.add(r.PredictedCachedTokens - r.CachedTokens)
	if rs != nil {
		rs.PromptTokens += int64(r.PromptTokens)
		rs.CachedTokens += int64(r.CachedTokens)
	}

	firstTok := r.E2E()
	if r.HasFirstToken {
		firstTok = r.TTFT()
	}
	tp, ok := r.TPOT()
	if ok {
		a.tpot.add(tp)
	}
	if firstTok <= a.slo.TTFTP99 && (!ok || tp <= a.slo.TPOTP99) {
		a.good++
	}
}

// replica is the counts of replica i; a record dispatched to no replica
// of the summary's counts into a scratch entry that no summary reads.
func (a *Accumulator) replica(i int) *ReplicaSummary {
	if i < maxDenseReplica {
		for len(a.per) <= i {
			a.per = append(a.per, ReplicaSummary{})
		}
		return &a.per[i]
	}
	if a.perSparse == nil {
		a.perSparse = map[int]*ReplicaSummary{}
	}
	rs := a.perSparse[i]
	if rs == nil {
		rs = &ReplicaSummary{}
		a.perSparse[i] = rs
	}
	return rs
}

// classAcc gathers one priority class.
type classAcc struct {
	ClassSummary
	ttft, queue dist
}

func (a *Accumulator) addClass(r *Record) {
	c := a.byClass[r.Priority]
	if c == nil {
		c = &classAcc{ClassSummary: ClassSummary{Priority: r.Priority}}
		if !a.exact {
			c.ttft.sketchAll()
			c.queue.sketchAll()
		}
		a.byClass[r.Priority] = c
	}
	c.Requests++
	switch r.Outcome {
	case OutcomeRejected:
		c.Rejected++
		return
	case OutcomeOK:
		c.Completed++
	}
	if r.HasFirstToken {
		c.ttft.add(r.TTFT())
	}
	if r.Replica >= 0 {
		c.queue.add(r.Queue())
	}
}

// tenantAcc gathers one tenant.
type tenantAcc struct {
	TenantSummary
	ttft, e2e dist
}

func (a *Accumulator) addTenant(r *Record) {
	t := a.byTenant[r.Tenant]
	if t == nil {
		t = &tenantAcc{TenantSummary: TenantSummary{Tenant: r.Tenant, FailedBy: map[string]int{}}}
		if !a.exact {
			t.ttft.sketchAll()
			t.e2e.sketchAll()
		}
		a.byTenant[r.Tenant] = t
	}
	t.Requests++
	if r.Outcome == OutcomeRejected {
		t.Failed++
		t.FailedBy[r.rejectReason()]++
		return
	}
	if r.HasFirstToken {
		t.ttft.add(r.TTFT())
	}
	if r.Outcome != OutcomeOK {
		t.Failed++
		t.FailedBy[r.failReason()]++
		return
	}
	t.Completed++
	t.e2e.add(r.E2E())
}

// sketchAll moves every kept value into sketches, past the exact limit.
func (a *Accumulator) sketchAll() {
	a.exact = false
	for _, d := range []*dist{&a.ttft, &a.tpot, &a.e2e, &a.queue} {
		d.sketchAll()
	}
	for _, c := range a.byClass {
		c.ttft.sketchAll()
		c.queue.sketchAll()
	}
	for _, t := range a.byTenant {
		t.ttft.sketchAll()
		t.e2e.sketchAll()
	}
	a.steady.toBins()
}

// Summary is the summary of the records added so far, as Summarize
// computes it (every field but Workload, Policy, Seed, RateRPS, SimWallS
// and SimEvents, which the caller sets). It reads opts.Replicas, ITL,
// SimulatedEnd, OfferedRate and Reasons; the warmup, SLO and exact limit
// are NewAccumulator's. More records may be added after it.
func (a *Accumulator) Summary(opts SummaryOptions) Summary {
	s := a.s
	s.Rejected = maps.Clone(a.s.Rejected)
	s.FailedBy = maps.Clone(a.s.FailedBy)
	slo := a.slo

	var scratch []time.Duration
	s.Replicas = len(opts.Replicas)
	s.TTFT = a.ttft.latency(&scratch)
	s.TPOT = a.tpot.latency(&scratch)
	s.E2E = a.e2e.latency(&scratch)
	s.QueueMs = a.queue.latency(&scratch)
	s.ITL = LatencyOfHistogram(opts.ITL)
	if !a.exact {
		s.PercentileError = PercentileError
	}

	first, last := a.first, a.last
	dur := durS(last - first)
	window := durS(a.lastArrival - first)
	s.WindowS = roundSig(window)
	s.DurationS = roundSig(dur)
	s.ThroughputRPS = roundSig(ratio(float64(s.Completed), dur))
	s.OutputTokensPerS = roundSig(ratio(float64(a.outTokens), dur))
	s.GoodputRPS = roundSig(ratio(float64(a.good), window))
	s.FailureReasons = failureReasons(s.FailedBy, opts.Reasons)
	s.Steady = a.steady.state(first, a.lastArrival, s.Requests, slo, opts.OfferedRate, len(opts.Replicas))
	s.HitRate = roundFrac(ratio(float64(a.cached), float64(a.prompt)))
	s.PredictedHitRate = roundFrac(ratio(float64(a.predicted), float64(a.prompt)))
	s.Prediction = a.pred.summary()

	s.SLOTTFTP99Ms = roundSig(durMs(slo.TTFTP99))
	s.SLOTPOTP99Ms = roundSig(durMs(slo.TPOTP99))
	s.SLOAttainment = roundFrac(ratio(float64(a.good), float64(s.Requests)))
	s.SLOMet = s.Completed > 0 &&
		s.TTFT.P99 <= durMs(slo.TTFTP99) &&
		s.TPOT.P99 <= durMs(slo.TPOTP99)

	per := make([]ReplicaSummary, len(opts.Replicas))
	for i, info := range opts.Replicas {
		rs := &per[i]
		switch {
		case i < len(a.per):
			*rs = a.per[i]
		case a.perSparse[i] != nil:
			*rs = *a.perSparse[i]
		}
		rs.Replica = info.Name
		rs.HitRate = roundFrac(ratio(float64(rs.CachedTokens), float64(rs.PromptTokens)))
		rs.BusyFraction = roundFrac(ratio(float64(info.Busy), float64(opts.SimulatedEnd)))
		rs.TokenBudgetUse = roundFrac(ratio(float64(info.Filled), float64(opts.SimulatedEnd)))
		rs.PeakReservedBlocks = info.PeakReservedBlocks
		rs.PeakRunning = info.PeakRunning
		rs.CapacityBlocks = info.CapacityBlocks
		s.PeakReservedOverCapacity = max(s.PeakReservedOverCapacity,
			roundFrac(ratio(float64(info.PeakReservedBlocks), float64(info.CapacityBlocks))))
	}
	s.PerReplica = per
	if a.classes {
		s.ByPriority = a.byPriority(&scratch)
	}
	if a.tenants {
		s.PerTenant = a.perTenant(&scratch)
	}

	s.TTFT = s.TTFT.rounded()
	s.TPOT = s.TPOT.rounded()
	s.ITL = s.ITL.rounded()
	s.E2E = s.E2E.rounded()
	s.QueueMs = s.QueueMs.rounded()
	s.SimulatedS = roundSig(durS(opts.SimulatedEnd))
	return s
}

// byPriority is Summary.ByPriority, by descending priority.
func (a *Accumulator) byPriority(scratch *[]time.Duration) []ClassSummary {
	out := make([]ClassSummary, 0, len(a.byClass))
	for _, c := range a.byClass {
		cs := c.ClassSummary
		cs.TTFTP99Ms = roundSig(c.ttft.latency(scratch).P99)
		cs.QueueP99Ms = roundSig(c.queue.latency(scratch).P99)
		out = append(out, cs)
	}
	slices.SortFunc(out, func(x, y ClassSummary) int { return cmp.Compare(y.Priority, x.Priority) })
	return out
}

// perTenant is Summary.PerTenant, by tenant.
func (a *Accumulator) perTenant(scratch *[]time.Duration) []TenantSummary {
	out := make([]TenantSummary, 0, len(a.byTenant))
	for _, t := range a.byTenant {
		ts := t.TenantSummary
		ts.FailedBy = maps.Clone(t.FailedBy)
		l := t.ttft.latency(scratch)
		ts.TTFTP50Ms = roundSig(l.P50)
		ts.TTFTP99Ms = roundSig(l.P99)
		ts.E2EP99Ms = roundSig(t.e2e.latency(scratch).P99)
		out = append(out, ts)
	}
	slices.SortFunc(out, func(x, y TenantSummary) int { return cmp.Compare(x.Tenant, y.Tenant) })
	return out
}

// dist is one latency distribution of a summary: its values while the
// summary is exact, a sketch past its exact limit.
type dist struct {
	vals []time.Duration
	sk   *sketch // nil while exact
}

func (d *dist) add(v time.Duration) {
	if d.sk != nil {
		d.sk.add(v)
		return
	}
	d.vals = append(d.vals, v)
}

// sketchAll moves the values into a sketch, for good.
func (d *dist) sketchAll() {
	if d.sk != nil {
		return
	}
	d.sk = new(sketch)
	for _, v := range d.vals {
		d.sk.add(v)
	}
	d.vals = nil
}

// latency summarises the distribution, unrounded: exactly (sorting the
// values in place, with scratch as the sort's buffer) or from the sketch.
func (d *dist) latency(scratch *[]time.Duration) Latency {
	if d.sk != nil {
		return d.sk.latency()
	}
	if cap(*scratch) < len(d.vals) {
		*scratch = make([]time.Duration, len(d.vals))
	}
	sortDurations(d.vals, (*scratch)[:len(d.vals)])
	return latencyOfSorted(d.vals)
}
