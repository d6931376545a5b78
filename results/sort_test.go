package results

import (
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestSortDurations(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		gen := rapid.OneOf(
			rapid.Int64(),
			rapid.Int64Range(0, int64(time.Minute)),
			rapid.Int64Range(-1000, 1000),
		)
		raw := rapid.SliceOfN(gen, 0, 3*radixMin).Draw(t, "values")
		d := make([]time.Duration, len(raw))
		for i, v := range raw {
			d[i] = time.Duration(v)
		}
		want := slices.Clone(d)
		slices.Sort(want)
		sortDurations(d, make([]time.Duration, len(d)))
		if !slices.Equal(d, want) {
			t.Fatalf("sortDurations = %v, want %v", d, want)
		}
	})
}

func TestSortDurationsLarge(t *testing.T) {
	x := uint64(12345)
	d := make([]time.Duration, 10*radixMin)
	for i := range d {
		x = x*6364136223846793005 + 1442695040888963407
		d[i] = time.Duration(x >> (x % 40)) // mixed magnitudes, some negative
	}
	want := slices.Clone(d)
	slices.Sort(want)
	sortDurations(d, make([]time.Duration, len(d)))
	if !slices.Equal(d, want) {
		t.Fatal("sortDurations differs from slices.Sort")
	}
}
