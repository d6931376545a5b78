package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/inferrail/inferrail/calibrate"
	"github.com/inferrail/inferrail/respcache"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/semcache"
	"github.com/inferrail/inferrail/tenancy"
)

// Bounds that keep a typo from asking for absurd resources.
const (
	maxAttempts   = 10
	maxSize       = GiB
	maxCount      = 1 << 20
	maxWorkers    = 4096
	maxEjectAfter = 1000
	maxBlockSize  = 1024
	// maxModelLen and maxKVBlocks are the engine's own bounds
	// (engine.Config.Validate); maxOvercommit is the gateway core's.
	maxModelLen   = 1 << 26
	maxKVBlocks   = 1 << 24
	maxOvercommit = 4
	// maxProfileBytes bounds a profile file read at validation.
	maxProfileBytes = 1 << 20
	maxConnections  = 1 << 22
	maxStreams      = 1 << 16
	// maxBackground bounds max_background_responses: each is read once a
	// second.
	maxBackground = 1 << 16
	// maxTokenBytes bounds the admin token file.
	maxTokenBytes = 4096
)

// tls checks that a certificate and its key are both named, and exist.
func (k *checker) tls(path string, t TLS) {
	switch {
	case t.CertFile == "" && t.KeyFile == "":
		return
	case t.CertFile == "":
		k.fail(path+".cert_file", "required with %s.key_file: the PEM certificate (chain) file", path)
		return
	case t.KeyFile == "":
		k.fail(path+".key_file", "required with %s.cert_file: the PEM private key file", path)
		return
	}
	for _, f := range []struct{ field, file string }{{"cert_file", t.CertFile}, {"key_file", t.KeyFile}} {
		if f.file == "" {
			continue
		}
		if st, err := os.Stat(f.file); err != nil {
			k.fail(path+"."+f.field, "%v", err)
		} else if !st.Mode().IsRegular() {
			k.fail(path+"."+f.field, "%q is not a regular file", f.file)
		}
	}
}

// tokenFile checks that the admin token file holds one token.
func (k *checker) tokenFile(path, file string) {
	if _, err := ReadToken(file); err != nil {
		k.fail(path, "%v", err)
	}
}

// ReadToken reads a bearer token file: one line of at least 16 visible
// characters, surrounding space trimmed.
func ReadToken(file string) (string, error) {
	st, err := os.Stat(file)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() || st.Size() > maxTokenBytes {
		return "", fmt.Errorf("%q must be a regular file of at most %d bytes holding one token", file, maxTokenBytes)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < 16 || strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return "", fmt.Errorf("%q must hold one token of at least 16 printable ASCII characters without spaces", file)
	}
	return tok, nil
}

// loopback reports whether a listen address only binds a loopback address
// (127.0.0.0/8, ::1 or localhost); ":8080" and "0.0.0.0:8080" are not.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checker collects the FieldErrors of one Validate call.
type checker struct {
	errs []error
	// poolModel is the model whose replicas epp.pool's pods are ("" without
	// a pool): it needs no replicas or dns of its own; pool is epp.pool.
	poolModel string
	pool      InferencePool
}

func (k *checker) fail(path, format string, args ...any) {
	k.errs = append(k.errs, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (k *checker) intIn(path string, v, lo, hi int) {
	if v < lo || v > hi {
		k.fail(path, "must be an integer from %d to %d, got %d", lo, hi, v)
	}
}

func (k *checker) positive(path string, d time.Duration) {
	if d <= 0 {
		k.fail(path, `must be a positive duration such as "100ms", got %v`, d)
	}
}

func (k *checker) nonNegative(path string, d time.Duration) {
	if d < 0 {
		k.fail(path, "must be 0 or a positive duration, got %v", d)
	}
}

// atMost checks d <= limit, where limit is the field limitPath; a limit
// that is not positive is reported on its own.
func (k *checker) atMost(path string, d time.Duration, limitPath string, limit time.Duration) {
	if limit > 0 && d > limit {
		k.fail(path, "must not exceed %s (%v), got %v", limitPath, limit, d)
	}
}

func (k *checker) share(path string, v float64) {
	if !(v >= 0 && v <= 1) { // also catches NaN
		k.fail(path, "must be a share from 0 to 1, got %v", v)
	}
}

func (k *checker) size(path string, v ByteSize) {
	if v < 1 || v > maxSize {
		k.fail(path, "must be a size from 1 byte to %v, got %d", maxSize, int64(v))
	}
}

// Validate checks every field of c and returns every problem, each a
// *FieldError naming its YAML path, joined with errors.Join; nil if c is
// valid. It reads the file system to check that tokenizer and profile
// paths exist and that the decision log's directory does.
func (c *Config) Validate() error {
	k := &checker{}
	k.listen("listen", c.Listen, false)
	k.listen("admin_listen", c.AdminListen, true)
	if c.AdminListen != "" && c.AdminListen == c.Listen && !strings.HasSuffix(c.Listen, ":0") {
		k.fail("admin_listen", "must differ from listen (%s), or be \"\" to turn the admin endpoints off", c.Listen)
	}
	k.nonNegative("drain_timeout", c.DrainTimeout)
	k.positive("request_timeout", c.RequestTimeout)
	k.size("max_body_bytes", c.MaxBodyBytes)

	k.positive("read_header_timeout", c.ReadHeaderTimeout)
	k.positive("read_timeout", c.ReadTimeout)
	k.positive("write_timeout", c.WriteTimeout)
	k.positive("first_byte_timeout", c.FirstByteTimeout)
	k.positive("stream_idle_timeout", c.StreamIdleTimeout)
	k.positive("idle_timeout", c.IdleTimeout)
	k.nonNegative("drain_delay", c.DrainDelay)
	k.intIn("max_connections", c.MaxConnections, 0, maxConnections)
	k.intIn("max_connections_per_client", c.MaxConnectionsPerClient, 0, maxConnections)
	if c.MaxConnections > 0 && c.MaxConnectionsPerClient > c.MaxConnections {
		k.fail("max_connections_per_client", "must not exceed max_connections (%d), got %d", c.MaxConnections, c.MaxConnectionsPerClient)
	}
	k.intIn("flood_connections_per_client", c.FloodConnectionsPerClient, 0, maxConnections)
	k.intIn("max_concurrent_streams", c.MaxConcurrentStreams, 1, maxStreams)
	k.intIn("max_background_responses", c.MaxBackgroundResponses, 1, maxBackground)
	k.size("max_inflight_body_bytes", c.MaxInflightBodyBytes)
	if c.MaxBodyBytes <= maxSize && c.MaxInflightBodyBytes < c.MaxBodyBytes {
		k.fail("max_inflight_body_bytes", "must be at least max_body_bytes (%v), or no body of that size is ever taken, got %v", c.MaxBodyBytes, c.MaxInflightBodyBytes)
	}
	k.size("response_buffer_bytes", c.ResponseBufferBytes)
	if c.Procs != "adaptive" && c.Procs != "fixed" {
		k.fail("procs", "must be adaptive or fixed, got %q", c.Procs)
	}
	if c.Sysmon != "awake" && c.Sysmon != "go" {
		k.fail("sysmon", "must be awake or go, got %q", c.Sysmon)
	}
	k.tls("tls", c.TLS)
	k.tls("admin_tls", c.AdminTLS)
	if c.AdminTokenFile != "" {
		k.tokenFile("admin_token_file", c.AdminTokenFile)
	} else if _, _, err := net.SplitHostPort(c.AdminListen); err == nil && !loopback(c.AdminListen) {
		k.fail("admin_token_file", "required when admin_listen (%s) is not a loopback address: a file holding the bearer token the admin endpoints ask for; or listen on 127.0.0.1", c.AdminListen)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		k.fail("log.format", `must be "text" or "json", got %q`, c.Log.Format)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		k.fail("log.level", `must be "debug", "info", "warn" or "error", got %q`, c.Log.Level)
	}
	k.share("log.access_sample", c.Log.AccessSample)

	k.intIn("retry.attempts", c.Retry.Attempts, 1, maxAttempts)
	k.nonNegative("retry.backoff", c.Retry.Backoff)
	k.nonNegative("retry.max_backoff", c.Retry.MaxBackoff)
	if c.Retry.MaxBackoff < c.Retry.Backoff {
		k.fail("retry.max_backoff", "must be at least retry.backoff (%v), got %v", c.Retry.Backoff, c.Retry.MaxBackoff)
	}

	h := &c.Health
	k.positive("health.interval", h.Interval)
	k.positive("health.timeout", h.Timeout)
	k.atMost("health.timeout", h.Timeout, "health.interval", h.Interval)
	if !strings.HasPrefix(h.Path, "/") || strings.ContainsFunc(h.Path, unicode.IsSpace) {
		k.fail("health.path", "must be an HTTP path starting with / and without spaces, such as /health, got %q", h.Path)
	}
	k.intIn("health.eject_after", h.EjectAfter, 1, maxEjectAfter)
	k.positive("health.eject_time", h.EjectTime)
	if h.MaxEjectTime < h.EjectTime {
		k.fail("health.max_eject_time", "must be at least health.eject_time (%v), got %v", h.EjectTime, h.MaxEjectTime)
	}
	k.share("health.max_ejected_share", h.MaxEjectedShare)
	k.nonNegative("health.ready_window", h.ReadyWindow)

	s := &c.Scrape
	k.positive("scrape.interval", s.Interval)
	k.positive("scrape.timeout", s.Timeout)
	k.atMost("scrape.timeout", s.Timeout, "scrape.interval", s.Interval)
	k.size("scrape.max_bytes", s.MaxBytes)
	if s.MaxAge < s.Interval {
		k.fail("scrape.max_age", "must be at least scrape.interval (%v), or every report counts as missing, got %v", s.Interval, s.MaxAge)
	}

	k.intIn("tokenize.workers", c.Tokenize.Workers, 0, maxWorkers)
	k.intIn("tokenize.queue", c.Tokenize.Queue, 1, maxCount)
	k.positive("tokenize.timeout", c.Tokenize.Timeout)
	if c.Tokenize.MaxPromptBytes != 0 {
		k.size("tokenize.max_prompt_bytes", c.Tokenize.MaxPromptBytes)
	}

	k.decisionLog(&c.DecisionLog)
	k.record(&c.Record)
	k.positive("dns_refresh", c.DNSRefresh)
	k.tracing(&c.Tracing)
	k.listen("epp.listen", c.EPP.Listen, false)
	k.tls("epp.tls", c.EPP.TLS)
	if !c.EPP.SecureServing && (c.EPP.TLS.CertFile != "" || c.EPP.TLS.KeyFile != "") {
		k.fail("epp.tls", "is served only with epp.secure_serving: true (false serves plaintext h2c)")
	}
	if p := c.EPP.Pool; p.Name != "" {
		k.poolModel, k.pool = p.Model, p
		if p.Model == "" && len(c.Models) == 1 {
			k.poolModel = c.Models[0].Name
		}
		if p.Namespace == "" {
			k.fail("epp.pool.namespace", "must name the pool's namespace, such as default")
		}
		if p.Model == "" && len(c.Models) != 1 {
			k.fail("epp.pool.model", "must name the model whose replicas the pool's pods are, when several models are configured")
		} else if _, ok := c.Model(p.Model); p.Model != "" && !ok {
			k.fail("epp.pool.model", "must name a configured model, got %q", p.Model)
		}
		k.intIn("epp.pool.kv_events_port", p.KVEventsPort, 0, 65535)
		k.intIn("epp.pool.kv_events_replay_port", p.KVEventsReplayPort, 0, 65535)
		switch {
		case p.KVEventsListen != "":
			k.zmqEndpoint("epp.pool.kv_events_listen", p.KVEventsListen, true)
			if p.KVEventsPort != 0 || p.KVEventsTopic != "" {
				k.fail("epp.pool.kv_events_listen", "set either kv_events_listen (every pod's engine connects to the picker, each on its topic kv@POD_IP:PORT@MODEL) or kv_events_port and kv_events_topic (the picker connects to each pod), not both")
			}
		case p.KVEventsPort == 0 && (p.KVEventsReplayPort != 0 || p.KVEventsTopic != ""):
			k.fail("epp.pool.kv_events_port", "required with kv_events_replay_port or kv_events_topic (the port each pod publishes its KV events on)")
		}
	}
	k.intIn("epp.fallback_endpoints", c.EPP.FallbackEndpoints, 0, maxFallbackEndpoints)
	if le := c.EPP.LeaderElection; le.Enabled {
		const lp = "epp.leader_election"
		if c.EPP.Pool.Name == "" {
			k.fail(lp+".enabled", "needs epp.pool: the lease is held in the InferencePool's namespace")
		}
		if errs := validation.IsDNS1123Subdomain(le.LeaseName); le.LeaseName != "" && len(errs) > 0 {
			k.fail(lp+".lease_name", "%q is not a Lease name: %s", le.LeaseName, strings.Join(errs, "; "))
		}
		k.positive(lp+".lease_duration", le.LeaseDuration)
		k.positive(lp+".renew_deadline", le.RenewDeadline)
		k.positive(lp+".retry_period", le.RetryPeriod)
		switch {
		case le.RenewDeadline > 0 && le.LeaseDuration <= le.RenewDeadline:
			k.fail(lp+".lease_duration", "must be longer than renew_deadline (%v), got %v", le.RenewDeadline, le.LeaseDuration)
		case le.RetryPeriod > 0 && float64(le.RenewDeadline) <= 1.2*float64(le.RetryPeriod):
			k.fail(lp+".renew_deadline", "must be longer than 1.2 retry_period (%v), got %v", le.RetryPeriod, le.RenewDeadline)
		}
	}

	k.models(c.Models)
	k.tenancy(c)
	return errors.Join(k.errs...)
}

// tracing checks the tracing section.
func (k *checker) tracing(t *Tracing) {
	if t.Endpoint != "" {
		u, err := url.Parse(t.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			k.fail("tracing.endpoint", "must be an http:// or https:// URL of an OTLP/HTTP traces receiver, such as http://127.0.0.1:4318/v1/traces, got %q", t.Endpoint)
		}
	}
	k.share("tracing.sample_ratio", t.SampleRatio)
	k.positive("tracing.timeout", t.Timeout)
	if t.ServiceName == "" {
		k.fail("tracing.service_name", "must not be empty (the default is inferrail)")
	}
	for name := range t.Headers {
		if name == "" || strings.ContainsAny(name, " \t\r\n:") {
			k.fail("tracing.headers", "header names must be tokens without spaces or colons, got %q", name)
		}
	}
}

// listen checks a host:port listen address.
func (k *checker) listen(path, addr string, mayBeEmpty bool) {
	if addr == "" {
		if !mayBeEmpty {
			k.fail(path, "must be a host:port address such as 127.0.0.1:8080 or :8080, got \"\"")
		}
		return
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		var p int
		if p, err = strconv.Atoi(port); err == nil && (p < 0 || p > 65535) {
			err = errors.New("port out of range")
		}
	}
	if err != nil {
		k.fail(path, "must be a host:port address with a numeric port, such as 127.0.0.1:8080 or :8080, got %q", addr)
	}
}

func (k *checker) decisionLog(l *DecisionLog) {
	k.share("decision_log.sample", l.Sample)
	k.intIn("decision_log.buffer", l.Buffer, 1, maxCount)
	if l.Path == "" {
		return
	}
	if st, err := os.Stat(l.Path); err == nil && st.IsDir() {
		k.fail("decision_log.path", "%q is a directory; name a file in it", l.Path)
		return
	}
	dir := filepath.Dir(l.Path)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		k.fail("decision_log.path", "directory %q does not exist; create it or change the path", dir)
	}
}

// Bounds of the record section.
const (
	minRotateBytes = 64 * KiB
	maxRotateBytes = 1 << 40
	// MinSaltLen is the shortest record salt: a short one could be guessed,
	// and with it the prompts behind the recorded hashes.
	MinSaltLen   = 16
	maxSaltBytes = 4096
)

func (k *checker) record(r *Record) {
	if r.Path == "" {
		return
	}
	if st, err := os.Stat(r.Path); err == nil && st.IsDir() {
		k.fail("record.path", "%q is a directory; name a file in it, such as %s", r.Path, filepath.Join(r.Path, "traffic.parquet"))
	} else if dir := filepath.Dir(r.Path); !isDir(dir) {
		k.fail("record.path", "directory %q does not exist; create it or change the path", dir)
	}
	if r.RotateBytes < minRotateBytes || r.RotateBytes > maxRotateBytes {
		k.fail("record.rotate_bytes", "must be a size from 64KiB to 1TiB, such as 256MiB, got %d", int64(r.RotateBytes))
	}
	k.positive("record.rotate_interval", r.RotateInterval)
	k.positive("record.flush_interval", r.FlushInterval)
	k.atMost("record.flush_interval", r.FlushInterval, "record.rotate_interval", r.RotateInterval)
	if !(r.Sample > 0 && r.Sample <= 1) {
		k.fail("record.sample", "must be a share above 0 and at most 1 (set path to \"\" to record nothing), got %v", r.Sample)
	}
	k.intIn("record.buffer", r.Buffer, 1, maxCount)
	switch {
	case r.Salt != "" && r.SaltFile != "":
		k.fail("record.salt", "set salt or salt_file, not both")
	case r.Salt == "" && r.SaltFile == "":
		k.fail("record.salt", "required with record.path: a secret of at least %d characters that keys the recorded hashes (or record.salt_file naming a file that holds it)", MinSaltLen)
	case r.Salt != "":
		if err := checkSalt(r.Salt); err != nil {
			k.fail("record.salt", "%v", err)
		}
	default:
		if _, err := ReadSalt(r.SaltFile); err != nil {
			k.fail("record.salt_file", "%v", err)
		}
	}
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

func checkSalt(salt string) error {
	if len(salt) < MinSaltLen {
		return fmt.Errorf("must be at least %d characters, got %d", MinSaltLen, len(salt))
	}
	return nil
}

// ReadSalt reads a record salt file: a regular file of at most 4096 bytes
// whose content, surrounding space trimmed, is at least MinSaltLen
// characters.
func ReadSalt(file string) (string, error) {
	st, err := os.Stat(file)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() || st.Size() > maxSaltBytes {
		return "", fmt.Errorf("%q must be a regular file of at most %d bytes holding the salt", file, maxSaltBytes)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	salt := strings.TrimSpace(string(b))
	if err := checkSalt(salt); err != nil {
		return "", fmt.Errorf("%q: the salt %w", file, err)
	}
	return salt, nil
}

// RecordSalt is the salt the record section names (salt, or salt_file's
// content); call it on a validated configuration.
func (r *Record) RecordSalt() (string, error) {
	if r.Salt != "" {
		return r.Salt, nil
	}
	salt, err := ReadSalt(r.SaltFile)
	if err != nil {
		return "", fmt.Errorf("record.salt_file: %w", err)
	}
	return salt, nil
}

func (k *checker) models(models []Model) {
	if len(models) == 0 {
		k.fail("models", "at least one model is required")
		return
	}
	owner := map[string]string{} // name or alias -> the path that claimed it
	claim := func(path, name string) {
		if prev, ok := owner[name]; ok {
			k.fail(path, "%q is already used by %s; names and aliases must be unique across all models", name, prev)
			return
		}
		owner[name] = path
	}
	for i := range models {
		m := &models[i]
		p := "models[" + strconv.Itoa(i) + "]"
		if msg := nameProblem(m.Name); msg != "" {
			k.fail(p+".name", "%s", msg)
		} else {
			claim(p+".name", m.Name)
		}
		for _, names := range []struct {
			key  string
			list []string
		}{{"aliases", m.Aliases}, {"adapters", m.Adapters}} {
			for j, a := range names.list {
				ap := p + "." + names.key + "[" + strconv.Itoa(j) + "]"
				if msg := nameProblem(a); msg != "" {
					k.fail(ap, "%s", msg)
					continue
				}
				claim(ap, a)
			}
		}
		k.model(p, m)
	}
}

// nameProblem says what is wrong with a model name or alias, "" if nothing.
func nameProblem(s string) string {
	switch {
	case s == "":
		return "required: the model name clients send"
	case strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return fmt.Sprintf("must not contain spaces or control characters, got %q", s)
	}
	return ""
}

// maxFallbackEndpoints bounds epp.fallback_endpoints.
const maxFallbackEndpoints = 8

func (k *checker) model(p string, m *Model) {
	if names := router.Names(); !slices.Contains(names, m.Policy) {
		k.fail(p+".policy", "unknown policy %q; want one of %s", m.Policy, strings.Join(names, ", "))
	}
	if names := router.Names(); m.ShadowPolicy != "" && !slices.Contains(names, m.ShadowPolicy) {
		k.fail(p+".shadow_policy", "unknown policy %q; want one of %s, or leave it out for no shadow", m.ShadowPolicy, strings.Join(names, ", "))
	}
	k.tokenizer(p+".tokenizer", m.Tokenizer)
	events := m.Index == IndexEvents
	if m.Index != IndexApproximate && !events {
		k.fail(p+".index", "must be %q or %q, got %q", IndexApproximate, IndexEvents, m.Index)
	}
	k.intIn(p+".block_size", m.BlockSize, 1, maxBlockSize)
	k.profile(p+".profile", m.Profile)
	k.intIn(p+".max_concurrency", m.MaxConcurrency, 1, maxCount)
	k.intIn(p+".max_pending", m.MaxPending, 1, maxCount)
	k.admission(p, m)
	k.caches(p, m)
	k.pd(p, m)
	if len(m.Replicas) == 0 && len(m.DNS) == 0 && (m.Name == "" || m.Name != k.poolModel) {
		k.fail(p, "needs at least one entry in replicas or dns")
	}
	if events && m.Name != "" && m.Name == k.poolModel && k.pool.KVEventsPort == 0 && k.pool.KVEventsListen == "" && m.KVEventsListen == "" {
		k.fail("epp.pool.kv_events_port", "required with index: events for %s, the pool's model (the port each pod's engine publishes its KV events on, such as 5557), or kv_events_listen (an endpoint the pods' engines connect to); or set its index: approximate", m.Name)
	}
	central := m.KVEventsListen != ""
	if central {
		k.zmqEndpoint(p+".kv_events_listen", m.KVEventsListen, true)
		if !events {
			k.fail(p+".kv_events_listen", "needs index: events; set it or remove kv_events_listen")
		}
	}

	names := map[string]int{}
	urls := map[string]int{}
	for j := range m.Replicas {
		r := &m.Replicas[j]
		rp := p + ".replicas[" + strconv.Itoa(j) + "]"
		u, err := parseURL(r.URL)
		if err != nil {
			k.fail(rp+".url", "%v", err)
		} else {
			key := u.String()
			if prev, ok := urls[key]; ok {
				k.fail(rp+".url", "%q is also replicas[%d]'s; list each replica once", r.URL, prev)
			} else {
				urls[key] = j
			}
		}
		switch {
		case r.Name == "" && err != nil:
			// The URL's problem is reported; a name would be derived from it.
		case r.Name == "":
			k.fail(rp+".name", "required (Parse derives it from the url's host:port)")
		case strings.ContainsFunc(r.Name, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
			k.fail(rp+".name", "must not contain spaces or control characters, got %q", r.Name)
		default:
			if prev, ok := names[r.Name]; ok {
				k.fail(rp+".name", "%q is also replicas[%d]'s name; replica names must be unique within a model", r.Name, prev)
			} else {
				names[r.Name] = j
			}
		}
		k.intIn(rp+".max_concurrency", r.MaxConcurrency, 0, maxCount)
		k.intIn(rp+".max_pending", r.MaxPending, 0, maxCount)
		k.intIn(rp+".kv_capacity_blocks", r.KVCapacityBlocks, 0, maxKVBlocks)
		switch {
		case r.KVEvents != "":
			k.zmqEndpoint(rp+".kv_events", r.KVEvents, r.KVEventsBind)
		case central:
			// Its engine connects to kv_events_listen; kv_events_topic, if
			// set, is the topic it publishes on.
		case events:
			k.fail(rp+".kv_events", "required with index: events (the engine's ZMQ endpoint, such as tcp://10.0.0.1:5557), unless the model has kv_events_listen; or set index: approximate")
		case r.KVEventsReplay != "":
			k.fail(rp+".kv_events_replay", "needs kv_events; set it or remove kv_events_replay")
		case r.KVEventsTopic != "":
			k.fail(rp+".kv_events_topic", "needs kv_events; set it or remove kv_events_topic")
		}
		if r.KVEventsReplay != "" {
			k.zmqEndpoint(rp+".kv_events_replay", r.KVEventsReplay, false)
		}
	}

	groups := map[string]int{}
	for j := range m.DNS {
		g := &m.DNS[j]
		gp := p + ".dns[" + strconv.Itoa(j) + "]"
		switch {
		case g.Name == "":
			k.fail(gp+".name", "required: a name for the group, unique within the model")
		case strings.ContainsFunc(g.Name, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
			k.fail(gp+".name", "must not contain spaces or control characters, got %q", g.Name)
		default:
			if prev, ok := groups[g.Name]; ok {
				k.fail(gp+".name", "%q is also dns[%d]'s name; group names must be unique within a model", g.Name, prev)
			} else {
				groups[g.Name] = j
			}
		}
		if msg := hostProblem(g.Host); msg != "" {
			k.fail(gp+".host", "%s", msg)
		}
		k.intIn(gp+".port", g.Port, 1, 65535)
		if g.Scheme != "http" && g.Scheme != "https" {
			k.fail(gp+".scheme", `must be "http" or "https", got %q`, g.Scheme)
		}
		switch {
		case g.KVEventsPort != 0:
			k.intIn(gp+".kv_events_port", g.KVEventsPort, 1, 65535)
		case central && g.KVEventsTopic != "":
			k.fail(gp+".kv_events_topic", "has no use with the model's kv_events_listen: each address publishes on its own topic, kv@ADDRESS:PORT@MODEL; remove it")
		case central:
		case events:
			k.fail(gp+".kv_events_port", "required with index: events (the port every address publishes KV events on, such as 5557); or set index: approximate")
		case g.KVEventsReplayPort != 0:
			k.fail(gp+".kv_events_replay_port", "needs kv_events_port; set it or remove kv_events_replay_port")
		case g.KVEventsTopic != "":
			k.fail(gp+".kv_events_topic", "needs kv_events_port; set it or remove kv_events_topic")
		}
		if g.KVEventsReplayPort != 0 {
			k.intIn(gp+".kv_events_replay_port", g.KVEventsReplayPort, 1, 65535)
		}
	}
}

// pd checks a model's pd block and its replicas' roles: a model with a
// prefill replica needs one to decode on.
func (k *checker) pd(p string, m *Model) {
	d := &m.PD
	if d.Decider != "" && !slices.Contains(gateway.Deciders(), d.Decider) {
		k.fail(p+".pd.decider", "unknown decider %q; want one of %s", d.Decider, strings.Join(gateway.Deciders(), ", "))
	}
	k.intIn(p+".pd.non_cached_tokens", d.NonCachedTokens, 0, maxModelLen)
	k.intIn(p+".pd.min_prompt_tokens", d.MinPromptTokens, 0, maxModelLen)
	if d.PrefillTimeout <= 0 {
		k.fail(p+".pd.prefill_timeout", `must be positive: the longest a prefill request may take, such as "60s"; got %v`, d.PrefillTimeout)
	}
	firstPrefill, decoders := "", 0
	role := func(path, s string) {
		r, err := gateway.ParseRole(s)
		if err != nil {
			k.fail(path, `unknown role %q; want "prefill", "decode" or "both" (the default)`, s)
			return
		}
		switch {
		case r == gateway.RolePrefill && firstPrefill == "":
			firstPrefill = path
		case r != gateway.RolePrefill:
			decoders++
		}
	}
	for j := range m.Replicas {
		role(p+".replicas["+strconv.Itoa(j)+"].role", m.Replicas[j].Role)
	}
	for j := range m.DNS {
		role(p+".dns["+strconv.Itoa(j)+"].role", m.DNS[j].Role)
	}
	if firstPrefill != "" && decoders == 0 {
		k.fail(firstPrefill, "the model has prefill replicas but none to decode on: give some replica (or dns group) role decode or both")
	}
}

// caches checks a model's response_cache and semantic_cache blocks (each
// package's Validate, its errors under the model's path) and that the
// semantic cache has the exact one in front of it.
func (k *checker) caches(p string, m *Model) {
	each := func(err error, field func(error) (string, string, bool)) {
		if err == nil {
			return
		}
		list := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			list = j.Unwrap()
		}
		for _, e := range list {
			if f, msg, ok := field(e); ok {
				k.fail(p+"."+f, "%s", msg)
			} else {
				k.fail(p, "%v", e)
			}
		}
	}
	each(m.ResponseCache.Validate(), func(e error) (string, string, bool) {
		var fe *respcache.FieldError
		if errors.As(e, &fe) {
			return "response_cache." + fe.Field, fe.Msg, true
		}
		return "", "", false
	})
	each(m.SemanticCache.Validate(), func(e error) (string, string, bool) {
		var fe *semcache.FieldError
		if errors.As(e, &fe) {
			return "semantic_cache." + fe.Field, fe.Msg, true
		}
		return "", "", false
	})
	if m.SemanticCache.Enabled && !m.ResponseCache.Enabled {
		k.fail(p+".semantic_cache.enabled", "needs response_cache.enabled: true: the semantic cache sits behind the exact one, takes its determinism rule and tenant, and stores the answers it captures")
	}
}

// admission checks a model's admission and queue settings.
func (k *checker) admission(p string, m *Model) {
	if _, err := gateway.ParseAdmission(m.Admission); err != nil {
		k.fail(p+".admission", "%v", err)
	}
	if !(m.OutputQuantile >= 0 && m.OutputQuantile <= 1) { // also catches NaN
		k.fail(p+".output_quantile", "must be between 0 (reserve max_tokens) and 1, got %v", m.OutputQuantile)
	}
	if !(m.Overcommit > 0 && m.Overcommit <= maxOvercommit) { // also catches NaN
		k.fail(p+".overcommit", "must be a number above 0 and at most %v (the share of each replica's KV capacity admission may reserve), got %v", maxOvercommit, m.Overcommit)
	}
	k.intIn(p+".max_model_len", m.MaxModelLen, 0, maxModelLen)
	k.intIn(p+".default_max_tokens", m.DefaultMaxTokens, 0, maxModelLen)
	k.intIn(p+".max_n", m.MaxN, 1, MaxMaxN)
	if m.MaxModelLen > 0 && m.DefaultMaxTokens >= m.MaxModelLen {
		k.fail(p+".default_max_tokens", "must be below max_model_len (%d), or 0 for max_model_len minus the prompt, got %d", m.MaxModelLen, m.DefaultMaxTokens)
	}
	k.intIn(p+".max_priority", m.MaxPriority, 0, gateway.MaxPriorityLimit)
	k.intIn(p+".kv_capacity_blocks", m.KVCapacityBlocks, 0, maxKVBlocks)
	q := &m.Queue
	k.intIn(p+".queue.max_requests", q.MaxRequests, 0, gateway.MaxQueueRequests)
	k.size(p+".queue.max_bytes", q.MaxBytes)
	if q.Timeout <= 0 {
		k.fail(p+".queue.timeout", `must be positive: the longest a request waits for a replica, such as "30s"; got %v`, q.Timeout)
	}
}

// parseURL checks an engine's base URL: absolute http:// or https://, with
// a host, no user, query or fragment. Its error is the message.
func parseURL(s string) (*url.URL, error) {
	want := fmt.Sprintf("must be an absolute http:// or https:// URL, got %q", s)
	u, err := url.Parse(s)
	switch {
	case s == "":
		return nil, errors.New(`required: the engine's base URL, such as "http://10.0.0.1:8000"`)
	case err != nil || u.Scheme == "" || u.Opaque != "":
		if !strings.Contains(s, "://") {
			want += fmt.Sprintf(" (write %q)", "http://"+s)
		}
		return nil, errors.New(want)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New(want)
	case u.Host == "" || u.Hostname() == "":
		return nil, fmt.Errorf("must name a host, such as http://10.0.0.1:8000, got %q", s)
	case u.User != nil:
		return nil, fmt.Errorf("must not hold a user or password, got %q", s)
	case u.RawQuery != "" || u.ForceQuery:
		return nil, fmt.Errorf("must not have a query (?...), got %q", s)
	case u.Fragment != "" || strings.Contains(s, "#"):
		return nil, fmt.Errorf("must not have a fragment (#...), got %q", s)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("port must be from 1 to 65535, got %q", s)
		}
	}
	return u, nil
}

// hostProblem says what is wrong with a DNS group's host, "" if nothing.
func hostProblem(h string) string {
	switch {
	case h == "":
		return "required: the DNS name to resolve, such as vllm.default.svc.cluster.local"
	case strings.Contains(h, "://"):
		return fmt.Sprintf("must be a bare DNS name (the scheme goes in scheme), got %q", h)
	case strings.ContainsAny(h, ":/?#@") || strings.ContainsFunc(h, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return fmt.Sprintf("must be a bare DNS name without port, path or spaces (the port goes in port), got %q", h)
	}
	return ""
}

// zmqEndpoint checks a ZMQ endpoint the router connects to: tcp://HOST:PORT
// or ipc://PATH.
func (k *checker) zmqEndpoint(path, e string, bind bool) {
	want := "must be a ZMQ endpoint to connect to, tcp://HOST:PORT (such as tcp://10.0.0.1:5557) or ipc://PATH, got %q"
	if bind {
		want = "must be a ZMQ endpoint to bind, tcp://HOST:PORT (such as tcp://*:5557 or tcp://0.0.0.0:5557) or ipc://PATH, got %q"
	}
	scheme, rest, ok := strings.Cut(e, "://")
	switch {
	case !ok || rest == "":
		k.fail(path, want, e)
	case scheme == "ipc":
	case scheme != "tcp":
		k.fail(path, want, e)
	default:
		host, port, err := net.SplitHostPort(rest)
		n, perr := strconv.Atoi(port)
		switch {
		case err != nil || perr != nil || n < 1 || n > 65535 || host == "":
			k.fail(path, want, e)
		case host == "*" && !bind:
			k.fail(path, "must name the engine's host: * is for binding, the router connects (set kv_events_bind: true to bind); got %q", e)
		}
	}
}

// tokenizer checks that a tokenizer exists.
func (k *checker) tokenizer(path, t string) {
	if t == BuiltinSim {
		return
	}
	if strings.HasPrefix(t, "builtin:") {
		k.fail(path, "unknown built-in tokenizer %q; the only one is %s", t, BuiltinSim)
		return
	}
	if t == "" {
		k.fail(path, "required: %s, a model directory holding tokenizer.json, or a tokenizer.json path", BuiltinSim)
		return
	}
	st, err := os.Stat(t)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		k.fail(path, "%q does not exist; want %s, a model directory holding tokenizer.json, or a tokenizer.json path", t, BuiltinSim)
	case err != nil:
		k.fail(path, "%v", err)
	case st.IsDir():
		tj := filepath.Join(t, "tokenizer.json")
		if _, err := os.Stat(tj); err != nil {
			k.fail(path, "directory %q holds no tokenizer.json (%q is missing)", t, tj)
		}
	case !st.Mode().IsRegular():
		k.fail(path, "%q is not a regular file", t)
	}
}

// profile checks that an engine profile resolves.
func (k *checker) profile(path, p string) {
	if p == "" {
		return
	}
	// A file that is not regular (a device, a FIFO) would block or never
	// end when read: refuse it before ResolveProfile reads it.
	if st, err := os.Stat(p); err == nil && !st.Mode().IsRegular() {
		k.fail(path, "%q is not a regular file; want a profile YAML path or a MODEL@GPU preset", p)
		return
	} else if err == nil && st.Size() > maxProfileBytes {
		k.fail(path, "%q is %d bytes; a profile is a small YAML file (at most %v)", p, st.Size(), ByteSize(maxProfileBytes))
		return
	}
	if _, err := calibrate.ResolveProfile(p); err != nil {
		k.fail(path, "%v", err)
	}
}

// Bounds of the tenancy section: the limiter's (tenancy/limit) and the
// usage buffer's.
const (
	// maxLimit is tenancy/limit's MaxLimit (2^40).
	maxLimit       = 1 << 40
	maxGateways    = 10000
	maxRedisDB     = 1 << 16
	maxUsageBuffer = 1 << 24
)

// tenancy checks auth and the tenancy section, and each model's
// key_limits.
func (k *checker) tenancy(c *Config) {
	t := &c.Tenancy
	switch c.Auth {
	case AuthNone, AuthKeys:
	default:
		k.fail("auth", "must be %q or %q, got %q", AuthNone, AuthKeys, c.Auth)
	}
	if t.Store != "" {
		// ParseDSN's errors never hold the password.
		if _, err := tenancy.ParseDSN(t.Store); err != nil {
			k.fail("tenancy.store", "%v", err)
		}
	} else if c.Auth == AuthKeys {
		k.fail("tenancy.store", "required with auth: keys: a SQLite file such as /var/lib/inferrail/tenancy.db, or postgres://user@host/db for several gateways")
	}
	for i := range c.Models {
		m := &c.Models[i]
		if m.APIKeyFile == "" {
			continue
		}
		p := fmt.Sprintf("models[%d].api_key_file", i)
		if c.ForwardClientAuth {
			k.fail(p, "not with forward_client_auth: true: the engines' key replaces the client's Authorization; set one of them")
		} else if _, err := ReadSecret(m.APIKeyFile); err != nil {
			k.fail(p, "%v", err)
		}
	}
	if c.Auth == AuthKeys && c.ForwardClientAuth {
		k.fail("forward_client_auth", "must be false with auth: keys: the client's Authorization header holds its inferrail API key, which never goes to the engines")
	}
	k.durationIn("tenancy.auth_cache_ttl", t.AuthCacheTTL, time.Millisecond, time.Hour)
	k.durationIn("tenancy.usage_flush_interval", t.UsageFlushInterval, 10*time.Millisecond, time.Hour)
	k.intIn("tenancy.usage_buffer", t.UsageBuffer, 1, maxUsageBuffer)
	k.durationIn("tenancy.window", t.Window, time.Millisecond, 366*24*time.Hour)
	k.durationIn("tenancy.lease_ttl", t.LeaseTTL, time.Millisecond, 24*time.Hour)
	if t.Window%time.Microsecond != 0 {
		k.fail("tenancy.window", "must be a whole number of microseconds, got %v", t.Window)
	}
	if t.LeaseTTL%time.Microsecond != 0 {
		k.fail("tenancy.lease_ttl", "must be a whole number of microseconds, got %v", t.LeaseTTL)
	}
	k.limits("tenancy.limits.global", t.Limits.Global)
	for i := range c.Models {
		k.limits("models["+strconv.Itoa(i)+"].key_limits", c.Models[i].KeyLimits)
	}
	r := &t.Redis
	if r.Address != "" {
		k.redisAddress("tenancy.redis.address", r.Address)
	}
	if r.PasswordFile != "" {
		if _, err := ReadSecret(r.PasswordFile); err != nil {
			k.fail("tenancy.redis.password_file", "%v", err)
		}
	}
	k.intIn("tenancy.redis.db", r.DB, 0, maxRedisDB)
	switch {
	case r.KeyPrefix == "":
		k.fail("tenancy.redis.key_prefix", "must not be empty (the default is ir)")
	case strings.ContainsAny(r.KeyPrefix, "{}") || strings.ContainsFunc(r.KeyPrefix, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		k.fail("tenancy.redis.key_prefix", "must hold no braces, spaces or control characters, got %q", r.KeyPrefix)
	case len(r.KeyPrefix) > 64:
		k.fail("tenancy.redis.key_prefix", "must be at most 64 bytes, got %d", len(r.KeyPrefix))
	}
	k.durationIn("tenancy.redis.timeout", r.Timeout, time.Millisecond, 10*time.Second)
	switch r.OnRedisError {
	case "closed", "open", "local":
	default:
		k.fail("tenancy.redis.on_redis_error", `must be "closed" (503 while Redis fails), "open" (admit) or "local" (this gateway's share of each limit), got %q`, r.OnRedisError)
	}
	k.intIn("tenancy.redis.gateways", r.Gateways, 1, maxGateways)

	l := &t.Ledger
	switch l.Backend {
	case "local":
	case "redis":
		if r.Address == "" {
			k.fail("tenancy.ledger.backend", "redis needs tenancy.redis.address, the Redis every gateway shares")
		}
		for i := range c.Models {
			if len(c.Models[i].DNS) > 0 {
				// The shared ledger keys a replica by its index, which
				// DNS discovery's order does not fix across gateways.
				k.fail("models["+strconv.Itoa(i)+"].dns", "cannot be used with tenancy.ledger.backend: redis: list the replicas (every gateway the same, in the same order)")
			}
		}
	default:
		k.fail("tenancy.ledger.backend", `must be "local" or "redis", got %q`, l.Backend)
	}
	k.durationIn("tenancy.ledger.lease_ttl", l.LeaseTTL, 100*time.Millisecond, 10*time.Minute)
	k.durationIn("tenancy.ledger.refresh_interval", l.RefreshInterval, 10*time.Millisecond, 10*time.Minute)
	if l.Backend == "redis" && r.Timeout*3 > l.LeaseTTL {
		k.fail("tenancy.redis.timeout", "must be at most tenancy.ledger.lease_ttl/3 (%v) with the redis ledger, got %v", l.LeaseTTL/3, r.Timeout)
	}
	if l.RefreshInterval > 0 && l.LeaseTTL > 0 && l.RefreshInterval*3 > l.LeaseTTL {
		k.fail("tenancy.ledger.refresh_interval", "must be at most lease_ttl/3 (%v), or a live gateway's lease can lapse between renewals, got %v", l.LeaseTTL/3, l.RefreshInterval)
	}
	if len(l.GatewayID) > 64 || strings.ContainsFunc(l.GatewayID, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || r == '{' || r == '}' || r == ','
	}) {
		k.fail("tenancy.ledger.gateway_id", "must be at most 64 bytes without spaces, control characters, braces or commas, got %q", l.GatewayID)
	}
	switch l.OnRedisError {
	case "closed", "open", "local":
	default:
		k.fail("tenancy.ledger.on_redis_error", `must be "closed" (requests wait while Redis fails), "open" (admit as if alone) or "local" (this gateway's share of capacity), got %q`, l.OnRedisError)
	}
}

// limits checks one bucket's limits: 0 (unlimited) or a positive integer
// each.
func (k *checker) limits(path string, l Limits) {
	for _, f := range []struct {
		name string
		v    int
	}{{"rpm", l.RPM}, {"tpm", l.TPM}, {"max_concurrency", l.MaxConcurrency}} {
		switch {
		case f.v < 0:
			k.fail(path+"."+f.name, "must be 0 (unlimited) or a positive integer, got %d", f.v)
		case f.v > maxLimit:
			k.fail(path+"."+f.name, "must be at most %d, got %d", int64(maxLimit), f.v)
		}
	}
}

// durationIn checks lo <= d <= hi.
func (k *checker) durationIn(path string, d, lo, hi time.Duration) {
	if d < lo || d > hi {
		k.fail(path, "must be a duration from %v to %v, got %v", lo, hi, d)
	}
}

// redisAddress checks a Redis address: host:port or unix:///path.
func (k *checker) redisAddress(path, addr string) {
	if rest, ok := strings.CutPrefix(addr, "unix://"); ok {
		if !filepath.IsAbs(rest) {
			k.fail(path, "a unix socket must be an absolute path such as unix:///run/redis/redis.sock, got %q", addr)
		}
		return
	}
	host, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n < 1 || n > 65535 || host == "" || strings.Contains(addr, "://") {
		k.fail(path, "must be host:port (such as 127.0.0.1:6379) or unix:///path/to/redis.sock, got %q", addr)
	}
}

// ReadSecret reads a password file: one line, surrounding space trimmed,
// at most 4096 bytes. Its errors never hold the file's content.
func ReadSecret(file string) (string, error) {
	st, err := os.Stat(file)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() || st.Size() > maxTokenBytes {
		return "", fmt.Errorf("%q must be a regular file of at most %d bytes holding one line", file, maxTokenBytes)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	pw := strings.TrimSpace(string(b))
	if pw == "" || strings.ContainsAny(pw, "\r\n") {
		return "", fmt.Errorf("%q must hold one non-empty line", file)
	}
	return pw, nil
}
