package live

import (
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/inferrail/inferrail/engine/server"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// The gateway's whole metric set (names, help, labels) is what
// testdata/metrics.golden says: a change to it is a deliberate edit there
// (go test ./live -run TestMetricSet -update). Go's and the process's
// collectors and the build info are served beside it.
func TestMetricSet(t *testing.T) {
	g := startGateway(t, testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()})))
	var lines []string
	for _, c := range g.met.own {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			lines = append(lines, d.String())
		}
	}
	sort.Strings(lines)
	got := strings.Join(lines, "\n") + "\n"
	path := filepath.Join("testdata", "metrics.golden")
	if *update {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Fatalf("the metric set changed; if on purpose, rerun with -update:\ngot:\n%s\nwant:\n%s", got, want)
	}
	// Every name follows Prometheus's conventions: counters end in _total,
	// the rest do not.
	for _, l := range lines {
		name := strings.TrimPrefix(l[:strings.Index(l, `", help`)], `Desc{fqName: "`)
		if !strings.HasPrefix(name, "inferrail_") {
			t.Errorf("%s: not in the inferrail_ namespace", name)
		}
	}
	mfs, err := g.met.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		seen[mf.GetName()] = true
		if strings.HasSuffix(mf.GetName(), "_total") != (mf.GetType().String() == "COUNTER") && strings.HasPrefix(mf.GetName(), "inferrail_") {
			t.Errorf("%s is a %s: counters and only counters end in _total", mf.GetName(), mf.GetType())
		}
	}
	for _, n := range []string{"go_goroutines", "process_resident_memory_bytes", "inferrail_build_info"} {
		if !seen[n] {
			t.Errorf("%s not served", n)
		}
	}
}

// Served requests count their prompt, cached and predicted tokens, and a
// replica that DNS removed leaves no series behind.
func TestTokenCountersAndDepartedReplicas(t *testing.T) {
	cfg := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true}))
	cfg.StreamUsage = false // a stream's usage is not asked for (TestStreamUsageAsked)
	g := startGateway(t, cfg)
	prompt := words(500, 64)
	for range 2 {
		resp, err := g.post(t.Context(), "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	m := g.models[0]
	value := func(v *prometheus.CounterVec) float64 {
		var d dto.Metric
		v.WithLabelValues(m.name).Write(&d)
		return d.GetCounter().GetValue()
	}
	p, c, pr, rp := value(g.met.promptTokens), value(g.met.cachedTokens), value(g.met.predictedTokens), value(g.met.reportedTokens)
	if p == 0 || c == 0 || pr == 0 || c > p || pr > p || rp != p {
		t.Fatalf("prompt %v, cached %v, predicted %v, reported prompt %v tokens", p, c, pr, rp)
	}
	// A stream whose client did not ask for usage: its prompt and
	// prediction count, and nothing toward the engine-measured hit rate
	// (it would read as a miss).
	resp, err := g.post(t.Context(), "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2, "stream": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	waitUntil(t, "the stream counted", 5*time.Second, func() bool { return value(g.met.promptTokens) > p })
	if p2, c2, pr2, rp2 := value(g.met.promptTokens), value(g.met.cachedTokens), value(g.met.predictedTokens), value(g.met.reportedTokens); p2 != p*3/2 || pr2 <= pr || c2 != c || rp2 != rp {
		t.Fatalf("after a stream without usage: prompt %v -> %v, predicted %v -> %v, cached %v -> %v, reported prompt %v -> %v; want the prompt and prediction counted and the cached and reported ones not", p, p2, pr, pr2, c, c2, rp, rp2)
	}
	count := func(c prometheus.Collector) int {
		ch := make(chan prometheus.Metric, 64)
		go func() { c.Collect(ch); close(ch) }()
		n := 0
		for range ch {
			n++
		}
		return n
	}
	if count(g.met.ttftH) == 0 {
		t.Fatal("no TTFT series before the replica left")
	}
	ra := m.lookup("a")
	g.met.forget(m.name, "a", ra)
	if n := count(g.met.ttftH) + count(g.met.decisions); n != 0 {
		t.Fatalf("%d series left of a departed replica", n)
	}
	// A request that ends just after its replica left (a reload drops the
	// series once the last request in flight is settled, then its last
	// byte's duration is observed) does not bring them back.
	g.met.duration(m, ra, time.Second)
	g.met.ttft(m, ra, time.Second)
	g.met.decision(m, ra)
	if n := count(g.met.ttftH) + count(g.met.durationH) + count(g.met.decisions); n != 0 {
		t.Fatalf("%d series came back after the replica left", n)
	}
	// Nor does one whose series were never resolved before it left.
	rz := &replica{name: "z"}
	g.met.forget(m.name, "z", rz)
	g.met.decision(m, rz)
	if n := count(g.met.decisions); n != 0 {
		t.Fatalf("%d series of a replica that left before its first request", n)
	}
	// A reload's policy labels the observations after it.
	rb := &replica{name: "b"}
	before := testutil.ToFloat64(g.met.decisions.WithLabelValues(m.name, m.policyName(), "b"))
	p2 := "round_robin"
	m.reloaded.Store(&p2)
	g.met.decision(m, rb)
	if got := testutil.ToFloat64(g.met.decisions.WithLabelValues(m.name, "round_robin", "b")); got != 1 {
		t.Fatalf("decisions under the reloaded policy %v, want 1", got)
	}
	if after := testutil.ToFloat64(g.met.decisions.WithLabelValues(m.name, m.policy, "b")); after != before {
		t.Fatalf("decisions under the old policy went from %v to %v", before, after)
	}
}

// TestREADMEMetricsTable checks that the README's metrics table names
// exactly the metric set.
func TestREADMEMetricsTable(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	golden, err := os.ReadFile(filepath.Join("testdata", "metrics.golden"))
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, l := range strings.Split(string(golden), "\n") {
		if i := strings.Index(l, `fqName: "`); i >= 0 {
			rest := l[i+len(`fqName: "`):]
			want = append(want, rest[:strings.IndexByte(rest, '"')])
		}
	}
	for _, l := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(l, "| `inferrail_") {
			name := strings.TrimPrefix(l, "| `")
			got = append(got, name[:strings.IndexByte(name, '`')])
		}
	}
	sort.Strings(got)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("README.md's metrics table names\n%s\nbut the metric set is\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// overheadOf is inferrail_proxy_overhead_seconds' sample count and sum.
func overheadOf(t *testing.T, g *testGateway) (uint64, float64) {
	t.Helper()
	var d dto.Metric
	if err := g.met.overheadH.WithLabelValues(server.DefaultModelName).(prometheus.Metric).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleCount(), d.GetHistogram().GetSampleSum()
}

// inferrail_proxy_overhead_seconds is the proxy's own part of a request's
// time to first byte: not the engine's time to its first byte (300 ms a
// step here), not the wait in the queue (the second request waits for the
// first, over a second); and a retried request is left out.
func TestProxyOverhead(t *testing.T) {
	t.Run("engine and queue left out", func(t *testing.T) {
		ec := testEngineConfig()
		ec.Latency.StepFixedMs = 300
		c := testConfig(t, newUpstream(t, server.Config{Engine: ec}))
		c.Models[0].MaxConcurrency = 1
		g := startGateway(t, c)
		done := make(chan error, 1)
		go func() { _, _, err := g.complete(t.Context(), words(1, 10), 3); done <- err }()
		waitUntil(t, "the first request in flight", 5*time.Second, func() bool { in, _ := g.inFlight(); return in == 1 })
		resp, _, err := g.complete(t.Context(), words(2, 10), 1)
		if err != nil || queuedMs(t, resp) < 300 {
			t.Fatalf("the second request: %v, queued %v ms; want it queued", err, queuedMs(t, resp))
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n, sum := overheadOf(t, g); n != 2 || sum > 0.3 {
			t.Fatalf("%d samples summing %.3f s; want 2 under 0.3 s (neither the engine's 300 ms steps nor the queue)", n, sum)
		}
	})
	t.Run("retried left out", func(t *testing.T) {
		var calls atomic.Int64 // every other generation fails: each request is retried once
		flaky := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/completions" && calls.Add(1)%2 == 1 {
					http.Error(w, "busy", http.StatusServiceUnavailable)
					return
				}
				h.ServeHTTP(w, r)
			})
		}
		ups := make([]*upstream, 2)
		for i := range ups {
			ups[i] = &upstream{t: t, cfg: server.Config{Engine: testEngineConfig()}, wrap: flaky}
			ups[i].start("127.0.0.1:0")
			t.Cleanup(ups[i].kill)
		}
		g := startGateway(t, testConfig(t, ups...))
		for i := range 3 {
			if _, _, err := g.complete(t.Context(), words(i, 10), 2); err != nil {
				t.Fatal(err)
			}
		}
		if calls.Load() != 6 {
			t.Fatalf("%d tries for 3 requests, want 6", calls.Load())
		}
		if n, _ := overheadOf(t, g); n != 0 {
			t.Fatalf("%d samples of retried requests, want none", n)
		}
	})
}
