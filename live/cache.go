package live

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/respcache"
	"github.com/inferrail/inferrail/semcache"
)

// This file is the response caches on the request path: per model, the
// exact cache (package respcache, models[].response_cache) and behind it
// the semantic cache (package semcache, models[].semantic_cache), in the
// order handleGenerate calls them, once the body is parsed and the key
// authorized and before anything is weighed, reserved or routed:
//
//   - lookupCaches: the exact cache decides (bypass, hit, or a miss that
//     identical concurrent requests wait for); on a miss of a model with a
//     semantic cache, the same tenant's nearest earlier request with the
//     same everything but its last user message is looked up.
//   - serveCached: a hit is replayed byte for byte (x-inferrail-cache: hit,
//     or semantic), charged to the rate limiter as one request of 0 tokens
//     and metered as a request of 0 engine tokens (release).
//   - otherwise the request goes to the engines through the miss's
//     capture, which tees the answer as it is written (the client gets
//     every byte when the engine sends it), and finishCaches stores a whole
//     answer in both caches when the handler ends.
//
// The tenant is the API key's id (auth: keys) and the response_cache's
// tenant_header value: never the anonymous key of auth: none, which every
// request would share (one tenant's answers served to all, hit latency
// telling each what the others asked).

// Values of x-inferrail-cache beyond respcache's hit and miss.
const cacheSemantic = "semantic"

// Outcomes of a request answered from a cache (inferrail_requests_total).
const (
	outcomeCacheHit    = "cache_hit"
	outcomeSemanticHit = "semantic_hit"
)

// maxSemanticSets bounds the semantic cache's writes in flight off the
// request path (store: pgvector); one more is dropped and counted as a
// store error (op put_dropped).
const maxSemanticSets = 64

// cacheCloseTimeout bounds how long Close waits for those writes.
const cacheCloseTimeout = 5 * time.Second

// semanticOpenTimeout bounds opening a semantic cache at startup (its
// pgvector store connects and creates its schema).
const semanticOpenTimeout = 30 * time.Second

// caches are the models' response caches, by model name; nil when no
// model has one.
type caches struct {
	byModel map[string]*modelCaches
}

// modelCaches is one model's caches.
type modelCaches struct {
	model string
	exact *respcache.Cache
	// tenantHeader is response_cache.tenant_header, canonical ("": none).
	tenantHeader string
	// sem is the semantic cache (nil: off); semAsync stores its answers
	// off the request path (a remote store), at most cap(semSets) at once.
	sem      *semcache.Cache
	semAsync bool
	semSets  chan struct{}
	semWG    sync.WaitGroup
	// semStoreErr counts a dropped write.
	semStoreErr prometheus.Counter
	log         *slog.Logger
}

// newCaches builds the caches the configuration turns on and writes the
// startup notes (cacheNotes, and a Redis store's eviction settings) to
// notes. Its errors name the model's field.
func newCaches(cfg *config.Config, met *cacheMetrics, notes io.Writer, log *slog.Logger) (*caches, error) {
	cs := &caches{byModel: map[string]*modelCaches{}}
	for i := range cfg.Models {
		mc := &cfg.Models[i]
		if !mc.ResponseCache.Enabled {
			continue
		}
		if notes != nil {
			for _, n := range cacheNotes(cfg, i) {
				fmt.Fprintf(notes, "inferrail live: model %s: %s\n", mc.Name, n)
			}
		}
		m, err := newModelCaches(mc, met, notes, log)
		if err != nil {
			cs.close()
			return nil, fmt.Errorf("models[%d].%w", i, err)
		}
		cs.byModel[mc.Name] = m
	}
	if len(cs.byModel) == 0 {
		return nil, nil
	}
	return cs, nil
}

func newModelCaches(mc *config.Model, met *cacheMetrics, notes io.Writer, log *slog.Logger) (*modelCaches, error) {
	name := mc.Name
	exact, err := respcache.New(mc.ResponseCache, respcache.Deps{Hooks: met.exactHooks(name)})
	if err != nil {
		return nil, fmt.Errorf("response_cache: %w", err)
	}
	m := &modelCaches{model: name, exact: exact, log: log, semSets: make(chan struct{}, maxSemanticSets)}
	if h := mc.ResponseCache.TenantHeader; h != "" {
		m.tenantHeader = textproto.CanonicalMIMEHeaderKey(h)
	}
	if rs, ok := exact.Store().(*respcache.RedisStore); ok && notes != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := rs.CheckEviction(ctx); err != nil {
			fmt.Fprintf(notes, "inferrail live: model %s: response_cache.redis: %v\n", name, err)
		}
		cancel()
	}
	if !mc.SemanticCache.Enabled {
		return m, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), semanticOpenTimeout)
	defer cancel()
	sem, err := semcache.New(ctx, mc.SemanticCache, semcache.Deps{Rule: exact, Hooks: met.semanticHooks(name)})
	if err != nil {
		exact.Close()
		return nil, fmt.Errorf("semantic_cache: %w", err)
	}
	m.sem, m.semAsync = sem, mc.SemanticCache.Store != semcache.StoreMemory
	m.semStoreErr = met.semStoreErrors.WithLabelValues(name, "put_dropped")
	return m, nil
}

// cacheNotes are the startup notes of model i's caches: what makes some
// or all of its requests never cached, though the cache is on. The rule:
// a request is cached only with a tenant and a temperature at most
// max_temperature, and one without temperature has OpenAI's default 1
// (live sets no temperature of its own); so a cache on a model whose
// requests cannot have a tenant (auth: none and no tenant_header) caches
// nothing, and one whose max_temperature is under 1 never caches a request
// that leaves temperature out.
func cacheNotes(cfg *config.Config, i int) []string {
	rc := &cfg.Models[i].ResponseCache
	if !rc.Enabled {
		return nil
	}
	var out []string
	if cfg.Auth != config.AuthKeys && rc.TenantHeader == "" {
		out = append(out, "response_cache is on but no request can have a tenant (auth: none and no response_cache.tenant_header): "+
			"every request is bypassed (no_tenant); turn auth: keys on, or name a tenant_header that a trusted front sets")
	}
	if rc.MaxTemperature < 1 {
		out = append(out, fmt.Sprintf("response_cache: requests without a temperature sample at OpenAI's default 1, above max_temperature (%v): "+
			"they are never cached; only requests that send temperature <= %v are", rc.MaxTemperature, rc.MaxTemperature))
	}
	return out
}

// close ends every cache: pending writes first (bounded), then the stores.
func (cs *caches) close() {
	if cs == nil {
		return
	}
	for _, m := range cs.byModel {
		m.close()
	}
}

func (m *modelCaches) close() {
	if m.sem != nil {
		done := make(chan struct{})
		go func() { m.semWG.Wait(); close(done) }()
		t := time.NewTimer(cacheCloseTimeout)
		select {
		case <-done:
		case <-t.C:
			m.log.Warn("semantic cache: writes still pending at close", "model", m.model, "waited", cacheCloseTimeout)
		}
		t.Stop()
		if err := m.sem.Close(); err != nil {
			m.log.Warn("semantic cache: close", "model", m.model, "error", err.Error())
		}
	}
	if err := m.exact.Close(); err != nil {
		m.log.Warn("response cache: close", "model", m.model, "error", err.Error())
	}
}

// forModel is model's caches, nil when it has none.
func (cs *caches) forModel(model string) *modelCaches {
	if cs == nil {
		return nil
	}
	return cs.byModel[model]
}

// cacheTurn is one request's passage through its model's caches.
type cacheTurn struct {
	mc *modelCaches
	// hit is the answer to replay, with its x-inferrail-cache value.
	hit    *respcache.Entry
	header string
	// capture is the exact cache's miss: the answer goes through it.
	capture *respcache.Capture
	// sem is the semantic cache's miss (semMiss), stored at the end.
	sem     semcache.Result
	semMiss bool
}

// cacheKeyID is the API key id the caches partition by: "" without
// tenancy and for the anonymous key of auth: none.
func cacheKeyID(g *grant) string {
	if g == nil || g.keyID == anonymousKey {
		return ""
	}
	return g.keyID
}

// semanticTenant is the semantic cache's tenant: the exact cache's key id
// and tenant header value, both when both are there ("" when neither is).
// Neither holds a newline (key ids are letters and digits, header values
// cannot), so two tenants never spell the same.
func semanticTenant(keyID, header string) string {
	switch {
	case keyID == "" && header == "":
		return ""
	case header == "":
		return "key:" + keyID
	case keyID == "":
		return "header:" + header
	}
	return "key:" + keyID + "\nheader:" + header
}

// lookupCaches asks in's model's caches for the request: nil when the
// model has none or the request is bypassed; else a turn with a hit to
// replay, or a miss's capture to send the answer through. The error is the
// answer when the request's context ended while it waited for an identical
// request's answer.
func (s *Server) lookupCaches(ctx context.Context, r *http.Request, g *grant, in *inbound) (*cacheTurn, *apiError) {
	mc := s.caches.forModel(in.m.name)
	if mc == nil || in.op.prefillOnly() || in.op == opResponses { // the caches keep generations (not the Responses API's: the engine may store each)
		return nil, nil
	}
	keyID := cacheKeyID(g)
	res, err := mc.exact.Lookup(ctx, respcache.Request{Path: r.URL.Path, Body: in.body, Model: in.engineModel(), KeyID: keyID, Header: r.Header})
	if err != nil {
		if r.Context().Err() != nil {
			return nil, &apiError{status: statusClientGone, outcome: "client_gone", model: in.m.name}
		}
		return nil, &apiError{status: http.StatusGatewayTimeout, typ: "timeout", code: "request_timeout", outcome: "timeout", model: in.m.name,
			msg: fmt.Sprintf("the request did not complete within request_timeout (%v) while it waited for an identical request's answer", s.cfg.RequestTimeout)}
	}
	switch res.Outcome {
	case respcache.Hit:
		return &cacheTurn{mc: mc, hit: res.Entry, header: "hit"}, nil
	case respcache.Bypass:
		return nil, nil
	}
	ct := &cacheTurn{mc: mc, capture: res.Capture}
	if mc.sem == nil {
		return ct, nil
	}
	hdr := ""
	if mc.tenantHeader != "" {
		if vs := r.Header[mc.tenantHeader]; len(vs) == 1 { // the exact cache bypasses a repeated one
			hdr = vs[0]
		}
	}
	sr, err := mc.sem.Lookup(ctx, semcache.Query{Path: r.URL.Path, Body: in.body, Tenant: semanticTenant(keyID, hdr), Model: in.engineModel()})
	if err != nil {
		// Counted by the hooks; the request goes to the engines.
		s.log.Debug("semantic cache lookup failed", "model", in.m.name, "error", err.Error())
	}
	switch sr.Outcome {
	case semcache.Hit:
		e, derr := respcache.DecodeEntry(sr.Answer)
		if derr == nil && e.Kind == res.Kind {
			// Answered with another request's answer: nothing is stored
			// under this request's key, and the identical requests
			// waiting for it look for their own.
			res.Capture.Abandon()
			return &cacheTurn{mc: mc, hit: e, header: cacheSemantic}, nil
		}
		if derr == nil {
			derr = fmt.Errorf("a %v answer for a %v request", e.Kind, res.Kind)
		}
		mc.semStoreErrCorrupt(s, derr)
	case semcache.Miss:
		ct.sem, ct.semMiss = sr, true
	}
	return ct, nil
}

// semStoreErrCorrupt counts and logs a stored semantic answer that cannot
// be replayed (the request goes to the engines).
func (m *modelCaches) semStoreErrCorrupt(s *Server, err error) {
	s.met.cache.semStoreErrors.WithLabelValues(m.model, "corrupt").Inc()
	s.log.Warn("semantic cache: a stored answer cannot be replayed", "model", m.model, "error", err.Error())
}

// serveCached answers the request with ct's hit. It is still a request
// to the rate limiter (RPM and concurrency, 0 tokens) and to the usage
// meter (a request of 0 engine tokens: release).
func (s *Server) serveCached(ctx context.Context, w http.ResponseWriter, g *grant, in *inbound, ar *accessRecord, ct *cacheTurn) {
	if g != nil {
		g.cached = true
	}
	if e := s.reserve(ctx, w, g, in); e != nil {
		ar.status, ar.outcome = e.status, e.outcome
		s.answerError(w, e)
		return
	}
	defer s.release(g, in, ar)
	outcome := outcomeCacheHit
	if ct.header == cacheSemantic {
		outcome = outcomeSemanticHit
	}
	ar.ttft = time.Since(ar.began)
	if err := respcache.ReplayAs(w, ct.hit, s.cfg.WriteTimeout, ct.header); err != nil {
		s.outcomeOf(ar, in.m.name, "client_gone")
		ar.status = statusClientGone
		return
	}
	s.outcomeOf(ar, in.m.name, outcome)
	ar.status = http.StatusOK
	g.done()
}

// finishCaches ends a miss once the handler is done with the answer:
// the exact cache stores it when it was whole and successful, and the
// semantic cache keeps that same entry for the request's scope.
func (s *Server) finishCaches(ct *cacheTurn) {
	ct.capture.Finish()
	if !ct.semMiss {
		return
	}
	e := ct.capture.Entry()
	if e == nil {
		return
	}
	ct.mc.storeSemantic(ct.sem, respcache.EncodeEntry(e))
}

// storeSemantic stores a miss's answer: at once in memory (microseconds),
// off the request path for a remote store (bounded by its own timeout, at
// most maxSemanticSets at once).
func (m *modelCaches) storeSemantic(sr semcache.Result, answer []byte) {
	put := func() {
		if err := sr.Store(context.Background(), answer); err != nil {
			m.log.Debug("semantic cache store failed", "model", m.model, "error", err.Error())
		}
	}
	if !m.semAsync {
		put()
		return
	}
	select {
	case m.semSets <- struct{}{}:
	default:
		m.semStoreErr.Inc()
		return
	}
	m.semWG.Go(func() {
		defer func() { <-m.semSets }()
		put()
	})
}

// cacheMetrics are the caches' Prometheus metrics (newCacheMetrics
// registers them with the gateway's).
type cacheMetrics struct {
	hits, misses, coalesced, stores, tooLarge *prometheus.CounterVec
	bypass, notStored, evictions, storeErrors *prometheus.CounterVec

	semHits, semMisses, semEmbedErrors, semStores *prometheus.CounterVec
	semBypass, semStoreErrors, semNotStored       *prometheus.CounterVec
	semSimilarity, semEmbedDuration               *prometheus.HistogramVec
}

// newCacheMetrics registers the caches' metrics in m's registry, as m's
// own; the gauges of the memory stores read s's caches when scraped.
func newCacheMetrics(m *metrics, s *Server) *cacheMetrics {
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		m.reg.MustRegister(c)
		m.own = append(m.own, c)
		return c
	}
	hv := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		m.reg.MustRegister(h)
		m.own = append(m.own, h)
		return h
	}
	c := &cacheMetrics{}
	c.hits = cv("inferrail_response_cache_hits_total", "Requests answered from the exact response cache (models[].response_cache), coalesced ones included.", "model")
	c.misses = cv("inferrail_response_cache_misses_total", "Cacheable requests the exact response cache did not hold, sent to an engine (or answered by the semantic cache).", "model")
	c.bypass = cv("inferrail_response_cache_bypass_total", "Requests the exact response cache does not look up, by reason (no_tenant, temperature, n, best_of, top_p, top_k, min_p, stream, invalid_body, tenant_header, path).", "model", "reason")
	c.coalesced = cv("inferrail_response_cache_coalesced_total", "Hits that waited for an identical request's answer instead of computing their own.", "model")
	c.stores = cv("inferrail_response_cache_stores_total", "Answers stored in the exact response cache.", "model")
	c.notStored = cv("inferrail_response_cache_not_stored_total", "Answers of cacheable requests not stored, by reason (too_large, status, content_encoding, content_type, incomplete, error_event, malformed).", "model", "reason")
	c.tooLarge = cv("inferrail_response_cache_too_large_total", "Answers larger than response_cache.max_entry_bytes: relayed, not stored.", "model")
	c.evictions = cv("inferrail_response_cache_evictions_total", "Entries the memory store dropped, by reason (lru: past max_bytes; ttl: expired).", "model", "reason")
	c.storeErrors = cv("inferrail_response_cache_store_errors_total", "Failed store calls of the exact response cache by op (get: read as a miss; set; set_dropped: too many Redis writes pending).", "model", "op")
	c.semHits = cv("inferrail_semantic_cache_hits_total", "Requests answered by the semantic cache (models[].semantic_cache) with a similar earlier request's answer of the same tenant.", "model")
	c.semMisses = cv("inferrail_semantic_cache_misses_total", "Requests the semantic cache looked up without a stored answer within its threshold.", "model")
	c.semBypass = cv("inferrail_semantic_cache_bypass_total", "Exact-cache misses the semantic cache does not look up, by reason (no_user_message, not_text, empty_text, too_long, invalid_body).", "model", "reason")
	c.semSimilarity = hv("inferrail_semantic_cache_hit_similarity", "Cosine similarity of the semantic cache's hits to the stored request.", []float64{0.8, 0.85, 0.9, 0.95, 0.97, 0.99, 1}, "model")
	c.semEmbedErrors = cv("inferrail_semantic_cache_embed_errors_total", "Failed embeddings calls of the semantic cache (the request goes to an engine).", "model")
	c.semEmbedDuration = hv("inferrail_semantic_cache_embed_duration_seconds", "Duration of the semantic cache's embeddings calls, failed ones included.", prometheus.ExponentialBuckets(0.0001, 2, 15), "model")
	c.semStoreErrors = cv("inferrail_semantic_cache_store_errors_total", "Failed store calls of the semantic cache by op (nearest, put; put_dropped: too many writes pending; corrupt: a stored answer that cannot be replayed).", "model", "op")
	c.semStores = cv("inferrail_semantic_cache_stores_total", "Answers stored in the semantic cache.", "model")
	c.semNotStored = cv("inferrail_semantic_cache_not_stored_total", "Answers the semantic cache did not store, by reason (too_large: past semantic_cache.max_entry_bytes or its store's bound).", "model", "reason")
	g := &cacheGauges{s: s}
	m.reg.MustRegister(g)
	m.own = append(m.own, g)
	return c
}

// exactHooks count model's exact cache (the model label curried in).
func (c *cacheMetrics) exactHooks(model string) respcache.Hooks {
	hits, misses, coalesced := c.hits.WithLabelValues(model), c.misses.WithLabelValues(model), c.coalesced.WithLabelValues(model)
	stores, tooLarge := c.stores.WithLabelValues(model), c.tooLarge.WithLabelValues(model)
	return respcache.Hooks{
		Hit:        hits.Inc,
		Miss:       misses.Inc,
		Coalesced:  coalesced.Inc,
		Bypass:     func(reason string) { c.bypass.WithLabelValues(model, reason).Inc() },
		Stored:     func(int) { stores.Inc() },
		NotStored:  func(reason string) { c.notStored.WithLabelValues(model, reason).Inc() },
		TooLarge:   tooLarge.Inc,
		Evicted:    func(reason string, n int) { c.evictions.WithLabelValues(model, reason).Add(float64(n)) },
		StoreError: func(op string) { c.storeErrors.WithLabelValues(model, op).Inc() },
	}
}

// semanticHooks count model's semantic cache.
func (c *cacheMetrics) semanticHooks(model string) semcache.Hooks {
	hits, misses, embedErrors, stores := c.semHits.WithLabelValues(model), c.semMisses.WithLabelValues(model), c.semEmbedErrors.WithLabelValues(model), c.semStores.WithLabelValues(model)
	sim, embed := c.semSimilarity.WithLabelValues(model), c.semEmbedDuration.WithLabelValues(model)
	return semcache.Hooks{
		Hit:          func(similarity float64) { hits.Inc(); sim.Observe(similarity) },
		Miss:         misses.Inc,
		Bypass:       func(reason string) { c.semBypass.WithLabelValues(model, reason).Inc() },
		EmbedError:   embedErrors.Inc,
		EmbedLatency: func(d time.Duration) { embed.Observe(d.Seconds()) },
		StoreError:   func(op string) { c.semStoreErrors.WithLabelValues(model, op).Inc() },
		Stored:       func(int) { stores.Inc() },
		NotStored:    func(reason string) { c.semNotStored.WithLabelValues(model, reason).Inc() },
	}
}

// cacheGauges reports the memory stores' sizes, read when scraped.
type cacheGauges struct{ s *Server }

var (
	descCacheEntries    = prometheus.NewDesc("inferrail_response_cache_entries", "Entries in the exact response cache's memory store.", []string{"model"}, nil)
	descCacheBytes      = prometheus.NewDesc("inferrail_response_cache_bytes", "Bytes the exact response cache's memory store holds (bounded by max_bytes).", []string{"model"}, nil)
	descSemanticEntries = prometheus.NewDesc("inferrail_semantic_cache_entries", "Entries in the semantic cache's memory store.", []string{"model"}, nil)
	descSemanticBytes   = prometheus.NewDesc("inferrail_semantic_cache_bytes", "Bytes of answers and vectors the semantic cache's memory store holds (bounded by max_bytes).", []string{"model"}, nil)
)

func (g *cacheGauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCacheEntries, descCacheBytes, descSemanticEntries, descSemanticBytes} {
		ch <- d
	}
}

func (g *cacheGauges) Collect(ch chan<- prometheus.Metric) {
	cs := g.s.caches
	if cs == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, model string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, model)
	}
	for name, m := range cs.byModel {
		if ms, ok := m.exact.Store().(*respcache.MemoryStore); ok {
			gauge(descCacheEntries, float64(ms.Len()), name)
			gauge(descCacheBytes, float64(ms.Bytes()), name)
		}
		if m.sem != nil {
			if ms, ok := m.sem.Store().(*semcache.MemoryStore); ok {
				gauge(descSemanticEntries, float64(ms.Len()), name)
				gauge(descSemanticBytes, float64(ms.Bytes()), name)
			}
		}
	}
}
