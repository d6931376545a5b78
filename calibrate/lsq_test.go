package calibrate

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/engine"
)

// synthRows models a standard design with profile p plus relative noise.
func synthRows(p engine.Profile, noise float64, rng *rand.Rand) []Row {
	d, _ := NewDesign(DesignOptions{})
	c := coefs(p)
	var truth ProfileEstimator
	copy(truth[:], c[:])
	truth[5] = 0.4 // client overhead, ms
	var rows []Row
	for _, s := range d.Probes {
		var r Row
		switch s.Kind {
		case ProbeDecode:
			r = DecodeRow(s.Batch, float64(s.Batch*(s.Prompt+s.Output/2)))
		default:
			r = PrefillRow(s.Prompt, s.Cached, d.MaxNumBatchedTokens)
		}
		r.Y = dot(r.X, truth) * (1 + noise*rng.NormFloat64())
		rows = append(rows, r)
	}
	return rows
}

func TestFitRowsRecoversWithNoise(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	want := engine.DefaultConfig().Latency
	fit, err := FitRows(synthRows(want, 0.01, rng))
	if err != nil {
		t.Fatal(err)
	}
	w := coefs(want)
	// 1% noise: every coefficient within 3 standard errors and within 15%.
	for i, c := range fit.Coefficients[:5] {
		if d := math.Abs(c.Value - w[i]); d > 3*c.StdErr+1e-9 || d > 0.15*w[i] {
			t.Errorf("%s = %.4g ± %.2g, want %.4g", c.Name, c.Value, c.StdErr, w[i])
		}
	}
	if fit.RelRMS < 0.003 || fit.RelRMS > 0.03 {
		t.Errorf("relative RMS %.4f, want about the 1%% noise", fit.RelRMS)
	}
}

// TestFitRowsExactProperty: without noise, any positive profile comes back exactly.
func TestFitRowsExactProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := engine.Profile{
			StepFixedMs:      rapid.Float64Range(1, 100).Draw(t, "fixed"),
			PrefillTokenUs:   rapid.Float64Range(1, 1000).Draw(t, "token"),
			PrefillPairNs:    rapid.Float64Range(0.1, 50).Draw(t, "pair"),
			DecodeSeqUs:      rapid.Float64Range(1, 1000).Draw(t, "seq"),
			DecodeCtxTokenNs: rapid.Float64Range(1, 1000).Draw(t, "ctx"),
		}
		fit, err := FitRows(synthRows(p, 0, rand.New(rand.NewPCG(1, 1))))
		if err != nil {
			t.Fatal(err)
		}
		w := coefs(p)
		for i, c := range fit.Coefficients[:5] {
			if math.Abs(c.Value-w[i]) > 1e-6*w[i] {
				t.Fatalf("%s = %v, want %v", c.Name, c.Value, w[i])
			}
		}
	})
}

// TestFitRowsLeavesOutDelayedRows: rows a busy machine delayed (time only
// ever added, here 10 to 40 ms on rows of every kind) are left out and the
// profile still comes back within 2%, where plain least squares is pulled off.
func TestFitRowsLeavesOutDelayedRows(t *testing.T) {
	want := engine.Profile{StepFixedMs: 9, PrefillTokenUs: 70, PrefillPairNs: 3, DecodeSeqUs: 60, DecodeCtxTokenNs: 40}
	rng := rand.New(rand.NewPCG(3, 3))
	var rows []Row
	for range 3 {
		rows = append(rows, synthRows(want, 0.002, rng)...)
	}
	delayed := []int{3, 11, 20, 26, 40, 47, 58}
	for k, i := range delayed {
		rows[i].Y += 10 + 5*float64(k)
	}
	fit, err := FitRows(rows)
	if err != nil {
		t.Fatal(err)
	}
	w := coefs(want)
	for i, c := range fit.Coefficients[:5] {
		if rel := math.Abs(c.Value-w[i]) / w[i]; rel > 0.02 {
			t.Errorf("%s = %.4g, want %.4g (%.1f%% off)", c.Name, c.Value, w[i], 100*rel)
		}
	}
	for _, i := range delayed {
		if !slices.Contains(fit.Outliers, i) {
			t.Errorf("delayed row %d (y %.1f ms) not left out; outliers %v", i, rows[i].Y, fit.Outliers)
		}
	}
	if len(fit.Outliers) > len(delayed)+2 {
		t.Errorf("%d rows left out %v, want about the %d delayed", len(fit.Outliers), fit.Outliers, len(delayed))
	}
}

func TestFitRowsRefusesPoorDesign(t *testing.T) {
	p := engine.DefaultConfig().Latency
	c := coefs(p)
	var truth ProfileEstimator
	copy(truth[:], c[:])
	row := func(r Row) Row { r.Y = dot(r.X, truth); return r }
	cases := []struct {
		name    string
		rows    []Row
		mention string
	}{
		{"one prompt length", func() []Row {
			var rs []Row
			for range 10 {
				rs = append(rs, row(PrefillRow(512, 0, 2048)))
			}
			for b := 1; b <= 32; b *= 2 {
				rs = append(rs, row(DecodeRow(b, float64(b*700))))
			}
			return rs
		}(), "prefill_token_us"},
		{"no decode", func() []Row {
			var rs []Row
			for u := 32; u <= 8192; u *= 2 {
				rs = append(rs, row(PrefillRow(u, 0, 2048)), row(PrefillRow(32, u, 2048)))
			}
			return rs
		}(), "decode_seq_us"},
		{"batch and context in lockstep", func() []Row {
			var rs []Row
			for u := 32; u <= 8192; u *= 2 {
				rs = append(rs, row(PrefillRow(u, 0, 2048)), row(PrefillRow(32, u, 2048)))
			}
			for b := 1; b <= 64; b *= 2 {
				rs = append(rs, row(DecodeRow(b, float64(b*512))))
			}
			return rs
		}(), "decode_ctx_token_ns"},
		{"too few", []Row{row(PrefillRow(10, 0, 0))}, "more than"},
	}
	for _, tc := range cases {
		_, err := FitRows(tc.rows)
		if err == nil || !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("%s: err %v, want a refusal naming %q", tc.name, err, tc.mention)
		}
	}
}

func TestPrefillRowChunks(t *testing.T) {
	r := PrefillRow(5000, 100, 2048)
	if r.X[0] != 3 || r.X[1] != 5 {
		t.Fatalf("5000 tokens in 2048-token chunks: %v steps, %v k-tokens", r.X[0], r.X[1])
	}
	// Pairs: 2048*(100+1024) + 2048*(2148+1024) + 904*(4196+452).
	want := (2048*(100+1024.0) + 2048*(2148+1024.0) + 904*(4196+452.0)) / 1e6
	if math.Abs(r.X[2]-want) > 1e-9 {
		t.Errorf("pairs %v, want %v", r.X[2], want)
	}
	// The row prices the same as the engine's chunked prefill.
	p := engine.DefaultConfig().Latency
	var est ProfileEstimator
	c := coefs(p)
	copy(est[:], c[:])
	got := dot(r.X, est)
	sum := 0.0
	for _, ch := range [][2]int{{2048, 100}, {2048, 2148}, {904, 4196}} {
		sum += float64(p.PrefillTime(ch[0], ch[1])) / 1e6
	}
	if math.Abs(got-sum) > 1e-3 {
		t.Errorf("row prices %v ms, engine %v ms", got, sum)
	}
}

func BenchmarkFitRows(b *testing.B) {
	rows := synthRows(engine.DefaultConfig().Latency, 0.01, rand.New(rand.NewPCG(3, 3)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FitRows(rows); err != nil {
			b.Fatal(err)
		}
	}
}
