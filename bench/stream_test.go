package bench

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/internal/openai"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/workload"
)

// runAgainst runs n requests of w1 against h, inside a synctest bubble.
func runAgainst(t *testing.T, n int, h http.Handler) *Output {
	t.Helper()
	var out *Output
	synctest.Test(t, func(t *testing.T) {
		client, stop := serve(t, h)
		defer stop()
		src, err := workload.New(w1(t, n, 2))
		if err != nil {
			t.Fatal(err)
		}
		out, err = Run(context.Background(), Config{BaseURL: "http://x", Source: src, Client: client, PreciseWindow: -1})
		if err != nil {
			t.Fatal(err)
		}
	})
	return out
}

// streamer writes events 10 ms apart, each flushed, optionally a byte at a
// time (so every event is split inside "data: " and its JSON).
func streamer(bytewise bool, events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for _, e := range events {
			time.Sleep(10 * time.Millisecond)
			if !bytewise {
				w.Write([]byte(e))
				fl.Flush()
				continue
			}
			for i := range len(e) {
				w.Write([]byte{e[i]})
				fl.Flush()
			}
		}
	}
}

// llm-d-inference-sim ends a stream with a chunk that carries only the
// finish reason: it is no token, and the request completes with the
// usage's counts and its last token's time as its end.
func TestFinishOnlyChunk(t *testing.T) {
	for _, bytewise := range []bool{false, true} {
		out := runAgainst(t, 5, streamer(bytewise,
			`data: {"id":"c","object":"text_completion","choices":[{"index":0,"finish_reason":null,"text":"Today"}]}`+"\n\n",
			`data: {"id":"c","object":"text_completion","choices":[{"index":0,"finish_reason":null,"text":" is"}]}`+"\r\n\r\n",
			`data: {"id":"c","object":"text_completion","choices":[{"index":0,"finish_reason":null,"text":" nice"}]}`+"\n\n",
			`data: {"id":"c","object":"text_completion","choices":[{"index":0,"finish_reason":"stop","text":""}]}`+"\n\n",
			`data: {"id":"c","object":"text_completion","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}`+"\n\n",
			"data: [DONE]\n\n"))
		if out.Summary.Completed != 5 {
			t.Fatalf("bytewise %v: %d completed, errors %v", bytewise, out.Summary.Completed, out.Errors)
		}
		for _, r := range out.Records {
			// Tokens at 10, 20, 30 ms; the finish-only chunk at 40 ms is none.
			if r.OutputTokens != 3 || r.PromptTokens != 9 || r.FirstToken-r.Arrival != 10*time.Millisecond || r.End-r.Arrival != 30*time.Millisecond {
				t.Errorf("bytewise %v: record %+v", bytewise, r)
			}
		}
		if out.Summary.ITL.P50 != 10 {
			t.Errorf("bytewise %v: ITL p50 %v ms, want 10 (two gaps a request, no gap to the finish-only chunk)", bytewise, out.Summary.ITL.P50)
		}
	}
}

// A reasoning model's first token is its first reasoning delta; the answer
// quoted by later turns is its content only.
func TestReasoningCountsAsTokens(t *testing.T) {
	out := runAgainst(t, 3, streamer(false,
		`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n",
		`data: {"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}`+"\n\n",
		`data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"length"}]}`+"\n\n",
		`data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":2}}}`+"\n\n",
		"data: [DONE]\n\n"))
	if out.Summary.Completed != 3 {
		t.Fatalf("%d completed, errors %v", out.Summary.Completed, out.Errors)
	}
	for _, r := range out.Records {
		if r.FirstToken-r.Arrival != 20*time.Millisecond || r.CachedTokens != 2 {
			t.Errorf("record %+v: want the first token at the reasoning delta (20 ms), 2 cached", r)
		}
	}
}

// Failures inside a 200 response are counted by what went wrong.
func TestStreamFailures(t *testing.T) {
	text := `data: {"choices":[{"index":0,"text":"a"}]}` + "\n\n"
	for _, c := range []struct {
		name   string
		events []string
		reason string
	}{
		{"vLLM error event", []string{text, string(openai.AppendErrorEvent(nil, "Internal server error", "InternalServerError", 500))}, "stream error: InternalServerError"},
		{"no [DONE]", []string{text}, "stream ended early"},
		{"not JSON", []string{text, "data: {oops\n\n", "data: [DONE]\n\n"}, "bad stream event"},
	} {
		out := runAgainst(t, 4, streamer(false, c.events...))
		if out.Errors[c.reason] != 4 || out.Summary.Completed != 0 {
			t.Errorf("%s: errors %v, %d completed; want 4 %q", c.name, out.Errors, out.Summary.Completed, c.reason)
		}
	}
}

// bench --json prints Output.Report: the summary's fields flat, as sim
// prints them, and the send lag and error reasons a summary has no room for.
func TestReportJSON(t *testing.T) {
	var calls atomic.Int64
	ok := streamer(false, `data: {"choices":[{"index":0,"text":"a"}]}`+"\n\n", "data: [DONE]\n\n")
	out := runAgainst(t, 6, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1)%3 == 0 {
			http.Error(w, "no", http.StatusInternalServerError)
			return
		}
		ok(w, r)
	}))
	var buf strings.Builder
	if err := results.WriteJSON(&buf, out.Report()); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(buf.String()), &got); err != nil {
		t.Fatal(err)
	}
	errs, _ := got["errors"].(map[string]any)
	lag, _ := got["send_lag_ms"].(map[string]any)
	if errs["http 500"] != 2.0 || lag == nil || lag["p99"] == nil || got["ttft_ms"] == nil || got["completed"] != 4.0 {
		t.Errorf("report JSON lacks send lag, error reasons or the summary:\n%s", buf.String())
	}
	var empty Output
	if b, _ := json.Marshal(empty.Report()); !strings.Contains(string(b), `"errors":{}`) {
		t.Errorf("no errors encode as %s, want {}", b)
	}
}

// A server that ends its chunked response in a write after data: [DONE]
// (vLLM's does, and nginx relaying a stream): with CloseAtDone the
// response takes its connection with it, and every request dials again; by
// default the response is read to its end and the connection serves the
// next request.
func TestReadToEndKeepsConnection(t *testing.T) {
	h := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(`data: {"id":"c","object":"text_completion","choices":[{"index":0,"finish_reason":"length","text":"Today"}]}` + "\n\n"))
		w.Write([]byte("data: [DONE]\n\n"))
		w.(http.Flusher).Flush()
		time.Sleep(5 * time.Millisecond) // the chunked end comes later
	}
	for _, readToEnd := range []bool{false, true} {
		var dials atomic.Int64
		synctest.Test(t, func(t *testing.T) {
			client, stop := serve(t, http.HandlerFunc(h))
			defer stop()
			tr := client.Transport.(*http.Transport)
			dial := tr.DialContext
			tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				dials.Add(1)
				return dial(ctx, network, addr)
			}
			// Requests 1 s apart: each starts after the last has ended.
			src, err := workload.New(w1(t, 20, 1))
			if err != nil {
				t.Fatal(err)
			}
			out, err := Run(context.Background(), Config{BaseURL: "http://x", Source: src, Client: client, PreciseWindow: -1, CloseAtDone: !readToEnd})
			if err != nil {
				t.Fatal(err)
			}
			if out.Summary.Completed != 20 {
				t.Fatalf("read to end %v: %d completed, errors %v", readToEnd, out.Summary.Completed, out.Errors)
			}
		})
		switch n := dials.Load(); {
		case readToEnd && n > 2:
			t.Errorf("read to end: %d dials for 20 requests one after another, want the connection kept", n)
		case !readToEnd && n < 15:
			t.Errorf("closed at [DONE]: %d dials for 20 requests, want about one each (else this test shows nothing)", n)
		}
	}
}

// Reading to the end, a server that keeps a stream open after data: [DONE]
// costs each request openai.DoneGrace at most: the requests complete, their
// times are the stream's own, and the run ends without waiting for the
// server.
func TestReadToEndStreamHeldOpen(t *testing.T) {
	h := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		time.Sleep(10 * time.Millisecond)
		w.Write([]byte(`data: {"id":"c","object":"text_completion","choices":[{"index":0,"finish_reason":"length","text":"Today"}]}` + "\n\n"))
		w.Write([]byte("data: [DONE]\n\n"))
		w.(http.Flusher).Flush()
		select {
		case <-time.After(time.Hour):
		case <-r.Context().Done():
		}
	}
	synctest.Test(t, func(t *testing.T) {
		client, stop := serve(t, http.HandlerFunc(h))
		defer stop()
		src, err := workload.New(w1(t, 5, 1))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		out, err := Run(context.Background(), Config{BaseURL: "http://x", Source: src, Client: client, PreciseWindow: -1})
		if err != nil {
			t.Fatal(err)
		}
		if out.Summary.Completed != 5 {
			t.Fatalf("%d completed, errors %v", out.Summary.Completed, out.Errors)
		}
		for _, r := range out.Records {
			if r.FirstToken-r.Arrival != 10*time.Millisecond || r.End-r.Arrival != 10*time.Millisecond {
				t.Errorf("record %+v: want its first and last token 10 ms after arrival", r)
			}
		}
		// Five requests a second apart; the last one's end waits DoneGrace.
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("the run took %v: it waited for the held streams", took)
		}
	})
}
