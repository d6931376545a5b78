package live

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/router/gateway"
)

// explainCall posts body to /admin/explain (query q) on g's admin handler.
func explainCall(t testing.TB, g *testGateway, q string, body []byte, hdr map[string]string) (int, []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/admin/explain"+q, bytes.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	g.AdminHandler().ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// POST /admin/explain says where a request would go and why, as the proxy
// sees it (its headers too), deciding nothing; the request sent for real
// goes there.
func TestAdminExplain(t *testing.T) {
	g := startGateway(t, testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}), newUpstream(t, server.Config{Engine: testEngineConfig()})))
	prompt := words(100, 400)
	resp, _, err := g.complete(context.Background(), prompt, 2)
	if err != nil {
		t.Fatal(err)
	}
	holder := resp.Header.Get(HeaderReplica)
	body, _ := json.Marshal(map[string]any{"model": "sim", "prompt": prompt, "max_tokens": 2, "ignore_eos": true, "stream": true})
	status, b := explainCall(t, g, "", body, map[string]string{HeaderPriority: "3", HeaderTenant: "team-a"})
	if status != 200 {
		t.Fatalf("%d %s", status, b)
	}
	var ex gateway.Explanation
	if err := json.Unmarshal(b, &ex); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if ex.Model != server.DefaultModelName || ex.Policy != "cost_model" || len(ex.Candidates) != 2 || ex.Admission.Verdict != gateway.VerdictDispatch {
		t.Fatalf("explanation %s", b)
	}
	if ex.Request.Priority != 3 || ex.Request.Tenant != "team-a" || !ex.Request.PromptKnown || ex.Request.PromptTokens != 400 {
		t.Fatalf("request as seen: %+v", ex.Request)
	}
	if ex.Winner == nil || ex.Winner.Name != holder || ex.Winner.PredictedCachedTokens == 0 || !strings.Contains(ex.Why, "lowest estimated TTFT") {
		t.Fatalf("winner %+v, why %q; the prompt is cached on %s", ex.Winner, ex.Why, holder)
	}
	for _, c := range ex.Candidates {
		if _, ok := c.Term("ttft_ms"); !ok || !c.Considered || c.Admission == "" {
			t.Fatalf("candidate %+v", c)
		}
	}
	// Nothing was dispatched or reserved; the real request goes there.
	if in, pend := g.inFlight(); in != 0 || pend != 0 || g.reserved() != 0 {
		t.Fatalf("explain left %d in flight, %d pending, %d reserved", in, pend, g.reserved())
	}
	resp, _, err = g.complete(context.Background(), prompt, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get(HeaderReplica); got != ex.Winner.Name {
		t.Fatalf("explained %s, sent to %s", ex.Winner.Name, got)
	}
	// A chat body, said so by ?endpoint=chat.
	chat, _ := json.Marshal(map[string]any{"model": "sim", "messages": []map[string]string{{"role": "user", "content": "hello there"}}})
	if status, b := explainCall(t, g, "?endpoint=chat", chat, nil); status != 200 || !bytes.Contains(b, []byte(`"verdict": "dispatch"`)) {
		t.Fatalf("chat: %d %s", status, b)
	}
}

// A body that does not parse is a 400 in OpenAI's error shape; so are a
// bad priority header and a bad endpoint; an unknown model is a 404; GET
// is a 405.
func TestAdminExplainBadInput(t *testing.T) {
	g := startGateway(t, testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()})))
	cases := []struct {
		name, q, body string
		hdr           map[string]string
		status        int
		mention       string
	}{
		{"not json", "", `{"model": "sim", "prompt": `, nil, 400, "JSON"},
		{"not an object", "", `[1, 2]`, nil, 400, "JSON object"},
		{"empty", "", ``, nil, 400, "JSON object"},
		{"unknown model", "", `{"model": "gpt-9", "prompt": "hi"}`, nil, 404, "gpt-9"},
		{"bad priority", "", `{"model": "sim", "prompt": "hi"}`, map[string]string{HeaderPriority: "high"}, 400, HeaderPriority},
		{"bad endpoint", "?endpoint=rerank", `{"model": "sim", "prompt": "hi"}`, nil, 400, "endpoint"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, b := explainCall(t, g, c.q, []byte(c.body), c.hdr)
			if status != c.status {
				t.Fatalf("%d %s, want %d", status, b, c.status)
			}
			if e := errorOf(t, b); e.Type != "invalid_request_error" || !strings.Contains(e.Message, c.mention) {
				t.Fatalf("error %+v, want one mentioning %q", e, c.mention)
			}
		})
	}
	rec := httptest.NewRecorder()
	g.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/admin/explain", nil))
	if rec.Code != 405 || rec.Header().Get("Allow") != "POST" {
		t.Fatalf("GET: %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
}

// Whatever the body, the endpoint answers 200 with an explanation or an
// OpenAI error of the client's making, never a 5xx.
func FuzzAdminExplain(f *testing.F) {
	g := startGateway(f, testConfig(f, newUpstream(f, server.Config{Engine: testEngineConfig()})))
	for _, s := range []string{`{"model":"sim","prompt":"hello"}`, `{"model":"sim","messages":[{"role":"user","content":"x"}]}`, `{`, `{"prompt":[1,2,3],"max_tokens":-1}`, `{"model":"sim","prompt":"a","cache_salt":"s","user":"u"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		status, b := explainCall(t, g, "", body, nil)
		switch status {
		case 200:
			var ex gateway.Explanation
			if err := json.Unmarshal(b, &ex); err != nil || ex.Why == "" {
				t.Fatalf("200 without an explanation: %v: %s", err, b)
			}
		case 400, 404, 413:
			errorOf(t, b)
		default:
			t.Fatalf("status %d: %s", status, b)
		}
	})
}

// A shadow policy equal to the real one agrees on every decision in live
// too: the metrics say so, and the decision log has the shadow's picks.
func TestShadowInLive(t *testing.T) {
	var mu sync.Mutex
	var logged bytes.Buffer
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}), newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.Models[0].ShadowPolicy = "cost_model"
	c.DecisionLog.Sample = 1
	g := startGatewayDeps(t, c, Deps{DecisionLog: writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logged.Write(p) })})
	const n = 12
	for i := range n {
		if _, _, err := g.complete(context.Background(), words(200+i%3, 100), 2); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := g.met.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		found[mf.GetName()] = mf
	}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	dec := found["inferrail_shadow_decisions_total"]
	if dec == nil {
		t.Fatal("no inferrail_shadow_decisions_total")
	}
	agreed, disagreed := 0.0, 0.0
	for _, m := range dec.GetMetric() {
		if label(m, "primary") != "cost_model" || label(m, "shadow") != "cost_model" {
			t.Fatalf("labels %v", m.GetLabel())
		}
		if label(m, "agree") == "true" {
			agreed = m.GetCounter().GetValue()
		} else {
			disagreed = m.GetCounter().GetValue()
		}
	}
	if agreed != n || disagreed != 0 {
		t.Fatalf("agreed %v, disagreed %v of %d: agreement must be 1.0", agreed, disagreed, n)
	}
	var est [2]uint64
	for _, m := range found["inferrail_shadow_estimated_ttft_seconds"].GetMetric() {
		k := map[string]int{"primary": 0, "shadow": 1}[label(m, "policy")]
		est[k] = m.GetHistogram().GetSampleCount()
	}
	measured := uint64(0)
	for _, m := range found["inferrail_shadow_measured_ttft_seconds"].GetMetric() {
		if label(m, "agree") == "true" {
			measured = m.GetHistogram().GetSampleCount()
		}
	}
	if est != [2]uint64{n, n} || measured != n {
		t.Fatalf("estimates %v, measured %d, for %d decisions", est, measured, n)
	}
	g.stop()
	mu.Lock()
	defer mu.Unlock()
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != n {
		t.Fatalf("%d decision log lines", len(lines))
	}
	for _, l := range lines {
		var e decisionEntry
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.ShadowPolicy != "cost_model" || e.ShadowAgree == nil || !*e.ShadowAgree ||
			e.ShadowReplica != e.Replica || e.EstimatedTTFTMs == nil || *e.EstimatedTTFTMs != *e.ShadowEstimatedTTFTMs {
			t.Fatalf("entry %s (%v)", l, err)
		}
	}
}
