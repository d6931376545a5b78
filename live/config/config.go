package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inferrail/inferrail/internal/bytesize"
	"github.com/inferrail/inferrail/respcache"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/semcache"
	"github.com/inferrail/inferrail/tenancy"
)

// Index modes (Model.Index).
const (
	// IndexApproximate predicts each replica's cache from the router's own
	// routing decisions.
	IndexApproximate = "approximate"
	// IndexEvents feeds the index with the engines' KV events.
	IndexEvents = "events"
)

// BuiltinSim names the simulation tokenizer (package engine/simtok), the
// one the mock engine (`inferrail engine`) uses.
const BuiltinSim = "builtin:sim"

// Config is the whole configuration of `inferrail live`. Parse and Load
// build one with defaults applied and validated; a Config built in code
// should start from Default and DefaultModel and be checked with Validate.
type Config struct {
	// Listen is the client-facing address, host:port (HTTP/1.1 and h2c).
	// Default "127.0.0.1:8080".
	Listen string `yaml:"listen"`
	// AdminListen is the address of metrics and admin endpoints; "" turns
	// them off. Default "127.0.0.1:9090".
	AdminListen string `yaml:"admin_listen"`
	// DrainTimeout is how long running streams may finish after SIGTERM;
	// 0 closes them at once. Default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// RequestTimeout is one overall deadline per request, retries
	// included. Default 10m.
	RequestTimeout time.Duration `yaml:"request_timeout"`
	// MaxBodyBytes caps a request body. YAML: bytes, or a size such as
	// "32MiB". Default 32 MiB.
	MaxBodyBytes ByteSize `yaml:"max_body_bytes"`
	// Seed seeds the policies' random choices. Default 0.
	Seed uint64 `yaml:"seed"`

	// ReadHeaderTimeout bounds reading a request's headers. Default 10s.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ReadTimeout bounds reading a request's body, from its headers on; a
	// body not read in time is answered 408 and its connection closed.
	// Default 30s.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds each write of a response to the client: a client
	// that does not read for this long is cut off, the request's upstream
	// is cancelled and its slot freed. Default 10s.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// FirstByteTimeout bounds each try's wait for the engine's first
	// response byte; past it the try counts as a failure of that replica
	// and the request is retried on another (retry.attempts apply).
	// Default 60s.
	FirstByteTimeout time.Duration `yaml:"first_byte_timeout"`
	// StreamIdleTimeout bounds the gap between two reads of a response
	// after its first byte: an engine silent for longer ends the stream as
	// a failure the client sees. Default 60s.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// IdleTimeout closes a client's keep-alive connection idle for this
	// long. Default 2m.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// DrainDelay is how long readiness fails on SIGTERM before the proxy
	// stops accepting connections, so load balancers stop sending first.
	// Default 5s.
	DrainDelay time.Duration `yaml:"drain_delay"`

	// MaxConnections caps the client connections open at once; one more
	// is accepted and closed at once. 0 derives it from the process's open
	// file limit (half of it, less a reserve: the other half is for the
	// upstream connections). Default 0.
	MaxConnections int `yaml:"max_connections"`
	// MaxConnectionsPerClient caps the connections of one client address;
	// 0 derives it: max_connections less a tenth (at least one), so that
	// no one address takes every slot (a readiness probe or another
	// client still connects while one address floods). Set it lower when
	// clients connect directly; behind a load balancer or a NAT many
	// clients share one address (set it to max_connections for no cap of
	// its own). Default 0.
	MaxConnectionsPerClient int `yaml:"max_connections_per_client"`
	// FloodConnectionsPerClient sheds a connection flood by its source:
	// while the kernel's accept queue of the client listener is an eighth
	// full or more, and for a second after (connections arrive faster
	// than the gateway takes them; once it is full the kernel drops every
	// client's connections alike, a readiness probe's included, each
	// retried a second later), a
	// new connection from an address that already holds this many or
	// more, and at least its share of the open ones (or that share alone
	// once the open connections are within an eighth of max_connections:
	// a flood from many addresses), is closed at accept,
	// which costs a fraction of serving it: the queue drains and the
	// addresses that hold few are served meanwhile. 0 never sheds. Set it
	// (256 is a good start) where clients connect directly; leave it 0
	// behind a load balancer, an ingress or a NAT, where one address is
	// every client: a legitimate load spike while the gateway is short of
	// CPU fills the queue too, and its connections would be shed (a load
	// generator's 1,456 of them in one bench-live run on a busy machine).
	// Linux only (the queue is read with TCP_INFO). Default 0.
	FloodConnectionsPerClient int `yaml:"flood_connections_per_client"`
	// MaxConcurrentStreams caps the concurrent requests of one HTTP/2
	// connection. Default 100.
	MaxConcurrentStreams int `yaml:"max_concurrent_streams"`
	// MaxBackgroundResponses caps the background responses (Responses
	// API, background: true) in flight through the gateway at once: each
	// is watched until the engine is done with it (one read a second),
	// holding its replica's slot meanwhile. One more is refused with 429
	// before it reaches an engine. Default 256.
	MaxBackgroundResponses int `yaml:"max_background_responses"`
	// MaxInflightBodyBytes bounds the request bodies held at once, over
	// every request (read, queued or in flight); a request that would pass
	// it is answered 503 with Retry-After. Default 1GiB.
	MaxInflightBodyBytes ByteSize `yaml:"max_inflight_body_bytes"`
	// ResponseBufferBytes is how much of an engine's response the proxy
	// holds for a client that reads more slowly than the engine writes: an
	// engine that has finished frees its slot while the client still reads.
	// Default 1MiB.
	ResponseBufferBytes ByteSize `yaml:"response_buffer_bytes"`

	// PredictedCachedHeader sends x-inferrail-predicted-cached-tokens on
	// every response. Off, it is sent only to a request that carries its
	// own cache_salt (whose cache no other tenant shares): the header
	// otherwise tells any client whether another sent a prefix. Default
	// false.
	PredictedCachedHeader bool `yaml:"predicted_cached_header"`
	// ForwardClientAuth forwards the client's Authorization and Cookie
	// headers to the engines. Default false.
	ForwardClientAuth bool `yaml:"forward_client_auth"`
	// StreamUsage asks the engine for the usage of a streamed request
	// that has no stream_options (stream_options.include_usage), and
	// keeps the usage-only chunk it adds from the client: metering, the
	// TPM true-up and the engine-measured hit rate then read the engine's
	// counts for every stream. Default true.
	StreamUsage bool `yaml:"stream_usage"`

	// TLS serves the client listener over TLS (HTTP/1.1 and h2) when its
	// cert_file and key_file are set.
	TLS TLS `yaml:"tls"`
	// AdminTLS serves the admin listener over TLS likewise.
	AdminTLS TLS `yaml:"admin_tls"`
	// AdminTokenFile holds the bearer token the admin endpoints require
	// (but /livez and /readyz); required when admin_listen is not a
	// loopback address. Default "".
	AdminTokenFile string `yaml:"admin_token_file"`
	// Pprof serves Go's profiles at /debug/pprof/ on the admin listener.
	// Default false.
	Pprof bool `yaml:"pprof"`
	// Procs is how many processors (GOMAXPROCS) the proxy runs Go code
	// on: "adaptive" as few as its load needs (one while it is light: an
	// idle processor costs a thread wake-up and a spin for every
	// connection event) and every one the container allows as soon as it
	// needs more; "fixed" every one, as Go sets it. Adaptive took 15-23%
	// less CPU per request at 1,000 req/s and 10-16% at 3,000 here, with
	// no longer a tail (README). Adaptive reads again, every 30 s, how many
	// Go itself would use (the container's CPU limit, which a resize
	// changes). A GOMAXPROCS environment variable fixes it in either case.
	// Read at start only. Default "adaptive".
	Procs string `yaml:"procs"`
	// Sysmon is how Go's runtime monitor runs: "awake" keeps it from the
	// deep sleep it takes while every processor is idle (the proxy executes
	// itself again once at start with GODEBUG=schedtrace=2147483647 added,
	// which keeps it so; idle, it then wakes every 10 ms); "go" leaves it
	// as Go runs it: woken by the first system call after each idle
	// moment, it then checks every 20 µs for a millisecond, which costs a
	// proxy at a few hundred to a few thousand requests a second about
	// three context switches a request (README). A GODEBUG in the
	// environment that sets schedtrace is left as it is. Read at start
	// only. Default "awake".
	Sysmon string `yaml:"sysmon"`
	// Log configures the process log and the access log.
	Log Log `yaml:"log"`
	// Retry is what happens when a try fails before the first response byte.
	Retry Retry `yaml:"retry"`
	// Health configures active probes and passive ejection.
	Health Health `yaml:"health"`
	// Scrape configures the scraping of the engines' /metrics.
	Scrape Scrape `yaml:"scrape"`
	// Tokenize configures the edge tokenizer pool.
	Tokenize Tokenize `yaml:"tokenize"`
	// DecisionLog configures the sampled log of routing decisions.
	DecisionLog DecisionLog `yaml:"decision_log"`
	// Record configures the recording of the traffic served, in the
	// project's parquet trace format (docs/recording.md); off without a
	// path.
	Record Record `yaml:"record"`
	// DNSRefresh is how often DNS groups are resolved again. Default 10s.
	DNSRefresh time.Duration `yaml:"dns_refresh"`
	// Tracing configures OpenTelemetry traces; off without an endpoint.
	Tracing Tracing `yaml:"tracing"`
	// EPP configures `inferrail epp`, the endpoint picker for Kubernetes
	// inference gateways (unused by `inferrail live`).
	EPP EPP `yaml:"epp"`
	// Auth is how the client listener authenticates requests: "none"
	// (anyone who reaches it may use every model) or "keys" (an API key
	// in Authorization: Bearer, looked up in tenancy.store). `inferrail
	// epp` ignores it: the Kubernetes gateway in front authenticates.
	// Default "none".
	Auth string `yaml:"auth"`
	// Tenancy configures API keys, rate limits and usage metering.
	Tenancy Tenancy `yaml:"tenancy"`
	// Models are the served models, at least one.
	Models []Model `yaml:"models"`
}

// Auth modes (Config.Auth).
const (
	AuthNone = "none"
	AuthKeys = "keys"
)

// Tenancy configures API keys (with auth: keys), the rate limiter and
// usage metering.
type Tenancy struct {
	// Store is where keys and usage live: a SQLite file path (or
	// sqlite:///path/to/file.db), or a postgres:// URL for several
	// gateways. Required with auth: keys; with auth: none it is optional
	// and meters usage under the key id "anonymous". Default "".
	Store string `yaml:"store"`
	// AuthCacheTTL is how long a key read from the store is used without
	// reading it again: the longest a change made through another
	// gateway takes to apply here (with Postgres, only while the store's
	// LISTEN/NOTIFY watch is lost). Default 5s.
	AuthCacheTTL time.Duration `yaml:"auth_cache_ttl"`
	// UsageFlushInterval is how often the usage rows are written to the
	// store (and once more at shutdown). Default 10s.
	UsageFlushInterval time.Duration `yaml:"usage_flush_interval"`
	// UsageBuffer is how many usage rows (one per key, model and hour,
	// merged as requests end) wait for a flush before new ones are
	// dropped and counted. Default 65536.
	UsageBuffer int `yaml:"usage_buffer"`
	// Window is the period RPM and TPM count over. Default 1m.
	Window time.Duration `yaml:"window"`
	// LeaseTTL is how long a concurrency slot lives without renewal (a
	// request renews its own every lease_ttl/3): a crashed gateway's
	// slots are free within it. Default 30s.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Limits are the limits beyond each key's own.
	Limits TenancyLimits `yaml:"limits"`
	// Redis shares the limiter's state between gateways, and the
	// Responses API's stored-response homes (which replica holds each,
	// and its key); without an address both are in process.
	Redis Redis `yaml:"redis"`
	// Ledger is where the gateway core's KV reservations live.
	Ledger Ledger `yaml:"ledger"`
}

// Ledger configures the gateway core's reservation ledger (KV admission):
// this gateway's own, or shared through tenancy.redis by every gateway in
// front of the same engines, so that together they admit as one would.
type Ledger struct {
	// Backend is "local" (this gateway's reservations only) or "redis"
	// (every gateway's, checked and reserved atomically in Redis).
	// Default "local".
	Backend string `yaml:"backend"`
	// LeaseTTL is how long a gateway's reservations count after its last
	// successful call to Redis: a crashed gateway's are gone within it.
	// Default 10s.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// RefreshInterval is how often this gateway renews its lease and
	// reads the others' reservations (every gateway of a deployment must
	// use the same). At most lease_ttl/3. Default 250ms.
	RefreshInterval time.Duration `yaml:"refresh_interval"`
	// GatewayID names this gateway in Redis; "" is a random one per start
	// (a restarted gateway's old reservations then expire with its lease).
	// Default "".
	GatewayID string `yaml:"gateway_id"`
	// OnRedisError is what admission does while Redis fails: "closed"
	// (requests wait in the queue), "open" (admit as if alone) or "local"
	// (this gateway's share: capacity / tenancy.redis.gateways). Default
	// "closed".
	OnRedisError string `yaml:"on_redis_error"`
}

// TenancyLimits are limits shared by every request.
type TenancyLimits struct {
	// Global limits every request, whatever its key. Default unlimited.
	Global Limits `yaml:"global"`
}

// Limits are a bucket's rate limits; 0 is unlimited for that dimension.
type Limits struct {
	// RPM is requests per window (per minute by default).
	RPM int `yaml:"rpm"`
	// TPM is tokens per window: the estimate (prompt + max_tokens) at
	// admission, reconciled with the engine's usage at the end.
	TPM int `yaml:"tpm"`
	// MaxConcurrency is requests in flight at once.
	MaxConcurrency int `yaml:"max_concurrency"`
}

// Zero reports whether every dimension is unlimited.
func (l Limits) Zero() bool { return l == Limits{} }

// Redis is the Redis that the gateways' limiters share.
type Redis struct {
	// Address is host:port (such as 127.0.0.1:6379) or unix:///path.sock;
	// "" keeps the limiter in process. Default "".
	Address string `yaml:"address"`
	// PasswordFile holds Redis's password (AUTH), one line; "" is none.
	PasswordFile string `yaml:"password_file"`
	// DB is the Redis database number. Default 0.
	DB int `yaml:"db"`
	// KeyPrefix starts every key the limiter writes. Default "ir".
	KeyPrefix string `yaml:"key_prefix"`
	// Timeout bounds each Redis call, 1ms to 10s. Default 20ms.
	Timeout time.Duration `yaml:"timeout"`
	// OnRedisError is what a request gets while Redis fails: "closed"
	// (503 limiter_unavailable), "open" (admitted, uncounted) or "local"
	// (this gateway's share of each limit, in process). Default "closed".
	OnRedisError string `yaml:"on_redis_error"`
	// Gateways is how many gateways share the limits: under
	// on_redis_error: local each enforces limit / gateways. Default 1.
	Gateways int `yaml:"gateways"`
}

// Tracing configures OpenTelemetry traces, exported over OTLP/HTTP:
// per request a server span, a route span per routing decision and a
// client span per try upstream, with GenAI semantic-convention attributes
// (never a prompt or a completion).
type Tracing struct {
	// Endpoint is the OTLP/HTTP traces URL, such as
	// http://127.0.0.1:4318/v1/traces; "" turns tracing off (no span is
	// created). Default "".
	Endpoint string `yaml:"endpoint"`
	// SampleRatio is the share of new traces sampled; a request carrying a
	// W3C traceparent follows its sampled flag. Default 0.1.
	SampleRatio float64 `yaml:"sample_ratio"`
	// Headers are sent with every export (an authorization header, say).
	Headers map[string]string `yaml:"headers"`
	// Timeout bounds one export. Default 10s.
	Timeout time.Duration `yaml:"timeout"`
	// ServiceName is the resource's service.name. Default "inferrail".
	ServiceName string `yaml:"service_name"`
}

// EPP configures `inferrail epp`: the Gateway API Inference Extension's
// endpoint-picker protocol (Envoy ext_proc over gRPC).
type EPP struct {
	// Listen is the ext_proc gRPC address. Default "127.0.0.1:9002".
	Listen string `yaml:"listen"`
	// SecureServing serves ext_proc over TLS, as the Gateway API
	// Inference Extension's reference picker does by default: the
	// gateways (kgateway, Envoy Gateway, Istio, GKE) connect to a picker
	// with TLS and do not verify its certificate. Without TLS files the
	// certificate is self-signed, made at start. false serves plaintext
	// h2c. Default true.
	SecureServing bool `yaml:"secure_serving"`
	// TLS names the certificate and key to serve (re-read when they
	// change) in place of a self-signed one.
	TLS TLS `yaml:"tls"`
	// Pool, when its name is set, takes a model's replicas from the ready
	// pods of an InferencePool, watched in Kubernetes.
	Pool InferencePool `yaml:"pool"`
	// LeaderElection runs several pickers for one pool, one of them
	// ready at a time.
	LeaderElection LeaderElection `yaml:"leader_election"`
	// FallbackEndpoints is how many endpoints follow the pick in the
	// destination header and metadata (the protocol's comma-separated
	// list: the gateway tries them in turn when the pick fails before an
	// answer): the model's other healthy replicas the request may go to,
	// the least loaded first. 0 to 8; default 0 (the pick alone, as
	// llm-d's picker does by default).
	FallbackEndpoints int `yaml:"fallback_endpoints"`
}

// LeaderElection lets several endpoint pickers run for one InferencePool
// (as the reference picker's --ha-enable-leader-election): they hold a
// Lease (coordination.k8s.io/v1) in the pool's namespace in turn, and only
// its holder is ready (/readyz and gRPC health but liveness), so the
// gateway sends ext_proc to it; the others watch the pool and its pods
// all along, ready to take over when the lease lapses.
type LeaderElection struct {
	// Enabled turns it on; it needs epp.pool. Default false.
	Enabled bool `yaml:"enabled"`
	// LeaseName is the Lease's name. Default "inferrail-epp-" and the
	// pool's name.
	LeaseName string `yaml:"lease_name"`
	// LeaseDuration is how long a standby waits, from the holder's last
	// renewal, before it takes the lease. Default 15s.
	LeaseDuration time.Duration `yaml:"lease_duration"`
	// RenewDeadline is how long the holder keeps trying to renew before
	// it gives the lease up. Default 10s.
	RenewDeadline time.Duration `yaml:"renew_deadline"`
	// RetryPeriod is the wait between tries to take or renew. Default 2s.
	RetryPeriod time.Duration `yaml:"retry_period"`
}

// InferencePool names an InferencePool (inference.networking.k8s.io/v1)
// whose ready pods are a model's replicas.
type InferencePool struct {
	// Name of the InferencePool; "" is none.
	Name string `yaml:"name"`
	// Namespace of the pool. Default "default".
	Namespace string `yaml:"namespace"`
	// Model is the served model whose replicas the pool's pods are; ""
	// when exactly one model is configured.
	Model string `yaml:"model"`
	// Kubeconfig is a kubeconfig file; "" uses the in-cluster
	// configuration (the pod's service account).
	Kubeconfig string `yaml:"kubeconfig"`
	// KVEventsPort is the port each pod's engine publishes its KV events
	// on (tcp://POD_IP:PORT: vLLM's --kv-events-config endpoint
	// tcp://*:PORT); required when the pool's model has index: events.
	KVEventsPort int `yaml:"kv_events_port"`
	// KVEventsReplayPort is each pod's replay port, optional.
	KVEventsReplayPort int `yaml:"kv_events_replay_port"`
	// KVEventsTopic is the topic subscribed to; "" is every topic.
	KVEventsTopic string `yaml:"kv_events_topic"`
	// KVEventsListen is a ZMQ endpoint the picker binds for every pod's
	// engine to connect to and publish on (llm-d's central mode: vLLM's
	// --kv-events-config endpoint tcp://EPP:PORT, topic
	// kv@$(POD_IP):PORT@MODEL), instead of kv_events_port; the model's
	// kv_events_listen (see Model).
	KVEventsListen string `yaml:"kv_events_listen"`
}

// TLS names a certificate and its key, PEM files read again when they
// change. Both or neither.
type TLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Enabled reports whether t names a certificate.
func (t TLS) Enabled() bool { return t.CertFile != "" }

// Log configures logging (log/slog, on stderr).
type Log struct {
	// Format is "text" or "json". Default "text".
	Format string `yaml:"format"`
	// Level is "debug", "info", "warn" or "error". Default "info".
	Level string `yaml:"level"`
	// AccessSample is the share of requests written to the access log (at
	// info level: method, path, status, duration, model, replica, tokens,
	// queue time; never a prompt or a header value). Default 1.
	AccessSample float64 `yaml:"access_sample"`
}

// Retry bounds the tries of one request before its first response byte.
type Retry struct {
	// Attempts is the total number of tries, from 1 (no retry) to 10.
	// Default 3.
	Attempts int `yaml:"attempts"`
	// Backoff is the wait before the first retry, doubled before each
	// next one; 0 retries at once. Default 10ms.
	Backoff time.Duration `yaml:"backoff"`
	// MaxBackoff caps the wait, at least Backoff. Default 200ms.
	MaxBackoff time.Duration `yaml:"max_backoff"`
}

// Health configures active health probes and the ejection of failing
// replicas.
type Health struct {
	// Interval is the time between two probes of a replica. Default 1s.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one probe, at most Interval. Default 500ms.
	Timeout time.Duration `yaml:"timeout"`
	// Path is the probed HTTP path. Default "/health".
	Path string `yaml:"path"`
	// EjectAfter is the number of consecutive failures (requests or
	// probes) that ejects a replica. Default 3.
	EjectAfter int `yaml:"eject_after"`
	// EjectTime is the first ejection's length; it doubles with each
	// ejection up to MaxEjectTime. Default 1s.
	EjectTime time.Duration `yaml:"eject_time"`
	// MaxEjectTime caps an ejection, at least EjectTime. Default 30s.
	MaxEjectTime time.Duration `yaml:"max_eject_time"`
	// MaxEjectedShare is the largest share of a model's replicas ever
	// ejected at once, in [0, 1]. Default 0.5.
	MaxEjectedShare float64 `yaml:"max_ejected_share"`
	// ReadyWindow: /readyz answers 200 while every model has a replica
	// that passed a probe or answered a request within this window. 0
	// means twice the interval plus the timeout. Default 0.
	ReadyWindow time.Duration `yaml:"ready_window"`
}

// Scrape configures the scraping of the engines' /metrics.
type Scrape struct {
	// Interval is the time between two scrapes of a replica. Default 100ms.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one scrape, at most Interval. Default 80ms.
	Timeout time.Duration `yaml:"timeout"`
	// MaxBytes caps a /metrics response. Default 4 MiB.
	MaxBytes ByteSize `yaml:"max_bytes"`
	// MaxAge is the age past which a report counts as missing, at least
	// Interval. Default 500ms.
	MaxAge time.Duration `yaml:"max_age"`
}

// Tokenize configures the pool that tokenizes prompts at the edge.
type Tokenize struct {
	// Workers is the pool size; 0 means GOMAXPROCS. Default 0.
	Workers int `yaml:"workers"`
	// Queue is the number of prompts waiting for a worker before new ones
	// are routed without a prediction. Default 1024.
	Queue int `yaml:"queue"`
	// Timeout is the longest wait for a tokenization; past it the request
	// is routed without a prediction. Default 20ms.
	Timeout time.Duration `yaml:"timeout"`
	// MaxPromptBytes bounds the prompts tokenized at the edge: a longer
	// one is routed without a prediction (and, when it cannot fit the
	// model's max_model_len whatever its tokens, answered 400 at once). 0
	// means 8 bytes per token of max_model_len, or 1MiB for a model
	// without one. Default 0.
	MaxPromptBytes ByteSize `yaml:"max_prompt_bytes"`
}

// DecisionLog configures the JSON-lines log of routing decisions.
type DecisionLog struct {
	// Path is the file decisions are appended to; "" turns the log off.
	// Its directory must exist. Default "".
	Path string `yaml:"path"`
	// Sample is the share of decisions logged, in [0, 1]. Default 0.01.
	Sample float64 `yaml:"sample"`
	// Buffer is the number of entries queued before new ones are dropped.
	// Default 4096.
	Buffer int `yaml:"buffer"`
}

// Record configures the recording of live traffic: one row per finished
// request (every outcome) in the project's parquet trace format, written
// off the request path, rotated by size and age. Prompts are never
// written: their blocks are keyed hashes (salted per deployment), as are
// tenants and the user field. docs/recording.md describes the columns.
type Record struct {
	// Path names the recording: files are written next to it as
	// <stem>-<UTC start>-<number>.parquet (stem: Path without its .parquet
	// suffix), each first as <name>.partial and renamed once complete. ""
	// turns recording off. Its directory must exist. Default "".
	Path string `yaml:"path"`
	// RotateBytes closes a file once it holds about this many bytes (at
	// the next row); from 64KiB to 1TiB. Default 256MiB.
	RotateBytes ByteSize `yaml:"rotate_bytes"`
	// RotateInterval closes a file this long after it was started. Default
	// 1h.
	RotateInterval time.Duration `yaml:"rotate_interval"`
	// FlushInterval is the longest a finished request's row waits in
	// memory before its row group is written (a checkpoint a reader of a
	// file cut short reads up to); at most rotate_interval. Default 10s.
	FlushInterval time.Duration `yaml:"flush_interval"`
	// Sample is the share of requests recorded, in (0, 1], decided per
	// request by a hash of its request id. Default 1.
	Sample float64 `yaml:"sample"`
	// Salt keys the hashes of prompts' blocks, tenants and users: at least
	// 16 characters, kept secret and the same across the deployment's
	// gateways (equal prompts get equal hash_ids only under one salt). It
	// is never written into a recording (its fingerprint is). Exactly one
	// of salt and salt_file is required when path is set. Default "".
	Salt string `yaml:"salt"`
	// SaltFile holds the salt instead (one line, surrounding space
	// trimmed). Default "".
	SaltFile string `yaml:"salt_file"`
	// Buffer is how many finished requests' rows wait for the writer; when
	// it is full, new rows are dropped and counted
	// (inferrail_record_dropped_total), never waited for. It also bounds
	// the rows held to write them in arrival order. Default 65536.
	Buffer int `yaml:"buffer"`
}

// Model is one served model and its replicas.
type Model struct {
	// Name is the model name clients ask for and engines serve; required,
	// unique across every model's name and aliases.
	Name string `yaml:"name"`
	// Aliases are other names clients may ask for; a request for an alias
	// is rewritten to Name.
	Aliases []string `yaml:"aliases"`
	// Adapters are the LoRA adapters the model's engines serve (vLLM's
	// --lora-modules names): a request for one goes to the model's
	// replicas with its model field unchanged, and its prompt's KV blocks
	// are keyed apart from the base model's and every other adapter's, as
	// the engine keys them. Unique across every model's name, aliases and
	// adapters.
	Adapters []string `yaml:"adapters"`
	// APIKeyFile holds the API key the model's engines ask for (vLLM's
	// --api-key, VLLM_API_KEY), one line: every request the gateway sends
	// them carries it as Authorization: Bearer, in place of any client's.
	// Read at start and at each reload. Not with forward_client_auth.
	// Default "" (none).
	APIKeyFile string `yaml:"api_key_file"`
	// Policy is the routing policy, one of router.Names(). Default
	// "cost_model".
	Policy string `yaml:"policy"`
	// ShadowPolicy is a policy (one of router.Names()) every routing
	// decision also asks, with the same candidates and state, without
	// effect on routing: its agreement with policy and cost_model's
	// estimates of both picks are exported (inferrail_shadow_*) and its
	// picks logged in the decision log (docs/explain-shadow.md). Default
	// "" (none).
	ShadowPolicy string `yaml:"shadow_policy"`
	// Tokenizer is "builtin:sim", a model directory holding tokenizer.json,
	// or a tokenizer.json path. Default "builtin:sim".
	Tokenizer string `yaml:"tokenizer"`
	// Index is "approximate" or "events" (every replica then needs a KV
	// events endpoint, or the model kv_events_listen). Default
	// "approximate".
	Index string `yaml:"index"`
	// KVEventsListen is a ZMQ endpoint the proxy binds (tcp://*:5557) for
	// every replica's engine to connect to and publish its KV events on,
	// each on its own topic (llm-d's central mode): a replica listed with
	// its own kv_events_topic is the one publishing on exactly that topic;
	// otherwise a topic kv@ADDRESS@MODEL (vLLM's --kv-events-config topic
	// kv@$(POD_IP):PORT@MODEL) is the replica whose URL's host:port, or
	// host, is ADDRESS. A replica with its own kv_events is subscribed to
	// there instead. Default "" (none).
	KVEventsListen string `yaml:"kv_events_listen"`
	// BlockSize is the engines' KV block size in tokens, 1 to 1024.
	// Default 16.
	BlockSize int `yaml:"block_size"`
	// Profile is the engine profile behind cost_model's estimates: "" for
	// the default, a profile YAML path or a MODEL@GPU preset. Default "".
	Profile string `yaml:"profile"`
	// SessionAffinity keeps a session on its replica. Default false.
	SessionAffinity bool `yaml:"session_affinity"`
	// MaxConcurrency is the per-replica cap of requests in flight.
	// Default 256.
	MaxConcurrency int `yaml:"max_concurrency"`
	// MaxPending is the per-replica cap of requests waiting for a first
	// byte. Default 64.
	MaxPending int `yaml:"max_pending"`
	// Admission is the rule that decides when a replica takes one more
	// request (package router/gateway): "none" (dispatch at once while a
	// replica is under its caps), "kv" (weigh each request in the KV
	// blocks it adds, prompt minus its predicted cached part plus
	// max_tokens, against each replica's capacity), or one of the peers'
	// rules "llmd-utilization", "llmd-concurrency", "dynamo", "tokenflow".
	// A request no replica admits waits in the queue. Default "kv".
	Admission string `yaml:"admission"`
	// Overcommit scales each replica's KV capacity for kv admission, in
	// (0, 4]. Default gateway.DefaultOvercommit (1).
	Overcommit float64 `yaml:"overcommit"`
	// OutputQuantile makes kv admission reserve, for each request's
	// output, this quantile of the answer lengths the engines reported for
	// the model's recent requests (at most its max_tokens); 0 reserves
	// max_tokens. In [0, 1]. Default 0.75 (gateway.DefaultConfig).
	OutputQuantile float64 `yaml:"output_quantile"`
	// DefaultMaxTokens is the output a request without max_tokens is
	// weighed with; 0 means max_model_len minus its prompt (vLLM's
	// default), or, when max_model_len is 0 too, the output_quantile of
	// the answers' lengths once known (nothing before). Default 0.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// MaxModelLen is the engines' context length (vLLM's
	// --max-model-len): a tokenized prompt plus max_tokens beyond it is
	// answered 400 at once, and a request without max_tokens (and no
	// default_max_tokens) is weighed as max_model_len minus its prompt.
	// 0: the replicas' GET /v1/models give it (vLLM's max_model_len; the
	// smallest when they differ), to refuse longer requests only, not to
	// weigh those without max_tokens; nothing is checked until one
	// answers. Default 0.
	MaxModelLen int `yaml:"max_model_len"`
	// MaxPriority caps the priority a request asks for with the
	// x-inferrail-priority header (higher is served first), 0 to 1000.
	// Default 10.
	MaxPriority int `yaml:"max_priority"`
	// MaxN caps a completion or chat request's n, the choices the engine
	// samples, each its own sequence (vLLM runs n sequences and sets no
	// bound): a request over it is answered 400 before any engine sees
	// it. 1 to 65536. Default 128 (OpenAI's bound).
	MaxN int `yaml:"max_n"`
	// KVCapacityBlocks is each replica's KV capacity in blocks for
	// admission; 0 takes what the engine reports (vLLM's
	// vllm:cache_config_info num_gpu_blocks). A replica's own setting
	// overrides it. Default 0.
	KVCapacityBlocks int `yaml:"kv_capacity_blocks"`
	// Queue bounds the requests waiting for a replica to admit them.
	Queue Queue `yaml:"queue"`
	// KeyLimits are the limits of each key on this model (its key x model
	// bucket), beyond the key's own; with auth: none they apply to every
	// request for the model together (one "anonymous" key). Default
	// unlimited.
	KeyLimits Limits `yaml:"key_limits"`
	// ResponseCache is the model's exact response cache (package
	// respcache, docs/response-cache.md): a deterministic request whose
	// identical twin (same canonical body, model, tenant and cache_salt)
	// was answered within its ttl is replayed byte for byte without an
	// engine. Default off (respcache.DefaultConfig: memory store, ttl 1h,
	// max_bytes 256MiB, max_entry_bytes 1MiB, max_temperature 0, max_wait
	// 30s). A request needs a tenant to be cached: its API key (auth:
	// keys) or the value of tenant_header.
	ResponseCache respcache.Config `yaml:"response_cache"`
	// SemanticCache is the model's semantic cache (package semcache,
	// docs/semantic-cache.md), behind the exact one: a deterministic
	// request the exact cache misses may get the stored answer of an
	// earlier request of the same tenant whose last user message is
	// nearly the same (embeddings' cosine similarity at least threshold).
	// Default off (semcache.DefaultConfig: memory store, threshold 0.95,
	// ttl 1h); it needs response_cache enabled, whose determinism rule and
	// tenant it uses and whose captured answers it stores.
	SemanticCache semcache.Config `yaml:"semantic_cache"`
	// PD configures disaggregated prefill/decode (docs/pd-live.md): it
	// matters when some replica has role: prefill.
	PD PD `yaml:"pd"`
	// Replicas are the listed replicas.
	Replicas []Replica `yaml:"replicas"`
	// DNS are the DNS groups: every address of a group is a replica.
	DNS []DNSGroup `yaml:"dns"`
}

// PD configures a model's disaggregated prefill/decode (P/D): a request
// the decider sends to a prefill replica is prefilled there (vLLM's
// NixlConnector protocol: max_tokens 1, kv_transfer_params
// do_remote_decode), then decoded on the replica the policy chose, which
// reads the prompt's KV from the prefill replica. A prefill that fails
// falls back to a local prefill on the decode replica.
type PD struct {
	// Decider decides remote or local prefill, one of
	// gateway.Deciders(): "auto" (the policy's own: dynamo for dynamo,
	// cost for cost_model, threshold for the others), "threshold" (llm-d's
	// prefix-based decider), "cost", "dynamo", "always", "never". Default
	// "auto".
	Decider string `yaml:"decider"`
	// NonCachedTokens is the least prompt the decode replica does not
	// have cached that is worth a remote prefill (threshold, cost).
	// Default 16 (llm-d's shipped P/D configurations).
	NonCachedTokens int `yaml:"non_cached_tokens"`
	// MinPromptTokens is the least prompt prefilled remotely (threshold;
	// 0: any). Default 0.
	MinPromptTokens int `yaml:"min_prompt_tokens"`
	// PrefillTimeout bounds a prefill request, from its send to its whole
	// answer; past it the request falls back to a local prefill. Default
	// 60s.
	PrefillTimeout time.Duration `yaml:"prefill_timeout"`
}

// Queue bounds a model's queue of requests no replica admits yet. Requests
// leave it highest priority first, fairly across tenants (the
// x-inferrail-tenant header, else the body's user field) within a priority,
// first come first served within a tenant, the moment capacity frees.
type Queue struct {
	// MaxRequests is the most requests waiting; one more is answered 429
	// queue_full. 0 turns queueing off: a request no replica admits is
	// answered 429 no_capacity at once. Default 1024.
	MaxRequests int `yaml:"max_requests"`
	// MaxBytes bounds the request bodies waiting, in bytes or a size such
	// as "256MiB". Default 256 MiB.
	MaxBytes ByteSize `yaml:"max_bytes"`
	// Timeout is the longest a request waits; past it, 429 queue_timeout
	// (503 when no replica is healthy). Must be positive. Default 30s.
	Timeout time.Duration `yaml:"timeout"`
	// ShedOnSLO answers 429 slo_shed at once when the queue's measured
	// drain rate says the request would wait past its timeout. Default
	// false.
	ShedOnSLO bool `yaml:"shed_on_slo"`
}

// Replica is one listed engine.
type Replica struct {
	// Name is unique within the model. Parse derives a missing one from
	// the URL's host:port.
	Name string `yaml:"name"`
	// URL is the engine's base URL: absolute http:// or https://, with a
	// host and no query; a path, if any, prefixes the API paths.
	URL string `yaml:"url"`
	// MaxConcurrency overrides the model's; 0 keeps it.
	MaxConcurrency int `yaml:"max_concurrency"`
	// MaxPending overrides the model's; 0 keeps it.
	MaxPending int `yaml:"max_pending"`
	// KVCapacityBlocks overrides the model's kv_capacity_blocks; 0 keeps
	// it.
	KVCapacityBlocks int `yaml:"kv_capacity_blocks"`
	// KVEvents is the ZMQ endpoint of the engine's KV events, such as
	// tcp://10.0.0.1:5557; required when the model's index is "events".
	KVEvents string `yaml:"kv_events"`
	// KVEventsReplay is the engine's replay endpoint, optional.
	KVEventsReplay string `yaml:"kv_events_replay"`
	// KVEventsTopic is the topic subscribed to; "" is every topic.
	KVEventsTopic string `yaml:"kv_events_topic"`
	// KVEventsBind makes the proxy bind kv_events (a local address such
	// as tcp://*:5557 or tcp://0.0.0.0:5557) for the engine to connect to,
	// as vLLM's publisher does when its endpoint has no "*". Default
	// false: the proxy connects to the engine's bound endpoint.
	KVEventsBind bool `yaml:"kv_events_bind"`
	// Role is what the replica serves under disaggregated prefill/decode:
	// "prefill" (only the prefills of requests decoded elsewhere: a vLLM
	// with --kv-transfer-config kv_role kv_producer), "decode" (never a
	// remote prefill: kv_consumer) or "both" (everything: kv_both, or an
	// engine without a connector). Default "both".
	Role string `yaml:"role"`
}

// DNSGroup is a DNS name whose every address is a replica.
type DNSGroup struct {
	// Name is unique among the model's groups.
	Name string `yaml:"name"`
	// Host is the DNS name resolved every dns_refresh.
	Host string `yaml:"host"`
	// Port is the engines' HTTP port.
	Port int `yaml:"port"`
	// Scheme is "http" or "https". Default "http".
	Scheme string `yaml:"scheme"`
	// KVEventsPort is the port each address publishes KV events on
	// (tcp://ADDRESS:PORT); required when the model's index is "events".
	KVEventsPort int `yaml:"kv_events_port"`
	// KVEventsReplayPort is each address's replay port, optional.
	KVEventsReplayPort int `yaml:"kv_events_replay_port"`
	// KVEventsTopic is the topic subscribed to; "" is every topic.
	KVEventsTopic string `yaml:"kv_events_topic"`
	// Role is every address's role, as a replica's role. Default "both".
	Role string `yaml:"role"`
}

// Default returns the defaults of every field, with no models.
func Default() Config {
	return Config{
		Listen:                    "127.0.0.1:8080",
		AdminListen:               "127.0.0.1:9090",
		DrainTimeout:              30 * time.Second,
		RequestTimeout:            10 * time.Minute,
		MaxBodyBytes:              32 * MiB,
		ReadHeaderTimeout:         10 * time.Second,
		ReadTimeout:               30 * time.Second,
		WriteTimeout:              10 * time.Second,
		FirstByteTimeout:          60 * time.Second,
		StreamIdleTimeout:         60 * time.Second,
		IdleTimeout:               2 * time.Minute,
		DrainDelay:                5 * time.Second,
		MaxConcurrentStreams:      100,
		MaxBackgroundResponses:    256,
		FloodConnectionsPerClient: 0,
		MaxInflightBodyBytes:      GiB,
		ResponseBufferBytes:       MiB,
		StreamUsage:               true,
		Procs:                     "adaptive",
		Sysmon:                    "awake",
		Log:                       Log{Format: "text", Level: "info", AccessSample: 1},
		Retry:                     Retry{Attempts: 3, Backoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		Health: Health{
			Interval:        time.Second,
			Timeout:         500 * time.Millisecond,
			Path:            "/health",
			EjectAfter:      3,
			EjectTime:       time.Second,
			MaxEjectTime:    30 * time.Second,
			MaxEjectedShare: 0.5,
		},
		Scrape:      Scrape{Interval: 100 * time.Millisecond, Timeout: 80 * time.Millisecond, MaxBytes: 4 * MiB, MaxAge: 500 * time.Millisecond},
		Tokenize:    Tokenize{Workers: 0, Queue: 1024, Timeout: 20 * time.Millisecond},
		DecisionLog: DecisionLog{Path: "", Sample: 0.01, Buffer: 4096},
		Record:      Record{RotateBytes: 256 * MiB, RotateInterval: time.Hour, FlushInterval: 10 * time.Second, Sample: 1, Buffer: 65536},
		DNSRefresh:  10 * time.Second,
		Tracing:     Tracing{SampleRatio: 0.1, Timeout: 10 * time.Second, ServiceName: "inferrail"},
		EPP: EPP{Listen: "127.0.0.1:9002", SecureServing: true, Pool: InferencePool{Namespace: "default"},
			LeaderElection: LeaderElection{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}},
		Auth: AuthNone,
		Tenancy: Tenancy{
			AuthCacheTTL:       5 * time.Second,
			UsageFlushInterval: 10 * time.Second,
			UsageBuffer:        65536,
			Window:             time.Minute,
			LeaseTTL:           30 * time.Second,
			Redis:              Redis{KeyPrefix: "ir", Timeout: 20 * time.Millisecond, OnRedisError: "closed", Gateways: 1},
			Ledger:             Ledger{Backend: "local", LeaseTTL: 10 * time.Second, RefreshInterval: 250 * time.Millisecond, OnRedisError: "closed"},
		},
	}
}

// DefaultMaxN is a model's max_n unless set: OpenAI's bound on n.
const DefaultMaxN = 128

// MaxMaxN bounds max_n.
const MaxMaxN = 1 << 16

// DefaultModel returns the defaults of a model's fields (no name, no
// replicas); Parse starts every entry of models from it.
func DefaultModel() Model {
	g := gateway.DefaultConfig()
	return Model{
		Policy:         "cost_model",
		Tokenizer:      BuiltinSim,
		Index:          IndexApproximate,
		BlockSize:      16,
		MaxConcurrency: 256,
		MaxPending:     64,
		Admission:      string(g.Admission),
		Overcommit:     g.Overcommit,
		OutputQuantile: g.OutputQuantile,
		MaxPriority:    g.Queue.MaxPriority,
		MaxN:           DefaultMaxN,
		Queue:          Queue{MaxRequests: g.Queue.MaxRequests, MaxBytes: ByteSize(g.Queue.MaxBytes), Timeout: g.Queue.Timeout},
		ResponseCache:  respcache.DefaultConfig(),
		SemanticCache:  semcache.DefaultConfig(),
		PD:             PD{Decider: g.PD.Decider, NonCachedTokens: g.PD.NonCachedTokens, MinPromptTokens: g.PD.MinPromptTokens, PrefillTimeout: time.Minute},
	}
}

// DefaultDNSGroup returns the defaults of a DNS group's fields; Parse
// starts every entry of dns from it.
func DefaultDNSGroup() DNSGroup { return DNSGroup{Scheme: "http"} }

// Parse reads a configuration from YAML. Decoding is strict: an unknown or
// repeated key, or a value of the wrong type, is an error. Fields the
// document leaves out (or leaves empty, as in "listen:") keep their defaults
// (Default, DefaultModel, DefaultDNSGroup); a replica without a name is named
// after its URL's host:port. The result is validated. On error every problem
// is reported, each a *FieldError, joined with errors.Join. Relative paths
// (tokenizer, profile, semantic_cache.embeddings.api_key_file,
// decision_log.path, record.path, record.salt_file) are taken from the working
// directory; Load takes them from the file's.
func Parse(data []byte) (*Config, error) {
	return parse(data, "")
}

// Load reads and parses the YAML file at path (see Parse). Relative paths
// in it are resolved against the file's directory, and every error is
// prefixed with path (and the line, where known).
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read live config: %w", err)
	}
	c, err := parse(data, filepath.Dir(path))
	if err == nil {
		return c, nil
	}
	var fes []*FieldError
	if fieldErrors(err, &fes) {
		errs := make([]error, len(fes))
		for i, fe := range fes {
			fe.File = path
			errs[i] = fe
		}
		return nil, errors.Join(errs...)
	}
	return nil, fmt.Errorf("%s: %w", path, err)
}

// fieldErrors collects the FieldErrors err joins into fes; it reports
// whether err is made of FieldErrors only.
func fieldErrors(err error, fes *[]*FieldError) bool {
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	for _, e := range list {
		fe, ok := e.(*FieldError)
		if !ok {
			return false
		}
		*fes = append(*fes, fe)
	}
	return len(list) > 0
}

func parse(data []byte, dir string) (*Config, error) {
	c := Default()
	d := newDecoder()
	if err := d.document(data, &c); err != nil {
		return nil, err
	}
	if len(d.errs) > 0 {
		return nil, d.joined()
	}
	c.deriveNames()
	if dir != "" {
		c.resolvePaths(dir)
	}
	if err := c.Validate(); err != nil {
		var fes []*FieldError
		if fieldErrors(err, &fes) {
			for _, fe := range fes {
				fe.Line = d.line(fe.Path)
			}
		}
		return nil, err
	}
	return &c, nil
}

// deriveNames names every unnamed replica after its URL's host:port.
func (c *Config) deriveNames() {
	for i := range c.Models {
		for j := range c.Models[i].Replicas {
			r := &c.Models[i].Replicas[j]
			if r.Name == "" {
				if u, err := parseURL(r.URL); err == nil {
					r.Name = u.Host
				}
			}
		}
	}
}

// resolvePaths makes the relative file paths of c relative to dir.
func (c *Config) resolvePaths(dir string) {
	join := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	c.DecisionLog.Path = join(c.DecisionLog.Path)
	c.Record.Path, c.Record.SaltFile = join(c.Record.Path), join(c.Record.SaltFile)
	c.TLS.CertFile, c.TLS.KeyFile = join(c.TLS.CertFile), join(c.TLS.KeyFile)
	c.AdminTLS.CertFile, c.AdminTLS.KeyFile = join(c.AdminTLS.CertFile), join(c.AdminTLS.KeyFile)
	c.AdminTokenFile = join(c.AdminTokenFile)
	c.Tenancy.Redis.PasswordFile = join(c.Tenancy.Redis.PasswordFile)
	c.Tenancy.Store = joinStore(dir, c.Tenancy.Store)
	for i := range c.Models {
		m := &c.Models[i]
		if !strings.HasPrefix(m.Tokenizer, "builtin:") {
			m.Tokenizer = join(m.Tokenizer)
		}
		m.SemanticCache.Embeddings.APIKeyFile = join(m.SemanticCache.Embeddings.APIKeyFile)
		m.APIKeyFile = join(m.APIKeyFile)
		if !isPresetName(m.Profile) {
			m.Profile = join(m.Profile)
		}
	}
}

// joinStore makes a relative SQLite store path relative to dir; a
// postgres:// URL, an absolute path and "" are kept.
func joinStore(dir, store string) string {
	if store == "" || strings.Contains(store, "://") && !strings.HasPrefix(store, "sqlite://") {
		return store
	}
	path, scheme := store, ""
	if rest, ok := strings.CutPrefix(store, "sqlite://"); ok {
		path, scheme = rest, "sqlite://"
	}
	if path == "" || filepath.IsAbs(path) {
		return store
	}
	return scheme + filepath.Join(dir, path)
}

// isPresetName reports whether a profile names a preset (MODEL@GPU) rather
// than a file.
func isPresetName(p string) bool {
	return strings.Contains(p, "@") && !strings.HasSuffix(p, ".yaml") && !strings.HasSuffix(p, ".yml")
}

// Ready returns the window of /readyz: health.ready_window, or twice the
// probe interval plus its timeout.
func (h Health) Ready() time.Duration {
	if h.ReadyWindow > 0 {
		return h.ReadyWindow
	}
	return 2*h.Interval + h.Timeout
}

// bytesPerToken bounds the bytes of an ordinary token when
// tokenize.max_prompt_bytes derives from max_model_len.
const bytesPerToken = 8

// PromptBytes returns the longest prompt (in bytes) tokenized at the edge
// for model m: tokenize.max_prompt_bytes, else 8 bytes per token of m's
// max_model_len, else 1MiB.
func (t Tokenize) PromptBytes(m *Model) int { return t.PromptBytesFor(m.MaxModelLen) }

// PromptBytesFor is PromptBytes for a model whose context is maxModelLen
// tokens (0: unknown), as configured or learned from its engines.
func (t Tokenize) PromptBytesFor(maxModelLen int) int {
	switch {
	case t.MaxPromptBytes > 0:
		return int(t.MaxPromptBytes)
	case maxModelLen > 0:
		return bytesPerToken * maxModelLen
	}
	return int(MiB)
}

// Model returns the model called name, or whose alias or adapter name is.
func (c *Config) Model(name string) (*Model, bool) {
	for i := range c.Models {
		m := &c.Models[i]
		if m.Name == name {
			return m, true
		}
		if slices.Contains(m.Aliases, name) || slices.Contains(m.Adapters, name) {
			return m, true
		}
	}
	return nil, false
}

// Limits returns the caps of in-flight and pending requests that apply to
// replica r of m: r's own where set, else m's.
func (m *Model) Limits(r *Replica) (maxConcurrency, maxPending int) {
	maxConcurrency, maxPending = m.MaxConcurrency, m.MaxPending
	if r.MaxConcurrency > 0 {
		maxConcurrency = r.MaxConcurrency
	}
	if r.MaxPending > 0 {
		maxPending = r.MaxPending
	}
	return maxConcurrency, maxPending
}

// KVCapacity returns the KV capacity in blocks configured for replica r of
// m: r's own where set, else m's; 0 means the engine's report.
func (m *Model) KVCapacity(r *Replica) int {
	if r.KVCapacityBlocks > 0 {
		return r.KVCapacityBlocks
	}
	return m.KVCapacityBlocks
}

// Summary describes the models, one line each, for `inferrail live --check`:
// name, aliases, policy, index, tokenizer, block size, profile, limits,
// admission and queue (max requests/bytes/timeout), then the replicas and
// the DNS groups (sections without entries are left out).
func (c *Config) Summary() string {
	var b strings.Builder
	for i := range c.Models {
		m := &c.Models[i]
		b.WriteString(m.Name)
		if len(m.Aliases) > 0 {
			fmt.Fprintf(&b, " (aliases %s)", strings.Join(m.Aliases, ", "))
		}
		if len(m.Adapters) > 0 {
			fmt.Fprintf(&b, " (LoRA adapters %s)", strings.Join(m.Adapters, ", "))
		}
		fmt.Fprintf(&b, ": policy %s, index %s, tokenizer %s, block_size %d", m.Policy, m.Index, m.Tokenizer, m.BlockSize)
		if m.ShadowPolicy != "" {
			fmt.Fprintf(&b, ", shadow_policy %s", m.ShadowPolicy)
		}
		if m.Profile != "" {
			fmt.Fprintf(&b, ", profile %s", m.Profile)
		}
		if m.SessionAffinity {
			b.WriteString(", session_affinity")
		}
		fmt.Fprintf(&b, ", max_concurrency %d, max_pending %d", m.MaxConcurrency, m.MaxPending)
		fmt.Fprintf(&b, ", admission %s", m.Admission)
		if m.KVCapacityBlocks > 0 {
			fmt.Fprintf(&b, ", kv_capacity_blocks %d", m.KVCapacityBlocks)
		}
		if m.MaxModelLen > 0 {
			fmt.Fprintf(&b, ", max_model_len %d", m.MaxModelLen)
		}
		fmt.Fprintf(&b, ", queue %d/%v/%v", m.Queue.MaxRequests, m.Queue.MaxBytes, m.Queue.Timeout)
		if !m.KeyLimits.Zero() {
			fmt.Fprintf(&b, ", key_limits rpm %d tpm %d max_concurrency %d", m.KeyLimits.RPM, m.KeyLimits.TPM, m.KeyLimits.MaxConcurrency)
		}
		if rc := &m.ResponseCache; rc.Enabled {
			fmt.Fprintf(&b, ", response_cache %s ttl %v max_temperature %v", rc.Store, rc.TTL, rc.MaxTemperature)
		}
		if sc := &m.SemanticCache; sc.Enabled {
			fmt.Fprintf(&b, ", semantic_cache %s threshold %v", sc.Store, sc.Threshold)
		}
		if len(m.Replicas) > 0 {
			fmt.Fprintf(&b, "; %s:", plural(len(m.Replicas), "replica"))
		}
		for j := range m.Replicas {
			r := &m.Replicas[j]
			fmt.Fprintf(&b, " %s=%s", r.Name, r.URL)
			var extra []string
			if r.MaxConcurrency > 0 {
				extra = append(extra, "max_concurrency "+strconv.Itoa(r.MaxConcurrency))
			}
			if r.MaxPending > 0 {
				extra = append(extra, "max_pending "+strconv.Itoa(r.MaxPending))
			}
			if r.KVCapacityBlocks > 0 {
				extra = append(extra, "kv_capacity_blocks "+strconv.Itoa(r.KVCapacityBlocks))
			}
			if r.KVEvents != "" {
				extra = append(extra, "kv_events "+r.KVEvents)
			}
			if len(extra) > 0 {
				fmt.Fprintf(&b, " (%s)", strings.Join(extra, ", "))
			}
		}
		if len(m.DNS) > 0 {
			fmt.Fprintf(&b, "; %s:", plural(len(m.DNS), "dns group"))
		}
		for j := range m.DNS {
			g := &m.DNS[j]
			fmt.Fprintf(&b, " %s=%s://%s:%d", g.Name, g.Scheme, g.Host, g.Port)
			if g.KVEventsPort > 0 {
				fmt.Fprintf(&b, " (kv_events port %d)", g.KVEventsPort)
			}
		}
		b.WriteByte('\n')
	}
	if t := c.tenancySummary(); t != "" {
		b.WriteString(t)
		b.WriteByte('\n')
	}
	return b.String()
}

// tenancySummary is Summary's line on auth, the store and the limiter, ""
// when tenancy is off. The store's password never shows.
func (c *Config) tenancySummary() string {
	t := &c.Tenancy
	limited := !t.Limits.Global.Zero()
	for i := range c.Models {
		limited = limited || !c.Models[i].KeyLimits.Zero()
	}
	if c.Auth != AuthKeys && t.Store == "" && !limited {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "tenancy: auth %s", c.Auth)
	if t.Store != "" {
		if d, err := tenancy.ParseDSN(t.Store); err == nil {
			fmt.Fprintf(&b, ", store %s %s", d.Backend, d.String())
		}
	}
	switch {
	case c.Auth != AuthKeys && !limited:
		b.WriteString(", no limits")
	case t.Redis.Address != "":
		fmt.Fprintf(&b, ", limiter redis %s (on_redis_error %s, gateways %d)", t.Redis.Address, t.Redis.OnRedisError, t.Redis.Gateways)
	default:
		b.WriteString(", limiter in process")
	}
	fmt.Fprintf(&b, ", window %v", t.Window)
	if g := t.Limits.Global; !g.Zero() {
		fmt.Fprintf(&b, ", global rpm %d tpm %d max_concurrency %d", g.RPM, g.TPM, g.MaxConcurrency)
	}
	return b.String()
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// ByteSize is a number of bytes (package bytesize): in YAML an integer, or
// a number and a unit such as "4MiB".
type ByteSize = bytesize.Size

// Byte size units.
const (
	KiB = bytesize.KiB
	MiB = bytesize.MiB
	GiB = bytesize.GiB
)
