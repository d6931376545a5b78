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
// as vLLM's: label model_name, and engine (the data-parallel rank, "0" with
// one), as vLLM's PrometheusStatLogger writes one series per engine index.
type metrics struct {
	reg      *prometheus.Registry
	snapshot atomic.Pointer[engine.Metrics]   // the group's, summed over ranks
	ranks    atomic.Pointer[[]engine.Metrics] // each rank's (nil with one rank)

	// One observer per rank, indexed by rank.
	ttft, itl, e2e    []prometheus.Observer
	promptLen, genLen []prometheus.Observer
	iteration         []prometheus.Observer
	success           [][3]prometheus.Counter // stop, length, abort

	// NIXL's transfer metrics, with a KV connector (nil without): a
	// consumer's reads of remote prefills. Labelled engine "0": a transfer
	// is the API server's, before any rank has the request.
	xferTime, xferBytes prometheus.Observer
	xferFailed          prometheus.Counter
}

func newMetrics(cfg *Config) *metrics {
	model := cfg.ServedModelNames[0]
	n := cfg.Engine.Ranks()
	labels := prometheus.Labels{"model_name": model}
	m := &metrics{reg: prometheus.NewRegistry()}
	hist := func(name, help string, buckets []float64) []prometheus.Observer {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels}, []string{"engine"})
		m.reg.MustRegister(h)
		out := make([]prometheus.Observer, n)
		for r := range out {
			out[r] = h.WithLabelValues(strconv.Itoa(r))
		}
		return out
	}
	m.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
	m.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets)
	m.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2eBuckets)
	tokBuckets := build125Buckets(cfg.Engine.MaxModelLen)
	m.promptLen = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokBuckets)
	m.genLen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tokBuckets)
	m.iteration = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", iterBuckets)
	success := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
	}, []string{"engine", "finished_reason"})
	m.success = make([][3]prometheus.Counter, n)
	for r := range m.success {
		for k, reason := range []string{"stop", "length", "abort"} {
			m.success[r][k] = success.WithLabelValues(strconv.Itoa(r), reason)
		}
	}
	m.reg.MustRegister(success)
	if cfg.KVTransfer.On() {
		// As vLLM's NixlPromMetrics names and buckets them.
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:nixl_xfer_time_seconds", Help: "Histogram of transfer duration for NIXL KV Cache transfers.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0}, ConstLabels: labels}, []string{"engine"})
		var bb []float64
		for i := 1; i < 25; i += 2 {
			bb = append(bb, float64(uint64(1)<<(10+i)))
		}
		b := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:nixl_bytes_transferred", Help: "Histogram of bytes transferred per NIXL KV Cache transfers.",
			Buckets: bb, ConstLabels: labels}, []string{"engine"})
		f := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:nixl_num_failed_transfers_total", Help: "Number of failed NIXL KV Cache transfers.", ConstLabels: labels}, []string{"engine"})
		m.reg.MustRegister(h, b, f)
		m.xferTime, m.xferBytes, m.xferFailed = h.WithLabelValues("0"), b.WithLabelValues("0"), f.WithLabelValues("0")
	}
	m.reg.MustRegister(newEngineCollector(m, cfg, labels))
	m.snapshot.Store(&engine.Metrics{NumGPUBlocks: cfg.Engine.NumGPUBlocks * n})
	if n > 1 {
		ranks := make([]engine.Metrics, n)
		for r := range ranks {
			ranks[r].NumGPUBlocks = cfg.Engine.NumGPUBlocks
		}
		m.ranks.Store(&ranks)
	}
	return m
}

// publish stores the group's metrics for /metrics (from the engine
// goroutine, after every step and command).
func (m *metrics) publish(g *engine.Group) {
	sum := g.Metrics()
	m.snapshot.Store(&sum)
	if n := g.Ranks(); n > 1 {
		ranks := make([]engine.Metrics, n)
		for r := range ranks {
			ranks[r] = g.RankMetrics(r)
		}
		m.ranks.Store(&ranks)
	}
}

func (m *metrics) observeToken(a *active, em engine.Emission, now time.Time, last map[engine.RequestID]time.Time) {
	if em.Output == 1 {
		m.ttft[a.rank].Observe(now.Sub(a.arrival).Seconds())
	} else if t, ok := last[em.ID]; ok {
		m.itl[a.rank].Observe(now.Sub(t).Seconds())
	}
	last[em.ID] = now
}

func (m *metrics) finished(a *active, reason string, now time.Time) {
	m.e2e[a.rank].Observe(now.Sub(a.arrival).Seconds())
	m.promptLen[a.rank].Observe(float64(a.promptLen))
	m.genLen[a.rank].Observe(float64(a.outLen))
	k := 0
	if reason == "length" {
		k = 1
	}
	m.success[a.rank][k].Inc()
}

func (m *metrics) aborted(a *active) { m.success[a.rank][2].Inc() }

// transferred records a consumer's KV transfer of tokens that took d.
func (m *metrics) transferred(d time.Duration, tokens int, c engine.Config) {
	if m.xferTime == nil {
		return
	}
	m.xferTime.Observe(d.Seconds())
	if b, ok := kvBytes(c, tokens); ok {
		m.xferBytes.Observe(b)
	}
}

// failedTransfer counts a consumer's failed KV transfer.
func (m *metrics) failedTransfer() {
	if m.xferFailed != nil {
		m.xferFailed.Inc()
	}
}

// engineCollector exposes the engine's own gauges and counters from the
// snapshot the engine goroutine publishes after every step and command: one
// series per data-parallel rank (label engine), as vLLM's /metrics page of a
// DP deployment has; a scraper sums them (fleet/remote does).
type engineCollector struct {
	m                                              *metrics
	cfg                                            *Config
	running, waiting, kv                           *prometheus.Desc
	queries, hits, preempt, prompt, gen, cacheInfo *prometheus.Desc
	// tierHits and tierBlocks are the lower KV tiers' (kv_tiers), by
	// medium: vLLM has no series of its own for them.
	tierHits, tierBlocks *prometheus.Desc
}

func newEngineCollector(m *metrics, cfg *Config, l prometheus.Labels) *engineCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, []string{"engine"}, l) }
	return &engineCollector{
		m: m, cfg: cfg,
		running:    d("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:    d("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kv:         d("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		queries:    d("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		hits:       d("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		preempt:    d("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		prompt:     d("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		gen:        d("vllm:generation_tokens_total", "Number of generation tokens processed."),
		cacheInfo:  prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", []string{"block_size", "engine", "num_gpu_blocks", "enable_prefix_caching"}, nil),
		tierHits:   prometheus.NewDesc("inferrail_engine_kv_tier_hit_tokens_total", "Prompt tokens loaded back from a lower KV tier instead of computed, by medium (CPU, DISK).", []string{"engine", "medium"}, l),
		tierBlocks: prometheus.NewDesc("inferrail_engine_kv_tier_blocks", "KV blocks a lower tier holds, by medium (CPU, DISK).", []string{"engine", "medium"}, l),
	}
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.kv, c.queries, c.hits, c.preempt, c.prompt, c.gen, c.cacheInfo} {
		ch <- d
	}
	if c.cfg.Engine.KVTiers.Enabled() {
		ch <- c.tierHits
		ch <- c.tierBlocks
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	ranks := []engine.Metrics{*c.m.snapshot.Load()}
	if p := c.m.ranks.Load(); p != nil {
		ranks = *p
	}
	caching := "True"
	if c.cfg.Engine.DisablePrefixCaching {
		caching = "False"
	}
	for r, s := range ranks {
		eng := strconv.Itoa(r)
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, eng)
		}
		k := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, eng)
		}
		g(c.running, float64(s.Running))
		g(c.waiting, float64(s.Waiting))
		g(c.kv, s.KVCacheUsage)
		k(c.queries, float64(s.PrefixCacheQueries))
		k(c.hits, float64(s.PrefixCacheHits))
		k(c.preempt, float64(s.Preemptions))
		k(c.prompt, float64(s.PromptTokens))
		k(c.gen, float64(s.GenerationTokens))
		ch <- prometheus.MustNewConstMetric(c.cacheInfo, prometheus.GaugeValue, 1,
			strconv.Itoa(c.cfg.Engine.BlockSize), eng, strconv.Itoa(c.cfg.Engine.NumGPUBlocks), caching)
		if t := c.cfg.Engine.KVTiers; t.Enabled() {
			ch <- prometheus.MustNewConstMetric(c.tierHits, prometheus.CounterValue, float64(s.CPUHitTokens), eng, engine.MediumCPU)
			ch <- prometheus.MustNewConstMetric(c.tierBlocks, prometheus.GaugeValue, float64(s.CPUBlocks), eng, engine.MediumCPU)
			if t.DiskBlocks > 0 {
				ch <- prometheus.MustNewConstMetric(c.tierHits, prometheus.CounterValue, float64(s.DiskHitTokens), eng, engine.MediumDisk)
				ch <- prometheus.MustNewConstMetric(c.tierBlocks, prometheus.GaugeValue, float64(s.DiskBlocks), eng, engine.MediumDisk)
			}
		}
	}
}
