package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/internal/openai"
	"github.com/inferrail/inferrail/internal/testpg"
	"github.com/inferrail/inferrail/internal/testredis"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/tenancy"
	"github.com/inferrail/inferrail/tenancy/limit"
	"github.com/inferrail/inferrail/tenancy/sqlstore"
)

// tenantGateway is a gateway with auth: keys (a SQLite store in a
// temporary directory unless the test says otherwise), its admin API
// served beside it, and its process log captured.
type tenantGateway struct {
	*testGateway
	admin *httptest.Server
	logs  *syncBuffer
	cfg   *config.Config
}

// startTenantGateway starts a gateway in front of up with auth: keys;
// mutate changes the configuration first. Usage is flushed by reading
// /admin/usage (the periodic flush is an hour away) unless mutate says.
func startTenantGateway(t testing.TB, up *upstream, mutate func(*config.Config), deps Deps) *tenantGateway {
	t.Helper()
	c := testConfig(t, up)
	c.Auth = config.AuthKeys
	c.Tenancy.Store = filepath.Join(t.TempDir(), "tenancy.db")
	c.Tenancy.UsageFlushInterval = time.Hour
	if mutate != nil {
		mutate(c)
	}
	logs := &syncBuffer{}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	g := startGatewayDeps(t, c, deps)
	admin := httptest.NewServer(g.AdminHandler())
	t.Cleanup(admin.Close)
	return &tenantGateway{testGateway: g, admin: admin, logs: logs, cfg: c}
}

// adminCall sends one admin API call (body marshalled unless it is a
// string) and returns the status and the body.
func (g *tenantGateway) adminCall(t testing.TB, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, g.admin.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// createKey creates a key over the admin API and returns its id and
// plaintext.
func (g *tenantGateway) createKey(t testing.TB, fields map[string]any) (id, plain string) {
	t.Helper()
	if _, ok := fields["name"]; !ok {
		fields["name"] = "team-" + strconv.Itoa(len(fields))
	}
	status, body := g.adminCall(t, "POST", "/admin/keys", fields)
	if status != http.StatusCreated {
		t.Fatalf("POST /admin/keys %v: %d %s", fields, status, body)
	}
	var v keyView
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	if v.Key == "" || v.ID == "" || !strings.HasPrefix(v.Key, "ir-"+v.ID+"-") {
		t.Fatalf("created key %s", body)
	}
	return v.ID, v.Key
}

// usageRows flushes and reads /admin/usage?query.
func (g *tenantGateway) usageRows(t testing.TB, query string) []tenancy.Usage {
	t.Helper()
	status, body := g.adminCall(t, "GET", "/admin/usage"+query, nil)
	if status != http.StatusOK {
		t.Fatalf("GET /admin/usage%s: %d %s", query, status, body)
	}
	var out struct {
		Data []tenancy.Usage `json:"data"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatal(err)
	}
	return out.Data
}

// callWith sends one completion with the API key (none when ""), reads
// the answer whole and returns it.
func callWith(t testing.TB, g *testGateway, key string, body map[string]any, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	h := map[string]string{}
	for k, v := range hdr {
		h[k] = v
	}
	if key != "" {
		h["Authorization"] = "Bearer " + key
	}
	resp, err := g.post(t.Context(), "/v1/completions", body, h)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// completion is a non-streamed completion body of prompt and max_tokens,
// run to max_tokens.
func completion(prompt string, maxTokens int) map[string]any {
	return map[string]any{"prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true}
}

// errorOf decodes an OpenAI error body.
func errorOf(t testing.TB, b []byte) openai.ErrorInfo {
	t.Helper()
	var e openai.ErrorBody
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("not an OpenAI error body: %v: %s", err, b)
	}
	return e.Error
}

// promptTokens is what the gateway's tokenizer makes of a completion
// prompt.
func promptTokens(t testing.TB, prompt string) int {
	return len(simModel(t).EncodeCompletion(prompt))
}

// The quick start: a key created over the admin API, a request made with
// it, its usage read back exactly after a flush.
func TestTenancyQuickStart(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, nil, Deps{})
	id, key := g.createKey(t, map[string]any{"name": "team-a", "rpm": 600, "tpm": 100000})
	prompt := words(100, 40)
	const n, maxTokens = 3, 7
	for range n {
		resp, body := callWith(t, g.testGateway, key, completion(prompt, maxTokens), nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if got := resp.Header.Get(limit.HeaderLimitRequests); got != "600" {
			t.Errorf("x-ratelimit-limit-requests %q, want 600", got)
		}
		if resp.Header.Get(limit.HeaderRemainingTokens) == "" || resp.Header.Get(limit.HeaderResetRequests) == "" {
			t.Errorf("headers %v lack x-ratelimit-remaining-tokens or -reset-requests", resp.Header)
		}
	}
	rows := g.usageRows(t, "?key="+id)
	if len(rows) != 1 {
		t.Fatalf("usage rows %+v, want one", rows)
	}
	u := rows[0]
	p := promptTokens(t, prompt)
	if u.KeyID != id || u.Model != server.DefaultModelName || u.Requests != n || u.Errors != 0 ||
		u.PromptTokens != int64(n*p) || u.OutputTokens != n*maxTokens || !u.Hour.Equal(tenancy.HourOf(time.Now())) {
		t.Fatalf("usage %+v, want %d requests of %d prompt and %d output tokens", u, n, p, maxTokens)
	}
	if u.TTFTSeconds <= 0 || u.DurationSeconds < u.TTFTSeconds || u.QueueSeconds < 0 {
		t.Fatalf("usage times %+v", u)
	}
	// SQLite announces no key changes: no watch, no watch metric.
	if strings.Contains(admin(t, g.testGateway, "/metrics"), "inferrail_tenancy_key_watch_up") {
		t.Error("inferrail_tenancy_key_watch_up exported with a SQLite store")
	}
	// The other filters.
	if rows := g.usageRows(t, "?model=nope"); len(rows) != 0 {
		t.Fatalf("model=nope: %+v", rows)
	}
	since := queryTime(time.Now().Add(time.Hour))
	if rows := g.usageRows(t, "?since="+since); len(rows) != 0 {
		t.Fatalf("since an hour ahead: %+v", rows)
	}
	// The key's requests are its tenant's: the access log names no key,
	// and the status page counts what the limiter holds (nothing now).
	status, body := g.adminCall(t, "GET", "/admin/status", nil)
	var st statusView
	if status != 200 || json.Unmarshal(body, &st) != nil || st.Limiter.Mode != "local" || st.Limiter.Reservations != 0 || st.Store == nil || st.Store.Backend != "sqlite" || st.Cache == nil || st.Cache.Keys != 1 {
		t.Fatalf("status %d %s", status, body)
	}
	if len(st.Models) != 1 || st.Models[0].ByPriority == nil || len(st.Models[0].ByPriority) != 0 {
		t.Fatalf("the queue per priority class, empty now: %s", body)
	}
}

// queryTime writes a time for a query string.
func queryTime(t time.Time) string {
	return strings.ReplaceAll(t.UTC().Format(time.RFC3339), "+", "%2B")
}

// Every key that cannot be used is a 401 in OpenAI's shape, whose body
// never repeats the key.
func TestTenancyUnauthorized(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, nil, Deps{})
	id, key := g.createKey(t, map[string]any{"name": "good"})
	revokedID, revoked := g.createKey(t, map[string]any{"name": "revoked"})
	disabledID, disabled := g.createKey(t, map[string]any{"name": "disabled"})
	// An expired key cannot be made through the API (expires_at must be
	// in the future): write it to the store.
	ek, expired, err := tenancy.NewKey("expired", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ek.ExpiresAt = time.Now().Add(-time.Minute)
	if _, err := g.ten.store.CreateKey(t.Context(), ek); err != nil {
		t.Fatal(err)
	}
	// Used once, so the cache holds them: revocation and disabling must
	// still apply at once.
	for _, k := range []string{key, revoked, disabled} {
		if resp, body := callWith(t, g.testGateway, k, completion("hi there", 2), nil); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	if status, body := g.adminCall(t, "DELETE", "/admin/keys/"+revokedID, nil); status != 200 || !strings.Contains(string(body), `"deleted": true`) {
		t.Fatalf("DELETE: %d %s", status, body)
	}
	if status, body := g.adminCall(t, "PATCH", "/admin/keys/"+disabledID, map[string]any{"disabled": true}); status != 200 {
		t.Fatalf("PATCH: %d %s", status, body)
	}
	wrongSecret := key[:len(key)-4] + "AAAA"
	if wrongSecret == key {
		wrongSecret = key[:len(key)-4] + "BBBB"
	}
	unknown := "ir-" + strings.Repeat("Z", tenancy.IDLen) + "-" + strings.Repeat("a", tenancy.SecretLen)
	cases := []struct {
		name, header, mention string
	}{
		{"missing", "", "didn't provide an API key"},
		{"not bearer", "Basic " + key, "not an inferrail API key"},
		{"malformed", "Bearer sk-abcdef", "not an inferrail API key"},
		{"truncated", "Bearer " + key[:len(key)-1], "not an inferrail API key"},
		{"unknown id", "Bearer " + unknown, "no such key"},
		{"wrong secret", "Bearer " + wrongSecret, "no such key"},
		{"revoked", "Bearer " + revoked, "no such key"},
		{"disabled", "Bearer " + disabled, "disabled"},
		{"expired", "Bearer " + expired, "expired"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{}
			if c.header != "" {
				hdr["Authorization"] = c.header
			}
			resp, body := callWith(t, g.testGateway, "", completion("hi there", 2), hdr)
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("%d %s, want 401", resp.StatusCode, body)
			}
			e := errorOf(t, body)
			if e.Type != "invalid_request_error" || e.Code.String() != "invalid_api_key" || !strings.Contains(e.Message, c.mention) {
				t.Fatalf("error %+v, want invalid_request_error/invalid_api_key mentioning %q", e, c.mention)
			}
			for _, secret := range []string{key, revoked, disabled, expired, wrongSecret, key[len(key)-tenancy.SecretLen:]} {
				if strings.Contains(string(body), secret) {
					t.Fatalf("the body %s repeats a key", body)
				}
			}
			if resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("no WWW-Authenticate")
			}
		})
	}
	// Two Authorization headers are one too many.
	req, _ := http.NewRequest("POST", g.base+"/v1/completions", strings.NewReader(`{"prompt":"x","max_tokens":1}`))
	req.Header.Add("Authorization", "Bearer "+key)
	req.Header.Add("Authorization", "Bearer "+key)
	resp, err := g.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("two Authorization headers: %d", resp.StatusCode)
	}
	// The good key still works, and the outcomes were counted.
	if resp, body := callWith(t, g.testGateway, key, completion("hi there", 2), nil); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	for outcome, want := range map[string]float64{"missing": 1, "malformed": 4, "invalid": 3, "disabled": 1, "expired": 1, "ok": 4} {
		if got := counterValue(t, g.met.auth.WithLabelValues(outcome)); got != want {
			t.Errorf("inferrail_auth_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
	_ = id
}

// A key limited to some models is refused the others with 403; a key
// listing an alias may use that alias.
func TestTenancyModelNotAllowed(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, nil, Deps{})
	_, other := g.createKey(t, map[string]any{"name": "other", "models": []string{"some-other-model"}})
	_, alias := g.createKey(t, map[string]any{"name": "alias", "models": []string{"sim"}})
	_, canonical := g.createKey(t, map[string]any{"name": "canonical", "models": []string{server.DefaultModelName}})
	try := func(key, model string) (int, openai.ErrorInfo) {
		body := completion("hi there", 2)
		body["model"] = model
		resp, b := callWith(t, g.testGateway, key, body, nil)
		if resp.StatusCode == 200 {
			return 200, openai.ErrorInfo{}
		}
		return resp.StatusCode, errorOf(t, b)
	}
	if code, e := try(other, server.DefaultModelName); code != 403 || e.Code.String() != "model_not_allowed" || !strings.Contains(e.Message, "not allowed to use the model `"+server.DefaultModelName+"`") {
		t.Fatalf("other model: %d %+v", code, e)
	}
	if code, e := try(alias, "sim"); code != 200 {
		t.Fatalf("alias by its alias: %d %+v", code, e)
	}
	if code, _ := try(alias, server.DefaultModelName); code != 403 {
		t.Fatalf("alias key by the model's name: %d, want 403", code)
	}
	for _, m := range []string{"sim", server.DefaultModelName} {
		if code, e := try(canonical, m); code != 200 {
			t.Fatalf("canonical key, %s: %d %+v", m, code, e)
		}
	}
}

// The key's priority caps the request's: the header may lower it, never
// raise it; without the header the request gets the key's.
func TestTenancyPriorityCap(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, nil, Deps{})
	k := tenancy.Key{ID: "k", Priority: 5}
	for _, c := range []struct {
		header string
		parsed int
		want   int
	}{{"", 0, 5}, {"2", 2, 2}, {"9", 9, 5}, {" ", 0, 5}} {
		in := &inbound{m: g.models[0], req: gateway.Request{Priority: c.parsed}}
		h := http.Header{}
		if c.header != "" {
			h.Set(HeaderPriority, c.header)
		}
		if e := g.authorize(&grant{key: k, keyID: "k"}, in, h); e != nil {
			t.Fatal(e.msg)
		}
		if in.req.Priority != c.want {
			t.Errorf("header %q: priority %d, want %d", c.header, in.req.Priority, c.want)
		}
	}
	// The key's id is the request's tenant, whatever the header says.
	id, key := g.createKey(t, map[string]any{"name": "tenant", "priority": 3})
	var tenant atomic.Value
	g2 := startTenantGateway(t, up, func(c *config.Config) { c.Tenancy.Store = g.cfg.Tenancy.Store }, Deps{Trace: func(_ string, ev gateway.TraceEvent) {
		if ev.Op == "submit" {
			tenant.Store(ev.Request.Tenant + "/" + strconv.Itoa(ev.Request.Priority))
		}
	}})
	if resp, body := callWith(t, g2.testGateway, key, completion("hi there", 2), map[string]string{HeaderTenant: "someone-else", HeaderPriority: "9"}); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if got, _ := tenant.Load().(string); got != id+"/3" {
		t.Fatalf("tenant/priority %q, want the key's id and priority %s/3", got, id)
	}
}

// counterValue reads a counter.
func counterValue(t testing.TB, c interface{ Write(*dtoMetric) error }) float64 {
	t.Helper()
	var m dtoMetric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// readAll reads a whole directory's files (a SQLite database with its WAL).
func readAll(t testing.TB, dir string) []byte {
	t.Helper()
	var all []byte
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		all = append(all, b...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return all
}

type dtoMetric = dto.Metric

var (
	_ = fmt.Sprintf
	_ = sync.Mutex{}
	_ = context.Background
)

// RPM: a key of 2 requests per minute gets its third answered 429 with
// Retry-After and OpenAI's headers, naming the bucket and the dimension;
// the key x model and global buckets refuse likewise.
func TestTenancyRPM(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, func(c *config.Config) {
		c.Models[0].KeyLimits = config.Limits{RPM: 3}
		c.Tenancy.Limits.Global = config.Limits{RPM: 5}
	}, Deps{})
	_, key := g.createKey(t, map[string]any{"name": "a", "rpm": 2})
	for i, wantRemaining := range []string{"1", "0"} {
		resp, body := callWith(t, g.testGateway, key, completion("hi there", 1), nil)
		if resp.StatusCode != 200 || resp.Header.Get(limit.HeaderLimitRequests) != "2" || resp.Header.Get(limit.HeaderRemainingRequests) != wantRemaining {
			t.Fatalf("request %d: %d %v %s", i, resp.StatusCode, resp.Header, body)
		}
	}
	resp, body := callWith(t, g.testGateway, key, completion("hi there", 1), nil)
	e := errorOf(t, body)
	if resp.StatusCode != 429 || e.Code.String() != "rate_limit_exceeded" || e.Type != "requests" ||
		!strings.Contains(e.Message, "requests per minute (RPM, bucket key)") || !strings.Contains(e.Message, "Limit 2") || !strings.Contains(e.Message, "try again in") {
		t.Fatalf("third: %d %s", resp.StatusCode, body)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
		t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	if resp.Header.Get(limit.HeaderRemainingRequests) != "0" || resp.Header.Get(limit.HeaderResetRequests) == "" {
		t.Fatalf("headers of the 429: %v", resp.Header)
	}
	// key x model: 3 per minute for each key on the model.
	_, other := g.createKey(t, map[string]any{"name": "b"})
	for range 3 {
		if resp, body := callWith(t, g.testGateway, other, completion("hi there", 1), nil); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	resp, body = callWith(t, g.testGateway, other, completion("hi there", 1), nil)
	if e := errorOf(t, body); resp.StatusCode != 429 || !strings.Contains(e.Message, "bucket key_model") || !strings.Contains(e.Message, "Limit 3") {
		t.Fatalf("key x model: %d %s", resp.StatusCode, body)
	}
	// global: 5 in all (2 + 3 admitted so far).
	_, third := g.createKey(t, map[string]any{"name": "c"})
	resp, body = callWith(t, g.testGateway, third, completion("hi there", 1), nil)
	if e := errorOf(t, body); resp.StatusCode != 429 || !strings.Contains(e.Message, "bucket global") || !strings.Contains(e.Message, "the gateway (global)") {
		t.Fatalf("global: %d %s", resp.StatusCode, body)
	}
	for kind, want := range map[string]float64{"key": 1, "key_model": 1, "global": 1} {
		if got := counterValue(t, g.met.ratelimit.WithLabelValues(kind, "rpm")); got != want {
			t.Errorf("inferrail_ratelimit_total{bucket_kind=%q,reason=rpm} = %v, want %v", kind, got, want)
		}
	}
	if got := counterValue(t, g.met.ratelimit.WithLabelValues("all", "allowed")); got != 5 {
		t.Errorf("allowed %v, want 5", got)
	}
}

// TPM is charged on the estimate (prompt + max_tokens) and reconciled
// with the engine's usage: a request that used fewer tokens refunds the
// rest, so the next fits; one whose estimate exceeds the limit never fits.
func TestTenancyTPMReconciled(t *testing.T) {
	// The engine stops after 2 tokens unless ignore_eos.
	up := newUpstream(t, server.Config{Engine: testEngineConfig(), OutputTokens: 2})
	g := startTenantGateway(t, up, nil, Deps{})
	prompt := words(300, 20)
	p := promptTokens(t, prompt)
	const maxTokens = 50
	est := p + maxTokens
	// Two estimates do not fit; one actual use and one estimate do.
	limitTPM := p + 2 + est + 4
	if limitTPM >= 2*est {
		t.Fatalf("prompt of %d tokens: the test needs TPM %d below two estimates (%d)", p, limitTPM, 2*est)
	}
	id, key := g.createKey(t, map[string]any{"name": "tokens", "tpm": limitTPM})
	body := map[string]any{"prompt": prompt, "max_tokens": maxTokens}
	resp, b := callWith(t, g.testGateway, key, body, nil)
	if resp.StatusCode != 200 || resp.Header.Get(limit.HeaderLimitTokens) != strconv.Itoa(limitTPM) || resp.Header.Get(limit.HeaderRemainingTokens) != strconv.Itoa(limitTPM-est) {
		t.Fatalf("first: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	resp, b = callWith(t, g.testGateway, key, body, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("second (fits only once the first refunded %d tokens): %d %s", maxTokens-2, resp.StatusCode, b)
	}
	resp, b = callWith(t, g.testGateway, key, body, nil)
	e := errorOf(t, b)
	if resp.StatusCode != 429 || e.Type != "tokens" || !strings.Contains(e.Message, "tokens per minute (TPM, bucket key)") || !strings.Contains(e.Message, fmt.Sprintf("Limit %d, Requested %d", limitTPM, est)) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	// Too large: refused at once, whatever the bucket holds, no Retry-After.
	resp, b = callWith(t, g.testGateway, key, map[string]any{"prompt": prompt, "max_tokens": limitTPM}, nil)
	e = errorOf(t, b)
	if resp.StatusCode != 429 || !strings.Contains(e.Message, "Request too large") || !strings.Contains(e.Message, "never fit") || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("too large: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	// The usage: what the engine really produced.
	rows := g.usageRows(t, "?key="+id)
	if len(rows) != 1 || rows[0].Requests != 2 || rows[0].OutputTokens != 4 || rows[0].PromptTokens != int64(2*p) || rows[0].Errors != 0 {
		t.Fatalf("usage %+v", rows)
	}
}

// Concurrency is a lease: taken at admission, renewed while the request
// runs past lease_ttl, released when it ends, and when its client leaves.
func TestTenancyConcurrencyLease(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, func(c *config.Config) { c.Tenancy.LeaseTTL = 150 * time.Millisecond }, Deps{})
	_, key := g.createKey(t, map[string]any{"name": "one-at-a-time", "max_concurrency": 1})
	long := map[string]any{"prompt": "hi there", "max_tokens": 600, "ignore_eos": true, "stream": true}
	start := func(ctx context.Context) *http.Response {
		resp, err := g.post(ctx, "/v1/completions", long, map[string]string{"Authorization": "Bearer " + key})
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return resp
	}
	// One streams for longer than the lease: a second is refused all along.
	resp := start(t.Context())
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, resp.Body); resp.Body.Close(); close(done) }()
	refused := 0
	for i := 0; i < 3; i++ {
		time.Sleep(120 * time.Millisecond)
		select {
		case <-done:
			t.Fatal("the long request ended too soon for the test")
		default:
		}
		r2, b := callWith(t, g.testGateway, key, completion("hi there", 1), nil)
		e := errorOf(t, b)
		if r2.StatusCode != 429 || !strings.Contains(e.Message, "concurrent requests (max_concurrency, bucket key)") || r2.Header.Get("Retry-After") != "1" {
			t.Fatalf("while one runs (%v in): %d %s", time.Duration(i+1)*120*time.Millisecond, r2.StatusCode, b)
		}
		refused++
	}
	<-done
	waitUntil(t, "the lease to be released", 2*time.Second, func() bool { return g.ten.active.Load() == 0 })
	if r2, b := callWith(t, g.testGateway, key, completion("hi there", 1), nil); r2.StatusCode != 200 {
		t.Fatalf("after the end: %d %s", r2.StatusCode, b)
	}
	// A client that leaves mid-stream frees its slot.
	ctx, cancel := context.WithCancel(t.Context())
	resp = start(ctx)
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	waitUntil(t, "the lease of a client that left to be released", 3*time.Second, func() bool { return g.ten.active.Load() == 0 })
	if r2, b := callWith(t, g.testGateway, key, completion("hi there", 1), nil); r2.StatusCode != 200 {
		t.Fatalf("after the client left: %d %s", r2.StatusCode, b)
	}
	if refused != 3 {
		t.Fatal(refused)
	}
}

// With auth: none, key_limits apply to all requests for the model
// together (the key "anonymous"), and usage is metered under that id when
// a store is configured.
func TestTenancyAnonymous(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, func(c *config.Config) {
		c.Auth = config.AuthNone
		c.Models[0].KeyLimits = config.Limits{RPM: 2}
	}, Deps{})
	for range 2 {
		if resp, body := callWith(t, g.testGateway, "", completion("hi there", 3), nil); resp.StatusCode != 200 || resp.Header.Get(limit.HeaderLimitRequests) != "2" {
			t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
		}
	}
	resp, body := callWith(t, g.testGateway, "", completion("hi there", 3), nil)
	if e := errorOf(t, body); resp.StatusCode != 429 || !strings.Contains(e.Message, "(key_limits)") {
		t.Fatalf("third: %d %s", resp.StatusCode, body)
	}
	rows := g.usageRows(t, "?key=anonymous")
	if len(rows) != 1 || rows[0].Requests != 2 || rows[0].OutputTokens != 6 {
		t.Fatalf("usage %+v", rows)
	}
	// Without limits or a store, tenancy is off: no grant at all.
	g2 := startGateway(t, testConfig(t, up))
	if g2.ten != nil {
		t.Fatal("tenancy on without auth, store or limits")
	}
}

// Neither the plaintext key nor its secret is ever stored or logged: the
// SQLite files and the whole debug log are read after a key's whole life.
func TestTenancyKeysNeverInPlaintext(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	dir := t.TempDir()
	g := startTenantGateway(t, up, func(c *config.Config) {
		c.Tenancy.Store = filepath.Join(dir, "tenancy.db")
		c.Log.AccessSample = 1
	}, Deps{})
	id, key := g.createKey(t, map[string]any{"name": "secret-keeper", "rpm": 100})
	secret := key[len(key)-tenancy.SecretLen:]
	for _, k := range []string{key, key[:len(key)-1] + "x", "ir-" + id + "-" + strings.Repeat("A", tenancy.SecretLen)} {
		callWith(t, g.testGateway, k, completion("hi there", 2), nil)
	}
	g.adminCall(t, "PATCH", "/admin/keys/"+id, map[string]any{"rpm": 5})
	g.usageRows(t, "")
	g.adminCall(t, "DELETE", "/admin/keys/"+id, nil)
	callWith(t, g.testGateway, key, completion("hi there", 2), nil)
	g.stop()
	db := readAll(t, dir)
	if !bytes.Contains(db, []byte(id)) {
		t.Fatal("the database does not hold the key's id: wrong file?")
	}
	logs := g.logs.String()
	if !strings.Contains(logs, id) || !strings.Contains(logs, "access") {
		t.Fatalf("the log names neither the key's id nor the requests:\n%s", logs)
	}
	for what, b := range map[string][]byte{"database": db, "log": []byte(logs)} {
		if bytes.Contains(b, []byte(key)) || bytes.Contains(b, []byte(secret)) {
			t.Errorf("the %s holds the plaintext key or its secret", what)
		}
	}
}

// flakyStore is a store whose key lookups and usage writes fail on demand.
type flakyStore struct {
	tenancy.Store
	failing atomic.Bool
	writes  atomic.Int64 // AddUsage calls that failed
}

var errFlaky = fmt.Errorf("connection refused (test)")

func (f *flakyStore) GetKey(ctx context.Context, id string) (tenancy.Key, error) {
	if f.failing.Load() {
		return tenancy.Key{}, errFlaky
	}
	return f.Store.GetKey(ctx, id)
}

func (f *flakyStore) AddUsage(ctx context.Context, rows []tenancy.Usage) error {
	if f.failing.Load() {
		f.writes.Add(1)
		return errFlaky
	}
	return f.Store.AddUsage(ctx, rows)
}

// While the store fails, a cached key is served (up to 10 x
// auth_cache_ttl) and an uncached one is answered 503; usage rows wait in
// the buffer (bounded: the rest are dropped and counted), the outage is
// logged once, and everything is written once the store is back.
func TestTenancyStoreUnavailable(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	st, err := openStore(t, filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	flaky := &flakyStore{Store: st}
	g := startTenantGateway(t, up, func(c *config.Config) {
		c.Tenancy.AuthCacheTTL = 100 * time.Millisecond
		c.Tenancy.UsageBuffer = 2
		c.Tenancy.UsageFlushInterval = 20 * time.Millisecond
	}, Deps{Store: flaky})
	cachedID, cached := g.createKey(t, map[string]any{"name": "cached"})
	uncachedID, uncached := g.createKey(t, map[string]any{"name": "uncached"})
	thirdID, third := g.createKey(t, map[string]any{"name": "third"})
	if resp, body := callWith(t, g.testGateway, cached, completion("hi there", 2), nil); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	waitUntil(t, "the first flush", 2*time.Second, func() bool { return g.ten.meter.pending() == 0 })
	flaky.failing.Store(true)
	for range 3 {
		if resp, body := callWith(t, g.testGateway, cached, completion("hi there", 2), nil); resp.StatusCode != 200 {
			t.Fatalf("a cached key while the store fails: %d %s", resp.StatusCode, body)
		}
	}
	resp, body := callWith(t, g.testGateway, uncached, completion("hi there", 2), nil)
	if e := errorOf(t, body); resp.StatusCode != 503 || e.Code.String() != "key_store_unavailable" || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("an uncached key while the store fails: %d %s", resp.StatusCode, body)
	}
	waitUntil(t, "a failed usage write", 2*time.Second, func() bool { return flaky.writes.Load() >= 2 })
	// Past 10 x auth_cache_ttl the cached key is refused too.
	time.Sleep(1100 * time.Millisecond)
	if resp, body := callWith(t, g.testGateway, cached, completion("hi there", 2), nil); resp.StatusCode != 503 {
		t.Fatalf("a stale key past max_stale: %d %s", resp.StatusCode, body)
	}
	flaky.failing.Store(false)
	for _, k := range []string{uncached, third} {
		if resp, body := callWith(t, g.testGateway, k, completion("hi there", 2), nil); resp.StatusCode != 200 {
			t.Fatalf("the store back: %d %s", resp.StatusCode, body)
		}
	}
	rows := g.usageRows(t, "")
	byKey := map[string]tenancy.Usage{}
	for _, u := range rows {
		byKey[u.KeyID] = u
	}
	// The buffer holds 2 rows: cached's and uncached's; third's came when it
	// was full... unless the flush emptied it first. Either way every row
	// written is exact and every row missing was counted.
	if u := byKey[cachedID]; u.Requests != 4 || u.OutputTokens != 8 {
		t.Fatalf("the cached key's usage %+v (rows %+v)", u, rows)
	}
	dropped := g.ten.meter.dropped.Load()
	if u, ok := byKey[thirdID]; ok == (dropped == 1) || ok && u.Requests != 1 {
		t.Fatalf("third's row %+v present %v, dropped %d", u, ok, dropped)
	}
	if u := byKey[uncachedID]; u.Requests != 1 {
		t.Fatalf("uncached's usage %+v", u)
	}
	logs := g.logs.String()
	if n := strings.Count(logs, "usage write to the store failed"); n != 1 {
		t.Errorf("the usage outage was logged %d times, want once", n)
	}
	if n := strings.Count(logs, "key store unavailable: requests"); n != 1 {
		t.Errorf("the key store outage was logged %d times, want once", n)
	}
	if !strings.Contains(logs, "usage writes to the store work again") || !strings.Contains(logs, "key store reachable again") {
		t.Errorf("no recovery logged:\n%s", logs)
	}
	if got := counterValue(t, g.met.storeErrors.WithLabelValues("usage_flush")); got < 2 {
		t.Errorf("usage_flush store errors %v", got)
	}
}

// A full usage buffer drops new rows and counts them.
func TestTenancyUsageBufferBound(t *testing.T) {
	m := newMeter(nil, 2, time.Hour, slog.New(slog.DiscardHandler), newMetrics(&Server{version: "test"}))
	defer func() {
		m.mu.Lock()
		clear(m.rows) // no store to write them to
		m.mu.Unlock()
		m.close()
	}()
	now := time.Now()
	for i := range 5 {
		m.add(tenancy.Usage{KeyID: "k" + strconv.Itoa(i%3), Model: "m", Hour: now, Requests: 1})
	}
	if m.pending() != 2 || m.dropped.Load() != 1 {
		t.Fatalf("pending %d, dropped %d; want 2 rows (merged) and 1 dropped", m.pending(), m.dropped.Load())
	}
	if got := counterValue(t, m.met.usageDropped); got != 1 {
		t.Fatalf("inferrail_usage_rows_dropped_total %v", got)
	}
}

// slowAckStore counts the requests of every usage write as soon as the
// write starts (it commits), then takes ack to answer, or fails if its
// context ends first: a commit whose reply is late.
type slowAckStore struct {
	tenancy.Store
	ack      time.Duration
	calls    atomic.Int64
	requests atomic.Int64
}

func (s *slowAckStore) AddUsage(ctx context.Context, rows []tenancy.Usage) error {
	s.calls.Add(1)
	for _, u := range rows {
		s.requests.Add(u.Requests)
	}
	select {
	case <-time.After(s.ack):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Closing the meter during a periodic write that has committed lets it
// finish: cancelling it made its rows look unwritten and the last flush
// added them again (TestTenancyThreeGatewaysRedis saw 141 requests metered
// for 140 served, once).
func TestTenancyUsageCloseDuringAWrite(t *testing.T) {
	st := &slowAckStore{ack: 300 * time.Millisecond}
	m := newMeter(st, 16, 20*time.Millisecond, slog.New(slog.DiscardHandler), newMetrics(&Server{version: "test"}))
	m.add(tenancy.Usage{KeyID: "k", Model: "m", Hour: time.Now(), Requests: 1})
	waitUntil(t, "the periodic write to start", 5*time.Second, func() bool { return st.calls.Load() > 0 })
	m.close()
	if got := st.requests.Load(); got != 1 {
		t.Fatalf("1 request metered as %d after a close during its write", got)
	}
	if m.pending() != 0 {
		t.Fatalf("%d rows left unwritten", m.pending())
	}
}

// openStore opens a store for a test.
func openStore(t testing.TB, dsn string) (tenancy.Store, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := sqlstore.Open(ctx, dsn)
	if err == nil {
		t.Cleanup(func() { st.Close() })
	}
	return st, err
}

// The Postgres store, a real server (internal/testpg): the quick start,
// and /admin/status showing the DSN without its password.
func TestTenancyPostgres(t *testing.T) {
	dsn := strings.Replace(testpg.Start(t), "postgres://postgres@", "postgres://postgres:hunter2pw@", 1)
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, func(c *config.Config) { c.Tenancy.Store = dsn }, Deps{})
	id, key := g.createKey(t, map[string]any{"name": "pg", "rpm": 10})
	for range 2 {
		if resp, body := callWith(t, g.testGateway, key, completion("hello postgres", 3), nil); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	rows := g.usageRows(t, "?key="+id)
	if len(rows) != 1 || rows[0].Requests != 2 || rows[0].OutputTokens != 6 {
		t.Fatalf("usage %+v", rows)
	}
	status, body := g.adminCall(t, "GET", "/admin/status", nil)
	if status != 200 || strings.Contains(string(body), "hunter2pw") || !strings.Contains(string(body), `"backend": "postgres"`) || !strings.Contains(string(body), "xxxxx") {
		t.Fatalf("status %d %s", status, body)
	}
	if strings.Contains(g.logs.String(), "hunter2pw") {
		t.Fatal("the log holds the store's password")
	}
}

// redisConfig points the limiter at a test Redis.
func redisConfig(srv *testredis.Server, policy string, gateways int) func(*config.Config) {
	return func(c *config.Config) {
		c.Tenancy.Redis.Address = "unix://" + srv.Addr
		c.Tenancy.Redis.OnRedisError = policy
		c.Tenancy.Redis.Gateways = gateways
		c.Tenancy.Redis.Timeout = 50 * time.Millisecond
	}
}

// statuses sends n requests with key and returns their statuses in order.
func statuses(t testing.TB, g *testGateway, key string, n int) []int {
	out := make([]int, n)
	for i := range out {
		resp, _ := callWith(t, g, key, completion("hi there", 1), nil)
		out[i] = resp.StatusCode
	}
	return out
}

// The Redis limiter (a real redis-server) stopped mid-test and restarted:
// closed answers 503 limiter_unavailable, open admits, local enforces this
// gateway's share; once Redis is back the same gateway limits through it
// again, without a restart (the limits restart empty).
func TestTenancyRedisPolicies(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	for _, policy := range []string{"closed", "open", "local"} {
		t.Run(policy, func(t *testing.T) {
			srv := testredis.Start(t)
			g := startTenantGateway(t, up, redisConfig(srv, policy, 2), Deps{})
			_, key := g.createKey(t, map[string]any{"name": "k", "rpm": 4})
			_, probe := g.createKey(t, map[string]any{"name": "probe", "rpm": 100000})
			if got := statuses(t, g.testGateway, key, 5); fmt.Sprint(got) != "[200 200 200 200 429]" {
				t.Fatalf("through Redis: %v", got)
			}
			srv.Stop()
			down := statuses(t, g.testGateway, key, 5)
			want := map[string]string{"closed": "[503 503 503 503 503]", "open": "[200 200 200 200 200]", "local": "[200 200 429 429 429]"}[policy]
			if fmt.Sprint(down) != want {
				t.Fatalf("Redis stopped: %v, want %v", down, want)
			}
			if policy == "closed" {
				resp, body := callWith(t, g.testGateway, key, completion("hi there", 1), nil)
				if e := errorOf(t, body); resp.StatusCode != 503 || e.Code.String() != "limiter_unavailable" || resp.Header.Get("Retry-After") != "1" {
					t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
				}
			}
			if got := counterValue(t, g.met.ratelimitFallback.WithLabelValues(policy)); got < 5 {
				t.Errorf("fallback decisions %v, want at least 5", got)
			}
			if g.ten.redis.Stats().Errors == 0 || counterValue(t, g.met.limiterErrors.WithLabelValues("reserve")) == 0 {
				t.Error("no Redis error counted")
			}
			srv.Restart()
			began := time.Now()
			waitUntil(t, "the limiter to reach Redis again", 10*time.Second, func() bool {
				before := g.ten.redis.Stats()
				resp, _ := callWith(t, g.testGateway, probe, completion("hi there", 1), nil)
				after := g.ten.redis.Stats()
				return resp.StatusCode == 200 && after.Errors == before.Errors && after.Open == before.Open && after.Local == before.Local
			})
			recovered := time.Since(began)
			if got := statuses(t, g.testGateway, key, 5); fmt.Sprint(got) != "[200 200 200 200 429]" {
				t.Fatalf("Redis back (limits restart empty): %v", got)
			}
			t.Logf("on_redis_error %s: Redis stopped: %v; restarted: recovered after %v, then [200 200 200 200 429] through Redis", policy, down, recovered.Round(time.Millisecond))
			if !strings.Contains(g.logs.String(), "redis limiter failing") || !strings.Contains(g.logs.String(), "redis limiter reachable again") {
				t.Errorf("the outage and the recovery are not logged:\n%s", g.logs.String())
			}
		})
	}
}

// admission is one answered request of the multi-gateway test, on the
// test's clock: the limiter decided on it between sent and recv (when its
// answer's headers came back); tokens is what it used, est its estimate.
type admission struct {
	sent, recv  time.Duration
	tokens, est int
}

// Three gateways (each its own go-redis client) share one Redis and one
// Postgres; 64 clients hammer one key with RPM and TPM limits over a 2s
// window. Admissions never exceed the limiter's bound (tenancy/limit's
// invariants 2 and 3: in any interval [a, b], L + (b-a)·L/W; in a window
// that begins at a refusal, L, and for tokens L plus one estimate), and
// the usage rows of the three add up to what was admitted. Each check
// counts only the requests certainly decided inside its interval (sent
// after its start, answered before its end), so the clocks of the test
// and of Redis need not agree.
func TestTenancyThreeGatewaysRedis(t *testing.T) {
	srv := testredis.Start(t)
	dsn := testpg.Start(t)
	// The engine stops after 6 tokens unless max_tokens is lower: most
	// requests refund part of their estimate.
	up := newUpstream(t, server.Config{Engine: testEngineConfig(), OutputTokens: 6})
	const (
		window  = 2 * time.Second
		rpm     = 40
		tpm     = 300
		run     = 5 * time.Second
		clients = 64
	)
	var gws []*tenantGateway
	for range 3 {
		gws = append(gws, startTenantGateway(t, up, func(c *config.Config) {
			c.Tenancy.Store = dsn
			c.Tenancy.Window = window
			c.Tenancy.UsageFlushInterval = 200 * time.Millisecond
			redisConfig(srv, "closed", 3)(c)
			c.Tenancy.Redis.Timeout = 2 * time.Second // 2 cores, 64 clients, -race: no call may time out
		}, Deps{Logger: slog.New(slog.DiscardHandler)}))
	}
	id, key := gws[0].createKey(t, map[string]any{"name": "shared", "rpm": rpm, "tpm": tpm})
	prompt := "hello three gateways"
	p := promptTokens(t, prompt)
	var (
		mu       sync.Mutex
		admitted []admission
		refused  = map[string][]admission{} // by dimension: rpm, tpm
		other    = map[string]int{}         // answers other than 200 and 429 on rpm or tpm, by status and code
	)
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			g := gws[c%3]
			for n := 0; time.Since(start) < run; n++ {
				maxTokens := 1 + (c+n)%12
				sent := time.Since(start)
				resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": maxTokens}, map[string]string{"Authorization": "Bearer " + key})
				recv := time.Since(start)
				if err != nil {
					mu.Lock()
					other[err.Error()]++
					mu.Unlock()
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				a := admission{sent: sent, recv: recv, est: p + maxTokens}
				what := func() string { return strconv.Itoa(resp.StatusCode) + " " + string(b) }
				mu.Lock()
				switch resp.StatusCode {
				case 200:
					var r struct {
						Usage struct {
							CompletionTokens int `json:"completion_tokens"`
						} `json:"usage"`
					}
					json.Unmarshal(b, &r)
					a.tokens = p + r.Usage.CompletionTokens
					admitted = append(admitted, a)
				case 429:
					switch {
					case strings.Contains(string(b), "requests per minute"):
						refused["rpm"] = append(refused["rpm"], a)
					case strings.Contains(string(b), "tokens per minute"):
						refused["tpm"] = append(refused["tpm"], a)
					default:
						other[what()]++
					}
				default:
					other[what()]++
				}
				mu.Unlock()
				if resp.StatusCode != 200 {
					time.Sleep(25 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(other) > 0 {
		t.Fatalf("answers other than 200 and 429 on rpm or tpm: %v", other)
	}
	// within sums the admissions certainly decided in [from, to].
	within := func(from, to time.Duration) (n, tokens int) {
		for _, a := range admitted {
			if a.sent >= from && a.recv <= to {
				n++
				tokens += a.tokens
			}
		}
		return n, tokens
	}
	bound := func(l int, d time.Duration) float64 { return float64(l) + float64(l)*float64(d)/float64(window) }
	maxEst := p + 12
	worstReq, worstTok := -1e9, -1e9 // admitted minus the bound, at worst
	maxInWindow, maxTokInWindow := 0, 0
	for _, a := range admitted {
		for _, b := range admitted {
			if b.recv <= a.sent {
				continue
			}
			n, tok := within(a.sent, b.recv)
			worstReq = max(worstReq, float64(n)-bound(rpm, b.recv-a.sent))
			worstTok = max(worstTok, float64(tok)-bound(tpm, b.recv-a.sent)-float64(maxEst))
		}
		n, tok := within(a.sent, a.sent+window)
		maxInWindow, maxTokInWindow = max(maxInWindow, n), max(maxTokInWindow, tok)
	}
	// A window that begins at a refusal admits at most L (RPM), and
	// charges at most L plus one estimate (TPM, reconciled).
	steady, steadyTok := 0, 0
	for _, r := range refused["rpm"] {
		n, _ := within(r.recv, r.sent+window)
		steady = max(steady, n)
	}
	for _, r := range refused["tpm"] {
		_, tok := within(r.recv, r.sent+window)
		// The refunds of the requests in flight at the refusal are applied
		// inside the window and make room in it: they count against it
		// (every request that may have been in flight: sent before the
		// refusal's answer, answered after 50ms before it was sent, as
		// Finish follows the answer by a little).
		refunds := 0
		for _, a := range admitted {
			if a.sent < r.recv && a.recv > r.sent-50*time.Millisecond {
				refunds += a.est - a.tokens
			}
		}
		steadyTok = max(steadyTok, tok-refunds)
	}
	total, tokens := len(admitted), 0
	for _, a := range admitted {
		tokens += a.tokens
	}
	t.Logf("3 gateways, 1 Redis, 1 Postgres, %d clients, 1 key: rpm %d, tpm %d, window %v, %v: %d admitted (bound L+T·L/W = %.0f), %d tokens used (bound %.0f + one estimate); "+
		"most requests in any window %d (bound 2L = %d), in a window starting at an RPM refusal %d (bound L = %d); most tokens in any window %d (bound 2·TPM + e = %d), in a window starting at a TPM refusal, net of the refunds made in it, %d (bound TPM + e = %d); refusals: %d on RPM, %d on TPM",
		clients, rpm, tpm, window, elapsed.Round(time.Millisecond), total, bound(rpm, elapsed), tokens, bound(tpm, elapsed), maxInWindow, 2*rpm, steady, rpm,
		maxTokInWindow, 2*tpm+maxEst, steadyTok, tpm+maxEst, len(refused["rpm"]), len(refused["tpm"]))
	if worstReq > 0 || worstTok > 0 {
		t.Fatalf("admissions above the bound: requests by %.1f, tokens by %.1f", worstReq, worstTok)
	}
	if steady > rpm || steadyTok > tpm+maxEst {
		t.Fatalf("a window starting at a refusal admitted %d requests (rpm %d) and %d tokens (tpm %d + estimate %d)", steady, rpm, steadyTok, tpm, maxEst)
	}
	if total < rpm || len(refused["rpm"]) == 0 || len(refused["tpm"]) == 0 {
		t.Fatalf("%d admitted, refusals %d on rpm and %d on tpm: the test did not reach both limits", total, len(refused["rpm"]), len(refused["tpm"]))
	}
	// Every gateway's usage reaches the store: the rows add up.
	for _, g := range gws {
		g.stop()
	}
	st, err := openStore(t, dsn)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := st.Usage(t.Context(), tenancy.UsageQuery{KeyID: id})
	if err != nil {
		t.Fatal(err)
	}
	var sum tenancy.Usage
	for _, u := range rows {
		sum.Add(u)
	}
	if sum.Requests != int64(total) || sum.Errors != 0 || sum.PromptTokens+sum.OutputTokens != int64(tokens) {
		t.Fatalf("usage %+v, want %d requests and %d tokens", sum, total, tokens)
	}
}

// byteTokenizer writes a byte-level tokenizer.json with no merges (a token
// per byte of the prompt) and returns its path: an edge tokenizer that
// counts differently from the mock engine's.
func byteTokenizer(t testing.TB) string {
	t.Helper()
	// GPT-2's byte-to-character alphabet.
	var bs []int
	for _, r := range [][2]int{{'!', '~'}, {0xA1, 0xAC}, {0xAE, 0xFF}} {
		for b := r[0]; b <= r[1]; b++ {
			bs = append(bs, b)
		}
	}
	chars := map[int]rune{}
	for _, b := range bs {
		chars[b] = rune(b)
	}
	n := 0
	for b := range 256 {
		if _, ok := chars[b]; !ok {
			chars[b] = rune(256 + n)
			n++
		}
	}
	vocab := map[string]int{}
	for b := range 256 {
		vocab[string(chars[b])] = b
	}
	tj := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": []any{},
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []string{}},
	}
	data, err := json.Marshal(tj)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Usage is metered with the engine's prompt count when its answer gives
// one (usage.prompt_tokens: every whole body, a stream whose client asked
// for usage), not the edge tokenizer's, which may be another model's
// (builtin:sim by default); a stream without usage is metered with the
// edge's count. The access log says the same count.
func TestTenancyMetersTheEnginesPromptCount(t *testing.T) {
	for _, asked := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream_usage=%v", asked), func(t *testing.T) {
			up := newUpstream(t, server.Config{Engine: testEngineConfig()})
			tok := byteTokenizer(t)
			g := startTenantGateway(t, up, func(c *config.Config) {
				c.Models[0].Tokenizer = tok
				c.Log.AccessSample = 1
				c.StreamUsage = asked
			}, Deps{})
			_, key := g.createKey(t, map[string]any{"name": "team-a"})
			prompt := words(100, 40)
			edge := len(prompt) // a token per byte
			const maxTokens = 5

			resp, body := callWith(t, g.testGateway, key, completion(prompt, maxTokens), nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			var whole struct {
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(body, &whole); err != nil {
				t.Fatal(err)
			}
			engine := whole.Usage.PromptTokens
			if engine <= 0 || engine == edge {
				t.Fatalf("the engine counted %d prompt tokens, the edge %d: the test needs two different counts", engine, edge)
			}
			// A stream that asks for usage, and one that does not: each
			// client gets what it asked for.
			for _, usage := range []bool{true, false} {
				b := completion(prompt, maxTokens)
				b["stream"] = true
				if usage {
					b["stream_options"] = map[string]any{"include_usage": true}
				}
				resp, body := callWith(t, g.testGateway, key, b, nil)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("stream (usage %v): %d %s", usage, resp.StatusCode, body)
				}
				if got := strings.Contains(string(body), `"usage"`); got != usage || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
					t.Fatalf("stream (usage asked %v): usage in the stream %v, want %v, and data: [DONE] last:\n%s", usage, got, usage, body)
				}
			}
			var prompts int64
			for _, u := range g.usageRows(t, "") {
				prompts += u.PromptTokens
			}
			// The stream without usage: the engine's count when the proxy
			// asked for it, else the edge's.
			want, edges := int64(3*engine), 0
			if !asked {
				want, edges = int64(2*engine+edge), 1
			}
			if prompts != want {
				t.Fatalf("metered %d prompt tokens, want %d (the engine counts %d, the edge %d)", prompts, want, engine, edge)
			}
			logs := g.logs.String()
			if c := strings.Count(logs, fmt.Sprintf("prompt_tokens=%d ", engine)); c != 3-edges {
				t.Errorf("%d access log lines with the engine's prompt_tokens=%d, want %d:\n%s", c, engine, 3-edges, logs)
			}
			if c := strings.Count(logs, fmt.Sprintf("prompt_tokens=%d ", edge)); c != edges {
				t.Errorf("%d access log lines with the edge's prompt_tokens=%d, want %d:\n%s", c, edge, edges, logs)
			}
		})
	}
}

// A key revoked through one gateway is refused by another sharing the
// Postgres store at once (the store's NOTIFY), not after auth_cache_ttl
// (an hour here); /admin/status says the watch is listening.
func TestTenancyRevocationReachesOtherGateways(t *testing.T) {
	dsn := testpg.Start(t)
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	var gws []*tenantGateway
	for range 2 {
		gws = append(gws, startTenantGateway(t, up, func(c *config.Config) {
			c.Tenancy.Store = dsn
			c.Tenancy.AuthCacheTTL = time.Hour
		}, Deps{}))
	}
	a, b := gws[0], gws[1]
	for _, g := range gws {
		waitUntil(t, "the key watch listening", 10*time.Second, func() bool {
			_, body := g.adminCall(t, "GET", "/admin/status", nil)
			var st statusView
			return json.Unmarshal(body, &st) == nil && st.Store != nil && st.Store.Watch == "listening"
		})
	}
	if body := admin(t, b.testGateway, "/metrics"); !strings.Contains(body, "\ninferrail_tenancy_key_watch_up 1\n") {
		t.Fatalf("the key watch listening, but not inferrail_tenancy_key_watch_up 1:\n%s", body)
	}
	id, key := a.createKey(t, map[string]any{"name": "team-a"})
	if resp, body := callWith(t, b.testGateway, key, completion("hello", 2), nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("through the other gateway: %d %s", resp.StatusCode, body) // now cached there for an hour
	}
	if status, body := a.adminCall(t, "DELETE", "/admin/keys/"+id, nil); status/100 != 2 {
		t.Fatalf("revoke: %d %s", status, body)
	}
	revoked := time.Now()
	waitUntil(t, "the other gateway refusing the revoked key", 5*time.Second, func() bool {
		resp, _ := callWith(t, b.testGateway, key, completion("hello", 2), nil)
		return resp.StatusCode == http.StatusUnauthorized
	})
	t.Logf("refused by the other gateway %v after the revocation", time.Since(revoked).Round(time.Millisecond))
}
