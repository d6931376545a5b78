package calibrate

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/internal/pipenet"
)

// probeFake runs Probe against a fake engine with cfg's profile, set up by
// tweak, on synctest's clock.
func probeFake(t *testing.T, tweak func(*fakeServer)) (*ProbeResult, engine.Config, error) {
	t.Helper()
	var res *ProbeResult
	var err error
	cfg := engine.DefaultConfig()
	cfg.MaxModelLen = 16384
	synctest.Test(t, func(t *testing.T) {
		f, ferr := newFakeServer(cfg)
		if ferr != nil {
			t.Fatal(ferr)
		}
		tweak(f)
		url, client, stop := startFake(f)
		defer stop()
		res, err = Probe(context.Background(), ProbeConfig{BaseURL: url, Client: client, Budget: time.Hour, MaxNumBatchedTokens: cfg.MaxNumBatchedTokens, Repeats: 1, Seed: 1})
	})
	return res, cfg, err
}

// llm-d-inference-sim ends each stream with a chunk that carries only the
// finish reason. That chunk is no token: calibrate must not leave every
// decode probe out over it (and then refuse the engine, blaming a slow
// client), but fit the profile as for any engine.
func TestProbeFinishOnlyChunk(t *testing.T) {
	res, cfg, err := probeFake(t, func(f *fakeServer) { f.finishOnly = true })
	if err != nil {
		t.Fatalf("probe refused an engine whose streams end with a finish-only chunk: %v", err)
	}
	for _, n := range res.Notes {
		if strings.Contains(n, "left out") {
			t.Errorf("note %q: no probe should be left out", n)
		}
	}
	want := coefs(cfg.Latency)
	for i, c := range res.Fit.Coefficients[:5] {
		if rel := math.Abs(c.Value-want[i]) / want[i]; rel > 0.05 {
			t.Errorf("%s = %.4g, want %.4g", c.Name, c.Value, want[i])
		}
	}
}

// A decode probe whose tokens the server merged once (while a busy client
// had not read them) runs again rather than leaving the fit short: with a
// probe left out the fit of the mock engine's terms was singular in a CI
// run ("least squares: matrix singular").
func TestProbeRetriesMergedDecode(t *testing.T) {
	res, cfg, err := probeFake(t, func(f *fakeServer) { f.mergeNext.Store(2) })
	if err != nil {
		t.Fatalf("probe failed on tokens merged in two streams: %v", err)
	}
	again := false
	for _, n := range res.Notes {
		if strings.Contains(n, "left out") {
			t.Errorf("note %q: no probe should be left out", n)
		}
		again = again || strings.Contains(n, "a decode probe ran again: a stream carried")
	}
	if !again {
		t.Errorf("notes %q: want one saying a decode probe ran again", res.Notes)
	}
	want := coefs(cfg.Latency)
	for i, c := range res.Fit.Coefficients[:5] {
		if rel := math.Abs(c.Value-want[i]) / want[i]; rel > 0.05 {
			t.Errorf("%s = %.4g, want %.4g", c.Name, c.Value, want[i])
		}
	}
}

// When calibrate refuses an engine, it says what was wrong in its streams.
func TestProbeNamesTheCause(t *testing.T) {
	// Two tokens a chunk (vLLM's --stream-interval 2): every decode probe is
	// left out, so decode_seq_us cannot be fitted; the error must say why.
	var plain, merging *fakeServer
	probeFake(t, func(f *fakeServer) { plain = f })
	_, _, err := probeFake(t, func(f *fakeServer) { f.perChunk = 2; merging = f })
	t.Logf("two tokens a chunk: %v", err)
	// The first probe left out is tried again, not the others: the server
	// merges every time.
	if n, n0 := merging.nextID.Load(), plain.nextID.Load(); n > n0+2*32 {
		t.Errorf("%d requests against %d with one token a chunk: decode probes tried again after the first was left out", n, n0)
	} else {
		t.Logf("%d requests against %d with one token a chunk", n, n0)
	}
	if err == nil || !strings.Contains(err.Error(), "decode probes were left out: a stream carried") ||
		!strings.Contains(err.Error(), "several tokens in a chunk") {
		t.Errorf("chunks of two tokens: error %v, want the dropped decode probes and why", err)
	}
	// vLLM's error event mid-stream.
	_, _, err = probeFake(t, func(f *fakeServer) { f.failAfter = 1 })
	t.Logf("error event: %v", err)
	if err == nil || !strings.Contains(err.Error(), "InternalServerError (500): Internal server error") {
		t.Errorf("error event: %v, want the server's error", err)
	}
	// No usage at all.
	_, _, err = probeFake(t, func(f *fakeServer) { f.noUsage = true })
	t.Logf("no usage: %v", err)
	if err == nil || !strings.Contains(err.Error(), "no usage, then [DONE]") {
		t.Errorf("no usage: %v, want what the stream held", err)
	}
}

// The profile calibrate writes keeps every fitted term, the TTFT overhead
// too, and reads back as the same engine configuration.
func TestProfileKeepsEveryFittedTerm(t *testing.T) {
	res, _, err := probeFake(t, func(f *fakeServer) { f.overhead = 700 * time.Microsecond })
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteFittedProfile(&buf, res.Config, res.Fit); err != nil {
		t.Fatal(err)
	}
	t.Logf("profile written:\n%s", buf.String())
	for _, c := range res.Fit.Coefficients {
		if line := fmt.Sprintf("%-20s %11.6g ±", c.Name, c.Value); !strings.Contains(buf.String(), line) {
			t.Errorf("profile lacks %q:\n%s", line, buf.String())
		}
	}
	if oh := res.Fit.Coefficients[NumCoefs-1]; math.Abs(oh.Value-0.7) > 0.05 {
		t.Errorf("ttft_overhead_ms fitted %.3g, want 0.7", oh.Value)
	}
	back, err := engine.ParseConfig(buf.Bytes())
	if err != nil || back != res.Config {
		t.Fatalf("read back %+v, %v; want %+v", back, err, res.Config)
	}
}

// calibrate reads /metrics with fleet/remote's parser: with data
// parallelism (two engines behind one address) the KV capacity is both
// ranks' and the engine is idle only when both are.
func TestCacheInfoDataParallel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var running atomic.Int64
		running.Store(1)
		mux := http.NewServeMux()
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			for _, e := range []string{"0", "1"} {
				r := int64(0)
				if e == "1" {
					r = running.Load()
				}
				fmt.Fprintf(w, "vllm:num_requests_running{engine=%q,model_name=\"m\"} %d\nvllm:num_requests_waiting{engine=%q,model_name=\"m\"} 0\n", e, r, e)
				fmt.Fprintf(w, "vllm:cache_config_info{cpu_offload_block_size=\"64\",block_size=\"16\",engine=%q,num_gpu_blocks=\"1000\"} 1\n", e)
			}
		})
		l := pipenet.Listen("engine")
		hs := &http.Server{Handler: mux}
		go hs.Serve(l)
		defer hs.Close()
		p := &prober{cfg: ProbeConfig{BaseURL: "http://engine", IdleWait: time.Minute}, client: &http.Client{Transport: &http.Transport{DialContext: l.Dial}},
			res: &ProbeResult{}, noted: map[string]bool{}}
		bs, blocks := p.cacheInfo(context.Background())
		if bs != 16 || blocks != 2000 {
			t.Errorf("block size %d, %d blocks; want 16 and both ranks' 2000", bs, blocks)
		}
		go func() { time.Sleep(time.Second); running.Store(0) }()
		start := time.Now()
		p.waitIdle(context.Background())
		if took := time.Since(start); took < time.Second {
			t.Errorf("waitIdle returned after %v, while rank 1 still ran a request", took)
		}
	})
}

// A /metrics page calibrate cannot read is noted with the parser's reason.
func TestCacheInfoUnreadable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1")
		})
		l := pipenet.Listen("engine")
		hs := &http.Server{Handler: mux}
		go hs.Serve(l)
		defer hs.Close()
		p := &prober{cfg: ProbeConfig{BaseURL: "http://engine"}, client: &http.Client{Transport: &http.Transport{DialContext: l.Dial}},
			res: &ProbeResult{}, noted: map[string]bool{}}
		p.cacheInfo(context.Background())
		if p.metrics || len(p.res.Notes) != 1 || !strings.Contains(p.res.Notes[0], "lacks vllm:num_requests_running") {
			t.Errorf("metrics usable %v, notes %q", p.metrics, p.res.Notes)
		}
	})
}

// vLLM's server ends a stream in a write of its own after data: [DONE]. A
// probe that closed its response at [DONE] would lose the connection, and
// every probe's time to first token would include a new connection's
// set-up (a gateway keeping its connections never pays it): calibrate
// reads on to the response's end, and a probe run keeps its connections.
func TestProbeKeepsConnections(t *testing.T) {
	var fs *fakeServer
	if _, _, err := probeFake(t, func(f *fakeServer) { fs = f }); err != nil {
		t.Fatal(err)
	}
	dials, requests := fs.dials.Load(), int64(fs.nextID.Load())
	if requests < 20 {
		t.Fatalf("%d requests: too few for this test to show anything", requests)
	}
	if dials*4 > requests {
		t.Errorf("%d connections for %d streamed requests: probes are not keeping their connections", dials, requests)
	}
}

// An engine that keeps a stream open after data: [DONE] delays each probe
// endWait at most (an hour each would take the probe's whole budget), and
// the timings are those of the streams themselves.
func TestProbeStreamHeldOpenAfterDone(t *testing.T) {
	res, cfg, err := probeFake(t, func(f *fakeServer) { f.holdAfterDone = time.Hour })
	if err != nil {
		t.Fatalf("probe failed against an engine that holds streams open after [DONE]: %v", err)
	}
	want := coefs(cfg.Latency)
	for i, c := range res.Fit.Coefficients[:5] {
		if rel := math.Abs(c.Value-want[i]) / want[i]; rel > 0.05 {
			t.Errorf("%s = %.4g, want %.4g", c.Name, c.Value, want[i])
		}
	}
}
