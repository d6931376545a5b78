package live

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
)

// Bad input to the admin API is a 400 in OpenAI's error shape whose param
// and message name the field; nothing is created or changed.
func TestAdminKeysValidation(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, nil, Deps{})
	id, _ := g.createKey(t, map[string]any{"name": "base"})
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	cases := []struct {
		name, method, path string
		body               any
		status             int
		param, mention     string
	}{
		{"negative rpm", "POST", "/admin/keys", map[string]any{"name": "x", "rpm": -5}, 400, "rpm", "rpm: must be a positive integer, or null for unlimited, got -5"},
		{"zero rpm", "POST", "/admin/keys", map[string]any{"name": "x", "rpm": 0}, 400, "rpm", "got 0"},
		{"zero tpm", "POST", "/admin/keys", map[string]any{"name": "x", "tpm": 0}, 400, "tpm", "tpm: must be a positive integer"},
		{"negative concurrency", "POST", "/admin/keys", map[string]any{"name": "x", "max_concurrency": -1}, 400, "max_concurrency", "got -1"},
		{"fractional rpm", "POST", "/admin/keys", map[string]any{"name": "x", "rpm": 1.5}, 400, "rpm", "got 1.5"},
		{"string tpm", "POST", "/admin/keys", map[string]any{"name": "x", "tpm": "100"}, 400, "tpm", "positive integer"},
		{"huge rpm", "POST", "/admin/keys", map[string]any{"name": "x", "rpm": 1e12}, 400, "rpm", "rpm: must be at most 1000000000"},
		{"priority too high", "POST", "/admin/keys", map[string]any{"name": "x", "priority": 1001}, 400, "priority", "from 0 to 1000"},
		{"no name", "POST", "/admin/keys", map[string]any{"rpm": 5}, 400, "name", "required"},
		{"empty name", "POST", "/admin/keys", map[string]any{"name": " "}, 400, "name", "must not be empty"},
		{"bad model", "POST", "/admin/keys", map[string]any{"name": "x", "models": []string{"a b"}}, 400, "models[0]", "models[0]"},
		{"models not a list", "POST", "/admin/keys", map[string]any{"name": "x", "models": "m"}, 400, "models", "list of model names"},
		{"expired already", "POST", "/admin/keys", map[string]any{"name": "x", "expires_at": past}, 400, "expires_at", "in the future"},
		{"expiry not rfc3339", "POST", "/admin/keys", map[string]any{"name": "x", "expires_at": "tomorrow"}, 400, "expires_at", "RFC 3339"},
		{"unknown field", "POST", "/admin/keys", map[string]any{"name": "x", "rpn": 5}, 400, "rpn", "unknown field"},
		{"not an object", "POST", "/admin/keys", `[1, 2]`, 400, "", "one JSON object"},
		{"trailing data", "POST", "/admin/keys", `{"name": "x"} {}`, 400, "", "one JSON object"},
		{"too large", "POST", "/admin/keys", `{"name": "` + strings.Repeat("x", maxAdminBody) + `"}`, 413, "", "exceeds"},
		{"patch negative", "PATCH", "/admin/keys/" + id, map[string]any{"tpm": -5}, 400, "tpm", "got -5"},
		{"patch disabled string", "PATCH", "/admin/keys/" + id, map[string]any{"disabled": "yes"}, 400, "disabled", "true or false"},
		{"patch unknown key", "PATCH", "/admin/keys/AAAAAAAAAAAA", map[string]any{"rpm": 5}, 404, "", "no key with id"},
		{"bad id", "GET", "/admin/keys/nope", nil, 404, "", "no key with id"},
		{"usage bad since", "GET", "/admin/usage?since=yesterday", nil, 400, "since", "RFC 3339"},
		{"usage unknown param", "GET", "/admin/usage?from=x", nil, 400, "from", "unknown parameter"},
		{"usage until before since", "GET", "/admin/usage?since=2030-01-02T00:00:00Z&until=2030-01-01T00:00:00Z", nil, 400, "until", "after since"},
		{"wrong method", "PUT", "/admin/keys/" + id, map[string]any{}, 405, "", "use GET, PATCH, DELETE"},
		{"unknown path", "GET", "/admin/nothing", nil, 404, "", "unknown admin path"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := g.adminCall(t, c.method, c.path, c.body)
			if status != c.status {
				t.Fatalf("%d %s, want %d", status, body, c.status)
			}
			e := errorOf(t, body)
			param := ""
			if e.Param != nil {
				param = *e.Param
			}
			if param != c.param || !strings.Contains(e.Message, c.mention) || e.Type != "invalid_request_error" {
				t.Fatalf("error %+v (param %q), want param %q mentioning %q", e, param, c.param, c.mention)
			}
		})
	}
	// Nothing was created but the base key.
	status, body := g.adminCall(t, "GET", "/admin/keys", nil)
	var list struct {
		Object string    `json:"object"`
		Data   []keyView `json:"data"`
	}
	if status != 200 || json.Unmarshal(body, &list) != nil || list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != id {
		t.Fatalf("GET /admin/keys: %d %s", status, body)
	}
}

// A key's whole life through the admin API: created with every field,
// listed, read, changed (a null limit is unlimited again), revoked; its
// secret is shown once and never again.
func TestAdminKeysLifecycle(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, nil, Deps{})
	exp := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
	status, body := g.adminCall(t, "POST", "/admin/keys", map[string]any{
		"name": "team-a", "priority": 7, "rpm": 60, "tpm": 6000, "max_concurrency": 4,
		"models": []string{server.DefaultModelName}, "expires_at": exp.Format(time.RFC3339), "disabled": false,
	})
	if status != 201 {
		t.Fatalf("%d %s", status, body)
	}
	var created keyView
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	if created.Name != "team-a" || created.Priority != 7 || *created.RPM != 60 || *created.TPM != 6000 || *created.MaxConcurrency != 4 ||
		len(created.Models) != 1 || !created.ExpiresAt.Equal(exp) || created.Object != "api_key" {
		t.Fatalf("created %s", body)
	}
	secret := created.Key[len(created.Key)-43:]
	for _, path := range []string{"/admin/keys", "/admin/keys/" + created.ID} {
		status, body := g.adminCall(t, "GET", path, nil)
		if status != 200 || !strings.Contains(string(body), created.ID) || strings.Contains(string(body), secret) || strings.Contains(string(body), `"key"`) {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
	}
	status, body = g.adminCall(t, "PATCH", "/admin/keys/"+created.ID, map[string]any{"rpm": nil, "tpm": 10, "models": nil, "expires_at": nil, "name": "team-b"})
	var patched keyView
	if status != 200 || json.Unmarshal(body, &patched) != nil {
		t.Fatalf("PATCH: %d %s", status, body)
	}
	if patched.RPM != nil || *patched.TPM != 10 || patched.Models != nil || patched.ExpiresAt != nil || patched.Name != "team-b" || patched.Priority != 7 || !strings.Contains(string(body), `"rpm": null`) {
		t.Fatalf("patched %s", body)
	}
	if status, body := g.adminCall(t, "DELETE", "/admin/keys/"+created.ID, nil); status != 200 {
		t.Fatalf("DELETE: %d %s", status, body)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if status, body := g.adminCall(t, m, "/admin/keys/"+created.ID, nil); status != 404 || errorOf(t, body).Code.String() != "key_not_found" {
			t.Fatalf("%s after revoke: %d %s", m, status, body)
		}
	}
	// The log says what the admin did, by key id.
	if logs := g.logs.String(); !strings.Contains(logs, "admin: key created") || !strings.Contains(logs, "admin: key revoked") || strings.Contains(logs, secret) {
		t.Fatalf("logs:\n%s", logs)
	}
}

// The admin API is behind the admin token; without a store its key paths
// say so; /admin/status serves every gateway.
func TestAdminAuthAndNoStore(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("0123456789abcdef-admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := testConfig(t, up)
	c.AdminTokenFile = tokFile
	g := startGateway(t, c)
	admin := httptest.NewServer(g.AdminHandler())
	defer admin.Close()
	get := func(path, token string) (int, string) {
		req, _ := http.NewRequest("GET", admin.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, _ := get("/admin/keys", ""); status != 401 {
		t.Fatalf("no token: %d", status)
	}
	if status, body := get("/admin/keys", "0123456789abcdef-admin"); status != 404 || !strings.Contains(body, "tenancy_disabled") {
		t.Fatalf("no store: %d %s", status, body)
	}
	status, body := get("/admin/status", "0123456789abcdef-admin")
	var st statusView
	if status != 200 || json.Unmarshal([]byte(body), &st) != nil || st.Auth != config.AuthNone || st.Limiter.Mode != "none" || len(st.Models) != 1 || len(st.Replicas) != 1 || st.Store != nil {
		t.Fatalf("status: %d %s", status, body)
	}
}

// A CPU profile longer than write_timeout is served whole: the admin
// server's write deadline would cut it (an empty reply); a bad seconds is
// a 400 that says what to give.
func TestProfileLongerThanWriteTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("samples a CPU profile for 1 s")
	}
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := testConfig(t, up)
	c.Pprof = true
	c.WriteTimeout = 300 * time.Millisecond
	g := startGateway(t, c)
	admin := httptest.NewServer(g.AdminHandler())
	defer admin.Close()
	resp, err := http.Get(admin.URL + "/debug/pprof/profile?seconds=1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || len(b) == 0 {
		t.Fatalf("profile: %d, %d bytes, %v", resp.StatusCode, len(b), err)
	}
	for _, q := range []string{"0", "x", "100000"} {
		resp, err := http.Get(admin.URL + "/debug/pprof/profile?seconds=" + q)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), "whole number of seconds") {
			t.Fatalf("seconds=%s: %d %s", q, resp.StatusCode, b)
		}
	}
}
