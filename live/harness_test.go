package live

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/engine/simtok"
	"github.com/inferrail/inferrail/router/tokenize"
)

// upstream is one in-process mock engine on 127.0.0.1 that a test can kill
// and restart on the same port.
type upstream struct {
	t      testing.TB
	cfg    server.Config
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
	hs := &http.Server{Handler: s.Handler()}
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

// gateway is a running proxy in front of upstreams.
type gateway struct {
	*Server
	base   string
	client *http.Client
	stop   func()
}

func testOptions(t testing.TB, ups ...*upstream) Options {
	o := DefaultOptions()
	o.Health.Interval = 50 * time.Millisecond
	o.Health.Timeout = 200 * time.Millisecond
	o.Health.EjectTime = 200 * time.Millisecond
	o.Scrape.Interval = 50 * time.Millisecond
	o.Backoff = time.Millisecond
	o.MaxBackoff = 5 * time.Millisecond
	mo := ModelOptions{
		Name: server.DefaultModelName, Aliases: []string{"sim"}, Policy: "cost_model", Encoder: simModel(t),
		Index: "approximate", Engine: testEngineConfig(), MaxConcurrency: 256, MaxPending: 256,
	}
	for i, u := range ups {
		mo.Replicas = append(mo.Replicas, ReplicaOptions{Name: string(rune('a' + i)), URL: u.url()})
	}
	o.Models = []ModelOptions{mo}
	return o
}

func startGateway(t testing.TB, o Options) *gateway {
	t.Helper()
	s, err := New(o)
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
	hs := &http.Server{Handler: s.Handler()}
	go hs.Serve(ln)
	tr := &http.Transport{MaxIdleConnsPerHost: 4096}
	g := &gateway{Server: s, base: "http://" + ln.Addr().String(), client: &http.Client{Transport: tr}}
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

func (g *gateway) post(ctx context.Context, path string, body any, hdr map[string]string) (*http.Response, error) {
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
func (g *gateway) complete(ctx context.Context, prompt string, maxTokens int) (*http.Response, string, error) {
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

// inFlight sums the gateway's in-flight counters.
func (g *gateway) inFlight() (inFlight, pending int) {
	for _, m := range g.models {
		m.mu.Lock()
		for _, r := range m.reps {
			inFlight += r.load.InFlight
			pending += r.load.Pending
		}
		m.mu.Unlock()
	}
	return
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
