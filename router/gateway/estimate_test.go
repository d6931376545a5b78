package gateway

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// selectNth returns what sorting returns at every index, with repeated
// values and every length up to the estimate's ring.
func TestSelectNthMatchesSort(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.SliceOfN(rapid.Int32Range(0, rapid.Int32Range(1, 1<<30).Draw(t, "top")), 1, 512).Draw(t, "s")
		i := rapid.IntRange(0, len(s)-1).Draw(t, "i")
		want := slices.Sorted(slices.Values(s))[i]
		if got := selectNth(slices.Clone(s), i); got != want {
			t.Fatalf("selectNth(%d) = %d, want %d", i, got, want)
		}
	})
}

// BenchmarkOutputEstimate adds answer lengths to a full estimate, refitting
// its quantile every 16 of them as the gateway does.
func BenchmarkOutputEstimate(b *testing.B) {
	o := outputEstimate{q: 0.75, min: 32}
	x := uint32(1)
	b.ReportAllocs()
	for b.Loop() {
		x = x*1664525 + 1013904223
		o.add(int(x>>20) + 1)
	}
}
