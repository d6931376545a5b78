package live

import (
	"github.com/inferrail/inferrail/internal/netguard"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/inferrail/inferrail/router/gateway"
)

// metrics are the gateway's own Prometheus metrics, served on the admin
// port.
type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	// The request path's series are resolved once: each model's
	// (modelSeries) and each replica's (replicaSeries).
	ttftH      *prometheus.HistogramVec
	durationH  *prometheus.HistogramVec
	decisions  *prometheus.CounterVec
	decisionH  *prometheus.HistogramVec
	retries    *prometheus.CounterVec
	errors     *prometheus.CounterVec
	rejections *prometheus.CounterVec
	queueWaitH *prometheus.HistogramVec
	overheadH  *prometheus.HistogramVec
	tokenize   *prometheus.CounterVec
	logDropped prometheus.Counter
	// The recording's rows written and dropped (by reason), and files
	// completed.
	recordWritten, recordFiles prometheus.Counter
	recordDropped              *prometheus.CounterVec
	// ledgerErrors counts failed calls of the shared ledger.
	ledgerErrors *prometheus.CounterVec
	// traceFailures counts failed trace exports.
	traceFailures prometheus.Counter
	kvEvents      *prometheus.CounterVec
	// connRejected and acceptErrors are the listeners' (Serve).
	connRejected *prometheus.CounterVec
	acceptErrors *prometheus.CounterVec
	// Tokens of the requests served: their prompts, what the engines
	// reported cached and what the index predicted cached (a hit rate and
	// the prediction's accuracy, per model).
	promptTokens, cachedTokens, predictedTokens *prometheus.CounterVec
	reportedTokens                              *prometheus.CounterVec
	scrapeErrors                                *prometheus.CounterVec
	// Tenancy: authentications, rate-limit decisions (and those the
	// on_redis_error policy made), failed limiter calls, usage rows
	// dropped, failed key store operations. No key id is a label.
	auth, ratelimit, ratelimitFallback, limiterErrors, storeErrors *prometheus.CounterVec
	usageDropped                                                   prometheus.Counter
	// reloads counts configuration reloads by result (ok, error);
	// reloadTime is when the configuration running now was loaded.
	reloads    *prometheus.CounterVec
	reloadTime prometheus.Gauge
	// conns reports each listener's open connections.
	conns *connCollector
	// perReplica are the vectors labelled by replica, whose series go
	// when a replica leaves (forget). fmu orders forget against the
	// observations of a request that ends just after its replica left
	// (replica.forgotten), which would bring the series back.
	perReplica []deleter
	fmu        sync.RWMutex
	// own are the collectors of the gateway's own metrics (not Go's or
	// the process's), for the snapshot test of the metric set.
	own []prometheus.Collector
	// cache is the response caches' (cache.go).
	cache *cacheMetrics
	// pdRequests counts the requests dispatched with a remote prefill by
	// how it went; pdPrefillH times their prefills (pd.go).
	pdRequests *prometheus.CounterVec
	pdPrefillH *prometheus.HistogramVec
	// responseSearches counts the searches for a stored response's
	// replica (locate.go) by result.
	responseSearches *prometheus.CounterVec
	// responseHomeErrors counts failed reads and writes of the response
	// homes shared through Redis (sharedhomes.go).
	responseHomeErrors *prometheus.CounterVec
	// backgroundWatches counts the watches of background responses by
	// how they ended (bgwatch.go).
	backgroundWatches *prometheus.CounterVec
}

// deleter is a metric vector whose series can be deleted by labels.
type deleter interface {
	DeletePartialMatch(prometheus.Labels) int
}

var latencyBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}

func newMetrics(s *Server) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{reg: reg}
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(c)
		m.own = append(m.own, c)
		return c
	}
	hv := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		reg.MustRegister(h)
		m.own = append(m.own, h)
		return h
	}
	m.requests = cv("inferrail_requests_total", "Requests by model and outcome (ok, upstream_<code>, no_replica, client_gone, stream_broken, bad_request, ...).", "model", "outcome")
	m.ttftH = hv("inferrail_time_to_first_byte_seconds", "From the request's arrival to the first response byte sent to the client, by model, policy and replica.", latencyBuckets, "model", "policy", "replica")
	m.durationH = hv("inferrail_request_duration_seconds", "From the request's arrival to its last byte, by model, policy and replica.", append(latencyBuckets, 160, 320, 640), "model", "policy", "replica")
	m.promptTokens = cv("inferrail_prompt_tokens_total", "Prompt tokens of the requests served whole, as tokenized at the edge (requests routed without a prediction are left out).", "model")
	m.cachedTokens = cv("inferrail_cached_tokens_total", "Prompt tokens the engines reported cached (usage.prompt_tokens_details.cached_tokens), for the requests counted in inferrail_reported_prompt_tokens_total.", "model")
	m.reportedTokens = cv("inferrail_reported_prompt_tokens_total", "Prompt tokens (the engine's count) of the requests served whole whose answer reported its cached tokens: the denominator of inferrail_cached_tokens_total (a stream whose client did not ask for usage reports none).", "model")
	m.predictedTokens = cv("inferrail_predicted_cached_tokens_total", "Prompt tokens the KV index predicted cached on the chosen replica, for the requests counted in inferrail_prompt_tokens_total.", "model")
	m.scrapeErrors = cv("inferrail_scrape_errors_total", "Scrapes of a replica's /metrics that failed or could not be read.", "model", "replica")
	m.decisions = cv("inferrail_decisions_total", "Routing decisions by model, policy and replica.", "model", "policy", "replica")
	m.decisionH = hv("inferrail_decision_seconds", "Time to route one attempt (index lookup and policy).", prometheus.ExponentialBuckets(1e-6, 2, 18), "model")
	m.retries = cv("inferrail_retries_total", "Attempts retried on another replica before the first response byte.", "model")
	m.errors = cv("inferrail_upstream_errors_total", "Failed attempts by reason.", "model", "reason")
	m.pdRequests = cv("inferrail_pd_requests_total", "Requests dispatched with a remote prefill (P/D), by model and outcome: remote (prefilled on the prefill replica, decoded with its KV), fallback (the prefill failed: prefilled on the decode replica; the reason is in inferrail_upstream_errors_total as prefill_<reason>).", "model", "outcome")
	m.pdPrefillH = hv("inferrail_pd_prefill_seconds", "From a remote prefill's request to its whole answer (or its failure), by model.", latencyBuckets, "model")
	m.tokenize = cv("inferrail_tokenize_total", "Edge tokenizations by outcome (ok, timeout, queue_full, error, skipped).", "model", "outcome")
	m.rejections = cv("inferrail_rejected_total", "Requests the gateway core rejected, by model and reason (queue_full, queue_timeout, no_capacity, slo_shed, no_replica, too_long).", "model", "reason")
	m.overheadH = hv("inferrail_proxy_overhead_seconds", "The proxy's own part of a request's time to first byte: from its arrival to its forwarding to the engine, less its wait in the queue, plus from the engine's first byte to the proxy's first write to the client. First tries only, not P/D.", prometheus.ExponentialBuckets(5e-6, 2, 16), "model")
	m.queueWaitH = hv("inferrail_queue_wait_seconds", "Time each request waited in the queue for a replica to admit it (0 when one admitted it at once).", append([]float64{0.0001}, append(latencyBuckets, 160)...), "model")
	m.ledgerErrors = cv("inferrail_ledger_errors_total", "Failed calls of the KV reservation ledger shared through Redis (tenancy.ledger.backend: redis), by model and operation.", "model", "op")
	m.kvEvents = cv("inferrail_kv_event_batches_total", "KV event batches by model, replica and result (applied, gap, reset).", "model", "replica", "result")
	m.connRejected = cv("inferrail_connections_rejected_total", "Connections closed at accept because a cap was reached or a flood was shed, by listener and reason (max_conns, max_conns_per_client, flood: see flood_connections_per_client).", "listener", "reason")
	m.acceptErrors = cv("inferrail_accept_errors_total", "Temporary accept errors (such as too many open files) the listener backed off from.", "listener")
	m.auth = cv("inferrail_auth_total", "Client authentications (auth: keys) by outcome: ok, missing, malformed, invalid (unknown or revoked), expired, disabled, model_not_allowed, unavailable (the key store failed).", "outcome")
	m.ratelimit = cv("inferrail_ratelimit_total", "Rate-limit decisions by the kind of bucket that refused (key, key_model, global; all for allowed and limiter_unavailable) and reason (allowed, rpm, tpm, concurrency, too_large, limiter_unavailable).", "bucket_kind", "reason")
	m.ratelimitFallback = cv("inferrail_ratelimit_fallback_total", "Rate-limit decisions made by tenancy.redis.on_redis_error while Redis failed, by policy (closed, open, local).", "policy")
	m.limiterErrors = cv("inferrail_ratelimit_backend_errors_total", "Failed rate-limiter calls by operation: reserve, finish, renew (Redis errors and timeouts) and lease_lost.", "op")
	m.storeErrors = cv("inferrail_tenancy_store_errors_total", "Failed key store operations by kind: auth (a key lookup with nothing cached to serve), usage_flush, admin.", "op")
	m.usageDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferrail_usage_rows_dropped_total", Help: "Usage rows dropped: tenancy.usage_buffer was full, or the store refused them as invalid."})
	m.own = append(m.own, m.usageDropped)
	reg.MustRegister(m.usageDropped)
	m.recordDropped = cv("inferrail_record_dropped_total", "Rows of the recording (record.path) not written, by reason: buffer_full (record.buffer was full: the request path never waits), write_error (a file could not be written), shutdown (the request ended after the recording closed).", "reason")
	m.recordWritten = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferrail_record_written_total", Help: "Rows of the recording (record.path) written out in complete row groups."})
	m.recordFiles = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferrail_record_files_total", Help: "Recording files completed (renamed from .partial)."})
	m.own = append(m.own, m.recordWritten, m.recordFiles)
	reg.MustRegister(m.recordWritten, m.recordFiles)
	m.responseSearches = cv("inferrail_response_searches_total", "Searches of the replicas for a stored response (Responses API) this gateway did not see answered, by result: found, missing (every replica answered 404), unknown (no 200 and some replica did not say), busy (not started: 32 a second, or 8 at once, were running), recent (not searched: missing within 10 s), invalid (not searched: not an id as vLLM makes them).", "result")
	m.responseHomeErrors = cv("inferrail_response_home_errors_total", "Failed reads (get) and writes (put) of the stored responses' replicas shared through tenancy.redis; a write is also counted when 64 were in flight already (dropped).", "op")
	m.backgroundWatches = cv("inferrail_background_watches_total", "Background responses (Responses API, background: true) watched until they end (meanwhile holding their replica's slot in the core and their rate-limit reservation), by how the watch ended: metered (its end read: its usage learned and metered), expired (not final within request_timeout), lost (its engine no longer has it: 404, or 10 failed reads in a row), shutdown; the last three metered at the output bound.", "result")
	m.reloads = cv("inferrail_config_reloads_total", "Configuration reloads (SIGHUP, the file changing, POST /admin/reload) by result: ok (applied), error (rejected: the running configuration is kept).", "result")
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	m.reloadTime = prometheus.NewGauge(prometheus.GaugeOpts{Name: "inferrail_config_last_reload_success_timestamp_seconds", Help: "When the configuration running now was loaded (at start, or by the last successful reload), in Unix seconds."})
	m.own = append(m.own, m.reloadTime)
	reg.MustRegister(m.reloadTime)
	m.logDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferrail_decision_log_dropped_total", Help: "Sampled decisions dropped because the log writer was behind."})
	m.traceFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferrail_trace_export_failures_total", Help: "Trace exports (batches of spans) that failed; their spans are lost."})
	m.conns = newConnCollector()
	m.own = append(m.own, m.traceFailures, m.conns)
	reg.MustRegister(m.traceFailures, m.conns)
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "inferrail_build_info", Help: "1, labelled with the build's version and Go version."}, []string{"version", "goversion"})
	info.WithLabelValues(s.version, runtime.Version()).Set(1)
	m.own = append(m.own, m.logDropped, &stateCollector{s: s}, info)
	reg.MustRegister(m.own[len(m.own)-3:]...)
	m.cache = newCacheMetrics(m, s)
	sc := &shadowCollector{s: s}
	m.own = append(m.own, sc)
	reg.MustRegister(sc)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.perReplica = []deleter{m.ttftH, m.durationH, m.decisions, m.kvEvents, m.scrapeErrors}
	return m
}

// modelSeries are a model's series of the request path (its vectors'
// children labelled by the model alone, and by the outcomes of a request
// served), resolved once: a vector's lookup hashes the label values byte by
// byte, takes a lock and compares every label, about ten times a request
// (6% of the proxy's CPU at 1,000 req/s, most of it cache misses: the
// resolved child is one line). These vectors' series are never deleted.
type modelSeries struct {
	prompt, cached, predicted, reported prometheus.Counter
	decision, queueWait, overhead       prometheus.Observer
	ok, tokenizedOK                     prometheus.Counter
}

// model returns md's series, resolving them the first time.
func (m *metrics) model(md *model) *modelSeries {
	if ms := md.series.Load(); ms != nil {
		return ms
	}
	ms := &modelSeries{
		prompt:      m.promptTokens.WithLabelValues(md.name),
		cached:      m.cachedTokens.WithLabelValues(md.name),
		predicted:   m.predictedTokens.WithLabelValues(md.name),
		reported:    m.reportedTokens.WithLabelValues(md.name),
		decision:    m.decisionH.WithLabelValues(md.name),
		queueWait:   m.queueWaitH.WithLabelValues(md.name),
		overhead:    m.overheadH.WithLabelValues(md.name),
		ok:          m.requests.WithLabelValues(md.name, "ok"),
		tokenizedOK: m.tokenize.WithLabelValues(md.name, string(tokOK)),
	}
	md.series.CompareAndSwap(nil, ms)
	return md.series.Load()
}

// replicaSeries are a replica's series of the request path, for the policy
// they were resolved under (a reload may change the model's).
type replicaSeries struct {
	policy         string
	ttft, duration prometheus.Observer
	decisions      prometheus.Counter
}

// series returns r's series under md's policy now, resolving them the first
// time; nil once r's series were forgotten (no observation brings them
// back: an observation of a child resolved before goes to a child no
// longer in its vector).
func (m *metrics) series(md *model, r *replica) *replicaSeries {
	p := md.policyName()
	if rs := r.series.Load(); rs != nil && rs.policy == p {
		return rs
	}
	m.fmu.RLock()
	defer m.fmu.RUnlock()
	if r.forgotten {
		return nil
	}
	rs := &replicaSeries{
		policy:    p,
		ttft:      m.ttftH.WithLabelValues(md.name, p, r.name),
		duration:  m.durationH.WithLabelValues(md.name, p, r.name),
		decisions: m.decisions.WithLabelValues(md.name, p, r.name),
	}
	r.series.Store(rs)
	return rs
}

// connCollector is inferrail_open_connections, with each listener's
// accept queue (inferrail_listen_queue, inferrail_listen_queue_max) and
// the network namespace's listen overflows (inferrail_listen_overflows_total),
// all read when scraped.
type connCollector struct {
	open, queue, queueMax, overflows *prometheus.Desc
	// drops reads the namespace's listen drops (netguard.ReadListenDrops).
	drops func() (netguard.ListenDrops, error)
	mu    sync.Mutex
	ls    map[string]listenerStats
}

// listenerStats is what a listener reports: netguard.Listener's methods.
type listenerStats interface {
	Stats() netguard.Stats
	AcceptQueue() (netguard.AcceptQueue, bool)
}

func newConnCollector() *connCollector {
	return &connCollector{
		open:      prometheus.NewDesc("inferrail_open_connections", "Client connections open now, by listener.", []string{"listener"}, nil),
		queue:     prometheus.NewDesc("inferrail_listen_queue", "Connections the kernel completed that wait for the listener to accept them, by listener (Linux). At inferrail_listen_queue_max the kernel drops new connections' SYNs and each such client waits a second or more to retry.", []string{"listener"}, nil),
		queueMax:  prometheus.NewDesc("inferrail_listen_queue_max", "The listener's accept queue bound: the listen backlog, capped by net.core.somaxconn (Linux).", []string{"listener"}, nil),
		overflows: prometheus.NewDesc("inferrail_listen_overflows_total", "Connection attempts (SYNs, handshakes' last ACKs) the kernel dropped because a listener's accept queue was full, over the whole network namespace (the pod's in Kubernetes; TcpExt ListenOverflows of /proc/net/netstat, Linux).", nil, nil),
		drops:     netguard.ReadListenDrops,
	}
}

// set reports listener's connections from l (a second Serve of the same
// Server replaces the first's).
func (c *connCollector) set(listener string, l listenerStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ls == nil {
		c.ls = map[string]listenerStats{}
	}
	c.ls[listener] = l
}

func (c *connCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.open
	ch <- c.queue
	ch <- c.queueMax
	ch <- c.overflows
}

func (c *connCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, l := range c.ls {
		ch <- prometheus.MustNewConstMetric(c.open, prometheus.GaugeValue, float64(l.Stats().Open), name)
		if q, ok := l.AcceptQueue(); ok {
			ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, float64(q.Len), name)
			ch <- prometheus.MustNewConstMetric(c.queueMax, prometheus.GaugeValue, float64(q.Max), name)
		}
	}
	if len(c.ls) > 0 {
		if d, err := c.drops(); err == nil {
			ch <- prometheus.MustNewConstMetric(c.overflows, prometheus.CounterValue, float64(d.Overflows))
		}
	}
}

// forget deletes the series of a replica that left its model.
func (m *metrics) forget(model, replica string, r *replica) {
	m.fmu.Lock()
	defer m.fmu.Unlock()
	if r != nil {
		r.forgotten = true
	}
	for _, v := range m.perReplica {
		v.DeletePartialMatch(prometheus.Labels{"model": model, "replica": replica})
	}
}

// served counts the tokens of a request served whole, tokenized at the
// edge: its prompt and what the index predicted cached.
func (m *metrics) served(md *model, prompt, predicted int) {
	ms := m.model(md)
	ms.prompt.Add(float64(prompt))
	ms.predicted.Add(float64(predicted))
}

// reported counts the tokens of a request served whole whose answer said
// how many of its prompt tokens the engine found cached.
func (m *metrics) reported(md *model, prompt, cached int) {
	ms := m.model(md)
	ms.reported.Add(float64(prompt))
	ms.cached.Add(float64(cached))
}

func (m *metrics) outcome(model, o string) { m.requests.WithLabelValues(model, o).Inc() }

// ok counts a request of md served whole (outcome ok).
func (m *metrics) ok(md *model) { m.model(md).ok.Inc() }
func (m *metrics) ttft(md *model, r *replica, d time.Duration) {
	if rs := m.series(md, r); rs != nil {
		rs.ttft.Observe(d.Seconds())
	}
}
func (m *metrics) duration(md *model, r *replica, d time.Duration) {
	if rs := m.series(md, r); rs != nil {
		rs.duration.Observe(d.Seconds())
	}
}
func (m *metrics) overhead(md *model, d time.Duration) {
	m.model(md).overhead.Observe(d.Seconds())
}
func (m *metrics) decisionTime(md *model, d time.Duration) {
	m.model(md).decision.Observe(d.Seconds())
}
func (m *metrics) decision(md *model, r *replica) {
	if rs := m.series(md, r); rs != nil {
		rs.decisions.Inc()
	}
}
func (m *metrics) retry(model string)       { m.retries.WithLabelValues(model).Inc() }
func (m *metrics) pd(model, outcome string) { m.pdRequests.WithLabelValues(model, outcome).Inc() }
func (m *metrics) prefillTime(model string, d time.Duration) {
	m.pdPrefillH.WithLabelValues(model).Observe(d.Seconds())
}
func (m *metrics) errorReason(model, reason string) { m.errors.WithLabelValues(model, reason).Inc() }
func (m *metrics) rejected(model, reason string)    { m.rejections.WithLabelValues(model, reason).Inc() }
func (m *metrics) queueWait(md *model, d time.Duration) {
	m.model(md).queueWait.Observe(d.Seconds())
}
func (m *metrics) tokenized(md *model, o tokOutcome) {
	if o == tokOK {
		m.model(md).tokenizedOK.Inc()
		return
	}
	m.tokenize.WithLabelValues(md.name, string(o)).Inc()
}
func (m *metrics) responseSearch(result string) {
	m.responseSearches.WithLabelValues(result).Inc()
}

func (m *metrics) backgroundWatch(result string) {
	m.backgroundWatches.WithLabelValues(result).Inc()
}

func (m *metrics) kvBatch(model, replica, result string) {
	m.kvEvents.WithLabelValues(model, replica, result).Inc()
}

// stateCollector reports what each model's gateway core knows, read at
// scrape time: each replica's health, load, reservations, ejections and
// report age, and each model's queue and index size.
type stateCollector struct{ s *Server }

var (
	descHealthy   = prometheus.NewDesc("inferrail_replica_healthy", "1 when the replica takes requests (not ejected).", []string{"model", "replica"}, nil)
	descInFlight  = prometheus.NewDesc("inferrail_replica_in_flight", "Requests in flight at the replica, as the gateway counts them.", []string{"model", "replica"}, nil)
	descPending   = prometheus.NewDesc("inferrail_replica_pending", "Requests at the replica still waiting for a first byte.", []string{"model", "replica"}, nil)
	descRunning   = prometheus.NewDesc("inferrail_replica_engine_running", "The engine's running requests, as last scraped.", []string{"model", "replica"}, nil)
	descWaiting   = prometheus.NewDesc("inferrail_replica_engine_waiting", "The engine's waiting requests, as last scraped.", []string{"model", "replica"}, nil)
	descKV        = prometheus.NewDesc("inferrail_replica_engine_kv_usage", "The engine's KV cache usage (0-1), as last scraped.", []string{"model", "replica"}, nil)
	descAge       = prometheus.NewDesc("inferrail_replica_report_age_seconds", "Age of the replica's last readable metrics page (-1: none yet).", []string{"model", "replica"}, nil)
	descReserved  = prometheus.NewDesc("inferrail_reserved_blocks", "KV blocks admission has reserved on the replica for its requests in flight.", []string{"model", "replica"}, nil)
	descCapacity  = prometheus.NewDesc("inferrail_replica_kv_capacity_blocks", "The replica's KV capacity admission weighs requests against (configured, else reported; 0: unknown).", []string{"model", "replica"}, nil)
	descEjections = prometheus.NewDesc("inferrail_ejections_total", "Replicas ejected after consecutive failures.", []string{"model", "replica"}, nil)
	descRestarts  = prometheus.NewDesc("inferrail_replica_restarts_total", "Engine restarts detected (cumulative counters going backwards): the index forgot the replica.", []string{"model", "replica"}, nil)
	descQueue     = prometheus.NewDesc("inferrail_queue_depth", "Requests waiting in the model's queue for a replica to admit them.", []string{"model"}, nil)
	descQueueB    = prometheus.NewDesc("inferrail_queue_bytes", "Request bytes waiting in the model's queue.", []string{"model"}, nil)
	descIndex     = prometheus.NewDesc("inferrail_index_bytes", "Memory of the model's KV index.", []string{"model"}, nil)
	descMaxLen    = prometheus.NewDesc("inferrail_model_max_model_len", "The context, in tokens, a request's prompt plus max_tokens must fit: max_model_len as configured, else the smallest the replicas' /v1/models gave (0: unknown, not checked).", []string{"model"}, nil)
	descBlocks    = prometheus.NewDesc("inferrail_index_blocks", "Blocks the KV index holds for the replica.", []string{"model", "replica"}, nil)
	descBGFlight  = prometheus.NewDesc("inferrail_background_responses_in_flight", "Background responses (Responses API, background: true) in flight through the gateway: admitted, or answered and watched until they end (at most max_background_responses).", nil, nil)
	descKeyWatch  = prometheus.NewDesc("inferrail_tenancy_key_watch_up", "1 while the key store's changes are followed (Postgres LISTEN/NOTIFY: a key changed through another gateway applies at once), 0 while the watch connects or is lost (changes then take up to auth_cache_ttl); absent for a store that announces nothing (SQLite).", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHealthy, descInFlight, descPending, descRunning, descWaiting, descKV, descAge,
		descReserved, descCapacity, descEjections, descRestarts, descQueue, descQueueB, descIndex, descBlocks, descMaxLen, descBGFlight, descKeyWatch} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	n := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	for _, m := range c.s.models {
		snap := m.snapshot()
		for _, rs := range snap.reps {
			st, name := &rs.st, rs.rep.name
			healthy := 0.0
			if st.Healthy {
				healthy = 1
			}
			g(descHealthy, healthy, m.name, name)
			g(descInFlight, float64(st.Load.InFlight), m.name, name)
			g(descPending, float64(st.Load.Pending), m.name, name)
			g(descRunning, float64(st.Report.Running), m.name, name)
			g(descWaiting, float64(st.Report.Waiting), m.name, name)
			g(descKV, st.Report.KVUsage, m.name, name)
			age := -1.0
			if st.ReportAge >= 0 {
				age = st.ReportAge.Seconds()
			}
			g(descAge, age, m.name, name)
			g(descReserved, float64(st.ReservedBlocks), m.name, name)
			g(descCapacity, float64(st.CapacityBlocks), m.name, name)
			n(descEjections, float64(st.Ejections), m.name, name)
			n(descRestarts, float64(st.Restarts), m.name, name)
			g(descBlocks, float64(rs.indexBlocks), m.name, name)
		}
		g(descQueue, float64(snap.queued), m.name)
		g(descQueueB, float64(snap.queuedBytes), m.name)
		g(descIndex, float64(snap.indexBytes), m.name)
		g(descMaxLen, float64(m.contextLen()), m.name)
	}
	g(descBGFlight, float64(len(c.s.bgSlots)))
	if t := c.s.ten; t != nil && t.stopWatch != nil {
		up := 0.0
		if t.watchState.Load() == watchListening {
			up = 1
		}
		g(descKeyWatch, up)
	}
}

// shadowCollector reports each model's shadow mode (shadow_policy), read
// from its gateway core at scrape time: decisions by agreement, cost_model's
// estimates of the time to first token on the real picks and the shadow's,
// the real picks' measured time to first byte and the estimates summed over
// the same requests (docs/explain-shadow.md: reading agreement).
type shadowCollector struct{ s *Server }

var (
	descShadowDecisions = prometheus.NewDesc("inferrail_shadow_decisions_total",
		"Routing decisions the shadow policy (shadow_policy) was asked about, by model, primary and shadow policy, and whether the shadow picked the same replica (agree: true, false).",
		[]string{"model", "primary", "shadow", "agree"}, nil)
	descShadowEstimated = prometheus.NewDesc("inferrail_shadow_estimated_ttft_seconds",
		"cost_model's estimate of each decision's time to first token, on the replica the request went to (policy: primary) and on the shadow policy's pick (policy: shadow), by model.",
		[]string{"model", "policy"}, nil)
	descShadowMeasured = prometheus.NewDesc("inferrail_shadow_measured_ttft_seconds",
		"The measured time from dispatch to first byte of the requests the shadow policy was asked about, by model and whether it agreed.",
		[]string{"model", "agree"}, nil)
	descShadowMeasuredEstimate = prometheus.NewDesc("inferrail_shadow_measured_estimate_seconds_total",
		"The sum of cost_model's estimates of the real picks' time to first token over the requests counted in inferrail_shadow_measured_ttft_seconds (its _sum over this is the estimator's calibration), by model and agreement.",
		[]string{"model", "agree"}, nil)
)

func (c *shadowCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descShadowDecisions, descShadowEstimated, descShadowMeasured, descShadowMeasuredEstimate} {
		ch <- d
	}
}

func (c *shadowCollector) Collect(ch chan<- prometheus.Metric) {
	bounds := gateway.ShadowBuckets()
	hist := func(d *prometheus.Desc, h *gateway.Histogram, labels ...string) {
		cum, buckets := uint64(0), make(map[float64]uint64, len(bounds))
		for i, b := range bounds {
			cum += h.Buckets[i]
			buckets[b] = cum
		}
		ch <- prometheus.MustNewConstHistogram(d, h.Count, h.Sum, buckets, labels...)
	}
	for _, m := range c.s.models {
		st, ok := m.shadowStats()
		if !ok {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descShadowDecisions, prometheus.CounterValue, float64(st.Agreed), m.name, st.Primary, st.Shadow, "true")
		ch <- prometheus.MustNewConstMetric(descShadowDecisions, prometheus.CounterValue, float64(st.Decisions-st.Agreed), m.name, st.Primary, st.Shadow, "false")
		hist(descShadowEstimated, &st.EstimatedPrimary, m.name, "primary")
		hist(descShadowEstimated, &st.EstimatedShadow, m.name, "shadow")
		for k, agree := range []string{"false", "true"} {
			hist(descShadowMeasured, &st.Measured[k], m.name, agree)
			ch <- prometheus.MustNewConstMetric(descShadowMeasuredEstimate, prometheus.CounterValue, st.MeasuredEstimateSum[k], m.name, agree)
		}
	}
}
