package live

import (
	"encoding/json"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// readFields agrees with encoding/json on every valid object, and on the
// fields it reads.
func TestReadFieldsMatchesEncodingJSON(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		obj := map[string]any{}
		keys := rapid.SliceOfN(rapid.SampledFrom([]string{"model", "prompt", "cache_salt", "user", "stream", "messages", "max_tokens", "max_completion_tokens", "x\"y", "é"}), 0, 8).Draw(t, "keys")
		for _, k := range keys {
			switch rapid.IntRange(0, 5).Draw(t, "kind") {
			case 0:
				obj[k] = rapid.String().Draw(t, "s")
			case 1:
				obj[k] = rapid.Int().Draw(t, "n")
			case 2:
				obj[k] = []any{rapid.String().Draw(t, "a"), map[string]any{"k": []any{1.5, nil, true}}}
			case 3:
				obj[k] = nil
			case 4:
				obj[k] = map[string]any{"role": "user", "content": rapid.String().Draw(t, "c")}
			default:
				obj[k] = rapid.Bool().Draw(t, "b")
			}
		}
		body, _ := json.MarshalIndent(obj, "", rapid.SampledFrom([]string{"", " ", "\t"}).Draw(t, "indent"))
		f, err := readFields(body)
		var want struct {
			Model     any `json:"model"`
			CacheSalt any `json:"cache_salt"`
		}
		json.Unmarshal(body, &want)
		ms, isStr := want.Model.(string)
		switch {
		case want.Model != nil && !isStr:
			if err == nil {
				t.Fatalf("non-string model %v accepted", want.Model)
			}
			return
		case want.CacheSalt != nil:
			if _, ok := want.CacheSalt.(string); !ok {
				return // an error either way
			}
		}
		if _, bad := obj["user"].(string); !bad && obj["user"] != nil {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if isStr && (f.Model == nil || *f.Model != ms) {
			t.Fatalf("model %v, want %q", f.Model, ms)
		}
		for key, got := range map[string]int{"max_tokens": f.MaxTokens, "max_completion_tokens": f.MaxCompletionTokens} {
			want := 0
			if n, ok := obj[key].(int); ok && n >= 0 && n <= maxCount {
				want = n
			}
			if got != want {
				t.Fatalf("%s: %d, want %d (%s)", key, got, want, body)
			}
		}
		if isStr {
			out := rewriteModel(body, f, "renamed")
			var back map[string]any
			if err := json.Unmarshal(out, &back); err != nil || back["model"] != "renamed" || len(back) != len(obj) {
				t.Fatalf("rewrite: %s (%v)", out, err)
			}
		}
	})
}

// max_tokens (and for chat max_completion_tokens, which wins as in vLLM)
// is read when it is a count; anything else is left for the engine.
func TestReadFieldsMaxTokens(t *testing.T) {
	cases := []struct {
		body       string
		chat, comp int
	}{
		{`{"prompt": "x"}`, 0, 0},
		{`{"max_tokens": 16}`, 16, 16},
		{`{"max_tokens": 16, "max_completion_tokens": 32}`, 32, 16},
		{`{"max_completion_tokens": 32}`, 32, 0},
		{`{"max_completion_tokens": 0, "max_tokens": 7}`, 7, 7},
		{`{"max_tokens": null}`, 0, 0},
		{`{"max_tokens": -1}`, 0, 0},
		{`{"max_tokens": 1.5}`, 0, 0},
		// Read as vLLM's validation reads them (pydantic's lax mode).
		{`{"max_tokens": 1e3}`, 1000, 1000},
		{`{"max_tokens": 16.0}`, 16, 16},
		{`{"max_tokens": "16"}`, 16, 16},
		{`{"max_tokens": "16.0"}`, 16, 16},
		{`{"max_tokens": "1 6"}`, 0, 0},
		{`{"max_tokens": "Inf"}`, 0, 0},
		{`{"max_tokens": "0x10"}`, 0, 0},
		{`{"max_tokens": 1e300}`, 0, 0},
		{`{"max_tokens": 99999999999999999999}`, 0, 0},
		{`{"messages": [{"max_tokens": 5}], "max_tokens" : 9}`, 9, 9},
	}
	for _, c := range cases {
		f, err := readFields([]byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		n, _ := readFields([]byte(strings.ReplaceAll(strings.ReplaceAll(c.body, `"max_completion_tokens"`, `"x"`), `"max_tokens"`, `"n"`)))
		if n.N != c.comp {
			t.Errorf("%s as n: %d, want %d", c.body, n.N, c.comp)
		}
		if got := f.maxTokens(opChat); got != c.chat {
			t.Errorf("%s: chat max tokens %d, want %d", c.body, got, c.chat)
		}
		if got := f.maxTokens(opCompletion); got != c.comp {
			t.Errorf("%s: completion max tokens %d, want %d", c.body, got, c.comp)
		}
	}
}

func TestReadFieldsRejects(t *testing.T) {
	for _, b := range []string{``, `[]`, `"x"`, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{"a":1} x`, `{"model": 5}`, `{"a": tru}`, `{"a": "x}`, strings.Repeat("[", 600) + strings.Repeat("]", 600)} {
		if _, err := readFields([]byte(b)); err == nil {
			t.Errorf("%.40q accepted", b)
		}
	}
}

// Item 13 of the hardening issue: JSON nested deeper than any fixed cap, in
// a field the proxy never reads, passes as it does to vLLM; a broken one
// at depth is still refused.
func TestReadFieldsAnyDepth(t *testing.T) {
	const depth = 100000
	deep := `{"model": "m", "tools": ` + strings.Repeat(`[{"a":`, depth) + `1` + strings.Repeat(`}]`, depth) + `, "prompt": "hi"}`
	f, err := readFields([]byte(deep))
	if err != nil {
		t.Fatalf("nested %d deep: %v", depth, err)
	}
	if f.Model == nil || *f.Model != "m" || string(f.Prompt) != `"hi"` {
		t.Fatalf("fields after the deep value misread: %+v", f)
	}
	for _, bad := range []string{
		`{"x": ` + strings.Repeat(`[`, depth) + strings.Repeat(`]`, depth-1) + `}`,
		`{"x": ` + strings.Repeat(`{"a":`, depth) + `1` + strings.Repeat(`}`, depth) + `]}`,
		`{"x": [1, {"a" 1}]}`,
	} {
		if _, err := readFields([]byte(bad)); err == nil {
			t.Errorf("%.60q... accepted", bad)
		}
	}
}

func FuzzReadFields(f *testing.F) {
	f.Add([]byte(`{"model": "m", "prompt": "hi", "messages": [{"role": "user"}]}`))
	f.Add([]byte(`{"a": [1, {"b": "\"}"}], "model": "x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		f, err := readFields(b)
		if err == nil && json.Valid(b) && f.Model != nil {
			out := rewriteModel(b, f, "z")
			if !json.Valid(out) {
				t.Fatalf("rewrite of valid %q is invalid: %q", b, out)
			}
		}
	})
}

func BenchmarkReadFields(b *testing.B) {
	body, _ := json.Marshal(map[string]any{"model": "llama", "messages": []map[string]string{{"role": "system", "content": strings.Repeat("word ", 6000)}, {"role": "user", "content": "hi"}}, "max_tokens": 100, "stream": true})
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		readFields(body)
	}
}

// The fast path for plain prompts gives what encoding/json gives.
func TestCompletionPromptFastPath(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := rapid.String().Draw(t, "prompt")
		raw, _ := json.Marshal(p)
		got, ok := completionPrompt(raw)
		if !ok || got != p {
			t.Fatalf("%q -> %q, %v", p, got, ok)
		}
	})
	if _, ok := completionPrompt([]byte(`"a\u00e9"`)); !ok {
		t.Fatal("escaped prompt refused")
	}
}

// An answer's text is read back whatever the reads' boundaries, from a
// stream or from a whole body.
func TestAnswerText(t *testing.T) {
	sse := "data: {\"choices\":[{\"index\":0,\"text\":\"ab \"}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"cd\\n\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n"
	rapid.Check(t, func(t *rapid.T) {
		a := newAnswer(true, true)
		rest := []byte(sse)
		for len(rest) > 0 {
			n := rapid.IntRange(1, len(rest)).Draw(t, "n")
			a.feed(rest[:n])
			rest = rest[n:]
		}
		if text, ok := a.finish(); !ok || string(text) != "ab cd\n" {
			t.Fatalf("%q, %v", text, ok)
		}
	})
	a := newAnswer(false, true)
	a.feed([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"whole"}}]}`))
	if text, ok := a.finish(); !ok || string(text) != "whole" {
		t.Fatalf("body: %q, %v", text, ok)
	}
	a = newAnswer(false, true)
	a.feed([]byte(`not json`))
	if _, ok := a.finish(); ok {
		t.Fatal("garbage read as an answer")
	}
}

// The fast read of an event's text agrees with decoding it.
func TestAnswerFastPath(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		text := rapid.String().Draw(t, "text")
		var ev any
		if rapid.Bool().Draw(t, "chat") {
			ev = map[string]any{"id": "x", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": text}, "logprobs": nil}}}
		} else {
			ev = map[string]any{"id": "x", "choices": []any{map[string]any{"index": 0, "text": text, "finish_reason": nil}}}
		}
		b, _ := json.Marshal(ev)
		a := newAnswer(true, true)
		a.feed(append(append([]byte("data: "), b...), "\n\n"...))
		if got, ok := a.finish(); !ok || string(got) != text {
			t.Fatalf("%s: %q", b, got)
		}
	})
}

// An answer's length comes from the engine's usage where it sends one
// (last in a body, in its own event in a stream), else from the events that
// carried text; a body is kept only by its tail when its text is not needed.
func TestAnswerLength(t *testing.T) {
	sse := "data: {\"choices\":[{\"index\":0,\"text\":\"ab \"}],\"usage\":null}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"text\":\"cd\"}],\"usage\":null}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n"
	rapid.Check(t, func(t *rapid.T) {
		usage := rapid.Bool().Draw(t, "usage")
		body := sse
		if !usage {
			body = sse[:strings.Index(sse, "data: {\"choices\":[],")]
		}
		a := newAnswer(true, rapid.Bool().Draw(t, "keep"))
		rest := []byte(body)
		for len(rest) > 0 {
			n := rapid.IntRange(1, len(rest)).Draw(t, "n")
			a.feed(rest[:n])
			rest = rest[n:]
		}
		a.finish()
		n, ok := a.outputTokens(-1)
		want := 2 // events with text
		if usage {
			want = 3
		}
		if !ok || n != want {
			t.Fatalf("usage %v: %d tokens (%v), want %d", usage, n, ok, want)
		}
		if usage && a.cached != 4 {
			t.Fatalf("cached %d, want 4", a.cached)
		}
	})
	a := newAnswer(false, false)
	a.feed([]byte(`{"choices":[{"index":0,"text":"` + strings.Repeat("x", 100000) + `"}],`))
	a.feed([]byte(`"usage":{"prompt_tokens":5,"completion_tokens":17}}`))
	if len(a.pending) > 2*bodyTail {
		t.Fatalf("kept %d bytes of a body whose text is not needed", len(a.pending))
	}
	a.finish()
	if n, ok := a.outputTokens(-1); !ok || n != 17 {
		t.Fatalf("body usage: %d, %v", n, ok)
	}
	if n, ok := a.promptTokens(); !ok || n != 5 {
		t.Fatalf("body usage's prompt_tokens: %d, %v; want 5", n, ok)
	}
}

// An answer taken from the pool reads a response exactly as a fresh one:
// nothing of the responses it read before (their text, usage, [DONE], a
// broken stream, a non-streamed body) is left in it.
func TestPooledAnswerIsFresh(t *testing.T) {
	responses := []struct {
		stream bool
		body   string
	}{
		{true, "data: {\"choices\":[{\"index\":0,\"text\":\"ab \"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\ndata: [DONE]\n\n"},
		{true, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"choi"},
		{true, "data: not json\n\n"},
		{true, "data: {\"choices\":[{\"index\":0,\"text\":\"" + strings.Repeat("long ", 20000) + "\"}]}\n\n"},
		{false, `{"choices":[{"index":0,"message":{"role":"assistant","content":"whole"}}],"usage":{"prompt_tokens":4,"completion_tokens":2}}`},
		{false, `not json`},
	}
	type read struct {
		text             string
		ok, done, over   bool
		completion, hits int
		out, prompt      int
		known            bool
	}
	readWith := func(a *answer, body string, cut int) read {
		for b := []byte(body); len(b) > 0; {
			n := min(cut, len(b))
			a.feed(b[:n])
			b = b[n:]
		}
		text, ok := a.finish()
		out, known := a.outputTokens(-1)
		prompt, _ := a.promptTokens()
		return read{string(text), ok, a.done, a.over, a.completion, a.cached, out, prompt, known}
	}
	rapid.Check(t, func(t *rapid.T) {
		for range rapid.IntRange(1, 8).Draw(t, "responses") {
			r := responses[rapid.IntRange(0, len(responses)-1).Draw(t, "response")]
			keep := rapid.Bool().Draw(t, "keepText")
			cut := rapid.IntRange(1, 64).Draw(t, "cut")
			pooled := newAnswer(r.stream, keep)
			got := readWith(pooled, r.body, cut)
			pooled.release()
			fresh := &answer{}
			*fresh = answer{stream: r.stream, keepText: keep, whole: keep, completion: -1, cached: -1, prompt: -1, total: -1}
			fresh.a.MaxText = maxAnswerBytes
			if !keep {
				fresh.a.MaxText = -1
			}
			fresh.r.MaxEventBytes = 4 * maxAnswerBytes
			if want := readWith(fresh, r.body, cut); got != want {
				t.Fatalf("pooled %+v, fresh %+v", got, want)
			}
		}
	})
}
