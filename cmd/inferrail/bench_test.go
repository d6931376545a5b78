package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
)

// tinyW1 is a few short W1 requests, quickly sent: bench's plumbing, not
// its measurements, is under test here.
var tinyW1 = []string{"--workload", "w1", "--requests", "4", "--rate", "40",
	"--set", "w1.prompts=1", "--set", "w1.prompt_min_tokens=64", "--set", "w1.prompt_max_tokens=128",
	"--set", "w1.question_min_tokens=8", "--set", "w1.question_max_tokens=16",
	"--set", "output.median=4", "--set", "output.min=2", "--set", "output.max_tokens=8"}

// benchArgs is bench against url with tinyW1 and more.
func benchArgs(url string, more ...string) []string {
	return append(append([]string{"bench", "--base-url", url, "--timeout", "30s"}, tinyW1...), more...)
}

// answering serves a one-token answer with usage (10 prompt tokens, 8 of
// them cached) on 127.0.0.1, calling see with each request first; fail, if
// set, answers the requests it picks with an error instead.
func answering(t *testing.T, see func(r *http.Request), fail func(n int64) bool) string {
	t.Helper()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if see != nil {
			see(r)
		}
		if fail != nil && fail(calls.Add(1)) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte(`{"object":"error","message":"the engine fell over","type":"InternalServerError","param":null,"code":500}`))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(`data: {"choices":[{"index":0,"text":"a "}]}` + "\n\n"))
		w.Write([]byte(`data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":8}}}` + "\n\ndata: [DONE]\n\n"))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// warnings are the warning lines of stderr.
func warnings(stderr string) []string {
	var w []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(strings.TrimLeft(l, "\r "), "warning: ") {
			w = append(w, l)
		}
	}
	return w
}

// The key sent is --api-key or --api-key-file, else an Authorization
// --header, else $INFERRAIL_API_KEY: flags beat the environment. --header
// is sent with every request, repeated names as repeated headers.
func TestBenchAPIKeyPrecedenceAndHeaders(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("ir-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, env string
		flags     []string
		auth      string
		team      string
	}{
		{"environment", "ir-env", nil, "Bearer ir-env", ""},
		{"none", "", nil, "", ""},
		{"--api-key over the environment", "ir-env", []string{"--api-key", "ir-flag"}, "Bearer ir-flag", ""},
		{"--api-key-file over the environment", "ir-env", []string{"--api-key-file", keyFile}, "Bearer ir-file", ""},
		{"--header Authorization over the environment", "ir-env", []string{"--header", "Authorization: Basic YTpi"}, "Basic YTpi", ""},
		{"repeated --header", "", []string{"--header", "X-Team: search", "--header", "x-team:ads"}, "", "search,ads"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("INFERRAIL_API_KEY", c.env)
			var mu sync.Mutex
			seen := map[string]int{}
			url := answering(t, func(r *http.Request) {
				mu.Lock()
				seen[r.Header.Get("Authorization")+"|"+strings.Join(r.Header.Values("X-Team"), ",")]++
				mu.Unlock()
			}, nil)
			code, stdout, stderr := runCLIWithin(t, time.Minute, benchArgs(url, c.flags...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if want := c.auth + "|" + c.team; len(seen) != 1 || seen[want] != 4 {
				t.Errorf("Authorization|X-Team seen %v, want %q on all 4 requests\n%s", seen, want, stdout)
			}
		})
	}
}

// Two keys, a malformed header or one of bench's own are bad input: exit 2,
// one line naming the flag, nothing sent.
func TestBenchBadKeyAndHeaderFlagsExitTwo(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("ir-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int64
	url := answering(t, func(*http.Request) { sent.Add(1) }, nil)
	for _, c := range []struct {
		flags    []string
		mentions []string
	}{
		{[]string{"--api-key", "a", "--api-key-file", keyFile}, []string{"--api-key and --api-key-file", "one of them"}},
		{[]string{"--api-key", "a", "--header", "Authorization: Bearer b"}, []string{"--header Authorization", "--api-key"}},
		{[]string{"--api-key-file", keyFile, "--header", "authorization: Bearer b"}, []string{"--header Authorization"}},
		{[]string{"--api-key", "two words"}, []string{"--api-key"}},
		{[]string{"--header", "X-Team"}, []string{"--header", "want Name: value"}},
		{[]string{"--header", "X Team: a"}, []string{"--header", "not allowed in a name"}},
		{[]string{"--header", "X-Team:"}, []string{"--header", "has no value"}},
		{[]string{"--header", "Content-Type: text/plain"}, []string{"--header", "Content-Type", "bench sets it itself"}},
		{[]string{"--header", "Host: example.com"}, []string{"--header", "Host", "bench sets it itself"}},
		{[]string{"--header", "content-length: 3"}, []string{"--header", "Content-Length", "bench sets it itself"}},
	} {
		args := benchArgs(url, c.flags...)
		code, stdout, stderr := runCLIWithin(t, time.Minute, args...)
		wantUsage(t, c.flags, code, stdout, stderr, c.mentions...)
	}
	if n := sent.Load(); n != 0 {
		t.Errorf("%d requests sent despite bad input", n)
	}
}

// --json and --out's summary.json both hold the send lag the text prints
// and the failures by reason, with the server's message.
func TestBenchJSONAndOutKeepSendLagAndErrors(t *testing.T) {
	url := answering(t, nil, func(n int64) bool { return n%2 == 0 })
	dir := filepath.Join(t.TempDir(), "run")
	code, stdout, stderr := runCLIWithin(t, time.Minute, benchArgs(url, "--json", "--out", dir)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	file, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]string{"--json": stdout, "summary.json": string(file)} {
		var m map[string]any
		if err := json.Unmarshal([]byte(b), &m); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, b)
		}
		lag, _ := m["send_lag_ms"].(map[string]any)
		errs, _ := m["errors"].(map[string]any)
		ex, _ := m["error_examples"].(map[string]any)
		if _, ok := lag["p50"].(float64); !ok || lag["p99"] == nil {
			t.Errorf("%s: send_lag_ms %v, want p50 and p99", name, m["send_lag_ms"])
		}
		if errs["http 500"] != 2.0 || len(errs) != 1 || ex["http 500"] != "the engine fell over" || m["failed"] != 2.0 || m["completed"] != 2.0 {
			t.Errorf("%s: errors %v, examples %v, failed %v", name, m["errors"], m["error_examples"], m["failed"])
		}
	}
	code, stdout, stderr = runCLIWithin(t, time.Minute, benchArgs(url)...)
	if code != 0 || !strings.Contains(stdout, "send lag: p50 ") || !strings.Contains(stdout, "  http 500: 2 (first: the engine fell over)") {
		t.Errorf("text: exit %d\n%s%s", code, stdout, stderr)
	}
}

// mockEngine serves the mock engine, fast, on 127.0.0.1.
func mockEngine(t *testing.T, details bool) string {
	t.Helper()
	cfg := engine.DefaultConfig()
	cfg.Latency = engine.Profile{StepFixedMs: 1, PrefillTokenUs: 1, DecodeSeqUs: 10}
	s, err := server.New(server.Config{Engine: cfg, EnablePromptTokensDetails: details})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return srv.URL
}

// Against an engine started without --enable-prompt-tokens-details the hit
// rate is unknown, with one warning naming the flag, and without live's
// header there are no predictions: bench says so rather than print 0%.
func TestBenchSaysWhatTheServerDidNotTell(t *testing.T) {
	url := mockEngine(t, false)
	code, stdout, stderr := runCLIWithin(t, time.Minute, benchArgs(url)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if w := warnings(stderr); len(w) != 1 || !strings.Contains(w[0], "--enable-prompt-tokens-details") || !strings.Contains(w[0], "hit rate is unknown") {
		t.Errorf("warnings %q, want one naming --enable-prompt-tokens-details (stderr %q)", w, stderr)
	}
	if !strings.Contains(stdout, "  unknown  ") || !strings.Contains(stdout, "predictions: no predictions (the server sent no x-inferrail-predicted-cached-tokens header)") || strings.Contains(stdout, "exact") {
		t.Errorf("text makes up a hit rate or predictions:\n%s", stdout)
	}
	code, stdout, stderr = runCLIWithin(t, time.Minute, benchArgs(url, "--json")...)
	var m map[string]any
	if err := json.Unmarshal([]byte(stdout), &m); code != 0 || err != nil {
		t.Fatalf("--json: exit %d, %v: %s", code, err, stderr)
	}
	if v, ok := m["hit_rate"]; !ok || v != nil || m["prediction"] != nil || len(warnings(stderr)) != 1 {
		t.Errorf("--json: hit_rate %v, prediction %v, want null; warnings %q", m["hit_rate"], m["prediction"], warnings(stderr))
	}

	url = mockEngine(t, true)
	code, stdout, stderr = runCLIWithin(t, time.Minute, benchArgs(url)...)
	if code != 0 || len(warnings(stderr)) != 0 || strings.Contains(stdout, "unknown") {
		t.Errorf("with --enable-prompt-tokens-details: exit %d, warnings %q\n%s", code, warnings(stderr), stdout)
	}
}
