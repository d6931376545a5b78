package calibrate

import (
	"bytes"
	"context"
	"github.com/inferrail/inferrail/internal/pipenet"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
)

// knownConfig is a non-default engine profile for the acceptance test: every
// coefficient differs from engine.DefaultConfig, so a prober that fell back
// on defaults would be found out.
func knownConfig() engine.Config {
	c := engine.DefaultConfig()
	c.Name = "known"
	c.NumGPUBlocks = 6000
	c.MaxModelLen = 16384
	c.MaxNumBatchedTokens = 2048
	c.Latency = engine.Profile{StepFixedMs: 9, PrefillTokenUs: 70, PrefillPairNs: 3, DecodeSeqUs: 60, DecodeCtxTokenNs: 40}
	return c
}

// startEngine runs the real mock engine (engine/server) over an in-memory
// listener, so that it works inside a synctest bubble; stop shuts it down.
func startEngine(t *testing.T, cfg server.Config) (url string, client *http.Client, stop func()) {
	t.Helper()
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln := pipenet.Listen("engine")
	hs := &http.Server{Handler: s.Handler()}
	runDone := make(chan struct{})
	go func() { s.Run(ctx); close(runDone) }()
	go hs.Serve(ln)
	tr := &http.Transport{DialContext: ln.Dial, MaxIdleConnsPerHost: 256}
	return "http://engine", &http.Client{Transport: tr}, func() {
		tr.CloseIdleConnections()
		hs.Close()
		ln.Close()
		cancel()
		<-runDone
		// net/http lingers up to 500 ms on connections closed early; in a
		// bubble this costs no real time.
		time.Sleep(time.Second)
	}
}

// TestProbeRecoversEngineProfile is the acceptance test of the prober: it
// calibrates the real mock engine (engine/server, the same code as
// `inferrail engine`) configured with a known profile, on synctest's
// virtual clock, and every fitted coefficient must come back within 5%.
func TestProbeRecoversEngineProfile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		details bool // --enable-prompt-tokens-details
	}{{"cached-reported", true}, {"cached-inferred", false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := knownConfig()
				url, client, stop := startEngine(t, server.Config{Engine: cfg, EnablePromptTokensDetails: tc.details})
				defer stop()
				var progress bytes.Buffer
				res, err := Probe(context.Background(), ProbeConfig{
					BaseURL: url, Client: client, Budget: time.Hour, Progress: &progress,
					MaxNumBatchedTokens: cfg.MaxNumBatchedTokens, Repeats: 1, Seed: 7,
				})
				if err != nil {
					t.Fatalf("probe: %v\n%s", err, progress.String())
				}
				t.Logf("%d measurements, %d rows, rel RMS %.2g, cond %.3g, skipped %d, notes %q",
					len(res.Measurements), len(res.Rows), res.Fit.RelRMS, res.Fit.Condition, res.Skipped, res.Notes)
				want := coefs(cfg.Latency)
				for i, c := range res.Fit.Coefficients {
					line := "  %-20s %10.5g ± %.2g"
					if i < 5 {
						line += "  (true %.5g)"
						t.Logf(line, c.Name, c.Value, c.StdErr, want[i])
					} else {
						t.Logf(line, c.Name, c.Value, c.StdErr)
					}
				}
				for i, c := range res.Fit.Coefficients[:5] {
					if rel := math.Abs(c.Value-want[i]) / want[i]; rel > 0.05 {
						t.Errorf("%s = %.4g ± %.2g, want %.4g (%.1f%% off)", c.Name, c.Value, c.StdErr, want[i], 100*rel)
					}
				}
				if len(res.Fit.Outliers) > 0 {
					t.Errorf("rows %v left out as outliers against an exact engine", res.Fit.Outliers)
				}
				if res.Fit.RelRMS > 0.02 {
					t.Errorf("relative RMS %.4f, want under 2%% against an exact engine", res.Fit.RelRMS)
				}
				if res.Config.NumGPUBlocks != cfg.NumGPUBlocks || res.Config.BlockSize != cfg.BlockSize || res.Config.MaxModelLen != cfg.MaxModelLen {
					t.Errorf("config limits %+v not read from the server", res.Config)
				}
				if res.Tokenizer.PerWord != 1 || res.Tokenizer.Extra != 0 {
					t.Errorf("tokenizer %+v, want one token per word (builtin:sim)", res.Tokenizer)
				}
			})
		})
	}
}

// TestResetCacheWaitsForIdle checks the prober's cache reset against the
// real mock engine, which answers 409 while requests run: the reset waits
// for the running request to finish, then the prefix cache is empty.
func TestResetCacheWaitsForIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := knownConfig()
		url, client, stop := startEngine(t, server.Config{Engine: cfg, EnablePromptTokensDetails: true})
		defer stop()
		ctx := context.Background()
		p := &prober{cfg: ProbeConfig{BaseURL: url, Model: server.DefaultModelName, IdleWait: time.Minute}, client: client,
			rng: rand.New(rand.NewPCG(1, 2)), res: &ProbeResult{}, noted: map[string]bool{}}
		if bs, _ := p.cacheInfo(ctx); bs != cfg.BlockSize {
			t.Fatalf("block size %d from /metrics, want %d", bs, cfg.BlockSize)
		}
		prompt := p.words(256)
		if _, err := p.stream(ctx, prompt, 1); err != nil {
			t.Fatal(err)
		}
		// A long request keeps the engine busy for about 300 steps.
		bg := make(chan error, 1)
		go func() { _, err := p.stream(ctx, p.words(64), 300); bg <- err }()
		time.Sleep(50 * time.Millisecond)
		start := time.Now()
		p.resetCache(ctx)
		if took := time.Since(start); took < time.Second {
			t.Errorf("reset returned after %v, before the running request finished", took)
		}
		if err := <-bg; err != nil {
			t.Fatal(err)
		}
		c, err := p.stream(ctx, prompt, 1)
		if err != nil {
			t.Fatal(err)
		}
		if c.cachedTokens != 0 {
			t.Errorf("after the reset the prompt had %d cached tokens, want 0", c.cachedTokens)
		}
		if len(p.res.Notes) > 0 {
			t.Errorf("notes %q, want none", p.res.Notes)
		}
	})
}

// TestResetCacheRefused checks a refusal that does not go away (another
// client keeps the engine busy; /metrics is not served, so the prober
// cannot wait for idle) is retried a few times and then noted.
func TestResetCacheRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		mux := http.NewServeMux()
		mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, _ *http.Request) {
			calls++
			w.WriteHeader(http.StatusConflict)
		})
		l := pipenet.Listen("engine")
		hs := &http.Server{Handler: mux}
		go hs.Serve(l)
		defer hs.Close()
		p := &prober{cfg: ProbeConfig{BaseURL: "http://engine"}, client: &http.Client{Transport: &http.Transport{DialContext: l.Dial}},
			res: &ProbeResult{}, noted: map[string]bool{}}
		p.resetCache(context.Background())
		if calls < 2 {
			t.Errorf("%d reset calls, want retries after a 409", calls)
		}
		if len(p.res.Notes) != 1 || !strings.Contains(p.res.Notes[0], "409") {
			t.Errorf("notes %q, want one saying the reset was refused", p.res.Notes)
		}
	})
}
