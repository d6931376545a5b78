package results

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The steady-state check (Summary.Steady). A run answers for the load it
// offered only once the fleet has settled into serving it: a queue that
// still grows when arrivals stop, or latencies still climbing, mean that a
// longer run would give another answer (a fleet that "meets the SLO" with
// 5,000 requests may miss it with 12,000). The check cuts the measured
// window in two halves by arrival time and compares them:
//
//   - latency: the TTFT p99 of the requests arriving in the second half is
//     more than SteadyRise times that of the first half, and higher by more
//     than SteadyFloor of the SLO's TTFT bound (so that a rise from 50 to 90
//     ms, harmless against a 2 s bound, does not count);
//   - backlog: the mean number of requests in flight (arrived, not yet
//     finished, warmup requests included) over the second half is more than
//     SteadyBacklogRise times that over the first half, plus one per replica
//     (a queue that grows at a steady pace grows less from half to half the
//     longer it has been growing, so this bound is tighter than latency's);
//   - offered rate: the measured requests arrived at less than SteadyRate of
//     the rate the workload was configured to offer
//     (SummaryOptions.OfferedRate, which the fleet gives for closed loops
//     only): a closed loop (w2's chats, w3's agent tasks) ramps up over a
//     session's lifetime and winds down when it stops starting sessions,
//     and a run too short to hold its rate between the two answers for a
//     lighter load than it names.
//
// Any of them makes Warning say so. The check needs SteadyMinRequests
// measured requests with a first token in each half; with fewer it is not
// made (Checked false).
const (
	SteadyRise        = 1.5
	SteadyFloor       = 0.1
	SteadyBacklogRise = 1.25
	SteadyRate        = 0.9
	SteadyMinRequests = 200
)

// SteadyState is the steady-state check of one run: its two halves of the
// measured window side by side, and a warning when they differ as an
// unsettled run's do (see SteadyRise).
type SteadyState struct {
	// Checked says whether each half had SteadyMinRequests measured
	// requests with a first token; when false the other fields are zero.
	Checked bool `json:"checked"`
	// FirstTTFTP99Ms and SecondTTFTP99Ms are the TTFT p99 of the measured
	// requests with a first token (rejections left out, as in
	// Summary.TTFT) arriving in the first and the second half of the
	// measured window.
	FirstTTFTP99Ms  float64 `json:"first_half_ttft_p99_ms"`
	SecondTTFTP99Ms float64 `json:"second_half_ttft_p99_ms"`
	// FirstInFlight and SecondInFlight are the mean numbers of requests in
	// flight (arrived and not finished, whatever their outcome; a request
	// whose end is unknown stays in flight) over the first and the second
	// half of the measured window.
	FirstInFlight  float64 `json:"first_half_in_flight"`
	SecondInFlight float64 `json:"second_half_in_flight"`
	// ArrivalRPS is the rate at which the measured requests arrived: the
	// gaps between them, Requests-1, over the window (0 with fewer than
	// two); OfferedRPS is SummaryOptions.OfferedRate (0: not known, not
	// checked).
	ArrivalRPS float64 `json:"arrival_rps"`
	OfferedRPS float64 `json:"offered_rps,omitempty"`
	// Warning says why the run looks too short for its answer, "" when it
	// looks steady (or was not checked).
	Warning string `json:"warning,omitempty"`
	// BinS is 0 (omitted) when the check is exact. Past the summary's
	// exact limit (SummaryOptions.ExactLimit) the check keeps, instead of
	// every request, steadyBins time bins of BinS seconds each (arrival
	// counts, completion counts and a TTFT sketch): the halves are then cut
	// at the bin edge nearest the middle of the window, the TTFT p99s are
	// within PercentileError, and the in-flight means are exact at bin
	// edges and interpolated linearly inside the bins holding the window's
	// first and last arrivals.
	BinS float64 `json:"bin_s,omitempty"`
}

// steadyRec is what the exact check keeps of one record.
type steadyRec struct {
	arrival, end, ttft time.Duration
	flags              uint8
}

// The flags of a steadyRec.
const (
	steadyEnded    = 1 << iota // end is known (finishedAt)
	steadyMeasured             // arrived at or after warmup
	steadyTTFT                 // measured, not rejected, with a first token: ttft counts
)

// steadyBins is how many time bins the check keeps past the exact limit.
const steadyBins = 512

// steadyAcc gathers the steady-state check as records arrive: every
// record (warmup ones too, for the requests in flight) while the summary is
// exact, time bins past its exact limit.
type steadyAcc struct {
	recs []steadyRec
	bins *timeBins // nil while exact
}

// add counts one record.
func (a *steadyAcc) add(r *Record, warmup time.Duration) {
	sr := steadyRec{arrival: r.Arrival}
	if end, ended := r.finishedAt(); ended {
		sr.end = end
		sr.flags |= steadyEnded
	}
	if r.Arrival >= warmup {
		sr.flags |= steadyMeasured
		if r.Outcome != OutcomeRejected && r.HasFirstToken {
			sr.flags |= steadyTTFT
			sr.ttft = r.TTFT()
		}
	}
	if a.bins != nil {
		a.bins.add(sr)
		return
	}
	a.recs = append(a.recs, sr)
}

// toBins moves the kept records into time bins, for good.
func (a *steadyAcc) toBins() {
	if a.bins != nil {
		return
	}
	a.bins = &timeBins{width: 1}
	for _, sr := range a.recs {
		a.bins.add(sr)
	}
	a.recs = nil
}

// state is the check over the measured window [first, last] of arrivals;
// total is the number of measured requests.
func (a *steadyAcc) state(first, last time.Duration, total int, slo SLO, offered float64, replicas int) SteadyState {
	var st SteadyState
	var ok bool
	if a.bins != nil {
		st, ok = a.bins.state(first, last)
	} else {
		st, ok = a.exact(first, last)
	}
	if !ok {
		return SteadyState{}
	}
	st.Checked = true
	st.ArrivalRPS = roundSig(ratio(float64(total-1), durS(last-first)))
	st.OfferedRPS = roundSig(max(offered, 0))
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

// exact is the check's halves from every record kept; ok is false when a
// half has fewer than SteadyMinRequests requests with a first token.
func (a *steadyAcc) exact(first, last time.Duration) (SteadyState, bool) {
	mid := first + (last-first)/2
	var x, y []time.Duration
	var inFirst, inSecond time.Duration // request-time spent in flight in each half
	overlap := func(from, to, lo, hi time.Duration) time.Duration {
		return max(0, min(to, hi)-max(from, lo))
	}
	for i := range a.recs {
		r := &a.recs[i]
		end := r.end
		if r.flags&steadyEnded == 0 {
			end = last
		}
		inFirst += overlap(r.arrival, end, first, mid)
		inSecond += overlap(r.arrival, end, mid, last)
		if r.flags&steadyTTFT == 0 {
			continue
		}
		if r.arrival < mid {
			x = append(x, r.ttft)
		} else {
			y = append(y, r.ttft)
		}
	}
	if len(x) < SteadyMinRequests || len(y) < SteadyMinRequests {
		return SteadyState{}, false
	}
	slices.Sort(x)
	slices.Sort(y)
	return SteadyState{
		FirstTTFTP99Ms:  roundSig(latencyOfSorted(x).P99),
		SecondTTFTP99Ms: roundSig(latencyOfSorted(y).P99),
		FirstInFlight:   roundSig(ratio(float64(inFirst), float64(mid-first))),
		SecondInFlight:  roundSig(ratio(float64(inSecond), float64(last-mid))),
	}, true
}

// timeBin is one bin of timeBins.
type timeBin struct {
	// arrivals and ends count the records arriving, and the records with
	// a known end ending, in the bin; arrSum and endSum sum those times in
	// nanoseconds.
	arrivals, ends int64
	arrSum, endSum u128
	// ttft holds the TTFT of the measured requests arriving in the bin
	// that count in the check (steadyTTFT).
	ttft sketch
}

// timeBins is the steady-state check past the exact limit: steadyBins
// bins of width nanoseconds each from time 0. The width is the smallest
// power of two for which the bins cover every arrival and every known end
// so far: when a time falls past the last bin the width doubles and pairs
// of bins merge, so the bins depend on the records only, not on their
// order.
type timeBins struct {
	width time.Duration
	bins  [steadyBins]timeBin
}

// cover widens the bins until they cover t.
func (t *timeBins) cover(v time.Duration) {
	for v/t.width >= steadyBins {
		for i := range steadyBins / 2 {
			a, b := &t.bins[2*i], &t.bins[2*i+1]
			m := timeBin{arrivals: a.arrivals + b.arrivals, ends: a.ends + b.ends,
				arrSum: a.arrSum.add(b.arrSum), endSum: a.endSum.add(b.endSum), ttft: a.ttft}
			m.ttft.merge(&b.ttft)
			t.bins[i] = m
		}
		for i := steadyBins / 2; i < steadyBins; i++ {
			t.bins[i] = timeBin{}
		}
		t.width *= 2
	}
}

// add counts one record. Negative times count as 0, and an end before its
// arrival as the arrival (no time in flight), as the exact check counts it.
func (t *timeBins) add(r steadyRec) {
	arr := max(r.arrival, 0)
	t.cover(arr)
	b := &t.bins[arr/t.width]
	b.arrivals++
	b.arrSum = b.arrSum.add(u128{lo: uint64(arr)})
	if r.flags&steadyTTFT != 0 {
		b.ttft.add(r.ttft)
	}
	if r.flags&steadyEnded != 0 {
		end := max(r.end, arr)
		t.cover(end)
		e := &t.bins[end/t.width]
		e.ends++
		e.endSum = e.endSum.add(u128{lo: uint64(end)})
	}
}

// inFlight returns the integral of the requests in flight from 0 to each
// bin edge: f[k] for time k*width, k in [0, steadyBins]. With A arrivals
// and E ends before x, summing a and e over them, the integral to x is
// sum(e) - sum(a) + x*(A-E): every request that ended before x was in
// flight e-a, every other one arrived before x was so far x-a.
func (t *timeBins) inFlight() []float64 {
	f := make([]float64, steadyBins+1)
	var arr, ends int64
	var arrSum, endSum u128
	for k := 1; k <= steadyBins; k++ {
		b := &t.bins[k-1]
		arr, ends = arr+b.arrivals, ends+b.ends
		arrSum, endSum = arrSum.add(b.arrSum), endSum.add(b.endSum)
		x := uint64(k) * uint64(t.width)
		f[k] = endSum.add(mul128(x, uint64(arr-ends))).sub(arrSum).float()
	}
	return f
}

// state is the check's halves from the bins (see SteadyState.BinS).
func (t *timeBins) state(first, last time.Duration) (SteadyState, bool) {
	w := t.width
	// The bin edge nearest the middle, inside the window when one is.
	mid := first + (last-first)/2
	k := int64((mid + w/2) / w)
	k = min(max(k, int64((first+w-1)/w)), int64(last/w))
	k = min(max(k, 0), steadyBins)
	cut := time.Duration(k) * w
	var x, y sketch
	for i := range steadyBins {
		if int64(i) < k {
			x.merge(&t.bins[i].ttft)
		} else {
			y.merge(&t.bins[i].ttft)
		}
	}
	if x.n < SteadyMinRequests || y.n < SteadyMinRequests {
		return SteadyState{}, false
	}
	f := t.inFlight()
	at := func(v time.Duration) float64 {
		v = min(max(v, 0), steadyBins*w)
		i := int(v / w)
		if i == steadyBins {
			return f[i]
		}
		return f[i] + (f[i+1]-f[i])*float64(v-time.Duration(i)*w)/float64(w)
	}
	return SteadyState{
		FirstTTFTP99Ms:  roundSig(x.quantileMs(0.99)),
		SecondTTFTP99Ms: roundSig(y.quantileMs(0.99)),
		FirstInFlight:   roundSig(ratio(at(cut)-at(first), float64(cut-first))),
		SecondInFlight:  roundSig(ratio(at(last)-at(cut), float64(last-cut))),
		BinS:            roundSig(durS(w)),
	}, true
}

// finishedAt is when a request left the fleet: its end if it completed,
// else its first token (the last time known of it) or its arrival; ended is
// false for a request with no known end (aborted or failed after its first
// token: it counts as in flight until the run stopped).
func (r *Record) finishedAt() (time.Duration, bool) {
	switch r.Outcome {
	case OutcomeOK:
		return r.End, true
	case OutcomeRejected:
		return r.Arrival, true
	case OutcomeFailed:
		if !r.HasFirstToken {
			return max(r.Arrival, r.Dispatch), true
		}
	}
	return 0, false
}
