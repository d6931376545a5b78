package respcache

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// body4KB is a chat request of about 4 KB: a system prompt, a few turns,
// a tool with a JSON schema, sampling fields.
func body4KB() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"qwen","temperature":0,"max_tokens":256,"seed":42,"stream":true,"stream_options":{"include_usage":true},"messages":[`)
	b.WriteString(`{"role":"system","content":"You are a careful assistant. ` + strings.Repeat("Answer precisely and cite the document. ", 30) + `"}`)
	for i := range 6 {
		fmt.Fprintf(&b, `,{"role":"user","content":"Question %d: what does section %d of the contract say about termination, notice periods and penalties?"}`, i, i)
		fmt.Fprintf(&b, `,{"role":"assistant","content":"Section %d says the notice period is 30 days, with a penalty of 1.5 times the monthly fee (see clause %d.2)."}`, i, i)
	}
	b.WriteString(`],"tools":[{"type":"function","function":{"name":"lookup_clause","description":"Find a clause by number","parameters":{"type":"object","properties":{"section":{"type":"integer","minimum":1},"clause":{"type":"string"},"strict":{"type":"boolean"}},"required":["section"]}}}],"tool_choice":"auto","top_p":1.0,"user":"eval-runner"}`)
	return []byte(b.String())
}

func BenchmarkKey4KB(b *testing.B) {
	c := newCache(b, testConfig(), Deps{})
	req := Request{Path: PathChatCompletions, Body: body4KB(), Model: "qwen", KeyID: "key-1"}
	b.SetBytes(int64(len(req.Body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, reason := c.keyOf(&req); reason != "" {
			b.Fatal(reason)
		}
	}
}

// BenchmarkLookupHit is a whole Lookup that hits the memory store: the
// rules and key of a 4 KB body, then the store.
func BenchmarkLookupHit(b *testing.B) {
	c := newCache(b, testConfig(), Deps{})
	req := Request{Path: PathChatCompletions, Body: body4KB(), Model: "qwen", KeyID: "key-1"}
	k, _, _ := c.keyOf(&req)
	if err := c.store.Set(context.Background(), k, sseEntry("x"), time.Hour); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		res, err := c.Lookup(ctx, req)
		if err != nil || res.Outcome != Hit {
			b.Fatal(res.Outcome, err)
		}
	}
}

// BenchmarkMemoryGet is the memory store's hit alone, over 10,000 entries.
func BenchmarkMemoryGet(b *testing.B) {
	s, _ := NewMemoryStore(1<<30, nil)
	keys := make([]Key, 10000)
	e := sseEntry("x")
	for i := range keys {
		keys[i] = testKey(fmt.Sprint(i))
		s.Set(context.Background(), keys[i], e, time.Hour)
	}
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if got, _ := s.Get(ctx, keys[i%len(keys)]); got == nil {
			b.Fatal("miss")
		}
		i++
	}
}

// entry50 is a stream of 50 events (48 text chunks, usage, [DONE]).
func entry50() *Entry {
	body := fakeStream("bench", 48)
	var ends []int
	off := 0
	for _, ev := range splitEvents(body) {
		off += len(ev)
		ends = append(ends, off)
	}
	if len(ends) != 50 {
		panic(len(ends))
	}
	return &Entry{Kind: KindSSE, ContentType: "text/event-stream; charset=utf-8", Body: []byte(body), Events: ends}
}

func BenchmarkReplay50(b *testing.B) {
	e := entry50()
	b.SetBytes(int64(len(e.Body)))
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		if err := Replay(rec, e, time.Second); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCapture50 is the miss path's cost beyond the relay: a 50-event
// stream written through a capture (to a recorder), checked and stored at
// Finish.
func BenchmarkCapture50(b *testing.B) {
	c := newCache(b, testConfig(), Deps{})
	e := entry50()
	events := splitEvents(string(e.Body))
	req := Request{Path: PathChatCompletions, Body: []byte(streamBody), Model: "m", KeyID: "k"}
	b.SetBytes(int64(len(e.Body)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		req.KeyID = fmt.Sprint(i) // a new key each time: always a miss
		i++
		res, _ := c.Lookup(context.Background(), req)
		rec := httptest.NewRecorder()
		w := res.Capture.Wrap(rec)
		w.Header().Set("Content-Type", e.ContentType)
		for _, ev := range events {
			w.Write([]byte(ev))
		}
		res.Capture.Finish()
	}
}

// BenchmarkHitHTTP is a cached hit through a minimal proxy over loopback
// (the 4 KB body, a 50-event stream replayed), one request at a time; it
// reports the latency quantiles the client saw. live adds its own
// handler's work to this.
func BenchmarkHitHTTP(b *testing.B) {
	c := newCache(b, testConfig(), Deps{})
	body := body4KB()
	k, _, _ := c.keyOf(&Request{Path: PathChatCompletions, Body: body, Model: "m", KeyID: "k"})
	c.store.Set(context.Background(), k, entry50(), time.Hour)
	p := &cachingProxy{t: b, c: c, model: "m", upstream: http.NotFoundHandler()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: p}
	go hs.Serve(ln)
	defer hs.Close()
	url := "http://" + ln.Addr().String() + PathChatCompletions
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	var lat []time.Duration
	buf := make([]byte, 64<<10)
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
		req.Header.Set("X-Test-Key", "k")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := resp.Body.Read(buf); err != nil {
				break
			}
		}
		resp.Body.Close()
		if resp.Header.Get(HeaderCache) != "hit" {
			b.Fatal(resp.Header.Get(HeaderCache))
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(q(0.5), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}
