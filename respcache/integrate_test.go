package respcache

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
	"time"
)

// What the proxy needs beyond Lookup, Capture and Replay to put the
// semantic cache behind this one: the rule alone, the stored entry, an
// encoding without a key, a capture that ends without an answer, and a
// replay under another header value.

func TestDeterministicIsTheKeysRule(t *testing.T) {
	cfg := testConfig()
	cfg.MaxTemperature = 0.5
	c := newCache(t, cfg, Deps{})
	cases := []struct {
		path, body string
		reason     string
	}{
		{PathChatCompletions, `{"messages":[],"temperature":0}`, ""},
		{PathCompletions, `{"prompt":"x","temperature":0.5,"top_p":1}`, ""},
		{PathCompletions, `{"prompt":"x"}`, ReasonTemperature}, // absent is 1
		{PathCompletions, `{"prompt":"x","temperature":0.7}`, ReasonTemperature},
		{PathCompletions, `{"prompt":"x","temperature":0,"n":2}`, ReasonN},
		{PathCompletions, `{"prompt":"x","temperature":0.2,"top_p":0.9}`, ReasonTopP},
		{PathCompletions, `{"prompt":"x","temperature":0,"stream":"yes"}`, ReasonStream},
		{PathCompletions, `{"prompt":"x","temperature":0,"temperature":0}`, ReasonInvalidBody},
		{"/v1/embeddings", `{"input":"x"}`, ReasonPath},
	}
	for _, tc := range cases {
		ok, why := c.Deterministic(tc.path, []byte(tc.body))
		if ok != (tc.reason == "") || why != tc.reason {
			t.Errorf("Deterministic(%s, %s) = %v, %q; want reason %q", tc.path, tc.body, ok, why, tc.reason)
		}
		// The same verdict as Lookup's, for a request with a tenant.
		res, err := c.Lookup(context.Background(), Request{Path: tc.path, Body: []byte(tc.body), Model: "m", KeyID: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if (res.Outcome == Bypass) != (tc.reason != "") || res.Reason != tc.reason {
			t.Errorf("Lookup(%s) = %v %q, Deterministic says %q", tc.body, res.Outcome, res.Reason, why)
		}
		if res.Capture != nil {
			res.Capture.Abandon()
		}
	}
}

func TestEncodeDecodeEntry(t *testing.T) {
	for _, e := range []*Entry{
		{Kind: KindJSON, ContentType: "application/json", Body: []byte(fakeJSON("a")), Usage: Usage{Known: true, PromptTokens: 9, CompletionTokens: 3, CachedTokens: 0}},
		{Kind: KindSSE, ContentType: "text/event-stream; charset=utf-8", Body: []byte("data: a\n\ndata: [DONE]\n\n"), Events: []int{9, 23}, Usage: Usage{CachedTokens: -1}},
	} {
		got, err := DecodeEntry(EncodeEntry(e))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, e) {
			t.Errorf("round trip:\n%+v\nwant\n%+v", got, e)
		}
	}
	b := EncodeEntry(&Entry{Kind: KindSSE, ContentType: "text/event-stream", Body: []byte("data: a\n\n"), Events: []int{9}})
	for _, bad := range [][]byte{nil, b[:10], append([]byte{9}, b[1:]...)} {
		if _, err := DecodeEntry(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeEntry(%q) = %v, want ErrCorrupt", bad, err)
		}
	}
}

func TestCaptureEntryAndAbandon(t *testing.T) {
	cnt := newCounters()
	c := newCache(t, testConfig(), Deps{Hooks: cnt.hooks()})
	req := Request{Path: PathChatCompletions, Body: []byte(`{"messages":[{"role":"user","content":"hi"}],"temperature":0}`), Model: "m", KeyID: "k"}
	ctx := context.Background()

	// A miss abandoned: nothing stored, nothing counted as not stored,
	// and a request waiting for it computes its own answer.
	res, err := c.Lookup(ctx, req)
	if err != nil || res.Outcome != Miss {
		t.Fatalf("first lookup: %v %v", res.Outcome, err)
	}
	var wg sync.WaitGroup
	var follower Result
	wg.Go(func() {
		follower, _ = c.Lookup(ctx, req)
	})
	time.Sleep(20 * time.Millisecond) // the follower waits for the leader (or comes after: a miss too)
	res.Capture.Abandon()
	res.Capture.Finish() // does nothing after Abandon
	wg.Wait()
	if follower.Outcome != Miss {
		t.Fatalf("follower of an abandoned miss: %v, want its own miss", follower.Outcome)
	}
	if res.Capture.Entry() != nil || cnt.get("stored") != 0 || cnt.get("not_stored:incomplete") != 0 {
		t.Fatalf("abandoned: entry %v, counters %v", res.Capture.Entry(), cnt)
	}

	// The follower's miss, answered: Entry is what was stored.
	rec := httptest.NewRecorder()
	w := follower.Capture.Wrap(rec)
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, fakeJSON("x"))
	if follower.Capture.Entry() != nil {
		t.Fatal("Entry before Finish")
	}
	follower.Capture.Finish()
	e := follower.Capture.Entry()
	if e == nil || string(e.Body) != fakeJSON("x") {
		t.Fatalf("Entry after Finish = %+v", e)
	}
	hit, err := c.Lookup(ctx, req)
	if err != nil || hit.Outcome != Hit || hit.Entry != e {
		t.Fatalf("lookup after the store: %v %v (the stored entry is Entry's)", hit.Outcome, err)
	}

	// ReplayAs writes the header value it is given, the bytes unchanged.
	out := httptest.NewRecorder()
	if err := ReplayAs(out, e, time.Second, "semantic"); err != nil {
		t.Fatal(err)
	}
	if got := out.Header().Get(HeaderCache); got != "semantic" {
		t.Errorf("%s = %q, want semantic", HeaderCache, got)
	}
	if !bytes.Equal(out.Body.Bytes(), e.Body) || out.Code != http.StatusOK {
		t.Errorf("ReplayAs wrote %d %q", out.Code, out.Body.Bytes())
	}
}
