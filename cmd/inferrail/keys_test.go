package main

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/live"
	"github.com/inferrail/inferrail/live/config"
)

// keysAdmin serves the admin API of a gateway with auth: keys on a SQLite
// store (its replica need not answer: no request is proxied) behind an
// admin token; it returns the API's URL and the token file.
func keysAdmin(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	tok := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(tok, []byte("keys-test-admin-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := config.Default()
	m := config.DefaultModel()
	m.Name = "m"
	m.Replicas = []config.Replica{{Name: "a", URL: "http://127.0.0.1:1"}}
	c.Models = []config.Model{m}
	c.Auth = config.AuthKeys
	c.Tenancy.Store = filepath.Join(dir, "tenancy.db")
	c.AdminTokenFile = tok
	s, err := live.New(&c, live.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.AdminHandler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	return srv.URL, tok
}

// keys create, list, show, update, revoke and usage against a live admin
// API: the plaintext is printed once, bad input exits 2 on one line naming
// the field, an unreachable admin API exits 1.
func TestKeysCommands(t *testing.T) {
	admin, tok := keysAdmin(t)
	flags := []string{"--admin", admin, "--token-file", tok}
	cli := func(args ...string) (int, string, string) {
		return runCLIWithin(t, time.Minute, append(args, flags...)...)
	}
	code, out, errOut := cli("keys", "create", "--name", "team-a", "--rpm", "600", "--tpm", "unlimited", "--model", "m", "--expires", "30d", "--priority", "4")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	key := strings.TrimSpace(out)
	if !strings.HasPrefix(key, "ir-") || strings.Count(out, "\n") != 1 || !strings.Contains(errOut, "shown this once") || !strings.Contains(errOut, "rpm 600, tpm unlimited") {
		t.Fatalf("create printed %q, %q", out, errOut)
	}
	id := key[3:15]
	code, out, errOut = cli("keys", "list")
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "team-a") || strings.Contains(out, key) || !strings.Contains(out, "MAX_CONCURRENCY") {
		t.Fatalf("list: exit %d: %q %q", code, out, errOut)
	}
	code, out, _ = cli("keys", "list", "--json")
	var list struct {
		Data []apiKey `json:"data"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Data) != 1 || *list.Data[0].RPM != 600 {
		t.Fatalf("list --json: exit %d: %q", code, out)
	}
	if code, out, errOut = cli("keys", "update", id, "--rpm", "unlimited", "--all-models", "--expires", "never", "--disabled"); code != 0 ||
		!strings.Contains(out, "rpm unlimited") || !strings.Contains(out, "every model") || !strings.Contains(out, "never expires") || !strings.Contains(out, "disabled") {
		t.Fatalf("update: exit %d: %q %q", code, out, errOut)
	}
	if code, out, _ = cli("keys", "show", id); code != 0 || !strings.Contains(out, "priority 4") {
		t.Fatalf("show: exit %d: %q", code, out)
	}
	code, out, errOut = cli("usage")
	if code != 0 || !strings.Contains(out, "REQUESTS") || !strings.Contains(out, "total") {
		t.Fatalf("usage: exit %d: %q %q", code, out, errOut)
	}
	if code, out, _ = cli("usage", "--json", "--since", "24h", "--key", id); code != 0 || !strings.Contains(out, `"data": []`) {
		t.Fatalf("usage --json: exit %d: %q", code, out)
	}
	if code, out, errOut = cli("keys", "revoke", id); code != 0 || !strings.Contains(out, "revoked "+id) {
		t.Fatalf("revoke: exit %d: %q %q", code, out, errOut)
	}
	// Bad input: exit 2, one line, naming the problem.
	for _, c := range []struct {
		args     []string
		mentions []string
	}{
		{[]string{"keys", "create", "--name", "x", "--rpm", "-5"}, []string{"rpm: must be a positive integer, or null for unlimited, got -5"}},
		{[]string{"keys", "create", "--name", "x", "--tpm", "0"}, []string{"tpm:", "got 0"}},
		{[]string{"keys", "create", "--name", "x", "--rpm", "lots"}, []string{"--rpm must be a positive integer"}},
		{[]string{"keys", "create", "--rpm", "5"}, []string{"--name is required"}},
		{[]string{"keys", "create", "--name", "x", "--expires", "soon"}, []string{"--expires"}},
		{[]string{"keys", "create", "--name", "x", "--priority", "2000"}, []string{"priority"}},
		{[]string{"keys", "revoke", id}, []string{"404", "no key with id"}},
		{[]string{"keys", "update", id}, []string{"nothing to change"}},
		{[]string{"keys", "revoke", key}, []string{"not the key itself"}},
		{[]string{"keys", "revoke"}, []string{"one key id"}},
		{[]string{"usage", "--since", "last week"}, []string{"--since"}},
	} {
		code, out, errOut := cli(c.args...)
		wantUsage(t, c.args, code, out, errOut, c.mentions...)
		if strings.Contains(errOut, key[15:]) {
			t.Errorf("%v: stderr repeats the secret", c.args)
		}
	}
	args := []string{"keys", "frobnicate"}
	code, out, errOut = runCLIWithin(t, time.Minute, args...)
	wantUsage(t, args, code, out, errOut, "unknown command", "create")
	// A wrong token, a bad --admin: bad input too.
	bad := filepath.Join(t.TempDir(), "bad-token")
	os.WriteFile(bad, []byte("not-the-admin-token-at-all\n"), 0o600)
	args = []string{"keys", "list", "--admin", admin, "--token-file", bad}
	code, out, errOut = runCLIWithin(t, time.Minute, args...)
	wantUsage(t, args, code, out, errOut, "401", "--token-file")
	args = []string{"keys", "list", "--admin", "127.0.0.1:9090"}
	code, out, errOut = runCLIWithin(t, time.Minute, args...)
	wantUsage(t, args, code, out, errOut, "--admin must be")
	// An admin API that does not answer: exit 1, one line.
	code, out, errOut = runCLIWithin(t, time.Minute, "keys", "list", "--admin", "http://127.0.0.1:1")
	if code != 1 || out != "" || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "127.0.0.1:1") {
		t.Fatalf("unreachable admin API: exit %d, %q %q", code, out, errOut)
	}
}

// `inferrail live` with a key store it cannot reach exits at once on one
// line that names the store's host, never its password.
func TestLiveUnreachableStoreExits(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "live.yaml")
	doc := "admin_listen: \"\"\nauth: keys\ntenancy:\n  store: postgres://gw:hunter2-secret@127.0.0.1:1/inferrail?connect_timeout=2\nmodels:\n  - name: m\n    kv_capacity_blocks: 1000\n    replicas:\n      - url: http://127.0.0.1:1\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"live", "--config", path}, {"live", "--check", "--config", path}} {
		code, out, errOut := runCLIWithin(t, time.Minute, args...)
		if code == 0 || out != "" || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
		if !strings.Contains(errOut, "tenancy.store") || !strings.Contains(errOut, "127.0.0.1:1") || strings.Contains(errOut, "hunter2") {
			t.Fatalf("%v: stderr %q should name tenancy.store and 127.0.0.1:1, never the password", args, errOut)
		}
	}
	// A SQLite file in a directory that does not exist, likewise.
	doc = strings.Replace(doc, "postgres://gw:hunter2-secret@127.0.0.1:1/inferrail?connect_timeout=2", filepath.Join(dir, "nope", "t.db"), 1)
	os.WriteFile(path, []byte(doc), 0o644)
	code, _, errOut := runCLIWithin(t, time.Minute, "live", "--check", "--config", path)
	if code == 0 || !strings.Contains(errOut, filepath.Join(dir, "nope")) {
		t.Fatalf("sqlite: exit %d, %q", code, errOut)
	}
}
