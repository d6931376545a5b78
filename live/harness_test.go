package live

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/engine/simtok"
	"github.com/inferrail/inferrail/internal/h1"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/tokenize"
)

// upstream is one in-process mock engine on 127.0.0.1 that a test can kill
// and restart on the same port.
type upstream struct {
	t      testing.TB
	cfg    server.Config
	wrap   func(http.Handler) http.Handler // around the engine's handler, if set
	addr   string
	mu     sync.Mutex
	srv    *server.Server
	hs     *http.Server
	cancel context.CancelFunc
	done   chan struct{}
}

func testEngineConfig() engine.Config {
	c := engine.DefaultConfig()
	c.NumGPUBlocks = 2048
	c.MaxModelLen = 8192
	// Fast steps keep tests short.
	c.Latency = engine.Profile{StepFixedMs: 1, PrefillTokenUs: 5}
	return c
}

func newUpstream(t testing.TB, cfg server.Config) *upstream {
	u := &upstream{t: t, cfg: cfg}
	u.start("127.0.0.1:0")
	t.Cleanup(u.kill)
	return u
}

func (u *upstream) start(addr string) {
	u.t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port may take a moment to be free again
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		u.t.Fatal(err)
	}
	s, err := server.New(u.cfg)
	if err != nil {
		u.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	h := s.Handler()
	if u.wrap != nil {
		h = u.wrap(h)
	}
	hs := &http.Server{Handler: h}
	go hs.Serve(ln)
	u.mu.Lock()
	u.addr, u.srv, u.hs, u.cancel, u.done = ln.Addr().String(), s, hs, cancel, done
	u.mu.Unlock()
}

// kill closes the engine abruptly: listener and every connection.
func (u *upstream) kill() {
	u.mu.Lock()
	hs, cancel, done := u.hs, u.cancel, u.done
	u.hs = nil
	u.mu.Unlock()
	if hs == nil {
		return
	}
	hs.Close()
	cancel()
	<-done
}

func (u *upstream) restart() { u.start(u.addr) }

func (u *upstream) url() string { return "http://" + u.addr }

// testGateway is a running proxy in front of upstreams.
type testGateway struct {
	*Server
	base   string
	client *http.Client
	stop   func()
}

// testConfig is a configuration for a proxy in front of ups (replicas a,
// b, ...), with fast probes and scrapes, cost_model on the engines'
// profile, and the default admission (kv) and queue.
func testConfig(t testing.TB, ups ...*upstream) *config.Config {
	c := config.Default()
	c.Health.Interval = 50 * time.Millisecond
	c.Health.Timeout = 50 * time.Millisecond
	c.Health.EjectTime = 200 * time.Millisecond
	c.Scrape.Interval = 50 * time.Millisecond
	c.Scrape.Timeout = 40 * time.Millisecond
	c.Retry.Backoff = time.Millisecond
	c.Retry.MaxBackoff = 5 * time.Millisecond
	// The tests read the prediction; it is off by default (a cross-tenant
	// cache oracle) and tested so in hardening_test.go.
	c.PredictedCachedHeader = true
	m := config.DefaultModel()
	m.Name, m.Aliases, m.Policy = server.DefaultModelName, []string{"sim"}, "cost_model"
	m.Profile = profileFile(t, testEngineConfig())
	m.MaxConcurrency, m.MaxPending = 256, 256
	for i, u := range ups {
		m.Replicas = append(m.Replicas, config.Replica{Name: string(rune('a' + i)), URL: u.url()})
	}
	c.Models = []config.Model{m}
	return &c
}

// profileFile writes ec as a profile YAML file and returns its path.
func profileFile(t testing.TB, ec engine.Config) string {
	t.Helper()
	b, err := yaml.Marshal(ec)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "profile.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func startGateway(t testing.TB, c *config.Config) *testGateway { return startGatewayDeps(t, c, Deps{}) }

func startGatewayDeps(t testing.TB, c *config.Config, deps Deps) *testGateway {
	t.Helper()
	s, err := New(c, deps)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { s.Run(ctx); close(runDone) }()
	// The client listener's server as Serve runs it without TLS: h1's
	// loop, net/http's server for h2c.
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	hs, err := h1.New(h1.Config{Handler: s.Handler(), Fallback: &http.Server{Handler: s.Handler(), Protocols: &protocols}})
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(ln)
	tr := &http.Transport{MaxIdleConnsPerHost: 4096}
	g := &testGateway{Server: s, base: "http://" + ln.Addr().String(), client: &http.Client{Transport: tr}}
	var once sync.Once
	g.stop = func() {
		once.Do(func() {
			tr.CloseIdleConnections()
			hs.Close()
			cancel()
			<-runDone
			s.Close()
		})
	}
	t.Cleanup(g.stop)
	return g
}

func (g *testGateway) post(ctx context.Context, path string, body any, hdr map[string]string) (*http.Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.base+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return g.client.Do(req)
}

// complete sends one streaming completion and reads it to the end.
func (g *testGateway) complete(ctx context.Context, prompt string, maxTokens int) (*http.Response, string, error) {
	resp, err := g.post(ctx, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true, "stream": true}, nil)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp, string(b), err
	}
	if resp.StatusCode != 200 {
		return resp, string(b), errors.New("status " + resp.Status + ": " + string(b))
	}
	if !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		return resp, string(b), errors.New("stream ended without [DONE]")
	}
	return resp, string(b), nil
}

// words returns n vocabulary words.
func words(first, n int) string {
	t := simtok.New()
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(first + i)
	}
	return t.Decode(ids)
}

// inFlight sums the gateway's in-flight and pending counters and its
// queued requests.
func (g *testGateway) inFlight() (inFlight, pending int) {
	for _, m := range g.models {
		snap := m.snapshot()
		for _, r := range snap.reps {
			inFlight += r.st.Load.InFlight
			pending += r.st.Load.Pending
		}
	}
	return
}

// queued is the requests waiting in every model's queue.
func (g *testGateway) queued() int {
	n := 0
	for _, m := range g.models {
		n += m.snapshot().queued
	}
	return n
}

// reserved sums the KV blocks admission holds on every replica.
func (g *testGateway) reserved() int {
	n := 0
	for _, m := range g.models {
		for _, r := range m.snapshot().reps {
			n += r.st.ReservedBlocks
		}
	}
	return n
}

func waitUntil(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func simModel(t testing.TB) Encoder {
	m, err := tokenize.LoadModel(tokenize.BuiltinSim, tokenize.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}
