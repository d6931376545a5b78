package results

import (
	"math"
	"math/big"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// drawDurations draws between 1 and 2000 durations, log-uniform in
// [1µs, 100s], with repeats.
func drawDurations(t *rapid.T) []time.Duration {
	logs := rapid.SliceOfN(rapid.Float64Range(math.Log(1e3), math.Log(100e9)), 1, 2000).Draw(t, "logs")
	ds := make([]time.Duration, len(logs))
	for i, l := range logs {
		ds[i] = time.Duration(math.Round(math.Exp(l)))
		ds[i] = min(max(ds[i], time.Microsecond), 100*time.Second)
	}
	return ds
}

// exactMean is the sum of ds divided by their count, truncated.
func exactMean(ds []time.Duration) time.Duration {
	sum := new(big.Int)
	for _, d := range ds {
		sum.Add(sum, big.NewInt(int64(d)))
	}
	return time.Duration(sum.Quo(sum, big.NewInt(int64(len(ds)))).Int64())
}

// TestHistogramProperties checks the documented contract against exact
// statistics of the samples. The reference quantile is nearest rank: the
// k-th smallest sample, k = ceil(q*n) clamped to [1, n]. To allow for
// floating-point rounding of q*n the reported value may lie anywhere within
// 1% of the samples at ranks k-1..k+1.
func TestHistogramProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ds := drawDurations(t)
		split := rapid.IntRange(0, len(ds)).Draw(t, "split")

		h := NewHistogram()
		a, b := NewHistogram(), NewHistogram()
		for i, d := range ds {
			h.Add(d)
			if i < split {
				a.Add(d)
			} else {
				b.Add(d)
			}
		}
		sorted := slices.Clone(ds)
		slices.Sort(sorted)
		n := len(sorted)

		if h.Count() != int64(n) {
			t.Fatalf("Count = %d, want %d", h.Count(), n)
		}
		if got, want := h.Mean(), exactMean(ds); got != want {
			t.Fatalf("Mean = %v, want %v", got, want)
		}
		if h.Min() != sorted[0] || h.Max() != sorted[n-1] {
			t.Fatalf("Min, Max = %v, %v, want %v, %v", h.Min(), h.Max(), sorted[0], sorted[n-1])
		}

		qs := []float64{0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1}
		qs = append(qs, rapid.SliceOfN(rapid.Float64Range(0, 1), 1, 5).Draw(t, "qs")...)
		for _, q := range qs {
			k := int(math.Ceil(q * float64(n)))
			lo := sorted[min(max(k-2, 0), n-1)]
			hi := sorted[min(max(k, 0), n-1)]
			got := h.Quantile(q)
			if float64(got) < 0.99*float64(lo) || float64(got) > 1.01*float64(hi) {
				t.Fatalf("Quantile(%v) = %v, want within 1%% of [%v, %v] (n=%d)", q, got, lo, hi, n)
			}
		}

		a.Merge(b)
		if *a != *h {
			t.Fatalf("Merge differs from adding all samples")
		}
	})
}

func TestHistogramEdgeCases(t *testing.T) {
	h := NewHistogram()
	if h.Count() != 0 || h.Mean() != 0 || h.Quantile(0.5) != 0 || h.Min() != 0 || h.Max() != 0 {
		t.Fatalf("empty histogram not all zero")
	}

	// Zeros, negatives (recorded as zero) and sub-microsecond samples.
	for _, d := range []time.Duration{0, -5, 0, 0} {
		h.Add(d)
	}
	if got := h.Quantile(0.99); got != 0 {
		t.Errorf("all-zero Quantile(0.99) = %v, want 0", got)
	}
	h.Add(400 * time.Nanosecond)
	if got := h.Quantile(0.5); got != 80*time.Nanosecond {
		t.Errorf("sub-microsecond Quantile(0.5) = %v, want the bucket mean 80ns", got)
	}
	if got := h.Quantile(1); got != 400*time.Nanosecond {
		t.Errorf("Quantile(1) = %v, want 400ns", got)
	}

	// Extremes must not overflow.
	var big Histogram
	big.Add(math.MaxInt64)
	big.Add(math.MaxInt64)
	big.Add(time.Microsecond)
	if got, want := big.Mean(), exactMean([]time.Duration{math.MaxInt64, math.MaxInt64, time.Microsecond}); got != want {
		t.Errorf("Mean near MaxInt64 = %d", got)
	}
	if got := big.Quantile(0.5); float64(got) < 0.99*math.MaxInt64 {
		t.Errorf("Quantile(0.5) near MaxInt64 = %d", got)
	}

	// Merging nil, empty and self.
	var m Histogram
	m.Merge(nil)
	m.Merge(NewHistogram())
	m.Add(time.Millisecond)
	m.Add(3 * time.Millisecond)
	m.Merge(&m)
	if m.Count() != 4 || m.Mean() != 2*time.Millisecond || m.Min() != time.Millisecond || m.Max() != 3*time.Millisecond {
		t.Errorf("self-merge: count %d mean %v min %v max %v", m.Count(), m.Mean(), m.Min(), m.Max())
	}
}

func TestHistogramAddAllocs(t *testing.T) {
	h := NewHistogram()
	allocs := testing.AllocsPerRun(1000, func() { h.Add(1234567 * time.Nanosecond) })
	if allocs != 0 {
		t.Errorf("Add allocates %v times", allocs)
	}
}

func BenchmarkHistogramAdd(b *testing.B) {
	h := NewHistogram()
	b.ReportAllocs()
	x := uint64(1)
	for b.Loop() {
		x = x*6364136223846793005 + 1442695040888963407
		h.Add(time.Duration(x >> 27)) // up to ~137s
	}
}
