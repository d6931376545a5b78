package respcache

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// counters counts every hook call.
type counters struct {
	mu sync.Mutex
	n  map[string]int
}

func newCounters() *counters { return &counters{n: map[string]int{}} }

func (c *counters) add(name string, n int) {
	c.mu.Lock()
	c.n[name] += n
	c.mu.Unlock()
}

func (c *counters) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func (c *counters) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.n)
}

func (c *counters) hooks() Hooks {
	return Hooks{
		Hit:        func() { c.add("hit", 1) },
		Miss:       func() { c.add("miss", 1) },
		Bypass:     func(r string) { c.add("bypass:"+r, 1) },
		Coalesced:  func() { c.add("coalesced", 1) },
		Stored:     func(int) { c.add("stored", 1) },
		NotStored:  func(r string) { c.add("not_stored:"+r, 1) },
		TooLarge:   func() { c.add("too_large", 1) },
		Evicted:    func(r string, n int) { c.add("evicted:"+r, n) },
		StoreError: func(op string) { c.add("store_error:"+op, 1) },
	}
}

// testConfig is an enabled in-memory cache.
func testConfig() Config {
	c := DefaultConfig()
	c.Enabled = true
	c.MaxWait = 10 * time.Second
	return c
}

func newCache(t testing.TB, cfg Config, deps Deps) *Cache {
	t.Helper()
	c, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return c
}

// sseChunk is one chat completion chunk as vLLM writes it.
func sseChunk(id string, text string, finish string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return fmt.Sprintf(`data: {"id":"%s","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":%q},"logprobs":null,"finish_reason":%s}]}`+"\n\n", id, text, fr)
}

// fakeStream is a whole vLLM-style stream of n text chunks, a usage chunk
// and data: [DONE]; tag goes into every id so that answers differ.
func fakeStream(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		fin := ""
		if i == n-1 {
			fin = "length"
		}
		b.WriteString(sseChunk("chatcmpl-"+tag, fmt.Sprintf("tok%d ", i), fin))
	}
	fmt.Fprintf(&b, `data: {"id":"chatcmpl-%s","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[],"usage":{"prompt_tokens":12,"total_tokens":%d,"completion_tokens":%d}}`+"\n\n", tag, 12+n, n)
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// fakeJSON is a non-streamed chat completion.
func fakeJSON(tag string) string {
	return fmt.Sprintf(`{"id":"chatcmpl-%s","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"answer %s"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}`, tag, tag)
}

// fakeEngine answers chat completions like vLLM: streamed event by event
// (each flushed, delay apart) or as one JSON body. Each answer is tagged
// with the call's number, so that two computed answers always differ.
// fail, when set, may answer a call itself (it returns true).
type fakeEngine struct {
	calls  atomic.Int64
	delay  time.Duration
	events int
	fail   func(call int64, w http.ResponseWriter) bool
}

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	call := e.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	if e.fail != nil && e.fail(call, w) {
		return
	}
	tag := fmt.Sprint(call)
	n := e.events
	if n == 0 {
		n = 5
	}
	if !bytes.Contains(body, []byte(`"stream":true`)) {
		if e.delay > 0 {
			time.Sleep(e.delay)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, fakeJSON(tag))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for _, ev := range splitEvents(fakeStream(tag, n)) {
		if e.delay > 0 {
			time.Sleep(e.delay / time.Duration(n+2))
		}
		io.WriteString(w, ev)
		rc.Flush()
	}
}

// splitEvents cuts a stream after each blank line.
func splitEvents(s string) []string {
	var out []string
	for len(s) > 0 {
		i := strings.Index(s, "\n\n")
		if i < 0 {
			return append(out, s)
		}
		out = append(out, s[:i+2])
		s = s[i+2:]
	}
	return out
}

// cachingProxy is what the proxy will do, reduced to the cache: Lookup,
// then replay a hit, or pass the upstream's answer through the capture
// (a miss) or straight (a bypass). upstream answers in process.
type cachingProxy struct {
	t        testing.TB
	c        *Cache
	model    string
	upstream http.Handler
	// forward, when set, sends the request to a real engine instead.
	forward func(ctx context.Context, w http.ResponseWriter, path string, body []byte) error
}

func (p *cachingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	res, err := p.c.Lookup(r.Context(), Request{Path: r.URL.Path, Body: body, Model: p.model, KeyID: r.Header.Get("X-Test-Key"), Header: r.Header})
	if err != nil {
		w.WriteHeader(499)
		return
	}
	switch res.Outcome {
	case Hit:
		if err := Replay(w, res.Entry, 5*time.Second); err != nil {
			p.t.Errorf("replay: %v", err)
		}
		return
	case Miss:
		w = res.Capture.Wrap(w)
		defer res.Capture.Finish()
	}
	if p.forward != nil {
		if err := p.forward(r.Context(), w, r.URL.Path, body); err != nil {
			p.t.Errorf("forward: %v", err)
		}
		return
	}
	up := httptest.NewRequestWithContext(r.Context(), http.MethodPost, r.URL.Path, bytes.NewReader(body))
	p.upstream.ServeHTTP(w, up)
}

// do sends body through h in process and returns the recorded answer.
func do(h http.Handler, key, body string, hdr ...string) *httptest.ResponseRecorder {
	return doCtx(context.Background(), h, key, body, hdr...)
}

func doCtx(ctx context.Context, h http.Handler, key, body string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, PathChatCompletions, strings.NewReader(body))
	if key != "" {
		r.Header.Set("X-Test-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// flushRecorder records a response's writes and where it was flushed.
type flushRecorder struct {
	*httptest.ResponseRecorder
	mu       sync.Mutex
	segments []string // the bytes between flushes
	cur      bytes.Buffer
}

func newFlushRecorder() *flushRecorder {
	return &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
}

func (f *flushRecorder) Write(b []byte) (int, error) {
	f.mu.Lock()
	f.cur.Write(b)
	f.mu.Unlock()
	return f.ResponseRecorder.Write(b)
}

func (f *flushRecorder) Flush() {
	f.mu.Lock()
	if f.cur.Len() > 0 {
		f.segments = append(f.segments, f.cur.String())
		f.cur.Reset()
	}
	f.mu.Unlock()
	f.ResponseRecorder.Flush()
}

func (f *flushRecorder) all() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.segments)
	if f.cur.Len() > 0 {
		out = append(out, f.cur.String())
	}
	return out
}

const (
	streamBody = `{"model":"m","messages":[{"role":"user","content":"hello"}],"temperature":0,"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`
	jsonBody   = `{"model":"m","messages":[{"role":"user","content":"hello"}],"temperature":0,"max_tokens":8}`
)
