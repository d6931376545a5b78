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
}

// steadyState checks the measured requests of recs (arriving at or after
// warmup) over the window [first, last] of their arrivals.
func steadyState(recs []Record, warmup, first, last time.Duration, slo SLO, offered float64, replicas int) SteadyState {
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
