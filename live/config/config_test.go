package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/respcache"
	"github.com/inferrail/inferrail/semcache"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current code")

const examplePath = "../../examples/live.yaml"

// minimal is the smallest valid configuration.
const minimal = `
models:
  - name: m
    replicas:
      - url: http://127.0.0.1:8001
`

// fieldErrs returns the FieldErrors joined in err, failing the test if err
// holds anything else.
func fieldErrs(t *testing.T, err error) []*FieldError {
	t.Helper()
	var fes []*FieldError
	if err == nil {
		return nil
	}
	if !fieldErrors(err, &fes) {
		t.Fatalf("error is not made of FieldErrors: %v", err)
	}
	return fes
}

func TestParseMinimalAppliesDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	m := DefaultModel()
	m.Name = "m"
	m.Replicas = []Replica{{Name: "127.0.0.1:8001", URL: "http://127.0.0.1:8001"}}
	want.Models = []Model{m}
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("Parse(minimal) =\n%+v\nwant\n%+v", *c, want)
	}
}

func TestDefaultValues(t *testing.T) {
	d := Default()
	// The values the issue specifies, spelled out so that a changed
	// default is a deliberate edit here too.
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen", d.Listen, "127.0.0.1:8080"},
		{"admin_listen", d.AdminListen, "127.0.0.1:9090"},
		{"drain_timeout", d.DrainTimeout, 30 * time.Second},
		{"request_timeout", d.RequestTimeout, 10 * time.Minute},
		{"max_body_bytes", d.MaxBodyBytes, ByteSize(33554432)},
		{"retry", d.Retry, Retry{3, 10 * time.Millisecond, 200 * time.Millisecond}},
		{"health", d.Health, Health{time.Second, 500 * time.Millisecond, "/health", 3, time.Second, 30 * time.Second, 0.5, 0}},
		{"scrape", d.Scrape, Scrape{100 * time.Millisecond, 80 * time.Millisecond, 4194304, 500 * time.Millisecond}},
		{"tokenize", d.Tokenize, Tokenize{0, 1024, 20 * time.Millisecond, 0}},
		{"read_header_timeout", d.ReadHeaderTimeout, 10 * time.Second},
		{"read_timeout", d.ReadTimeout, 30 * time.Second},
		{"write_timeout", d.WriteTimeout, 10 * time.Second},
		{"first_byte_timeout", d.FirstByteTimeout, 60 * time.Second},
		{"stream_idle_timeout", d.StreamIdleTimeout, 60 * time.Second},
		{"idle_timeout", d.IdleTimeout, 2 * time.Minute},
		{"drain_delay", d.DrainDelay, 5 * time.Second},
		{"max_connections", d.MaxConnections, 0},
		{"max_connections_per_client", d.MaxConnectionsPerClient, 0},
		{"flood_connections_per_client", d.FloodConnectionsPerClient, 0},
		{"max_concurrent_streams", d.MaxConcurrentStreams, 100},
		{"max_background_responses", d.MaxBackgroundResponses, 256},
		{"max_inflight_body_bytes", d.MaxInflightBodyBytes, GiB},
		{"response_buffer_bytes", d.ResponseBufferBytes, MiB},
		{"predicted_cached_header", d.PredictedCachedHeader, false},
		{"forward_client_auth", d.ForwardClientAuth, false},
		{"stream_usage", d.StreamUsage, true},
		{"pprof", d.Pprof, false},
		{"procs", d.Procs, "adaptive"},
		{"sysmon", d.Sysmon, "awake"},
		{"log", d.Log, Log{"text", "info", 1}},
		{"decision_log", d.DecisionLog, DecisionLog{"", 0.01, 4096}},
		{"record", d.Record, Record{Path: "", RotateBytes: 256 * MiB, RotateInterval: time.Hour, FlushInterval: 10 * time.Second, Sample: 1, Buffer: 65536}},
		{"dns_refresh", d.DNSRefresh, 10 * time.Second},
		{"model", DefaultModel(), Model{Policy: "cost_model", Tokenizer: "builtin:sim", Index: "approximate", BlockSize: 16, MaxConcurrency: 256, MaxPending: 64,
			Admission: "kv", Overcommit: 1, OutputQuantile: 0.75, MaxPriority: 10, MaxN: 128, Queue: Queue{MaxRequests: 1024, MaxBytes: 256 * MiB, Timeout: 30 * time.Second},
			ResponseCache: respcache.DefaultConfig(), SemanticCache: semcache.DefaultConfig(),
			PD: PD{Decider: "auto", NonCachedTokens: 16, PrefillTimeout: time.Minute}}},
		{"response_cache", DefaultModel().ResponseCache, respcache.Config{Enabled: false, Store: "memory", TTL: time.Hour, MaxBytes: 0, MaxEntryBytes: respcache.MiB,
			MaxTemperature: 0, TenantHeader: "", MaxWait: 30 * time.Second, Redis: respcache.RedisConfig{KeyPrefix: "ir:rc:", Timeout: 50 * time.Millisecond}}},
		{"semantic_cache", DefaultModel().SemanticCache, semcache.Config{Enabled: false, Threshold: 0.95, Store: "memory", TTL: time.Hour, MaxEntryBytes: 1 << 20, MaxTextBytes: 2048,
			Embeddings: semcache.EmbeddingsConfig{Timeout: time.Second}, Postgres: semcache.PostgresConfig{Table: "inferrail_semantic_cache", Timeout: 200 * time.Millisecond, MaxConns: 4}}},
		{"dns", DefaultDNSGroup(), DNSGroup{Scheme: "http"}},
		{"auth", d.Auth, "none"},
		{"tenancy", d.Tenancy, Tenancy{Store: "", AuthCacheTTL: 5 * time.Second, UsageFlushInterval: 10 * time.Second, UsageBuffer: 65536,
			Window: time.Minute, LeaseTTL: 30 * time.Second,
			Redis:  Redis{Address: "", KeyPrefix: "ir", Timeout: 20 * time.Millisecond, OnRedisError: "closed", Gateways: 1},
			Ledger: Ledger{Backend: "local", LeaseTTL: 10 * time.Second, RefreshInterval: 250 * time.Millisecond, OnRedisError: "closed"}}},
		{"key_limits", DefaultModel().KeyLimits, Limits{}},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: got %+v, want %+v", c.name, c.got, c.want)
		}
	}
	// Default alone is invalid only for want of models.
	fes := fieldErrs(t, d.Validate())
	if len(fes) != 1 || fes[0].Path != "models" {
		t.Fatalf("Default().Validate() = %v, want one error on models", fes)
	}
}

func TestParseEveryField(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(tok, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	logDir := t.TempDir()
	pwFile := filepath.Join(logDir, "redis.pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	saltFile := filepath.Join(logDir, "record.salt")
	if err := os.WriteFile(saltFile, []byte("  a-salt-of-24-characters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := `
listen: 0.0.0.0:80
admin_listen: ""
drain_timeout: 0
request_timeout: 1m
max_body_bytes: 1KiB
seed: 7
retry: {attempts: 10, backoff: 0s, max_backoff: 1s}
health: {interval: 2s, timeout: 2s, path: /ready, eject_after: 5, eject_time: 2s, max_eject_time: 2s, max_ejected_share: 1, ready_window: 9s}
scrape: {interval: 1s, timeout: 1ms, max_bytes: 1000, max_age: 1s}
tokenize: {workers: 8, queue: 1, timeout: 1ms, max_prompt_bytes: 2KiB}
read_header_timeout: 1s
read_timeout: 2s
write_timeout: 3s
first_byte_timeout: 4s
stream_idle_timeout: 5s
idle_timeout: 6s
drain_delay: 0s
max_connections: 100
max_connections_per_client: 10
flood_connections_per_client: 16
max_concurrent_streams: 7
max_background_responses: 9
max_inflight_body_bytes: 2KiB
response_buffer_bytes: 64KiB
predicted_cached_header: true
forward_client_auth: true
stream_usage: false
pprof: true
procs: fixed
sysmon: go
log: {format: json, level: debug, access_sample: 0.5}
decision_log: {path: ` + filepath.Join(logDir, "d.jsonl") + `, sample: 1, buffer: 1}
dns_refresh: 1m
record: {path: ` + filepath.Join(logDir, "rec.parquet") + `, rotate_bytes: 1MiB, rotate_interval: 2m, flush_interval: 3s, sample: 0.5, salt_file: ` + saltFile + `, buffer: 9}
tracing: {endpoint: "http://127.0.0.1:4318/v1/traces", sample_ratio: 0.5, headers: {authorization: "Bearer x"}, timeout: 3s, service_name: gw}
epp: {listen: "127.0.0.1:9100", secure_serving: false, pool: {name: vllm, namespace: llm, model: big, kubeconfig: /tmp/kc, kv_events_port: 5557, kv_events_replay_port: 5558, kv_events_topic: kv},
  leader_election: {enabled: true, lease_name: picker-lease, lease_duration: 20s, renew_deadline: 12s, retry_period: 3s}, fallback_endpoints: 2}
auth: none
tenancy:
  store: postgres://gw:pw@db.example:5432/inferrail
  auth_cache_ttl: 2s
  usage_flush_interval: 3s
  usage_buffer: 10
  window: 4s
  lease_ttl: 5s
  limits: {global: {rpm: 1, tpm: 2, max_concurrency: 3}}
  redis: {address: "unix:///run/redis.sock", password_file: ` + pwFile + `, db: 2, key_prefix: gw, timeout: 7ms, on_redis_error: local, gateways: 3}
  ledger: {backend: local, lease_ttl: 3s, refresh_interval: 100ms, gateway_id: gw-1, on_redis_error: open}
models:
  - name: big
    aliases: [b1, b2]
    policy: round_robin
    tokenizer: ` + tok + `
    index: events
    block_size: 1024
    profile: Llama-3.1-8B@H100
    session_affinity: true
    max_concurrency: 1
    max_pending: 2
    admission: llmd-utilization
    overcommit: 1.5
    output_quantile: 0.9
    default_max_tokens: 256
    max_model_len: 8192
    max_priority: 100
    max_n: 16
    kv_capacity_blocks: 4000
    queue: {max_requests: 0, max_bytes: 1MiB, timeout: 2s, shed_on_slo: true}
    key_limits: {rpm: 4, tpm: 5, max_concurrency: 6}
    response_cache: {enabled: true, store: redis, ttl: 2m, max_bytes: 0, max_entry_bytes: 2KiB, max_temperature: 0.5, tenant_header: X-Team, max_wait: 3s,
      redis: {addr: "127.0.0.1:6380", key_prefix: "rc:", timeout: 9ms}}
    semantic_cache:
      enabled: true
      embeddings: {url: "http://127.0.0.1:8000", model: emb, timeout: 2s, dimensions: 384, api_key_file: ` + pwFile + `}
      threshold: 0.97
      store: pgvector
      postgres: {dsn: "postgres://u@db.example/x", table: sc, timeout: 1s, max_conns: 2}
      ttl: 10m
      max_entries: 50
      max_bytes: 0
      max_entry_bytes: 4096
      max_text_bytes: 512
    replicas:
      - name: r
        url: https://engine.example:8443/prefix
        max_concurrency: 3
        max_pending: 4
        kv_capacity_blocks: 5000
        kv_events: tcp://engine.example:5557
        kv_events_replay: tcp://engine.example:5558
        kv_events_topic: kv
        kv_events_bind: true
        role: decode
    dns:
      - name: g
        host: vllm.default.svc.cluster.local
        port: 8000
        scheme: https
        kv_events_port: 5557
        kv_events_replay_port: 5558
        kv_events_topic: kv
        role: both
    pd: {decider: cost, non_cached_tokens: 256, min_prompt_tokens: 512, prefill_timeout: 7s}
`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Listen: "0.0.0.0:80", AdminListen: "", DrainTimeout: 0, RequestTimeout: time.Minute,
		MaxBodyBytes: 1024, Seed: 7,
		ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 3 * time.Second, FirstByteTimeout: 4 * time.Second,
		StreamIdleTimeout: 5 * time.Second, IdleTimeout: 6 * time.Second, DrainDelay: 0,
		MaxConnections: 100, MaxConnectionsPerClient: 10, FloodConnectionsPerClient: 16, MaxConcurrentStreams: 7, MaxBackgroundResponses: 9, MaxInflightBodyBytes: 2 * KiB, ResponseBufferBytes: 64 * KiB,
		PredictedCachedHeader: true, ForwardClientAuth: true, Pprof: true, Procs: "fixed", Sysmon: "go", Log: Log{"json", "debug", 0.5},
		Retry:       Retry{10, 0, time.Second},
		Health:      Health{2 * time.Second, 2 * time.Second, "/ready", 5, 2 * time.Second, 2 * time.Second, 1, 9 * time.Second},
		Scrape:      Scrape{time.Second, time.Millisecond, 1000, time.Second},
		Tokenize:    Tokenize{8, 1, time.Millisecond, 2 * KiB},
		DecisionLog: DecisionLog{filepath.Join(logDir, "d.jsonl"), 1, 1},
		Record:      Record{filepath.Join(logDir, "rec.parquet"), MiB, 2 * time.Minute, 3 * time.Second, 0.5, "", saltFile, 9},
		DNSRefresh:  time.Minute,
		Tracing:     Tracing{"http://127.0.0.1:4318/v1/traces", 0.5, map[string]string{"authorization": "Bearer x"}, 3 * time.Second, "gw"},
		EPP: EPP{"127.0.0.1:9100", false, TLS{}, InferencePool{"vllm", "llm", "big", "/tmp/kc", 5557, 5558, "kv", ""},
			LeaderElection{true, "picker-lease", 20 * time.Second, 12 * time.Second, 3 * time.Second}, 2},
		Auth: AuthNone,
		Tenancy: Tenancy{
			Store: "postgres://gw:pw@db.example:5432/inferrail", AuthCacheTTL: 2 * time.Second, UsageFlushInterval: 3 * time.Second,
			UsageBuffer: 10, Window: 4 * time.Second, LeaseTTL: 5 * time.Second, Limits: TenancyLimits{Global: Limits{1, 2, 3}},
			Redis:  Redis{Address: "unix:///run/redis.sock", PasswordFile: pwFile, DB: 2, KeyPrefix: "gw", Timeout: 7 * time.Millisecond, OnRedisError: "local", Gateways: 3},
			Ledger: Ledger{Backend: "local", LeaseTTL: 3 * time.Second, RefreshInterval: 100 * time.Millisecond, GatewayID: "gw-1", OnRedisError: "open"},
		},
		Models: []Model{{
			Name: "big", Aliases: []string{"b1", "b2"}, Policy: "round_robin", Tokenizer: tok,
			Index: "events", BlockSize: 1024, Profile: "Llama-3.1-8B@H100", SessionAffinity: true,
			MaxConcurrency: 1, MaxPending: 2,
			Admission: "llmd-utilization", Overcommit: 1.5, OutputQuantile: 0.9, DefaultMaxTokens: 256, MaxModelLen: 8192, MaxPriority: 100, MaxN: 16, KVCapacityBlocks: 4000,
			Queue:     Queue{MaxRequests: 0, MaxBytes: MiB, Timeout: 2 * time.Second, ShedOnSLO: true},
			KeyLimits: Limits{4, 5, 6},
			ResponseCache: respcache.Config{Enabled: true, Store: "redis", TTL: 2 * time.Minute, MaxEntryBytes: 2 * respcache.KiB, MaxTemperature: 0.5,
				TenantHeader: "X-Team", MaxWait: 3 * time.Second, Redis: respcache.RedisConfig{Addr: "127.0.0.1:6380", KeyPrefix: "rc:", Timeout: 9 * time.Millisecond}},
			SemanticCache: semcache.Config{Enabled: true, Threshold: 0.97, Store: "pgvector", TTL: 10 * time.Minute, MaxEntries: 50, MaxEntryBytes: 4096, MaxTextBytes: 512,
				Embeddings: semcache.EmbeddingsConfig{URL: "http://127.0.0.1:8000", Model: "emb", Timeout: 2 * time.Second, Dimensions: 384, APIKeyFile: pwFile},
				Postgres:   semcache.PostgresConfig{DSN: "postgres://u@db.example/x", Table: "sc", Timeout: time.Second, MaxConns: 2}},
			PD:       PD{Decider: "cost", NonCachedTokens: 256, MinPromptTokens: 512, PrefillTimeout: 7 * time.Second},
			Replicas: []Replica{{"r", "https://engine.example:8443/prefix", 3, 4, 5000, "tcp://engine.example:5557", "tcp://engine.example:5558", "kv", true, "decode"}},
			DNS:      []DNSGroup{{"g", "vllm.default.svc.cluster.local", 8000, "https", 5557, 5558, "kv", "both"}},
		}},
	}
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", *c, want)
	}
}

func TestModelResolvesAliases(t *testing.T) {
	c, err := Parse([]byte(`
models:
  - {name: a, aliases: [x, y], replicas: [{url: "http://h:1"}]}
  - {name: b, aliases: [z], replicas: [{url: "http://h:2"}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"a": "a", "x": "a", "y": "a", "b": "b", "z": "b"} {
		m, ok := c.Model(name)
		if !ok || m.Name != want {
			t.Errorf("Model(%q) = %v, %v; want %s", name, m, ok, want)
		}
	}
	if m, ok := c.Model("nope"); ok {
		t.Errorf("Model(nope) = %v, want none", m)
	}
	// The result points into c.
	m, _ := c.Model("z")
	m.Policy = "p2c"
	if c.Models[1].Policy != "p2c" {
		t.Error("Model returned a copy, want a pointer into Models")
	}
}

func TestLimits(t *testing.T) {
	m := Model{MaxConcurrency: 10, MaxPending: 5}
	cases := []struct {
		r        Replica
		mc, mpen int
	}{
		{Replica{}, 10, 5},
		{Replica{MaxConcurrency: 3}, 3, 5},
		{Replica{MaxPending: 1}, 10, 1},
		{Replica{MaxConcurrency: 20, MaxPending: 30}, 20, 30},
	}
	for _, c := range cases {
		mc, mp := m.Limits(&c.r)
		if mc != c.mc || mp != c.mpen {
			t.Errorf("Limits(%+v) = %d, %d; want %d, %d", c.r, mc, mp, c.mc, c.mpen)
		}
	}
}

func TestKVCapacity(t *testing.T) {
	m := Model{KVCapacityBlocks: 100}
	if got := m.KVCapacity(&Replica{}); got != 100 {
		t.Errorf("KVCapacity(no override) = %d, want the model's 100", got)
	}
	if got := m.KVCapacity(&Replica{KVCapacityBlocks: 7}); got != 7 {
		t.Errorf("KVCapacity(override 7) = %d, want 7", got)
	}
}

// A queue section that sets one field keeps the defaults of the others.
func TestQueuePartialKeepsDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal + "    queue: {timeout: 5s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultModel().Queue
	want.Timeout = 5 * time.Second
	if got := c.Models[0].Queue; got != want {
		t.Fatalf("queue %+v, want %+v", got, want)
	}
}

func TestReplicaNameDerivedFromURL(t *testing.T) {
	c, err := Parse([]byte(`
models:
  - name: m
    replicas:
      - url: http://10.0.0.1:8000
      - url: https://engine.internal/v1
      - {name: explicit, url: "http://10.0.0.2:8000"}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range c.Models[0].Replicas {
		got = append(got, r.Name)
	}
	if want := []string{"10.0.0.1:8000", "engine.internal", "explicit"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("names %v, want %v", got, want)
	}
}

func TestByteSize(t *testing.T) {
	cases := []struct {
		in   string
		want ByteSize
		err  bool
	}{
		{"1024", 1024, false},
		{"0x10", 16, false},
		{`"4MiB"`, 4 << 20, false},
		{`"4 MiB"`, 4 << 20, false},
		{`"1KiB"`, 1024, false},
		{`"1GiB"`, 1 << 30, false},
		{`"3KB"`, 3000, false},
		{`"3MB"`, 3e6, false},
		{`"1GB"`, 1e9, false},
		{`"17B"`, 17, false},
		{`"17"`, 17, false},
		{`"4mib"`, 0, true},
		{`"1.5MiB"`, 0, true},
		{"1.5", 0, true},
		{`"MiB"`, 0, true},
		{`"99999999999999999999"`, 0, true},
		{`"9999999999GiB"`, 0, true},
		{"[1]", 0, true},
		{"true", 0, true},
	}
	for _, c := range cases {
		cfg, err := Parse([]byte("max_body_bytes: " + c.in + "\n" + minimal))
		if c.err {
			fes := fieldErrs(t, err)
			if len(fes) != 1 || fes[0].Path != "max_body_bytes" || !strings.Contains(fes[0].Msg, "size") {
				t.Errorf("max_body_bytes: %s: got %v, want one size error", c.in, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("max_body_bytes: %s: %v", c.in, err)
			continue
		}
		if cfg.MaxBodyBytes != c.want {
			t.Errorf("max_body_bytes: %s = %d, want %d", c.in, cfg.MaxBodyBytes, c.want)
		}
	}
	for b, want := range map[ByteSize]string{0: "0B", 1: "1B", 1536: "1536B", 32 * MiB: "32MiB", GiB: "1GiB", 3 * KiB: "3KiB"} {
		if got := b.String(); got != want {
			t.Errorf("ByteSize(%d).String() = %q, want %q", int64(b), got, want)
		}
	}
}

func TestExampleGolden(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(data)
	if err != nil {
		t.Fatalf("examples/live.yaml: %v", err)
	}
	// Every value the example spells out is a default, except the model.
	d := Default()
	c2 := *c
	c2.Models = nil
	if !reflect.DeepEqual(c2, d) {
		t.Errorf("examples/live.yaml's settings differ from Default():\n%+v\n%+v", c2, d)
	}
	if _, err := Load(examplePath); err != nil {
		t.Fatalf("Load(example): %v", err)
	}
	golden := filepath.Join("testdata", "live.summary.golden")
	got := c.Summary()
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (generate it with go test ./live/config -run TestExampleGolden -update)", err)
	}
	if got != string(want) {
		t.Fatalf("Summary() of examples/live.yaml =\n%s\nwant (%s)\n%s", got, golden, want)
	}
}

func TestSummaryShowsEverything(t *testing.T) {
	c, err := Parse([]byte(`
models:
  - name: a
    aliases: [x]
    policy: p2c
    index: events
    profile: Llama-3.1-8B@H100
    session_affinity: true
    kv_capacity_blocks: 100
    max_model_len: 4096
    replicas:
      - {name: r1, url: "http://h:1", max_concurrency: 2, max_pending: 3, kv_capacity_blocks: 50, kv_events: "tcp://h:5557"}
    dns:
      - {name: g, host: pool.local, port: 80, kv_events_port: 5557}
  - name: b
    dns:
      - {name: g, host: pool.local, port: 81, scheme: https}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := "a (aliases x): policy p2c, index events, tokenizer builtin:sim, block_size 16, profile Llama-3.1-8B@H100, session_affinity, max_concurrency 256, max_pending 64, admission kv, kv_capacity_blocks 100, max_model_len 4096, queue 1024/256MiB/30s; 1 replica: r1=http://h:1 (max_concurrency 2, max_pending 3, kv_capacity_blocks 50, kv_events tcp://h:5557); 1 dns group: g=http://pool.local:80 (kv_events port 5557)\n" +
		"b: policy cost_model, index approximate, tokenizer builtin:sim, block_size 16, max_concurrency 256, max_pending 64, admission kv, queue 1024/256MiB/30s; 1 dns group: g=https://pool.local:81\n"
	if got := c.Summary(); got != want {
		t.Fatalf("Summary() =\n%s\nwant\n%s", got, want)
	}
}

func TestLoadPrefixesFileAndLine(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "live.yaml")
	doc := "listen: nope\nmodels:\n  - name: m\n    replicas:\n      - url: 10.0.0.1:8000\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil {
		t.Fatal("Load accepted an invalid file")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{
		path + `:1: listen: must be a host:port address with a numeric port, such as 127.0.0.1:8080 or :8080, got "nope"`,
		path + `:5: models[0].replicas[0].url: must be an absolute http:// or https:// URL, got "10.0.0.1:8000" (write "http://10.0.0.1:8000")`,
	}
	if !reflect.DeepEqual(lines, want) {
		t.Fatalf("Load error:\n%s\nwant\n%s", err, strings.Join(want, "\n"))
	}

	// Syntax errors carry file and line too.
	if err := os.WriteFile(path, []byte("listen: a\n  bad: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+":") || !strings.Contains(err.Error(), "invalid YAML") {
		t.Fatalf("Load(syntax error) = %v, want %s:LINE: invalid YAML: ...", err, path)
	}

	// A missing file says which.
	_, err = Load(filepath.Join(dir, "missing.yaml"))
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("Load(missing) = %v", err)
	}
}

func TestLoadResolvesRelativePaths(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tok", "qwen"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tok", "qwen", "tokenizer.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	prof, err := os.ReadFile("../../examples/profile-default-8b-24gb.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p.yaml"), prof, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rec.salt"), []byte("0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := `
decision_log: {path: logs.jsonl}
record: {path: rec.parquet, salt_file: rec.salt}
models:
  - name: m
    tokenizer: tok/qwen
    profile: p.yaml
    replicas: [{url: "http://h:1"}]
  - name: n
    profile: Llama-3.1-8B@H100
    replicas: [{url: "http://h:1"}]
`
	path := filepath.Join(dir, "live.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Models[0].Tokenizer, filepath.Join(dir, "tok", "qwen"); got != want {
		t.Errorf("tokenizer %q, want %q", got, want)
	}
	if got, want := c.Models[0].Profile, filepath.Join(dir, "p.yaml"); got != want {
		t.Errorf("profile %q, want %q", got, want)
	}
	if got, want := c.Models[1].Profile, "Llama-3.1-8B@H100"; got != want {
		t.Errorf("preset %q, want %q", got, want)
	}
	if got, want := c.DecisionLog.Path, filepath.Join(dir, "logs.jsonl"); got != want {
		t.Errorf("decision_log.path %q, want %q", got, want)
	}
	if got, want := c.Record.Path, filepath.Join(dir, "rec.parquet"); got != want {
		t.Errorf("record.path %q, want %q", got, want)
	}
	if got, want := c.Record.SaltFile, filepath.Join(dir, "rec.salt"); got != want {
		t.Errorf("record.salt_file %q, want %q", got, want)
	}
	// Parse takes the same paths from the working directory, where they
	// do not exist.
	data, _ := os.ReadFile(path)
	fes := fieldErrs(t, func() error { _, err := Parse(data); return err }())
	paths := map[string]bool{}
	for _, fe := range fes {
		paths[fe.Path] = true
	}
	if !paths["models[0].tokenizer"] || !paths["models[0].profile"] {
		t.Errorf("Parse from another directory: %v, want tokenizer and profile errors", fes)
	}
}

// The caches show in the summary when on, and the semantic cache's key
// file is found next to the configuration file.
func TestCachesSummaryAndPaths(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "emb.key"), []byte("k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	doc := `
models:
  - name: m
    response_cache: {enabled: true, ttl: 5m}
    semantic_cache: {enabled: true, embeddings: {url: "http://127.0.0.1:1", model: e, api_key_file: emb.key}}
    replicas: [{name: r, url: "http://h:1"}]
`
	path := filepath.Join(dir, "live.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Models[0].SemanticCache.Embeddings.APIKeyFile, filepath.Join(dir, "emb.key"); got != want {
		t.Errorf("api_key_file %q, want %q", got, want)
	}
	want := "m: policy cost_model, index approximate, tokenizer builtin:sim, block_size 16, max_concurrency 256, max_pending 64, admission kv, queue 1024/256MiB/30s, response_cache memory ttl 5m0s max_temperature 0, semantic_cache memory threshold 0.95; 1 replica: r=http://h:1\n"
	if got := c.Summary(); got != want {
		t.Errorf("Summary() =\n%s\nwant\n%s", got, want)
	}
	// examples/live.yaml spells out the defaults.
	ex, err := Load(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	if got := ex.Models[0].ResponseCache; !reflect.DeepEqual(got, respcache.DefaultConfig()) {
		t.Errorf("examples/live.yaml response_cache %+v, want the defaults %+v", got, respcache.DefaultConfig())
	}
	if got := ex.Models[0].SemanticCache; !reflect.DeepEqual(got, semcache.DefaultConfig()) {
		t.Errorf("examples/live.yaml semantic_cache %+v, want the defaults %+v", got, semcache.DefaultConfig())
	}
	// A wrong value is reported at its line, under the model's path.
	bad := strings.Replace(doc, "ttl: 5m", "ttl: 0s", 1)
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if err == nil || !strings.Contains(err.Error(), path+":4: models[0].response_cache.ttl: must be a duration from 1s") {
		t.Fatalf("Load(ttl 0) = %v", err)
	}
}
