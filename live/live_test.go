package live

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
)

func TestProxyBasics(t *testing.T) {
	a := newUpstream(t, server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true})
	b := newUpstream(t, server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true})
	g := startGateway(t, testConfig(t, a, b))
	ctx := context.Background()
	prompt := words(100, 200)

	// Through the alias, with a request id the engine uses as its id.
	resp, err := g.post(ctx, "/v1/completions", map[string]any{"model": "sim", "prompt": prompt, "max_tokens": 5, "ignore_eos": true}, map[string]string{"X-Request-Id": "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var c struct {
		ID    string `json:"id"`
		Model string `json:"model"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	first := resp.Header.Get(HeaderReplica)
	// The client's id is echoed; the engine gets the proxy's own.
	if resp.StatusCode != 200 || c.ID == "cmpl-req-1" || !strings.HasPrefix(c.ID, "cmpl-") || c.Model != server.DefaultModelName || resp.Header.Get(HeaderRequestID) != "req-1" || (first != "a" && first != "b") {
		t.Fatalf("status %d, id %q, model %q, headers %v", resp.StatusCode, c.ID, c.Model, resp.Header)
	}
	if resp.Header.Get(HeaderPredicted) != "0" {
		t.Fatalf("a cold prompt predicted %q cached tokens", resp.Header.Get(HeaderPredicted))
	}

	// The same prompt again: predicted cached, sent to the same replica,
	// and a request id generated.
	resp, _, err = g.complete(ctx, prompt, 3)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get(HeaderReplica) != first || resp.Header.Get(HeaderPredicted) != "192" || resp.Header.Get(HeaderRequestID) == "" {
		t.Fatalf("second request: replica %q (first %q), predicted %q, id %q", resp.Header.Get(HeaderReplica), first, resp.Header.Get(HeaderPredicted), resp.Header.Get(HeaderRequestID))
	}

	// Chat, streaming.
	resp, err = g.post(ctx, "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": prompt}}, "max_tokens": 4, "stream": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sse, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Role, content, usage-less end: the engine may put several tokens in
	// one event when its client reads slowly, so count words, not events.
	content := ""
	for _, line := range strings.Split(string(sse), "\n") {
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if d, ok := strings.CutPrefix(line, "data: {"); ok && json.Unmarshal([]byte("{"+d), &ev) == nil && len(ev.Choices) > 0 {
			content += ev.Choices[0].Delta.Content
		}
	}
	if resp.StatusCode != 200 || len(strings.Fields(content)) != 4 || !strings.HasSuffix(string(sse), "data: [DONE]\n\n") || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
		t.Fatalf("chat stream: %d %v\n%s", resp.StatusCode, resp.Header, sse)
	}

	// Local answers and errors in OpenAI's shape.
	for _, tc := range []struct {
		method, path string
		status       int
		want         string
	}{
		{"GET", "/v1/models", 200, `"id":"sim"`},
		{"GET", "/health", 200, ""},
		{"GET", "/v1/completions", 405, `"code":"method_not_allowed"`},
		{"POST", "/v2/whatever", 404, `"code":"not_found"`},
		{"POST", "/v1/completions", 404, "does not exist"},
	} {
		body := strings.NewReader(`{"model": "nope", "prompt": "x"}`)
		req, _ := http.NewRequest(tc.method, g.base+tc.path, body)
		resp, err := g.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, resp.StatusCode, b)
		}
	}
	if in, p := g.inFlight(); in != 0 || p != 0 {
		t.Fatalf("slots held after the requests: %d in flight, %d pending", in, p)
	}
}

// load sends streaming completions from workers until stop is closed and
// counts outcomes; sentAfter marks requests sent after a point.
type load struct {
	ok, failed atomic.Int64
	errs       sync.Map
	wg         sync.WaitGroup
}

func (l *load) run(g *testGateway, workers int, stop chan struct{}) {
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, _, err := g.complete(context.Background(), words((w*997+i*31)%20000, 40+i%60), 8)
				if err != nil {
					l.failed.Add(1)
					l.errs.Store(err.Error(), true)
				} else {
					l.ok.Add(1)
				}
			}
		}()
	}
}

// A replica that dies under load: no request sent afterwards fails (the
// ones it held may), it is out of rotation at once, and back once it is
// healthy again.
func TestDeadReplica(t *testing.T) {
	ups := []*upstream{
		newUpstream(t, server.Config{Engine: testEngineConfig()}),
		newUpstream(t, server.Config{Engine: testEngineConfig()}),
		newUpstream(t, server.Config{Engine: testEngineConfig()}),
	}
	o := testConfig(t, ups...)
	o.Models[0].Policy = "round_robin"
	g := startGateway(t, o)
	stop := make(chan struct{})
	var before load
	before.run(g, 8, stop)
	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	ups[1].kill()
	// Requests sent from now on must all succeed.
	var after load
	after.run(g, 8, stop)
	var ejectedAt time.Time
	waitUntil(t, "the dead replica's ejection", 5*time.Second, func() bool {
		for _, v := range g.replicaViews() {
			if v.Replica == "b" && !v.Healthy {
				ejectedAt = time.Now()
				return true
			}
		}
		return false
	})
	time.Sleep(300 * time.Millisecond)
	ups[1].restart()
	waitUntil(t, "the replica's return", 5*time.Second, func() bool {
		for _, v := range g.replicaViews() {
			if v.Replica == "b" && v.Healthy {
				return true
			}
		}
		return false
	})
	time.Sleep(300 * time.Millisecond)
	close(stop)
	before.wg.Wait()
	after.wg.Wait()
	if after.failed.Load() != 0 {
		var errs []string
		after.errs.Range(func(k, _ any) bool { errs = append(errs, k.(string)); return true })
		t.Fatalf("%d of %d requests sent after the kill failed: %v", after.failed.Load(), after.failed.Load()+after.ok.Load(), errs)
	}
	t.Logf("ejected %v after the kill; before: %d ok, %d failed (in flight on the dead replica); after: %d ok",
		ejectedAt.Sub(killed).Round(time.Millisecond), before.ok.Load(), before.failed.Load(), after.ok.Load())
	waitUntil(t, "slots to drain", 5*time.Second, func() bool { in, p := g.inFlight(); return in == 0 && p == 0 })
}

// Replicas that answer 503 are retried around; when every replica fails
// every request, the gateway passes the error through and never ejects more
// than the allowed share.
func TestFailingReplicas(t *testing.T) {
	bad := server.Config{Engine: testEngineConfig(), Faults: server.Faults{ErrorRate: 1, ErrorStatus: 503}}
	good := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startGateway(t, testConfig(t, newUpstream(t, bad), good, newUpstream(t, bad)))
	for i := range 50 {
		if _, _, err := g.complete(context.Background(), words(i*50, 30), 4); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}

	all := startGateway(t, testConfig(t, newUpstream(t, bad), newUpstream(t, bad), newUpstream(t, bad), newUpstream(t, bad)))
	codes := map[int]int{}
	for i := range 60 {
		resp, _, _ := all.complete(context.Background(), words(i*50, 30), 4)
		if resp != nil {
			codes[resp.StatusCode]++
		}
		healthy := 0
		for _, v := range all.replicaViews() {
			if v.Healthy {
				healthy++
			}
		}
		if healthy < 2 {
			t.Fatalf("after request %d only %d of 4 replicas are in rotation (max ejected share 0.5)", i, healthy)
		}
	}
	if codes[503] != 60 {
		t.Fatalf("status codes %v, want 60 x 503 passed through", codes)
	}
}

// Caps are never overshot: with max_concurrency 3 and max_pending 2 the
// engine never sees more than 3 requests at once; the surplus waits in the
// queue (and says so in x-inferrail-queued-ms) until a slot frees, or, with
// queueing off, is turned away at once with 429 and Retry-After.
func TestCapsNeverOvershoot(t *testing.T) {
	cfg := testEngineConfig()
	cfg.Latency.StepFixedMs = 20
	for _, queue := range []bool{true, false} {
		t.Run(fmt.Sprintf("queue=%v", queue), func(t *testing.T) {
			u := newUpstream(t, server.Config{Engine: cfg})
			o := testConfig(t, u)
			o.Models[0].MaxConcurrency, o.Models[0].MaxPending = 3, 2
			if !queue {
				o.Models[0].Queue.MaxRequests = 0
			}
			g := startGateway(t, o)
			var maxSeen atomic.Int64
			stop := make(chan struct{})
			watched := make(chan struct{})
			go func() {
				defer close(watched)
				for {
					select {
					case <-stop:
						return
					default:
					}
					in, p := g.inFlight()
					if int64(in) > maxSeen.Load() {
						maxSeen.Store(int64(in))
					}
					if p > 2 {
						t.Errorf("%d pending", p)
					}
					time.Sleep(100 * time.Microsecond)
				}
			}()
			var wg sync.WaitGroup
			var ok, waited, turned atomic.Int64
			for i := range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, _, err := g.complete(context.Background(), words(i, 20), 10)
					switch {
					case err == nil:
						ok.Add(1)
						if ms, _ := strconv.ParseFloat(resp.Header.Get(HeaderQueued), 64); ms > 0 {
							waited.Add(1)
						}
					case resp != nil && resp.StatusCode == 429 && resp.Header.Get("Retry-After") != "":
						turned.Add(1)
					default:
						t.Errorf("request %d: %v", i, err)
					}
				}()
			}
			wg.Wait()
			close(stop)
			<-watched
			if maxSeen.Load() > 3 || ok.Load()+turned.Load() != 40 {
				t.Fatalf("max in flight %d, %d served, %d turned away", maxSeen.Load(), ok.Load(), turned.Load())
			}
			if queue && (ok.Load() != 40 || waited.Load() < 30) {
				t.Fatalf("with a queue: %d of 40 served, %d waited, want all served and most waiting", ok.Load(), waited.Load())
			}
			if !queue && (ok.Load() < 2 || turned.Load() == 0) {
				t.Fatalf("without a queue: %d served, %d turned away", ok.Load(), turned.Load())
			}
		})
	}
}

// 1,000 clients that go away at random points leave no slot held in the
// gateway and no request in the engines.
func TestRandomDisconnects(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	ups := []*upstream{newUpstream(t, server.Config{Engine: testEngineConfig()}), newUpstream(t, server.Config{Engine: testEngineConfig()})}
	g := startGateway(t, testConfig(t, ups...))
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(time.Duration(rand.IntN(200))*time.Millisecond, cancel)
			defer cancel()
			g.complete(ctx, words(i*7, 30+i%100), 20+i%40)
		}()
	}
	wg.Wait()
	waitUntil(t, "every slot to be released", 10*time.Second, func() bool {
		in, p := g.inFlight()
		return in == 0 && p == 0 && g.queued() == 0 && g.reserved() == 0
	})
	for i, u := range ups {
		u.mu.Lock()
		srv := u.srv
		u.mu.Unlock()
		waitUntil(t, "engine "+strconv.Itoa(i)+" to be empty", 5*time.Second, func() bool {
			m := engineMetrics(t, srv)
			return m["vllm:num_requests_running"]+m["vllm:num_requests_waiting"] == 0
		})
	}
}

// engineMetrics reads a mock engine's gauges from its /metrics handler.
func engineMetrics(t testing.TB, s *server.Server) map[string]float64 {
	rec := &recorder{h: http.Header{}}
	req, _ := http.NewRequest("GET", "/metrics", nil)
	s.Handler().ServeHTTP(rec, req)
	out := map[string]float64{}
	for _, line := range strings.Split(rec.b.String(), "\n") {
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		if i := strings.LastIndexByte(rest, ' '); i >= 0 {
			v, _ := strconv.ParseFloat(rest[i+1:], 64)
			out[name] += v
		}
	}
	return out
}

type recorder struct {
	h http.Header
	b strings.Builder
}

func (r *recorder) Header() http.Header         { return r.h }
func (r *recorder) Write(p []byte) (int, error) { return r.b.Write(p) }
func (r *recorder) WriteHeader(int)             {}

// 3,000 hostile requests (malformed JSON, wrong types, huge bodies, bodies
// that never end, headers sent a byte at a time) do not hurt the gateway:
// every one is answered or timed out, and a normal request still works.
func TestHostileRequests(t *testing.T) {
	u := newUpstream(t, server.Config{Engine: testEngineConfig()})
	o := testConfig(t, u)
	o.MaxBodyBytes = config.MiB
	s, err := New(o, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 200 * time.Millisecond, ReadTimeout: time.Second}
	go hs.Serve(ln)
	defer hs.Close()
	defer s.Close()
	base := "http://" + ln.Addr().String()
	client := &http.Client{Timeout: 5 * time.Second}
	bodies := []string{
		`{`, `[]`, `"prompt"`, `{"prompt": 5}`, `{"model": 7}`, `{"model": "x", "prompt": "y"}`, `null`, ``,
		`{"prompt": "` + strings.Repeat("a", 2<<20) + `"}`, "\x00\xff\xfe", `{"messages": "no"}`, `{"prompt": "ok", "max_tokens": -1}`,
	}
	var wg sync.WaitGroup
	var answered, serverErrors atomic.Int64
	sem := make(chan struct{}, 64)
	for i := range 3000 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if i%100 == 99 { // slowloris: headers a byte at a time, never finished
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					return
				}
				defer c.Close()
				for _, ch := range []byte("POST /v1/completions HTTP/1.1\r\nHost: x\r\n") {
					if _, err := c.Write([]byte{ch}); err != nil {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
				return
			}
			path := "/v1/completions"
			if i%2 == 0 {
				path = "/v1/chat/completions"
			}
			resp, err := client.Post(base+path, "application/json", strings.NewReader(bodies[i%len(bodies)]))
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answered.Add(1)
			if resp.StatusCode >= 500 && resp.StatusCode != 502 && resp.StatusCode != 503 {
				serverErrors.Add(1)
			}
		}()
	}
	wg.Wait()
	if serverErrors.Load() != 0 || answered.Load() < 2900 {
		t.Fatalf("%d answered, %d server errors", answered.Load(), serverErrors.Load())
	}
	resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(`{"prompt": %q, "max_tokens": 3}`, words(1, 10))))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a normal request after the storm: %v %v", resp, err)
	}
	resp.Body.Close()
}

// A replica that accepts requests and never answers (its /health still
// fine) holds at most max_pending of them while they wait: then it is full
// and every other request goes elsewhere.
func TestHangingReplica(t *testing.T) {
	hang := newUpstream(t, server.Config{Engine: testEngineConfig(), Faults: server.Faults{HangRate: 1}})
	o := testConfig(t, hang, newUpstream(t, server.Config{Engine: testEngineConfig()}), newUpstream(t, server.Config{Engine: testEngineConfig()}))
	o.Models[0].MaxPending = 4
	g := startGateway(t, o)
	var hung atomic.Int64
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if _, _, err := g.complete(ctx, words(i*40, 30), 4); err != nil {
				hung.Add(1)
			}
		}()
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	if hung.Load() > 4 {
		t.Fatalf("%d of 60 requests hung on the silent replica (max_pending 4)", hung.Load())
	}
	t.Logf("%d of 60 requests went to the hanging replica", hung.Load())
}

// cachedTokensOf reads a whole answer's usage.prompt_tokens_details
// .cached_tokens (0 when absent) and closes its body.
func cachedTokensOf(resp *http.Response) int {
	var body struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	return body.Usage.PromptTokensDetails.CachedTokens
}

// With the approximate index, the proxy learns the blocks of each answer it
// streams: a next turn that quotes the answer is predicted cached as far as
// the engine really has it.
func TestAnswersAreIndexed(t *testing.T) {
	g := startGateway(t, testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true})))
	prompt := words(400, 100)
	_, sse, err := g.complete(context.Background(), prompt, 40)
	if err != nil {
		t.Fatal(err)
	}
	answer := ""
	for _, line := range strings.Split(sse, "\n") {
		var ev struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if d, ok := strings.CutPrefix(line, "data: {"); ok && json.Unmarshal([]byte("{"+d), &ev) == nil && len(ev.Choices) > 0 {
			answer += ev.Choices[0].Text
		}
	}
	if got := len(strings.Fields(answer)); got != 40 {
		t.Fatalf("answer has %d words", got)
	}
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": prompt + answer + words(900, 20), "max_tokens": 2, "ignore_eos": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cached := cachedTokensOf(resp)
	// 100 prompt tokens and 39 answer tokens are held: 8 full blocks.
	if resp.Header.Get(HeaderPredicted) != "128" || cached != 128 {
		t.Fatalf("predicted %s cached tokens, the engine found %d; want 128 and 128", resp.Header.Get(HeaderPredicted), cached)
	}
}
