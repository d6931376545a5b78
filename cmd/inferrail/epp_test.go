package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// eppYAML is a minimal configuration for `inferrail epp`, with extra
// top-level YAML appended.
func eppYAML(t *testing.T, extra string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "live.yaml")
	body := "admin_listen: \"\"\n" + extra + "models:\n  - name: m\n    kv_capacity_blocks: 2048\n    replicas:\n      - url: http://127.0.0.1:1\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Bad input to `inferrail epp` exits 2 before anything is served, on one
// line that names the problem; --check of a good configuration exits 0.
func TestEPPCommandBadInput(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		mentions []string
	}{
		{"no config", []string{"epp"}, []string{"--config is required"}},
		{"bad listen", []string{"epp", "--config", eppYAML(t, "epp:\n  listen: nowhere\n")}, []string{"epp.listen", "host:port"}},
		{"pool without namespace", []string{"epp", "--config", eppYAML(t, "epp:\n  pool:\n    name: vllm\n    namespace: \"\"\n")}, []string{"epp.pool.namespace"}},
		{"unknown key", []string{"epp", "--config", eppYAML(t, "epp:\n  lisen: 127.0.0.1:9002\n")}, []string{"lisen"}},
		{"missing kubeconfig", []string{"epp", "--check", "--config", eppYAML(t, "epp:\n  pool:\n    name: vllm\n    kubeconfig: /nonexistent/kubeconfig\n")}, []string{"epp.pool.kubeconfig"}},
		{"an argument", []string{"epp", "serve"}, []string{"takes no arguments"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLIWithin(t, 30*time.Second, tc.args...)
			wantUsage(t, tc.args, code, out, errOut, tc.mentions...)
		})
	}
	code, out, errOut := runCLIWithin(t, 30*time.Second, "epp", "--check", "--config", eppYAML(t, "epp:\n  listen: 127.0.0.1:0\n"))
	if code != 0 || !strings.Contains(out, ": ok") {
		t.Fatalf("--check of a good configuration: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = runCLIWithin(t, 30*time.Second, "epp", "--help")
	for _, want := range []string{"--config", "--check", "request_body_mode: FULL_DUPLEX_STREAMED", "response_header_mode: SEND", "allow_mode_override: false", "message_timeout"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("epp --help (exit %d) lacks %q", code, want)
		}
	}
}
