package results

// The summary as it was computed before the Accumulator, over a slice of
// records held whole: the reference the streaming summary must equal bit for
// bit under its exact limit (TestStreamingSummaryEqualsExact).

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// refSummarize is Summarize over records held in memory, with exact
// percentiles from sorted slices.
func refSummarize(recs []Record, opts SummaryOptions) Summary {
	slo := opts.SLO
	def := DefaultSLO()
	if slo.TTFTP99 == 0 {
		slo.TTFTP99 = def.TTFTP99
	}
	if slo.TPOTP99 == 0 {
		slo.TPOTP99 = def.TPOTP99
	}

	// One backing array for the four per-request samples and the scratch
	// space of sortDurations.
	n := len(recs)
	buf := make([]time.Duration, 5*n)
	ttft := buf[0:0:n]
	tpot := buf[n : n : 2*n]
	e2e := buf[2*n : 2*n : 3*n]
	queue := buf[3*n : 3*n : 4*n]
	scratch := buf[4*n:]

	per := make([]ReplicaSummary, len(opts.Replicas))
	var (
		s                         Summary
		first, last, lastArrival  time.Duration
		prompt, cached, predicted int64
		outTokens                 int64
		good                      int
		pred                      predictionAcc
		classes                   bool // a measured request has a non-zero priority
		tenants                   bool // a measured request has a tenant
	)
	s.Rejected = map[string]int{}
	s.FailedBy = map[string]int{}
	for i := range recs {
		r := &recs[i]
		if r.Arrival < opts.Warmup {
			continue
		}
		if s.Requests == 0 || r.Arrival < first {
			first = r.Arrival
		}
		if s.Requests == 0 || r.Arrival > last {
			last = r.Arrival
		}
		lastArrival = max(lastArrival, r.Arrival)
		s.Requests++
		s.Preemptions += r.Preemptions
		classes = classes || r.Priority != 0
		tenants = tenants || r.Tenant != ""

		if r.Outcome == OutcomeRejected {
			s.Failed++
			s.FailedBy[r.failReason()]++
			s.RejectedTotal++
			s.Rejected[r.rejectReason()]++
			continue
		}
		var rs *ReplicaSummary
		if r.Replica >= 0 {
			queue = append(queue, r.Queue())
			if r.Replica < len(per) {
				rs = &per[r.Replica]
				rs.Requests++
				rs.Preemptions += r.Preemptions
			}
		}
		if r.HasFirstToken {
			ttft = append(ttft, r.TTFT())
		}
		if r.Outcome != OutcomeOK {
			s.Failed++
			s.FailedBy[r.failReason()]++
			s.EngineFailed++
			continue
		}

		s.Completed++
		last = max(last, r.End)
		e2e = append(e2e, r.E2E())
		outTokens += int64(r.OutputTokens)
		prompt += int64(r.PromptTokens)
		cached += int64(r.CachedTokens)
		predicted += int64(r.PredictedCachedTokens)
		pred.add(r.PredictedCachedTokens - r.CachedTokens)
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
			tpot = append(tpot, tp)
		}
		if firstTok <= slo.TTFTP99 && (!ok || tp <= slo.TPOTP99) {
			good++
		}
	}

	s.Replicas = len(opts.Replicas)
	for _, d := range [][]time.Duration{ttft, tpot, e2e, queue} {
		sortDurations(d, scratch)
	}
	s.TTFT = latencyOfSorted(ttft)
	s.TPOT = latencyOfSorted(tpot)
	s.E2E = latencyOfSorted(e2e)
	s.QueueMs = latencyOfSorted(queue)
	s.ITL = LatencyOfHistogram(opts.ITL)

	dur := durS(last - first)
	window := durS(lastArrival - first)
	s.WindowS = roundSig(window)
	s.DurationS = roundSig(dur)
	s.ThroughputRPS = roundSig(ratio(float64(s.Completed), dur))
	s.OutputTokensPerS = roundSig(ratio(float64(outTokens), dur))
	s.GoodputRPS = roundSig(ratio(float64(good), window))
	s.FailureReasons = failureReasons(s.FailedBy, opts.Reasons)
	s.Steady = refSteadyState(recs, opts.Warmup, first, lastArrival, slo, opts.OfferedRate, len(opts.Replicas))
	s.HitRate = roundFrac(ratio(float64(cached), float64(prompt)))
	s.PredictedHitRate = roundFrac(ratio(float64(predicted), float64(prompt)))
	s.Prediction = pred.summary()

	s.SLOTTFTP99Ms = roundSig(durMs(slo.TTFTP99))
	s.SLOTPOTP99Ms = roundSig(durMs(slo.TPOTP99))
	s.SLOAttainment = roundFrac(ratio(float64(good), float64(s.Requests)))
	s.SLOMet = s.Completed > 0 &&
		s.TTFT.P99 <= durMs(slo.TTFTP99) &&
		s.TPOT.P99 <= durMs(slo.TPOTP99)

	for i, info := range opts.Replicas {
		rs := &per[i]
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
	if classes {
		s.ByPriority = refByPriority(recs, opts.Warmup)
	}
	if tenants {
		s.PerTenant = refPerTenant(recs, opts.Warmup)
	}

	s.TTFT = s.TTFT.rounded()
	s.TPOT = s.TPOT.rounded()
	s.ITL = s.ITL.rounded()
	s.E2E = s.E2E.rounded()
	s.QueueMs = s.QueueMs.rounded()
	s.SimulatedS = roundSig(durS(opts.SimulatedEnd))
	return s
}

// refClassAcc gathers one priority class for byPriority.
type refClassAcc struct {
	ClassSummary
	ttft, queue []time.Duration
}

// byPriority is Summary.ByPriority over the records arriving at or after
// warmup, by descending priority.
func refByPriority(recs []Record, warmup time.Duration) []ClassSummary {
	accs := map[int]*refClassAcc{}
	for i := range recs {
		r := &recs[i]
		if r.Arrival < warmup {
			continue
		}
		a := accs[r.Priority]
		if a == nil {
			a = &refClassAcc{ClassSummary: ClassSummary{Priority: r.Priority}}
			accs[r.Priority] = a
		}
		a.Requests++
		switch {
		case r.Outcome == OutcomeRejected:
			a.Rejected++
			continue
		case r.Outcome == OutcomeOK:
			a.Completed++
		}
		if r.HasFirstToken {
			a.ttft = append(a.ttft, r.TTFT())
		}
		if r.Replica >= 0 {
			a.queue = append(a.queue, r.Queue())
		}
	}
	out := make([]ClassSummary, 0, len(accs))
	for _, a := range accs {
		slices.Sort(a.ttft)
		slices.Sort(a.queue)
		a.TTFTP99Ms = roundSig(latencyOfSorted(a.ttft).P99)
		a.QueueP99Ms = roundSig(latencyOfSorted(a.queue).P99)
		out = append(out, a.ClassSummary)
	}
	slices.SortFunc(out, func(x, y ClassSummary) int { return cmp.Compare(y.Priority, x.Priority) })
	return out
}

// refTenantAcc gathers one tenant for perTenant.
type refTenantAcc struct {
	TenantSummary
	ttft, e2e []time.Duration
}

// perTenant is Summary.PerTenant over the records arriving at or after
// warmup, by tenant.
func refPerTenant(recs []Record, warmup time.Duration) []TenantSummary {
	accs := map[string]*refTenantAcc{}
	for i := range recs {
		r := &recs[i]
		if r.Arrival < warmup {
			continue
		}
		a := accs[r.Tenant]
		if a == nil {
			a = &refTenantAcc{TenantSummary: TenantSummary{Tenant: r.Tenant, FailedBy: map[string]int{}}}
			accs[r.Tenant] = a
		}
		a.Requests++
		if r.Outcome == OutcomeRejected {
			a.Failed++
			a.FailedBy[r.rejectReason()]++
			continue
		}
		if r.HasFirstToken {
			a.ttft = append(a.ttft, r.TTFT())
		}
		if r.Outcome != OutcomeOK {
			a.Failed++
			a.FailedBy[r.failReason()]++
			continue
		}
		a.Completed++
		a.e2e = append(a.e2e, r.E2E())
	}
	out := make([]TenantSummary, 0, len(accs))
	for _, a := range accs {
		slices.Sort(a.ttft)
		slices.Sort(a.e2e)
		t := latencyOfSorted(a.ttft)
		a.TTFTP50Ms = roundSig(t.P50)
		a.TTFTP99Ms = roundSig(t.P99)
		a.E2EP99Ms = roundSig(latencyOfSorted(a.e2e).P99)
		out = append(out, a.TenantSummary)
	}
	slices.SortFunc(out, func(x, y TenantSummary) int { return cmp.Compare(x.Tenant, y.Tenant) })
	return out
}

// refSteadyState is the steady-state check over records held in memory.
func refSteadyState(recs []Record, warmup, first, last time.Duration, slo SLO, offered float64, replicas int) SteadyState {
	mid := first + (last-first)/2
	var a, b []time.Duration
	total := 0
	var inFirst, inSecond time.Duration // request-time spent in flight in each half
	overlap := func(from, to, lo, hi time.Duration) time.Duration {
		return max(0, min(to, hi)-max(from, lo))
	}
	for i := range recs {
		r := &recs[i]
		end, ended := r.finishedAt()
		if !ended {
			end = last
		}
		inFirst += overlap(r.Arrival, end, first, mid)
		inSecond += overlap(r.Arrival, end, mid, last)
		if r.Arrival < warmup {
			continue
		}
		total++
		if r.Outcome == OutcomeRejected || !r.HasFirstToken {
			continue
		}
		if r.Arrival < mid {
			a = append(a, r.TTFT())
		} else {
			b = append(b, r.TTFT())
		}
	}
	if len(a) < SteadyMinRequests || len(b) < SteadyMinRequests {
		return SteadyState{}
	}
	slices.Sort(a)
	slices.Sort(b)
	st := SteadyState{
		Checked:         true,
		FirstTTFTP99Ms:  roundSig(latencyOfSorted(a).P99),
		SecondTTFTP99Ms: roundSig(latencyOfSorted(b).P99),
		FirstInFlight:   roundSig(ratio(float64(inFirst), float64(mid-first))),
		SecondInFlight:  roundSig(ratio(float64(inSecond), float64(last-mid))),
		ArrivalRPS:      roundSig(ratio(float64(total-1), durS(last-first))),
		OfferedRPS:      roundSig(max(offered, 0)),
	}
	var why []string
	floor := SteadyFloor * durMs(slo.TTFTP99)
	if st.SecondTTFTP99Ms > SteadyRise*st.FirstTTFTP99Ms && st.SecondTTFTP99Ms-st.FirstTTFTP99Ms > floor {
		why = append(why, fmt.Sprintf("TTFT p99 rose from %.0f ms in the first half of the measured window to %.0f ms in the second",
			st.FirstTTFTP99Ms, st.SecondTTFTP99Ms))
	}
	if st.SecondInFlight > SteadyBacklogRise*st.FirstInFlight+float64(max(replicas, 1)) {
		why = append(why, fmt.Sprintf("%.0f requests were in flight on average in the second half of the measured window against %.0f in the first (a growing backlog)",
			st.SecondInFlight, st.FirstInFlight))
	}
	if offered > 0 && st.ArrivalRPS < SteadyRate*offered {
		why = append(why, fmt.Sprintf("requests arrived at %.3g req/s in the measured window against the %.3g configured (a closed loop still ramping up or already winding down, or sessions cut short by max_model_len)",
			st.ArrivalRPS, offered))
	}
	if len(why) > 0 {
		st.Warning = "not steady: " + strings.Join(why, "; ") + "; a longer run may give another answer"
	}
	return st
}
