package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// FuzzReader feeds a stream in chunks whose sizes come from cuts: the
// reader must not panic, must give the same events (and error) as when fed
// the whole stream at once, and must stamp each event with the reading of
// the chunk that held the byte completing it.
func FuzzReader(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.sse"))
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, []byte{7, 1, 200})
	}
	f.Add([]byte("data: [DONE]\r"), []byte{12})
	f.Add([]byte("\xef\xbb\xbfdata: {}\r\n\r\n"), []byte{1})
	f.Add([]byte("data: {\"choices\":[{\"text\":\"\\ud83d\\ude00\xf0\x9f\x98\x80\"}]}\n\n"), []byte{3, 5})
	f.Fuzz(func(t *testing.T, stream, cuts []byte) {
		if len(cuts) == 0 {
			cuts = []byte{1}
		}
		sizes := make([]int, len(cuts))
		for i, c := range cuts {
			sizes[i] = int(c)%64 + 1
		}
		whole, errWhole := readAll(stream)
		split, errSplit := readAll(stream, sizes...)
		if !sameEvents(whole, split) || fmt.Sprint(errWhole) != fmt.Sprint(errSplit) {
			t.Fatalf("whole:\n%s\nin chunks of %v:\n%s", render(whole, errWhole), sizes, render(split, errSplit))
		}
		// Every chunk's reading is its index; an event is complete when the
		// line end of its blank line (or the stream's end) arrives, so its
		// At never decreases and is at most the last chunk's.
		chunks := 0
		for n, k := len(stream), 0; n > 0; k++ {
			n -= min(n, sizes[k%len(sizes)])
			chunks++
		}
		var last time.Duration
		for _, e := range split {
			if e.At < last || e.At > time.Duration(chunks)*time.Millisecond {
				t.Fatalf("event at %v after one at %v, %d chunks", e.At, last, chunks)
			}
			last = e.At
		}
	})
}

// FuzzDecode checks the decoder against encoding/json: it accepts exactly
// the JSON objects encoding/json accepts, and reads the same fields.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"index":0,"text":" a","finish_reason":null}]}`,
		`{"choices":[{"delta":{"content":"\u00e9","reasoning_content":"r"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":2}}}`,
		`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}`,
		`{"error": {"message": "x", "type": "InternalServerError", "param": null, "code": 500}}`,
		`{"object":"error","message":"m","code":"c","param":"p"}`,
		`{"choices":[{"text":"a","text":null,"delta":{"content":"b"}}],"usage":{"prompt_tokens":1e3}}`,
		`{"choices":[{"message":{"content":"\ud800\u0041"}}], "x": [1, {"y": -0.5e-3}, true, false, null]}`,
		"{\"choices\":[{\"text\":\"\xff\xfe\"}]}",
		`[1]`, `{"a":1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseResponse(data)
		want, ok := reference(data)
		if ok != (err == nil) {
			t.Fatalf("%q: decoder error %v, encoding/json accepts it: %v", data, err, ok)
		}
		if err != nil {
			if !errors.Is(err, ErrBadJSON) {
				t.Fatalf("%q: error %v does not wrap ErrBadJSON", data, err)
			}
			return
		}
		if g, w := render([]Event{got}, nil), render([]Event{want}, nil); g != w {
			t.Fatalf("%q:\n got %s\nwant %s", data, g, w)
		}
	})
}

// reference decodes data with encoding/json by the rules Event documents.
func reference(data []byte) (Event, bool) {
	if !json.Valid(data) {
		return Event{}, false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return Event{}, false
	}
	m, ok := v.(map[string]any)
	if !ok {
		return Event{}, false
	}
	e := Event{Kind: KindChunk, Usage: Usage{CachedTokens: -1}}
	str := func(v any) (string, bool) { s, ok := v.(string); return s, ok }
	num := func(v any) (int, bool) {
		n, ok := v.(json.Number)
		if !ok {
			return 0, false
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		return int(i), err == nil
	}
	info := func(m map[string]any) *ErrorInfo {
		var ei ErrorInfo
		ei.Message, _ = str(m["message"])
		ei.Type, _ = str(m["type"])
		if p, ok := str(m["param"]); ok {
			ei.Param = &p
		}
		switch c := m["code"].(type) {
		case string:
			ei.Code = StringCode(c)
		case json.Number:
			i, isInt := num(c)
			ei.Code = Code{kind: codeNumber, s: string(c), n: i, isInt: isInt}
		}
		return &ei
	}
	switch x := m["error"].(type) {
	case map[string]any:
		e.Kind, e.Error = KindError, info(x)
	case string:
		e.Kind, e.Error = KindError, &ErrorInfo{Message: x}
	default:
		if s, _ := str(m["object"]); s == "error" {
			e.Kind, e.Error = KindError, info(m)
		}
	}
	if cs, ok := m["choices"].([]any); ok {
		e.Choices = len(cs)
		if len(cs) > 0 {
			if c, ok := cs[0].(map[string]any); ok {
				e.Index, _ = num(c["index"])
				e.FinishReason, _ = str(c["finish_reason"])
				delta, _ := c["delta"].(map[string]any)
				msg, _ := c["message"].(map[string]any)
				text := []any{c["text"], delta["content"], msg["content"]}
				for _, v := range text {
					if s, ok := str(v); ok {
						if s != "" {
							e.Text = []byte(s)
						}
						break
					}
				}
				for _, v := range []any{delta["reasoning_content"], delta["reasoning"], msg["reasoning_content"], msg["reasoning"]} {
					if s, ok := str(v); ok {
						if s != "" {
							e.Reasoning = []byte(s)
						}
						break
					}
				}
			}
		}
	}
	if u, ok := m["usage"].(map[string]any); ok {
		e.HasUsage = true
		e.Usage.PromptTokens, _ = num(u["prompt_tokens"])
		e.Usage.CompletionTokens, _ = num(u["completion_tokens"])
		if d, ok := u["prompt_tokens_details"].(map[string]any); ok {
			if c, ok := num(d["cached_tokens"]); ok {
				e.Usage.CachedTokens = c
			}
		}
	}
	return e, true
}
