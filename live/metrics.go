package live

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's own Prometheus metrics, served on the admin
// port.
type metrics struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec
	ttftH      *prometheus.HistogramVec
	durationH  *prometheus.HistogramVec
	decisions  *prometheus.CounterVec
	decisionH  *prometheus.HistogramVec
	retries    *prometheus.CounterVec
	ejections  *prometheus.CounterVec
	errors     *prometheus.CounterVec
	tokenize   *prometheus.CounterVec
	logDropped prometheus.Counter
	kvEvents   *prometheus.CounterVec
}

var latencyBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}

func newMetrics(s *Server) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{reg: reg}
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	hv := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		reg.MustRegister(h)
		return h
	}
	m.requests = cv("inferrail_requests_total", "Requests by model and outcome (ok, upstream_<code>, no_replica, client_gone, stream_broken, bad_request, ...).", "model", "outcome")
	m.ttftH = hv("inferrail_time_to_first_byte_seconds", "From the request's arrival to the first response byte sent to the client.", latencyBuckets, "model")
	m.durationH = hv("inferrail_request_duration_seconds", "From the request's arrival to its last byte.", append(latencyBuckets, 160, 320, 640), "model")
	m.decisions = cv("inferrail_decisions_total", "Routing decisions by model, policy and replica.", "model", "policy", "replica")
	m.decisionH = hv("inferrail_decision_seconds", "Time to route one attempt (index lookup and policy).", prometheus.ExponentialBuckets(1e-6, 2, 18), "model")
	m.retries = cv("inferrail_retries_total", "Attempts retried on another replica before the first response byte.", "model")
	m.ejections = cv("inferrail_ejections_total", "Replicas ejected after consecutive failures.", "model", "replica")
	m.errors = cv("inferrail_upstream_errors_total", "Failed attempts by reason.", "model", "reason")
	m.tokenize = cv("inferrail_tokenize_total", "Edge tokenizations by outcome (ok, timeout, queue_full, error, skipped).", "model", "outcome")
	m.kvEvents = cv("inferrail_kv_event_batches_total", "KV event batches by model, replica and result (applied, gap, reset).", "model", "replica", "result")
	m.logDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferrail_decision_log_dropped_total", Help: "Sampled decisions dropped because the log writer was behind."})
	reg.MustRegister(m.logDropped, &stateCollector{s: s})
	return m
}

func (m *metrics) outcome(model, o string) { m.requests.WithLabelValues(model, o).Inc() }
func (m *metrics) ttft(model string, d time.Duration) {
	m.ttftH.WithLabelValues(model).Observe(d.Seconds())
}
func (m *metrics) duration(model string, d time.Duration) {
	m.durationH.WithLabelValues(model).Observe(d.Seconds())
}
func (m *metrics) decisionTime(model string, d time.Duration) {
	m.decisionH.WithLabelValues(model).Observe(d.Seconds())
}
func (m *metrics) decision(md *model, a attempt) {
	m.decisions.WithLabelValues(md.name, md.opts.Policy, a.rep.name).Inc()
}
func (m *metrics) retry(model string)               { m.retries.WithLabelValues(model).Inc() }
func (m *metrics) ejected(model, replica string)    { m.ejections.WithLabelValues(model, replica).Inc() }
func (m *metrics) errorReason(model, reason string) { m.errors.WithLabelValues(model, reason).Inc() }
func (m *metrics) tokenized(model string, o tokOutcome) {
	m.tokenize.WithLabelValues(model, string(o)).Inc()
}
func (m *metrics) kvBatch(model, replica, result string) {
	m.kvEvents.WithLabelValues(model, replica, result).Inc()
}

// stateCollector reports each replica's health, load and report age, and
// each model's index size, read at scrape time.
type stateCollector struct{ s *Server }

var (
	descHealthy  = prometheus.NewDesc("inferrail_replica_healthy", "1 when the replica takes requests (probe passing, not ejected).", []string{"model", "replica"}, nil)
	descInFlight = prometheus.NewDesc("inferrail_replica_in_flight", "Requests in flight at the replica, as the gateway counts them.", []string{"model", "replica"}, nil)
	descPending  = prometheus.NewDesc("inferrail_replica_pending", "Requests at the replica still waiting for a first byte.", []string{"model", "replica"}, nil)
	descRunning  = prometheus.NewDesc("inferrail_replica_engine_running", "The engine's running requests, as last scraped.", []string{"model", "replica"}, nil)
	descWaiting  = prometheus.NewDesc("inferrail_replica_engine_waiting", "The engine's waiting requests, as last scraped.", []string{"model", "replica"}, nil)
	descKV       = prometheus.NewDesc("inferrail_replica_engine_kv_usage", "The engine's KV cache usage (0-1), as last scraped.", []string{"model", "replica"}, nil)
	descAge      = prometheus.NewDesc("inferrail_replica_report_age_seconds", "Age of the replica's last readable metrics page (-1: none yet).", []string{"model", "replica"}, nil)
	descIndex    = prometheus.NewDesc("inferrail_index_bytes", "Memory of the model's KV index.", []string{"model"}, nil)
	descBlocks   = prometheus.NewDesc("inferrail_index_blocks", "Blocks the KV index holds for the replica.", []string{"model", "replica"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHealthy, descInFlight, descPending, descRunning, descWaiting, descKV, descAge, descIndex, descBlocks} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, m := range c.s.models {
		m.mu.Lock()
		g := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
		for _, r := range m.reps {
			if r.gone {
				continue
			}
			healthy := 0.0
			if r.healthy(now) {
				healthy = 1
			}
			g(descHealthy, healthy, m.name, r.name)
			g(descInFlight, float64(r.load.InFlight), m.name, r.name)
			g(descPending, float64(r.load.Pending), m.name, r.name)
			g(descRunning, float64(r.engine.Running), m.name, r.name)
			g(descWaiting, float64(r.engine.Waiting), m.name, r.name)
			g(descKV, r.engine.KVCacheUsage, m.name, r.name)
			age := -1.0
			if !r.engineAt.IsZero() {
				age = now.Sub(r.engineAt).Seconds()
			}
			g(descAge, age, m.name, r.name)
			g(descBlocks, float64(m.rt.Index().Blocks(r.idx)), m.name, r.name)
		}
		g(descIndex, float64(m.rt.Index().Bytes()), m.name)
		m.mu.Unlock()
	}
}
