package live

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/gateway"
)

// otlpReceiver is an OTLP/HTTP traces endpoint on 127.0.0.1 that keeps
// every span it is sent.
type otlpReceiver struct {
	url   string
	mu    sync.Mutex
	spans []*tracepb.Span
	svc   string // the resource's service.name
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	rc := &otlpReceiver{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					rc.svc = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	})}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	rc.url = "http://" + ln.Addr().String() + "/v1/traces"
	return rc
}

func (rc *otlpReceiver) got() []*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]*tracepb.Span(nil), rc.spans...)
}

// seenEngine is a mock engine of cfg that records the traceparent and
// the model field of each generation request it is sent.
type seenEngine struct {
	url    string
	mu     sync.Mutex
	seen   []string
	models []string
}

func newSeenEngine(t *testing.T, cfg server.Config) *seenEngine {
	e := &seenEngine{}
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") && r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			var f struct {
				Model string `json:"model"`
			}
			json.Unmarshal(b, &f)
			e.mu.Lock()
			e.seen = append(e.seen, r.Header.Get("Traceparent"))
			e.models = append(e.models, f.Model)
			e.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close(); cancel(); <-done })
	e.url = "http://" + ln.Addr().String()
	return e
}

// last is the last request's traceparent, lastModel its model field.
func (e *seenEngine) last() string      { return e.lastOf(&e.seen) }
func (e *seenEngine) lastModel() string { return e.lastOf(&e.models) }

func (e *seenEngine) lastOf(list *[]string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(*list) == 0 {
		return ""
	}
	return (*list)[len(*list)-1]
}

func attrOf(sp *tracepb.Span, key string) *commonpb.AnyValue {
	for _, kv := range sp.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

// tracedGateway is a gateway in front of one recording engine, tracing to
// endpoint at ratio.
func tracedGateway(t *testing.T, endpoint string, ratio float64, log *slog.Logger) (*testGateway, *seenEngine) {
	eng := newSeenEngine(t, server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true})
	c := testConfig(t)
	c.Models[0].Replicas = []config.Replica{{Name: "a", URL: eng.url}}
	c.Tracing.Endpoint, c.Tracing.SampleRatio, c.Tracing.Timeout = endpoint, ratio, time.Second
	c.Tracing.ServiceName = "gw-test"
	return startGatewayDeps(t, c, Deps{Encoders: map[string]Encoder{c.Models[0].Name: simModel(t)}, Logger: log}), eng
}

const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"

func TestTracesThreeSpansPerRequest(t *testing.T) {
	rc := newOTLPReceiver(t)
	g, eng := tracedGateway(t, rc.url, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	parent := "00-" + clientTrace + "-00f067aa0ba902b7-01"
	body := map[string]any{"model": "sim", "messages": []map[string]string{{"role": "user", "content": words(0, 40)}}, "max_tokens": 5, "stream": true, "ignore_eos": true,
		"stream_options": map[string]any{"include_usage": true}}
	resp, err := g.post(ctx, "/v1/chat/completions", body, map[string]string{"traceparent": parent})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte("[DONE]")) {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	waitUntil(t, "three spans at the receiver", 10*time.Second, func() bool { return len(rc.got()) >= 3 })
	spans := rc.got()
	if len(spans) != 3 {
		t.Fatalf("got %d spans, want 3", len(spans))
	}
	byKind := map[tracepb.Span_SpanKind]*tracepb.Span{}
	for _, sp := range spans {
		if got := hex.EncodeToString(sp.TraceId); got != clientTrace {
			t.Errorf("span %q: trace id %s, want the client's %s", sp.Name, got, clientTrace)
		}
		byKind[sp.Kind] = sp
	}
	srv, route, up := byKind[tracepb.Span_SPAN_KIND_SERVER], byKind[tracepb.Span_SPAN_KIND_INTERNAL], byKind[tracepb.Span_SPAN_KIND_CLIENT]
	if srv == nil || route == nil || up == nil {
		t.Fatalf("want a server, an internal and a client span, got %v", spans)
	}
	model := g.models[0].name
	if srv.Name != "chat "+model || route.Name != "route "+model || up.Name != "chat "+model {
		t.Errorf("names: server %q, route %q, client %q", srv.Name, route.Name, up.Name)
	}
	if hex.EncodeToString(srv.ParentSpanId) != "00f067aa0ba902b7" {
		t.Errorf("server span's parent %x, want the client's span", srv.ParentSpanId)
	}
	if !bytes.Equal(route.ParentSpanId, srv.SpanId) || !bytes.Equal(up.ParentSpanId, srv.SpanId) {
		t.Errorf("route and client spans must be children of the server span")
	}
	for _, c := range []struct {
		sp   *tracepb.Span
		key  string
		want string
	}{
		{srv, "gen_ai.operation.name", "chat"}, {srv, "gen_ai.provider.name", "vllm"}, {srv, "gen_ai.request.model", model},
		{route, "inferrail.policy", "cost_model"}, {route, "inferrail.replica", "a"}, {route, "inferrail.admission", "dispatched"},
		{up, "server.address", "127.0.0.1"}, {up, "inferrail.replica", "a"},
	} {
		if v := attrOf(c.sp, c.key); v == nil || v.GetStringValue() != c.want {
			t.Errorf("%s: %s = %v, want %q", c.sp.Name, c.key, v, c.want)
		}
	}
	for _, c := range []struct {
		sp  *tracepb.Span
		key string
	}{
		{srv, "gen_ai.usage.input_tokens"}, {srv, "gen_ai.usage.output_tokens"}, {srv, "http.response.status_code"},
		{route, "inferrail.candidates"}, {route, "inferrail.prompt_tokens"}, {up, "http.response.status_code"},
	} {
		if v := attrOf(c.sp, c.key); v == nil || v.GetIntValue() <= 0 {
			t.Errorf("%s: %s = %v, want a positive integer", c.sp.Name, c.key, v)
		}
	}
	if v := attrOf(srv, "gen_ai.usage.output_tokens"); v.GetIntValue() != 5 {
		t.Errorf("output tokens %d, want 5", v.GetIntValue())
	}
	for _, k := range []string{"gen_ai.response.time_to_first_chunk", "inferrail.decision_us", "inferrail.queue_ms"} {
		sp := srv
		if k == "inferrail.decision_us" {
			sp = route
		}
		if attrOf(sp, k) == nil {
			t.Errorf("%s: no %s", sp.Name, k)
		}
	}
	// Never content: no attribute holds the prompt's words.
	prompt := words(0, 40)
	for _, sp := range spans {
		for _, kv := range sp.Attributes {
			if s := kv.Value.GetStringValue(); len(s) > 8 && strings.Contains(prompt, s) {
				t.Errorf("%s: attribute %s carries prompt text", sp.Name, kv.Key)
			}
		}
	}
	// The engine was sent the client span's context.
	want := "00-" + clientTrace + "-" + hex.EncodeToString(up.SpanId) + "-01"
	if got := eng.last(); got != want {
		t.Errorf("engine got traceparent %q, want %q", got, want)
	}
	if rc.svc != "gw-test" {
		t.Errorf("service.name %q", rc.svc)
	}
	// n: gen_ai.request.choice.count, set when not 1 (the convention's
	// rule).
	if v := attrOf(srv, "gen_ai.request.choice.count"); v != nil {
		t.Errorf("choice count %v for n 1", v)
	}
	body["n"] = 2
	resp, err = g.post(ctx, "/v1/chat/completions", body, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	waitUntil(t, "three more spans", 10*time.Second, func() bool { return len(rc.got()) >= 6 })
	servers := 0
	for _, sp := range rc.got()[3:] {
		if sp.Kind == tracepb.Span_SPAN_KIND_SERVER {
			servers++
			if v := attrOf(sp, "gen_ai.request.choice.count"); v.GetIntValue() != 2 || attrOf(sp, "gen_ai.usage.output_tokens").GetIntValue() != 10 {
				t.Errorf("n 2: choice count %v, output tokens %v; want 2 and 10", v, attrOf(sp, "gen_ai.usage.output_tokens"))
			}
		}
	}
	if servers != 1 {
		t.Errorf("%d server spans for the request of n 2", servers)
	}
}

func TestTracesFollowTheClientsSampledFlag(t *testing.T) {
	rc := newOTLPReceiver(t)
	g, eng := tracedGateway(t, rc.url, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Not sampled by the client: nothing is exported, even at ratio 1, and
	// the engine is still told the trace.
	resp, err := g.post(ctx, "/v1/completions", map[string]any{"model": "sim", "prompt": words(0, 20), "max_tokens": 3}, map[string]string{"traceparent": "00-" + clientTrace + "-00f067aa0ba902b7-00"})
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := eng.last(); !strings.HasPrefix(got, "00-"+clientTrace+"-") || !strings.HasSuffix(got, "-00") {
		t.Errorf("engine got traceparent %q, want the client's trace, not sampled", got)
	}
	// A sampled one after it is exported: its spans are the only ones.
	resp, err = g.post(ctx, "/v1/completions", map[string]any{"model": "sim", "prompt": words(0, 20), "max_tokens": 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	waitUntil(t, "the sampled request's spans", 10*time.Second, func() bool { return len(rc.got()) >= 3 })
	time.Sleep(1200 * time.Millisecond) // one more batch interval: nothing else arrives
	for _, sp := range rc.got() {
		if hex.EncodeToString(sp.TraceId) == clientTrace {
			t.Fatalf("span %q of the unsampled trace was exported", sp.Name)
		}
	}
	if n := len(rc.got()); n != 3 {
		t.Fatalf("got %d spans, want 3", n)
	}
	for _, sp := range rc.got() {
		if sp.Kind == tracepb.Span_SPAN_KIND_SERVER {
			if v := attrOf(sp, "gen_ai.operation.name"); v.GetStringValue() != "text_completion" || sp.Name != "text_completion "+g.models[0].name {
				t.Errorf("server span %q: operation %v, want text_completion", sp.Name, v)
			}
		}
	}
}

func TestTracingOffPassesTheClientsTraceparent(t *testing.T) {
	g, eng := tracedGateway(t, "", 1, nil)
	if g.tr != nil {
		t.Fatal("no endpoint must mean no tracer")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	parent := "00-" + clientTrace + "-00f067aa0ba902b7-01"
	resp, err := g.post(ctx, "/v1/completions", map[string]any{"model": "sim", "prompt": words(0, 20), "max_tokens": 3}, map[string]string{"traceparent": parent})
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := eng.last(); got != parent {
		t.Errorf("engine got traceparent %q, want the client's %q unchanged", got, parent)
	}
}

func TestTracingUnreachableEndpoint(t *testing.T) {
	// A port nothing listens on: connections are refused at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/v1/traces"
	ln.Close()
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	g, _ := tracedGateway(t, dead, 1, log)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 20 {
		resp, err := g.post(ctx, "/v1/completions", map[string]any{"model": "sim", "prompt": words(i, 20), "max_tokens": 3}, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d with the trace endpoint down", i, resp.StatusCode)
		}
		if i == 9 {
			waitUntil(t, "a failed export", 10*time.Second, func() bool { return testutil.ToFloat64(g.met.traceFailures) >= 1 })
		}
	}
	waitUntil(t, "a second failed export", 10*time.Second, func() bool { return testutil.ToFloat64(g.met.traceFailures) >= 2 })
	if n := strings.Count(logs.String(), "trace export failed"); n != 1 {
		t.Errorf("the outage was logged %d times, want once:\n%s", n, logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// BenchmarkTracingSpans is one request's tracing: its server, route and
// client spans, the traceparent injected upstream, at ratio 1 (every span
// recorded and exported, to a no-op exporter) and 0 (none sampled).
func BenchmarkTracingSpans(b *testing.B) {
	for _, ratio := range []float64{0, 0.1, 1} {
		b.Run("ratio="+strconv.FormatFloat(ratio, 'f', -1, 64), func(b *testing.B) {
			c := config.Default().Tracing
			c.SampleRatio = ratio
			tr := tracerWith(tracetest.NewNoopExporter(), c, "bench")
			defer tr.shutdown(context.Background())
			up := newUpstream(b, server.Config{Engine: testEngineConfig()})
			g := startGateway(b, testConfig(b, up))
			m := g.models[0]
			rep := m.live()[0]
			in := &inbound{op: opChat, m: m, req: gateway.Request{PromptTokens: 256, MaxTokens: 16}}
			a := &attempt{rep: rep}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			hdr := http.Header{}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				ctx, srv := tr.server(r, opChat)
				rsp := tr.route(ctx, m)
				endRoute(rsp, in, a, gateway.Decision{Kind: gateway.Dispatched}, nil, time.Microsecond)
				t := &try{}
				_, t.span = tr.upstream(ctx, in, rep)
				tr.prop.Inject(trace.ContextWithSpan(ctx, t.span), propagation.HeaderCarrier(hdr))
				endUpstream(t, "")
				endServer(srv, in, &accessRecord{status: 200, promptTokens: 256, outputTokens: 16}, "id")
			}
		})
	}
}

// The endpoint picker traces as the proxy does: a SERVER span continuing
// Envoy's traceparent, the routing decision's INTERNAL span under it, the
// response's usage on it once Envoy has relayed the answer, and the
// engine's traceparent set to the pick's span (no CLIENT span: Envoy
// sends the request). A rejection is traced too.
func TestEPPTraces(t *testing.T) {
	rc := newOTLPReceiver(t)
	up := newUpstream(t, server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true})
	c := eppConfig(t, up)
	c.Tracing.Endpoint, c.Tracing.SampleRatio, c.Tracing.Timeout = rc.url, 1, time.Second
	c.Models[0].MaxConcurrency, c.Models[0].Queue.MaxRequests = 1, 0
	e := startEPP(t, c, Deps{}, eppOptions{})
	parent := "00-" + clientTrace + "-00f067aa0ba902b7-01"
	call := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(10, 30), 4, true), header: map[string]string{"traceparent": parent}})
	// Busy: the next request is refused (queueing is off), traced too.
	refused := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(50, 10), 2, false), header: map[string]string{"traceparent": parent}})
	if refused.pick.status() != 429 {
		t.Fatalf("with the replica busy: %d, want 429", refused.pick.status())
	}
	resp := call.forward()
	call.respond(resp, "")
	call.relayBody(resp)
	call.finish()
	waitUntil(t, "four spans at the receiver", 10*time.Second, func() bool { return len(rc.got()) >= 4 })
	var servers, routes []*tracepb.Span
	for _, sp := range rc.got() {
		if got := hex.EncodeToString(sp.TraceId); got != clientTrace {
			t.Errorf("span %q: trace id %s, want Envoy's %s", sp.Name, got, clientTrace)
		}
		switch sp.Kind {
		case tracepb.Span_SPAN_KIND_SERVER:
			servers = append(servers, sp)
		case tracepb.Span_SPAN_KIND_INTERNAL:
			routes = append(routes, sp)
		default:
			t.Errorf("span %q of kind %v: the picker sends nothing itself", sp.Name, sp.Kind)
		}
	}
	if len(servers) != 2 || len(routes) != 2 {
		t.Fatalf("%d server and %d route spans, want 2 and 2", len(servers), len(routes))
	}
	model := e.models[0].name
	var ok, rejected *tracepb.Span
	for _, sp := range servers {
		if hex.EncodeToString(sp.ParentSpanId) != "00f067aa0ba902b7" || sp.Name != "text_completion "+model {
			t.Errorf("server span %q, parent %x", sp.Name, sp.ParentSpanId)
		}
		switch attrOf(sp, "http.response.status_code").GetIntValue() {
		case 200:
			ok = sp
		case 429:
			rejected = sp
		}
	}
	if ok == nil || rejected == nil {
		t.Fatalf("server spans %v: want one 200, one 429", servers)
	}
	if v := attrOf(ok, "gen_ai.usage.output_tokens"); v == nil || v.GetIntValue() != 4 {
		t.Errorf("the answered span's output tokens %v, want 4", v)
	}
	for _, r := range routes {
		if !bytes.Equal(r.ParentSpanId, ok.SpanId) && !bytes.Equal(r.ParentSpanId, rejected.SpanId) {
			t.Errorf("route span %q is not under a server span", r.Name)
		}
	}
	if want := "00-" + clientTrace + "-" + hex.EncodeToString(ok.SpanId) + "-01"; call.pick.traceparent != want {
		t.Errorf("the engine's traceparent %q, want %q (the pick's span)", call.pick.traceparent, want)
	}
}
