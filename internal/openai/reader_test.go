package openai

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// readAll feeds stream to a fresh Reader in chunks of the given sizes
// (cycled; none: one chunk), chunk i read at i ms, then ends it at the
// next reading. It returns copies of every event and the first error.
func readAll(stream []byte, sizes ...int) ([]Event, error) {
	var r Reader
	var out []Event
	keep := func(evs []Event) {
		for _, e := range evs {
			e.Text = bytes.Clone(e.Text)
			e.Reasoning = bytes.Clone(e.Reasoning)
			e.ResponseID = bytes.Clone(e.ResponseID)
			out = append(out, e)
		}
	}
	i := 0
	for k := 0; len(stream) > 0; k++ {
		n := len(stream)
		if len(sizes) > 0 {
			n = min(n, sizes[k%len(sizes)])
		}
		evs, err := r.Feed(stream[:n], time.Duration(i)*time.Millisecond)
		keep(evs)
		i++
		stream = stream[n:]
		if err != nil {
			return out, err
		}
	}
	evs, err := r.End(time.Duration(i) * time.Millisecond)
	keep(evs)
	return out, err
}

// render writes events one a line, for golden files and failure messages.
func render(evs []Event, err error) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%v %s", e.At, e.Kind)
		if e.Kind != KindDone {
			fmt.Fprintf(&b, " choices=%d index=%d", e.Choices, e.Index)
		}
		if e.Text != nil {
			fmt.Fprintf(&b, " text=%q", e.Text)
		}
		if e.Reasoning != nil {
			fmt.Fprintf(&b, " reasoning=%q", e.Reasoning)
		}
		if e.FinishReason != "" {
			fmt.Fprintf(&b, " finish=%s", e.FinishReason)
		}
		if e.HasUsage {
			fmt.Fprintf(&b, " usage=%d/%d/%d", e.Usage.PromptTokens, e.Usage.CompletionTokens, e.Usage.CachedTokens)
		}
		if e.ResponseID != nil {
			fmt.Fprintf(&b, " id=%s", e.ResponseID)
		}
		if e.Error != nil {
			param := "null"
			if e.Error.Param != nil {
				param = *e.Error.Param
			}
			fmt.Fprintf(&b, " error=%q type=%q param=%s code=%q", e.Error.Message, e.Error.Type, param, e.Error.Code.String())
		}
		b.WriteByte('\n')
	}
	if err != nil {
		fmt.Fprintf(&b, "err: %v\n", err)
	}
	return b.String()
}

// sameEvents compares events but for their At.
func sameEvents(a, b []Event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		x.At, y.At = 0, 0
		if render([]Event{x}, nil) != render([]Event{y}, nil) {
			return false
		}
	}
	return true
}

func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs (rerun with -update if intended):\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// TestGoldenStreams reads every testdata/*.sse in 7-byte chunks (so every
// line is split, some inside a UTF-8 sequence or a CRLF) and checks the
// events against testdata/*.golden; one chunk and one byte at a time must
// give the same events.
func TestGoldenStreams(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.sse"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/*.sse: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			stream, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			evs, err := readAll(stream, 7)
			got := render(evs, err)
			golden(t, strings.TrimSuffix(f, ".sse")+".golden", got)
			for _, sizes := range [][]int{nil, {1}, {3, 1, 64}} {
				evs2, err2 := readAll(stream, sizes...)
				if !sameEvents(evs, evs2) || fmt.Sprint(err) != fmt.Sprint(err2) {
					t.Errorf("chunks of %v:\n%s\nwant:\n%s", sizes, render(evs2, err2), got)
				}
			}
		})
	}
}

// TestGoldenResponses decodes every testdata/response-*.json.
func TestGoldenResponses(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("testdata", "response-*.json"))
	if len(files) == 0 {
		t.Fatal("no testdata/response-*.json")
	}
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		e, err := ParseResponse(body)
		golden(t, strings.TrimSuffix(f, ".json")+".golden", render([]Event{e}, err))
	}
}

// Events are stamped with the reading of the Feed that completed them,
// not the one that started them.
func TestEventTime(t *testing.T) {
	var r Reader
	evs, err := r.Feed([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"te"), 1)
	if err != nil || len(evs) != 1 || evs[0].At != 1 || string(evs[0].Text) != "a" {
		t.Fatalf("first feed: %s", render(evs, err))
	}
	evs, err = r.Feed([]byte("xt\":\"b\"}]}\n"), 2)
	if err != nil || len(evs) != 0 {
		t.Fatalf("second feed, the event's blank line still to come: %s", render(evs, err))
	}
	evs, err = r.Feed([]byte("\n"), 3)
	if err != nil || len(evs) != 1 || evs[0].At != 3 || string(evs[0].Text) != "b" {
		t.Fatalf("third feed: %s", render(evs, err))
	}
}

// A CR that ends one chunk and the LF that starts the next are one line end.
func TestCRLFSplit(t *testing.T) {
	var r Reader
	var n int
	for _, p := range []string{"data: [DONE]\r", "\n", "\r", "\n", "data: [DONE]\r\n\r\n"} {
		evs, err := r.Feed([]byte(p), 0)
		if err != nil {
			t.Fatal(err)
		}
		n += len(evs)
	}
	if n != 2 {
		t.Fatalf("%d events, want 2", n)
	}
}

func TestTooLong(t *testing.T) {
	for _, c := range []struct{ name, stream string }{
		{"line", "data: " + strings.Repeat("x", 100)},
		{"ended line", ": " + strings.Repeat("x", 100) + "\n"},
		{"data lines", strings.Repeat("data: "+strings.Repeat("x", 30)+"\n", 4)},
	} {
		for _, size := range []int{1, 16, 1000} {
			r := Reader{MaxEventBytes: 64}
			var err error
			for s := c.stream; len(s) > 0 && err == nil; {
				n := min(size, len(s))
				_, err = r.Feed([]byte(s[:n]), 0)
				s = s[n:]
			}
			if !errors.Is(err, ErrTooLong) {
				t.Errorf("%s in chunks of %d: %v, want ErrTooLong", c.name, size, err)
			}
			if len(r.carry) > 64 || len(r.data) > 64 {
				t.Errorf("%s: buffers grew to %d and %d bytes past the limit", c.name, len(r.carry), len(r.data))
			}
			if _, again := r.Feed([]byte("data: [DONE]\n\n"), 0); again != err {
				t.Errorf("%s: the error did not stick: %v", c.name, again)
			}
		}
	}
}

// A line at the limit is fine.
func TestAtLimit(t *testing.T) {
	line := `data: {"choices":[{"text":"` + strings.Repeat("y", 30) + `"}]}`
	r := Reader{MaxEventBytes: len(line)}
	evs, err := r.Feed([]byte(line+"\n\n"), 0)
	if err != nil || len(evs) != 1 {
		t.Fatalf("%s", render(evs, err))
	}
}

func TestReset(t *testing.T) {
	var r Reader
	if _, err := r.Feed([]byte("data: nope\n\n"), 0); !errors.Is(err, ErrBadJSON) {
		t.Fatalf("%v, want ErrBadJSON", err)
	}
	r.Reset()
	if r.Err() != nil {
		t.Fatal("Reset kept the error")
	}
	r.Feed([]byte("data: {\"choices\":[{\"text\":"), 0)
	r.Reset()
	evs, err := r.Feed([]byte("data: [DONE]\n\n"), 0)
	if err != nil || len(evs) != 1 || evs[0].Kind != KindDone {
		t.Fatalf("after Reset: %s", render(evs, err))
	}
}

func TestDecodeFields(t *testing.T) {
	for _, c := range []struct{ data, want string }{
		{`{"choices":[{"index":2,"text":"a","delta":{"content":"b"}}]}`, `0s chunk choices=1 index=2 text="a"`},
		{`{"choices":[{"delta":{"content":"b","reasoning":"r"},"message":{"content":"c"}}]}`, `0s chunk choices=1 index=0 text="b" reasoning="r"`},
		{`{"choices":[{"message":{"content":"c","reasoning_content":"r1","reasoning":"r2"}}]}`, `0s chunk choices=1 index=0 text="c" reasoning="r1"`},
		{`{"choices":[{"text":null,"delta":{"content":"d"}}]}`, `0s chunk choices=1 index=0 text="d"`},
		{`{"choices":[{"text":"x"},{"text":"y"}]}`, `0s chunk choices=2 index=0 text="x"`},
		{`{"choices":[null,{"text":"y"}]}`, `0s chunk choices=2 index=0`},
		{`{"choices":[{"text":"","finish_reason":"stop"}]}`, `0s chunk choices=1 index=0 finish=stop`},
		{`{"choices":[{"finish_reason":"sp\u0065cial"}]}`, `0s chunk choices=1 index=0 finish=special`},
		{`{"choices":{"text":"x"},"usage":{"prompt_tokens":1.5,"completion_tokens":-2,"prompt_tokens_details":{"cached_tokens":"7"}}}`, `0s chunk choices=0 index=0 usage=0/-2/-1`},
		{`{"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":9223372036854775808}}`, `0s chunk choices=0 index=0 usage=9223372036854775807/0/-1`},
		{`{"usage":null}`, `0s chunk choices=0 index=0`},
		{`{"error":"boom"}`, `0s error choices=0 index=0 error="boom" type="" param=null code=""`},
		{`{"error":null,"choices":[]}`, `0s chunk choices=0 index=0`},
		{`{"error":{"message":"m","type":"t","param":"p","code":"c","object":"error"}}`, `0s error choices=0 index=0 error="m" type="t" param=p code="c"`},
		{`{"object":"error","message":"m","type":"BadRequestError","param":null,"code":400}`, `0s error choices=0 index=0 error="m" type="BadRequestError" param=null code="400"`},
		{`{"te\u0078t":1,"choices":[{"te\u0078t":"k"}]}`, `0s chunk choices=1 index=0 text="k"`},
		{`{"choices":[{"text":"\ud83d\ude00 \ud83d \ude00 \ud83d\u0041 ` + "\xff" + `"}]}`, "0s chunk choices=1 index=0 text=\"😀 \uFFFD \uFFFD \uFFFDA \uFFFD\""},
	} {
		e, err := ParseResponse([]byte(c.data))
		if got := strings.TrimSpace(render([]Event{e}, err)); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.data, got, c.want)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, data := range []string{
		``, ` `, `[]`, `"x"`, `null`, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{"a":1}x`, `{"a":01}`,
		`{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":1e}`, `{"a":tru}`, `{"a":"\x"}`, `{"a":"\u12"}`,
		"{\"a\":\"\x01\"}", `{"a":[1,]}`, `{"a":[1 2]}`, `{a:1}`, `{"choices":[{"text":"a"]}`,
		`{"usage":{"prompt_tokens":}}`, `{"error":{"code":}}`,
		`{"a":` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`,
	} {
		if e, err := ParseResponse([]byte(data)); !errors.Is(err, ErrBadJSON) {
			t.Errorf("%.40q: %s, want ErrBadJSON", data, render([]Event{e}, err))
		}
	}
	deep := `{"a":` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `}`
	if _, err := ParseResponse([]byte(deep)); err != nil {
		t.Errorf("nesting at the limit: %v", err)
	}
}

func TestCodeJSON(t *testing.T) {
	for _, c := range []struct {
		in, out string
		text    string
		num     int
		isNum   bool
	}{
		{`"queue_full"`, `"queue_full"`, "queue_full", 0, false},
		{`500`, `500`, "", 500, true},
		{`5e2`, `5e2`, "", 0, false},
		{`null`, `null`, "", 0, false},
		{`{"x":1}`, `null`, "", 0, false},
	} {
		var code Code
		if err := code.UnmarshalJSON([]byte(c.in)); err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		b, _ := code.MarshalJSON()
		text, isText := code.Text()
		n, isNum := code.Number()
		if string(b) != c.out || text != c.text || isText != (c.text != "") || n != c.num || isNum != c.isNum {
			t.Errorf("%s: marshals %s, text %q %v, number %d %v", c.in, b, text, isText, n, isNum)
		}
	}
	if (&ErrorInfo{Message: "m", Type: "InternalServerError", Code: NumberCode(500)}).Error() != "InternalServerError (500): m" {
		t.Error("ErrorInfo.Error")
	}
}

func TestAnswer(t *testing.T) {
	stream, err := os.ReadFile(filepath.Join("testdata", "vllm-chat-reasoning.sse"))
	if err != nil {
		t.Fatal(err)
	}
	var r Reader
	a := Answer{MaxText: 1 << 10}
	for len(stream) > 0 {
		n := min(5, len(stream))
		evs, err := r.Feed(stream[:n], 0)
		if err != nil {
			t.Fatal(err)
		}
		a.Add(evs...)
		stream = stream[n:]
	}
	want := "Bonjour à vous 😀\n\"ok\" — très bien"
	if string(a.Text) != want || !a.Done || a.Error != nil || !a.HasUsage || a.Usage.CompletionTokens != 7 || a.Generated != 5 || a.FinishReason != "stop" {
		t.Fatalf("%+v", a)
	}
	a.Reset()
	a.MaxText = 4
	a.Add(Event{Kind: KindChunk, Text: []byte("abc")}, Event{Kind: KindChunk, Text: []byte("de")}, Event{Kind: KindError, Error: &ErrorInfo{Message: "x"}})
	if string(a.Text) != "abc" || !a.Truncated || a.Error == nil || a.Generated != 2 || a.Events != 3 {
		t.Fatalf("%+v", a)
	}
	a.Reset()
	a.MaxText = -1
	a.Add(Event{Kind: KindChunk, Text: []byte("abc"), HasUsage: true, Usage: Usage{CompletionTokens: 1, CachedTokens: -1}})
	if len(a.Text) != 0 || a.Truncated || a.Generated != 1 || a.Usage.CompletionTokens != 1 {
		t.Fatalf("no text kept: %+v", a)
	}
}

// A stream of n = 2 (vLLM's shape: each chunk one choice, by index, the
// choices interleaved): the text kept is the first choice's, whole and in
// order; every choice's chunks are counted.
func TestAnswerChoices(t *testing.T) {
	stream, err := os.ReadFile(filepath.Join("testdata", "vllm-chat-n2.sse"))
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readAll(stream, 7)
	if err != nil {
		t.Fatal(err)
	}
	var a Answer
	a.Add(evs...)
	if string(a.Text) != "Red sun rises" || a.Generated != 5 || !a.Done || !a.HasUsage || a.Usage.CompletionTokens != 5 {
		t.Fatalf("text %q, generated %d, done %v, usage %+v", a.Text, a.Generated, a.Done, a.Usage)
	}
}

// A Responses API stream adds up as a chat stream does: its text deltas,
// its usage (input_tokens, output_tokens) and its end, with the response's
// id; an error event or response.failed is its error.
func TestAnswerResponses(t *testing.T) {
	read := func(file string) Answer {
		t.Helper()
		stream, err := os.ReadFile(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		evs, err := readAll(stream, 11)
		if err != nil {
			t.Fatal(err)
		}
		var a Answer
		a.Add(evs...)
		return a
	}
	a := read("vllm-responses.sse")
	if string(a.Text) != "Hello wörld" || !a.Done || a.Error != nil || !a.HasUsage || a.Generated != 3 ||
		a.Usage != (Usage{PromptTokens: 21, CompletionTokens: 3, CachedTokens: 16}) || string(a.ResponseID) != "resp_9f2c4e" {
		t.Fatalf("%+v", a)
	}
	a = read("responses-error.sse")
	if a.Done || a.Error == nil || a.Error.Message != "the engine went away" || string(a.ResponseID) != "resp_e1" {
		t.Fatalf("%+v", a)
	}
	a.Reset()
	if len(a.ResponseID) != 0 || a.Done {
		t.Fatalf("reset: %+v", a)
	}
}

// An escape after a non-ASCII character is still decoded (it was once
// taken as plain once valid UTF-8 was seen).
func TestEscapeAfterNonASCII(t *testing.T) {
	var r Reader
	evs, err := r.Feed([]byte("data: {\"choices\":[{\"index\":0,\"text\":\"\u00c0\\u0026 \u00e9\\n\"}]}\n\n"), 0)
	if err != nil || len(evs) != 1 {
		t.Fatalf("%v %v", evs, err)
	}
	if got := string(evs[0].Text); got != "À& é\n" {
		t.Fatalf("text %q", got)
	}
}
