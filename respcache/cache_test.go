package respcache

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestMissThenHit(t *testing.T) {
	for _, tc := range []struct {
		name, body, ctype string
	}{
		{"stream", streamBody, "text/event-stream; charset=utf-8"},
		{"json", jsonBody, "application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cnt := newCounters()
			eng := &fakeEngine{}
			p := &cachingProxy{t: t, c: newCache(t, testConfig(), Deps{Hooks: cnt.hooks()}), model: "m", upstream: eng}
			first := do(p, "k1", tc.body)
			if got := first.Header().Get(HeaderCache); got != "miss" {
				t.Fatalf("first: x-inferrail-cache %q, want miss", got)
			}
			second := do(p, "k1", tc.body)
			if got := second.Header().Get(HeaderCache); got != "hit" {
				t.Fatalf("second: x-inferrail-cache %q, want hit (%v)", got, cnt)
			}
			if first.Body.String() != second.Body.String() {
				t.Fatalf("replay differs:\n%q\n%q", first.Body.String(), second.Body.String())
			}
			if got := second.Header().Get("Content-Type"); got != tc.ctype {
				t.Errorf("replayed content type %q, want %q", got, tc.ctype)
			}
			if eng.calls.Load() != 1 {
				t.Errorf("engine called %d times, want 1", eng.calls.Load())
			}
			if cnt.get("hit") != 1 || cnt.get("miss") != 1 || cnt.get("stored") != 1 {
				t.Errorf("counters %v", cnt)
			}
			// The stream and the JSON answer of one body are two entries.
			other := jsonBody
			if tc.body == jsonBody {
				other = streamBody
			}
			if w := do(p, "k1", other); w.Header().Get(HeaderCache) != "miss" {
				t.Errorf("the other kind of answer was a %q", w.Header().Get(HeaderCache))
			}
		})
	}
}

// TestTenantIsolation: two tenants that send the same body never share an
// entry, by API key or by tenant header; each replays only its own answer.
func TestTenantIsolation(t *testing.T) {
	cfg := testConfig()
	cfg.TenantHeader = "X-Tenant"
	eng := &fakeEngine{}
	p := &cachingProxy{t: t, c: newCache(t, cfg, Deps{}), model: "m", upstream: eng}
	answers := map[string]string{}
	for _, who := range []struct{ key, tenant string }{{"a", ""}, {"b", ""}, {"", "t1"}, {"", "t2"}, {"a", "t1"}} {
		id := who.key + "/" + who.tenant
		var hdr []string
		if who.tenant != "" {
			hdr = []string{"X-Tenant", who.tenant}
		}
		first := do(p, who.key, streamBody, hdr...)
		if got := first.Header().Get(HeaderCache); got != "miss" {
			t.Fatalf("%s: first request %q, want miss: another tenant's entry", id, got)
		}
		for other, body := range answers {
			if body == first.Body.String() {
				t.Fatalf("%s got %s's answer", id, other)
			}
		}
		answers[id] = first.Body.String()
		again := do(p, who.key, streamBody, hdr...)
		if again.Header().Get(HeaderCache) != "hit" || again.Body.String() != first.Body.String() {
			t.Fatalf("%s: its own entry was not replayed (%q)", id, again.Header().Get(HeaderCache))
		}
	}
	if n := eng.calls.Load(); n != 5 {
		t.Errorf("engine called %d times, want 5 (one per tenant)", n)
	}
	// No tenant at all: never cached.
	if w := do(p, "", streamBody); w.Header().Get(HeaderCache) != "" {
		t.Errorf("a request without tenant got x-inferrail-cache %q", w.Header().Get(HeaderCache))
	}
}

// TestCoalesce: 100 concurrent identical misses reach the engine once;
// the 99 others replay the first's answer byte for byte.
func TestCoalesce(t *testing.T) {
	for _, body := range []string{streamBody, jsonBody} {
		synctest.Test(t, func(t *testing.T) {
			cnt := newCounters()
			eng := &fakeEngine{delay: 100 * time.Millisecond}
			p := &cachingProxy{t: t, c: newCache(t, testConfig(), Deps{Hooks: cnt.hooks()}), model: "m", upstream: eng}
			const n = 100
			out := make([]*httptest.ResponseRecorder, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { out[i] = do(p, "k", body) })
			}
			wg.Wait()
			if got := eng.calls.Load(); got != 1 {
				t.Fatalf("%d identical misses reached the engine %d times, want 1", n, got)
			}
			misses := 0
			for i, w := range out {
				if w.Code != 200 || w.Body.String() != out[0].Body.String() {
					t.Fatalf("answer %d differs (status %d)", i, w.Code)
				}
				if w.Header().Get(HeaderCache) == "miss" {
					misses++
				}
			}
			if misses != 1 || cnt.get("coalesced") != n-1 || cnt.get("hit") != n-1 {
				t.Errorf("misses %d, counters %v", misses, cnt)
			}
		})
	}
}

// TestCoalesceLeaderFails: when the first request's answer fails, those
// waiting for it go to the engine themselves; none gets its error.
func TestCoalesceLeaderFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		eng := &fakeEngine{delay: 50 * time.Millisecond}
		eng.fail = func(call int64, w http.ResponseWriter) bool {
			if call != 1 {
				return false
			}
			time.Sleep(50 * time.Millisecond)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`)
			return true
		}
		cnt := newCounters()
		p := &cachingProxy{t: t, c: newCache(t, testConfig(), Deps{Hooks: cnt.hooks()}), model: "m", upstream: eng}
		const n = 10
		out := make([]*httptest.ResponseRecorder, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { out[i] = do(p, "k", jsonBody) })
		}
		wg.Wait()
		failed := 0
		for _, w := range out {
			if w.Code != 200 {
				failed++
			}
		}
		if failed != 1 {
			t.Fatalf("%d answers failed, want 1 (the leader's own)", failed)
		}
		if got := eng.calls.Load(); got != n {
			t.Errorf("engine called %d times, want %d: the followers compute their own", got, n)
		}
		if cnt.get("not_stored:status") != 1 || cnt.get("stored") == 0 {
			t.Errorf("counters %v", cnt)
		}
		// The answers the followers computed are stored: the next is a hit.
		if w := do(p, "k", jsonBody); w.Header().Get(HeaderCache) != "hit" {
			t.Errorf("after the followers: %q", w.Header().Get(HeaderCache))
		}
	})
}

// TestCoalesceMaxWait: a follower waits for the first answer no longer
// than max_wait, then computes its own; its context ends the wait too.
func TestCoalesceMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.MaxWait = time.Second
		eng := &fakeEngine{}
		eng.fail = func(call int64, w http.ResponseWriter) bool {
			if call == 1 || call == 3 {
				time.Sleep(time.Minute) // a slow leader
			}
			return false
		}
		c := newCache(t, cfg, Deps{})
		p := &cachingProxy{t: t, c: c, model: "m", upstream: eng}
		leader := make(chan *httptest.ResponseRecorder)
		go func() { leader <- do(p, "k", jsonBody) }()
		synctest.Wait()
		start := time.Now()
		w := do(p, "k", jsonBody)
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("the follower waited %v, want max_wait (1s)", waited)
		}
		if w.Code != 200 || w.Header().Get(HeaderCache) != "miss" {
			t.Errorf("follower past max_wait: %d %q", w.Code, w.Header().Get(HeaderCache))
		}
		// Its answer is stored; a new request replays it at once.
		if w := do(p, "k", jsonBody); w.Header().Get(HeaderCache) != "hit" {
			t.Errorf("next request: %q", w.Header().Get(HeaderCache))
		}
		// A follower whose client leaves stops waiting.
		go func() { leader <- do(p, "k2", jsonBody) }() // the third call: slow too
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := c.Lookup(ctx, Request{Path: PathChatCompletions, Body: []byte(jsonBody), Model: "m", KeyID: "k2"})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("cancelled follower: %v", err)
		}
		<-leader
		<-leader
	})
}

// TestNotStored: only whole, successful answers are stored.
func TestNotStored(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		reason string
		serve  func(w http.ResponseWriter)
	}{
		{"status", jsonBody, NotStoredStatus, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			io.WriteString(w, `{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`)
		}},
		{"error body", jsonBody, NotStoredErrorEvent, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"object":"error","message":"bad","type":"x","param":null,"code":400}`)
		}},
		{"truncated json", jsonBody, NotStoredMalformed, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, fakeJSON("x")[:40])
		}},
		{"gzip", jsonBody, NotStoredEncoding, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			io.WriteString(w, "\x1f\x8b...")
		}},
		{"not json", jsonBody, NotStoredContentType, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, fakeJSON("x"))
		}},
		{"empty", jsonBody, NotStoredIncomplete, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
		}},
		{"stream without done", streamBody, NotStoredIncomplete, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, strings.TrimSuffix(fakeStream("x", 3), "data: [DONE]\n\n"))
		}},
		{"stream cut mid-event", streamBody, NotStoredIncomplete, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			s := fakeStream("x", 3)
			io.WriteString(w, s[:len(s)/2])
		}},
		{"error event", streamBody, NotStoredErrorEvent, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, sseChunk("x", "a", "")+`data: {"error": {"message": "engine died", "type": "InternalServerError", "param": null, "code": 500}}`+"\n\ndata: [DONE]\n\n")
		}},
		{"stream as json", streamBody, NotStoredContentType, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, fakeJSON("x"))
		}},
		{"too large", jsonBody, NotStoredTooLarge, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			big := strings.Repeat("x", 2048)
			io.WriteString(w, strings.Replace(fakeJSON("x"), "answer", big, 1))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MaxEntryBytes = 1 * KiB
			cnt := newCounters()
			eng := &fakeEngine{fail: func(_ int64, w http.ResponseWriter) bool { tc.serve(w); return true }}
			p := &cachingProxy{t: t, c: newCache(t, cfg, Deps{Hooks: cnt.hooks()}), model: "m", upstream: eng}
			first := do(p, "k", tc.body)
			second := do(p, "k", tc.body)
			if second.Header().Get(HeaderCache) != "miss" || eng.calls.Load() != 2 {
				t.Errorf("the answer was stored (second: %q, %d calls)", second.Header().Get(HeaderCache), eng.calls.Load())
			}
			if cnt.get("not_stored:"+tc.reason) != 2 || cnt.get("stored") != 0 {
				t.Errorf("counters %v, want not_stored:%s twice", cnt, tc.reason)
			}
			if tc.reason == NotStoredTooLarge {
				if cnt.get("too_large") != 2 {
					t.Errorf("too_large not counted: %v", cnt)
				}
				if first.Body.Len() < 2048 {
					t.Errorf("the client got %d bytes of a big answer", first.Body.Len())
				}
			}
		})
	}
}

// TestCacheTTL: an entry is served for ttl, then computed again.
func TestCacheTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.TTL = time.Minute
		cnt := newCounters()
		eng := &fakeEngine{}
		p := &cachingProxy{t: t, c: newCache(t, cfg, Deps{Hooks: cnt.hooks()}), model: "m", upstream: eng}
		do(p, "k", jsonBody)
		time.Sleep(time.Minute - time.Millisecond)
		if w := do(p, "k", jsonBody); w.Header().Get(HeaderCache) != "hit" {
			t.Fatalf("before ttl: %q", w.Header().Get(HeaderCache))
		}
		time.Sleep(time.Millisecond)
		if w := do(p, "k", jsonBody); w.Header().Get(HeaderCache) != "miss" {
			t.Fatalf("at ttl: %q", w.Header().Get(HeaderCache))
		}
		if cnt.get("evicted:ttl") != 1 {
			t.Errorf("counters %v", cnt)
		}
	})
}

func TestDisabledAndBypass(t *testing.T) {
	c := newCache(t, DefaultConfig(), Deps{})
	if c.Store() != nil {
		t.Error("a disabled cache holds a store")
	}
	res, err := c.Lookup(context.Background(), chatReq(jsonBody))
	if err != nil || res.Outcome != Bypass || res.Reason != ReasonDisabled {
		t.Errorf("disabled: %+v %v", res, err)
	}
	var nilCache *Cache
	if res, _ := nilCache.Lookup(context.Background(), chatReq(jsonBody)); res.Outcome != Bypass {
		t.Errorf("nil cache: %+v", res)
	}
	cnt := newCounters()
	eng := &fakeEngine{}
	p := &cachingProxy{t: t, c: newCache(t, testConfig(), Deps{Hooks: cnt.hooks()}), model: "m", upstream: eng}
	sampled := strings.Replace(jsonBody, `"temperature":0`, `"temperature":0.7`, 1)
	for range 2 {
		if w := do(p, "k", sampled); w.Header().Get(HeaderCache) != "" || w.Code != 200 {
			t.Errorf("a sampled request: %d %q", w.Code, w.Header().Get(HeaderCache))
		}
	}
	if eng.calls.Load() != 2 || cnt.get("bypass:temperature") != 2 {
		t.Errorf("%d calls, counters %v", eng.calls.Load(), cnt)
	}
}

// failingStore fails every call.
type failingStore struct{}

var errStoreDown = errors.New("store down")

func (failingStore) Get(context.Context, Key) (*Entry, error)              { return nil, errStoreDown }
func (failingStore) Set(context.Context, Key, *Entry, time.Duration) error { return errStoreDown }

// TestStoreErrors: a failing store makes misses, counted, and never fails
// a request.
func TestStoreErrors(t *testing.T) {
	cnt := newCounters()
	eng := &fakeEngine{}
	p := &cachingProxy{t: t, c: newCache(t, testConfig(), Deps{Store: failingStore{}, Hooks: cnt.hooks()}), model: "m", upstream: eng}
	for range 2 {
		if w := do(p, "k", streamBody); w.Code != 200 || w.Header().Get(HeaderCache) != "miss" {
			t.Fatalf("%d %q", w.Code, w.Header().Get(HeaderCache))
		}
	}
	if cnt.get("store_error:get") != 2 || cnt.get("store_error:set") != 2 || cnt.get("stored") != 0 {
		t.Errorf("counters %v", cnt)
	}
}

// TestCaptureIsTransparent: the client gets each chunk when the engine
// writes it (flushed through the capture), and ResponseController reaches
// the connection beneath (write deadlines).
func TestCaptureIsTransparent(t *testing.T) {
	c := newCache(t, testConfig(), Deps{})
	res, err := c.Lookup(context.Background(), chatReq(streamBody))
	if err != nil || res.Outcome != Miss {
		t.Fatal(res, err)
	}
	rec := newFlushRecorder()
	w := res.Capture.Wrap(rec)
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	events := splitEvents(fakeStream("x", 4))
	for i, ev := range events {
		io.WriteString(w, ev)
		if err := rc.Flush(); err != nil {
			t.Fatal(err)
		}
		if got := rec.all(); len(got) != i+1 || got[i] != ev {
			t.Fatalf("after event %d the client has %q", i, got)
		}
	}
	res.Capture.Finish()
	res.Capture.Finish() // twice is once
	again, _ := c.Lookup(context.Background(), chatReq(streamBody))
	if again.Outcome != Hit {
		t.Fatalf("not stored: %+v", again)
	}
	if got := len(again.Entry.Events); got != len(events) {
		t.Errorf("%d events stored, want %d", got, len(events))
	}
	if u := again.Entry.Usage; !u.Known || u.PromptTokens != 12 || u.CompletionTokens != 4 {
		t.Errorf("usage %+v", u)
	}
}

// TestEventBoundaries: events end at blank lines whatever the line ends
// (LF, CRLF, CR) and however the writes split them.
func TestEventBoundaries(t *testing.T) {
	for _, nl := range []string{"\n", "\r\n", "\r"} {
		stream := "data: a" + nl + nl + ": comment" + nl + "data: b" + nl + "data: c" + nl + nl + "data: [DONE]" + nl + nl
		want := []int{}
		for i, off := 0, 0; i < 3; i++ {
			j := strings.Index(stream[off:], nl+nl)
			off += j + 2*len(nl)
			want = append(want, off)
		}
		for split := 1; split <= len(stream); split++ {
			p := &Capture{kind: KindSSE, limit: 1 << 20, lineStart: true}
			for i := 0; i < len(stream); i += split {
				p.keep([]byte(stream[i:min(i+split, len(stream))]))
			}
			if len(p.events) != len(want) {
				t.Fatalf("line end %q, writes of %d: events %v, want %v", nl, split, p.events, want)
			}
			for i := range want {
				if p.events[i] != want[i] {
					t.Fatalf("line end %q, writes of %d: events %v, want %v", nl, split, p.events, want)
				}
			}
		}
	}
}
