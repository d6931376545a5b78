package config

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// valid returns a valid configuration with one model of two replicas.
func valid() Config {
	c := Default()
	m := DefaultModel()
	m.Name = "m"
	m.Replicas = []Replica{{Name: "a", URL: "http://127.0.0.1:8001"}, {Name: "b", URL: "http://127.0.0.1:8002"}}
	c.Models = []Model{m}
	return c
}

func TestValidBaseline(t *testing.T) {
	c := valid()
	if err := c.Validate(); err != nil {
		t.Fatalf("baseline invalid: %v", err)
	}
}

// TestValidateRules breaks one rule per case and wants exactly that one
// problem, at its path, with a message that says what is allowed.
func TestValidateRules(t *testing.T) {
	tmp := t.TempDir()
	noTok := filepath.Join(tmp, "empty-model-dir")
	if err := os.Mkdir(noTok, 0o755); err != nil {
		t.Fatal(err)
	}
	m0 := func(c *Config) *Model { return &c.Models[0] }
	r0 := func(c *Config) *Replica { return &c.Models[0].Replicas[0] }
	withDNS := func(c *Config) *DNSGroup {
		g := DefaultDNSGroup()
		g.Name, g.Host, g.Port = "pool", "vllm.local", 8000
		c.Models[0].DNS = append(c.Models[0].DNS, g)
		return &c.Models[0].DNS[len(c.Models[0].DNS)-1]
	}
	events := func(c *Config) {
		c.Models[0].Index = IndexEvents
		for i := range c.Models[0].Replicas {
			c.Models[0].Replicas[i].KVEvents = "tcp://127.0.0.1:5557"
		}
	}
	cases := []struct {
		name   string
		mutate func(*Config)
		path   string
		msg    string // substring of the message
	}{
		// addresses
		{"listen empty", func(c *Config) { c.Listen = "" }, "listen", "host:port"},
		// the shared ledger
		{"ledger backend", func(c *Config) { c.Tenancy.Ledger.Backend = "etcd" }, "tenancy.ledger.backend", `"local" or "redis"`},
		{"ledger redis without address", func(c *Config) { c.Tenancy.Ledger.Backend = "redis" }, "tenancy.ledger.backend", "tenancy.redis.address"},
		{"ledger redis with dns", func(c *Config) {
			c.Tenancy.Ledger.Backend, c.Tenancy.Redis.Address = "redis", "127.0.0.1:6379"
			c.Models[0].DNS = []DNSGroup{{Name: "g", Host: "vllm.default.svc", Port: 8000, Scheme: "http"}}
		}, "models[0].dns", "list the replicas"},
		{"ledger refresh over ttl/3", func(c *Config) { c.Tenancy.Ledger.RefreshInterval = 5 * time.Second }, "tenancy.ledger.refresh_interval", "lease_ttl/3"},
		{"ledger policy", func(c *Config) { c.Tenancy.Ledger.OnRedisError = "retry" }, "tenancy.ledger.on_redis_error", "closed"},
		{"ledger gateway id", func(c *Config) { c.Tenancy.Ledger.GatewayID = "a b" }, "tenancy.ledger.gateway_id", "without spaces"},
		// disaggregated prefill/decode
		{"pd decider", func(c *Config) { m0(c).PD.Decider = "sometimes" }, "models[0].pd.decider", "threshold, cost, dynamo, always, never"},
		{"pd non_cached_tokens", func(c *Config) { m0(c).PD.NonCachedTokens = -1 }, "models[0].pd.non_cached_tokens", ""},
		{"pd min_prompt_tokens", func(c *Config) { m0(c).PD.MinPromptTokens = -5 }, "models[0].pd.min_prompt_tokens", ""},
		{"pd prefill_timeout", func(c *Config) { m0(c).PD.PrefillTimeout = 0 }, "models[0].pd.prefill_timeout", "must be positive"},
		{"replica role", func(c *Config) { r0(c).Role = "prefiller" }, "models[0].replicas[0].role", `"prefill", "decode" or "both"`},
		{"dns role", func(c *Config) { withDNS(c).Role = "Decode" }, "models[0].dns[0].role", `unknown role "Decode"`},
		{"prefill replicas and none to decode on", func(c *Config) {
			c.Models[0].Replicas[0].Role, c.Models[0].Replicas[1].Role = "prefill", "prefill"
		}, "models[0].replicas[0].role", "none to decode on"},
		{"prefill replicas and a prefill dns group", func(c *Config) {
			c.Models[0].Replicas = c.Models[0].Replicas[:1]
			r0(c).Role = "prefill"
			withDNS(c).Role = "prefill"
		}, "models[0].replicas[0].role", "none to decode on"},
		// the response caches
		{"response cache ttl", func(c *Config) { m0(c).ResponseCache.TTL = 0 }, "models[0].response_cache.ttl", "from 1s to 720h0m0s, got 0s"},
		{"response cache redis without addr", func(c *Config) { m0(c).ResponseCache.Store = "redis" }, "models[0].response_cache.redis.addr", "required with store: redis"},
		{"response cache temperature", func(c *Config) { m0(c).ResponseCache.MaxTemperature = 3 }, "models[0].response_cache.max_temperature", "0 (greedy requests only) to 2"},
		{"semantic cache threshold", func(c *Config) { m0(c).SemanticCache.Threshold = 0.5 }, "models[0].semantic_cache.threshold", "0.8 to 1"},
		{"semantic cache without url", func(c *Config) {
			m0(c).ResponseCache.Enabled = true
			m0(c).SemanticCache.Enabled, m0(c).SemanticCache.Embeddings.Model = true, "e"
		}, "models[0].semantic_cache.embeddings.url", ""},
		{"semantic cache without the exact one", func(c *Config) {
			m0(c).SemanticCache.Enabled = true
			m0(c).SemanticCache.Embeddings.URL, m0(c).SemanticCache.Embeddings.Model = "http://127.0.0.1:8000", "e"
		}, "models[0].semantic_cache.enabled", "needs response_cache.enabled"},
		// tracing and the endpoint picker
		{"tracing endpoint not a URL", func(c *Config) { c.Tracing.Endpoint = "127.0.0.1:4318" }, "tracing.endpoint", "http:// or https:// URL"},
		{"tracing ratio over 1", func(c *Config) { c.Tracing.SampleRatio = 1.5 }, "tracing.sample_ratio", ""},
		{"tracing timeout zero", func(c *Config) { c.Tracing.Timeout = 0 }, "tracing.timeout", "positive"},
		{"tracing header name", func(c *Config) { c.Tracing.Headers = map[string]string{"a b": "x"} }, "tracing.headers", "without spaces"},
		{"epp listen", func(c *Config) { c.EPP.Listen = "nowhere" }, "epp.listen", "host:port"},
		{"epp pool model unknown", func(c *Config) { c.EPP.Pool = InferencePool{Name: "p", Namespace: "d", Model: "nope"} }, "epp.pool.model", "configured model"},
		{"epp pool namespace", func(c *Config) { c.EPP.Pool = InferencePool{Name: "p"} }, "epp.pool.namespace", "namespace"},
		{"epp pool events without a port", func(c *Config) {
			m0(c).Replicas, m0(c).Index = nil, IndexEvents
			c.EPP.Pool = InferencePool{Name: "p", Namespace: "d"}
		}, "epp.pool.kv_events_port", "required with index: events"},
		{"epp fallback_endpoints", func(c *Config) { c.EPP.FallbackEndpoints = 9 }, "epp.fallback_endpoints", "from 0 to 8"},
		{"epp pool listen and port", func(c *Config) {
			c.EPP.Pool = InferencePool{Name: "p", Namespace: "d", KVEventsPort: 5557, KVEventsListen: "tcp://*:5557"}
		}, "epp.pool.kv_events_listen", "not both"},
		{"epp pool listen bad", func(c *Config) {
			c.EPP.Pool = InferencePool{Name: "p", Namespace: "d", KVEventsListen: "tcp://h"}
		}, "epp.pool.kv_events_listen", "ZMQ endpoint to bind"},
		{"kv_events_listen without events", func(c *Config) { m0(c).KVEventsListen = "tcp://*:5557" }, "models[0].kv_events_listen", "needs index: events"},
		{"kv_events_listen bad", func(c *Config) { events(c); m0(c).KVEventsListen = "5557" }, "models[0].kv_events_listen", "ZMQ endpoint to bind"},
		{"kv_events_listen and a group topic", func(c *Config) {
			events(c)
			m0(c).KVEventsListen = "tcp://*:5557"
			withDNS(c).KVEventsTopic = "kv"
		}, "models[0].dns[0].kv_events_topic", "own topic"},
		{"epp pool kv port", func(c *Config) { c.EPP.Pool = InferencePool{Name: "p", Namespace: "d", KVEventsPort: 70000} }, "epp.pool.kv_events_port", ""},
		{"epp leader election without a pool", func(c *Config) { c.EPP.LeaderElection.Enabled = true }, "epp.leader_election.enabled", "needs epp.pool"},
		{"epp lease name", func(c *Config) {
			c.EPP.Pool = InferencePool{Name: "p", Namespace: "d"}
			c.EPP.LeaderElection.Enabled, c.EPP.LeaderElection.LeaseName = true, "Not_A_Name"
		}, "epp.leader_election.lease_name", "not a Lease name"},
		{"epp lease shorter than renew", func(c *Config) {
			c.EPP.Pool = InferencePool{Name: "p", Namespace: "d"}
			c.EPP.LeaderElection.Enabled, c.EPP.LeaderElection.LeaseDuration = true, 5*time.Second
		}, "epp.leader_election.lease_duration", "longer than renew_deadline"},
		{"epp renew within retries", func(c *Config) {
			c.EPP.Pool = InferencePool{Name: "p", Namespace: "d"}
			c.EPP.LeaderElection.Enabled, c.EPP.LeaderElection.RetryPeriod = true, 9*time.Second
		}, "epp.leader_election.renew_deadline", "1.2 retry_period"},
		{"epp retry period zero", func(c *Config) {
			c.EPP.Pool = InferencePool{Name: "p", Namespace: "d"}
			c.EPP.LeaderElection.Enabled, c.EPP.LeaderElection.RetryPeriod = true, 0
		}, "epp.leader_election.retry_period", "positive"},
		{"epp pool topic without a port", func(c *Config) { c.EPP.Pool = InferencePool{Name: "p", Namespace: "d", KVEventsTopic: "kv"} }, "epp.pool.kv_events_port", "required with"},
		// the hardening bounds
		{"read_timeout zero", func(c *Config) { c.ReadTimeout = 0 }, "read_timeout", "positive"},
		{"write_timeout zero", func(c *Config) { c.WriteTimeout = 0 }, "write_timeout", "positive"},
		{"first_byte_timeout negative", func(c *Config) { c.FirstByteTimeout = -time.Second }, "first_byte_timeout", "positive"},
		{"stream_idle_timeout zero", func(c *Config) { c.StreamIdleTimeout = 0 }, "stream_idle_timeout", "positive"},
		{"procs unknown", func(c *Config) { c.Procs = "4" }, "procs", "adaptive or fixed"},
		{"sysmon unknown", func(c *Config) { c.Sysmon = "asleep" }, "sysmon", "awake or go"},
		{"drain_delay negative", func(c *Config) { c.DrainDelay = -time.Second }, "drain_delay", "0 or a positive"},
		{"per client over total", func(c *Config) { c.MaxConnections, c.MaxConnectionsPerClient = 10, 20 }, "max_connections_per_client", "must not exceed max_connections (10)"},
		{"per client negative", func(c *Config) { c.MaxConnectionsPerClient = -1 }, "max_connections_per_client", "from 0"},
		{"flood per client negative", func(c *Config) { c.FloodConnectionsPerClient = -1 }, "flood_connections_per_client", "from 0"},
		{"streams zero", func(c *Config) { c.MaxConcurrentStreams = 0 }, "max_concurrent_streams", "from 1"},
		{"background zero", func(c *Config) { c.MaxBackgroundResponses = 0 }, "max_background_responses", "from 1"},
		{"background huge", func(c *Config) { c.MaxBackgroundResponses = 1 << 20 }, "max_background_responses", "to 65536"},
		{"inflight under body", func(c *Config) { c.MaxInflightBodyBytes = MiB }, "max_inflight_body_bytes", "at least max_body_bytes"},
		{"tls key missing", func(c *Config) { c.TLS.CertFile = noTok + "/../" }, "tls.key_file", "required with tls.cert_file"},
		{"admin token needed", func(c *Config) { c.AdminListen = "0.0.0.0:9090" }, "admin_token_file", "not a loopback address"},
		{"admin token missing file", func(c *Config) { c.AdminTokenFile = filepath.Join(tmp, "nope") }, "admin_token_file", "no such file"},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format", `"text" or "json"`},
		{"log level", func(c *Config) { c.Log.Level = "loud" }, "log.level", `"debug"`},
		{"access sample", func(c *Config) { c.Log.AccessSample = 2 }, "log.access_sample", "share"},
		{"kv events star without bind", func(c *Config) { events(c); r0(c).KVEvents = "tcp://*:5557" }, "models[0].replicas[0].kv_events", "kv_events_bind"},
		{"listen no port", func(c *Config) { c.Listen = "localhost" }, "listen", `got "localhost"`},
		{"listen port range", func(c *Config) { c.Listen = ":65536" }, "listen", "numeric port"},
		{"listen named port", func(c *Config) { c.Listen = ":http" }, "listen", "numeric port"},
		{"admin_listen bad", func(c *Config) { c.AdminListen = "9090" }, "admin_listen", "host:port"},
		{"admin_listen same", func(c *Config) { c.AdminListen = c.Listen }, "admin_listen", "must differ from listen"},
		// timeouts and sizes
		{"drain_timeout negative", func(c *Config) { c.DrainTimeout = -time.Second }, "drain_timeout", "0 or a positive"},
		{"request_timeout zero", func(c *Config) { c.RequestTimeout = 0 }, "request_timeout", "positive"},
		{"max_body_bytes zero", func(c *Config) { c.MaxBodyBytes = 0 }, "max_body_bytes", "from 1 byte to 1GiB"},
		{"max_body_bytes huge", func(c *Config) { c.MaxBodyBytes = 2 * GiB }, "max_body_bytes", "from 1 byte to 1GiB"},
		// retry
		{"attempts zero", func(c *Config) { c.Retry.Attempts = 0 }, "retry.attempts", "from 1 to 10, got 0"},
		{"attempts eleven", func(c *Config) { c.Retry.Attempts = 11 }, "retry.attempts", "from 1 to 10, got 11"},
		{"backoff negative", func(c *Config) { c.Retry.Backoff = -1; c.Retry.MaxBackoff = 0 }, "retry.backoff", "0 or a positive"},
		{"max_backoff below backoff", func(c *Config) { c.Retry.MaxBackoff = time.Millisecond }, "retry.max_backoff", "at least retry.backoff (10ms)"},
		// health
		{"health interval", func(c *Config) { c.Health.Interval = 0 }, "health.interval", "positive"},
		{"health timeout zero", func(c *Config) { c.Health.Timeout = 0 }, "health.timeout", "positive"},
		{"health timeout > interval", func(c *Config) { c.Health.Timeout = 2 * time.Second }, "health.timeout", "must not exceed health.interval (1s)"},
		{"health path relative", func(c *Config) { c.Health.Path = "health" }, "health.path", "starting with /"},
		{"health path space", func(c *Config) { c.Health.Path = "/he alth" }, "health.path", "without spaces"},
		{"eject_after zero", func(c *Config) { c.Health.EjectAfter = 0 }, "health.eject_after", "from 1 to 1000"},
		{"eject_time zero", func(c *Config) { c.Health.EjectTime = 0 }, "health.eject_time", "positive"},
		{"max_eject_time below", func(c *Config) { c.Health.MaxEjectTime = 500 * time.Millisecond }, "health.max_eject_time", "at least health.eject_time (1s)"},
		{"ejected share negative", func(c *Config) { c.Health.MaxEjectedShare = -0.1 }, "health.max_ejected_share", "from 0 to 1"},
		{"ejected share above one", func(c *Config) { c.Health.MaxEjectedShare = 1.5 }, "health.max_ejected_share", "from 0 to 1"},
		{"ejected share NaN", func(c *Config) { c.Health.MaxEjectedShare = math.NaN() }, "health.max_ejected_share", "from 0 to 1"},
		// scrape
		{"scrape interval", func(c *Config) { c.Scrape.Interval = 0 }, "scrape.interval", "positive"},
		{"scrape timeout zero", func(c *Config) { c.Scrape.Timeout = 0 }, "scrape.timeout", "positive"},
		{"scrape timeout > interval", func(c *Config) { c.Scrape.Timeout = 200 * time.Millisecond }, "scrape.timeout", "must not exceed scrape.interval (100ms)"},
		{"scrape max_bytes", func(c *Config) { c.Scrape.MaxBytes = -1 }, "scrape.max_bytes", "from 1 byte"},
		{"scrape max_age", func(c *Config) { c.Scrape.MaxAge = 50 * time.Millisecond }, "scrape.max_age", "at least scrape.interval (100ms)"},
		// tokenize
		{"workers negative", func(c *Config) { c.Tokenize.Workers = -1 }, "tokenize.workers", "from 0 to 4096"},
		{"workers huge", func(c *Config) { c.Tokenize.Workers = 5000 }, "tokenize.workers", "from 0 to 4096"},
		{"queue zero", func(c *Config) { c.Tokenize.Queue = 0 }, "tokenize.queue", "from 1"},
		{"tokenize timeout", func(c *Config) { c.Tokenize.Timeout = 0 }, "tokenize.timeout", "positive"},
		// decision log
		{"sample above one", func(c *Config) { c.DecisionLog.Sample = 2 }, "decision_log.sample", "from 0 to 1"},
		{"sample NaN", func(c *Config) { c.DecisionLog.Sample = math.NaN() }, "decision_log.sample", "from 0 to 1"},
		{"buffer zero", func(c *Config) { c.DecisionLog.Buffer = 0 }, "decision_log.buffer", "from 1"},
		{"log dir missing", func(c *Config) { c.DecisionLog.Path = filepath.Join(tmp, "no", "d.jsonl") }, "decision_log.path", "directory \"" + filepath.Join(tmp, "no") + "\" does not exist"},
		{"log path is dir", func(c *Config) { c.DecisionLog.Path = tmp }, "decision_log.path", "is a directory"},
		{"dns_refresh", func(c *Config) { c.DNSRefresh = 0 }, "dns_refresh", "positive"},
		// record
		{"record without salt", func(c *Config) { recordOn(c, tmp); c.Record.Salt = "" }, "record.salt", "required with record.path"},
		{"record salt short", func(c *Config) { recordOn(c, tmp); c.Record.Salt = "short" }, "record.salt", "at least 16 characters, got 5"},
		{"record salt and file", func(c *Config) { recordOn(c, tmp); c.Record.SaltFile = filepath.Join(tmp, "s") }, "record.salt", "not both"},
		{"record salt file missing", func(c *Config) { recordOn(c, tmp); c.Record.Salt, c.Record.SaltFile = "", filepath.Join(tmp, "nosalt") }, "record.salt_file", "no such file"},
		{"record salt file short", func(c *Config) {
			recordOn(c, tmp)
			c.Record.Salt, c.Record.SaltFile = "", filepath.Join(tmp, "short.salt")
			os.WriteFile(c.Record.SaltFile, []byte("  tiny \n"), 0o600)
		}, "record.salt_file", "at least 16 characters, got 4"},
		{"record dir missing", func(c *Config) { recordOn(c, tmp); c.Record.Path = filepath.Join(tmp, "no", "r.parquet") }, "record.path", "does not exist"},
		{"record path is dir", func(c *Config) { recordOn(c, tmp); c.Record.Path = tmp }, "record.path", "is a directory"},
		{"record rotate_bytes small", func(c *Config) { recordOn(c, tmp); c.Record.RotateBytes = KiB }, "record.rotate_bytes", "from 64KiB to 1TiB"},
		{"record rotate_interval zero", func(c *Config) { recordOn(c, tmp); c.Record.RotateInterval = 0 }, "record.rotate_interval", "positive"},
		{"record flush above rotate", func(c *Config) { recordOn(c, tmp); c.Record.FlushInterval = 2 * time.Hour }, "record.flush_interval", "must not exceed record.rotate_interval (1h0m0s)"},
		{"record sample zero", func(c *Config) { recordOn(c, tmp); c.Record.Sample = 0 }, "record.sample", "above 0 and at most 1"},
		{"record sample NaN", func(c *Config) { recordOn(c, tmp); c.Record.Sample = math.NaN() }, "record.sample", "above 0 and at most 1"},
		{"record buffer zero", func(c *Config) { recordOn(c, tmp); c.Record.Buffer = 0 }, "record.buffer", "from 1"},
		// models
		{"no models", func(c *Config) { c.Models = nil }, "models", "at least one model"},
		{"model name empty", func(c *Config) { m0(c).Name = "" }, "models[0].name", "required"},
		{"model name space", func(c *Config) { m0(c).Name = "a b" }, "models[0].name", "spaces"},
		{"alias empty", func(c *Config) { m0(c).Aliases = []string{""} }, "models[0].aliases[0]", "required"},
		{"alias is own name", func(c *Config) { m0(c).Aliases = []string{"m"} }, "models[0].aliases[0]", `"m" is already used by models[0].name`},
		{"alias twice", func(c *Config) { m0(c).Aliases = []string{"x", "x"} }, "models[0].aliases[1]", `"x" is already used by models[0].aliases[0]`},
		{"adapter empty", func(c *Config) { m0(c).Adapters = []string{""} }, "models[0].adapters[0]", "required"},
		{"adapter named as an alias", func(c *Config) { m0(c).Aliases, m0(c).Adapters = []string{"x"}, []string{"x"} }, "models[0].adapters[0]", `"x" is already used by models[0].aliases[0]`},
		{"two models one name", func(c *Config) { c.Models = append(c.Models, c.Models[0]) }, "models[1].name", `"m" is already used by models[0].name`},
		{"alias clashes with other model", func(c *Config) {
			m := c.Models[0]
			m.Name, m.Aliases = "other", []string{"m"}
			c.Models = append(c.Models, m)
		}, "models[1].aliases[0]", `"m" is already used by models[0].name`},
		{"policy unknown", func(c *Config) { m0(c).Policy = "fastest" }, "models[0].policy", `unknown policy "fastest"; want one of aibrix,`},
		{"tokenizer empty", func(c *Config) { m0(c).Tokenizer = "" }, "models[0].tokenizer", "required"},
		{"tokenizer builtin unknown", func(c *Config) { m0(c).Tokenizer = "builtin:gpt" }, "models[0].tokenizer", "the only one is builtin:sim"},
		{"tokenizer missing", func(c *Config) { m0(c).Tokenizer = filepath.Join(tmp, "nope.json") }, "models[0].tokenizer", `"` + filepath.Join(tmp, "nope.json") + `" does not exist`},
		{"tokenizer dir without json", func(c *Config) { m0(c).Tokenizer = noTok }, "models[0].tokenizer", `"` + filepath.Join(noTok, "tokenizer.json") + `" is missing`},
		{"index unknown", func(c *Config) { m0(c).Index = "exact" }, "models[0].index", `must be "approximate" or "events", got "exact"`},
		{"block_size zero", func(c *Config) { m0(c).BlockSize = 0 }, "models[0].block_size", "from 1 to 1024"},
		{"block_size big", func(c *Config) { m0(c).BlockSize = 1025 }, "models[0].block_size", "from 1 to 1024"},
		{"profile missing", func(c *Config) { m0(c).Profile = filepath.Join(tmp, "p.yaml") }, "models[0].profile", "p.yaml"},
		{"profile unknown preset", func(c *Config) { m0(c).Profile = "Nope@H100" }, "models[0].profile", "Nope"},
		{"profile not a file", func(c *Config) { m0(c).Profile = os.DevNull }, "models[0].profile", "not a regular file"},
		{"max_concurrency zero", func(c *Config) { m0(c).MaxConcurrency = 0 }, "models[0].max_concurrency", "from 1"},
		{"max_pending zero", func(c *Config) { m0(c).MaxPending = 0 }, "models[0].max_pending", "from 1"},
		{"no replicas", func(c *Config) { m0(c).Replicas = nil }, "models[0]", "at least one entry in replicas or dns"},
		// admission and queue
		{"admission unknown", func(c *Config) { m0(c).Admission = "foo" }, "models[0].admission", `unknown admission mode "foo" (allowed: none, kv, llmd-utilization, llmd-concurrency, dynamo, tokenflow)`},
		{"admission empty", func(c *Config) { m0(c).Admission = "" }, "models[0].admission", `unknown admission mode ""`},
		{"overcommit zero", func(c *Config) { m0(c).Overcommit = 0 }, "models[0].overcommit", "above 0 and at most 4"},
		{"output quantile", func(c *Config) { m0(c).OutputQuantile = 1.5 }, "models[0].output_quantile", "between 0"},
		{"output quantile NaN", func(c *Config) { m0(c).OutputQuantile = math.NaN() }, "models[0].output_quantile", "between 0"},
		{"overcommit big", func(c *Config) { m0(c).Overcommit = 4.5 }, "models[0].overcommit", "above 0 and at most 4"},
		{"overcommit NaN", func(c *Config) { m0(c).Overcommit = math.NaN() }, "models[0].overcommit", "above 0 and at most 4"},
		{"max_model_len negative", func(c *Config) { m0(c).MaxModelLen = -1 }, "models[0].max_model_len", "from 0"},
		{"default_max_tokens negative", func(c *Config) { m0(c).DefaultMaxTokens = -1 }, "models[0].default_max_tokens", "from 0"},
		{"default_max_tokens past max_model_len", func(c *Config) { m0(c).MaxModelLen = 100; m0(c).DefaultMaxTokens = 100 }, "models[0].default_max_tokens", "below max_model_len (100)"},
		{"max_priority negative", func(c *Config) { m0(c).MaxPriority = -1 }, "models[0].max_priority", "from 0 to 1000"},
		{"max_priority big", func(c *Config) { m0(c).MaxPriority = 1001 }, "models[0].max_priority", "from 0 to 1000"},
		{"max_n zero", func(c *Config) { m0(c).MaxN = 0 }, "models[0].max_n", "from 1 to 65536"},
		{"max_n big", func(c *Config) { m0(c).MaxN = 65537 }, "models[0].max_n", "from 1 to 65536"},
		{"kv_capacity_blocks negative", func(c *Config) { m0(c).KVCapacityBlocks = -1 }, "models[0].kv_capacity_blocks", "from 0"},
		{"replica kv_capacity_blocks negative", func(c *Config) { r0(c).KVCapacityBlocks = -1 }, "models[0].replicas[0].kv_capacity_blocks", "from 0"},
		{"queue max_requests negative", func(c *Config) { m0(c).Queue.MaxRequests = -1 }, "models[0].queue.max_requests", "from 0 to 1048576"},
		{"queue max_requests big", func(c *Config) { m0(c).Queue.MaxRequests = 1<<20 + 1 }, "models[0].queue.max_requests", "from 0 to 1048576"},
		{"queue max_bytes zero", func(c *Config) { m0(c).Queue.MaxBytes = 0 }, "models[0].queue.max_bytes", "from 1 byte"},
		{"queue timeout zero", func(c *Config) { m0(c).Queue.Timeout = 0 }, "models[0].queue.timeout", "must be positive"},
		{"queue timeout negative", func(c *Config) { m0(c).Queue.Timeout = -time.Second }, "models[0].queue.timeout", "must be positive"},
		// replicas
		{"url empty", func(c *Config) { r0(c).URL = "" }, "models[0].replicas[0].url", "required"},
		{"url without scheme", func(c *Config) { r0(c).URL = "10.0.0.1:8000" }, "models[0].replicas[0].url", `must be an absolute http:// or https:// URL, got "10.0.0.1:8000" (write "http://10.0.0.1:8000")`},
		{"url host only", func(c *Config) { r0(c).URL = "engine" }, "models[0].replicas[0].url", "must be an absolute"},
		{"url scheme", func(c *Config) { r0(c).URL = "ftp://h:1" }, "models[0].replicas[0].url", "must be an absolute http:// or https://"},
		{"url no host", func(c *Config) { r0(c).URL = "http:///v1" }, "models[0].replicas[0].url", "must name a host"},
		{"url user", func(c *Config) { r0(c).URL = "http://u:p@h:1" }, "models[0].replicas[0].url", "user or password"},
		{"url query", func(c *Config) { r0(c).URL = "http://h:1/?a=1" }, "models[0].replicas[0].url", "query"},
		{"url empty query", func(c *Config) { r0(c).URL = "http://h:1/?" }, "models[0].replicas[0].url", "query"},
		{"url fragment", func(c *Config) { r0(c).URL = "http://h:1/#x" }, "models[0].replicas[0].url", "fragment"},
		{"url port zero", func(c *Config) { r0(c).URL = "http://h:0" }, "models[0].replicas[0].url", "port must be from 1 to 65535"},
		{"url port big", func(c *Config) { r0(c).URL = "http://h:65536" }, "models[0].replicas[0].url", "port must be from 1 to 65535"},
		{"url twice", func(c *Config) { c.Models[0].Replicas[1].URL = r0(c).URL }, "models[0].replicas[1].url", "also replicas[0]'s"},
		{"replica name empty", func(c *Config) { r0(c).Name = "" }, "models[0].replicas[0].name", "required"},
		{"replica name space", func(c *Config) { r0(c).Name = "a\tb" }, "models[0].replicas[0].name", "spaces"},
		{"replica name twice", func(c *Config) { c.Models[0].Replicas[1].Name = "a" }, "models[0].replicas[1].name", `"a" is also replicas[0]'s name`},
		{"replica max_concurrency", func(c *Config) { r0(c).MaxConcurrency = -1 }, "models[0].replicas[0].max_concurrency", "from 0"},
		{"replica max_pending", func(c *Config) { r0(c).MaxPending = -1 }, "models[0].replicas[0].max_pending", "from 0"},
		{"kv_events no scheme", func(c *Config) { r0(c).KVEvents = "10.0.0.1:5557" }, "models[0].replicas[0].kv_events", "ZMQ endpoint"},
		{"kv_events udp", func(c *Config) { r0(c).KVEvents = "udp://h:5557" }, "models[0].replicas[0].kv_events", "ZMQ endpoint"},
		{"kv_events no port", func(c *Config) { r0(c).KVEvents = "tcp://h" }, "models[0].replicas[0].kv_events", "ZMQ endpoint"},
		{"kv_events bind address", func(c *Config) { r0(c).KVEvents = "tcp://*:5557" }, "models[0].replicas[0].kv_events", "* is for binding"},
		{"events need kv_events", func(c *Config) { events(c); r0(c).KVEvents = "" }, "models[0].replicas[0].kv_events", "required with index: events"},
		{"replay without kv_events", func(c *Config) { r0(c).KVEventsReplay = "tcp://h:5558" }, "models[0].replicas[0].kv_events_replay", "needs kv_events"},
		{"topic without kv_events", func(c *Config) { r0(c).KVEventsTopic = "kv" }, "models[0].replicas[0].kv_events_topic", "needs kv_events"},
		{"replay bad", func(c *Config) { r0(c).KVEvents = "ipc:///tmp/kv"; r0(c).KVEventsReplay = "h:5558" }, "models[0].replicas[0].kv_events_replay", "ZMQ endpoint"},
		// DNS groups
		{"dns name empty", func(c *Config) { withDNS(c).Name = "" }, "models[0].dns[0].name", "required"},
		{"dns name space", func(c *Config) { withDNS(c).Name = "p q" }, "models[0].dns[0].name", "spaces"},
		{"dns name twice", func(c *Config) { withDNS(c); withDNS(c) }, "models[0].dns[1].name", `"pool" is also dns[0]'s name`},
		{"dns host empty", func(c *Config) { withDNS(c).Host = "" }, "models[0].dns[0].host", "required"},
		{"dns host url", func(c *Config) { withDNS(c).Host = "http://vllm" }, "models[0].dns[0].host", "scheme goes in scheme"},
		{"dns host port", func(c *Config) { withDNS(c).Host = "vllm:8000" }, "models[0].dns[0].host", "port goes in port"},
		{"dns port zero", func(c *Config) { withDNS(c).Port = 0 }, "models[0].dns[0].port", "from 1 to 65535"},
		{"dns port big", func(c *Config) { withDNS(c).Port = 70000 }, "models[0].dns[0].port", "from 1 to 65535"},
		{"dns scheme", func(c *Config) { withDNS(c).Scheme = "grpc" }, "models[0].dns[0].scheme", `must be "http" or "https"`},
		{"dns scheme empty", func(c *Config) { withDNS(c).Scheme = "" }, "models[0].dns[0].scheme", `must be "http" or "https"`},
		{"dns kv port big", func(c *Config) { withDNS(c).KVEventsPort = 70000 }, "models[0].dns[0].kv_events_port", "from 1 to 65535"},
		{"dns kv port negative", func(c *Config) { withDNS(c).KVEventsPort = -1 }, "models[0].dns[0].kv_events_port", "from 1 to 65535"},
		{"dns events need port", func(c *Config) { events(c); withDNS(c) }, "models[0].dns[0].kv_events_port", "required with index: events"},
		{"dns replay without port", func(c *Config) { withDNS(c).KVEventsReplayPort = 5558 }, "models[0].dns[0].kv_events_replay_port", "needs kv_events_port"},
		{"dns topic without port", func(c *Config) { withDNS(c).KVEventsTopic = "kv" }, "models[0].dns[0].kv_events_topic", "needs kv_events_port"},
		{"dns replay port big", func(c *Config) { g := withDNS(c); g.KVEventsPort = 5557; g.KVEventsReplayPort = 1 << 20 }, "models[0].dns[0].kv_events_replay_port", "from 1 to 65535"},
		{"epp tls without key", func(c *Config) { c.EPP.TLS.CertFile = filepath.Join(tmp, "c.pem") }, "epp.tls.key_file", "required with epp.tls.cert_file"},
		{"epp tls plaintext", func(c *Config) {
			cert, key := filepath.Join(tmp, "c.pem"), filepath.Join(tmp, "k.pem")
			os.WriteFile(cert, []byte("x"), 0o600)
			os.WriteFile(key, []byte("x"), 0o600)
			c.EPP.SecureServing, c.EPP.TLS.CertFile, c.EPP.TLS.KeyFile = false, cert, key
		}, "epp.tls", "only with epp.secure_serving: true"},
		// tenancy
		{"auth unknown", func(c *Config) { c.Auth = "basic" }, "auth", `must be "none" or "keys"`},
		{"keys need a store", func(c *Config) { c.Auth = AuthKeys }, "tenancy.store", "required with auth: keys"},
		{"store bad scheme", func(c *Config) { c.Tenancy.Store = "mysql://u:hunter2@h/db" }, "tenancy.store", "unknown scheme"},
		{"keys forward auth", func(c *Config) {
			c.Auth, c.Tenancy.Store, c.ForwardClientAuth = AuthKeys, filepath.Join(tmp, "t.db"), true
		}, "forward_client_auth", "must be false with auth: keys"},
		{"auth_cache_ttl 0", func(c *Config) { c.Tenancy.AuthCacheTTL = 0 }, "tenancy.auth_cache_ttl", "from 1ms to 1h0m0s"},
		{"flush interval 0", func(c *Config) { c.Tenancy.UsageFlushInterval = 0 }, "tenancy.usage_flush_interval", "from 10ms"},
		{"usage_buffer 0", func(c *Config) { c.Tenancy.UsageBuffer = 0 }, "tenancy.usage_buffer", "from 1 to"},
		{"window 0", func(c *Config) { c.Tenancy.Window = 0 }, "tenancy.window", "from 1ms"},
		{"window not whole us", func(c *Config) { c.Tenancy.Window = time.Second + 1 }, "tenancy.window", "microseconds"},
		{"lease_ttl big", func(c *Config) { c.Tenancy.LeaseTTL = 48 * time.Hour }, "tenancy.lease_ttl", "to 24h0m0s"},
		{"global rpm negative", func(c *Config) { c.Tenancy.Limits.Global.RPM = -5 }, "tenancy.limits.global.rpm", "must be 0 (unlimited) or a positive integer, got -5"},
		{"global tpm huge", func(c *Config) { c.Tenancy.Limits.Global.TPM = 1 << 41 }, "tenancy.limits.global.tpm", "at most"},
		{"key_limits concurrency negative", func(c *Config) { m0(c).KeyLimits.MaxConcurrency = -1 }, "models[0].key_limits.max_concurrency", "got -1"},
		{"redis address bad", func(c *Config) { c.Tenancy.Redis.Address = "redis://127.0.0.1:6379" }, "tenancy.redis.address", "host:port"},
		{"redis unix relative", func(c *Config) { c.Tenancy.Redis.Address = "unix://redis.sock" }, "tenancy.redis.address", "absolute path"},
		{"redis password missing", func(c *Config) { c.Tenancy.Redis.PasswordFile = filepath.Join(tmp, "nope") }, "tenancy.redis.password_file", "no such file"},
		{"redis db negative", func(c *Config) { c.Tenancy.Redis.DB = -1 }, "tenancy.redis.db", "from 0"},
		{"redis prefix brace", func(c *Config) { c.Tenancy.Redis.KeyPrefix = "a{b}" }, "tenancy.redis.key_prefix", "braces"},
		{"redis prefix empty", func(c *Config) { c.Tenancy.Redis.KeyPrefix = "" }, "tenancy.redis.key_prefix", "must not be empty"},
		{"redis timeout 0", func(c *Config) { c.Tenancy.Redis.Timeout = 0 }, "tenancy.redis.timeout", "from 1ms to 10s"},
		{"redis policy", func(c *Config) { c.Tenancy.Redis.OnRedisError = "retry" }, "tenancy.redis.on_redis_error", `"closed"`},
		{"redis gateways 0", func(c *Config) { c.Tenancy.Redis.Gateways = 0 }, "tenancy.redis.gateways", "from 1 to 10000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(&c)
			fes := fieldErrs(t, c.Validate())
			if len(fes) != 1 {
				t.Fatalf("got %d problems, want 1 at %s: %v", len(fes), tc.path, fes)
			}
			if fes[0].Path != tc.path || !strings.Contains(fes[0].Msg, tc.msg) {
				t.Fatalf("got %q, want path %s and a message containing %q", fes[0].Error(), tc.path, tc.msg)
			}
			if want := tc.path + ": " + fes[0].Msg; fes[0].Error() != want {
				t.Fatalf("Error() = %q, want %q", fes[0].Error(), want)
			}
		})
	}
}

// TestValidateAccepts covers the edges each rule allows.
func TestValidateAccepts(t *testing.T) {
	tmp := t.TempDir()
	tok := filepath.Join(tmp, "model")
	if err := os.Mkdir(tok, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tok, "tokenizer.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		mutate func(*Config)
	}{
		{"admin off", func(c *Config) { c.AdminListen = "" }},
		{"events from kv_events_listen", func(c *Config) {
			c.Models[0].Index, c.Models[0].KVEventsListen = IndexEvents, "tcp://*:5557"
			c.Models[0].Replicas[0].KVEventsTopic = "kv@a@m"
			c.Models[0].Replicas[0].KVEventsReplay = "tcp://h:5558"
			c.Models[0].DNS = []DNSGroup{{Name: "g", Host: "vllm", Port: 8000, Scheme: "http", KVEventsReplayPort: 5558}}
		}},
		{"epp pool events from kv_events_listen", func(c *Config) {
			c.Models[0].Index, c.Models[0].Replicas = IndexEvents, nil
			c.EPP.Pool = InferencePool{Name: "p", Namespace: "d", KVEventsListen: "tcp://0.0.0.0:5557", KVEventsReplayPort: 5558}
		}},
		{"listen any host, port 0", func(c *Config) { c.Listen = ":0" }},
		{"listen ipv6", func(c *Config) { c.Listen = "[::1]:8080" }},
		{"drain 0", func(c *Config) { c.DrainTimeout = 0 }},
		{"one attempt, no backoff", func(c *Config) { c.Retry = Retry{Attempts: 1} }},
		{"ten attempts", func(c *Config) { c.Retry.Attempts = 10 }},
		{"health timeout = interval", func(c *Config) { c.Health.Timeout = c.Health.Interval }},
		{"share 0 and 1", func(c *Config) { c.Health.MaxEjectedShare = 0; c.DecisionLog.Sample = 1 }},
		{"max_age = interval", func(c *Config) { c.Scrape.MaxAge = c.Scrape.Interval }},
		{"decision log in temp dir", func(c *Config) { c.DecisionLog.Path = filepath.Join(tmp, "d.jsonl") }},
		{"record", func(c *Config) { recordOn(c, tmp) }},
		{"record off ignores the rest", func(c *Config) { c.Record.Sample, c.Record.Buffer = 0, 0 }},
		{"record salt file, edges", func(c *Config) {
			recordOn(c, tmp)
			c.Record.Salt, c.Record.SaltFile = "", filepath.Join(tmp, "ok.salt")
			os.WriteFile(c.Record.SaltFile, []byte("0123456789abcdef\n"), 0o600)
			c.Record.RotateBytes, c.Record.FlushInterval, c.Record.Sample, c.Record.Buffer = 64*KiB, c.Record.RotateInterval, 1e-9, 1
		}},
		{"both caches on", func(c *Config) {
			c.Models[0].ResponseCache.Enabled, c.Models[0].ResponseCache.MaxTemperature = true, 2
			c.Models[0].SemanticCache.Enabled, c.Models[0].SemanticCache.Threshold = true, 1
			c.Models[0].SemanticCache.Embeddings.URL, c.Models[0].SemanticCache.Embeddings.Model = "http://127.0.0.1:8000", "e"
		}},
		{"tokenizer dir", func(c *Config) { c.Models[0].Tokenizer = tok }},
		{"tokenizer file", func(c *Config) { c.Models[0].Tokenizer = filepath.Join(tok, "tokenizer.json") }},
		{"profile preset", func(c *Config) { c.Models[0].Profile = "Llama-3.1-8B@H100" }},
		{"profile file", func(c *Config) { c.Models[0].Profile = "../../examples/profile-default-8b-24gb.yaml" }},
		{"every policy", func(c *Config) {
			for _, p := range []string{"round_robin", "random", "least_request", "p2c", "prefix_hash", "kv_aware", "cost_model", "llmd", "dynamo", "sglang", "aibrix", "preble"} {
				m := c.Models[0]
				m.Name, m.Policy = "m-"+p, p
				c.Models = append(c.Models, m)
			}
		}},
		{"only an inferencepool", func(c *Config) {
			c.Models[0].Replicas = nil
			c.EPP.Pool = InferencePool{Name: "vllm", Namespace: "llm"}
		}},
		{"an inferencepool's events", func(c *Config) {
			c.Models[0].Replicas, c.Models[0].Index = nil, IndexEvents
			c.EPP.Pool = InferencePool{Name: "vllm", Namespace: "llm", KVEventsPort: 5557, KVEventsReplayPort: 5558, KVEventsTopic: "kv"}
		}},
		{"only dns", func(c *Config) {
			c.Models[0].Replicas = nil
			c.Models[0].DNS = []DNSGroup{{Name: "g", Host: "10.0.0.1", Port: 1, Scheme: "https"}}
		}},
		{"events everywhere", func(c *Config) {
			m := &c.Models[0]
			m.Index = IndexEvents
			m.Replicas[0].KVEvents = "tcp://[::1]:5557"
			m.Replicas[0].KVEventsReplay = "tcp://[::1]:5558"
			m.Replicas[0].KVEventsTopic = "kv@"
			m.Replicas[1].KVEvents = "ipc:///run/kv.sock"
			m.DNS = []DNSGroup{{Name: "g", Host: "pool.local", Port: 8000, Scheme: "http", KVEventsPort: 5557, KVEventsReplayPort: 5558, KVEventsTopic: "kv"}}
		}},
		{"every admission", func(c *Config) {
			for _, a := range []string{"none", "kv", "llmd-utilization", "llmd-concurrency", "dynamo", "tokenflow"} {
				m := c.Models[0]
				m.Name, m.Admission = "m-"+a, a
				c.Models = append(c.Models, m)
			}
		}},
		{"queue off, admission edges", func(c *Config) {
			m := &c.Models[0]
			m.Queue.MaxRequests, m.Overcommit, m.MaxPriority, m.MaxModelLen, m.DefaultMaxTokens = 0, 4, 0, 100, 99
			m.KVCapacityBlocks, m.Replicas[0].KVCapacityBlocks = 1, 1<<24
		}},
		{"kv_events with approximate index", func(c *Config) { c.Models[0].Replicas[0].KVEvents = "tcp://h:5557" }},
		{"url with path prefix", func(c *Config) { c.Models[0].Replicas[0].URL = "https://gw.example/team/v1" }},
		{"same url in two models", func(c *Config) {
			m := c.Models[0]
			m.Name = "other"
			c.Models = append(c.Models, m)
		}},
		{"group and replica share a name", func(c *Config) {
			c.Models[0].DNS = []DNSGroup{{Name: "a", Host: "pool.local", Port: 8000, Scheme: "http"}}
		}},
		{"keys on sqlite", func(c *Config) { c.Auth, c.Tenancy.Store = AuthKeys, filepath.Join(tmp, "t.db") }},
		{"keys on postgres, redis", func(c *Config) {
			c.Auth, c.Tenancy.Store = AuthKeys, "postgres://gw:pw@127.0.0.1:5432/inferrail?sslmode=disable"
			c.Tenancy.Redis = Redis{Address: "127.0.0.1:6379", KeyPrefix: "x", Timeout: time.Millisecond, OnRedisError: "open", Gateways: 10000, DB: 15}
			c.Tenancy.Limits.Global = Limits{RPM: 1 << 40, TPM: 1, MaxConcurrency: 1}
			c.Models[0].KeyLimits = Limits{RPM: 1}
		}},
		{"store without keys", func(c *Config) { c.Tenancy.Store = "sqlite://" + filepath.Join(tmp, "t.db") }},
		{"redis unix socket", func(c *Config) { c.Tenancy.Redis.Address = "unix:///run/redis/redis.sock" }},
		{"pd pools", func(c *Config) {
			c.Models[0].Replicas[0].Role, c.Models[0].Replicas[1].Role = "prefill", "decode"
			c.Models[0].PD = PD{Decider: "always", PrefillTimeout: time.Millisecond}
		}},
		{"prefill replica and a dns group to decode on", func(c *Config) {
			c.Models[0].Replicas = c.Models[0].Replicas[:1]
			c.Models[0].Replicas[0].Role = "prefill"
			c.Models[0].DNS = []DNSGroup{{Name: "g", Host: "pool.local", Port: 8000, Scheme: "http"}}
		}},
		{"every role spelled", func(c *Config) {
			c.Models[0].Replicas[0].Role, c.Models[0].Replicas[1].Role = "both", ""
			c.Models[0].PD.Decider = ""
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(&c)
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestParseDecodeErrors covers strict decoding: each document has one
// problem, reported with its path and line.
func TestParseDecodeErrors(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		path string
		line int
		msg  string
	}{
		{"unknown top-level", "listne: :1\n" + minimal, "listne", 1, "unknown field; known fields here: listen, admin_listen,"},
		{"unknown nested", "models:\n  - name: m\n    replicas:\n      - urll: http://h:1\n", "models[0].replicas[0].urll", 4, "unknown field; known fields here: name, url,"},
		{"unknown in retry", "retry: {tries: 3}\n" + minimal, "retry.tries", 1, "unknown field"},
		{"duplicate key", "listen: :1\nlisten: :2\n" + minimal, "listen", 2, "set twice (lines 1 and 2)"},
		{"duplicate nested", "models:\n  - name: m\n    name: n\n    replicas: [{url: 'http://h:1'}]\n", "models[0].name", 3, "set twice"},
		{"int from word", "retry: {attempts: three}\n" + minimal, "retry.attempts", 1, `want an integer, got "three"`},
		{"int from float", "retry: {attempts: 2.5}\n" + minimal, "retry.attempts", 1, `want an integer, got "2.5"`},
		{"int from quoted", "retry: {attempts: \"3\"}\n" + minimal, "retry.attempts", 1, "want an integer"},
		{"int overflow", "seed: 99999999999999999999999\n" + minimal, "seed", 1, "non-negative integer"},
		{"uint negative", "seed: -1\n" + minimal, "seed", 1, "non-negative integer"},
		{"duration from int", "drain_timeout: 30\n" + minimal, "drain_timeout", 1, `want a duration such as "500ms" or "10s", got "30"`},
		{"duration garbage", "health: {interval: 5 s}\n" + minimal, "health.interval", 1, "want a duration"},
		{"duration from list", "dns_refresh: [1s]\n" + minimal, "dns_refresh", 1, "want a duration such as \"500ms\" or \"10s\", got a list"},
		{"bool from yes", "models:\n  - name: m\n    session_affinity: yes\n    replicas: [{url: 'http://h:1'}]\n", "models[0].session_affinity", 3, "want true or false"},
		{"float from word", "health: {max_ejected_share: half}\n" + minimal, "health.max_ejected_share", 1, "want a number"},
		{"string from mapping", "listen: {host: a}\n" + minimal, "listen", 1, "want a string, got a mapping"},
		{"list expected", "models: {name: m}\n", "models", 1, "want a list, got a mapping"},
		{"aliases scalar", "models:\n  - name: m\n    aliases: llama\n    replicas: [{url: 'http://h:1'}]\n", "models[0].aliases", 3, `want a list, got "llama"`},
		{"mapping expected", "retry: 3\n" + minimal, "retry", 1, `want a mapping of fields, got "3"`},
		{"root not mapping", "hello\n", "", 1, `want a mapping of fields, got "hello"`},
		{"merge key", "x: &x {attempts: 2}\n", "x", 1, "unknown field"},
		{"merge key used", "retry:\n  <<: {attempts: 2}\n" + minimal, "retry", 2, "merge keys (<<) are not supported"},
		{"key not scalar", "? [a]\n: 1\n" + minimal, "", 1, "a key must be a plain name"},
		{"two documents", minimal + "---\nlisten: :1\n", "", 6, "more than one YAML document"},
		{"syntax", "listen: [\n", "", 1, "invalid YAML"},
		{"tab indentation", "retry:\n\tattempts: 3\n", "", 2, "invalid YAML"},
		{"size wrong", "scrape: {max_bytes: lots}\n" + minimal, "scrape.max_bytes", 1, "want a size in bytes"},
		{"no models", "listen: :1\n", "models", 0, "at least one model is required"},
		{"empty models", "models: []\n", "models", 1, "at least one model is required"},
		{"empty document", "", "models", 0, "at least one model is required"},
		{"only comments", "# nothing\n", "models", 0, "at least one model is required"},
		{"validation with line", "models:\n  - name: m\n    replicas:\n      - url: http://h:1\n        max_pending: -1\n", "models[0].replicas[0].max_pending", 5, "from 0"},
		{"admission with line", "models:\n  - name: m\n    admission: foo\n    replicas: [{url: 'http://h:1'}]\n", "models[0].admission", 3, `unknown admission mode "foo" (allowed: none, kv,`},
		{"queue timeout with line", "models:\n  - name: m\n    queue:\n      timeout: 0\n    replicas: [{url: 'http://h:1'}]\n", "models[0].queue.timeout", 4, "must be positive"},
		{"queue unknown field", "models:\n  - name: m\n    queue: {size: 3}\n    replicas: [{url: 'http://h:1'}]\n", "models[0].queue.size", 3, "unknown field; known fields here: max_requests, max_bytes, timeout, shed_on_slo"},
		{"validation line of parent", "models:\n  - name: m\n", "models[0]", 2, "at least one entry in replicas or dns"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			fes := fieldErrs(t, err)
			if len(fes) != 1 {
				t.Fatalf("got %d problems, want 1: %v", len(fes), err)
			}
			fe := fes[0]
			if fe.Path != tc.path || fe.Line != tc.line || !strings.Contains(fe.Msg, tc.msg) {
				t.Fatalf("got path %q line %d msg %q; want path %q line %d msg containing %q", fe.Path, fe.Line, fe.Msg, tc.path, tc.line, tc.msg)
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	doc := `
listen: nope
retry: {attempts: 0, bogus: 1}
models:
  - name: a
    policy: fastest
    replicas:
      - url: 10.0.0.1:8000
      - url: http://h:1
        name: x
      - url: http://h:2
        name: x
  - name: a
    aliases: [a2]
`
	// Decoding problems come first (the document is not validated until
	// it decodes), then every validation problem at once.
	_, err := Parse([]byte(doc))
	fes := fieldErrs(t, err)
	if len(fes) != 1 || fes[0].Path != "retry.bogus" {
		t.Fatalf("decode: %v, want the unknown field only", err)
	}
	doc = strings.Replace(doc, ", bogus: 1", "", 1)
	_, err = Parse([]byte(doc))
	var got []string
	for _, fe := range fieldErrs(t, err) {
		got = append(got, fe.Path)
	}
	want := []string{"listen", "retry.attempts", "models[0].policy", "models[0].replicas[0].url", "models[0].replicas[2].name", "models[1].name", "models[1]"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("problems at\n%v\nwant\n%v\n(%v)", got, want, err)
	}
	if lines := strings.Count(err.Error(), "\n") + 1; lines != len(want) {
		t.Fatalf("error has %d lines, want one per problem:\n%v", lines, err)
	}
}

func TestParseAnchorsAndEmptyValues(t *testing.T) {
	c, err := Parse([]byte(`
listen:            # empty: keeps the default
admin_listen: ""   # "" turns the admin endpoints off
models:
  - name: a
    replicas: &pool
      - url: http://h:1
      - url: http://h:2
  - name: b
    block_size: ~
    replicas: *pool
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != Default().Listen || c.AdminListen != "" {
		t.Errorf("listen %q admin %q", c.Listen, c.AdminListen)
	}
	if len(c.Models[1].Replicas) != 2 || c.Models[1].Replicas[1].Name != "h:2" || c.Models[1].BlockSize != 16 {
		t.Errorf("model b = %+v", c.Models[1])
	}
}

func TestParseBoundsAliasExpansion(t *testing.T) {
	var b strings.Builder
	b.WriteString("models:\n  - name: m0\n    replicas: &r\n")
	for i := range 1000 {
		fmt.Fprintf(&b, "      - url: http://h:%d\n", i+1)
	}
	for i := 1; i < 300; i++ {
		fmt.Fprintf(&b, "  - {name: m%d, replicas: *r}\n", i)
	}
	_, err := Parse([]byte(b.String()))
	fes := fieldErrs(t, err)
	if len(fes) != 1 || !strings.Contains(fes[0].Msg, "expands to more than") {
		t.Fatalf("got %d problems (%.200v), want the expansion bound", len(fes), err)
	}
}

// The store's password never appears in a validation error, nor in the
// summary of `inferrail live --check`.
func TestTenancyStorePasswordNeverShown(t *testing.T) {
	c := valid()
	c.Auth, c.Tenancy.Store = AuthKeys, "postgres://gw:hunter2-secret@db.example:5432/inferrail"
	c.Tenancy.Limits.Global.RPM = -1
	err := c.Validate()
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("Validate() = %v", err)
	}
	c.Tenancy.Limits.Global.RPM = 60
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	sum := c.Summary()
	if strings.Contains(sum, "hunter2") || !strings.Contains(sum, "tenancy: auth keys, store postgres postgres://gw:xxxxx@db.example:5432/inferrail, limiter in process, window 1m0s, global rpm 60") {
		t.Fatalf("Summary() = %q", sum)
	}
	c.Tenancy.Store = "mysql://gw:hunter2-secret@db.example/x"
	if err := c.Validate(); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("Validate() = %v", err)
	}
}

// A relative SQLite store is taken from the configuration file's
// directory, as the other paths are.
func TestLoadResolvesTenancyPaths(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for store, want := range map[string]string{
		"t.db":                   filepath.Join(dir, "t.db"),
		"sqlite://t.db":          "sqlite://" + filepath.Join(dir, "t.db"),
		"/abs/t.db":              "/abs/t.db",
		"postgres://u@h/db":      "postgres://u@h/db",
		"sqlite:///abs/other.db": "sqlite:///abs/other.db",
	} {
		path := filepath.Join(dir, "live.yaml")
		doc := fmt.Sprintf("auth: keys\ntenancy: {store: %q, redis: {password_file: pw}}\n%s", store, minimal)
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if c.Tenancy.Store != want || c.Tenancy.Redis.PasswordFile != filepath.Join(dir, "pw") {
			t.Errorf("store %q: got %q (password_file %q), want %q", store, c.Tenancy.Store, c.Tenancy.Redis.PasswordFile, want)
		}
	}
}

// recordOn turns recording on in c, to a file in dir, with a valid salt.
func recordOn(c *Config, dir string) {
	c.Record.Path = filepath.Join(dir, "traffic.parquet")
	c.Record.Salt = "0123456789abcdef"
}

func TestRecordSalt(t *testing.T) {
	dir := t.TempDir()
	r := Record{Salt: "0123456789abcdef"}
	if s, err := r.RecordSalt(); err != nil || s != r.Salt {
		t.Fatalf("salt: %q, %v", s, err)
	}
	r = Record{SaltFile: filepath.Join(dir, "s")}
	if err := os.WriteFile(r.SaltFile, []byte("\t0123456789abcdefXYZ \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := r.RecordSalt(); err != nil || s != "0123456789abcdefXYZ" {
		t.Fatalf("salt_file: %q, %v", s, err)
	}
	os.Remove(r.SaltFile)
	if _, err := r.RecordSalt(); err == nil || !strings.Contains(err.Error(), "record.salt_file") {
		t.Fatalf("salt_file gone: %v", err)
	}
}
