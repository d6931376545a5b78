package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
)

// reports collects OnReport calls.
type reports struct {
	mu  sync.Mutex
	got map[string][]Report
}

func (r *reports) add(name string, rep Report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got == nil {
		r.got = make(map[string][]Report)
	}
	r.got[name] = append(r.got[name], rep)
}

func (r *reports) of(name string) []Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Report(nil), r.got[name]...)
}

func newTestScraper(t *testing.T, tr *memTransport, cfg ScraperConfig) (*Scraper, *reports) {
	t.Helper()
	rs := &reports{}
	cfg.Client = tr.client()
	cfg.OnReport = rs.add
	s, err := NewScraper(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, rs
}

func TestScraperReadsEveryTargetEveryInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newMemTransport()
		tr.handle("vllm:8000", page(fixture(t, "vllm_v1.txt"), textType))
		tr.handle("sglang:30000", page(fixture(t, "sglang.txt"), textType))
		s, rs := newTestScraper(t, tr, ScraperConfig{})
		if err := s.SetTargets(map[string]string{"a": "http://vllm:8000", "b": "http://sglang:30000/"}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		stop := runInBackground(s.Run)
		time.Sleep(time.Second + time.Millisecond)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		for name, engine := range map[string]string{"a": EngineVLLM, "b": EngineSGLang} {
			r, ok := s.Report(name)
			if !ok || r.Err != nil || r.Load.Engine != engine {
				t.Fatalf("%s: report %+v, %v", name, r, ok)
			}
			// At 0, 100ms, ..., 1s: 11 scrapes, each read at its tick
			// (in-memory transport: no time passes).
			got := rs.of(name)
			if len(got) != 11 || r.Scrapes != 11 {
				t.Fatalf("%s: %d reports, %d scrapes; want 11", name, len(got), r.Scrapes)
			}
			for i, rep := range got {
				if want := start.Add(time.Duration(i) * DefaultScrapeInterval); !rep.At.Equal(want) {
					t.Errorf("%s: scrape %d read at %v, want %v", name, i, rep.At.Sub(start), want.Sub(start))
				}
			}
			if st := r.State(DefaultScrapeInterval, time.Now()); st != StateFresh {
				t.Errorf("%s: state %v", name, st)
			}
		}
		if _, ok := s.Report("c"); ok {
			t.Error("report for an unknown target")
		}
	})
}

func TestScraperSlowTargetDelaysNoOther(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newMemTransport()
		tr.handle("fast", page(fixture(t, "vllm_v1.txt"), textType))
		tr.handle("slow", http.HandlerFunc(hang))
		// The slow target stalls after its headers, mid-body.
		tr.handle("stall", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", textType)
			w.Write([]byte("vllm:num_requests_running 1\n"))
			<-r.Context().Done()
		}))
		s, rs := newTestScraper(t, tr, ScraperConfig{})
		s.SetTargets(map[string]string{"fast": "http://fast", "slow": "http://slow", "stall": "http://stall"})
		start := time.Now()
		stop := runInBackground(s.Run)
		time.Sleep(time.Second + time.Millisecond)
		stop()
		fast := rs.of("fast")
		if len(fast) != 11 {
			t.Fatalf("fast target: %d reports in 1s, want 11", len(fast))
		}
		for i, rep := range fast {
			if want := start.Add(time.Duration(i) * DefaultScrapeInterval); !rep.At.Equal(want) || rep.Duration != 0 {
				t.Errorf("fast scrape %d read at %v taking %v: delayed", i, rep.At.Sub(start), rep.Duration)
			}
		}
		for _, name := range []string{"slow", "stall"} {
			got := rs.of(name)
			if len(got) != 10 { // each times out at 80ms, the last at 1.08s is after the end
				t.Errorf("%s: %d reports, want 10", name, len(got))
			}
			r, _ := s.Report(name)
			if !errors.Is(r.Err, context.DeadlineExceeded) || r.Duration != DefaultScrapeTimeout || !r.At.IsZero() {
				t.Errorf("%s: report %+v; want a deadline error after %v and no load", name, r, DefaultScrapeTimeout)
			}
			if r.Consecutive != int64(len(got)) || r.State(time.Second, time.Now()) != StateUnknown {
				t.Errorf("%s: %d consecutive failures, state %v", name, r.Consecutive, r.State(time.Second, time.Now()))
			}
		}
	})
}

func TestScraperOneScrapeInFlightPerTarget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var inflight, most, calls atomic.Int64
		tr := newMemTransport()
		var mu sync.Mutex
		var at []time.Duration
		start := time.Now()
		tr.handle("slow", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			at = append(at, time.Since(start))
			mu.Unlock()
			calls.Add(1)
			n := inflight.Add(1)
			defer inflight.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-r.Context().Done()
		}))
		// Timeout > Interval: the scrape at 0 lasts to 250ms, so the ticks
		// at 100 and 200 are skipped; scrapes start at 0, 300, 600, 900.
		s, _ := newTestScraper(t, tr, ScraperConfig{Interval: 100 * time.Millisecond, Timeout: 250 * time.Millisecond})
		s.SetTargets(map[string]string{"slow": "http://slow"})
		stop := runInBackground(s.Run)
		time.Sleep(time.Second)
		stop()
		if most.Load() != 1 || calls.Load() != 4 {
			t.Errorf("%d scrapes (at %v), at most %d at once; want 4, 1", calls.Load(), at, most.Load())
		}
	})
}

func TestScraperSizeCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		body := fixture(t, "vllm_v1.txt")
		var sent atomic.Int64
		tr := newMemTransport()
		tr.handle("fits", page(body, textType))
		// An endless page: the scraper must stop reading, not wait for the end.
		tr.handle("endless", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", textType)
			line := []byte("vllm:time_to_first_token_seconds_bucket{le=\"0.1\"} 1\n")
			for r.Context().Err() == nil {
				n, err := w.Write(line)
				sent.Add(int64(n))
				if err != nil {
					return
				}
			}
		}))
		max := int64(len(body))
		s, _ := newTestScraper(t, tr, ScraperConfig{MaxBytes: max, Timeout: time.Hour, Interval: time.Hour})
		s.SetTargets(map[string]string{"fits": "http://fits", "endless": "http://endless"})
		stop := runInBackground(s.Run)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if r, _ := s.Report("fits"); r.Err != nil || r.Load.Running != 7 {
			t.Errorf("page of exactly MaxBytes: %+v", r)
		}
		r, _ := s.Report("endless")
		if !errors.Is(r.Err, ErrTooLarge) || r.State(time.Hour, time.Now()) != StateUnreadable {
			t.Errorf("endless page: %+v", r)
		}
		stop()
		if n := sent.Load(); n > max+64<<10 {
			t.Errorf("read %d bytes of an endless page with MaxBytes %d", n, max)
		}
	})
}

// engineHandler serves a vLLM page whose numbers and health a test sets.
type engineHandler struct {
	mu                sync.Mutex
	running, queries  int
	status            int // non-zero: answer this status
	garbage           bool
	requests          int
	lastAt, firstSeen time.Time
}

func (e *engineHandler) set(f func(e *engineHandler)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(e)
}

func (e *engineHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.requests++
	e.lastAt = time.Now()
	if e.firstSeen.IsZero() {
		e.firstSeen = e.lastAt
	}
	switch {
	case e.status != 0:
		w.WriteHeader(e.status)
	case e.garbage:
		w.Header().Set("Content-Type", textType)
		fmt.Fprintf(w, "vllm:num_requests_running{{{ not a metric page 42\n\x00\xff garbage\n")
	default:
		w.Header().Set("Content-Type", textType)
		fmt.Fprintf(w, "vllm:num_requests_running{engine=\"0\"} %d\nvllm:num_requests_waiting{engine=\"0\"} 0\nvllm:prefix_cache_queries_total{engine=\"0\"} %d\n", e.running, e.queries)
	}
}

func (e *engineHandler) stats() (n int, first, last time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.requests, e.firstSeen, e.lastAt
}

func TestScraperFreshStaleUnreadable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		eng := &engineHandler{running: 3, queries: 100}
		tr := newMemTransport()
		tr.handle("e", eng)
		s, rs := newTestScraper(t, tr, ScraperConfig{})
		s.SetTargets(map[string]string{"e": "http://e"})
		stop := runInBackground(s.Run)
		defer stop()
		const maxAge = 250 * time.Millisecond
		time.Sleep(50 * time.Millisecond)
		good, _ := s.Report("e")
		if l, ok := s.Fresh("e", maxAge, time.Now()); !ok || l.Running != 3 {
			t.Fatalf("fresh load %+v, %v", l, ok)
		}

		// The engine fails: the last good load stays, fresh until it ages.
		eng.set(func(e *engineHandler) { e.status = http.StatusServiceUnavailable })
		time.Sleep(100 * time.Millisecond)
		r, _ := s.Report("e")
		if r.Err == nil || !strings.Contains(r.Err.Error(), "503") || r.Load != good.Load || !r.At.Equal(good.At) {
			t.Fatalf("after a failure: %+v", r)
		}
		if st := r.State(maxAge, time.Now()); st != StateFresh {
			t.Errorf("150ms-old load after one failure: %v, want fresh", st)
		}
		time.Sleep(200 * time.Millisecond)
		r, _ = s.Report("e")
		if st := r.State(maxAge, time.Now()); st != StateStale {
			t.Errorf("350ms-old load: %v, want stale", st)
		}
		if _, ok := s.Fresh("e", maxAge, time.Now()); ok {
			t.Error("Fresh returned a stale load")
		}

		// Garbage: unreadable at once, whatever the age of the last load.
		eng.set(func(e *engineHandler) { e.status, e.garbage = 0, true })
		time.Sleep(100 * time.Millisecond)
		r, _ = s.Report("e")
		if st := r.State(time.Hour, time.Now()); st != StateUnreadable || !errors.Is(r.Err, ErrUnreadable) || r.Load.Running != 3 {
			t.Errorf("garbage page: state %v, report %+v", st, r)
		}

		// Recovered, with its counters reset: a restart.
		eng.set(func(e *engineHandler) { e.garbage, e.running, e.queries = false, 1, 5 })
		time.Sleep(100 * time.Millisecond)
		r, _ = s.Report("e")
		if r.Err != nil || r.Load.Running != 1 || !r.Restarted || r.Consecutive != 0 || r.State(maxAge, time.Now()) != StateFresh {
			t.Errorf("after recovery: %+v", r)
		}
		eng.set(func(e *engineHandler) { e.queries = 50 })
		time.Sleep(100 * time.Millisecond)
		if r, _ := s.Report("e"); r.Restarted {
			t.Error("restart reported twice")
		}
		restarts := 0
		for _, rep := range rs.of("e") {
			if rep.Restarted {
				restarts++
			}
		}
		if restarts != 1 {
			t.Errorf("%d restarts reported to OnReport, want 1", restarts)
		}
	})
}

func TestScraperTargetChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b, c := &engineHandler{running: 1}, &engineHandler{running: 2}, &engineHandler{running: 3}
		tr := newMemTransport()
		tr.handle("a", a)
		tr.handle("b", b)
		tr.handle("c", c)
		s, _ := newTestScraper(t, tr, ScraperConfig{})
		s.SetTargets(map[string]string{"x": "http://a"})
		stop := runInBackground(s.Run)
		defer stop()
		time.Sleep(250 * time.Millisecond)

		// Replace the set between ticks: "x" now points at c (a new URL, a
		// fresh report), "y" is new; both are scraped at once, not at the
		// next tick.
		changed := time.Now()
		if err := s.SetTargets(map[string]string{"x": "http://c", "y": "http://b"}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		for name, want := range map[string]int{"x": 3, "y": 2} {
			r, ok := s.Report(name)
			if !ok || r.Load.Running != want || !r.At.Equal(changed) || r.Scrapes != 1 {
				t.Errorf("%s right after SetTargets: %+v, %v", name, r, ok)
			}
		}
		nA, _, lastA := a.stats()
		time.Sleep(time.Second)
		if n, _, _ := a.stats(); n != nA || lastA.After(changed) {
			t.Errorf("removed target still scraped: %d requests, then %d", nA, n)
		}
		if n, first, _ := c.stats(); n != 11 || !first.Equal(changed) {
			t.Errorf("new target: %d scrapes from %v", n, first)
		}

		// Removing everything.
		s.SetTargets(nil)
		if _, ok := s.Report("x"); ok || len(s.Reports()) != 0 {
			t.Error("removed targets still reported")
		}
		nB, _, _ := b.stats()
		time.Sleep(time.Second)
		if n, _, _ := b.stats(); n != nB {
			t.Error("removed target still scraped")
		}
	})
}

func TestScraperConfig(t *testing.T) {
	for _, cfg := range []ScraperConfig{
		{Interval: -time.Second},
		{Timeout: -1},
		{MaxBytes: -1},
		{Path: "metrics"},
	} {
		if _, err := NewScraper(cfg); err == nil {
			t.Errorf("NewScraper(%+v) succeeded", cfg)
		}
	}
	s, err := NewScraper(ScraperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetTargets(map[string]string{"a": "http://a:8000"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []map[string]string{
		{"a": "http://a:8000", "b": "ftp://b"},
		{"a": "a:8000"},
		{"": "http://a:8000"},
		{"a": "http://"},
		{"a": "http://a/?x=1"},
	} {
		err := s.SetTargets(bad)
		if err == nil {
			t.Errorf("SetTargets(%v) succeeded", bad)
		}
		if _, ok := s.Report("a"); !ok || len(s.Reports()) != 1 {
			t.Errorf("SetTargets(%v) failed (%v) but changed the targets", bad, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Run(ctx); err == nil {
		t.Error("second Run succeeded")
	}
}

// TestScraperAgainstMockEngine scrapes and probes the project's mock vLLM
// server over TCP on 127.0.0.1, with real time (no timing asserted).
func TestScraperAgainstMockEngine(t *testing.T) {
	cfg := engine.DefaultConfig()
	srv, err := server.New(server.Config{Engine: cfg})
	if err != nil {
		t.Fatal(err)
	}
	garbage, err := server.New(server.Config{Engine: cfg, Faults: server.Faults{GarbageMetrics: true}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := map[string]string{}
	for name, s := range map[string]*server.Server{"good": srv, "garbage": garbage} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: s.Handler()}
		go hs.Serve(ln)
		defer hs.Close()
		runCtx, stopRun := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { s.Run(runCtx); close(done) }()
		defer func() { stopRun(); <-done }()
		base[name] = "http://" + ln.Addr().String()
	}

	got := make(chan Report, 16)
	sc, err := NewScraper(ScraperConfig{Timeout: 5 * time.Second, OnReport: func(name string, r Report) {
		if name == "good" && r.Err == nil || name == "garbage" && r.Err != nil {
			select {
			case got <- r:
			default:
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	health := make(chan bool, 16)
	pr, err := NewProber(ProberConfig{Interval: 50 * time.Millisecond, OnResult: func(name string, ok bool, err error) {
		select {
		case health <- ok:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	sc.SetTargets(base)
	pr.SetTargets(map[string]string{"good": base["good"]})
	stopScraper, stopProber := runInBackground(sc.Run), runInBackground(pr.Run)
	defer stopScraper()
	defer stopProber()

	var good, bad bool
	for !good || !bad {
		select {
		case r := <-got:
			if r.Err == nil {
				good = true
				want := Load{Engine: EngineVLLM, Model: server.DefaultModelName, BlockSize: cfg.BlockSize, NumGPUBlocks: cfg.NumGPUBlocks,
					KVTokens: int64(cfg.BlockSize) * int64(cfg.NumGPUBlocks), Ranks: 1}
				if r.Load != want {
					t.Errorf("mock engine load %+v, want %+v", r.Load, want)
				}
			} else {
				bad = true
				if !errors.Is(r.Err, ErrUnreadable) {
					t.Errorf("garbage metrics: %v, want ErrUnreadable", r.Err)
				}
			}
		case <-ctx.Done():
			t.Fatal("no reports from the mock engines")
		}
	}
	select {
	case ok := <-health:
		if !ok {
			t.Error("mock engine's /health failed the probe")
		}
	case <-ctx.Done():
		t.Fatal("no probe result")
	}
}

// A connection cut mid-body is a scrape failure, not a parse of half a
// page.
func TestScraperBodyCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newMemTransport()
		tr.handle("cut", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", textType)
			w.Write([]byte("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"))
			panic(http.ErrAbortHandler)
		}))
		s, _ := newTestScraper(t, tr, ScraperConfig{})
		s.SetTargets(map[string]string{"cut": "http://cut"})
		stop := runInBackground(s.Run)
		synctest.Wait()
		stop()
		r, _ := s.Report("cut")
		if !errors.Is(r.Err, errAborted) || !r.At.IsZero() || r.Load != (Load{}) {
			t.Errorf("cut page: %+v", r)
		}
	})
}
