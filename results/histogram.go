package results

import (
	"math"
	"math/bits"
	"time"
)

// Histogram bucketing. Durations below subMicro nanoseconds share one bucket.
// Above it, each power-of-two octave [2^e, 2^(e+1)) nanoseconds is split into
// subBuckets equal-width buckets, so a bucket is at most 1/subBuckets (0.78%)
// of its lower bound wide: log-linear, approximately 1% geometric.
const (
	subMicro      = int64(time.Microsecond)
	subBucketBits = 7
	subBuckets    = 1 << subBucketBits
	// minOctave is the octave holding subMicro: 2^9 <= 1000 < 2^10.
	minOctave = 9
	// maxOctave is the octave holding math.MaxInt64.
	maxOctave  = 62
	numBuckets = (maxOctave - minOctave + 1) * subBuckets
)

// Histogram is a log-bucketed histogram of durations, meant for metrics with
// millions of samples such as inter-token latency.
//
// Quantiles are nearest-rank (see Quantile) and are reported to within 0.4%
// relative error for samples of at least one microsecond; Count, Mean, Min
// and Max are exact. Samples under a microsecond share a single bucket that
// reports the mean of its samples (exact when they are all zero). Negative
// durations are recorded as zero.
//
// Add is O(1) and allocation-free. The zero value is an empty histogram ready
// to use; NewHistogram is provided for symmetry. A Histogram is not safe for
// concurrent use.
type Histogram struct {
	count        int64
	sumHi, sumLo uint64 // exact 128-bit sum of samples, in nanoseconds
	min, max     int64
	zero         int64  // samples below subMicro
	zeroSum      uint64 // their sum, in nanoseconds
	counts       [numBuckets]int64
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram { return new(Histogram) }

// bucketOf returns the bucket index of v >= subMicro.
func bucketOf(v uint64) int {
	e := bits.Len64(v) - 1
	sub := int(v>>(e-subBucketBits)) - subBuckets
	return (e-minOctave)<<subBucketBits | sub
}

// bucketMid returns the midpoint of bucket i, in nanoseconds.
func bucketMid(i int) int64 {
	e := i>>subBucketBits + minOctave
	sub := uint64(i & (subBuckets - 1))
	shift := uint(e - subBucketBits)
	lo := (subBuckets + sub) << shift
	return int64(lo + 1<<(shift-1))
}

// Add records one sample.
func (h *Histogram) Add(d time.Duration) {
	v := max(int64(d), 0)
	if h.count == 0 {
		h.min, h.max = v, v
	} else {
		h.min = min(h.min, v)
		h.max = max(h.max, v)
	}
	h.count++
	var carry uint64
	h.sumLo, carry = bits.Add64(h.sumLo, uint64(v), 0)
	h.sumHi += carry
	if v < subMicro {
		h.zero++
		h.zeroSum += uint64(v)
		return
	}
	h.counts[bucketOf(uint64(v))]++
}

// Count returns the number of samples.
func (h *Histogram) Count() int64 { return h.count }

// Min returns the smallest sample, or 0 if there are none.
func (h *Histogram) Min() time.Duration { return time.Duration(h.min) }

// Max returns the largest sample, or 0 if there are none.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean returns the exact mean of the samples, truncated to a nanosecond, or 0
// if there are none.
func (h *Histogram) Mean() time.Duration {
	if h.count == 0 {
		return 0
	}
	// Every sample fits in an int64, so the mean does too and sumHi < count.
	q, _ := bits.Div64(h.sumHi, h.sumLo, uint64(h.count))
	return time.Duration(q)
}

// Quantile returns the nearest-rank q-quantile: the k-th smallest sample with
// k = ceil(q*Count()), at least 1. Quantile(0) is the minimum and Quantile(1)
// the maximum, both exact; other quantiles are the midpoint of the bucket
// holding the k-th sample, clamped to [Min, Max]. q is clamped to [0, 1] (NaN
// reads as 0). An empty histogram returns 0.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.count == 0 {
		return 0
	}
	if !(q > 0) {
		return time.Duration(h.min)
	}
	if q >= 1 {
		return time.Duration(h.max)
	}
	k := nearestRank(q, h.count)
	var v int64
	if k <= h.zero {
		v = int64(h.zeroSum / uint64(h.zero))
	} else {
		seen := h.zero
		for i := range h.counts {
			seen += h.counts[i]
			if seen >= k {
				v = bucketMid(i)
				break
			}
		}
	}
	return time.Duration(min(max(v, h.min), h.max))
}

// nearestRank returns ceil(q*n) clamped to [1, n], for q in (0, 1).
func nearestRank(q float64, n int64) int64 {
	k := int64(math.Ceil(q * float64(n)))
	return min(max(k, 1), n)
}

// Merge adds every sample of o to h. Merging a nil or empty histogram is a
// no-op.
func (h *Histogram) Merge(o *Histogram) {
	if o == nil || o.count == 0 {
		return
	}
	if h.count == 0 {
		h.min, h.max = o.min, o.max
	} else {
		h.min = min(h.min, o.min)
		h.max = max(h.max, o.max)
	}
	h.count += o.count
	var carry uint64
	h.sumLo, carry = bits.Add64(h.sumLo, o.sumLo, 0)
	h.sumHi += o.sumHi + carry
	h.zero += o.zero
	h.zeroSum += o.zeroSum
	for i := range h.counts {
		h.counts[i] += o.counts[i]
	}
}
