package bench

import (
	"context"
	"github.com/inferrail/inferrail/internal/pipenet"
	"math"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/workload"
)

// serve starts handler over pipes and returns a client for it.
func serve(t *testing.T, h http.Handler) (*http.Client, func()) {
	ln := pipenet.Listen("server")
	hs := &http.Server{Handler: h}
	go hs.Serve(ln)
	tr := &http.Transport{DialContext: ln.Dial, MaxIdleConnsPerHost: 10000}
	return &http.Client{Transport: tr}, func() {
		tr.CloseIdleConnections()
		hs.Close()
		ln.Close()
		time.Sleep(time.Second) // lingering connections finish (virtual time)
	}
}

func w1(t *testing.T, n int, rate float64) workload.Config {
	wl, err := workload.DefaultConfig("w1")
	if err != nil {
		t.Fatal(err)
	}
	wl.Requests, wl.Rate, wl.Seed = n, rate, 7
	return wl
}

// One workload through bench against one engine and through the simulator
// with one replica: the same TTFT percentiles and hit rate (on virtual time
// the only differences are the routers' bookkeeping).
func TestBenchMatchesSimulation(t *testing.T) {
	n := 600
	if testing.Short() {
		n = 200
	}
	ec := engine.DefaultConfig()
	wl := w1(t, n, 0.8)
	fc := fleet.DefaultConfig()
	fc.Seed, fc.Workload, fc.Policy, fc.Replicas, fc.Engine = 7, wl, "round_robin", 1, ec
	fc.ScrapeInterval, fc.Index, fc.SLO = 100*time.Millisecond, fleet.IndexApproximate, results.DefaultSLO()
	sim, err := fleet.Simulate(fc)
	if err != nil {
		t.Fatal(err)
	}
	var got *Output
	synctest.Test(t, func(t *testing.T) {
		srv, err := server.New(server.Config{Engine: ec, ServedModelNames: []string{wl.Model}, EnablePromptTokensDetails: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { srv.Run(ctx); close(done) }()
		client, stop := serve(t, srv.Handler())
		src, err := workload.New(wl)
		if err != nil {
			t.Fatal(err)
		}
		got, err = Run(context.Background(), Config{BaseURL: "http://engine", Source: src, Client: client, PreciseWindow: -1})
		if err != nil {
			t.Fatal(err)
		}
		stop()
		cancel()
		<-done
	})
	b, s := got.Summary, sim.Summary
	if b.Completed != n || b.Failed != 0 {
		t.Fatalf("bench: %d completed, %d failed of %d (errors %v)", b.Completed, b.Failed, n, got.Errors)
	}
	within := func(name string, x, y, tol float64) {
		if math.Abs(x-y) > tol*math.Max(math.Abs(y), 1e-9) {
			t.Errorf("%s: bench %.4g, sim %.4g (more than %.0f%% apart)", name, x, y, 100*tol)
		}
	}
	within("ttft p50", b.TTFT.P50, s.TTFT.P50, 0.05)
	within("ttft p99", b.TTFT.P99, s.TTFT.P99, 0.05)
	within("hit rate", b.HitRate, s.HitRate, 0.02)
	within("tpot p50", b.TPOT.P50, s.TPOT.P50, 0.05)
	t.Logf("bench TTFT p50/p99 %.1f/%.1f ms, sim %.1f/%.1f ms; hit rate %.3f vs %.3f", b.TTFT.P50, b.TTFT.P99, s.TTFT.P50, s.TTFT.P99, b.HitRate, s.HitRate)
}

// A server that takes a long time must not slow the schedule down: every
// request leaves on time and its latency counts from its schedule.
func TestOpenLoopNoCoordinatedOmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var seen []time.Duration
		start := time.Now()
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, time.Since(start))
			mu.Unlock()
			time.Sleep(2 * time.Second) // far slower than the arrival rate
			w.Header().Set("Content-Type", "text/event-stream")
			w.Write([]byte("data: {\"choices\":[{\"index\":0,\"text\":\"bakabo \"}]}\n\n"))
			w.Write([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"))
		})
		client, stop := serve(t, h)
		defer stop()
		src, err := workload.New(w1(t, 50, 10))
		if err != nil {
			t.Fatal(err)
		}
		out, err := Run(context.Background(), Config{BaseURL: "http://x", Source: src, Client: client, PreciseWindow: -1})
		if err != nil {
			t.Fatal(err)
		}
		if out.Summary.Completed != 50 {
			t.Fatalf("%d completed, errors %v", out.Summary.Completed, out.Errors)
		}
		if out.SendLag.P99 > 2 {
			t.Fatalf("send lag p99 %.3f ms against a slow server", out.SendLag.P99)
		}
		for _, r := range out.Records {
			if d := r.FirstToken - r.Arrival; d < 2*time.Second || d > 2*time.Second+10*time.Millisecond {
				t.Fatalf("request %d: TTFT %v, want the server's 2 s counted from the schedule", r.ID, d)
			}
		}
		if len(seen) != 50 {
			t.Fatalf("server saw %d requests", len(seen))
		}
	})
}

// Failures are counted by reason and never stop the run.
func TestErrorsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ec := engine.DefaultConfig()
		srv, err := server.New(server.Config{Engine: ec, Seed: 3, Faults: server.Faults{ErrorRate: 0.2, CloseRate: 0.1}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { srv.Run(ctx); close(done) }()
		client, stop := serve(t, srv.Handler())
		src, _ := workload.New(w1(t, 200, 0.5))
		out, err := Run(context.Background(), Config{BaseURL: "http://engine", Source: src, Client: client, Timeout: time.Minute, PreciseWindow: -1})
		if err != nil {
			t.Fatal(err)
		}
		stop()
		cancel()
		<-done
		failed := 0
		for _, r := range out.Records {
			if r.Outcome != results.OutcomeOK {
				failed++
			}
		}
		if out.Errors["http 500"] == 0 || out.Errors["connection closed"] == 0 || failed != out.Errors["http 500"]+out.Errors["connection closed"] {
			t.Fatalf("errors %v, %d failed records", out.Errors, failed)
		}
		if out.Summary.Completed+out.Summary.Failed != 200 {
			t.Fatalf("summary counts %d+%d", out.Summary.Completed, out.Summary.Failed)
		}
	})
}

func TestConfigErrors(t *testing.T) {
	src, _ := workload.New(w1(t, 1, 1))
	for _, c := range []Config{
		{BaseURL: "localhost:8000", Source: src},
		{BaseURL: "http://x", Source: src, Endpoint: "embeddings"},
		{BaseURL: "http://x"},
	} {
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// A gateway's refusals are told apart from failures by their status and
// OpenAI error code; anything else is a failure.
func TestGatewayReject(t *testing.T) {
	for _, c := range []struct {
		status int
		body   string
		want   string
	}{
		{429, `{"error":{"message":"m","type":"rate_limit_exceeded","param":null,"code":"queue_timeout"}}`, "queue_timeout"},
		{429, `{"error":{"code":"queue_full"}}`, "queue_full"},
		{503, `{"error":{"code":"no_replica_available"}}`, "no_replica"},
		{429, `{"error":{"code":"rate_limited_by_someone"}}`, ""},
		{500, `{"error":{"code":"queue_timeout"}}`, ""},
		{429, `not json`, ""},
		{503, `{"error":{"code":503}}`, ""},
	} {
		if got := gatewayReject(c.status, []byte(c.body)); got != c.want {
			t.Errorf("%d %s: %q, want %q", c.status, c.body, got, c.want)
		}
	}
}

// TestAPIKeySent: every request carries the API key as a bearer token, and
// none without one.
func TestAPIKeySent(t *testing.T) {
	for _, key := range []string{"ir-abc-secret", ""} {
		synctest.Test(t, func(t *testing.T) {
			srv, err := server.New(server.Config{Engine: engine.DefaultConfig()})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { srv.Run(ctx); close(done) }()
			var mu sync.Mutex
			seen := map[string]int{}
			h := srv.Handler()
			client, stop := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen[r.Header.Get("Authorization")]++
				mu.Unlock()
				h.ServeHTTP(w, r)
			}))
			src, _ := workload.New(w1(t, 20, 0.5))
			if _, err := Run(context.Background(), Config{BaseURL: "http://engine", APIKey: key, Source: src, Client: client, Timeout: time.Minute, PreciseWindow: -1}); err != nil {
				t.Fatal(err)
			}
			stop()
			cancel()
			<-done
			want := ""
			if key != "" {
				want = "Bearer " + key
			}
			if len(seen) != 1 || seen[want] != 20 {
				t.Fatalf("key %q: Authorization headers seen %v", key, seen)
			}
		})
	}
}
