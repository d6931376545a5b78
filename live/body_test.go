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
		keys := rapid.SliceOfN(rapid.SampledFrom([]string{"model", "prompt", "cache_salt", "user", "stream", "messages", "max_tokens", "x\"y", "é"}), 0, 8).Draw(t, "keys")
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
		if isStr {
			out := rewriteModel(body, f, "renamed")
			var back map[string]any
			if err := json.Unmarshal(out, &back); err != nil || back["model"] != "renamed" || len(back) != len(obj) {
				t.Fatalf("rewrite: %s (%v)", out, err)
			}
		}
	})
}

func TestReadFieldsRejects(t *testing.T) {
	for _, b := range []string{``, `[]`, `"x"`, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{"a":1} x`, `{"model": 5}`, `{"a": tru}`, `{"a": "x}`, strings.Repeat("[", 600) + strings.Repeat("]", 600)} {
		if _, err := readFields([]byte(b)); err == nil {
			t.Errorf("%.40q accepted", b)
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
		a := &answer{stream: true}
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
	a := &answer{}
	a.feed([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"whole"}}]}`))
	if text, ok := a.finish(); !ok || string(text) != "whole" {
		t.Fatalf("body: %q, %v", text, ok)
	}
	a = &answer{}
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
		a := &answer{stream: true}
		a.feed(append(append([]byte("data: "), b...), "\n\n"...))
		if got, ok := a.finish(); !ok || string(got) != text {
			t.Fatalf("%s: %q", b, got)
		}
	})
}
