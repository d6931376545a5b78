package bench

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/internal/pipenet"
	"github.com/inferrail/inferrail/live"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/workload"
)

// reportJSON is o's --json output, decoded.
func reportJSON(t *testing.T, o *Output) map[string]any {
	t.Helper()
	var buf strings.Builder
	if err := results.WriteJSON(&buf, o.Report()); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(buf.String()), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// text is o as bench prints it.
func text(t *testing.T, o *Output) string {
	t.Helper()
	var b strings.Builder
	if err := o.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// answer streams one token and a usage chunk whose prompt_tokens_details
// says 8 of 10 prompt tokens were cached.
func answer(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Write([]byte(`data: {"choices":[{"index":0,"text":"a"}]}` + "\n\n"))
	w.Write([]byte(`data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":8}}}` + "\n\n"))
	w.Write([]byte("data: [DONE]\n\n"))
}

// A request whose answer carries no x-inferrail-predicted-cached-tokens has
// no prediction (not a prediction of 0): the accuracy covers the answers
// that named one, and with none bench says so instead of a figure.
func TestPredictionsOnlyFromTheHeader(t *testing.T) {
	var calls atomic.Int64
	out := runAgainst(t, 12, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) % 4 {
		case 0:
			w.Header().Set(HeaderPredicted, "8") // exact
		case 1:
			w.Header().Set(HeaderPredicted, "6") // 2 under
		case 2:
			w.Header().Set(HeaderPredicted, "many") // no count: no prediction
		}
		answer(w)
	}))
	p := out.Predictions
	if out.Summary.Completed != 12 || p.Requests != 6 {
		t.Fatalf("%d completed, %d predictions; want 12 and 6 (errors %v)", out.Summary.Completed, p.Requests, out.Errors)
	}
	if p.Exact != 0.5 || p.Under != 0.5 || p.Over != 0 || p.MeanErrorTokens != -1 || p.MeanAbsErrorTokens != 1 || p.PredictedHitRate != 0.7 || p.HitRate != 0.8 {
		t.Errorf("predictions %+v: want half exact, half 2 under, predicted 70%% against 80%% found", p)
	}
	if out.Summary.Prediction != p.Prediction || out.Summary.PredictedHitRate != 0.7 {
		t.Errorf("summary's prediction %+v, predicted hit rate %v: want the predictions' own", out.Summary.Prediction, out.Summary.PredictedHitRate)
	}
	m := reportJSON(t, out)
	if pr, _ := m["prediction"].(map[string]any); pr == nil || pr["requests"] != 6.0 || pr["exact"] != 0.5 || m["predicted_hit_rate"] != 0.7 {
		t.Errorf("JSON prediction %v, predicted_hit_rate %v", m["prediction"], m["predicted_hit_rate"])
	}
	if txt := text(t, out); !strings.Contains(txt, "predictions (6 of 12 completed requests): predicted hit 70.0%, found 80.0%; exact 50.0%") {
		t.Errorf("text does not give the predictions:\n%s", txt)
	}

	none := runAgainst(t, 5, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { answer(w) }))
	if none.Predictions.Requests != 0 || none.Summary.Prediction != (results.Prediction{}) || none.Summary.PredictedHitRate != 0 {
		t.Errorf("no header: predictions %+v, summary's %+v", none.Predictions, none.Summary.Prediction)
	}
	m = reportJSON(t, none)
	if v, ok := m["prediction"]; !ok || v != nil {
		t.Errorf("no header: JSON prediction %v, want null", v)
	}
	if v, ok := m["predicted_hit_rate"]; !ok || v != nil {
		t.Errorf("no header: JSON predicted_hit_rate %v, want null", v)
	}
	txt := text(t, none)
	if !strings.Contains(txt, "predictions: no predictions (the server sent no x-inferrail-predicted-cached-tokens header)") || strings.Contains(txt, "exact") {
		t.Errorf("no header: text makes up predictions:\n%s", txt)
	}
}

// Through inferrail live with predicted_cached_header, every answer names
// the router's prediction, which bench compares with what the engine found;
// without it (and without cache_salt) live names none, and bench says so.
func TestPredictionsThroughLive(t *testing.T) {
	if HeaderPredicted != live.HeaderPredicted {
		t.Fatalf("bench reads %s, live sends %s", HeaderPredicted, live.HeaderPredicted)
	}
	for _, on := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			var pn pipenet.Network
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			ec := engine.DefaultConfig()
			s, err := server.New(server.Config{Engine: ec, EnablePromptTokensDetails: true})
			if err != nil {
				t.Fatal(err)
			}
			ehs := &http.Server{Handler: s.Handler()}
			eln := pn.Listen("engine:80")
			wg.Add(2)
			go func() { defer wg.Done(); s.Run(ctx) }()
			go func() { defer wg.Done(); ehs.Serve(eln) }()
			o := config.Default()
			o.PredictedCachedHeader = on
			mo := config.DefaultModel()
			mo.Name, mo.MaxModelLen = server.DefaultModelName, ec.MaxModelLen
			mo.Replicas = []config.Replica{{Name: "engine", URL: "http://engine:80"}}
			o.Models = []config.Model{mo}
			gw, err := live.New(&o, live.Deps{Transport: &http.Transport{DialContext: pn.Dial}})
			if err != nil {
				t.Fatal(err)
			}
			gln := pn.Listen("gateway:80")
			ghs := &http.Server{Handler: gw.Handler()}
			wg.Add(2)
			go func() { defer wg.Done(); gw.Run(ctx) }()
			go func() { defer wg.Done(); ghs.Serve(gln) }()
			time.Sleep(time.Second) // first scrapes and probes
			src, err := workload.New(w1(t, 60, 0.5))
			if err != nil {
				t.Fatal(err)
			}
			client := &http.Client{Transport: &http.Transport{DialContext: pn.Dial}}
			out, err := Run(context.Background(), Config{BaseURL: "http://gateway:80", Source: src, Client: client, PreciseWindow: -1})
			if err != nil {
				t.Fatal(err)
			}
			ghs.Close()
			gln.Close()
			ehs.Close()
			eln.Close()
			client.CloseIdleConnections()
			cancel()
			wg.Wait()
			gw.Close()
			time.Sleep(time.Second)

			p, sum := out.Predictions, out.Summary
			if sum.Completed != 60 {
				t.Fatalf("predicted_cached_header %v: %d of 60 completed (errors %v)", on, sum.Completed, out.Errors)
			}
			if !on {
				if p.Requests != 0 || !strings.Contains(text(t, out), NoPredictions) {
					t.Errorf("predicted_cached_header off: %d predictions, want none and %q", p.Requests, NoPredictions)
				}
				return
			}
			// One engine, the router's own index: it predicts what the
			// engine finds, give or take the odd eviction.
			if p.Requests != 60 || p.HitRate != sum.HitRate || sum.HitRate < 0.1 || p.Exact < 0.8 || p.PredictedHitRate < sum.HitRate-0.05 || p.PredictedHitRate > sum.HitRate+0.05 {
				t.Errorf("predicted_cached_header on: predictions %+v against hit rate %v", p, sum.HitRate)
			}
		})
	}
}

// runEngine runs n requests of w1 against the mock engine.
func runEngine(t *testing.T, n int, sc server.Config) *Output {
	t.Helper()
	var out *Output
	synctest.Test(t, func(t *testing.T) {
		srv, err := server.New(sc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { srv.Run(ctx); close(done) }()
		client, stop := serve(t, srv.Handler())
		src, err := workload.New(w1(t, n, 0.5))
		if err != nil {
			t.Fatal(err)
		}
		out, err = Run(context.Background(), Config{BaseURL: "http://engine", Source: src, Client: client, PreciseWindow: -1})
		if err != nil {
			t.Fatal(err)
		}
		stop()
		cancel()
		<-done
	})
	return out
}

// An engine started without --enable-prompt-tokens-details reports no
// cached tokens: the hit rate is unknown, not 0, and one warning names the
// flag. With the flag, the hit rate is the engine's and nothing warns.
func TestHitRateUnknownWithoutPromptTokensDetails(t *testing.T) {
	off := runEngine(t, 30, server.Config{Engine: engine.DefaultConfig()})
	if off.Summary.Completed != 30 || off.CachedReported != 0 || off.HitRateKnown() {
		t.Fatalf("without details: %d completed, %d reported cached tokens", off.Summary.Completed, off.CachedReported)
	}
	if w := off.Warnings(); len(w) != 1 || !strings.Contains(w[0], "--enable-prompt-tokens-details") || !strings.Contains(w[0], "hit rate is unknown") {
		t.Errorf("without details: warnings %q, want one naming --enable-prompt-tokens-details", w)
	}
	m := reportJSON(t, off)
	if v, ok := m["hit_rate"]; !ok || v != nil {
		t.Errorf("without details: JSON hit_rate %v, want null", v)
	}
	per, _ := m["per_replica"].([]any)
	if len(per) != 1 || per[0].(map[string]any)["hit_rate"] != nil || per[0].(map[string]any)["cached_tokens"] != nil || per[0].(map[string]any)["prompt_tokens"] == nil {
		t.Errorf("without details: JSON per_replica %v, want hit_rate and cached_tokens null", m["per_replica"])
	}
	if w, _ := m["warnings"].([]any); len(w) != 1 {
		t.Errorf("without details: JSON warnings %v", m["warnings"])
	}
	if txt := text(t, off); !strings.Contains(txt, "  unknown  ") {
		t.Errorf("without details: text does not say the hit rate is unknown:\n%s", txt)
	}

	on := runEngine(t, 30, server.Config{Engine: engine.DefaultConfig(), EnablePromptTokensDetails: true})
	if on.CachedReported != 30 || !on.HitRateKnown() || on.Summary.HitRate <= 0 || len(on.Warnings()) != 0 {
		t.Fatalf("with details: %d reported cached tokens, hit rate %v, warnings %q", on.CachedReported, on.Summary.HitRate, on.Warnings())
	}
	m = reportJSON(t, on)
	if m["hit_rate"] != on.Summary.HitRate {
		t.Errorf("with details: JSON hit_rate %v, want %v", m["hit_rate"], on.Summary.HitRate)
	}
	if w, ok := m["warnings"].([]any); !ok || len(w) != 0 {
		t.Errorf("with details: JSON warnings %v, want []", m["warnings"])
	}
	if txt := text(t, on); !strings.Contains(txt, fmtPct(on.Summary.HitRate)) || strings.Contains(txt, "unknown") {
		t.Errorf("with details: text:\n%s", txt)
	}
}

// Some answers with cached tokens and some without: the hit rate counts the
// others as uncached, and one warning says how many.
func TestSomeAnswersWithoutCachedTokens(t *testing.T) {
	var calls atomic.Int64
	out := runAgainst(t, 8, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1)%4 != 0 {
			answer(w)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(`data: {"choices":[{"index":0,"text":"a"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}` + "\n\ndata: [DONE]\n\n"))
	}))
	if w := out.Warnings(); out.CachedReported != 6 || len(w) != 1 || !strings.HasPrefix(w[0], "2 of 8 answers") || !strings.Contains(w[0], "--enable-prompt-tokens-details") {
		t.Errorf("%d reported, warnings %q", out.CachedReported, w)
	}
}

// A failed request's reason comes with the first message the server sent
// for it, in the text and in --json.
func TestErrorExamples(t *testing.T) {
	var calls atomic.Int64
	out := runAgainst(t, 6, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1)%2 == 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"object":"error","message":"This model's maximum context length is 32768 tokens.","type":"BadRequestError","param":null,"code":400}`))
			return
		}
		answer(w)
	}))
	const msg = "This model's maximum context length is 32768 tokens."
	if out.Errors["http 400"] != 3 || out.ErrorExamples["http 400"] != msg {
		t.Fatalf("errors %v, examples %v", out.Errors, out.ErrorExamples)
	}
	// The summary's failures by reason say the same, not "no reason recorded".
	if out.Summary.FailedBy["http 400"] != 3 {
		t.Errorf("summary failed_by %v, want http 400: 3", out.Summary.FailedBy)
	}
	m := reportJSON(t, out)
	if ex, _ := m["error_examples"].(map[string]any); ex["http 400"] != msg {
		t.Errorf("JSON error_examples %v", m["error_examples"])
	}
	if txt := text(t, out); !strings.Contains(txt, "  http 400: 3 (first: "+msg+")") {
		t.Errorf("text lacks the reason and its message:\n%s", txt)
	}
}

// Config.Header is sent with every request, repeated names as repeated
// headers, replacing bench's own X-Request-Id when it names it.
func TestHeadersSent(t *testing.T) {
	var mu sync.Mutex
	var team [][]string
	var ids []string
	h := http.Header{}
	for _, s := range []string{"X-Team: search", "x-team:  ads ", "X-Request-Id: mine"} {
		name, value, err := ParseHeader(s)
		if err != nil {
			t.Fatal(err)
		}
		h.Add(name, value)
	}
	synctest.Test(t, func(t *testing.T) {
		client, stop := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			team = append(team, r.Header.Values("X-Team"))
			ids = append(ids, r.Header.Get("X-Request-Id"))
			mu.Unlock()
			answer(w)
		}))
		defer stop()
		src, _ := workload.New(w1(t, 5, 2))
		if _, err := Run(context.Background(), Config{BaseURL: "http://x", Source: src, Client: client, Header: h, PreciseWindow: -1}); err != nil {
			t.Fatal(err)
		}
	})
	if len(team) != 5 {
		t.Fatalf("server saw %d requests", len(team))
	}
	for i := range team {
		if strings.Join(team[i], ",") != "search,ads" || ids[i] != "mine" {
			t.Errorf("request %d: X-Team %q, X-Request-Id %q", i, team[i], ids[i])
		}
	}
}

func TestParseHeader(t *testing.T) {
	for _, c := range []struct{ in, name, value string }{
		{"X-Team: search", "X-Team", "search"},
		{"x-custom-thing:a:b", "X-Custom-Thing", "a:b"},
		{"Authorization: Bearer ir-1", "Authorization", "Bearer ir-1"},
		{"X-Tab:\tv\tw ", "X-Tab", "v\tw"},
	} {
		name, value, err := ParseHeader(c.in)
		if err != nil || name != c.name || value != c.value {
			t.Errorf("%q: %q %q %v, want %q %q", c.in, name, value, err, c.name, c.value)
		}
	}
	for _, c := range []struct{ in, mention string }{
		{"X-Team", "want Name: value"},
		{": v", "no header name"},
		{"X Team: v", "not allowed in a name"},
		{"X-Team : v", "no space before the colon"},
		{"X-Team:", "has no value"},
		{"X-Team:   ", "has no value"},
		{"X-Team: a\r\nHost: evil", "control character"},
		{"Content-Type: text/plain", "bench sets it itself"},
		{"host: example.com", "Host: bench sets it itself"},
		{"Content-Length: 5", "bench sets it itself"},
		{"Transfer-Encoding: chunked", "bench sets it itself"},
	} {
		if _, _, err := ParseHeader(c.in); err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%q: error %v, want one mentioning %q", c.in, err, c.mention)
		}
	}
}

// Run refuses headers that ParseHeader would not make, bench's own, and
// Authorization beside an API key.
func TestConfigHeaderErrors(t *testing.T) {
	src, _ := workload.New(w1(t, 1, 1))
	for _, c := range []struct {
		h    http.Header
		key  string
		want string
	}{
		{http.Header{"Content-Type": {"text/plain"}}, "", "bench sets it itself"},
		{http.Header{"x-team": {"a"}}, "", "canonical"},
		{http.Header{"X-Team": {""}}, "", "has no value"},
		{http.Header{"X-Team": {"a\nb"}}, "", "control character"},
		{http.Header{"Authorization": {"Bearer a"}}, "b", "give one of them"},
	} {
		_, err := Run(context.Background(), Config{BaseURL: "http://x", Source: src, Header: c.h, APIKey: c.key})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v (key %q): error %v, want %q", c.h, c.key, err, c.want)
		}
	}
}
