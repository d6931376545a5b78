package respcache

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
)

// startEngine runs `inferrail engine` (engine/server) in process on
// 127.0.0.1 and returns its base URL.
func startEngine(t *testing.T) string {
	t.Helper()
	ec := engine.DefaultConfig()
	ec.NumGPUBlocks = 2048
	ec.MaxModelLen = 8192
	ec.Latency = engine.Profile{StepFixedMs: 1, PrefillTokenUs: 5} // fast steps
	s, err := server.New(server.Config{Engine: ec, EnablePromptTokensDetails: true, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { s.Run(ctx); close(runDone) }()
	hs := &http.Server{Handler: s.Handler()}
	go hs.Serve(ln)
	t.Cleanup(func() {
		hs.Close()
		cancel()
		<-runDone
	})
	return "http://" + ln.Addr().String()
}

// startProxy serves a cachingProxy in front of the engine at base on
// 127.0.0.1, forwarding like live's relay: headers copied, each chunk the
// engine sends written and flushed at once, with a write deadline through
// the ResponseController (which must reach the connection through the
// capture).
func startProxy(t *testing.T, c *Cache, base string) string {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	p := &cachingProxy{t: t, c: c, model: server.DefaultModelName}
	p.forward = func(ctx context.Context, w http.ResponseWriter, path string, body []byte) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		for k, vs := range resp.Header {
			if k != "Content-Length" && k != "Date" {
				w.Header()[k] = vs
			}
		}
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
			return err // the capture hid the connection
		}
		w.WriteHeader(resp.StatusCode)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil {
					return werr
				}
				if ferr := rc.Flush(); ferr != nil {
					return ferr
				}
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: p}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return "http://" + ln.Addr().String()
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, url, path, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Test-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

// TestReplayEngine: answers of `inferrail engine` replay byte for byte,
// streamed and not, chat and completions, with the original content type
// and, for streams, the engine's event boundaries.
func TestReplayEngine(t *testing.T) {
	eng := startEngine(t)
	c := newCache(t, testConfig(), Deps{})
	proxy := startProxy(t, c, eng)
	for _, tc := range []struct {
		name, path, body string
		stream           bool
	}{
		{"chat stream", PathChatCompletions, `{"model":"inferrail-sim","messages":[{"role":"user","content":"Tell me a story about a cache."}],"temperature":0,"max_tokens":24,"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"chat", PathChatCompletions, `{"model":"inferrail-sim","messages":[{"role":"user","content":"Tell me a story about a cache."}],"temperature":0,"max_tokens":24}`, false},
		{"completions stream", PathCompletions, `{"model":"inferrail-sim","prompt":"Once upon a time","temperature":0,"max_tokens":50,"ignore_eos":true,"stream":true}`, true},
		{"completions", PathCompletions, `{"model":"inferrail-sim","prompt":"Once upon a time","temperature":0,"max_tokens":16,"logprobs":2}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			direct := post(t, eng, tc.path, "", tc.body)
			if direct.status != 200 {
				t.Fatalf("engine: %d %s", direct.status, direct.body)
			}
			miss := post(t, proxy, tc.path, "k", tc.body)
			hit := post(t, proxy, tc.path, "k", tc.body)
			if miss.header.Get(HeaderCache) != "miss" || hit.header.Get(HeaderCache) != "hit" {
				t.Fatalf("x-inferrail-cache %q then %q", miss.header.Get(HeaderCache), hit.header.Get(HeaderCache))
			}
			if !bytes.Equal(miss.body, hit.body) {
				t.Fatalf("the replay differs from the answer:\n%s\n---\n%s", miss.body, hit.body)
			}
			if a, b := miss.header.Get("Content-Type"), hit.header.Get("Content-Type"); a != b || a != direct.header.Get("Content-Type") {
				t.Errorf("content types: engine %q, miss %q, hit %q", direct.header.Get("Content-Type"), a, b)
			}
			if tc.stream {
				if !bytes.HasSuffix(hit.body, []byte("data: [DONE]\n\n")) {
					t.Errorf("stream does not end with [DONE]: %q", hit.body)
				}
			} else if hit.header.Get("Content-Length") != miss.header.Get("Content-Length") && miss.header.Get("Content-Length") != "" {
				t.Errorf("content length: miss %q, hit %q", miss.header.Get("Content-Length"), hit.header.Get("Content-Length"))
			}

			// The entry's events are the stream's own, and a replay writes
			// (and flushes) exactly those.
			res, err := c.Lookup(context.Background(), Request{Path: tc.path, Body: []byte(tc.body), Model: server.DefaultModelName, KeyID: "k"})
			if err != nil || res.Outcome != Hit {
				t.Fatalf("lookup: %v %v", res.Outcome, err)
			}
			rec := newFlushRecorder()
			if err := Replay(rec, res.Entry, time.Second); err != nil {
				t.Fatal(err)
			}
			got := rec.all()
			if !tc.stream {
				if len(got) != 1 || got[0] != string(miss.body) || rec.Header().Get("Content-Length") == "" {
					t.Errorf("a JSON replay wrote %d segments, content length %q", len(got), rec.Header().Get("Content-Length"))
				}
				return
			}
			want := splitEvents(string(miss.body))
			if len(got) != len(want) {
				t.Fatalf("replay wrote %d flushed segments, the stream has %d events", len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("segment %d: %q, event %q", i, got[i], want[i])
				}
			}
			if u := res.Entry.Usage; tc.name == "chat stream" && (!u.Known || u.PromptTokens == 0 || u.CompletionTokens != 24) {
				t.Errorf("usage %+v", u)
			}
		})
	}
}
