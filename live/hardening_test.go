package live

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
)

// The regression tests of the hardening issue, one per defect it measured
// (numbered as there); each fails on the proxy before the fix.

// fakeEngine is an engine whose /v1/completions does what gen says; its
// /health passes (unless sick) and its /metrics is missing.
type fakeEngine struct {
	*httptest.Server
	sick atomic.Bool
	got  chan http.Header
}

func newFakeEngine(t *testing.T, gen http.HandlerFunc) *fakeEngine {
	f := &fakeEngine{got: make(chan http.Header, 64)}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		if f.sick.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	for _, p := range []string{"/v1/completions", "/v1/responses"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			select {
			case f.got <- r.Header.Clone():
			default:
			}
			io.Copy(io.Discard, r.Body)
			gen(w, r)
		})
	}
	f.Server = httptest.NewUnstartedServer(mux)
	f.Start()
	t.Cleanup(f.Close)
	return f
}

func fakeConfig(t *testing.T, urls ...string) *config.Config {
	c := testConfig(t)
	for i, u := range urls {
		c.Models[0].Replicas = append(c.Models[0].Replicas, config.Replica{Name: string(rune('a' + i)), URL: u})
	}
	return c
}

// sse writes n completion events and [DONE], flushing each.
func sse(w http.ResponseWriter, n int, done bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range n {
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-x\",\"choices\":[{\"index\":0,\"text\":\"w%d \"}]}\n\n", i)
		fl.Flush()
	}
	if done {
		io.WriteString(w, "data: [DONE]\n\n")
		fl.Flush()
	}
}

func rawRequest(t *testing.T, addr, req string) (*bufio.Reader, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return bufio.NewReader(c), c
}

func hostOf(base string) string { return strings.TrimPrefix(base, "http://") }

// 1: a prompt longer than tokenize.max_prompt_bytes is never tokenized (a
// 31.5 MB prompt took the proxy to 1.27 GB); it is routed without a
// prediction.
func TestHugePromptNotTokenized(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := testConfig(t, up)
	c.Tokenize.MaxPromptBytes = 64 * config.KiB
	var longest atomic.Int64
	enc := &countingEncoder{Encoder: simModel(t), longest: &longest}
	g := startGatewayDeps(t, c, Deps{Encoders: map[string]Encoder{c.Models[0].Name: enc}})
	// 200 KiB: routed without a prediction, and the engine refuses it as
	// vLLM would (too long for its context).
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": strings.Repeat("word ", 40<<10), "max_tokens": 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get(HeaderReplica) == "" || longest.Load() != 0 {
		t.Fatalf("status %d from %q; longest prompt tokenized %d bytes", resp.StatusCode, resp.Header.Get(HeaderReplica), longest.Load())
	}
	if _, _, err := g.complete(context.Background(), "a short one", 2); err != nil || longest.Load() == 0 {
		t.Fatalf("a short prompt was not tokenized (%v)", err)
	}
}

type countingEncoder struct {
	Encoder
	longest *atomic.Int64
}

func (c *countingEncoder) EncodeCompletion(p string) []uint32 {
	c.longest.Store(max(c.longest.Load(), int64(len(p))))
	return c.Encoder.EncodeCompletion(p)
}

// slowWriter is a client that never reads: each write blocks until its
// deadline passes (ResponseController finds SetWriteDeadline here).
type slowWriter struct {
	h        http.Header
	mu       sync.Mutex
	deadline time.Time
	code     int
	cut      atomic.Bool
}

func (s *slowWriter) Header() http.Header { return s.h }
func (s *slowWriter) WriteHeader(c int)   { s.code = c }
func (s *slowWriter) Write(p []byte) (int, error) {
	for {
		s.mu.Lock()
		d := s.deadline
		s.mu.Unlock()
		if !d.IsZero() && time.Now().After(d) {
			s.cut.Store(true)
			return 0, os.ErrDeadlineExceeded
		}
		time.Sleep(5 * time.Millisecond)
	}
}
func (s *slowWriter) Flush() {}
func (s *slowWriter) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	s.deadline = t
	s.mu.Unlock()
	return nil
}

// 2: a client that never reads holds no engine slot once the engine is
// done: with one slot in the fleet, a second request is served while the
// first one's client still has not read a byte; the reader is then cut off
// at write_timeout.
func TestSlowReaderHoldsNoSlot(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := testConfig(t, up)
	c.Models[0].MaxConcurrency, c.Models[0].MaxPending = 1, 1
	c.WriteTimeout = 3 * time.Second
	g := startGateway(t, c)
	body := `{"prompt": "the slow reader asks", "max_tokens": 20, "stream": true, "ignore_eos": true}`
	sw := &slowWriter{h: http.Header{}}
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	done := make(chan struct{})
	go func() { defer close(done); g.Handler().ServeHTTP(sw, r) }()
	waitUntil(t, "the slow reader's request dispatched", 2*time.Second, func() bool { n, _ := g.inFlight(); return n == 1 })
	start := time.Now()
	if _, _, err := g.complete(context.Background(), "a legitimate request", 4); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second || sw.cut.Load() {
		t.Fatalf("the legitimate request waited %v for the slow reader's slot (cut %v)", d, sw.cut.Load())
	}
	<-done
	if !sw.cut.Load() {
		t.Fatal("the slow reader was never cut off")
	}
}

// 3: a body that stalls is answered 408 at read_timeout, its connection
// closed.
func TestStalledBodyTimesOut(t *testing.T) {
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.ReadTimeout = 200 * time.Millisecond
	g := startGateway(t, c)
	br, _ := rawRequest(t, hostOf(g.base), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\": \"")
	start := time.Now()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	if resp.StatusCode != http.StatusRequestTimeout || time.Since(start) > 3*time.Second {
		t.Fatalf("status %d after %v", resp.StatusCode, time.Since(start))
	}
}

// 4: /readyz (and /health) fail once no engine has passed a probe or
// answered within the ready window, even though the ejection share cap
// keeps half the replicas counted healthy; /livez still passes.
func TestReadyWhenEnginesDie(t *testing.T) {
	a := newUpstream(t, server.Config{Engine: testEngineConfig()})
	b := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := testConfig(t, a, b)
	g := startGateway(t, c)
	get := func(path string) int {
		resp, err := http.Get(g.base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitUntil(t, "ready", 2*time.Second, func() bool { return get("/readyz") == 200 })
	a.kill()
	b.kill()
	window := c.Health.Ready()
	waitUntil(t, "not ready with every engine dead", window+time.Second, func() bool { return get("/readyz") == 503 && get("/health") == 503 })
	if get("/livez") != 200 {
		t.Fatal("/livez failed")
	}
	g.Drain()
	if get("/readyz") != 503 {
		t.Fatal("ready while draining")
	}
}

// 5: a stream broken mid-way reaches the client as a failure: an error
// event and no clean end of the body.
func TestBrokenStreamIsAnError(t *testing.T) {
	eng := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request) {
		sse(w, 3, false)
		panic(http.ErrAbortHandler) // the engine dies mid-stream
	})
	c := fakeConfig(t, eng.URL)
	c.Retry.Attempts = 1
	g := startGateway(t, c)
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 50, "stream": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("a broken stream ended cleanly: %q", b)
	}
	if !bytes.Contains(b, []byte(`data: {"error": {"message": `)) || bytes.Contains(b, []byte("[DONE]")) {
		t.Fatalf("no error event in %q", b)
	}
}

// 6: a try whose engine sends no first byte within first_byte_timeout is
// retried on another replica and counts against the hung one; with every
// replica hung the client gets 504 at request_timeout, not 502.
func TestHungEngineRetriedElsewhere(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	hung := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush() // headers, then nothing
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	good := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request) { sse(w, 2, true) })
	c := fakeConfig(t, hung.URL, good.URL)
	c.FirstByteTimeout = 200 * time.Millisecond
	c.Models[0].Policy = "round_robin"
	// The hung engine answers its health probes, and a passing probe resets
	// the consecutive failures this test reads: with the default 1 s
	// interval, a probe between the last try and the check (a loaded
	// machine) left nothing to see.
	c.Health.Interval = time.Hour
	g := startGateway(t, c)
	for range 4 {
		start := time.Now()
		resp, body, err := g.complete(context.Background(), "hello", 2)
		if err != nil || resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") || time.Since(start) > 2*time.Second {
			t.Fatalf("status %v after %v: %v %q", resp, time.Since(start), err, body)
		}
		if resp.Header.Get(HeaderReplica) != "b" {
			t.Fatalf("served by %s", resp.Header.Get(HeaderReplica))
		}
	}
	var fails int
	for _, v := range g.replicaViews() {
		if v.Replica == "a" {
			fails = v.Failures + 3*v.Ejections
		}
	}
	if fails == 0 {
		t.Fatal("the hung replica was never penalised")
	}

	c2 := fakeConfig(t, hung.URL)
	c2.FirstByteTimeout = 10 * time.Second
	c2.RequestTimeout = 300 * time.Millisecond
	g2 := startGateway(t, c2)
	resp, err := g2.post(context.Background(), "/v1/completions", map[string]any{"prompt": "hi", "stream": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("status %d at the request deadline, want 504", resp.StatusCode)
	}
}

// 7: the predicted-cached header is off by default (it tells any client
// whether another sent a prefix), on for a request with its own
// cache_salt, and on everywhere when the config says.
func TestPredictedHeaderPolicy(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := testConfig(t, up)
	c.PredictedCachedHeader = false
	g := startGateway(t, c)
	prompt := words(100, 64)
	for range 2 {
		resp, _, err := g.complete(context.Background(), prompt, 2)
		if err != nil {
			t.Fatal(err)
		}
		if v := resp.Header.Get(HeaderPredicted); v != "" {
			t.Fatalf("predicted header %q sent by default", v)
		}
	}
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2, "cache_salt": "mine"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get(HeaderPredicted) == "" {
		t.Fatal("no predicted header for a request with its own cache_salt")
	}
}

// 8: a malformed chunked body is answered 400, not passed on as empty.
func TestMalformedChunkedBody(t *testing.T) {
	g := startGateway(t, testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()})))
	br, _ := rawRequest(t, hostOf(g.base), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d for a malformed chunked body", resp.StatusCode)
	}
}

// 9: the client's request id is echoed only when it is a sane one, never
// sent upstream (the engine gets the proxy's, so its chunks stay small) and
// never what the decision log samples on.
func TestRequestIDBounded(t *testing.T) {
	eng := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request) { sse(w, 1, true) })
	c := fakeConfig(t, eng.URL)
	var logged atomic.Int64
	c.DecisionLog.Sample = 0.5
	g := startGatewayDeps(t, c, Deps{DecisionLog: writerFunc(func(p []byte) (int, error) { logged.Add(int64(bytes.Count(p, []byte("\n")))); return len(p), nil })})
	huge := strings.Repeat("x", 100<<10)
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": "hi", "stream": true}, map[string]string{HeaderRequestID: huge})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get(HeaderRequestID); got == huge || got == "" {
		t.Fatalf("echoed %d bytes of request id", len(got))
	}
	if up := <-eng.got; len(up.Get(HeaderRequestID)) > maxRequestID {
		t.Fatalf("sent %d bytes of request id upstream", len(up.Get(HeaderRequestID)))
	}
	for range 40 {
		resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": "hi", "stream": true}, map[string]string{HeaderRequestID: "same-id"})
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Header.Get(HeaderRequestID) != "same-id" {
			t.Fatalf("a sane id was not echoed: %q", resp.Header.Get(HeaderRequestID))
		}
	}
	g.stop() // flushes the decision log
	if n := logged.Load(); n == 0 || n >= 40 {
		t.Fatalf("%d of 41 decisions logged at sample 0.5: sampling follows the client's id", n)
	}
}

// 10: an announced Content-Length over the cap is refused before the body
// is read, without 100 Continue.
func TestOversizedContentLength(t *testing.T) {
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.MaxBodyBytes = config.MiB
	c.MaxInflightBodyBytes = config.MiB
	g := startGateway(t, c)
	br, _ := rawRequest(t, hostOf(g.base), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2000000\r\n\r\n")
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(line, "413") {
		t.Fatalf("first line %q, want 413 (and no 100 Continue)", line)
	}
}

// 11: the header policy: hop-by-hop and Connection-named headers, the
// client's credentials and its forwarding headers stay at the proxy; the
// proxy sets X-Forwarded-For/-Proto; error bodies name replicas, never
// their URLs.
func TestHeaderPolicy(t *testing.T) {
	eng := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request) { sse(w, 1, true) })
	c := fakeConfig(t, eng.URL)
	g := startGateway(t, c)
	hdr := map[string]string{"Authorization": "Bearer sk-secret", "Cookie": "s=1", "X-Forwarded-For": "6.6.6.6", "Connection": "X-Private", "X-Private": "p", "X-Kept": "k"}
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": "hi", "stream": true}, hdr)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	up := <-eng.got
	if up.Get("Authorization") != "" || up.Get("Cookie") != "" || up.Get("X-Private") != "" || up.Get("X-Kept") != "k" ||
		up.Get("X-Forwarded-For") != "127.0.0.1" || up.Get("X-Forwarded-Proto") != "http" {
		t.Fatalf("upstream headers %v", up)
	}

	c2 := fakeConfig(t, eng.URL)
	c2.ForwardClientAuth = true
	g2 := startGateway(t, c2)
	resp, err = g2.post(context.Background(), "/v1/completions", map[string]any{"prompt": "hi", "stream": true}, hdr)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if up := <-eng.got; up.Get("Authorization") != "Bearer sk-secret" {
		t.Fatal("forward_client_auth did not forward Authorization")
	}

	dead := "http://127.0.0.1:1"
	c3 := fakeConfig(t, dead)
	c3.Retry.Attempts = 1
	g3 := startGateway(t, c3)
	resp, err = g3.post(context.Background(), "/v1/completions", map[string]any{"prompt": "hi"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || bytes.Contains(b, []byte("127.0.0.1")) || !bytes.Contains(b, []byte("a,")) {
		t.Fatalf("502 body %s", b)
	}
}

// 17: a client that closes right after reading data: [DONE] (as the
// official SDKs do) leaves a success, with its answer recorded.
func TestDoneThenCloseIsSuccess(t *testing.T) {
	eng := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request) {
		sse(w, 3, true)
		time.Sleep(100 * time.Millisecond) // the engine closes its end late
	})
	c := fakeConfig(t, eng.URL)
	g := startGateway(t, c)
	before := g.outcomes("ok")
	br, conn := rawRequest(t, hostOf(g.base), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n{\"prompt\": \"hello\", \"stream\": true} ")
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "[DONE]") {
			break
		}
	}
	conn.Close()
	waitUntil(t, "the request counted a success", 2*time.Second, func() bool { return g.outcomes("ok") == before+1 })
}

// outcomes reads inferrail_requests_total for an outcome.
func (g *testGateway) outcomes(outcome string) float64 {
	return counterSum(g.Server, "inferrail_requests_total", "outcome", outcome)
}

// 18: GET /v1/models/{id} (the SDKs' models.retrieve).
func TestModelRetrieve(t *testing.T) {
	g := startGateway(t, testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()})))
	for id, want := range map[string]int{"sim": 200, server.DefaultModelName: 200, "nope": 404} {
		resp, err := http.Get(g.base + "/v1/models/" + id)
		if err != nil {
			t.Fatal(err)
		}
		var card struct{ ID, Object string }
		json.NewDecoder(resp.Body).Decode(&card)
		resp.Body.Close()
		if resp.StatusCode != want || want == 200 && (card.ID != id || card.Object != "model") {
			t.Fatalf("%s: status %d, card %+v", id, resp.StatusCode, card)
		}
	}
}

// 20: state changes are logged once each (an ejection, a probe failing and
// passing again), and every request has an access log line without its
// prompt.
func TestLogs(t *testing.T) {
	a := newUpstream(t, server.Config{Engine: testEngineConfig()})
	b := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := testConfig(t, a, b)
	var mu sync.Mutex
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) }), nil))
	g := startGatewayDeps(t, c, Deps{Logger: log})
	if _, _, err := g.complete(context.Background(), "a secret prompt", 2); err != nil {
		t.Fatal(err)
	}
	count := func(msg string) int {
		mu.Lock()
		defer mu.Unlock()
		return strings.Count(buf.String(), `"msg":"`+msg+`"`)
	}
	a.kill()
	waitUntil(t, "the ejection logged", 3*time.Second, func() bool { return count("replica ejected") >= 1 })
	time.Sleep(100 * time.Millisecond)
	if n := count("replica probe failing"); n != 1 {
		t.Fatalf("probe failing logged %d times", n)
	}
	a.restart()
	waitUntil(t, "recovery logged", 5*time.Second, func() bool { return count("replica probe passing again") == 1 })
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if !strings.Contains(out, `"msg":"access"`) || strings.Contains(out, "secret prompt") {
		t.Fatalf("access log missing or leaking the prompt:\n%s", out)
	}
}

// 5, through the official OpenAI Node SDK: a stream cut mid-way raises in
// the client's loop instead of ending as if whole.
func TestNodeSDKRaisesOnBrokenStream(t *testing.T) {
	abs := nodeModules(t)
	eng := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request) {
		sse(w, 3, false)
		panic(http.ErrAbortHandler)
	})
	c := fakeConfig(t, eng.URL)
	c.Retry.Attempts = 1
	g := startGateway(t, c)
	script := `const OpenAI = require('openai');
const c = new OpenAI({baseURL: process.env.BASE_URL + '/v1', apiKey: 'none', maxRetries: 0});
(async () => {
  let n = 0;
  try {
    const s = await c.completions.create({model: 'inferrail-sim', prompt: 'hi', max_tokens: 50, stream: true});
    for await (const ch of s) n++;
    console.log(JSON.stringify({raised: false, n}));
  } catch (e) {
    console.log(JSON.stringify({raised: true, n, message: String(e && e.message || e)}));
  }
})();`
	cmd := exec.Command("node", "-e", script)
	cmd.Env = append(os.Environ(), "BASE_URL="+g.base, "NODE_PATH="+abs)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v: %s", err, out)
	}
	var res struct {
		Raised  bool
		N       int
		Message string
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !res.Raised {
		t.Fatalf("the SDK read a broken stream as whole: %s", out)
	}
	t.Logf("the SDK raised after %d chunks: %s", res.N, res.Message)
}

// Streams one after another reuse the relay's buffers: every one is served
// promptly (a buffer returned empty to the pool once made a later read
// spin).
func TestManyStreamsInARow(t *testing.T) {
	g := startGateway(t, testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()})))
	for i := range 300 {
		start := time.Now()
		if _, body, err := g.complete(context.Background(), words(i*7, 20), 8); err != nil || !strings.Contains(body, "[DONE]") {
			t.Fatalf("request %d: %v %q", i, err, body)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("request %d took %v", i, d)
		}
	}
}

// An engine silent mid-stream past stream_idle_timeout ends the stream as a
// failure: an error event naming the timeout, an aborted response, and a
// failure of that replica.
func TestStreamIdleTimeout(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	eng := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request) {
		sse(w, 2, false)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	c := fakeConfig(t, eng.URL)
	c.StreamIdleTimeout = 200 * time.Millisecond
	g := startGateway(t, c)
	start := time.Now()
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": "hi", "stream": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || !bytes.Contains(b, []byte(`"type": "stream_idle_timeout"`)) || time.Since(start) > 3*time.Second {
		t.Fatalf("after %v: %v %q", time.Since(start), err, b)
	}
	if n := g.outcomes("stream_idle_timeout"); n != 1 {
		t.Fatalf("outcome counted %v times", n)
	}
}

// An engine that keeps a stream open after its data: [DONE] delays the
// client's [DONE] by openai.DoneGrace at most, and the request is a success.
func TestEngineOpenAfterDone(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	eng := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request) {
		sse(w, 2, true)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	g := startGateway(t, fakeConfig(t, eng.URL))
	start := time.Now()
	resp, body, err := g.complete(context.Background(), "hello", 2)
	if err != nil || resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("%v %v %q", resp, err, body)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("[DONE] reached the client after %v", d)
	}
	waitUntil(t, "a success", time.Second, func() bool { return g.outcomes("ok") == 1 })
}

// 3, on the small endpoints: a stalled body the handler never reads is cut
// at read_timeout, so its connection does not stay open.
func TestStalledBodyOnSmallEndpoint(t *testing.T) {
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.ReadTimeout = 200 * time.Millisecond
	g := startGateway(t, c)
	br, conn := rawRequest(t, hostOf(g.base), "GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	resp.Body.Close()
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	start := time.Now()
	if _, err := io.ReadAll(br); err != nil || time.Since(start) > 2*time.Second {
		t.Fatalf("the connection stayed open %v (%v)", time.Since(start), err)
	}
}

// An engine that serves the model under another name answers every request
// 404: the log says so once (with the hint), not once per request, and
// says once that it serves the model again when it does.
func TestLogsEngineNotServingTheModel(t *testing.T) {
	var missing atomic.Bool
	missing.Store(true)
	eng := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request) {
		if missing.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"message":"The model `+"`inferrail-sim`"+` does not exist.","type":"NotFoundError","param":"model","code":404}}`)
			return
		}
		sse(w, 2, true)
	})
	c := fakeConfig(t, eng.URL)
	var mu sync.Mutex
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) }), nil))
	g := startGatewayDeps(t, c, Deps{Logger: log})
	count := func(msg string) int {
		mu.Lock()
		defer mu.Unlock()
		return strings.Count(buf.String(), `"msg":"`+msg+`"`)
	}
	send := func(want int) {
		t.Helper()
		resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": "hi", "stream": true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("status %d, want %d", resp.StatusCode, want)
		}
	}
	for range 5 {
		send(http.StatusNotFound)
	}
	if n := count("replica answers 404 to this model: the engine does not serve it under this name"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, buf.String())
	}
	mu.Lock()
	hinted := strings.Contains(buf.String(), "--served-model-name")
	mu.Unlock()
	if !hinted {
		t.Fatalf("no hint in the log:\n%s", buf.String())
	}
	missing.Store(false)
	for range 3 {
		send(http.StatusOK)
	}
	if n := count("replica serves the model again"); n != 1 {
		t.Fatalf("recovery logged %d times, want once", n)
	}
}
