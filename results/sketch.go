package results

import (
	"math"
	"math/bits"
	"time"
)

// PercentileError is the relative error bound of every percentile of a
// summary past its exact limit (SummaryOptions.ExactLimit), the value of
// Summary.PercentileError then: each percentile is within 0.4% of the exact
// one. The sketch's buckets give 1/256 (0.39%: see sketch); the rest covers
// the summary's rounding to 6 significant digits.
const PercentileError = 0.004

// Sketch bucketing. Durations below 2*sketchSub nanoseconds (256 ns) have a
// bucket each, so they are exact (a zero router wait stays zero). Above,
// each power-of-two octave [2^e, 2^(e+1)) nanoseconds is cut into sketchSub
// equal buckets, as in Histogram: a bucket is at most 1/128 of its lower
// bound wide, so its midpoint is within 1/256 of any value in it.
const (
	sketchSubBits = 7
	sketchSub     = 1 << sketchSubBits
)

// sketchIndex is the bucket of v.
func sketchIndex(v uint64) int {
	if v < 2*sketchSub {
		return int(v)
	}
	e := bits.Len64(v) - 1 // at least sketchSubBits+1
	return (e-sketchSubBits+1)<<sketchSubBits | (int(v>>(e-sketchSubBits)) - sketchSub)
}

// sketchMid is the value bucket i stands for: the value itself below
// 2*sketchSub, else the bucket's midpoint.
func sketchMid(i int) int64 {
	if i < 2*sketchSub {
		return int64(i)
	}
	e := i>>sketchSubBits + sketchSubBits - 1
	sub := uint64(i & (sketchSub - 1))
	shift := uint(e - sketchSubBits)
	lo := (sketchSub + sub) << shift
	return int64(lo + 1<<(shift-1))
}

// sketch is a log-linear histogram of durations, the stand-in for a sorted
// slice of samples once a run is past its exact limit. Its order statistics
// are within 1/256 of the exact ones, relative (the bucket bounds above);
// Count, Min, Max and the mean are exact. Negative durations are counted as
// zero. Its buckets are a dense slice between the lowest and the highest
// bucket used, so it holds a few kilobytes for latencies that span a few
// decades. The zero value is an empty sketch.
type sketch struct {
	n            int64
	sumHi, sumLo uint64 // exact 128-bit sum, in nanoseconds
	min, max     int64
	off          int     // bucket of counts[0]
	counts       []int64 // counts[i] samples in bucket off+i
}

// add records one sample.
func (s *sketch) add(d time.Duration) {
	v := max(int64(d), 0)
	s.note(v, 1)
	s.bucket(sketchIndex(uint64(v)))[0]++
}

// note counts k samples with sum and extremes v (k = 1) into n, sum, min
// and max.
func (s *sketch) note(v int64, k int64) {
	if s.n == 0 {
		s.min, s.max = v, v
	} else {
		s.min, s.max = min(s.min, v), max(s.max, v)
	}
	s.n += k
	var carry uint64
	s.sumLo, carry = bits.Add64(s.sumLo, uint64(v), 0)
	s.sumHi += carry
}

// bucket returns counts from bucket i on, growing the dense range to hold i.
func (s *sketch) bucket(i int) []int64 {
	switch {
	case len(s.counts) == 0:
		s.off = i
		s.counts = append(s.counts[:0], 0)
	case i < s.off:
		grown := make([]int64, s.off-i+len(s.counts), s.off-i+cap(s.counts))
		copy(grown[s.off-i:], s.counts)
		s.counts, s.off = grown, i
	case i >= s.off+len(s.counts):
		for len(s.counts) <= i-s.off {
			s.counts = append(s.counts, 0)
		}
	}
	return s.counts[i-s.off:]
}

// merge adds every sample of o to s.
func (s *sketch) merge(o *sketch) {
	if o.n == 0 {
		return
	}
	if s.n == 0 {
		s.min, s.max = o.min, o.max
	} else {
		s.min, s.max = min(s.min, o.min), max(s.max, o.max)
	}
	s.n += o.n
	var carry uint64
	s.sumLo, carry = bits.Add64(s.sumLo, o.sumLo, 0)
	s.sumHi += o.sumHi + carry
	s.bucket(o.off)
	s.bucket(o.off + len(o.counts) - 1)
	dst := s.counts[o.off-s.off:]
	for i, c := range o.counts {
		dst[i] += c
	}
}

// valueAt returns the estimated k-th smallest sample (0-based, k in
// [0, n)): exact for the smallest and the largest, else the value of its
// bucket clamped to [min, max].
func (s *sketch) valueAt(k int64) int64 {
	switch {
	case k <= 0:
		return s.min
	case k >= s.n-1:
		return s.max
	}
	var seen int64
	for i, c := range s.counts {
		seen += c
		if seen > k {
			return min(max(sketchMid(s.off+i), s.min), s.max)
		}
	}
	return s.max
}

// meanMs is the exact mean of the samples in milliseconds (0 if none).
func (s *sketch) meanMs() float64 {
	if s.n == 0 {
		return 0
	}
	// Every sample fits an int64, so sumHi < n and the quotient fits too.
	q, r := bits.Div64(s.sumHi, s.sumLo, uint64(s.n))
	return (float64(q) + float64(r)/float64(s.n)) / float64(time.Millisecond)
}

// quantileMs is the q-quantile in milliseconds, interpolated between
// closest ranks like Quantile over the sorted samples, each rank estimated
// by valueAt; within 1/256 of Quantile's value.
func (s *sketch) quantileMs(q float64) float64 {
	return interpolate(int(s.n), q, func(i int) float64 { return durMs(time.Duration(s.valueAt(int64(i)))) })
}

// latency summarises the samples like latencyOfSorted.
func (s *sketch) latency() Latency {
	if s.n == 0 {
		return Latency{}
	}
	return Latency{Mean: s.meanMs(), P50: s.quantileMs(0.50), P90: s.quantileMs(0.90), P99: s.quantileMs(0.99)}
}

// u128 is an unsigned 128-bit integer, for exact sums of many durations.
type u128 struct{ hi, lo uint64 }

func (u u128) add(o u128) u128 {
	lo, c := bits.Add64(u.lo, o.lo, 0)
	return u128{u.hi + o.hi + c, lo}
}

func (u u128) sub(o u128) u128 {
	lo, b := bits.Sub64(u.lo, o.lo, 0)
	return u128{u.hi - o.hi - b, lo}
}

func mul128(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

func (u u128) float() float64 { return float64(u.hi)*math.Exp2(64) + float64(u.lo) }
