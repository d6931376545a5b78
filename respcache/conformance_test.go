package respcache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// storeHarness runs one conformance case against a fresh store of one
// implementation: f gets the store and the sleep that moves its clock
// (virtual for the memory store, real for Redis).
type storeHarness func(t *testing.T, f func(t *testing.T, s Store, sleep func(time.Duration)))

func testKey(name string) Key { return Key(sha256.Sum256([]byte(name))) }

func sseEntry(tag string) *Entry {
	body := fakeStream(tag, 3)
	var ends []int
	off := 0
	for _, ev := range splitEvents(body) {
		off += len(ev)
		ends = append(ends, off)
	}
	return &Entry{Kind: KindSSE, ContentType: "text/event-stream; charset=utf-8", Body: []byte(body), Events: ends,
		Usage: Usage{Known: true, PromptTokens: 12, CompletionTokens: 3, CachedTokens: -1}}
}

func jsonEntry(tag string) *Entry {
	return &Entry{Kind: KindJSON, ContentType: "application/json", Body: []byte(fakeJSON(tag)),
		Usage: Usage{Known: true, PromptTokens: 9, CompletionTokens: 3, CachedTokens: 0}}
}

func sameEntry(a, b *Entry) bool {
	return a.Kind == b.Kind && a.ContentType == b.ContentType && bytes.Equal(a.Body, b.Body) &&
		slices.Equal(a.Events, b.Events) && a.Usage == b.Usage
}

func mustGet(t *testing.T, s Store, k Key) *Entry {
	t.Helper()
	e, err := s.Get(context.Background(), k)
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	return e
}

func mustSet(t *testing.T, s Store, k Key, e *Entry, ttl time.Duration) {
	t.Helper()
	if err := s.Set(context.Background(), k, e, ttl); err != nil {
		t.Fatalf("set: %v", err)
	}
}

// conformance is the suite every Store passes.
var conformance = []struct {
	name string
	f    func(t *testing.T, s Store, sleep func(time.Duration))
}{
	{"missing", func(t *testing.T, s Store, _ func(time.Duration)) {
		if e := mustGet(t, s, testKey("nothing")); e != nil {
			t.Fatalf("an empty store returned %+v", e)
		}
	}},
	{"round trip", func(t *testing.T, s Store, _ func(time.Duration)) {
		all := make([]byte, 256)
		for i := range all {
			all[i] = byte(i)
		}
		bin := &Entry{Kind: KindSSE, ContentType: "text/event-stream", Body: all, Events: []int{1, 100, 256},
			Usage: Usage{CachedTokens: -1}}
		for name, e := range map[string]*Entry{"sse": sseEntry("a"), "json": jsonEntry("a"), "binary": bin} {
			k := testKey(name)
			mustSet(t, s, k, e, time.Hour)
			got := mustGet(t, s, k)
			if got == nil || !sameEntry(got, e) {
				t.Fatalf("%s: stored %+v, read %+v", name, e, got)
			}
		}
	}},
	{"overwrite", func(t *testing.T, s Store, _ func(time.Duration)) {
		k := testKey("k")
		mustSet(t, s, k, jsonEntry("old"), time.Hour)
		mustSet(t, s, k, sseEntry("new"), time.Hour)
		if got := mustGet(t, s, k); got == nil || !sameEntry(got, sseEntry("new")) {
			t.Fatalf("read %+v after an overwrite", got)
		}
	}},
	{"keys apart", func(t *testing.T, s Store, _ func(time.Duration)) {
		a := testKey("a")
		b := a
		b[31] ^= 1
		mustSet(t, s, a, jsonEntry("a"), time.Hour)
		if e := mustGet(t, s, b); e != nil {
			t.Fatalf("a key one bit away read %+v", e)
		}
		mustSet(t, s, b, jsonEntry("b"), time.Hour)
		if got := mustGet(t, s, a); got == nil || !sameEntry(got, jsonEntry("a")) {
			t.Fatalf("a: %+v", got)
		}
	}},
	{"ttl", func(t *testing.T, s Store, sleep func(time.Duration)) {
		short, long := testKey("short"), testKey("long")
		mustSet(t, s, short, jsonEntry("s"), 300*time.Millisecond)
		mustSet(t, s, long, jsonEntry("l"), time.Hour)
		sleep(100 * time.Millisecond)
		if mustGet(t, s, short) == nil {
			t.Fatal("expired before its ttl")
		}
		sleep(400 * time.Millisecond)
		if e := mustGet(t, s, short); e != nil {
			t.Fatal("served past its ttl")
		}
		if mustGet(t, s, long) == nil {
			t.Fatal("a longer ttl expired with the short one")
		}
		// A rewrite sets a new ttl.
		mustSet(t, s, short, jsonEntry("s2"), time.Hour)
		sleep(400 * time.Millisecond)
		if mustGet(t, s, short) == nil {
			t.Fatal("a rewritten entry kept its old ttl")
		}
	}},
	{"invalid entries", func(t *testing.T, s Store, _ func(time.Duration)) {
		k := testKey("bad")
		for name, e := range map[string]*Entry{
			"no kind":        {ContentType: "application/json", Body: []byte("{}")},
			"json events":    {Kind: KindJSON, Body: []byte("{}"), Events: []int{2}},
			"events order":   {Kind: KindSSE, Body: []byte("0123456789"), Events: []int{5, 3}},
			"events outside": {Kind: KindSSE, Body: []byte("0123456789"), Events: []int{11}},
			"empty event":    {Kind: KindSSE, Body: []byte("0123456789"), Events: []int{0, 5}},
		} {
			if err := s.Set(context.Background(), k, e, time.Hour); err == nil {
				t.Errorf("%s: stored", name)
			}
		}
		if e := mustGet(t, s, k); e != nil {
			t.Errorf("an invalid entry was stored: %+v", e)
		}
		if err := s.Set(context.Background(), k, jsonEntry("x"), 0); err == nil {
			t.Error("a ttl of 0 was accepted")
		}
	}},
	{"cancelled", func(t *testing.T, s Store, _ func(time.Duration)) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.Get(ctx, testKey("x")); !errors.Is(err, context.Canceled) {
			t.Errorf("get: %v, want context.Canceled", err)
		}
		if err := s.Set(ctx, testKey("x"), jsonEntry("x"), time.Hour); !errors.Is(err, context.Canceled) {
			t.Errorf("set: %v, want context.Canceled", err)
		}
	}},
	{"big", func(t *testing.T, s Store, _ func(time.Duration)) {
		body := bytes.Repeat([]byte("data: {\"x\":1}\n\n"), 1<<15) // 480 KiB
		ends := make([]int, 0, 1<<15)
		for i := 1; i <= 1<<15; i++ {
			ends = append(ends, i*15)
		}
		e := &Entry{Kind: KindSSE, ContentType: "text/event-stream", Body: body, Events: ends, Usage: Usage{CachedTokens: -1}}
		mustSet(t, s, testKey("big"), e, time.Hour)
		if got := mustGet(t, s, testKey("big")); got == nil || !sameEntry(got, e) {
			t.Fatal("a big entry did not round trip")
		}
	}},
	{"concurrent", func(t *testing.T, s Store, _ func(time.Duration)) {
		// Each Get returns nothing or an entry written under that key.
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := range 8 {
			wg.Go(func() {
				for i := range 40 {
					name := fmt.Sprintf("key%d", (g+i)%4)
					k := testKey(name)
					if i%2 == 0 {
						if err := s.Set(context.Background(), k, jsonEntry(name+"/"+fmt.Sprint(g)), time.Hour); err != nil {
							errs <- err
							return
						}
						continue
					}
					e, err := s.Get(context.Background(), k)
					if err != nil {
						errs <- err
						return
					}
					if e != nil && !bytes.Contains(e.Body, []byte(`"chatcmpl-`+name+`/`)) {
						errs <- fmt.Errorf("%s read another key's entry: %s", name, e.Body)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}},
}

func runConformance(t *testing.T, h storeHarness) {
	for _, c := range conformance {
		t.Run(c.name, func(t *testing.T) { h(t, c.f) })
	}
}
