package results

import (
	"math"
	"slices"
	"strconv"
	"time"
)

// Quantile returns the q-quantile of sorted (ascending) by linear
// interpolation between closest ranks, like numpy.percentile's default: the
// value at fractional index q*(len-1). q is clamped to [0, 1] (NaN reads as
// 0). An empty slice gives 0.
func Quantile(sorted []float64, q float64) float64 {
	return interpolate(len(sorted), q, func(i int) float64 { return sorted[i] })
}

// interpolate is Quantile over n sorted values read through at.
func interpolate(n int, q float64, at func(i int) float64) float64 {
	if n == 0 {
		return 0
	}
	if !(q > 0) {
		return at(0)
	}
	if q >= 1 {
		return at(n - 1)
	}
	pos := q * float64(n-1)
	i := int(pos)
	if i >= n-1 {
		return at(n - 1)
	}
	lo, hi := at(i), at(i+1)
	return lo + (hi-lo)*(pos-float64(i))
}

// Latency summarises a latency distribution in milliseconds.
type Latency struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// LatencyOf summarises per-request latencies given in milliseconds, with
// percentiles from Quantile. It sorts ms in place. Values are not rounded;
// an empty slice gives the zero Latency.
func LatencyOf(ms []float64) Latency {
	if len(ms) == 0 {
		return Latency{}
	}
	slices.Sort(ms)
	var sum float64
	for _, v := range ms {
		sum += v
	}
	return Latency{
		Mean: sum / float64(len(ms)),
		P50:  Quantile(ms, 0.50),
		P90:  Quantile(ms, 0.90),
		P99:  Quantile(ms, 0.99),
	}
}

// latencyOfSorted summarises durations sorted in ascending order, in
// milliseconds, like LatencyOf.
func latencyOfSorted(sorted []time.Duration) Latency {
	if len(sorted) == 0 {
		return Latency{}
	}
	var sum float64
	for _, d := range sorted {
		sum += durMs(d)
	}
	at := func(i int) float64 { return durMs(sorted[i]) }
	return Latency{
		Mean: sum / float64(len(sorted)),
		P50:  interpolate(len(sorted), 0.50, at),
		P90:  interpolate(len(sorted), 0.90, at),
		P99:  interpolate(len(sorted), 0.99, at),
	}
}

// LatencyOfHistogram summarises h in milliseconds, with nearest-rank
// percentiles (see Histogram.Quantile). A nil or empty histogram gives the
// zero Latency.
func LatencyOfHistogram(h *Histogram) Latency {
	if h == nil || h.Count() == 0 {
		return Latency{}
	}
	return Latency{
		Mean: durMs(h.Mean()),
		P50:  durMs(h.Quantile(0.50)),
		P90:  durMs(h.Quantile(0.90)),
		P99:  durMs(h.Quantile(0.99)),
	}
}

// rounded returns l with every field rounded by roundSig.
func (l Latency) rounded() Latency {
	return Latency{Mean: roundSig(l.Mean), P50: roundSig(l.P50), P90: roundSig(l.P90), P99: roundSig(l.P99)}
}

// durMs converts a duration to float milliseconds.
func durMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// durS converts a duration to float seconds.
func durS(d time.Duration) float64 { return float64(d) / float64(time.Second) }

// Summary precision: latencies, durations and throughputs keep sigDigits
// significant digits; fractions (hit rates, SLO attainment, busy fractions)
// keep fracDecimals decimal places.
const (
	sigDigits    = 6
	fracDecimals = 4
)

// roundSig rounds x to sigDigits significant digits; non-finite values become 0.
func roundSig(x float64) float64 {
	return roundFmt(x, 'g', sigDigits)
}

// roundFrac rounds x to fracDecimals decimal places; non-finite values become 0.
func roundFrac(x float64) float64 {
	return roundFmt(x, 'f', fracDecimals)
}

// roundFmt rounds through strconv's correctly rounded decimal formatting, so
// the result is exact and platform-independent.
func roundFmt(x float64, format byte, prec int) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	var buf [32]byte
	r, err := strconv.ParseFloat(string(strconv.AppendFloat(buf[:0], x, format, prec, 64)), 64)
	if err != nil || r == 0 {
		return 0 // also turns -0 into 0
	}
	return r
}

// ratio returns num/den, or 0 when den is not positive.
func ratio(num, den float64) float64 {
	if !(den > 0) {
		return 0
	}
	return num / den
}
