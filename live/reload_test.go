package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	ossignal "os/signal"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
)

// fileConfig is a configuration written as YAML, as an operator writes
// it: the tests edit it and write it again.
type fileConfig struct {
	Policy           string
	QueueMax         int
	QueueTimeout     string
	MaxConcurrency   int
	Replicas         [][2]string // name, url
	Profile          string
	Tokenizer        string
	Top, ModelExtra  string // raw YAML: top level, and inside the model
	RequestTimeout   string
	EjectTime        string
	AdminTokenFile   string
	ExtraModelsBlock string // raw YAML list items after the model
}

func newFileConfig(t testing.TB, ups ...*upstream) fileConfig {
	f := fileConfig{Policy: "cost_model", QueueMax: 1024, QueueTimeout: "30s", MaxConcurrency: 256, Profile: profileFile(t, testEngineConfig()), EjectTime: "200ms"}
	for i, u := range ups {
		f.Replicas = append(f.Replicas, [2]string{string(rune('a' + i)), u.url()})
	}
	return f
}

func (f fileConfig) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "health: {interval: 50ms, timeout: 50ms, eject_time: %s, max_eject_time: 10m}\n", f.EjectTime)
	b.WriteString("scrape: {interval: 50ms, timeout: 40ms}\nretry: {backoff: 1ms, max_backoff: 5ms}\npredicted_cached_header: true\n")
	if f.RequestTimeout != "" {
		fmt.Fprintf(&b, "request_timeout: %s\n", f.RequestTimeout)
	}
	if f.AdminTokenFile != "" {
		fmt.Fprintf(&b, "admin_token_file: %s\n", f.AdminTokenFile)
	}
	b.WriteString(f.Top)
	fmt.Fprintf(&b, "models:\n  - name: %s\n    aliases: [sim]\n    policy: %s\n    profile: %s\n", server.DefaultModelName, f.Policy, f.Profile)
	if f.Tokenizer != "" {
		fmt.Fprintf(&b, "    tokenizer: %s\n", f.Tokenizer)
	}
	fmt.Fprintf(&b, "    max_concurrency: %d\n    max_pending: %d\n    queue: {max_requests: %d, timeout: %s}\n", f.MaxConcurrency, f.MaxConcurrency, f.QueueMax, f.QueueTimeout)
	b.WriteString(f.ModelExtra)
	b.WriteString("    replicas:\n")
	for _, r := range f.Replicas {
		fmt.Fprintf(&b, "      - {name: %s, url: %q}\n", r[0], r[1])
	}
	b.WriteString(f.ExtraModelsBlock)
	return b.String()
}

// writeFile replaces path's content whole (a write and a rename, as an
// editor saves).
func writeFile(t testing.TB, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startFromFile writes f and starts a gateway from the file, as
// `inferrail live --config` does.
func startFromFile(t testing.TB, f fileConfig) (*testGateway, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "live.yaml")
	writeFile(t, path, f.yaml())
	c, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return startGatewayDeps(t, c, Deps{ConfigPath: path}), path
}

// reload writes f and reloads it.
func (g *testGateway) reload(t testing.TB, path string, f fileConfig) ReloadResult {
	t.Helper()
	writeFile(t, path, f.yaml())
	res, err := g.Reload(ReloadAdmin)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	return res
}

// policyNow is the policy the model's core routes with.
func (g *testGateway) policyNow() string {
	m := g.models[0]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.core.Router().Policy().Name()
}

// streamBG starts a streaming completion of n tokens; its error (nil: a
// whole 200 stream) arrives on the channel.
func (g *testGateway) streamBG(prompt string, n int) <-chan error {
	ch := make(chan error, 1)
	go func() {
		_, _, err := g.complete(context.Background(), prompt, n)
		ch <- err
	}()
	return ch
}

func waitErr(t testing.TB, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no end within 20s", what)
	}
}

// A reload that changes the policy and a queue limit applies both to new
// requests, while a stream that started before finishes as it began.
func TestReloadPolicyAndQueueLimit(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	f := newFileConfig(t, up)
	f.MaxConcurrency, f.QueueMax = 1, 0 // one request at a time, no queue
	g, path := startFromFile(t, f)
	long := g.streamBG(words(100, 30), 400)
	waitUntil(t, "the long stream in flight", 5*time.Second, func() bool { n, _ := g.inFlight(); return n == 1 })
	resp, _, err := g.complete(context.Background(), words(300, 20), 4)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a second request without a queue: %v, want 429", err)
	}

	f.Policy, f.QueueMax = "round_robin", 8
	f.ModelExtra = "    shadow_policy: p2c\n"
	res := g.reload(t, path, f)
	for _, want := range []string{"models[inferrail-sim].policy: cost_model -> round_robin", "models[inferrail-sim].queue.max_requests: 0 -> 8", `models[inferrail-sim].shadow_policy: "" -> p2c`} {
		if !slices.Contains(res.Changes, want) {
			t.Errorf("changes %q: want %q", res.Changes, want)
		}
	}
	if len(res.NeedsRestart) != 0 {
		t.Errorf("needs restart: %q", res.NeedsRestart)
	}
	if p := g.policyNow(); p != "round_robin" {
		t.Fatalf("policy %s after the reload", p)
	}
	m := g.models[0]
	m.mu.Lock()
	st, shadowed := m.core.ShadowStats()
	m.mu.Unlock()
	if !shadowed || st.Primary != "round_robin" || st.Shadow != "p2c" {
		t.Fatalf("shadow after the reload: %+v, %v", st, shadowed)
	}
	// The queue takes the next request now; it is served once the long
	// stream ends, routed by the new policy.
	resp, _, err = g.complete(context.Background(), words(300, 20), 4)
	if err != nil {
		t.Fatalf("a queued request after the reload: %v", err)
	}
	if resp.Header.Get(HeaderQueued) == "0" {
		t.Fatal("the request did not wait in the queue")
	}
	waitErr(t, long, "the stream in flight across the reload")
	if n := testutil.ToFloat64(g.met.decisions.WithLabelValues(server.DefaultModelName, "round_robin", "a")); n != 1 {
		t.Fatalf("%v decisions labelled round_robin, want 1", n)
	}
	if n := testutil.ToFloat64(g.met.reloads.WithLabelValues("ok")); n != 1 {
		t.Fatalf("%v reloads counted ok", n)
	}
}

// Replicas that stay keep their counters, health, ejection, index
// entries, requests in flight and reservations across reloads that change
// the queue and the policy: a repeated prompt is predicted as cached as
// before.
func TestReloadKeepsReplicaStateAndIndex(t *testing.T) {
	ec := server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true}
	f := newFileConfig(t, newUpstream(t, ec), newUpstream(t, ec))
	f.EjectTime = "1m" // the ejection below outlasts the test
	g, path := startFromFile(t, f)
	m := g.models[0]
	// Replica b is ejected: every request goes to a.
	m.mu.Lock()
	for range 3 {
		m.core.Failure(m.now(), m.byName["b"].idx)
	}
	m.mu.Unlock()
	prompt := words(500, 100)
	predicted := func() string {
		t.Helper()
		resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != "a" {
			t.Fatalf("status %d on %q", resp.StatusCode, resp.Header.Get(HeaderReplica))
		}
		return resp.Header.Get(HeaderPredicted)
	}
	predicted()
	want := predicted()
	if want == "0" || want == "" {
		t.Fatalf("a repeated prompt predicted %q cached tokens", want)
	}
	long := g.streamBG(words(2000, 40), 300)
	waitUntil(t, "the stream in flight", 5*time.Second, func() bool { n, p := g.inFlight(); return n == 1 && p == 0 })
	type kept struct {
		ejections, peak, indexBlocks, inFlight, reserved int
		ejectedUntil                                     string
		healthy                                          bool
	}
	state := func() map[string]kept {
		out := map[string]kept{}
		for _, v := range g.replicaViews() {
			out[v.Replica] = kept{v.Ejections, v.PeakInFlight, v.IndexBlocks, v.InFlight, v.ReservedBlocks, v.EjectedUntil, v.Healthy}
		}
		return out
	}
	before := state()
	if before["b"].ejections != 1 || before["b"].healthy || before["a"].inFlight != 1 || before["a"].reserved == 0 {
		t.Fatalf("setup: %+v", before)
	}
	for i, edit := range []func(*fileConfig){
		func(f *fileConfig) { f.QueueTimeout = "20s" },
		func(f *fileConfig) { f.Policy = "kv_aware" },
		func(f *fileConfig) { f.Policy, f.QueueMax = "cost_model", 100 },
	} {
		edit(&f)
		g.reload(t, path, f)
		if after := state(); !equalMaps(after, before) {
			t.Fatalf("reload %d: replica state %+v, before %+v", i+1, after, before)
		}
	}
	waitErr(t, long, "the stream in flight across the reloads")
	if got := predicted(); got != want {
		t.Fatalf("after the reloads a repeated prompt is predicted %s cached tokens, before %s", got, want)
	}
	waitUntil(t, "every reservation released", 5*time.Second, func() bool { return g.reserved() == 0 })
}

// allInFlight counts the requests in flight on every replica, those a
// reload removed included.
func (g *testGateway) allInFlight() int {
	n := 0
	for _, m := range g.models {
		m.mu.Lock()
		for _, r := range m.reps {
			n += m.core.State(m.now(), r.idx).Load.InFlight
		}
		m.mu.Unlock()
	}
	return n
}

func equalMaps[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A replica added by a reload gets traffic; one removed gets no new
// request while its stream in flight finishes, and its series go once it
// has; a name given another engine starts fresh.
func TestReloadAddsAndRemovesReplicas(t *testing.T) {
	ec := server.Config{Engine: testEngineConfig()}
	a, b, c, d := newUpstream(t, ec), newUpstream(t, ec), newUpstream(t, ec), newUpstream(t, ec)
	f := newFileConfig(t, a, b)
	f.Policy = "round_robin"
	g, path := startFromFile(t, f)
	s1, s2 := g.streamBG(words(10, 30), 300), g.streamBG(words(50, 30), 300)
	waitUntil(t, "a stream on each replica", 5*time.Second, func() bool {
		v := g.replicaViews()
		return len(v) == 2 && v[0].InFlight == 1 && v[1].InFlight == 1
	})
	f.Replicas = [][2]string{{"a", a.url()}, {"c", c.url()}}
	res := g.reload(t, path, f)
	for _, want := range []string{"models[inferrail-sim].replicas[b]: removed", "models[inferrail-sim].replicas[c]: added (" + c.url() + ")"} {
		if !slices.Contains(res.Changes, want) {
			t.Errorf("changes %q: want %q", res.Changes, want)
		}
	}
	seen := map[string]int{}
	for i := range 8 {
		resp, _, err := g.complete(context.Background(), words(1000+50*i, 10), 2)
		if err != nil {
			t.Fatal(err)
		}
		seen[resp.Header.Get(HeaderReplica)]++
	}
	if seen["b"] != 0 || seen["c"] == 0 || seen["a"] == 0 {
		t.Fatalf("requests after the reload went to %v: want a and c, never b", seen)
	}
	waitErr(t, s1, "stream 1")
	waitErr(t, s2, "stream 2")
	series := func(replica string) int {
		n := 0
		mfs, _ := g.met.reg.Gather()
		for _, mf := range mfs {
			for _, mm := range mf.GetMetric() {
				for _, l := range mm.GetLabel() {
					if l.GetName() == "replica" && l.GetValue() == replica {
						n++
					}
				}
			}
		}
		return n
	}
	waitUntil(t, "b's series dropped", 5*time.Second, func() bool { return series("b") == 0 })
	for _, v := range g.replicaViews() {
		if v.Replica == "b" {
			t.Fatal("b still in /replicas")
		}
	}
	// a points at another engine: a new replica, with nothing of the old.
	peakBefore := 0
	for _, v := range g.replicaViews() {
		if v.Replica == "a" {
			peakBefore = v.PeakInFlight
		}
	}
	f.Replicas = [][2]string{{"a", d.url()}, {"c", c.url()}}
	res = g.reload(t, path, f)
	if !slices.Contains(res.Changes, "models[inferrail-sim].replicas[a].url: "+a.url()+" -> "+d.url()) {
		t.Errorf("changes %q: want a's new url", res.Changes)
	}
	for _, v := range g.replicaViews() {
		if v.Replica == "a" && (v.URL != d.url() || v.PeakInFlight != 0 || peakBefore == 0) {
			t.Fatalf("a after its url changed: %+v (peak before %d)", v, peakBefore)
		}
	}
	clear(seen)
	for i := range 4 {
		resp, _, err := g.complete(context.Background(), words(3000+50*i, 10), 2)
		if err != nil {
			t.Fatal(err)
		}
		seen[resp.Header.Get(HeaderReplica)]++
	}
	if seen["a"] != 2 || seen["c"] != 2 {
		t.Fatalf("after a's url changed, requests went to %v", seen)
	}
	for _, v := range g.replicaViews() {
		if v.Replica == "a" && v.PeakInFlight != 1 {
			t.Fatalf("the new a: %+v", v)
		}
	}
	if n, _ := g.inFlight(); n != 0 {
		t.Fatalf("%d in flight at rest", n)
	}
}

// A broken file is rejected with its error, counted, and changes
// nothing: the old configuration keeps serving.
func TestReloadRejectsBrokenFiles(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	base := newFileConfig(t, up)
	g, path := startFromFile(t, base)
	dir := t.TempDir()
	garbled := filepath.Join(dir, "tokenizer.json")
	os.WriteFile(garbled, []byte(`{"model": {"type": "BPE", "vocab": `), 0o644)
	shortToken := filepath.Join(dir, "token")
	os.WriteFile(shortToken, []byte("short\n"), 0o600)
	sha0 := g.loaded().sha256
	for i, tc := range []struct {
		name, want string
		text       func() string
	}{
		{"yaml syntax", "yaml", func() string { return "models:\n  - name: [unclosed\n" }},
		{"unknown key", "listn", func() string { b := base; b.Top = "listn: 127.0.0.1:1\n"; return b.yaml() }},
		{"validation", "queue.timeout", func() string { b := base; b.Policy, b.QueueTimeout = "round_robin", "0s"; return b.yaml() }},
		{"unknown policy", "policy", func() string { b := base; b.Policy = "fastest"; return b.yaml() }},
		{"missing tokenizer", "does not exist", func() string { b := base; b.Tokenizer = filepath.Join(dir, "nope.json"); return b.yaml() }},
		{"unreadable tokenizer", "tokenizer", func() string { b := base; b.Policy, b.Tokenizer = "round_robin", garbled; return b.yaml() }},
		{"admin token", "admin_token_file", func() string { b := base; b.Policy, b.AdminTokenFile = "round_robin", shortToken; return b.yaml() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeFile(t, path, tc.text())
			_, err := g.Reload(ReloadAdmin)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("reload: %v, want an error naming %q", err, tc.want)
			}
			if n := testutil.ToFloat64(g.met.reloads.WithLabelValues("error")); n != float64(i+1) {
				t.Fatalf("%v reloads counted as errors, want %d", n, i+1)
			}
			if g.loaded().sha256 != sha0 || g.policyNow() != "cost_model" {
				t.Fatal("a rejected file changed the running configuration")
			}
			if _, _, err := g.complete(context.Background(), words(10, 10), 2); err != nil {
				t.Fatalf("the old configuration no longer serves: %v", err)
			}
			st := g.configStatus()
			if st.LastError == nil || !strings.Contains(st.LastError.Error, tc.want) || st.ReloadErrors != uint64(i+1) {
				t.Fatalf("status: %+v", st)
			}
		})
	}
	if n := testutil.ToFloat64(g.met.reloads.WithLabelValues("ok")); n != 0 {
		t.Fatalf("%v reloads counted ok", n)
	}
	base.Policy = "p2c"
	g.reload(t, path, base)
	if g.policyNow() != "p2c" {
		t.Fatal("a good file after the broken ones did not apply")
	}
}

// Settings that need a restart are reported with what runs instead, in
// the result, the log and /admin/status; the rest of the reload applies.
func TestReloadReportsRestartSettings(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	f := newFileConfig(t, up)
	g, path := startFromFile(t, f)
	start := g.loaded().at
	f.Top = "listen: 127.0.0.1:18080\n"
	f.RequestTimeout = "1m"
	f.Policy = "least_request"
	f.ExtraModelsBlock = "  - {name: other, replicas: [{name: x, url: \"http://127.0.0.1:1\"}]}\n"
	res := g.reload(t, path, f)
	for _, want := range []string{
		"listen: cannot change without a restart: kept 127.0.0.1:8080",
		"request_timeout: cannot change without a restart: kept 10m0s",
		"models[other]: cannot change without a restart: not served until then",
	} {
		if !slices.Contains(res.NeedsRestart, want) {
			t.Errorf("needs restart %q: want %q", res.NeedsRestart, want)
		}
	}
	if g.policyNow() != "least_request" {
		t.Fatal("the policy did not change with settings that need a restart")
	}
	if _, ok := g.routes.Load().byName["other"]; ok {
		t.Fatal("a model added by a reload is served")
	}
	b, _ := os.ReadFile(path)
	st := statusOf(t, g)
	if st.Config.SHA256 != hashOf(b) || !st.Config.LoadedAt.After(start) || !slices.Equal(st.Config.NeedsRestart, res.NeedsRestart) {
		t.Fatalf("status config %+v", st.Config)
	}
}

func statusOf(t testing.TB, g *testGateway) statusView {
	t.Helper()
	w := httptest.NewRecorder()
	g.AdminHandler().ServeHTTP(w, httptest.NewRequest("GET", "/admin/status", nil))
	var st statusView
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != 200 || st.Config == nil {
		t.Fatalf("status %d %s: %v", w.Code, w.Body, err)
	}
	return st
}

// POST /admin/reload answers the result, 422 with the error for a
// broken file, 405 for another method; the admin token a reload sets is
// required at once.
func TestAdminReload(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	f := newFileConfig(t, up)
	g, path := startFromFile(t, f)
	h := g.AdminHandler()
	call := func(method, target, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, target, nil)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	f.Policy = "p2c"
	writeFile(t, path, f.yaml())
	w := call("POST", "/admin/reload", "")
	var res ReloadResult
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil || w.Code != 200 || res.Source != ReloadAdmin || len(res.Changes) != 1 {
		t.Fatalf("POST /admin/reload: %d %s", w.Code, w.Body)
	}
	if w := call("GET", "/admin/reload", ""); w.Code != 405 || w.Header().Get("Allow") != "POST" {
		t.Fatalf("GET /admin/reload: %d %v", w.Code, w.Header())
	}
	writeFile(t, path, "models: [\n")
	w = call("POST", "/admin/reload", "")
	if w.Code != http.StatusUnprocessableEntity || !strings.Contains(w.Body.String(), "reload_rejected") {
		t.Fatalf("a broken file: %d %s", w.Code, w.Body)
	}
	tok := strings.Repeat("t0k3n", 5)
	tf := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tf, []byte(tok+"\n"), 0o600)
	f.AdminTokenFile = tf
	writeFile(t, path, f.yaml())
	if w := call("POST", "/admin/reload", ""); w.Code != 200 {
		t.Fatalf("setting a token: %d %s", w.Code, w.Body)
	}
	if w := call("GET", "/admin/status", ""); w.Code != http.StatusUnauthorized {
		t.Fatalf("status without the new token: %d", w.Code)
	}
	if w := call("GET", "/admin/status", tok); w.Code != 200 {
		t.Fatalf("status with the new token: %d", w.Code)
	}
	// A server not started from a file cannot reload.
	g2 := startGateway(t, testConfig(t, up))
	if _, err := g2.Reload(ReloadAdmin); !errors.Is(err, ErrNoConfigFile) {
		t.Fatalf("reload without a file: %v", err)
	}
}

// SIGHUP reloads (the signal really sent to the process).
func TestReloadOnSIGHUP(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	f := newFileConfig(t, up)
	g, path := startFromFile(t, f)
	hup := make(chan os.Signal, 1)
	ossignal.Notify(hup, syscall.SIGHUP)
	defer ossignal.Stop(hup)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go g.ReloadOn(ctx, hup)
	f.Policy = "random"
	writeFile(t, path, f.yaml())
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The policy is swapped before the reload is counted: wait for both.
	reloads := func() float64 { return testutil.ToFloat64(g.met.reloads.WithLabelValues("ok")) }
	waitUntil(t, "the reload on SIGHUP", 5*time.Second, func() bool { return g.policyNow() == "random" && reloads() >= 1 })
	if n := reloads(); n != 1 {
		t.Fatalf("%v reloads", n)
	}
}

// The file watch sees a write in place, a rename over the file and a
// Kubernetes ConfigMap's symlink swap; an unchanged or rejected file is
// not reloaded again.
func TestReloadWatchesTheFile(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	for _, how := range []string{"write in place", "rename over", "configmap symlink swap"} {
		t.Run(how, func(t *testing.T) {
			f := newFileConfig(t, up)
			dir := t.TempDir()
			path := filepath.Join(dir, "live.yaml")
			var swap func(text string)
			switch how {
			case "write in place":
				os.WriteFile(path, []byte(f.yaml()), 0o644)
				swap = func(text string) {
					if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			case "rename over":
				writeFile(t, path, f.yaml())
				swap = func(text string) { writeFile(t, path, text) }
			default:
				// What the kubelet does: ..data is a symlink to a
				// timestamped directory, the file a symlink through it; an
				// update writes a new directory, points ..data_tmp at it
				// and renames ..data_tmp over ..data.
				n := 0
				version := func(text string) {
					n++
					v := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", n, n)
					os.Mkdir(filepath.Join(dir, v), 0o755)
					os.WriteFile(filepath.Join(dir, v, "live.yaml"), []byte(text), 0o644)
					if err := os.Symlink(v, filepath.Join(dir, "..data_tmp")); err != nil {
						t.Fatal(err)
					}
					if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
						t.Fatal(err)
					}
				}
				version(f.yaml())
				if err := os.Symlink("..data/live.yaml", path); err != nil {
					t.Fatal(err)
				}
				swap = version
			}
			c, err := config.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			g := startGatewayDeps(t, c, Deps{ConfigPath: path})
			g.rl.quiet, g.rl.maxWait = 20*time.Millisecond, 200*time.Millisecond
			ctx, cancel := context.WithCancel(context.Background())
			done, err := g.WatchConfig(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { cancel(); <-done }()
			f.Policy = "prefix_hash"
			swap(f.yaml())
			waitUntil(t, "the watch's reload", 5*time.Second, func() bool { return g.policyNow() == "prefix_hash" })
			// A broken file is rejected, and not tried again while it stays
			// the same; the next good one applies. (A write in place may
			// also be caught half done: rejected, then applied whole.)
			before := g.rl.errs.Load()
			swap("models: [\n")
			waitUntil(t, "the broken file rejected", 5*time.Second, func() bool {
				f := g.rl.failedSHA.Load()
				return f != nil && *f == hashOf([]byte("models: [\n"))
			})
			rejected := g.rl.errs.Load()
			if rejected == before {
				t.Fatal("the broken file was not counted")
			}
			os.WriteFile(filepath.Join(dir, "unrelated"), []byte("x"), 0o644)
			time.Sleep(100 * time.Millisecond)
			if n := g.rl.errs.Load(); n != rejected {
				t.Fatalf("the same broken file was tried again (%d errors, %d before)", n, rejected)
			}
			f.Policy = "least_request"
			swap(f.yaml())
			waitUntil(t, "the good file after it", 5*time.Second, func() bool { return g.policyNow() == "least_request" })
			// A reload is counted just after it applies: wait for the count.
			waitUntil(t, "the second reload counted", 5*time.Second, func() bool { return g.rl.ok.Load() >= 2 })
			if n := g.rl.ok.Load(); n != 2 {
				t.Fatalf("%d reloads, want 2", n)
			}
		})
	}
}

// A burst of events is one reload after a quiet spell, and a stream of
// them still reloads every maxWait.
func TestReloadWatchDebounce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &Server{log: slog.New(slog.DiscardHandler)}
		s.rl.quiet, s.rl.maxWait = 200*time.Millisecond, 2*time.Second
		events, errs := make(chan fsnotify.Event), make(chan error)
		start := time.Now()
		var mu sync.Mutex
		var acts []time.Duration
		got := func() []time.Duration { mu.Lock(); defer mu.Unlock(); return slices.Clone(acts) }
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			s.watchLoop(ctx, events, errs, func() { mu.Lock(); acts = append(acts, time.Since(start)); mu.Unlock() })
			close(done)
		}()
		ev := func(at time.Duration) {
			time.Sleep(at - time.Since(start))
			events <- fsnotify.Event{Name: "live.yaml", Op: fsnotify.Write}
		}
		ev(0)
		ev(50 * time.Millisecond)
		ev(100 * time.Millisecond)
		time.Sleep(time.Second - time.Since(start))
		synctest.Wait()
		if a := got(); !slices.Equal(a, []time.Duration{300 * time.Millisecond}) {
			t.Fatalf("a burst acted at %v, want once at 300ms", a)
		}
		// Every 150ms from 1.05s to 4.05s: at most 2s after a burst's
		// first event, then 200ms after the last.
		for at := 1050 * time.Millisecond; at <= 4050*time.Millisecond; at += 150 * time.Millisecond {
			ev(at)
		}
		errs <- errors.New("queue overflow") // counts as an event
		time.Sleep(6*time.Second - time.Since(start))
		synctest.Wait()
		want := []time.Duration{300 * time.Millisecond, 3050 * time.Millisecond, 4250 * time.Millisecond}
		if a := got(); !slices.Equal(a, want) {
			t.Fatalf("acted at %v, want %v", a, want)
		}
		cancel()
		<-done
	})
}

// Concurrent reloads run one at a time.
func TestReloadConcurrentSerialised(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	f := newFileConfig(t, up)
	g, path := startFromFile(t, f)
	var active, most atomic.Int32
	g.rl.hook = func() {
		n := active.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond)
		active.Add(-1)
	}
	f.Policy = "p2c"
	writeFile(t, path, f.yaml())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := g.Reload(ReloadAdmin); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if most.Load() != 1 || g.rl.ok.Load() != 8 || g.policyNow() != "p2c" {
		t.Fatalf("%d reloads at once at most, %d ok", most.Load(), g.rl.ok.Load())
	}
}

// 1,000 requests in flight across 10 reloads (policies, the queue's
// timeout, caps, a replica removed and added back) all succeed, and no
// count or reservation is left behind.
func TestReloadUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 requests")
	}
	ec := server.Config{Engine: testEngineConfig()}
	ec.Engine.Latency.StepFixedMs = 20 // each stream lasts 2.4 s or more: every request is in flight at once, even on a loaded machine
	ups := []*upstream{newUpstream(t, ec), newUpstream(t, ec), newUpstream(t, ec)}
	f := newFileConfig(t, ups...)
	f.MaxConcurrency = 4096
	g, path := startFromFile(t, f)
	const n = 1000
	errs := make(chan error, n)
	shared := words(0, 48)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, _, err := g.complete(context.Background(), shared+words(1000+8*i, 8), 120)
			errs <- err
		})
	}
	// Every request sent: in flight, queued or (on a slow machine, where
	// the first may end before the last starts) done.
	waitUntil(t, "every request in flight", 20*time.Second, func() bool { return g.allInFlight()+g.queued()+len(errs) == n })
	policies := []string{"kv_aware", "round_robin", "cost_model", "p2c", "prefix_hash"}
	inFlight := make([]int, 0, 10)
	for i := range 10 {
		f.Policy = policies[i%len(policies)]
		f.QueueTimeout = []string{"20s", "30s"}[i%2]
		f.MaxConcurrency = 4096 - i
		f.Replicas = f.Replicas[:0]
		for j, u := range ups {
			if j == 2 && i%2 == 0 {
				continue // c out on even reloads, back on odd ones
			}
			f.Replicas = append(f.Replicas, [2]string{string(rune('a' + j)), u.url()})
		}
		g.reload(t, path, f)
		inFlight = append(inFlight, g.allInFlight()+g.queued())
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			if failed < 3 {
				t.Error(err)
			}
			failed++
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d requests failed across 10 reloads", failed, n)
	}
	if inFlight[9] < n/2 {
		t.Fatalf("requests in flight at each reload %v: the reloads ran after most had ended", inFlight)
	}
	waitUntil(t, "the counters at rest", 5*time.Second, func() bool {
		_, p := g.inFlight()
		return g.allInFlight() == 0 && p == 0 && g.queued() == 0 && g.reserved() == 0
	})
	t.Logf("in flight or queued at each reload: %v", inFlight)
}

// Every setting a file may change is either applied by a reload or
// reported as waiting for a restart: none is silently ignored (a setting
// added to the configuration later is one or the other too).
func TestReloadNeverIgnoresASetting(t *testing.T) {
	parse := func() *config.Config {
		c, err := config.Parse([]byte("models:\n  - name: m\n    replicas: [{name: a, url: \"http://127.0.0.1:1\"}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	base := parse()
	n := 0
	leaves(reflect.TypeOf(config.Config{}), "", func(path string, get func(*config.Config) reflect.Value) {
		if strings.HasSuffix(path, "[first].name") {
			return // a name says which entry it is
		}
		next := parse()
		if !bump(get(next)) {
			return
		}
		path = strings.Replace(strings.Replace(path, "models[first]", "models[m]", 1), "replicas[first]", "replicas[a]", 1)
		n++
		eff := effective(base, next)
		applied := diff("", reflect.ValueOf(*base), reflect.ValueOf(*eff))
		waits := diff("", reflect.ValueOf(*next), reflect.ValueOf(*eff))
		if len(applied)+len(waits) != 1 {
			t.Errorf("%s: applied %v, waits for a restart %v: want exactly one of them", path, applied, waits)
			return
		}
		if d := append(applied, waits...)[0]; d.path != path {
			t.Errorf("%s: reported as %s", path, d.path)
		}
	})
	if n < 80 {
		t.Fatalf("only %d settings tried", n)
	}
}

// leaves calls f with the YAML path of every scalar setting of t (the
// first model's and its first replica's included) and how to reach it.
func leaves(t reflect.Type, path string, f func(string, func(*config.Config) reflect.Value)) {
	var rec func(t reflect.Type, path string, get func(*config.Config) reflect.Value)
	rec = func(t reflect.Type, path string, get func(*config.Config) reflect.Value) {
		switch {
		case t.Kind() == reflect.Struct && t != reflect.TypeOf(time.Time{}):
			for i := range t.NumField() {
				fl := t.Field(i)
				name, _, _ := strings.Cut(fl.Tag.Get("yaml"), ",")
				if name == "" || name == "-" || !fl.IsExported() {
					continue
				}
				p := name
				if path != "" {
					p = path + "." + name
				}
				i := i
				rec(fl.Type, p, func(c *config.Config) reflect.Value {
					if v := get(c); v.IsValid() {
						return v.Field(i)
					}
					return reflect.Value{}
				})
			}
		case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
			// The first entry's settings, by its name.
			rec(t.Elem(), path+"[first]", func(c *config.Config) reflect.Value {
				v := get(c)
				if !v.IsValid() || v.Len() == 0 {
					return reflect.Value{}
				}
				return v.Index(0)
			})
		default:
			f(path, get)
		}
	}
	rec(t, path, func(c *config.Config) reflect.Value { return reflect.ValueOf(c).Elem() })
}

// bump changes a scalar setting; false for one it cannot (a list, a map,
// an entry that is not there, a name that identifies its entry).
func bump(v reflect.Value) bool {
	if !v.IsValid() || !v.CanSet() {
		return false
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(v.Int() + 1)
	case reflect.Uint64, reflect.Uint32, reflect.Uint:
		v.SetUint(v.Uint() + 1)
	case reflect.Float64:
		v.SetFloat(v.Float() + 0.5)
	case reflect.Bool:
		v.SetBool(!v.Bool())
	default:
		return false
	}
	return true
}
