package calibrate

import (
	"bytes"
	"context"
	"math"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/engine"
)

// TestProbeRecoversProfile runs the whole prober against a fake engine with a
// known profile on synctest's fake clock: every coefficient must come back
// within 5%.
func TestProbeRecoversProfile(t *testing.T) {
	for _, tc := range []struct {
		name     string
		noCached bool
		overhead time.Duration
	}{{"cached-reported", false, 0}, {"cached-inferred", true, 0}, {"client-overhead", false, 700 * time.Microsecond}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := engine.DefaultConfig()
				cfg.MaxModelLen = 16384
				f, err := newFakeServer(cfg)
				if err != nil {
					t.Fatal(err)
				}
				f.noCached = tc.noCached
				f.overhead = tc.overhead
				url, client, stop := startFake(f)
				defer stop()
				var progress bytes.Buffer
				res, err := Probe(context.Background(), ProbeConfig{BaseURL: url, Client: client, Budget: time.Hour, Progress: &progress, MaxNumBatchedTokens: cfg.MaxNumBatchedTokens, Repeats: 1, Seed: 1})
				if err != nil {
					t.Fatalf("probe: %v\n%s", err, progress.String())
				}
				t.Logf("%d measurements, %d rows, rel RMS %.2g, cond %.3g, notes %q, skipped %d", len(res.Measurements), len(res.Rows), res.Fit.RelRMS, res.Fit.Condition, res.Notes, res.Skipped)
				for _, c := range res.Fit.Coefficients {
					t.Logf("  %s = %.5g ± %.2g", c.Name, c.Value, c.StdErr)
				}
				want := coefs(cfg.Latency)
				for i, c := range res.Fit.Coefficients[:5] {
					if rel := math.Abs(c.Value-want[i]) / want[i]; rel > 0.05 {
						t.Errorf("%s = %.4g ± %.2g, want %.4g (%.1f%% off)", c.Name, c.Value, c.StdErr, want[i], 100*rel)
					}
				}
				if res.Fit.RelRMS > 0.02 {
					t.Errorf("relative RMS %.4f, want under 2%% against an exact engine", res.Fit.RelRMS)
				}
				if res.Config.NumGPUBlocks != cfg.NumGPUBlocks || res.Config.BlockSize != cfg.BlockSize || res.Config.MaxModelLen != 16384 {
					t.Errorf("config limits %+v not read from the server", res.Config)
				}
				if !bytes.Contains(progress.Bytes(), []byte("probes against")) {
					t.Errorf("progress does not state the plan: %q", progress.String())
				}
			})
		})
	}
}

// TestProbeBudgetStops checks a tiny budget stops the run and reports what
// was skipped rather than running on.
func TestProbeBudgetStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := engine.DefaultConfig()
		f, _ := newFakeServer(cfg)
		url, client, stop := startFake(f)
		defer stop()
		start := time.Now()
		res, err := Probe(context.Background(), ProbeConfig{BaseURL: url, Client: client, Budget: 3 * time.Second, Seed: 2})
		if took := time.Since(start); took > 4*time.Second {
			t.Errorf("run took %v with a 3s budget", took)
		}
		if err == nil {
			t.Fatalf("a 3s budget cannot identify every coefficient, yet the fit succeeded: %+v", res.Fit)
		}
		if res == nil || res.Skipped == 0 {
			t.Fatalf("want skipped probes reported, got %+v", res)
		}
	})
}

// TestProbeRealListener checks the prober speaks HTTP over a real
// 127.0.0.1 socket (wall clock; a tiny, fast profile, so only the plumbing is
// checked, not accuracy).
func TestProbeRealListener(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time test; skipped with -short")
	}
	cfg := engine.DefaultConfig()
	cfg.Latency = engine.Profile{StepFixedMs: 0.2, PrefillTokenUs: 0.5, PrefillPairNs: 0.01, DecodeSeqUs: 1, DecodeCtxTokenNs: 0.5}
	f, _ := newFakeServer(cfg)
	defer f.close()
	srv := httptest.NewServer(f.handler()) // listens on 127.0.0.1
	defer srv.Close()
	res, _ := Probe(context.Background(), ProbeConfig{BaseURL: srv.URL, Budget: 20 * time.Second, MaxPromptTokens: 1024, MaxBatch: 8, Repeats: 1})
	if res == nil || len(res.Measurements) == 0 {
		t.Fatalf("no measurements over a real socket: %+v", res)
	}
	if res.Tokenizer.PerWord != 1 {
		t.Errorf("tokens per word %v, want 1 from the fake's one-token-per-word tokenizer", res.Tokenizer.PerWord)
	}
}
