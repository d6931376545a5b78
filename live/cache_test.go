package live

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/respcache"
)

// The response caches through the proxy, against inferrail engine in
// process: byte-identical replay, tenants apart, identical misses computed
// once, hits metered as 0 engine tokens, non-deterministic requests
// bypassed, and the semantic cache's paraphrases.

// cacheConfig is testConfig with the exact cache on, its tenant the
// x-inferrail-tenant header (auth: none).
func cacheConfig(t testing.TB, ups ...*upstream) *config.Config {
	c := testConfig(t, ups...)
	c.Models[0].ResponseCache.Enabled = true
	c.Models[0].ResponseCache.TenantHeader = HeaderTenant
	return c
}

// engineRequests is the generation requests engine u finished, from its
// own metrics (vllm:request_success_total, every finished_reason).
// settledEngineRequests waits (at most 5 s) until the engine has counted at
// least want finished requests, a little longer for any late extra one, and
// returns its count: the engine counts a request as it retires it, which
// can come after the client has read the whole answer.
func settledEngineRequests(t testing.TB, u *upstream, want int) int {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for engineRequests(t, u) < want && time.Now().Before(end) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	return engineRequests(t, u)
}

// stableEngineRequests returns the engine's count of finished requests once
// it has stopped moving (two reads 30 ms apart agree; at most 5 s), so that a
// late count of an earlier request is not charged to the next one.
func stableEngineRequests(t testing.TB, u *upstream) int {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	n := engineRequests(t, u)
	for time.Now().Before(end) {
		time.Sleep(30 * time.Millisecond)
		m := engineRequests(t, u)
		if m == n {
			break
		}
		n = m
	}
	return n
}

func engineRequests(t testing.TB, u *upstream) int {
	t.Helper()
	resp, err := http.Get(u.url() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "vllm:request_success_total{") {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("engine metric %q: %v", l, err)
		}
		n += v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// send posts body to path with the headers and reads the whole answer.
func send(t testing.TB, g *testGateway, path string, body map[string]any, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	resp, err := g.post(t.Context(), path, body, hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
	}
	return resp, b
}

// vec reads one series of a counter vector, or a histogram vector's
// sample count.
func vec(t testing.TB, v prometheus.Collector, labels ...string) float64 {
	t.Helper()
	var m dto.Metric
	switch v := v.(type) {
	case *prometheus.CounterVec:
		if err := v.WithLabelValues(labels...).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	case *prometheus.HistogramVec:
		if err := v.WithLabelValues(labels...).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		return float64(m.GetHistogram().GetSampleCount())
	}
	t.Fatalf("not a vector: %T", v)
	return 0
}

func TestCacheReplayIsByteIdentical(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig(), Seed: 7, EnablePromptTokensDetails: true})
	g := startGateway(t, cacheConfig(t, up))
	model := g.models[0].name
	tenant := map[string]string{HeaderTenant: "team-a"}
	prompt := words(100, 40)
	cases := []struct {
		name, path string
		body       map[string]any
	}{
		{"completion", "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 12, "ignore_eos": true, "temperature": 0}},
		{"completion stream", "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 12, "ignore_eos": true, "temperature": 0, "stream": true,
			"stream_options": map[string]any{"include_usage": true}}},
		{"chat", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": prompt}}, "max_tokens": 12, "temperature": 0, "seed": 3}},
		{"chat stream", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": prompt}}, "max_tokens": 12, "temperature": 0, "stream": true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := stableEngineRequests(t, up)
			r1, first := send(t, g, tc.path, tc.body, tenant)
			if got := r1.Header.Get(respcache.HeaderCache); got != "miss" {
				t.Fatalf("first answer: %s %q, want miss", respcache.HeaderCache, got)
			}
			// The same request through the model's alias.
			again := map[string]any{"model": "sim"}
			for k, v := range tc.body {
				again[k] = v
			}
			r2, second := send(t, g, tc.path, again, tenant)
			if got := r2.Header.Get(respcache.HeaderCache); got != "hit" {
				t.Fatalf("second answer: %s %q, want hit", respcache.HeaderCache, got)
			}
			if !bytes.Equal(first, second) {
				t.Fatalf("replay differs:\n%s\nfirst:\n%s", second, first)
			}
			if r1.Header.Get("Content-Type") != r2.Header.Get("Content-Type") {
				t.Fatalf("content type %q, first %q", r2.Header.Get("Content-Type"), r1.Header.Get("Content-Type"))
			}
			if n := settledEngineRequests(t, up, before+1) - before; n != 1 {
				t.Fatalf("the engine computed %d answers, want 1", n)
			}
			// The engine itself writes the same text again (a function of
			// the prompt and its seed) under a new id: the hit above is the
			// first answer replayed, not the engine's again.
			r3, third := send(t, g, tc.path, tc.body, map[string]string{HeaderTenant: "team-b"})
			if got := r3.Header.Get(respcache.HeaderCache); got != "miss" {
				t.Fatalf("another tenant: %s %q, want miss", respcache.HeaderCache, got)
			}
			if bytes.Equal(first, third) || textOf(t, first) != textOf(t, third) || textOf(t, first) == "" {
				t.Fatalf("engine answers for the same request: %q and %q (same text, other ids expected)", first, third)
			}
		})
	}
	if h, m := vec(t, g.met.cache.hits, model), vec(t, g.met.cache.misses, model); h != 4 || m != 8 {
		t.Fatalf("hits %v, misses %v; want 4 and 8", h, m)
	}
	if s := vec(t, g.met.cache.stores, model); s != 8 {
		t.Fatalf("stores %v, want 8", s)
	}
}

// textOf is the generated text of a completion or chat answer, streamed
// or not.
func textOf(t testing.TB, b []byte) string {
	t.Helper()
	var out strings.Builder
	take := func(js []byte) {
		var v struct {
			Choices []struct {
				Text    string `json:"text"`
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(js, &v); err != nil {
			t.Fatalf("%v: %s", err, js)
		}
		for _, c := range v.Choices {
			out.WriteString(c.Text + c.Message.Content + c.Delta.Content)
		}
	}
	if !bytes.HasPrefix(b, []byte("data: ")) {
		take(b)
		return out.String()
	}
	for _, l := range strings.Split(string(b), "\n") {
		if d, ok := strings.CutPrefix(l, "data: "); ok && d != "[DONE]" {
			take([]byte(d))
		}
	}
	return out.String()
}

// With auth: keys the key is the tenant: two keys never share an entry,
// a hit is a request of 0 engine tokens in the key's usage, charged on
// RPM but not on TPM.
func TestCacheTenantsAndMetering(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, func(c *config.Config) { c.Models[0].ResponseCache.Enabled = true }, Deps{})
	prompt := words(300, 50)
	p := promptTokens(t, prompt)
	const out = 10
	body := map[string]any{"prompt": prompt, "max_tokens": out, "ignore_eos": true, "temperature": 0}
	// Room on TPM for one request's estimate and a little more; RPM for
	// four requests.
	idA, keyA := g.createKey(t, map[string]any{"name": "a", "rpm": 4, "tpm": p + out + 5})
	idB, keyB := g.createKey(t, map[string]any{"name": "b"})

	callCache := func(key string, b map[string]any) (int, string, []byte) {
		resp, got := callWith(t, g.testGateway, key, b, nil)
		return resp.StatusCode, resp.Header.Get(respcache.HeaderCache), got
	}
	_, c1, first := callCache(keyA, body)
	_, c2, second := callCache(keyA, body)
	_, c3, other := callCache(keyB, body)
	_, c4, _ := callCache(keyB, body)
	if c1 != "miss" || c2 != "hit" || c3 != "miss" || c4 != "hit" {
		t.Fatalf("x-inferrail-cache: a %q then %q, b %q then %q; want miss, hit, miss, hit", c1, c2, c3, c4)
	}
	if !bytes.Equal(first, second) || bytes.Equal(first, other) {
		t.Fatal("key b was served key a's answer, or key a not its own")
	}
	if n := settledEngineRequests(t, up, 2); n != 2 {
		t.Fatalf("the engine computed %d answers, want 2 (one per key)", n)
	}
	// The first answer holds TPM at p+out (of p+out+5): a hit still
	// passes, a new request that needs an estimate does not (and is not
	// charged on RPM: the limiter charges all or nothing).
	if st, c, _ := callCache(keyA, body); st != http.StatusOK || c != "hit" {
		t.Fatalf("a hit under TPM: %d %q", st, c)
	}
	fresh := map[string]any{"prompt": words(900, 50), "max_tokens": out, "ignore_eos": true, "temperature": 0}
	if st, _, b := callCache(keyA, fresh); st != http.StatusTooManyRequests || errorOf(t, b).Type != "tokens" {
		t.Fatalf("a miss past TPM: %d %s, want 429 tokens", st, b)
	}
	// Hits are requests on RPM: the fourth passes, the fifth does not.
	if st, c, _ := callCache(keyA, body); st != http.StatusOK || c != "hit" {
		t.Fatalf("the fourth request, a hit: %d %q", st, c)
	}
	if st, _, b := callCache(keyA, body); st != http.StatusTooManyRequests || errorOf(t, b).Type != "requests" {
		t.Fatalf("a hit past RPM: %d %s, want 429 requests", st, b)
	}

	rows := map[string]int64{}
	for _, u := range g.usageRows(t, "") {
		if u.KeyID == idA {
			rows["requests"] += u.Requests
			rows["prompt"] += u.PromptTokens
			rows["output"] += u.OutputTokens
			rows["errors"] += u.Errors
		}
		if u.KeyID == idB {
			rows["b_requests"] += u.Requests
			rows["b_prompt"] += u.PromptTokens
		}
	}
	// Key a: one miss (p + out tokens) and three hits (0 tokens, no
	// error); the refusals are not metered.
	want := map[string]int64{"requests": 4, "prompt": int64(p), "output": out, "errors": 0, "b_requests": 2, "b_prompt": int64(p)}
	for k, v := range want {
		if rows[k] != v {
			t.Errorf("usage %s = %d, want %d (all: %v)", k, rows[k], v, rows)
		}
	}
	if o := vec(t, g.met.requests, g.models[0].name, outcomeCacheHit); o != 4 {
		t.Errorf("inferrail_requests_total{outcome=cache_hit} = %v, want 4", o)
	}
}

// 100 concurrent identical misses reach the engine once; every client
// gets the same bytes.
func TestCacheConcurrentIdenticalMissesComputedOnce(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startGateway(t, cacheConfig(t, up))
	body := map[string]any{"prompt": words(40, 30), "max_tokens": 64, "ignore_eos": true, "temperature": 0, "stream": true}
	const n = 100
	answers := make([][]byte, n)
	kinds := make([]string, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			resp, err := g.post(t.Context(), "/v1/completions", body, map[string]string{HeaderTenant: "t"})
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			answers[i], err = io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("request %d: %d %v", i, resp.StatusCode, err)
			}
			kinds[i] = resp.Header.Get(respcache.HeaderCache)
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	if got := settledEngineRequests(t, up, 1); got != 1 {
		t.Fatalf("%d identical requests reached the engine %d times, want once", n, got)
	}
	misses := 0
	for i := range n {
		if kinds[i] == "miss" {
			misses++
		}
		if !bytes.Equal(answers[i], answers[0]) {
			t.Fatalf("answer %d differs from answer 0", i)
		}
	}
	model := g.models[0].name
	if misses != 1 || vec(t, g.met.cache.hits, model) != n-1 {
		t.Fatalf("%d misses, %v hits; want 1 and %d", misses, vec(t, g.met.cache.hits, model), n-1)
	}
	t.Logf("%v of the hits waited for the first answer", vec(t, g.met.cache.coalesced, model))
}

// Requests whose answers may differ, or that have no tenant, go to the
// engine every time, with no x-inferrail-cache header.
func TestCacheBypass(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startGateway(t, cacheConfig(t, up))
	model := g.models[0].name
	prompt := words(700, 20)
	tenant := map[string]string{HeaderTenant: "t"}
	cases := []struct {
		reason string
		body   map[string]any
		hdr    map[string]string
	}{
		{"temperature", map[string]any{"prompt": prompt, "max_tokens": 4}, tenant}, // OpenAI's default 1
		{"temperature", map[string]any{"prompt": prompt, "max_tokens": 4, "temperature": 0.7, "seed": 1}, tenant},
		{"no_tenant", map[string]any{"prompt": prompt, "max_tokens": 4, "temperature": 0}, nil},
	}
	for _, tc := range cases {
		before := stableEngineRequests(t, up)
		for range 2 {
			resp, _ := send(t, g, "/v1/completions", tc.body, tc.hdr)
			if got, ok := resp.Header[respcache.HeaderCache]; ok {
				t.Fatalf("%v: %s %q on a bypassed request", tc.body, respcache.HeaderCache, got)
			}
		}
		if n := settledEngineRequests(t, up, before+2) - before; n != 2 {
			t.Fatalf("%v: the engine computed %d answers, want 2", tc.body, n)
		}
	}
	for reason, want := range map[string]float64{"temperature": 4, "no_tenant": 2} {
		if got := vec(t, g.met.cache.bypass, model, reason); got != want {
			t.Errorf("bypass{reason=%s} = %v, want %v", reason, got, want)
		}
	}

	// With tenancy on and auth: none every request has the anonymous key:
	// it is no tenant, or all of them would share one pool.
	c := testConfig(t, up)
	c.Models[0].ResponseCache.Enabled = true
	c.Tenancy.Store = filepath.Join(t.TempDir(), "tenancy.db")
	anon := startGateway(t, c)
	body := map[string]any{"prompt": prompt, "max_tokens": 4, "temperature": 0}
	for range 2 {
		if resp, _ := send(t, anon, "/v1/completions", body, nil); resp.Header.Get(respcache.HeaderCache) != "" {
			t.Fatalf("the anonymous key was a tenant: %s %q", respcache.HeaderCache, resp.Header.Get(respcache.HeaderCache))
		}
	}
	if got := vec(t, anon.met.cache.bypass, model, "no_tenant"); got != 2 {
		t.Fatalf("anonymous: bypass{reason=no_tenant} = %v, want 2", got)
	}
}

// The semantic cache through the proxy, embeddings from the mock engine's
// /v1/embeddings: a paraphrase of a tenant's earlier question is answered
// with that question's answer; an unrelated question and every other
// tenant's are not.
func TestSemanticCacheThroughProxy(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := cacheConfig(t, up)
	sc := &c.Models[0].SemanticCache
	sc.Enabled = true
	sc.Embeddings.URL, sc.Embeddings.Model = up.url(), server.DefaultModelName
	g := startGateway(t, c)
	model := g.models[0].name
	ask := func(tenant, question string) (string, []byte) {
		t.Helper()
		body := map[string]any{"messages": []map[string]any{
			{"role": "system", "content": "You answer briefly."},
			{"role": "user", "content": question},
		}, "max_tokens": 8, "temperature": 0}
		resp, b := send(t, g, "/v1/chat/completions", body, map[string]string{HeaderTenant: tenant})
		return resp.Header.Get(respcache.HeaderCache), b
	}
	stored := func(n float64) {
		t.Helper()
		waitUntil(t, "the semantic cache to store", 5*time.Second, func() bool { return vec(t, g.met.cache.semStores, model) >= n })
	}

	kind, first := ask("a", "How do I reset my password?")
	if kind != "miss" {
		t.Fatalf("first question: %q, want miss", kind)
	}
	stored(1)
	before := stableEngineRequests(t, up)
	kind, para := ask("a", "how can i reset my password")
	if kind != cacheSemantic || !bytes.Equal(para, first) {
		t.Fatalf("paraphrase: %q %s, want semantic and the first answer %s", kind, para, first)
	}
	if stableEngineRequests(t, up) != before {
		t.Fatal("a semantic hit reached the engine")
	}
	// The paraphrase was not stored under its own exact key: asked again it
	// is a semantic hit again, not an exact one.
	if kind, _ := ask("a", "how can i reset my password"); kind != cacheSemantic {
		t.Fatalf("paraphrase again: %q, want semantic", kind)
	}
	if kind, unrelated := ask("a", "What is the capital of France?"); kind != "miss" || bytes.Equal(unrelated, first) {
		t.Fatalf("unrelated question: %q", kind)
	}
	stored(2)
	// Another tenant: the very same question misses (tenant a's answer is
	// not in its scope), and its own paraphrase then gets its own answer.
	kind, own := ask("b", "How do I reset my password?")
	if kind != "miss" || bytes.Equal(own, first) {
		t.Fatalf("tenant b asking tenant a's question: %q (tenant a's answer: %v)", kind, bytes.Equal(own, first))
	}
	stored(3)
	if kind, b := ask("b", "how can i reset my password"); kind != cacheSemantic || !bytes.Equal(b, own) {
		t.Fatalf("tenant b's paraphrase: %q (its own answer: %v, tenant a's: %v)", kind, bytes.Equal(b, own), bytes.Equal(b, first))
	}
	if h := vec(t, g.met.cache.semHits, model); h != 3 {
		t.Fatalf("semantic hits %v, want 3", h)
	}
	if vec(t, g.met.cache.semSimilarity, model) != 3 || vec(t, g.met.cache.semEmbedDuration, model) < 5 {
		t.Fatal("the similarity and embedding histograms were not observed")
	}
	if o := vec(t, g.met.requests, model, outcomeSemanticHit); o != 3 {
		t.Fatalf("inferrail_requests_total{outcome=semantic_hit} = %v, want 3", o)
	}
}

// A cache on a model whose requests can never have a tenant, or never a
// temperature it caches, is said at startup; a wrong cache setting fails
// New with its field.
func TestCacheStartupNotesAndErrors(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := testConfig(t, up)
	c.Models[0].ResponseCache.Enabled = true
	var notes bytes.Buffer
	g := startGatewayDeps(t, c, Deps{Notes: &notes})
	out := notes.String()
	for _, want := range []string{
		"model " + g.models[0].name + ": response_cache is on but no request can have a tenant (auth: none and no response_cache.tenant_header)",
		"requests without a temperature sample at OpenAI's default 1, above max_temperature (0): they are never cached",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("notes %q lack %q", out, want)
		}
	}
	// With a tenant header and max_temperature 1, nothing to say.
	c2 := cacheConfig(t, up)
	c2.Models[0].ResponseCache.MaxTemperature = 1
	notes.Reset()
	startGatewayDeps(t, c2, Deps{Notes: &notes})
	if strings.Contains(notes.String(), "response_cache") {
		t.Errorf("notes for a cache every request can use: %q", notes.String())
	}

	bad := cacheConfig(t, up)
	bad.Models[0].ResponseCache.TTL = 0
	if _, err := New(bad, Deps{}); err == nil || !strings.Contains(err.Error(), "models[0].response_cache.ttl: must be a duration from 1s") {
		t.Fatalf("New with ttl 0: %v", err)
	}
	sem := cacheConfig(t, up)
	sem.Models[0].SemanticCache.Enabled = true
	if _, err := New(sem, Deps{}); err == nil || !strings.Contains(err.Error(), "models[0].semantic_cache.embeddings.url") {
		t.Fatalf("New with a semantic cache without embeddings: %v", err)
	}
}

// A hit's cost through the proxy, one at a time over loopback (the
// measurement at 1,000 req/s is scripts/cache-live.sh).
func BenchmarkCacheHitThroughProxy(b *testing.B) {
	up := newUpstream(b, server.Config{Engine: testEngineConfig()})
	g := startGateway(b, cacheConfig(b, up))
	body, _ := json.Marshal(map[string]any{"prompt": words(10, 200), "max_tokens": 16, "ignore_eos": true, "temperature": 0, "stream": true})
	call := func() string {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, g.base+"/v1/completions", bytes.NewReader(body))
		req.Header.Set(HeaderTenant, "bench")
		resp, err := g.client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.Header.Get(respcache.HeaderCache)
	}
	call()
	if got := call(); got != "hit" {
		b.Fatalf("warm-up: %q, want hit", got)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		call()
	}
	b.StopTimer()
	if n := engineRequests(b, up); n != 1 {
		b.Fatalf("the engine computed %d answers, want 1", n)
	}
}
