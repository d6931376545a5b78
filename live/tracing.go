package live

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/gateway"
)

// Traces: per generation request a SERVER span named as the GenAI
// semantic conventions (v1.40.0, the last release that ships typed GenAI
// instruments: gen_ai.provider.name, not the older gen_ai.system) say,
// "{gen_ai.operation.name} {gen_ai.request.model}"; per routing decision an
// INTERNAL span "route {model}" (the policy, what it was offered, what it
// chose and why it waited); per try upstream a CLIENT span with the
// engine's address, whose context goes to the engine in traceparent. A
// client's W3C traceparent is continued (its sampled flag followed); new
// traces are sampled at tracing.sample_ratio. Prompts and completions are
// never recorded. Without tracing.endpoint, s.tr is nil and nothing is
// created.

// Attributes the v1.40.0 conventions do not define yet, under the names
// the later GenAI conventions give them.
const (
	attrRequestStream    = attribute.Key("gen_ai.request.stream")
	attrTimeToFirstChunk = attribute.Key("gen_ai.response.time_to_first_chunk")
)

// providerName is gen_ai.provider.name: the conventions' registry has no
// value for a self-hosted engine, so the API family inferrail speaks to
// the engines names it, as peers do.
const providerName = "vllm"

// tracer is the process's tracing, or nil when it is off.
type tracer struct {
	t    trace.Tracer
	tp   *sdktrace.TracerProvider
	prop propagation.TextMapPropagator
	// ratio is the share of new traces sampled. A request that is not
	// traced (no sampled traceparent, and not drawn) creates no span at
	// all: the decision comes before any of the SDK's work.
	ratio float64
}

// newTracer builds the tracer provider for c; nil when c has no endpoint.
// failures counts exports that failed; the first failure of an outage is
// logged once, at warn level, and its recovery at info level.
func newTracer(c config.Tracing, version string, log *slog.Logger, failures prometheus.Counter) (*tracer, error) {
	if c.Endpoint == "" {
		return nil, nil
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("tracing.endpoint: %w", err)
	}
	opts := []otlptracehttp.Option{
		otlptracehttp.WithEndpointURL(c.Endpoint),
		otlptracehttp.WithTimeout(c.Timeout),
		// Retries stay within one export's timeout: spans wait in the
		// batch queue (bounded, dropped when full), never a request.
		otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: true, InitialInterval: 500 * time.Millisecond, MaxInterval: 2 * time.Second, MaxElapsedTime: c.Timeout}),
	}
	if len(c.Headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(c.Headers))
	}
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	ce := &countingExporter{SpanExporter: exp, log: log, host: u.Host, failures: failures}
	return tracerWith(ce, c, version), nil
}

// tracerWith builds a tracer that exports to exp, batched.
func tracerWith(exp sdktrace.SpanExporter, c config.Tracing, version string) *tracer {
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(c.ServiceName), semconv.ServiceVersion(version))
	// server draws the new traces it samples before a span starts, so
	// the SDK samples every root it is given; a child follows its parent.
	// Small batches every 200 ms spread the export's work (a burst of it
	// on a busy core is a latency spike).
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(200*time.Millisecond), sdktrace.WithMaxExportBatchSize(128), sdktrace.WithExportTimeout(c.Timeout)),
	)
	return &tracer{
		t:     tp.Tracer("github.com/inferrail/inferrail/live", trace.WithInstrumentationVersion(version), trace.WithSchemaURL(semconv.SchemaURL)),
		tp:    tp,
		prop:  propagation.TraceContext{},
		ratio: c.SampleRatio,
	}
}

// shutdown exports what is left, within ctx.
func (t *tracer) shutdown(ctx context.Context) {
	if t != nil {
		t.tp.Shutdown(ctx)
	}
}

// countingExporter counts failed exports and logs the first of each outage
// once; it swallows the error, so the SDK does not log each failure again.
type countingExporter struct {
	sdktrace.SpanExporter
	log      *slog.Logger
	host     string
	failures prometheus.Counter
	failing  atomic.Bool
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		e.failures.Inc()
		if !e.failing.Swap(true) {
			e.log.Warn("trace export failed; spans are dropped while it fails (inferrail_trace_export_failures_total counts the failures)",
				"endpoint_host", e.host, "spans", len(spans), "err", err)
		}
		return nil
	}
	if e.failing.Swap(false) {
		e.log.Info("trace export recovered", "endpoint_host", e.host)
	}
	return nil
}

// operation is gen_ai.operation.name of a request for op.
func operation(op opKind) attribute.KeyValue {
	switch op {
	case opChat, opResponses:
		return semconv.GenAIOperationNameChat
	case opEmbedding:
		return semconv.GenAIOperationNameEmbeddings
	case opScore:
		return semconv.GenAIOperationNameKey.String("score")
	case opRerank:
		return semconv.GenAIOperationNameKey.String("rerank")
	}
	return semconv.GenAIOperationNameTextCompletion
}

// server starts a request's SERVER span, continuing the client's
// traceparent; the span is named again once the model is known. It returns
// a nil span for a request that is not traced: a client's traceparent not
// sampled (forwarded to the engine as it is), or a new trace not drawn.
func (t *tracer) server(r *http.Request, kind opKind) (context.Context, trace.Span) {
	return t.serverOf(r.Context(), r.Header, r.URL.Path, kind)
}

// serverOf is server for a request known by its headers h and path, its
// context parent: the proxy's, or the endpoint picker's for a request
// Envoy asks it about.
func (t *tracer) serverOf(parent context.Context, h http.Header, path string, kind opKind) (context.Context, trace.Span) {
	ctx := parent
	if len(h["Traceparent"]) > 0 {
		ctx = t.prop.Extract(ctx, propagation.HeaderCarrier(h))
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		if !sc.IsSampled() {
			return parent, nil
		}
	} else if t.ratio < 1 && rand.Float64() >= t.ratio {
		return parent, nil
	}
	op := operation(kind)
	return t.t.Start(ctx, op.Value.AsString(), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(op, semconv.GenAIProviderNameKey.String(providerName), semconv.HTTPRequestMethodPost, semconv.URLPath(path)))
}

// headersOf is the trace context of sp as request headers (traceparent,
// and tracestate when there is one), for the engine to continue.
func (t *tracer) headersOf(ctx context.Context, sp trace.Span) http.Header {
	h := http.Header{}
	t.prop.Inject(trace.ContextWithSpan(ctx, sp), propagation.HeaderCarrier(h))
	return h
}

// endServer sets what the request came to on its SERVER span, from its
// access record.
func endServer(sp trace.Span, in *inbound, ar *accessRecord, reqID string) {
	if sp == nil {
		return
	}
	if !sp.IsRecording() {
		sp.End()
		return
	}
	status := ar.status
	if status == 0 {
		status = http.StatusOK
	}
	attrs := []attribute.KeyValue{semconv.HTTPResponseStatusCode(status), attribute.String("inferrail.request_id", reqID)}
	if in != nil {
		sp.SetName(operation(in.op).Value.AsString() + " " + in.m.name)
		attrs = append(attrs, semconv.GenAIRequestModel(in.m.name), attrRequestStream.Bool(in.f.Stream), semconv.GenAIRequestMaxTokens(in.req.MaxTokens))
		if in.f.N > 1 { // the convention's rule: set when not 1
			attrs = append(attrs, semconv.GenAIRequestChoiceCount(in.f.N))
		}
		if ar.promptTokens > 0 {
			attrs = append(attrs, semconv.GenAIUsageInputTokens(ar.promptTokens))
		}
		if ar.outputTokens > 0 || ar.cachedTokens > 0 {
			attrs = append(attrs, semconv.GenAIUsageOutputTokens(ar.outputTokens), semconv.GenAIUsageCacheReadInputTokens(ar.cachedTokens))
		}
		if ar.ttft > 0 {
			attrs = append(attrs, attrTimeToFirstChunk.Float64(ar.ttft.Seconds()))
		}
		if ar.replica != "" {
			attrs = append(attrs, attribute.String("inferrail.replica", ar.replica))
		}
		attrs = append(attrs, attribute.Float64("inferrail.queue_ms", float64(ar.queued)/1e6))
	}
	if status >= 400 {
		attrs = append(attrs, semconv.ErrorTypeKey.String(strconv.Itoa(status)))
		if status >= 500 || status == statusClientGone {
			sp.SetStatus(codes.Error, http.StatusText(status))
		}
	}
	sp.SetAttributes(attrs...)
	sp.End()
}

// route starts the INTERNAL span of one routing decision.
func (t *tracer) route(ctx context.Context, m *model) trace.Span {
	if t == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return nil // tracing is off, or this request is not traced
	}
	_, sp := t.t.Start(ctx, "route "+m.name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("inferrail.policy", m.policyName())))
	return sp
}

// endRoute records a decision on its span: the core's first answer d, how
// the wait ended (e: nil once dispatched), the winner, its load and what
// the index predicted there, and the decision's own time.
func endRoute(sp trace.Span, in *inbound, a *attempt, d gateway.Decision, e *apiError, took time.Duration) {
	if sp == nil {
		return
	}
	if !sp.IsRecording() {
		sp.End()
		return
	}
	m := in.m
	outcome := "dispatched"
	switch {
	case e != nil:
		outcome = e.outcome
	case d.Kind == gateway.Queued:
		outcome = "queued"
	}
	attrs := []attribute.KeyValue{
		attribute.String("inferrail.admission", outcome),
		attribute.Int("inferrail.candidates", m.candidates()),
		attribute.Float64("inferrail.queue_ms", float64(a.queued)/1e6),
		attribute.Float64("inferrail.decision_us", float64(took)/1e3),
		attribute.Int("inferrail.prompt_tokens", in.req.PromptTokens),
		attribute.Bool("inferrail.tokenized", in.ids != nil),
	}
	if e == nil && a.rep != nil {
		attrs = append(attrs,
			attribute.String("inferrail.replica", a.dec.Name),
			attribute.Int("inferrail.replica.in_flight", m.inFlight(a.rep)),
			attribute.Int("inferrail.predicted_cached_tokens", a.dec.PredictedCachedTokens),
			attribute.Int("inferrail.reserved_blocks", a.dec.Weight))
	}
	if e != nil {
		attrs = append(attrs, semconv.ErrorTypeKey.String(e.outcome))
	}
	sp.SetAttributes(attrs...)
	sp.End()
}

// upstream starts the CLIENT span of one try at rep.
func (t *tracer) upstream(ctx context.Context, in *inbound, rep *replica) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil // not traced: a client's traceparent goes on as it came
	}
	op := operation(in.op)
	attrs := []attribute.KeyValue{op, semconv.GenAIProviderNameKey.String(providerName), semconv.GenAIRequestModel(in.m.name),
		attribute.String("inferrail.replica", rep.name)}
	if host, port, err := net.SplitHostPort(rep.base.Host); err == nil {
		p, _ := strconv.Atoi(port)
		attrs = append(attrs, semconv.ServerAddress(host), semconv.ServerPort(p))
	} else {
		attrs = append(attrs, semconv.ServerAddress(rep.base.Host))
	}
	return t.t.Start(ctx, op.Value.AsString()+" "+in.m.name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// endUpstream records how a try went on its span: its status, or why it
// failed.
func endUpstream(t *try, failure string) {
	sp := t.span
	if sp == nil {
		return
	}
	t.span = nil
	if !sp.IsRecording() {
		sp.End()
		return
	}
	switch {
	case t.resp != nil:
		sp.SetAttributes(semconv.HTTPResponseStatusCode(t.resp.StatusCode))
		if t.resp.StatusCode >= 500 {
			sp.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(t.resp.StatusCode)))
			sp.SetStatus(codes.Error, "")
		}
	case t.err != nil || t.timedOut:
		sp.SetAttributes(semconv.ErrorTypeKey.String(t.reason()))
		sp.SetStatus(codes.Error, t.reason())
	}
	if failure != "" {
		sp.SetAttributes(semconv.ErrorTypeKey.String(failure))
		sp.SetStatus(codes.Error, failure)
	}
	sp.End()
}
