package main

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/live"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/gateway"
)

// explainAdmin serves the admin API of a gateway of two replicas (which
// need not answer: explain dispatches nothing) with a shadow policy.
func explainAdmin(t *testing.T) string {
	t.Helper()
	c := config.Default()
	m := config.DefaultModel()
	m.Name, m.ShadowPolicy = "m", "round_robin"
	m.Replicas = []config.Replica{{Name: "a", URL: "http://127.0.0.1:1"}, {Name: "b", URL: "http://127.0.0.1:2"}}
	c.Models = []config.Model{m}
	s, err := live.New(&c, live.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.AdminHandler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	return srv.URL
}

// explain prints the table of a running gateway's explanation (--json its
// JSON), sends the proxy's headers, and refuses bad input with exit 2.
func TestExplainCommand(t *testing.T) {
	admin := explainAdmin(t)
	var code int
	var out, errOut string
	body := `{"model": "m", "prompt": "` + strings.Repeat("hello world ", 60) + `", "max_tokens": 8}`
	withStdin(t, body, func() {
		code, out, errOut = runCLI("explain", "--admin", admin, "--tenant", "team-a", "--priority", "2")
	})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"policy cost_model", "verdict dispatch", `tenant "team-a"`, "priority 2", "why: dispatch to", "replica", "ttft_ms", "queued_prefill_ms",
		"estimated_ttft_ms", "policy terms: load_bound", "shadow round_robin picks"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	// An embedding, told by its input: weighed as its prompt alone.
	withStdin(t, `{"model": "m", "input": "hello world"}`, func() { code, out, errOut = runCLI("explain", "--admin", admin) })
	if code != 0 || !strings.Contains(out, "an embedding (reserves no output)") {
		t.Fatalf("an embedding: exit %d: %s %s", code, out, errOut)
	}
	withStdin(t, body, func() { code, out, errOut = runCLI("explain", "--admin", admin, "--json") })
	var ex gateway.Explanation
	if code != 0 || json.Unmarshal([]byte(out), &ex) != nil || ex.Winner == nil || len(ex.Candidates) != 2 {
		t.Fatalf("--json: exit %d: %s %s", code, out, errOut)
	}
	for _, c := range []struct{ stdin, mention string }{
		{`{"model": "m", "prompt": `, "POST /admin/explain: 400"},
		{`{"model": "nope", "prompt": "x"}`, "404"},
		{"", "reads a generation request body on stdin"},
	} {
		withStdin(t, c.stdin, func() { code, out, errOut = runCLI("explain", "--admin", admin) })
		if code != 2 || !strings.Contains(errOut, c.mention) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Fatalf("stdin %q: exit %d, %q", c.stdin, code, errOut)
		}
	}
	if code, _, errOut = runCLI("explain", "--admin", "http://127.0.0.1:1", "--endpoint", "x"); code != 2 || !strings.Contains(errOut, "--endpoint") {
		t.Fatalf("bad endpoint: exit %d, %q", code, errOut)
	}
}

// sim --explain-sample writes the sampled decisions' explanations, one JSON
// object a line, into --explain-out; the flags go together.
func TestSimExplainOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "explain", "decisions.jsonl")
	code, _, errOut := runCLI("sim", "--workload", "w1", "--requests", "80", "--policy", "cost_model", "--explain-sample", "0.5", "--explain-out", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 20 || len(lines) > 60 {
		t.Fatalf("%d explanations for half of 80 requests", len(lines))
	}
	var ex gateway.Explanation
	if err := json.Unmarshal([]byte(lines[0]), &ex); err != nil || ex.Policy != "cost_model" || len(ex.Candidates) != 4 {
		t.Fatalf("%v: %s", err, lines[0])
	}
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"--explain-sample", "0.5"}, "explain-out"},
		{[]string{"--explain-out", path}, "explain-sample"},
		{[]string{"--explain-sample", "2", "--explain-out", path}, "explain-sample: must be in [0, 1]"},
	} {
		code, _, errOut := runCLI(append([]string{"sim", "--workload", "w1", "--requests", "10"}, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.mention) {
			t.Fatalf("%v: exit %d, %q", c.args, code, errOut)
		}
	}
}
