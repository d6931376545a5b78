package respcache

import (
	"errors"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/inferrail/inferrail/internal/bytesize"
)

// Stores (Config.Store).
const (
	// StoreMemory keeps entries in this process: an LRU bounded in bytes.
	StoreMemory = "memory"
	// StoreRedis keeps entries in one Redis every gateway shares.
	StoreRedis = "redis"
)

// Defaults and bounds of the configuration.
const (
	DefaultTTL           = time.Hour
	DefaultMaxBytes      = 256 * MiB
	DefaultMaxEntryBytes = 1 * MiB
	DefaultMaxWait       = 30 * time.Second
	DefaultKeyPrefix     = "ir:rc:"
	DefaultRedisTimeout  = 50 * time.Millisecond

	// MaxTTL is the longest ttl: a day and a month of answers that no
	// model, template or engine upgrade may change is already a bet.
	MaxTTL = 30 * 24 * time.Hour
	// MaxMaxWait bounds max_wait.
	MaxMaxWait = 10 * time.Minute
	// maxEntryLimit bounds max_entry_bytes: a Redis string holds at most
	// 512 MiB, and one answer near that is not worth holding twice.
	maxEntryLimit = 256 * MiB
	// maxKeyPrefix bounds redis.key_prefix.
	maxKeyPrefix = 64
)

// Config configures one model's exact response cache. Field names are the
// YAML keys; live/config embeds it per model as response_cache. Start from
// DefaultConfig and check with Validate (New does).
type Config struct {
	// Enabled turns the cache on. Default false: an exact cache only helps
	// with fully repeated deterministic requests (evals, retries,
	// idempotent agents), and the KV prefix cache already makes repeated
	// prefixes cheap.
	Enabled bool `yaml:"enabled"`
	// Store is where entries live: "memory" (this process, the default)
	// or "redis" (shared by every gateway; redis.addr is required).
	Store string `yaml:"store"`
	// TTL is how long an entry is served after it was stored, 1s to 720h.
	// Default 1h.
	TTL time.Duration `yaml:"ttl"`
	// MaxBytes bounds the memory store: past it the least recently used
	// entries are evicted. YAML: bytes or a size such as "256MiB". 0 means
	// 256MiB. With store: redis it must be 0: Redis's own maxmemory with
	// maxmemory-policy allkeys-lru bounds a shared cache.
	MaxBytes ByteSize `yaml:"max_bytes"`
	// MaxEntryBytes bounds one captured answer (its body, SSE framing
	// included); a bigger answer is relayed whole but not stored, and
	// counted as too_large. Default 1MiB; 1KiB to 256MiB, and at most an
	// eighth of max_bytes with store: memory.
	MaxEntryBytes ByteSize `yaml:"max_entry_bytes"`
	// MaxTemperature is the highest temperature still cached, 0 to 2.
	// Default 0: only greedy requests. Above 0 the operator accepts that
	// one sample answers every later identical request until ttl. A
	// request without temperature has OpenAI's default 1.
	MaxTemperature float64 `yaml:"max_temperature"`
	// TenantHeader names a request header whose value partitions the
	// cache (with the API key id when auth is on). Without auth it is the
	// only tenant, and requests that lack it are never cached. Clients can
	// set any header: name one that a trusted front (an auth proxy) sets
	// and strips from clients. Default "" (the API key alone).
	TenantHeader string `yaml:"tenant_header"`
	// MaxWait bounds how long identical requests wait for the first one's
	// answer (which they then replay) instead of reaching an engine; one
	// that waits longer goes to the engine itself. 0 turns the
	// coalescing off. A streaming request's first byte waits for the whole
	// of the first answer. Default 30s, at most 10m.
	MaxWait time.Duration `yaml:"max_wait"`
	// Redis is the shared store (store: redis).
	Redis RedisConfig `yaml:"redis"`
}

// RedisConfig is the Redis of store: redis.
type RedisConfig struct {
	// Addr is host:port (such as 127.0.0.1:6379) or unix:///path.sock.
	Addr string `yaml:"addr"`
	// KeyPrefix starts every key, at most 64 bytes, no spaces or braces.
	// Change it to drop every entry at once (after a model or template
	// upgrade). Default "ir:rc:".
	KeyPrefix string `yaml:"key_prefix"`
	// Timeout bounds each Redis call, 1ms to 10s. A lookup that times out
	// is a miss. Default 50ms.
	Timeout time.Duration `yaml:"timeout"`
}

// DefaultConfig returns the defaults: disabled, in memory.
func DefaultConfig() Config {
	return Config{
		Store:         StoreMemory,
		TTL:           DefaultTTL,
		MaxEntryBytes: DefaultMaxEntryBytes,
		MaxWait:       DefaultMaxWait,
		Redis:         RedisConfig{KeyPrefix: DefaultKeyPrefix, Timeout: DefaultRedisTimeout},
	}
}

// maxBytes is the memory store's bound: MaxBytes, or its default.
func (c *Config) maxBytes() int64 {
	if c.MaxBytes == 0 {
		return int64(DefaultMaxBytes)
	}
	return int64(c.MaxBytes)
}

// FieldError is one invalid field: Field is its YAML path inside the
// response_cache block (such as "redis.addr").
type FieldError struct {
	Field string
	Msg   string
}

// Error returns "response_cache.<field>: <msg>".
func (e *FieldError) Error() string { return "response_cache." + e.Field + ": " + e.Msg }

// Validate checks every field and returns all problems at once (each a
// *FieldError, joined), nil when the configuration is usable. A disabled
// cache is checked as well: turning it on must not reveal old mistakes.
func (c *Config) Validate() error {
	var errs []error
	fail := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	switch c.Store {
	case StoreMemory, StoreRedis:
	default:
		fail("store", `must be "memory" (this process) or "redis" (shared by every gateway), got %q`, c.Store)
	}
	if c.TTL < time.Second || c.TTL > MaxTTL {
		fail("ttl", "must be a duration from 1s to %v, got %v", MaxTTL, c.TTL)
	}
	if c.TTL%time.Millisecond != 0 {
		fail("ttl", "must be whole milliseconds (Redis's PX), got %v", c.TTL)
	}
	if c.MaxBytes < 0 {
		fail("max_bytes", "must be a size in bytes such as 256MiB, or 0 for the default (256MiB), got %d", c.MaxBytes)
	}
	if c.Store == StoreRedis && c.MaxBytes != 0 {
		fail("max_bytes", "applies to store: memory only; with store: redis remove it and bound the cache with the Redis server's maxmemory and maxmemory-policy allkeys-lru")
	}
	if c.MaxEntryBytes < 1*KiB || c.MaxEntryBytes > maxEntryLimit {
		fail("max_entry_bytes", "must be a size from 1KiB to %v, got %v", maxEntryLimit, c.MaxEntryBytes)
	} else if c.Store == StoreMemory && c.MaxBytes >= 0 && int64(c.MaxEntryBytes) > c.maxBytes()/8 {
		fail("max_entry_bytes", "must be at most an eighth of max_bytes (%v), or one answer could evict most of the cache: raise max_bytes or lower it, got %v", ByteSize(c.maxBytes()/8), c.MaxEntryBytes)
	}
	if math.IsNaN(c.MaxTemperature) || c.MaxTemperature < 0 || c.MaxTemperature > 2 {
		fail("max_temperature", "must be from 0 (greedy requests only) to 2, got %v", c.MaxTemperature)
	}
	if c.TenantHeader != "" && !validHeaderName(c.TenantHeader) {
		fail("tenant_header", "must be an HTTP header name (letters, digits and -), got %q", c.TenantHeader)
	}
	if c.MaxWait < 0 || c.MaxWait > MaxMaxWait {
		fail("max_wait", "must be a duration from 0 (no coalescing) to %v, got %v", MaxMaxWait, c.MaxWait)
	}
	r := &c.Redis
	if c.Store == StoreRedis || r.Addr != "" {
		if msg := checkRedisAddr(r.Addr); msg != "" {
			fail("redis.addr", "%s", msg)
		}
	}
	switch {
	case r.KeyPrefix == "":
		fail("redis.key_prefix", "must not be empty (the default is %q)", DefaultKeyPrefix)
	case len(r.KeyPrefix) > maxKeyPrefix:
		fail("redis.key_prefix", "must be at most %d bytes, got %d", maxKeyPrefix, len(r.KeyPrefix))
	case strings.ContainsAny(r.KeyPrefix, "{} \t\r\n") || strings.ContainsFunc(r.KeyPrefix, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		fail("redis.key_prefix", "must hold no braces, spaces or control characters, got %q", r.KeyPrefix)
	}
	if r.Timeout < time.Millisecond || r.Timeout > 10*time.Second {
		fail("redis.timeout", "must be a duration from 1ms to 10s, got %v", r.Timeout)
	}
	return errors.Join(errs...)
}

// checkRedisAddr returns what is wrong with a Redis address, "" if nothing.
func checkRedisAddr(addr string) string {
	if addr == "" {
		return "is required with store: redis: host:port (such as 127.0.0.1:6379) or unix:///path/to/redis.sock"
	}
	if rest, ok := strings.CutPrefix(addr, "unix://"); ok {
		if !filepath.IsAbs(rest) {
			return fmt.Sprintf("a unix socket must be an absolute path such as unix:///run/redis/redis.sock, got %q", addr)
		}
		return ""
	}
	host, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n < 1 || n > 65535 || host == "" || strings.Contains(addr, "://") {
		return fmt.Sprintf("must be host:port (such as 127.0.0.1:6379) or unix:///path/to/redis.sock, got %q", addr)
	}
	return ""
}

// validHeaderName reports whether s is a token of letters, digits and '-'.
func validHeaderName(s string) bool {
	if len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ByteSize is a size in bytes (package bytesize): in YAML an integer, or a
// number and a unit such as "256MiB".
type ByteSize = bytesize.Size

// Byte size units.
const (
	KiB = bytesize.KiB
	MiB = bytesize.MiB
	GiB = bytesize.GiB
)
