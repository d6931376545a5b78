package results

import (
	"math"
	"testing"
)

func TestQuantile(t *testing.T) {
	tests := []struct {
		name   string
		sorted []float64
		q      float64
		want   float64
	}{
		{"empty", nil, 0.5, 0},
		{"empty p99", []float64{}, 0.99, 0},
		{"single p0", []float64{7}, 0, 7},
		{"single p50", []float64{7}, 0.5, 7},
		{"single p99", []float64{7}, 0.99, 7},
		{"pair p50", []float64{1, 3}, 0.5, 2},
		{"pair p90", []float64{1, 3}, 0.9, 2.8},
		{"four p50", []float64{1, 2, 3, 4}, 0.5, 2.5},
		{"four p90", []float64{1, 2, 3, 4}, 0.9, 3.7},
		{"four p99", []float64{1, 2, 3, 4}, 0.99, 3.97},
		{"five p25", []float64{10, 20, 30, 40, 50}, 0.25, 20},
		{"five p90", []float64{10, 20, 30, 40, 50}, 0.9, 46},
		{"ten p99", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 100}, 0.99, 91.81},
		{"dups", []float64{5, 5, 5, 9}, 0.9, 7.8},
		{"min", []float64{1, 2, 3}, 0, 1},
		{"max", []float64{1, 2, 3}, 1, 3},
		{"below range clamps", []float64{1, 2, 3}, -1, 1},
		{"above range clamps", []float64{1, 2, 3}, 2, 3},
		{"nan reads as zero", []float64{1, 2, 3}, math.NaN(), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Quantile(tt.sorted, tt.q)
			if math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("Quantile(%v, %v) = %v, want %v", tt.sorted, tt.q, got, tt.want)
			}
		})
	}
}

func TestLatencyOf(t *testing.T) {
	if got := LatencyOf(nil); got != (Latency{}) {
		t.Errorf("LatencyOf(nil) = %+v, want zero", got)
	}
	if got, want := LatencyOf([]float64{4}), (Latency{4, 4, 4, 4}); got != want {
		t.Errorf("LatencyOf([4]) = %+v, want %+v", got, want)
	}
	got := LatencyOf([]float64{4, 1, 3, 2}) // sorted in place
	want := Latency{Mean: 2.5, P50: 2.5, P90: 3.7, P99: 3.97}
	if math.Abs(got.Mean-want.Mean) > 1e-9 || math.Abs(got.P50-want.P50) > 1e-9 ||
		math.Abs(got.P90-want.P90) > 1e-9 || math.Abs(got.P99-want.P99) > 1e-9 {
		t.Errorf("LatencyOf = %+v, want %+v", got, want)
	}
}

func TestRounding(t *testing.T) {
	tests := []struct {
		in, sig, frac float64
	}{
		{0, 0, 0},
		{1234.56789, 1234.57, 1234.5679},
		{0.000123456789, 0.000123457, 0.0001},
		{2.0 / 3, 0.666667, 0.6667},
		{-1e-9, -1e-9, 0},
		{math.NaN(), 0, 0},
		{math.Inf(1), 0, 0},
	}
	for _, tt := range tests {
		if got := roundSig(tt.in); got != tt.sig {
			t.Errorf("roundSig(%v) = %v, want %v", tt.in, got, tt.sig)
		}
		if got := roundFrac(tt.in); got != tt.frac || math.Signbit(got) {
			t.Errorf("roundFrac(%v) = %v, want %v", tt.in, got, tt.frac)
		}
	}
}
