package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferrail/inferrail/internal/testredis"
	"github.com/inferrail/inferrail/live/config"
)

// probeLog counts the GET /v1/responses/{id} requests engines answer, by
// id: a search cut short once a replica holds its id may still reach the
// other engine after the request that made it has its answer, so a count
// over all ids would take in a probe of an earlier search.
type probeLog struct {
	mu   sync.Mutex
	byID map[string]int
	all  int
}

func (p *probeLog) add(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byID == nil {
		p.byID = map[string]int{}
	}
	p.byID[id]++
	p.all++
}

// of returns the GETs of id so far.
func (p *probeLog) of(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byID[id]
}

// total returns every GET so far.
func (p *probeLog) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.all
}

// probedStoreEngine is storeEngine logging the GET /v1/responses/{id}
// requests it answers.
func probedStoreEngine(t *testing.T, gets *probeLog) *upstream {
	return wrappedStoreEngine(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id, ok := strings.CutPrefix(r.URL.Path, "/v1/responses/"); ok && r.Method == http.MethodGet {
				gets.add(id)
			}
			h.ServeHTTP(w, r)
		})
	})
}

// A response answered through one gateway is found through another (the
// chart runs two gateways): its continuations go to the replica that
// holds it, and so does GET /v1/responses/{id}. An id no replica holds
// costs one probe of each replica, and is not searched for again at once;
// an id vLLM would never make is not searched for.
func TestResponsesAcrossGateways(t *testing.T) {
	var gets probeLog
	a, b := probedStoreEngine(t, &gets), probedStoreEngine(t, &gets)
	g1 := startGateway(t, testConfig(t, a, b))
	g2 := startGateway(t, testConfig(t, a, b))
	resp, r1, body := g1.respond(t, map[string]any{"model": "sim", "input": words(100, 300), "max_output_tokens": 4})
	home := resp.Header.Get(HeaderReplica)
	if resp.StatusCode != http.StatusOK || home == "" {
		t.Fatalf("first: %d: %s", resp.StatusCode, body)
	}
	prev := r1.ID
	for turn := range 4 {
		resp, r, body := g2.respond(t, map[string]any{"previous_response_id": prev, "input": words(500+10*turn, 5), "max_output_tokens": 4})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderReplica) != home {
			t.Fatalf("turn %d through the other gateway: %d on %q (home %s): %s", turn, resp.StatusCode, resp.Header.Get(HeaderReplica), home, body)
		}
		// The first turn searches (both replicas asked at once; the
		// other's answer may be cut short); the rest are known.
		if n := gets.of(prev); turn == 0 && (n < 1 || n > 2) || turn > 0 && n != 0 {
			t.Fatalf("turn %d: %d probes of its previous response", turn, n)
		}
		prev = r.ID
	}
	get := func(g *testGateway, id string) (*http.Response, []byte) {
		t.Helper()
		resp, err := g.client.Get(g.base + "/v1/responses/" + id)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	g3 := startGateway(t, testConfig(t, a, b))
	if resp, b := get(g3, r1.ID); resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderReplica) != home || !strings.Contains(string(b), r1.ID) {
		t.Fatalf("GET through a third gateway: %d from %q: %s", resp.StatusCode, resp.Header.Get(HeaderReplica), b)
	}

	for range 3 {
		if resp, b := get(g2, "resp_nosuch"); resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "not found") {
			t.Fatalf("unknown id: %d %s", resp.StatusCode, b)
		}
	}
	if n := gets.of("resp_nosuch"); n != 2 {
		t.Fatalf("an unknown id asked for 3 times cost %d probes, want 2 (each replica once)", n)
	}
	if resp, _ := get(g2, "resp_no.such"); resp.StatusCode != http.StatusNotFound || gets.of("resp_no.such") != 0 {
		t.Fatalf("an id vLLM never makes: %d, %d probes", resp.StatusCode, gets.of("resp_no.such"))
	}
	// A continuation of an unknown id: searched once, then the usual
	// rule's engine answers 404.
	if resp, _, b := g2.respond(t, map[string]any{"previous_response_id": "resp_gone", "input": "x", "max_output_tokens": 2}); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("continuing an unknown id: %d %s", resp.StatusCode, b)
	}
	if n := gets.of("resp_gone"); n != 2 {
		t.Fatalf("continuing an unknown id cost %d probes, want 2", n)
	}
	for how, want := range map[string]float64{searchFound: 1, searchMissing: 2, searchRecent: 2, searchInvalid: 1} {
		if n := testutil.ToFloat64(g2.met.responseSearches.WithLabelValues(how)); n != want {
			t.Errorf("inferrail_response_searches_total{result=%q} = %v, want %v", how, n, want)
		}
	}
}

// The locator's bounds: concurrent requests for one id share one search
// (each candidate asked once); at most searchRate searches a second (in
// bursts of searchBurst) and maxLocating at once run,
// and one that cannot start within locateTimeout is given up; an id every
// candidate said it lacks is not searched for again within missTTL.
func TestLocatorBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l locator
		cands := []candidate{{rep: &replica{name: "a"}}, {rep: &replica{name: "b"}}, {rep: &replica{name: "c"}}}
		var mu sync.Mutex
		asked := map[string]int{}
		release := make(chan struct{})
		var running, most atomic.Int64
		// enter counts a probe running, and the most at once; the
		// returned func ends it.
		enter := func() func() {
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			return func() { running.Add(-1) }
		}
		probe := func(id string, holder string) func(context.Context, candidate) int {
			return func(ctx context.Context, c candidate) int {
				mu.Lock()
				asked[id+"/"+c.rep.name]++
				mu.Unlock()
				defer enter()()
				select {
				case <-release:
				case <-ctx.Done():
					return probeUnknown
				}
				if c.rep.name == holder {
					return probeHeld
				}
				return probeAbsent
			}
		}
		// 20 requests for one id: one search.
		var wg sync.WaitGroup
		found := make([]string, 20)
		for i := range 20 {
			wg.Go(func() {
				if c, how := l.find(t.Context(), "resp_1", cands, probe("resp_1", "b")); how == searchFound {
					found[i] = c.rep.name
				}
			})
		}
		synctest.Wait()
		close(release)
		wg.Wait()
		for i, f := range found {
			if f != "b" {
				t.Fatalf("request %d found %q, want b", i, f)
			}
		}
		for _, c := range cands {
			if n := asked["resp_1/"+c.rep.name]; n != 1 {
				t.Fatalf("%s asked %d times for one id, want 1", c.rep.name, n)
			}
		}

		// 12 ids at once, their probes held: maxLocating searches run, the
		// rest wait, and are given up at locateTimeout.
		hold := make(chan struct{})
		blocking := func(ctx context.Context, c candidate) int {
			defer enter()()
			select {
			case <-hold:
				return probeAbsent
			case <-ctx.Done():
				return probeUnknown
			}
		}
		most.Store(0)
		began := time.Now()
		var given, busy atomic.Int64
		for i := range 12 {
			wg.Go(func() {
				switch _, how := l.find(t.Context(), fmt.Sprintf("resp_x%d", i), cands, blocking); how {
				case searchBusy:
					busy.Add(1)
					given.Add(1)
				case searchUnknown:
					given.Add(1)
				}
			})
		}
		synctest.Wait()
		if r := running.Load(); r != maxLocating*int64(len(cands)) {
			t.Fatalf("%d probes running, want %d (%d searches of %d candidates)", r, maxLocating*len(cands), maxLocating, len(cands))
		}
		wg.Wait()
		// Those that waited for a slot are given up as busy, or, where a
		// slot freed at the very instant their wait ended, as unknown.
		if took := time.Since(began); took != locateTimeout || given.Load() != 12 || busy.Load() > 12-maxLocating || most.Load() != maxLocating*int64(len(cands)) {
			t.Fatalf("12 held searches ended after %v, %d given up (%d never started), at most %d probes at once; want %v, 12 (at most %d), %d",
				took, given.Load(), busy.Load(), most.Load(), locateTimeout, 12-maxLocating, maxLocating*len(cands))
		}
		close(hold)

		// Every candidate says it lacks resp_2: not asked again until
		// missTTL has passed.
		for i := range 3 {
			want := searchRecent
			if i == 0 {
				want = searchMissing
			}
			if _, how := l.find(t.Context(), "resp_2", cands, probe("resp_2", "")); how != want {
				t.Fatalf("search %d for an id no candidate holds: %s, want %s", i, how, want)
			}
		}
		if n := asked["resp_2/a"]; n != 1 {
			t.Fatalf("a missed id asked %d times within missTTL, want 1", n)
		}
		time.Sleep(missTTL)
		if _, how := l.find(t.Context(), "resp_2", cands, probe("resp_2", "")); how != searchMissing {
			t.Fatalf("after missTTL: %s", how)
		}
		if _, how := l.find(t.Context(), "resp/../x", cands, probe("x", "a")); how != searchInvalid {
			t.Fatalf("an id vLLM never makes: %s", how)
		}

		// Made-up ids one after another: searchBurst at once, then
		// searchRate a second.
		var l2 locator
		instant := func(context.Context, candidate) int { return probeAbsent }
		count := func(n int) (searched int) {
			for i := range n {
				if _, how := l2.find(t.Context(), fmt.Sprintf("resp_m%d_%d", n, i), cands, instant); how == searchMissing {
					searched++
				}
			}
			return searched
		}
		if n := count(200); n != searchBurst {
			t.Fatalf("200 made-up ids at once: %d searched, want %d", n, searchBurst)
		}
		time.Sleep(time.Second)
		if n := count(200); n != searchRate {
			t.Fatalf("200 more a second later: %d searched, want %d", n, searchRate)
		}
		if n := asked["resp_2/a"]; n != 2 {
			t.Fatalf("a missed id asked %d times after missTTL, want 2", n)
		}
	})
}

// With auth: keys the gateways share each stored response's replica and
// key through tenancy.redis (a real redis-server): a key continues and
// reads its response through a gateway that did not pass it on, and
// another key is refused there as on the first (404, as if it did not
// exist); no replica is searched.
func TestResponsesSharedHomesKeyed(t *testing.T) {
	srv := testredis.Start(t)
	var gets probeLog
	a, b := probedStoreEngine(t, &gets), probedStoreEngine(t, &gets)
	store := filepath.Join(t.TempDir(), "tenancy.db")
	keyed := func(c *config.Config) {
		c.Models[0].Replicas = []config.Replica{{Name: "a", URL: a.url()}, {Name: "b", URL: b.url()}}
		c.Tenancy.Store = store
		redisConfig(srv, "open", 2)(c) // the limiter admits while Redis is down (below)
	}
	g1 := startTenantGateway(t, a, keyed, Deps{})
	_, keyA := g1.createKey(t, map[string]any{"name": "a"})
	_, keyB := g1.createKey(t, map[string]any{"name": "b"})
	g2 := startTenantGateway(t, a, keyed, Deps{})
	call := func(g *tenantGateway, key, method, path string, body map[string]any) (*http.Response, []byte) {
		t.Helper()
		return keyedCall(t, g.testGateway, key, method, path, body)
	}
	resp, body := call(g1, keyA, http.MethodPost, "/v1/responses", map[string]any{"input": words(100, 40), "max_output_tokens": 2})
	var r responseBody
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &r) != nil || r.ID == "" {
		t.Fatalf("a on the first gateway: %d %s", resp.StatusCode, body)
	}
	home := resp.Header.Get(HeaderReplica)
	// The home is written to Redis without holding the request: read
	// through the other gateway once it is there.
	waitUntil(t, "the response's home shared", 5*time.Second, func() bool {
		resp, _ := call(g2, keyA, http.MethodGet, "/v1/responses/"+r.ID, nil)
		return resp.StatusCode == http.StatusOK && resp.Header.Get(HeaderReplica) == home
	})
	next := map[string]any{"previous_response_id": r.ID, "input": "more", "max_output_tokens": 2}
	if resp, b := call(g2, keyB, http.MethodPost, "/v1/responses", next); resp.StatusCode != http.StatusNotFound || !bytes.Contains(b, []byte("not found")) {
		t.Fatalf("b continuing a's response through the other gateway: %d %s", resp.StatusCode, b)
	}
	if resp, b := call(g2, keyB, http.MethodGet, "/v1/responses/"+r.ID, nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("b reading a's response through the other gateway: %d %s", resp.StatusCode, b)
	}
	for turn := range 3 {
		resp, b := call(g2, keyA, http.MethodPost, "/v1/responses", next)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderReplica) != home {
			t.Fatalf("a's turn %d through the other gateway: %d on %q (home %s): %s", turn, resp.StatusCode, resp.Header.Get(HeaderReplica), home, b)
		}
	}
	if n := gets.total(); n != 1 {
		t.Fatalf("%d GETs reached the engines, want a's one read (no search with keys)", n)
	}
	if n := testutil.ToFloat64(g2.met.responseHomeErrors.WithLabelValues("get")) + testutil.ToFloat64(g1.met.responseHomeErrors.WithLabelValues("put")); n != 0 {
		t.Fatalf("%v Redis errors", n)
	}

	// Redis down: each gateway serves its own responses as without it,
	// and counts and logs the outage once.
	srv.Stop()
	resp, body = call(g1, keyA, http.MethodPost, "/v1/responses", map[string]any{"input": words(300, 40), "max_output_tokens": 2})
	var r2 responseBody
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &r2) != nil {
		t.Fatalf("with Redis down: %d %s", resp.StatusCode, body)
	}
	waitUntil(t, "the failed write counted", 5*time.Second, func() bool {
		return testutil.ToFloat64(g1.met.responseHomeErrors.WithLabelValues("put")) >= 1
	})
	home2 := resp.Header.Get(HeaderReplica)
	next2 := map[string]any{"previous_response_id": r2.ID, "input": "more", "max_output_tokens": 2}
	if resp, b := call(g1, keyA, http.MethodPost, "/v1/responses", next2); resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderReplica) != home2 {
		t.Fatalf("continuing with Redis down: %d on %q (home %s): %s", resp.StatusCode, resp.Header.Get(HeaderReplica), home2, b)
	}
	if strings.Count(g1.logs.String(), "redis response homes failing") != 1 {
		t.Errorf("the outage is not logged once:\n%s", g1.logs.String())
	}
}
