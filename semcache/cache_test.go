package semcache

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
)

// greedy is the tests' determinism rule: temperature 0 only.
type greedy struct{}

func (greedy) Deterministic(_ string, body []byte) (bool, string) {
	var b struct {
		Temperature *float64 `json:"temperature"`
	}
	if json.Unmarshal(body, &b) != nil || b.Temperature == nil || *b.Temperature != 0 {
		return false, "temperature"
	}
	return true, ""
}

// startEngine serves `inferrail engine` on 127.0.0.1 and returns its base
// URL.
func startEngine(t *testing.T) string {
	t.Helper()
	cfg := engine.DefaultConfig()
	cfg.NumGPUBlocks, cfg.MaxModelLen = 512, 4096
	s, err := server.New(server.Config{Engine: cfg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done })
	return hs.URL
}

// counters records the hooks' calls.
type counters struct {
	mu                                sync.Mutex
	hits, misses, embedErrors, stored int
	bypass                            map[string]int
	storeErrors                       map[string]int
	embedCalls                        int
}

func (c *counters) hooks() Hooks {
	lock := func(f func()) { c.mu.Lock(); defer c.mu.Unlock(); f() }
	return Hooks{
		Hit:          func(float64) { lock(func() { c.hits++ }) },
		Miss:         func() { lock(func() { c.misses++ }) },
		Bypass:       func(r string) { lock(func() { c.bypass[r]++ }) },
		EmbedError:   func() { lock(func() { c.embedErrors++ }) },
		EmbedLatency: func(time.Duration) { lock(func() { c.embedCalls++ }) },
		StoreError:   func(op string) { lock(func() { c.storeErrors[op]++ }) },
		Stored:       func(int) { lock(func() { c.stored++ }) },
	}
}

func newCounters() *counters {
	return &counters{bypass: map[string]int{}, storeErrors: map[string]int{}}
}

func testConfig(url string) Config {
	cfg := DefaultConfig()
	cfg.Enabled = true
	cfg.Embeddings.URL = url
	cfg.Embeddings.Model = server.DefaultModelName
	cfg.Embeddings.Dimensions = 256
	return cfg
}

// chat is a deterministic chat request with a fixed system prompt.
func chat(user string) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": "m", "temperature": 0, "max_tokens": 64,
		"messages": []map[string]any{{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": user}},
	})
	return b
}

type pairSet struct {
	Paraphrases [][2]string `json:"paraphrases"`
	Unrelated   [][2]string `json:"unrelated"`
}

func readPairs(t *testing.T) pairSet {
	b, err := os.ReadFile("testdata/pairs.json")
	if err != nil {
		t.Fatal(err)
	}
	var p pairSet
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Paraphrases) < 10 || len(p.Unrelated) < 10 {
		t.Fatalf("testdata/pairs.json: %d paraphrases, %d unrelated pairs", len(p.Paraphrases), len(p.Unrelated))
	}
	return p
}

// testPairs runs the fixed test set through a Cache on store with the mock
// engine's embeddings: a paraphrase of a stored prompt hits, an unrelated
// prompt misses, and no other tenant ever hits.
func testPairs(t *testing.T, store Store) {
	ctx := context.Background()
	url := startEngine(t)
	cnt := newCounters()
	c, err := New(ctx, testConfig(url), Deps{Rule: greedy{}, Store: store, Hooks: cnt.hooks()})
	if err != nil {
		t.Fatal(err)
	}
	pairs := readPairs(t)
	lookup := func(t *testing.T, tenant, prompt string) Result {
		t.Helper()
		r, err := c.Lookup(ctx, Query{Path: PathChatCompletions, Body: chat(prompt), Tenant: tenant, Model: "m"})
		if err != nil {
			t.Fatalf("lookup %q: %v", prompt, err)
		}
		return r
	}
	run := func(name string, set [][2]string, wantHit bool) {
		t.Run(name, func(t *testing.T) {
			for i, p := range set {
				tenant := fmt.Sprintf("%s-%d", name, i)
				r := lookup(t, tenant, p[0])
				if r.Outcome != Miss {
					t.Fatalf("%q: first lookup %v (%s), want miss", p[0], r.Outcome, r.Reason)
				}
				answer := "answer to " + p[0]
				if err := r.Store(ctx, []byte(answer)); err != nil {
					t.Fatal(err)
				}
				r = lookup(t, tenant, p[1])
				if got := r.Outcome == Hit; got != wantHit {
					t.Errorf("%q after %q: %v at similarity %.4f, want hit %v", p[1], p[0], r.Outcome, r.Similarity, wantHit)
				}
				if r.Outcome == Hit && string(r.Answer) != answer {
					t.Errorf("%q: answer %q, want %q", p[1], r.Answer, answer)
				}
				// Another tenant: never, not even with the very same prompt.
				for _, q := range p {
					if r := lookup(t, tenant+"-other", q); r.Outcome == Hit {
						t.Fatalf("CROSS-TENANT HIT: %q answered with %q", q, r.Answer)
					}
				}
			}
		})
	}
	run("paraphrases", pairs.Paraphrases, true)
	run("unrelated", pairs.Unrelated, false)
	if cnt.hits != len(pairs.Paraphrases) || cnt.stored != len(pairs.Paraphrases)+len(pairs.Unrelated) || cnt.embedErrors != 0 || len(cnt.storeErrors) != 0 {
		t.Fatalf("hooks: %d hits, %d stored, %d embed errors, store errors %v", cnt.hits, cnt.stored, cnt.embedErrors, cnt.storeErrors)
	}
}

func TestPairsMemory(t *testing.T) {
	s, _ := NewMemoryStore(MemoryOptions{})
	testPairs(t, s)
}

// TestPartition: only the last user message is matched by similarity;
// any other difference is a miss, even for the same user message.
func TestPartition(t *testing.T) {
	ctx := context.Background()
	c, err := New(ctx, testConfig(startEngine(t)), Deps{Rule: greedy{}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	base := map[string]any{
		"model": "m", "temperature": 0, "max_tokens": 64,
		"messages": []any{map[string]any{"role": "system", "content": "You are a pirate."}, map[string]any{"role": "user", "content": "How do I reset my password?"}},
	}
	body := func(change func(m map[string]any)) []byte {
		b, _ := json.Marshal(base)
		var m map[string]any
		json.Unmarshal(b, &m)
		if change != nil {
			change(m)
		}
		b, _ = json.Marshal(m)
		return b
	}
	q := Query{Path: PathChatCompletions, Body: body(nil), Tenant: "t", Model: "m"}
	r, err := c.Lookup(ctx, q)
	if err != nil || r.Outcome != Miss {
		t.Fatalf("first: %v %v", r.Outcome, err)
	}
	r.Store(ctx, []byte("arr"))
	for name, change := range map[string]func(m map[string]any){
		"another system prompt": func(m map[string]any) {
			m["messages"].([]any)[0].(map[string]any)["content"] = "You are a lawyer."
		},
		"max_tokens": func(m map[string]any) { m["max_tokens"] = 65 },
		"stream":     func(m map[string]any) { m["stream"] = true },
		"tools":      func(m map[string]any) { m["tools"] = []any{map[string]any{"type": "function"}} },
		"cache_salt": func(m map[string]any) { m["cache_salt"] = "s" },
		"an earlier turn": func(m map[string]any) {
			m["messages"] = append([]any{map[string]any{"role": "user", "content": "hi"}}, m["messages"].([]any)...)
		},
	} {
		if r, err := c.Lookup(ctx, Query{Path: PathChatCompletions, Body: body(change), Tenant: "t", Model: "m"}); err != nil || r.Outcome != Miss {
			t.Errorf("%s: %v %v, want a miss", name, r.Outcome, err)
		}
	}
	// The same request with its keys in another order and a paraphrased
	// question: a hit.
	para := []byte(`{"messages":[{"content":"You are a pirate.","role":"system"},{"content":"how can I reset my password","role":"user"}],"max_tokens":64,"temperature":0,"model":"m"}`)
	if r, err := c.Lookup(ctx, Query{Path: PathChatCompletions, Body: para, Tenant: "t", Model: "m"}); err != nil || r.Outcome != Hit || string(r.Answer) != "arr" {
		t.Fatalf("paraphrase: %v %q %v", r.Outcome, r.Answer, err)
	}
	// Another model: a miss.
	if r, _ := c.Lookup(ctx, Query{Path: PathChatCompletions, Body: para, Tenant: "t", Model: "m2"}); r.Outcome != Miss {
		t.Fatalf("another model: %v", r.Outcome)
	}
}

// TestBypass: what is never looked up, and why.
func TestBypass(t *testing.T) {
	ctx := context.Background()
	cnt := newCounters()
	c, err := New(ctx, testConfig(startEngine(t)), Deps{Rule: greedy{}, Hooks: cnt.hooks()})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("word ", 500)
	for _, tc := range []struct {
		q    Query
		want string
	}{
		{Query{Path: PathChatCompletions, Body: chat("hi"), Model: "m"}, ReasonNoTenant},
		{Query{Path: PathChatCompletions, Body: chat("hi"), Tenant: "t"}, ReasonNoModel},
		{Query{Path: "/v1/embeddings", Body: chat("hi"), Tenant: "t", Model: "m"}, ReasonPath},
		{Query{Path: PathChatCompletions, Body: []byte(`{"messages":[{"role":"user","content":"hi"}],"temperature":0.7}`), Tenant: "t", Model: "m"}, ReasonNotDeterministic + ":temperature"},
		{Query{Path: PathChatCompletions, Body: []byte(`{"messages":[{"role":"user","content":"hi"}]}`), Tenant: "t", Model: "m"}, ReasonNotDeterministic + ":temperature"},
		{Query{Path: PathChatCompletions, Body: []byte(`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}],"temperature":0}`), Tenant: "t", Model: "m"}, ReasonNoUserMessage},
		{Query{Path: PathChatCompletions, Body: []byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}],"temperature":0}`), Tenant: "t", Model: "m"}, ReasonNotText},
		{Query{Path: PathCompletions, Body: []byte(`{"prompt":[1,2,3],"temperature":0}`), Tenant: "t", Model: "m"}, ReasonNotText},
		{Query{Path: PathCompletions, Body: []byte(`{"prompt":"  ","temperature":0}`), Tenant: "t", Model: "m"}, ReasonEmptyText},
		{Query{Path: PathCompletions, Body: []byte(`{"prompt":"` + long + `","temperature":0}`), Tenant: "t", Model: "m"}, ReasonTooLong},
		{Query{Path: PathChatCompletions, Body: []byte(`{"messages":"hi","temperature":0}`), Tenant: "t", Model: "m"}, ReasonInvalidBody},
	} {
		r, err := c.Lookup(ctx, tc.q)
		if err != nil || r.Outcome != Bypass || r.Reason != tc.want {
			t.Errorf("%s: %v %q %v, want bypass %q", tc.q.Body, r.Outcome, r.Reason, err, tc.want)
		}
	}
	if cnt.embedCalls != 0 {
		t.Fatalf("%d embeddings calls for requests never looked up", cnt.embedCalls)
	}
	// Disabled: nothing happens.
	cfg := testConfig("http://127.0.0.1:1")
	cfg.Enabled = false
	off, err := New(ctx, cfg, Deps{Rule: greedy{}})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := off.Lookup(ctx, Query{Path: PathChatCompletions, Body: chat("hi"), Tenant: "t", Model: "m"}); r.Reason != ReasonDisabled {
		t.Fatalf("disabled: %v %q", r.Outcome, r.Reason)
	}
	if _, err := New(ctx, testConfig("http://127.0.0.1:1"), Deps{}); err == nil {
		t.Fatal("a cache without a determinism rule")
	}
}

// TestEmbedFailure: an embeddings endpoint that fails makes a bypass with
// an error and counts it; the request then goes to the engines.
func TestEmbedFailure(t *testing.T) {
	ctx := context.Background()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"message":"model not loaded"}}`, http.StatusServiceUnavailable)
	}))
	defer hs.Close()
	cnt := newCounters()
	c, err := New(ctx, testConfig(hs.URL), Deps{Rule: greedy{}, Hooks: cnt.hooks()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Lookup(ctx, Query{Path: PathChatCompletions, Body: chat("hi"), Tenant: "t", Model: "m"})
	if err == nil || !strings.Contains(err.Error(), "model not loaded") || r.Outcome != Bypass || cnt.embedErrors != 1 {
		t.Fatalf("%v %v, %d embed errors", r.Outcome, err, cnt.embedErrors)
	}
	if err := r.Store(ctx, []byte("x")); err == nil {
		t.Fatal("a bypass's answer was stored")
	}
}

// TestStoreLimits: an answer over max_entry_bytes is not stored.
func TestStoreLimits(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(startEngine(t))
	cfg.MaxEntryBytes = 10
	cnt := newCounters()
	notStored := 0
	h := cnt.hooks()
	h.NotStored = func(string) { notStored++ }
	c, err := New(ctx, cfg, Deps{Rule: greedy{}, Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := c.Lookup(ctx, Query{Path: PathChatCompletions, Body: chat("hello there"), Tenant: "t", Model: "m"})
	if err := r.Store(ctx, []byte("more than ten bytes")); err != nil || notStored != 1 {
		t.Fatalf("%v, %d not stored", err, notStored)
	}
	if r, _ := c.Lookup(ctx, Query{Path: PathChatCompletions, Body: chat("hello there"), Tenant: "t", Model: "m"}); r.Outcome != Miss {
		t.Fatalf("%v after a too large answer", r.Outcome)
	}
}

// BenchmarkLookup: one hit through Lookup: Split, an embeddings call to
// `inferrail engine` over loopback HTTP, the memory store's Nearest.
func BenchmarkLookup(b *testing.B) {
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.Enabled = true
	ecfg := engine.DefaultConfig()
	ecfg.NumGPUBlocks, ecfg.MaxModelLen = 512, 4096
	s, err := server.New(server.Config{Engine: ecfg})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	cfg.Embeddings.URL, cfg.Embeddings.Model = hs.URL, server.DefaultModelName
	c, err := New(ctx, cfg, Deps{Rule: greedy{}})
	if err != nil {
		b.Fatal(err)
	}
	q := Query{Path: PathChatCompletions, Body: chat("How do I reset my password?"), Tenant: "t", Model: "m"}
	r, err := c.Lookup(ctx, q)
	if err != nil || r.Outcome != Miss {
		b.Fatal(r.Outcome, err)
	}
	r.Store(ctx, []byte("answer"))
	b.ReportAllocs()
	for b.Loop() {
		if r, err := c.Lookup(ctx, q); err != nil || r.Outcome != Hit {
			b.Fatal(r.Outcome, err)
		}
	}
}
