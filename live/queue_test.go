package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
)

// slowEngine is an engine whose every step takes 20 ms: a request of 30
// tokens holds it for over half a second.
func slowEngine() engine.Config {
	c := testEngineConfig()
	c.Latency.StepFixedMs = 20
	return c
}

// oneSlot is a proxy in front of one slow engine that runs one request at a
// time, so a test controls who waits.
func oneSlot(t *testing.T, mutate func(*config.Config)) (*testGateway, *upstream) {
	u := newUpstream(t, server.Config{Engine: slowEngine()})
	c := testConfig(t, u)
	c.Models[0].MaxConcurrency = 1
	if mutate != nil {
		mutate(c)
	}
	return startGateway(t, c), u
}

// block sends a long request and returns once the gateway has dispatched
// it; done is closed when it ends.
func block(t *testing.T, g *testGateway) (done chan struct{}) {
	t.Helper()
	done = make(chan struct{})
	go func() {
		defer close(done)
		if _, _, err := g.complete(context.Background(), words(5000, 20), 30); err != nil {
			t.Errorf("blocker: %v", err)
		}
	}()
	waitUntil(t, "the blocker to be in flight", 5*time.Second, func() bool { in, _ := g.inFlight(); return in == 1 })
	return done
}

// wireError is OpenAI's error body.
type wireError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

func readError(t *testing.T, resp *http.Response) wireError {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e wireError
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("status %d: not an OpenAI error: %s (%v)", resp.StatusCode, b, err)
	}
	return e
}

func queuedMs(t *testing.T, resp *http.Response) float64 {
	t.Helper()
	v := resp.Header.Get(HeaderQueued)
	ms, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s: %q, want milliseconds", HeaderQueued, v)
	}
	return ms
}

// admin answers one GET on the admin handler.
func admin(t *testing.T, g *testGateway, path string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	g.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	if rec.Code != 200 {
		t.Fatalf("GET %s: %d", path, rec.Code)
	}
	return rec.Body.String()
}

// Far more requests at once than three small engines hold: with kv
// admission every one is served, those that waited say so, and no engine
// ever runs more than fits in its KV cache (no preemption). Without
// admission the same burst overflows the engines' caches.
func TestOverloadIsQueuedNotFailed(t *testing.T) {
	const (
		capacity = 64 // KV blocks per engine
		prompt   = 48 // tokens
		output   = 48
		n        = 200
	)
	// Each request weighs (48+48)/16 = 6 blocks: 10 fit in 64.
	const fits = capacity / ((prompt + output) / 16)
	for _, admission := range []string{"kv", "none"} {
		t.Run(admission, func(t *testing.T) {
			ec := testEngineConfig()
			ec.NumGPUBlocks, ec.MaxModelLen = capacity, 1024
			// 5 ms steps: a request holds its engine for a quarter of a
			// second, far longer than the burst takes to arrive, so all
			// but the first wave find the engines full.
			ec.Latency.StepFixedMs = 5
			var ups []*upstream
			for range 3 {
				ups = append(ups, newUpstream(t, server.Config{Engine: ec}))
			}
			c := testConfig(t, ups...)
			c.Models[0].Admission = admission
			c.Models[0].KVCapacityBlocks = capacity
			g := startGateway(t, c)

			// Watch the engines' own gauges while the burst runs.
			var peakRunning atomic.Int64
			stop := make(chan struct{})
			watched := make(chan struct{})
			go func() {
				defer close(watched)
				for {
					for _, u := range ups {
						u.mu.Lock()
						srv := u.srv
						u.mu.Unlock()
						if r := int64(engineMetrics(t, srv)["vllm:num_requests_running"]); r > peakRunning.Load() {
							peakRunning.Store(r)
						}
					}
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
				}
			}()
			var wg sync.WaitGroup
			var failed, waited atomic.Int64
			var errs sync.Map
			// When each request was sent, and when the first answer ended:
			// a request sent before that found every slot taken (but for
			// the first wave), whatever the machine's speed.
			sent := make([]time.Time, n)
			var firstDone atomic.Int64
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sent[i] = time.Now()
					resp, _, err := g.complete(context.Background(), words(100+i*prompt, prompt), output)
					firstDone.CompareAndSwap(0, time.Now().UnixNano())
					if err != nil {
						failed.Add(1)
						errs.Store(err.Error(), true)
						return
					}
					if queuedMs(t, resp) > 0 {
						waited.Add(1)
					}
				}()
			}
			wg.Wait()
			close(stop)
			<-watched
			if failed.Load() != 0 {
				var list []string
				errs.Range(func(k, _ any) bool { list = append(list, k.(string)); return true })
				t.Fatalf("%d of %d failed: %v", failed.Load(), n, list)
			}
			var preemptions float64
			for _, u := range ups {
				u.mu.Lock()
				preemptions += engineMetrics(t, u.srv)["vllm:num_preemptions_total"]
				u.mu.Unlock()
			}
			peakInFlight, peakReserved := 0, 0
			for _, m := range g.models {
				for _, r := range m.snapshot().reps {
					peakInFlight = max(peakInFlight, r.st.PeakInFlight)
					peakReserved = max(peakReserved, r.st.PeakReserved)
				}
			}
			t.Logf("admission %s: %d waited in the queue; peak running %d per engine (gateway's count %d), peak reserved %d of %d blocks, %v preemptions",
				admission, waited.Load(), peakRunning.Load(), peakInFlight, peakReserved, capacity, preemptions)
			if admission == "none" {
				if preemptions == 0 {
					t.Errorf("without admission the burst fit the engines (peak running %d): the test proves nothing", peakRunning.Load())
				}
				return
			}
			if peakRunning.Load() > fits || peakInFlight > fits || peakReserved > capacity || preemptions != 0 {
				t.Fatalf("overshoot: peak running %d, in flight %d (fits %d), reserved %d of %d, %v preemptions", peakRunning.Load(), peakInFlight, fits, peakReserved, capacity, preemptions)
			}
			early := 0
			for _, at := range sent {
				if at.UnixNano() < firstDone.Load() {
					early++
				}
			}
			// A few may slip in as the first answers' slots free (the
			// gateway frees a slot as the engine ends, before the client
			// has read the end).
			const slack = 5
			if early < n/2 {
				t.Fatalf("only %d of %d requests were sent before the first answer ended: the burst does not overload the engines", early, n)
			}
			if want := int64(early - 3*fits - slack); waited.Load() < want {
				t.Fatalf("%d requests say they waited, want at least %d (%d sent before the first answer ended, %d fit at once)", waited.Load(), want, early, 3*fits)
			}
			waitUntil(t, "every reservation released", 5*time.Second, func() bool { return g.reserved() == 0 && g.queued() == 0 })

			// The admin view and the metrics show the reservations.
			var views []map[string]any
			if err := json.Unmarshal([]byte(admin(t, g, "/replicas")), &views); err != nil || len(views) != 3 {
				t.Fatalf("/replicas: %v %v", views, err)
			}
			for _, k := range []string{"reserved_blocks", "capacity_blocks", "peak_reserved_blocks"} {
				if _, ok := views[0][k]; !ok {
					t.Errorf("/replicas has no %s: %v", k, views[0])
				}
			}
			if views[0]["capacity_blocks"] != float64(capacity) {
				t.Errorf("capacity_blocks %v, want %d", views[0]["capacity_blocks"], capacity)
			}
			met := admin(t, g, "/metrics")
			for _, name := range []string{"inferrail_queue_depth{", "inferrail_queue_wait_seconds_bucket{", "inferrail_reserved_blocks{"} {
				if !strings.Contains(met, name) {
					t.Errorf("/metrics has no %s", name)
				}
			}
		})
	}
}

// A request that waits past queue.timeout gets 429 queue_timeout with
// Retry-After, in OpenAI's error shape, and says how long it waited.
func TestQueueTimeout(t *testing.T) {
	g, _ := oneSlot(t, func(c *config.Config) { c.Models[0].Queue.Timeout = 100 * time.Millisecond })
	done := block(t, g)
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": words(1, 10), "max_tokens": 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	ms := queuedMs(t, resp)
	e := readError(t, resp)
	if resp.StatusCode != 429 || ra < 1 || e.Error.Code != "queue_timeout" || ms < 100 {
		t.Fatalf("status %d, Retry-After %q, queued %v ms, error %+v; want 429 queue_timeout after 100 ms", resp.StatusCode, resp.Header.Get("Retry-After"), ms, e)
	}
	if !strings.Contains(admin(t, g, "/metrics"), `inferrail_rejected_total{model="inferrail-sim",reason="queue_timeout"} 1`) {
		t.Error("inferrail_rejected_total does not count the timeout")
	}
	<-done
}

// With the queue full, one more request gets 429 queue_full at once; the
// one waiting is served when the slot frees.
func TestQueueFull(t *testing.T) {
	g, _ := oneSlot(t, func(c *config.Config) { c.Models[0].Queue.MaxRequests = 1 })
	done := block(t, g)
	waiting := make(chan *http.Response, 1)
	go func() {
		resp, _, err := g.complete(context.Background(), words(10, 10), 2)
		if err != nil {
			t.Errorf("the queued request: %v", err)
		}
		waiting <- resp
	}()
	waitUntil(t, "one request queued", 5*time.Second, func() bool { return g.queued() == 1 })
	began := time.Now()
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": words(20, 10), "max_tokens": 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := readError(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || e.Error.Code != "queue_full" || resp.Header.Get(HeaderQueued) == "" {
		t.Fatalf("status %d, headers %v, error %+v; want 429 queue_full", resp.StatusCode, resp.Header, e)
	}
	if took := time.Since(began); took > 200*time.Millisecond {
		t.Errorf("queue_full took %v, want at once", took)
	}
	<-done
	if r := <-waiting; r != nil && queuedMs(t, r) < 50 {
		t.Errorf("the queued request says it waited %v ms", queuedMs(t, r))
	}
}

// A priority header that is not an integer from 0 to 1000 is a 400 that
// names it; a good one is served.
func TestPriorityHeaderChecked(t *testing.T) {
	g := startGateway(t, testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()})))
	for _, v := range []string{"high", "-1", "1001", "1.5", "1 2"} {
		resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": words(1, 10), "max_tokens": 2}, map[string]string{HeaderPriority: v})
		if err != nil {
			t.Fatal(err)
		}
		e := readError(t, resp)
		if resp.StatusCode != 400 || !strings.Contains(strings.ToLower(e.Error.Message), "x-inferrail-priority") || e.Error.Type != "invalid_request_error" {
			t.Errorf("priority %q: %d %+v, want 400 naming the header", v, resp.StatusCode, e)
		}
	}
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": words(1, 10), "max_tokens": 2}, map[string]string{HeaderPriority: "1000", HeaderTenant: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(HeaderQueued) != "0" {
		t.Fatalf("priority 1000 (capped at max_priority): %d, queued %q", resp.StatusCode, resp.Header.Get(HeaderQueued))
	}
}

// Clients that go away while queued leave nothing queued and no slot or
// reservation held, and never reach the engine.
func TestDisconnectWhileQueued(t *testing.T) {
	g, u := oneSlot(t, nil)
	done := block(t, g)
	var wg sync.WaitGroup
	var cancels []context.CancelFunc
	for i := range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := g.complete(ctx, words(100+i*20, 10), 2); err == nil {
				t.Errorf("request %d was served after its client left", i)
			}
		}()
	}
	waitUntil(t, "five requests queued", 5*time.Second, func() bool { return g.queued() == 5 })
	for _, c := range cancels {
		c()
	}
	wg.Wait()
	waitUntil(t, "the queue to empty", 5*time.Second, func() bool { return g.queued() == 0 })
	<-done
	waitUntil(t, "every slot released", 5*time.Second, func() bool { in, p := g.inFlight(); return in == 0 && p == 0 && g.reserved() == 0 })
	u.mu.Lock()
	served := engineMetrics(t, u.srv)["vllm:request_success_total"]
	u.mu.Unlock()
	if served != 1 {
		t.Fatalf("the engine served %v requests, want the blocker only", served)
	}
	// The slot is free: a new request is served at once.
	resp, _, err := g.complete(context.Background(), words(900, 10), 2)
	if err != nil || resp.Header.Get(HeaderQueued) != "0" {
		t.Fatalf("after the disconnects: %v, queued %q", err, resp.Header.Get(HeaderQueued))
	}
}

// Of two waiting requests, the higher priority is dispatched first, though
// it arrived later.
func TestPriorityOrder(t *testing.T) {
	g, _ := oneSlot(t, nil)
	done := block(t, g)
	var mu sync.Mutex
	var order []string
	send := func(name, prio string, wg *sync.WaitGroup) {
		defer wg.Done()
		_, _, err := g.post2(name, prio)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		mu.Lock()
		order = append(order, name)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go send("low", "1", &wg)
	waitUntil(t, "low queued", 5*time.Second, func() bool { return g.queued() == 1 })
	go send("none", "", &wg)
	waitUntil(t, "none queued", 5*time.Second, func() bool { return g.queued() == 2 })
	go send("high", "5", &wg)
	waitUntil(t, "high queued", 5*time.Second, func() bool { return g.queued() == 3 })
	<-done
	wg.Wait()
	if got := strings.Join(order, " "); got != "high low none" {
		t.Fatalf("served in order %s, want high low none", got)
	}
}

// post2 sends a short completion with a priority header ("" for none).
func (g *testGateway) post2(name, prio string) (*http.Response, string, error) {
	hdr := map[string]string{HeaderTenant: name}
	if prio != "" {
		hdr[HeaderPriority] = prio
	}
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": words(len(name)*100, 10), "max_tokens": 2}, hdr)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return resp, string(b), fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return resp, string(b), nil
}

// With no replica healthy, a request gets 503 with Retry-After at once.
func TestNoHealthyReplica(t *testing.T) {
	u := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := testConfig(t, u)
	c.Health.EjectAfter, c.Health.MaxEjectedShare = 1, 1
	c.Health.EjectTime, c.Health.MaxEjectTime = 10*time.Second, 10*time.Second
	g := startGateway(t, c)
	u.kill()
	waitUntil(t, "the replica's ejection", 5*time.Second, func() bool { return !g.Server.models[0].healthy() })
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": words(1, 10), "max_tokens": 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ra := resp.Header.Get("Retry-After")
	e := readError(t, resp)
	if resp.StatusCode != 503 || ra == "" || e.Error.Code != "no_replica_available" {
		t.Fatalf("status %d, Retry-After %q, error %+v; want 503 no_replica_available", resp.StatusCode, ra, e)
	}
	if g.queued() != 0 {
		t.Fatal("the request was queued")
	}
}

// A tokenized prompt plus max_tokens beyond max_model_len is a 400 at once.
func TestTooLong(t *testing.T) {
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.Models[0].MaxModelLen = 100
	g := startGateway(t, c)
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": words(1, 90), "max_tokens": 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := readError(t, resp)
	if resp.StatusCode != 400 || e.Error.Code != "context_length_exceeded" {
		t.Fatalf("status %d, error %+v; want 400 context_length_exceeded", resp.StatusCode, e)
	}
	if _, _, err := g.complete(context.Background(), words(1, 90), 10); err != nil {
		t.Fatalf("a request that fits: %v", err)
	}
}

// New says once, per model, which replicas kv admission cannot weigh until
// their first scrape; none when their capacity is configured or admission
// does not weigh KV.
func TestStartupNote(t *testing.T) {
	u := newUpstream(t, server.Config{Engine: testEngineConfig()})
	for _, tc := range []struct {
		name   string
		mutate func(*config.Config)
		want   string
	}{
		{"unknown", func(*config.Config) {}, "no kv_capacity_blocks for replicas a, b: kv admission"},
		{"one configured", func(c *config.Config) { c.Models[0].Replicas[0].KVCapacityBlocks = 10 }, "no kv_capacity_blocks for replica b: kv admission"},
		{"model configured", func(c *config.Config) { c.Models[0].KVCapacityBlocks = 10 }, ""},
		{"no admission", func(c *config.Config) { c.Models[0].Admission = "none" }, ""},
		{"dns", func(c *config.Config) {
			c.Models[0].Replicas = nil
			c.Models[0].DNS = []config.DNSGroup{{Name: "g", Host: "pool.test", Port: 80, Scheme: "http"}}
		}, "no kv_capacity_blocks for the replicas its DNS groups find"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t, u, u)
			c.Models[0].Replicas[1].URL += "/other" // two replicas of one engine
			tc.mutate(c)
			var notes bytes.Buffer
			s, err := New(c, Deps{Notes: &notes})
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			got := notes.String()
			if tc.want == "" && got != "" || tc.want != "" && (!strings.Contains(got, tc.want) || strings.Count(got, "\n") != 1) {
				t.Fatalf("notes %q, want one containing %q", got, tc.want)
			}
		})
	}
}

// New refuses an invalid configuration with config.Validate's message.
func TestNewValidates(t *testing.T) {
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.Models[0].Admission = "foo"
	c.Models[0].Queue.Timeout = 0
	_, err := New(c, Deps{})
	if err == nil || !strings.Contains(err.Error(), `models[0].admission: unknown admission mode "foo"`) || !strings.Contains(err.Error(), "models[0].queue.timeout: must be positive") {
		t.Fatalf("New: %v", err)
	}
}
