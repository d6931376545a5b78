package live

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/router/gateway"
)

// modelsEngine is an engine whose /health passes and whose /v1/models
// answers what models says (counting the questions); nothing else.
type modelsEngine struct {
	*httptest.Server
	asked  atomic.Int64
	models atomic.Pointer[string] // the body; "" answers 404
}

func newModelsEngine(t *testing.T, body string) *modelsEngine {
	e := &modelsEngine{}
	e.models.Store(&body)
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		e.asked.Add(1)
		b := *e.models.Load()
		if b == "" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, b)
	})
	e.Server = httptest.NewServer(mux)
	t.Cleanup(e.Close)
	return e
}

func card(id string, maxLen int) string {
	return fmt.Sprintf(`{"object":"list","data":[{"id":%q,"object":"model","owned_by":"vllm","max_model_len":%d}]}`, id, maxLen)
}

// longAndShort starts two engines, of 8192 and 4096 tokens of context.
func longAndShort(t *testing.T) (*upstream, *upstream) {
	long, short := testEngineConfig(), testEngineConfig()
	long.MaxModelLen, short.MaxModelLen = 8192, 4096
	return newUpstream(t, server.Config{Engine: long}), newUpstream(t, server.Config{Engine: short})
}

// waitAnswered waits until n of m's replicas have given their
// max_model_len.
func waitAnswered(t *testing.T, m *model, n int) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%d replicas' max_model_len", n), 5*time.Second, func() bool {
		got := 0
		for _, rs := range m.snapshot().reps {
			if rs.ctxLen > 0 {
				got++
			}
		}
		return got == n
	})
}

// Without max_model_len configured, the gateway takes the smallest its
// engines' /v1/models give: a request over it is refused at the edge (400,
// counted too_long) where the longer engine would have run it, and the
// edge's tokenization bound follows.
func TestMaxModelLenLearnedFromEngines(t *testing.T) {
	a, b := longAndShort(t)
	c := testConfig(t, a, b)
	if c.Models[0].MaxModelLen != 0 {
		t.Fatal("the test needs max_model_len unset")
	}
	g := startGateway(t, c)
	m := g.models[0]
	waitAnswered(t, m, 2)
	if g := m.coreConfig(); g.ContextLen != 4096 || g.MaxModelLen != 0 {
		t.Fatalf("the core checks against %d (max_model_len %d), want 4096 (0)", g.ContextLen, g.MaxModelLen)
	}
	var views []replicaView
	if err := json.Unmarshal([]byte(admin(t, g, "/replicas")), &views); err != nil || len(views) != 2 {
		t.Fatalf("/replicas: %v %v", views, err)
	}
	for _, v := range views {
		if want := map[string]int{"a": 8192, "b": 4096}[v.Replica]; v.MaxModelLen != want || v.ModelMaxModelLen != 4096 {
			t.Fatalf("/replicas: %s said %d (want %d), the model checks %d (want 4096)", v.Replica, v.MaxModelLen, want, v.ModelMaxModelLen)
		}
	}
	if !strings.Contains(admin(t, g, "/metrics"), `inferrail_model_max_model_len{model="`+m.name+`"} 4096`) {
		t.Fatal("inferrail_model_max_model_len does not say 4096")
	}
	if got, want := m.promptLimit(), c.Tokenize.PromptBytesFor(4096); got != want {
		t.Fatalf("tokenization bound %d bytes, want %d", got, want)
	}
	resp, body, err := g.complete(context.Background(), words(0, 100), 5000)
	if err == nil || resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "context_length_exceeded") || !strings.Contains(body, "(4096 tokens)") {
		t.Fatalf("100 tokens and max_tokens 5000 against 4096: %v %s", err, body)
	}
	if n := testutil.ToFloat64(g.met.rejections.WithLabelValues(m.name, gateway.ReasonTooLong)); n != 1 {
		t.Fatalf("rejected too_long %v times at the edge, want 1", n)
	}
	if _, _, err := g.complete(context.Background(), words(0, 100), 2); err != nil {
		t.Fatalf("a request that fits: %v", err)
	}
}

// A configured max_model_len is the one used: the engines are not asked.
func TestMaxModelLenConfiguredIsNotLearned(t *testing.T) {
	e := newModelsEngine(t, card(server.DefaultModelName, 1024))
	c := fakeConfig(t, e.URL)
	c.Models[0].MaxModelLen = 2048
	g := startGateway(t, c)
	waitUntil(t, "a passing probe", 5*time.Second, func() bool { return g.models[0].ready(time.Now(), time.Second) })
	time.Sleep(200 * time.Millisecond) // four more
	if n := e.asked.Load(); n != 0 || g.models[0].contextLen() != 2048 {
		t.Fatalf("asked /v1/models %d times, context %d; want 0 and 2048", n, g.models[0].contextLen())
	}
}

// An engine that cannot say is asked again no sooner than the retry
// interval, logged once, and its answer taken once it gives one; a card
// for another name is the engine's only one and counts; reloading keeps
// the length learned.
func TestMaxModelLenRetriedUntilAnswered(t *testing.T) {
	e := newModelsEngine(t, "")
	c := fakeConfig(t, e.URL)
	logs := &syncBuffer{}
	g := startGatewayDeps(t, c, Deps{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	m := g.models[0]
	waitUntil(t, "the first question", 5*time.Second, func() bool { return e.asked.Load() > 0 })
	// The retry is 10s: every probe passes (each 50ms), the engine is not
	// asked again.
	time.Sleep(300 * time.Millisecond)
	if n := e.asked.Load(); n != 1 {
		t.Fatalf("asked %d times within the retry interval, want 1", n)
	}
	if m.contextLen() != 0 {
		t.Fatalf("context %d from a 404", m.contextLen())
	}
	for _, bad := range []string{"<html>", `{"data":[{"id":"x","max_model_len":-1}]}`, `{"object":"list","data":[{"id":"a"},{"id":"b"}]}`} {
		e.models.Store(&bad)
		m.mu.Lock()
		m.reps[0].ctxAsked = time.Time{} // the retry interval is over
		m.mu.Unlock()
		before := e.asked.Load()
		waitUntil(t, "a question", 5*time.Second, func() bool { return e.asked.Load() > before })
		time.Sleep(50 * time.Millisecond)
		if m.contextLen() != 0 {
			t.Fatalf("context %d from %s", m.contextLen(), bad)
		}
	}
	if n := strings.Count(logs.String(), "gives no max_model_len"); n != 1 {
		t.Fatalf("the failing replica was logged %d times, want once:\n%s", n, logs.String())
	}
	good := card("served-under-another-name", 3000)
	e.models.Store(&good)
	m.mu.Lock()
	m.reps[0].ctxAsked = time.Time{}
	m.mu.Unlock()
	waitUntil(t, "max_model_len learned", 5*time.Second, func() bool { return m.contextLen() == 3000 })
	if !strings.Contains(logs.String(), "max_model_len learned") {
		t.Fatalf("no log line for the change:\n%s", logs.String())
	}
	asked := e.asked.Load()
	time.Sleep(200 * time.Millisecond)
	if e.asked.Load() != asked {
		t.Fatal("a replica that answered was asked again")
	}
}

// A hot reload keeps the length the engines gave (the file says 0); one
// that takes out the replica with the shortest context gives the others'.
func TestMaxModelLenKeptByReload(t *testing.T) {
	a, b := longAndShort(t)
	f := newFileConfig(t, a, b)
	g, path := startFromFile(t, f)
	m := g.models[0]
	waitAnswered(t, m, 2)
	f.Policy = "round_robin"
	g.reload(t, path, f)
	if g.policyNow() != "round_robin" {
		t.Fatal("the reload did not apply")
	}
	if got := m.coreConfig().ContextLen; got != 4096 || m.contextLen() != 4096 {
		t.Fatalf("after a reload the core checks against %d (edge %d), want 4096", got, m.contextLen())
	}
	f.Replicas = f.Replicas[:1]
	g.reload(t, path, f)
	if got := m.coreConfig().ContextLen; got != 8192 || m.contextLen() != 8192 {
		t.Fatalf("without the 4096 replica the core checks against %d (edge %d), want 8192", got, m.contextLen())
	}
}

// An engine restarted with another --max-model-len is asked again.
func TestMaxModelLenAskedAgainAfterRestart(t *testing.T) {
	ec := testEngineConfig()
	ec.MaxModelLen = 4096
	a := newUpstream(t, server.Config{Engine: ec})
	g := startGateway(t, testConfig(t, a))
	m := g.models[0]
	waitUntil(t, "max_model_len learned", 5*time.Second, func() bool { return m.contextLen() == 4096 })
	for i := range 3 { // counters for the scraper to see go backwards
		if _, _, err := g.complete(context.Background(), words(i*50, 40), 2); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "a scrape of the served requests", 5*time.Second, func() bool {
		return m.snapshot().reps[0].st.Report.PrefixQueries > 0
	})
	a.kill()
	a.cfg.Engine.MaxModelLen = 2048
	a.restart()
	waitUntil(t, "max_model_len learned again", 5*time.Second, func() bool { return m.contextLen() == 2048 })
}
