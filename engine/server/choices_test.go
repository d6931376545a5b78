package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// choicesBody is a request body for path ("chat" or "completions") with n
// choices (n 0: the field left out).
func choicesBody(ts *testServer, chat bool, n int, extra map[string]any) map[string]any {
	b := map[string]any{"max_tokens": 12, "ignore_eos": true}
	if chat {
		b["messages"] = []map[string]any{{"role": "user", "content": words(ts.Server, 700, 40)}}
	} else {
		b["prompt"] = words(ts.Server, 700, 40)
	}
	if n != 0 {
		b["n"] = n
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func choicesPath(chat bool) string {
	if chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// fullChoice is one choice of a non-streamed answer of either endpoint.
type fullChoice struct {
	Index   int     `json:"index"`
	Text    *string `json:"text"`
	Message *struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"message"`
	FinishReason *string `json:"finish_reason"`
}

func (c fullChoice) content() string {
	if c.Message != nil {
		return c.Message.Content
	}
	if c.Text != nil {
		return *c.Text
	}
	return ""
}

type fullAnswer struct {
	Choices []fullChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

func postFull(t *testing.T, ts *testServer, chat bool, n int) fullAnswer {
	t.Helper()
	resp, b := postRaw(t, ts, choicesPath(chat), "", choicesBody(ts, chat, n, nil))
	if resp.StatusCode != 200 {
		t.Fatalf("n = %d: status %d: %s", n, resp.StatusCode, b)
	}
	var out fullAnswer
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return out
}

// n = 3 answers three choices in index order: choice 0 is what n = 1
// writes, the others differ; usage counts the prompt once and every
// choice's tokens.
func TestChoicesFull(t *testing.T) {
	for _, chat := range []bool{false, true} {
		t.Run(choicesPath(chat), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ts := startPipe(t, Config{Engine: testEngine(), EnablePromptTokensDetails: true})
				defer ts.stop()
				one := postFull(t, ts, chat, 0)
				three := postFull(t, ts, chat, 3)
				if len(one.Choices) != 1 || one.Choices[0].Index != 0 {
					t.Fatalf("n = 1: choices %+v", one.Choices)
				}
				if len(three.Choices) != 3 {
					t.Fatalf("n = 3: %d choices", len(three.Choices))
				}
				sum := 0
				for i, c := range three.Choices {
					if c.Index != i {
						t.Errorf("choice %d has index %d", i, c.Index)
					}
					if c.FinishReason == nil || *c.FinishReason != "length" {
						t.Errorf("choice %d: finish_reason %v, want length", i, c.FinishReason)
					}
					if chat && c.Message.Role != "assistant" {
						t.Errorf("choice %d: role %q", i, c.Message.Role)
					}
					k := len(ts.tok.Encode(c.content()))
					if k != 12 {
						t.Errorf("choice %d: %d tokens, want 12", i, k)
					}
					sum += k
				}
				texts := []string{three.Choices[0].content(), three.Choices[1].content(), three.Choices[2].content()}
				if texts[0] != one.Choices[0].content() {
					t.Errorf("choice 0 %q differs from n = 1's %q", texts[0], one.Choices[0].content())
				}
				if texts[1] == texts[0] || texts[2] == texts[0] || texts[1] == texts[2] {
					t.Errorf("choices are not distinct: %q", texts)
				}
				u := three.Usage
				if u.PromptTokens != one.Usage.PromptTokens || u.CompletionTokens != sum || u.TotalTokens != u.PromptTokens+sum {
					t.Errorf("usage %+v: want prompt %d once, completion %d", u, one.Usage.PromptTokens, sum)
				}
				// The first request left the prompt's blocks in the cache.
				if u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens == 0 {
					t.Errorf("usage %+v: no cached tokens for a repeated prompt", u)
				}
			})
		})
	}
}

// streamChunk is one stream event of either endpoint.
type streamChunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Index int     `json:"index"`
		Text  *string `json:"text"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *streamUsage `json:"usage"`
}

// checkChoicesStream checks the shape of an n-choice stream as vLLM writes
// it and returns each choice's text and the usage chunk's usage.
func checkChoicesStream(t *testing.T, evs []sseEvent, chat bool, n int) ([]string, streamUsage) {
	t.Helper()
	if len(evs) < 2 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %v", evs)
	}
	texts := make([]string, n)
	roles := make([]int, n)
	finished := make([]bool, n)
	var u *streamUsage
	for k, ev := range evs[:len(evs)-1] {
		var c streamChunk
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("event %d: %v: %s", k, err, ev.data)
		}
		if c.Usage != nil {
			if len(c.Choices) != 0 || u != nil || k != len(evs)-2 {
				t.Fatalf("event %d: usage chunk with %d choices, or not once and last: %s", k, len(c.Choices), ev.data)
			}
			for i, f := range finished {
				if !f {
					t.Fatalf("usage chunk before choice %d finished", i)
				}
			}
			u = c.Usage
			continue
		}
		if len(c.Choices) != 1 {
			t.Fatalf("event %d carries %d choices: %s", k, len(c.Choices), ev.data)
		}
		ch := c.Choices[0]
		i := ch.Index
		if i < 0 || i >= n {
			t.Fatalf("event %d: index %d: %s", k, i, ev.data)
		}
		if finished[i] {
			t.Fatalf("event %d: choice %d goes on after its finish_reason: %s", k, i, ev.data)
		}
		if chat {
			if ch.Delta == nil {
				t.Fatalf("event %d: no delta: %s", k, ev.data)
			}
			if ch.Delta.Role != nil {
				if *ch.Delta.Role != "assistant" || roles[i] > 0 || texts[i] != "" || ch.FinishReason != nil {
					t.Fatalf("event %d: role chunk out of place: %s", k, ev.data)
				}
				roles[i]++
				continue
			}
			if roles[i] == 0 {
				t.Fatalf("event %d: content of choice %d before its role chunk: %s", k, i, ev.data)
			}
			texts[i] += *ch.Delta.Content
		} else {
			texts[i] += *ch.Text
		}
		if ch.FinishReason != nil {
			if *ch.FinishReason != "length" {
				t.Errorf("choice %d: finish_reason %q", i, *ch.FinishReason)
			}
			finished[i] = true
		}
	}
	for i := range n {
		if !finished[i] {
			t.Errorf("choice %d has no finish_reason", i)
		}
	}
	if u == nil {
		t.Fatal("no usage chunk")
	}
	return texts, *u
}

// readFirst reads a stream's first event, calls then, and reads the rest.
func readFirst(r io.Reader, then func()) ([]sseEvent, error) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, err
		}
		if data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok {
			then()
			rest, err := readSSE(br)
			return append([]sseEvent{{data: data}}, rest...), err
		}
	}
}

// n = 3 streamed: one choice per chunk, by index, a role chunk per choice
// (chat), a finish_reason closing each, one usage chunk summing them, then
// [DONE]; the engine runs the three as three requests.
func TestChoicesStream(t *testing.T) {
	for _, chat := range []bool{false, true} {
		t.Run(choicesPath(chat), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ts := startPipe(t, Config{Engine: testEngine()})
				defer ts.stop()
				full := postFull(t, ts, chat, 3)
				resp, err := ts.post(context.Background(), choicesPath(chat), choicesBody(ts, chat, 3, map[string]any{
					"stream": true, "stream_options": map[string]any{"include_usage": true},
				}))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				running := -1
				evs, err := readFirst(resp.Body, func() { running = ts.met.snapshot.Load().Running })
				if err != nil {
					t.Fatal(err)
				}
				if running != 3 {
					t.Errorf("the engine runs %d requests while n = 3 streams, want 3", running)
				}
				texts, u := checkChoicesStream(t, evs, chat, 3)
				sum := 0
				for i, text := range texts {
					if text != full.Choices[i].content() {
						t.Errorf("choice %d streamed %q, answered whole %q", i, text, full.Choices[i].content())
					}
					sum += len(ts.tok.Encode(text))
				}
				if sum != 36 || u.CompletionTokens != sum || u.PromptTokens != full.Usage.PromptTokens || u.TotalTokens != u.PromptTokens+sum {
					t.Errorf("usage %+v: want completion %d (36), prompt %d", u, sum, full.Usage.PromptTokens)
				}
				if m := ts.met.snapshot.Load(); m.Running+m.Waiting != 0 {
					t.Errorf("the engine holds %d requests after the stream", m.Running+m.Waiting)
				}
			})
		})
	}
}

// A client that leaves an n = 3 stream aborts every choice's request.
func TestChoicesDisconnect(t *testing.T) {
	for _, chat := range []bool{false, true} {
		t.Run(choicesPath(chat), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ts := startPipe(t, Config{Engine: testEngine()})
				defer ts.stop()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				resp, err := ts.post(ctx, choicesPath(chat), choicesBody(ts, chat, 3, map[string]any{"stream": true, "max_tokens": 500}))
				if err != nil {
					t.Fatal(err)
				}
				running := -1
				readFirst(resp.Body, func() {
					running = ts.met.snapshot.Load().Running
					cancel()
				})
				resp.Body.Close()
				if running != 3 {
					t.Fatalf("the engine runs %d requests before the disconnect, want 3", running)
				}
				synctest.Wait()
				m := ts.met.snapshot.Load()
				if m.Running+m.Waiting != 0 || m.UsedBlocks != 0 {
					t.Fatalf("after the disconnect the engine holds %d requests and %d blocks", m.Running+m.Waiting, m.UsedBlocks)
				}
				if m.RequestsAborted != 3 {
					t.Fatalf("aborted %d requests, want 3", m.RequestsAborted)
				}
			})
		})
	}
}

// The stall fault stops choice 0 only: the others stream to their end, the
// stream never ends, and leaving it frees the engine.
func TestChoicesStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), Faults: Faults{StallRate: 1}})
		defer ts.stop()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp, err := ts.post(ctx, "/v1/completions", choicesBody(ts, false, 3, map[string]any{"stream": true}))
		if err != nil {
			t.Fatal(err)
		}
		evs := make(chan string, 100)
		go func() {
			defer close(evs)
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					evs <- data
				}
			}
		}()
		tokens := make([]int, 3)
		finished := make([]bool, 3)
		take := func(data string) {
			var c streamChunk
			if data == "[DONE]" || json.Unmarshal([]byte(data), &c) != nil || len(c.Choices) != 1 {
				t.Fatalf("stalled stream wrote %s", data)
			}
			tokens[c.Choices[0].Index] += len(ts.tok.Encode(*c.Choices[0].Text))
			finished[c.Choices[0].Index] = c.Choices[0].FinishReason != nil
		}
		for !finished[1] || !finished[2] {
			data, ok := <-evs
			if !ok {
				t.Fatalf("stream ended: tokens %v, finished %v", tokens, finished)
			}
			take(data)
		}
		// Nothing more comes, however long the client waits.
		time.Sleep(time.Minute)
		synctest.Wait()
	more:
		for {
			select {
			case data := <-evs:
				take(data)
			default:
				break more
			}
		}
		if tokens[0] != 6 || finished[0] || tokens[1] != 12 || !finished[1] || tokens[2] != 12 || !finished[2] {
			t.Fatalf("stalled stream: tokens %v, finished %v; want choice 0 stopped at 6 of 12, the others done", tokens, finished)
		}
		if m := ts.met.snapshot.Load(); m.Running+m.Waiting != 0 {
			t.Fatalf("the engine holds %d requests during the stall", m.Running+m.Waiting)
		}
		cancel()
		resp.Body.Close()
		for range evs {
		}
	})
}

// An engine that stops while an n = 3 stream runs ends it with an error
// event and [DONE].
func TestChoicesEngineFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine()})
		defer ts.stop()
		resp, err := ts.post(context.Background(), "/v1/chat/completions", choicesBody(ts, true, 3, map[string]any{"stream": true, "max_tokens": 1000}))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		evs, err := readFirst(resp.Body, ts.halt)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) < 3 || evs[len(evs)-1].data != "[DONE]" || !strings.Contains(evs[len(evs)-2].data, `"error"`) {
			t.Fatalf("stream after the engine stopped: %v", evs)
		}
		for _, ev := range evs[:len(evs)-2] {
			if strings.Contains(ev.data, `"error"`) {
				t.Fatalf("error event before the last: %v", evs)
			}
		}
	})
}

// n is refused as vLLM refuses it (n < 1), above max_num_seqs, and with
// kv_transfer_params; n = max_num_seqs is served.
func TestChoicesRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Engine: testEngine()}
		cfg.Engine.MaxNumSeqs = 4
		ts := startPipe(t, cfg)
		defer ts.stop()
		for _, chat := range []bool{false, true} {
			for _, tc := range []struct {
				extra map[string]any
				param string
				msg   string
			}{
				{map[string]any{"n": 0}, "n", "n must be at least 1, got 0."},
				{map[string]any{"n": -1}, "n", "n must be at least 1, got -1."},
				{map[string]any{"n": 1.5}, "n", "invalid type"},
				{map[string]any{"n": "2"}, "n", "invalid type"},
				{map[string]any{"n": 5}, "n", "max_num_seqs"},
				{map[string]any{"n": 2, "kv_transfer_params": map[string]any{"do_remote_decode": true}}, "kv_transfer_params", "n = 2"},
			} {
				resp, b := postRaw(t, ts, choicesPath(chat), "", choicesBody(ts, chat, 0, tc.extra))
				var e errorResponse
				if resp.StatusCode != 400 || json.Unmarshal(b, &e) != nil || e.Error.Param == nil || *e.Error.Param != tc.param || !strings.Contains(e.Error.Message, tc.msg) {
					t.Errorf("%s %v: %d %s; want 400, param %q, message with %q", choicesPath(chat), tc.extra, resp.StatusCode, b, tc.param, tc.msg)
				}
			}
			if got := postFull(t, ts, chat, 4); len(got.Choices) != 4 {
				t.Errorf("n = max_num_seqs: %d choices", len(got.Choices))
			}
			// n = 1 with kv_transfer_params stays a P/D request.
			resp, b := postRaw(t, ts, choicesPath(chat), "", choicesBody(ts, chat, 1, map[string]any{"kv_transfer_params": map[string]any{"do_remote_decode": true}}))
			if resp.StatusCode != 200 {
				t.Errorf("n = 1 with kv_transfer_params: %d %s", resp.StatusCode, b)
			}
		}
	})
}

// A request the engine cannot hold is refused for every choice, and no
// choice stays in the engine.
func TestChoicesEngineRefuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Engine: testEngine()}
		cfg.Engine.NumGPUBlocks = 8 // 128 tokens: less than prompt + output
		ts := startPipe(t, cfg)
		defer ts.stop()
		resp, b := postRaw(t, ts, "/v1/completions", "", map[string]any{"prompt": words(ts.Server, 1, 200), "max_tokens": 10, "n": 3})
		var e errorResponse
		if resp.StatusCode != 400 || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error.Message, "KV blocks") {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		synctest.Wait()
		if m := ts.met.snapshot.Load(); m.Running+m.Waiting != 0 || m.UsedBlocks != 0 {
			t.Fatalf("the engine holds %d requests and %d blocks after refusing", m.Running+m.Waiting, m.UsedBlocks)
		}
	})
}

// A child the engine refuses after others were added takes them out with
// it: the request is answered as add answers, and nothing stays.
func TestChoicesRollback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine()})
		defer ts.stop()
		g := &generation{model: DefaultModelName, prompt: ts.tok.Encode(words(ts.Server, 5, 40)), maxTokens: 50, n: 3}
		kids := ts.newChoices(g, ts.newActive(g))
		kids[2].id = kids[0].id // the engine refuses a duplicate id
		w := httptest.NewRecorder()
		if ts.add(w, kids...) || w.Code != 500 || !strings.Contains(w.Body.String(), "duplicate") {
			t.Fatalf("added, or answered %d %s", w.Code, w.Body)
		}
		synctest.Wait()
		if m := ts.met.snapshot.Load(); m.Running+m.Waiting != 0 || m.UsedBlocks != 0 || m.RequestsAborted != 2 {
			t.Fatalf("after the refusal the engine holds %d requests and %d blocks, aborted %d (want 0, 0, 2)", m.Running+m.Waiting, m.UsedBlocks, m.RequestsAborted)
		}
	})
}

// The per-choice seed changes only choices after the first.
func TestChoiceSeeds(t *testing.T) {
	s, err := New(Config{Engine: testEngine()})
	if err != nil {
		t.Fatal(err)
	}
	g := &generation{model: DefaultModelName, prompt: s.tok.Encode(words(s, 5, 30)), maxTokens: 8, ignoreEOS: true, n: 3}
	a := s.newActive(g)
	kids := s.newChoices(g, a)
	b := s.newChoice(g, 0, nil)
	if fmt.Sprint(a.tokens) != fmt.Sprint(b.tokens) || fmt.Sprint(a.hashes) != fmt.Sprint(b.hashes) {
		t.Fatal("choice 0 is not the n = 1 request")
	}
	for i, k := range kids {
		if k.notify != a.notify {
			t.Errorf("choice %d has its own notify channel", i)
		}
		if fmt.Sprint(k.hashes[:1]) != fmt.Sprint(a.hashes[:1]) {
			t.Errorf("choice %d's prompt blocks hash differently", i)
		}
		if i > 0 && fmt.Sprint(k.tokens[30:]) == fmt.Sprint(a.tokens[30:]) {
			t.Errorf("choice %d writes choice 0's output", i)
		}
	}
}

// The handler's cost per request on wall-clock time (engine steps included),
// for n = 1 and n = 4, streamed and not.
func BenchmarkServe(b *testing.B) {
	for _, n := range []int{1, 4} {
		for _, stream := range []bool{false, true} {
			b.Run(fmt.Sprintf("n=%d/stream=%v", n, stream), func(b *testing.B) {
				s, err := New(Config{Engine: testEngine()})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { s.Run(ctx); close(done) }()
				defer func() { cancel(); <-done }()
				h := s.Handler()
				body := fmt.Appendf(nil, `{"prompt": %q, "max_tokens": 4, "ignore_eos": true, "stream": %v, "n": %d}`, words(s, 100, 40), stream, n)
				b.ReportAllocs()
				for b.Loop() {
					w := httptest.NewRecorder()
					h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/completions", bytes.NewReader(body)))
					if w.Code != 200 {
						b.Fatalf("status %d: %s", w.Code, w.Body)
					}
				}
			})
		}
	}
}
