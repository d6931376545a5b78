package server

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/prometheus/client_golang/prometheus"
)

// Histogram buckets as vLLM's v1 metrics logger defines them.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets  = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	e2eBuckets  = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	iterBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
)

// build125Buckets returns 1, 2, 5, 10, 20, 50, ... up to max, as vLLM's
// build_1_2_5_buckets does for token-count histograms.
func build125Buckets(max int) []float64 {
	var out []float64
	for base := 1; base <= max; base *= 10 {
		for _, m := range []int{1, 2, 5} {
			if v := base * m; v <= max {
				out = append(out, float64(v))
			}
		}
	}
	return out
}

// metrics are the server's Prometheus metrics, named, labelled and bucketed
// as vLLM's (labels model_name and engine).
type metrics struct {
	reg      *prometheus.Registry
	snapshot atomic.Pointer[engine.Metrics]

	ttft, itl, e2e    prometheus.Observer
	promptLen, genLen prometheus.Observer
	iteration         prometheus.Observer
	success           *prometheus.CounterVec
}

func newMetrics(cfg *Config) *metrics {
	model := cfg.ServedModelNames[0]
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	m := &metrics{reg: prometheus.NewRegistry()}
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		m.reg.MustRegister(h)
		return h
	}
	m.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
	m.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets)
	m.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2eBuckets)
	tokBuckets := build125Buckets(cfg.Engine.MaxModelLen)
	m.promptLen = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokBuckets)
	m.genLen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tokBuckets)
	m.iteration = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", iterBuckets)
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
	}, []string{"finished_reason"})
	for _, r := range []string{"stop", "length", "abort"} {
		m.success.WithLabelValues(r)
	}
	m.reg.MustRegister(m.success)
	m.reg.MustRegister(newEngineCollector(m, cfg, labels))
	m.snapshot.Store(&engine.Metrics{NumGPUBlocks: cfg.Engine.NumGPUBlocks})
	return m
}

func (m *metrics) observeToken(a *active, em engine.Emission, now time.Time, last map[engine.RequestID]time.Time) {
	if em.Output == 1 {
		m.ttft.Observe(now.Sub(a.arrival).Seconds())
	} else if t, ok := last[em.ID]; ok {
		m.itl.Observe(now.Sub(t).Seconds())
	}
	last[em.ID] = now
}

func (m *metrics) finished(a *active, reason string, now time.Time) {
	m.e2e.Observe(now.Sub(a.arrival).Seconds())
	m.promptLen.Observe(float64(a.promptLen))
	m.genLen.Observe(float64(a.outLen))
	m.success.WithLabelValues(reason).Inc()
}

func (m *metrics) aborted() { m.success.WithLabelValues("abort").Inc() }

// engineCollector exposes the engine's own gauges and counters from the
// snapshot the engine goroutine publishes after every step and command.
type engineCollector struct {
	m                                              *metrics
	cfg                                            *Config
	running, waiting, kv                           *prometheus.Desc
	queries, hits, preempt, prompt, gen, cacheInfo *prometheus.Desc
}

func newEngineCollector(m *metrics, cfg *Config, l prometheus.Labels) *engineCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, l) }
	return &engineCollector{
		m: m, cfg: cfg,
		running:   d("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:   d("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kv:        d("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		queries:   d("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		hits:      d("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		preempt:   d("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		prompt:    d("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		gen:       d("vllm:generation_tokens_total", "Number of generation tokens processed."),
		cacheInfo: prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", []string{"block_size", "num_gpu_blocks", "enable_prefix_caching"}, nil),
	}
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.kv, c.queries, c.hits, c.preempt, c.prompt, c.gen, c.cacheInfo} {
		ch <- d
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.snapshot.Load()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	k := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	g(c.running, float64(s.Running))
	g(c.waiting, float64(s.Waiting))
	g(c.kv, s.KVCacheUsage)
	k(c.queries, float64(s.PrefixCacheQueries))
	k(c.hits, float64(s.PrefixCacheHits))
	k(c.preempt, float64(s.Preemptions))
	k(c.prompt, float64(s.PromptTokens))
	k(c.gen, float64(s.GenerationTokens))
	caching := "True"
	if c.cfg.Engine.DisablePrefixCaching {
		caching = "False"
	}
	ch <- prometheus.MustNewConstMetric(c.cacheInfo, prometheus.GaugeValue, 1,
		strconv.Itoa(c.cfg.Engine.BlockSize), strconv.Itoa(c.cfg.Engine.NumGPUBlocks), caching)
}
