package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
)

// matchJSON compares actual against a fixture token by token: keys, their
// order, nulls and values must agree; "<string>" and "<number>" in the
// fixture match any string or number.
func matchJSON(want, got []byte) error {
	wd, gd := json.NewDecoder(bytes.NewReader(want)), json.NewDecoder(bytes.NewReader(got))
	wd.UseNumber()
	gd.UseNumber()
	var path []string
	for i := 0; ; i++ {
		wt, werr := wd.Token()
		gt, gerr := gd.Token()
		if errors.Is(werr, io.EOF) && errors.Is(gerr, io.EOF) {
			return nil
		}
		if werr != nil || gerr != nil {
			return fmt.Errorf("token %d: fixture %v, response %v (%v, %v)", i, wt, gt, werr, gerr)
		}
		if s, ok := wt.(string); ok {
			switch s {
			case "<string>":
				if _, ok := gt.(string); !ok {
					return fmt.Errorf("token %d after %v: want a string, got %#v", i, path, gt)
				}
				continue
			case "<number>":
				if _, ok := gt.(json.Number); !ok {
					return fmt.Errorf("token %d after %v: want a number, got %#v", i, path, gt)
				}
				continue
			}
			path = append(path, s)
			if len(path) > 6 {
				path = path[1:]
			}
		}
		if fmt.Sprintf("%T %v", wt, wt) != fmt.Sprintf("%T %v", gt, gt) {
			return fmt.Errorf("token %d after %v: fixture has %#v, response has %#v", i, path, wt, gt)
		}
	}
}

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "wire", name))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(b)
}

func postRaw(t *testing.T, ts *testServer, path, reqID string, body any) (*http.Response, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, ts.base+path, bytes.NewReader(b))
	if reqID != "" {
		req.Header.Set("X-Request-Id", reqID)
	}
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp, out
}

func checkBody(t *testing.T, name string, got []byte) {
	t.Helper()
	if err := matchJSON(fixture(t, name), got); err != nil {
		t.Errorf("%s: %v\nresponse: %s", name, err, got)
	}
}

func checkStream(t *testing.T, name string, got []byte) {
	t.Helper()
	evs, err := readSSE(bytes.NewReader(got))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	want := strings.Split(string(fixture(t, name)), "\n")
	if len(evs) != len(want) {
		t.Fatalf("%s: %d events, fixture has %d:\n%s", name, len(evs), len(want), got)
	}
	for i := range want {
		if want[i] == "[DONE]" || evs[i].data == "[DONE]" {
			if want[i] != evs[i].data {
				t.Fatalf("%s event %d: %q, want %q", name, i, evs[i].data, want[i])
			}
			continue
		}
		if err := matchJSON([]byte(want[i]), []byte(evs[i].data)); err != nil {
			t.Errorf("%s event %d: %v\nevent: %s", name, i, err, evs[i].data)
		}
	}
}

func TestWireFormat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine()})
		defer ts.stop()
		prompt := words(ts.Server, 40, 20)

		resp, body := postRaw(t, ts, "/v1/completions", "fixture-1", map[string]any{"model": "inferrail-sim", "prompt": prompt, "max_tokens": 3, "ignore_eos": true})
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("X-Request-Id") != "fixture-1" {
			t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
		}
		checkBody(t, "completion.json", body)

		_, body = postRaw(t, ts, "/v1/chat/completions", "fixture-3", map[string]any{"messages": []map[string]any{{"role": "user", "content": prompt}}, "max_completion_tokens": 2})
		checkBody(t, "chat.json", body)

		resp, body = postRaw(t, ts, "/v1/chat/completions", "fixture-4", map[string]any{
			"messages":   []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": prompt}}}},
			"max_tokens": 2, "stream": true, "stream_options": map[string]any{"include_usage": true},
		})
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream; charset=utf-8" {
			t.Fatalf("stream content type %q", ct)
		}
		checkStream(t, "chat_stream.sse", body)

		resp, body = postRaw(t, ts, "/v1/completions", "", map[string]any{"model": "gpt-4o", "prompt": prompt})
		if resp.StatusCode != 404 {
			t.Fatalf("unknown model: status %d", resp.StatusCode)
		}
		checkBody(t, "error_model.json", body)
		resp, body = postRaw(t, ts, "/v1/completions", "", map[string]any{"prompt": prompt, "max_tokens": 5000})
		if resp.StatusCode != 400 {
			t.Fatalf("too long: status %d", resp.StatusCode)
		}
		checkBody(t, "error_context.json", body)
		_, body = postRaw(t, ts, "/v1/completions", "", map[string]any{"prompt": prompt, "stream_options": map[string]any{"include_usage": true}})
		checkBody(t, "error_stream_options.json", body)

		req, _ := http.NewRequest(http.MethodGet, ts.base+"/v1/models", nil)
		mresp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		mb, _ := io.ReadAll(mresp.Body)
		mresp.Body.Close()
		checkBody(t, "models.json", mb)

		// With prompt token details: the second identical prompt finds 16
		// of its 20 tokens (one full block; the last is recomputed).
		ts2 := startPipe(t, Config{Engine: testEngine(), EnablePromptTokensDetails: true})
		defer ts2.stop()
		postRaw(t, ts2, "/v1/completions", "", map[string]any{"prompt": prompt, "max_tokens": 3})
		_, body = postRaw(t, ts2, "/v1/completions", "fixture-2", map[string]any{"prompt": prompt, "max_tokens": 3, "ignore_eos": true, "stream": true, "stream_options": map[string]any{"include_usage": true}})
		checkStream(t, "completion_stream.sse", body)
	})
}

// Bad input gets vLLM's error body with a message naming the problem, never
// a panic or a hang.
func TestBadRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), MaxBodyBytes: 1 << 16})
		defer ts.stop()
		for _, tc := range []struct {
			path, body string
			status     int
			want       string
		}{
			{"/v1/completions", `{"prompt": "a b", "max_tokens": "ten"}`, 400, "max_tokens"},
			{"/v1/completions", `{"prompt": ""}`, 400, "prompt"},
			{"/v1/completions", `{"prompt": ["a", "b"]}`, 400, "one prompt"},
			{"/v1/completions", `{"prompt": "a", "n": 0}`, 400, "n must be at least 1, got 0."},
			{"/v1/completions", `{"prompt": "a", "max_tokens": 0}`, 400, "at least 1"},
			{"/v1/completions", `{"prompt": "a", "cache_salt": ""}`, 400, "cache_salt"},
			{"/v1/completions", `{"prompt": `, 400, "invalid JSON"},
			{"/v1/completions", `{"prompt": "` + strings.Repeat("x ", 40000) + `"}`, 413, "exceeds"},
			{"/v1/chat/completions", `{"messages": []}`, 400, "messages"},
			{"/v1/chat/completions", `{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`, 400, "text parts"},
			{"/v1/chat/completions", `{"messages": [{"content": "hi"}]}`, 400, "role"},
		} {
			req, _ := http.NewRequest(http.MethodPost, ts.base+tc.path, strings.NewReader(tc.body))
			resp, err := ts.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var e errorResponse
			if resp.StatusCode != tc.status || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error.Message, tc.want) || e.Error.Code != tc.status {
				t.Errorf("%s %.60s: status %d body %s; want %d mentioning %q", tc.path, tc.body, resp.StatusCode, b, tc.status, tc.want)
			}
		}
		for _, tc := range []struct {
			method, path string
			status       int
			body         string
		}{
			{http.MethodGet, "/v1/completions", 405, `{"detail":"Method Not Allowed"}`},
			{http.MethodPost, "/v1/nothing", 404, `{"detail":"Not Found"}`},
		} {
			req, _ := http.NewRequest(tc.method, ts.base+tc.path, nil)
			resp, err := ts.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || string(b) != tc.body {
				t.Errorf("%s %s: %d %s, want %d %s", tc.method, tc.path, resp.StatusCode, b, tc.status, tc.body)
			}
		}
	})
}

func FuzzRequestBody(f *testing.F) {
	f.Add([]byte(`{"prompt": "a b c", "max_tokens": 3, "stream": true}`), false)
	f.Add([]byte(`{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}`), true)
	f.Add([]byte(`{"prompt": [1, 2, 3], "max_tokens": 1}`), false)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		synctest.Test(t, func(t *testing.T) {
			ts := startPipe(t, Config{Engine: testEngine()})
			defer ts.stop()
			path := "/v1/completions"
			if chat {
				path = "/v1/chat/completions"
			}
			req, _ := http.NewRequest(http.MethodPost, ts.base+path, bytes.NewReader(body))
			resp, err := ts.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode >= 500 {
				t.Fatalf("status %d for %q", resp.StatusCode, body)
			}
		})
	})
}
