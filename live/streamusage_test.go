package live

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/internal/openai"
	"github.com/inferrail/inferrail/live/config"
)

// A stream whose client set no stream_options is sent with
// include_usage, its usage counted and its usage chunk kept from the
// client, who gets the events the engine sends without it; a client's
// own stream_options go as they are.
func TestStreamUsageAsked(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true})
	g := startGateway(t, testConfig(t, up))
	m := g.models[0]
	reported := func() float64 {
		var d dto.Metric
		g.met.reportedTokens.WithLabelValues(m.name).Write(&d)
		return d.GetCounter().GetValue()
	}
	events := func(base, path string, body map[string]any) []string {
		t.Helper()
		b, _ := json.Marshal(body)
		resp, err := http.Post(base+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %v %s", path, resp.StatusCode, err, out)
		}
		if resp.ContentLength >= 0 {
			t.Fatalf("%s: a stream with a Content-Length (%d)", path, resp.ContentLength)
		}
		return strings.SplitAfter(string(out), "\n\n")
	}
	prompt := words(300, 48)
	for _, tc := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4, "ignore_eos": true, "stream": true}},
		{"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": prompt}}, "max_tokens": 4, "ignore_eos": true, "stream": true}},
	} {
		before := reported()
		got := events(g.base, tc.path, tc.body)
		direct := events(up.url(), tc.path, tc.body)
		if strings.Contains(strings.Join(got, ""), `"usage"`) || streamText(t, got) != streamText(t, direct) || got[len(got)-2] != "data: [DONE]\n\n" {
			t.Fatalf("%s: through the proxy %q, straight from the engine %q; want the same text, no usage, data: [DONE] last:\n%q", tc.path, streamText(t, got), streamText(t, direct), got)
		}
		waitUntil(t, "the stream's usage counted", 5*time.Second, func() bool { return reported() > before })

		// The client's own stream_options: sent as they are, the usage
		// neither asked for nor counted.
		own := map[string]any{"stream_options": map[string]any{"include_usage": false}}
		for k, v := range tc.body {
			own[k] = v
		}
		before = reported()
		if got := events(g.base, tc.path, own); strings.Contains(strings.Join(got, ""), `"usage"`) {
			t.Fatalf("%s: include_usage false, but a usage in the stream", tc.path)
		}
		time.Sleep(50 * time.Millisecond)
		if r := reported(); r != before {
			t.Fatalf("%s: the client's include_usage false was overridden: reported prompt tokens %v -> %v", tc.path, before, r)
		}
	}
}

// streamText is the text a stream's events carry.
func streamText(t testing.TB, events []string) string {
	t.Helper()
	var r openai.Reader
	evs, err := r.Feed([]byte(strings.Join(events, "")), 0)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, e := range evs {
		text.Write(e.Text)
	}
	return text.String()
}

// An engine that writes the usage event cut across writes, with CRLF line
// ends and a comment: the client gets every other byte as the engine wrote
// it, and the engine got include_usage.
func TestStreamUsageCutEvents(t *testing.T) {
	const (
		head  = "data: {\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" a\",\"finish_reason\":null}]}\r\n\r\n: keep-alive\r\n\r\n"
		last  = "data: {\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" b\",\"finish_reason\":\"length\"}]}\r\n\r\n"
		usage = "data: {\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}}\r\n\r\n"
		done  = "data: [DONE]\r\n\r\n"
	)
	var mu sync.Mutex
	var asked []string
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusOK) // probes and scrapes
			return
		}
		var body struct {
			StreamOptions *struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		asked = append(asked, fmt.Sprint(body.StreamOptions != nil && body.StreamOptions.IncludeUsage))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		all := head + last + usage + done
		// Cut inside the usage event's data, and between a CR and its LF.
		cuts := []int{len(head), len(head + last + usage[:20]), len(head + last + usage[:len(usage)-1]), len(all)}
		from := 0
		for _, c := range cuts {
			io.WriteString(w, all[from:c])
			f.Flush()
			time.Sleep(5 * time.Millisecond)
			from = c
		}
	}))
	t.Cleanup(engine.Close)
	c := testConfig(t)
	c.Models[0].Replicas = append(c.Models[0].Replicas, config.Replica{Name: "a", URL: engine.URL})
	g := startGateway(t, c)
	resp, err := g.post(t.Context(), "/v1/completions", map[string]any{"prompt": "x y z", "max_tokens": 2, "stream": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if want := head + last + done; string(got) != want {
		t.Fatalf("the client got\n%q\nwant\n%q", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || asked[0] != "true" {
		t.Fatalf("the engine was asked for usage: %v, want [true]", asked)
	}
}

// sseEvent is a generated event and whether it is a usage-only chunk.
type sseEvent struct {
	text  string
	usage bool
}

func genEvents(t *rapid.T) []sseEvent {
	eol := rapid.SampledFrom([]string{"\n", "\r\n", "\r"}).Draw(t, "eol")
	n := rapid.IntRange(0, 8).Draw(t, "n")
	var evs []sseEvent
	for i := range n {
		var e sseEvent
		switch rapid.IntRange(0, 4).Draw(t, fmt.Sprint("kind", i)) {
		case 0:
			e = sseEvent{`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}` + eol + eol, true}
		case 1:
			e = sseEvent{`data: {"choices":[{"index":0,"text":"usage"}],"usage":{"prompt_tokens":3}}` + eol + eol, false} // a continuous usage: kept
		case 2:
			e = sseEvent{": comment" + eol + eol, false}
		case 3:
			e = sseEvent{"data: [DONE]" + eol + eol, false}
		default:
			e = sseEvent{`data: {"choices":[{"index":0,"text":" \"usage\""}]}` + eol + eol, false}
		}
		evs = append(evs, e)
	}
	return evs
}

// Cut anywhere, a stream loses exactly its usage-only events, and each
// other event goes out as soon as its last byte is in.
func TestWithoutUsageProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		evs := genEvents(t)
		var in, want strings.Builder
		for _, e := range evs {
			in.WriteString(e.text)
			if !e.usage {
				want.WriteString(e.text)
			}
		}
		all := in.String()
		tail := rapid.StringMatching(`(data: \{"x":1)?`).Draw(t, "tail") // an event the stream broke in
		all += tail
		a := newAnswer(true, false)
		a.strip = true
		var got []byte
		for from := 0; from < len(all); {
			to := rapid.IntRange(from+1, len(all)).Draw(t, "cut")
			got = append(got, a.pass([]byte(all[from:to]), false)...)
			// Every event ended by now is out (a CR last may yet be a CRLF).
			ended := 0
			for _, e := range evs {
				if ended+len(e.text) > to {
					break
				}
				ended += len(e.text)
			}
			var wantNow strings.Builder
			done := 0
			for _, e := range evs {
				if done+len(e.text) > ended {
					break
				}
				done += len(e.text)
				if !e.usage {
					wantNow.WriteString(e.text)
				}
			}
			if len(got) < wantNow.Len() && !(to > 0 && all[to-1] == '\r') {
				t.Fatalf("after %d bytes out %q, want at least %q", to, got, wantNow.String())
			}
			from = to
		}
		got = append(got, a.pass(nil, true)...)
		if string(got) != want.String()+tail {
			t.Fatalf("got\n%q\nwant\n%q", got, want.String()+tail)
		}
	})
}

// An event that never ends is not held without bound: past maxHeldEvent
// its bytes go out as they come, and a usage event after it is still
// taken out.
func TestWithoutUsageBounded(t *testing.T) {
	a := newAnswer(true, false)
	a.strip = true
	piece := bytes.Repeat([]byte("x"), 16<<10)
	in, out := 0, 0
	for range 64 { // 1 MiB of one event
		in += len(piece)
		out += len(a.pass(piece, false))
		if held := in - out; held > maxHeldEvent+len(piece) || len(a.held) > maxHeldEvent {
			t.Fatalf("after %d bytes %d held", in, held)
		}
	}
	usage := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n"
	rest := "\n\n" + usage + "data: [DONE]\n\n"
	got := a.pass([]byte(rest), true)
	if out += len(got); out != in+len(rest)-len(usage) || !bytes.HasSuffix(got, []byte("\n\ndata: [DONE]\n\n")) {
		t.Fatalf("%d bytes out of %d, want all but the usage event's %d; last %q", out, in+len(rest), len(usage), got)
	}
}

// The engine's bytes, however cut, reach the client as they do whole.
func FuzzWithoutUsage(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n"), uint8(7))
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\ndata: {\"choices\":[],\r\ndata: \"usage\":{}}\r\r"), uint8(30))
	f.Fuzz(func(t *testing.T, data []byte, cut uint8) {
		whole := newAnswer(true, false)
		whole.strip = true
		want := append([]byte(nil), whole.pass(data, true)...)
		parts := newAnswer(true, false)
		parts.strip = true
		i := min(int(cut), len(data))
		got := append([]byte(nil), parts.pass(data[:i], false)...)
		got = append(got, parts.pass(data[i:], true)...)
		if !bytes.Equal(got, want) {
			t.Fatalf("cut at %d: %q, whole: %q", i, got, want)
		}
		if len(want) > len(data) {
			t.Fatalf("out %d bytes of %d", len(want), len(data))
		}
	})
}

// A 16-token stream as vLLM writes it, an event a write, through the
// answer with and without its usage event taken out.
func BenchmarkAnswerPass(b *testing.B) {
	var evs [][]byte
	for i := range 16 {
		evs = append(evs, fmt.Appendf(nil, "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" w%d\",\"finish_reason\":null}]}\n\n", i))
	}
	usage := []byte("data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[],\"usage\":{\"prompt_tokens\":256,\"completion_tokens\":16,\"total_tokens\":272}}\n\n")
	done := []byte("data: [DONE]\n\n")
	for _, strip := range []bool{false, true} {
		b.Run(fmt.Sprintf("strip=%v", strip), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				a := newAnswer(true, false)
				a.strip = strip
				for _, e := range evs {
					a.pass(e, false)
				}
				a.pass(usage, false)
				a.pass(done, true)
				a.release()
			}
		})
	}
}

// lateWriter is a client that reads nothing for its first write's first
// delay, then everything: the relay hands the engine's side to its
// watchdog (pump) meanwhile.
type lateWriter struct {
	h     http.Header
	delay time.Duration
	mu    sync.Mutex
	body  bytes.Buffer
	first bool
}

func (w *lateWriter) Header() http.Header { return w.h }
func (w *lateWriter) WriteHeader(int)     {}
func (w *lateWriter) Flush()              {}
func (w *lateWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	first := !w.first
	w.first = true
	w.mu.Unlock()
	if first {
		time.Sleep(w.delay)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.body.Write(p)
}

// The usage event is taken out on the watchdog's side too: a client that
// stalls past slowWrite gets the stream without it.
func TestStreamUsageSlowClient(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startGateway(t, testConfig(t, up))
	body := `{"prompt": "a late reader asks", "max_tokens": 30, "stream": true, "ignore_eos": true}`
	lw := &lateWriter{h: http.Header{}, delay: 10 * slowWrite}
	g.Handler().ServeHTTP(lw, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body)))
	got := lw.body.String()
	var r openai.Reader
	evs, err := r.Feed([]byte(got), 0)
	if err != nil {
		t.Fatal(err)
	}
	text := 0
	for _, e := range evs {
		if e.Generated() {
			text++
		}
	}
	if strings.Contains(got, `"usage"`) || !strings.HasSuffix(got, "data: [DONE]\n\n") || text == 0 {
		t.Fatalf("a late client got %d text events, usage %v, [DONE] last %v:\n%s", text, strings.Contains(got, `"usage"`), strings.HasSuffix(got, "data: [DONE]\n\n"), got)
	}
}

// The body a stream's usage is asked in goes out in parts, uncopied: its
// parts, its reader and its length all say the same JSON, the client's
// keys first and stream_options last.
func TestWithStreamUsageParts(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prompt := rapid.StringMatching(`[a-z }{"]{0,40}`).Draw(t, "prompt")
		in, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "stream": true})
		up := withStreamUsage(in)
		whole := bytes.Join(up.appendTo(nil), nil)
		read, err := io.ReadAll(up.reader())
		if err != nil || !bytes.Equal(read, whole) || up.len() != len(whole) {
			t.Fatalf("reader %q (%v), len %d, parts %q", read, err, up.len(), whole)
		}
		var out map[string]any
		if err := json.Unmarshal(whole, &out); err != nil {
			t.Fatalf("%q: %v", whole, err)
		}
		if out["prompt"] != prompt || !bytes.HasSuffix(whole, []byte(`,"stream_options":{"include_usage":true}}`)) {
			t.Fatalf("%q", whole)
		}
		if !bytes.Equal(in, bytes.Join(plainBody(in).appendTo(nil), nil)) {
			t.Fatal("a plain body changed")
		}
	})
}
