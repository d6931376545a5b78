package semcache

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"
)

// Store kinds (Config.Store).
const (
	StoreMemory   = "memory"
	StorePgvector = "pgvector"
)

// Defaults.
const (
	// DefaultThreshold is the cosine similarity a lookup needs to hit.
	// Why 0.95 and not the 0.8 many peers default to: the similarity
	// distributions of right and wrong hits overlap (vCache), and a
	// semantic cache served one user's answer to another at 0.9085
	// (vllm-project/semantic-router#2134). At 0.95 (production-stack's
	// default with all-MiniLM-L6-v2) two prompts must say nearly the same
	// thing; the cost is fewer hits. The right value depends on the
	// embedding model: measure before lowering it (docs/semantic-cache.md).
	DefaultThreshold     = 0.95
	DefaultTTL           = time.Hour
	DefaultEmbedTimeout  = time.Second
	DefaultPGTimeout     = 200 * time.Millisecond
	DefaultPGMaxConns    = 4
	DefaultMaxEntryBytes = 1 << 20
	DefaultMaxTextBytes  = 2048
	minThreshold         = 0.8
	maxTTL               = 720 * time.Hour
	maxEmbedTimeout      = time.Minute
	maxPGTimeout         = 10 * time.Second
	maxMaxEntries        = 100000
	maxTextBytesLimit    = 1 << 20
	maxEmbedDimensions   = 16384
	maxEntryBytesLimit   = 64 << 20
	maxMemoryBytesLimit  = 1 << 40
	maxPGMaxConns        = 1000
)

// Config configures one model's semantic cache. Field names are the YAML
// keys; live/config embeds it per model as semantic_cache. Start from
// DefaultConfig and check with Validate (New does).
type Config struct {
	// Enabled turns the cache on. Default false: a semantic cache answers
	// a request with the answer to another, similar one; turn it on only
	// where that is acceptable (docs/semantic-cache.md).
	Enabled bool `yaml:"enabled"`
	// Embeddings is the OpenAI-compatible endpoint that embeds prompts.
	Embeddings EmbeddingsConfig `yaml:"embeddings"`
	// Threshold is the cosine similarity, 0.8 to 1, at or above which a
	// stored answer is served. Default 0.95.
	Threshold float64 `yaml:"threshold"`
	// Store is "memory" (this process, the default) or "pgvector"
	// (Postgres with pgvector, shared by every gateway; postgres.dsn and
	// embeddings.dimensions are required).
	Store string `yaml:"store"`
	// Postgres is the database of store: pgvector.
	Postgres PostgresConfig `yaml:"postgres"`
	// TTL is how long an answer is served after it was stored, 1s to
	// 720h. Default 1h.
	TTL time.Duration `yaml:"ttl"`
	// MaxEntries bounds the entries of one scope (tenant, model and
	// request partition), 1 to 100000; a lookup compares with all of them
	// in memory. 0 means 1000.
	MaxEntries int `yaml:"max_entries"`
	// MaxBytes bounds the memory store's answers and vectors, in bytes. 0
	// means 64 MiB. Must be 0 with store: pgvector.
	MaxBytes int64 `yaml:"max_bytes"`
	// MaxEntryBytes bounds one stored answer, in bytes; a bigger one is
	// not stored. Default 1 MiB, at most 64 MiB.
	MaxEntryBytes int64 `yaml:"max_entry_bytes"`
	// MaxTextBytes bounds the embedded text (the last user message, or
	// the prompt), in bytes: a longer one is never looked up, because one
	// changed word moves a long text's embedding too little to tell.
	// Default 2048, at most 1 MiB.
	MaxTextBytes int `yaml:"max_text_bytes"`
}

// EmbeddingsConfig is the embeddings endpoint.
type EmbeddingsConfig struct {
	// URL is the server's base URL, http:// or https://, such as
	// http://10.0.0.5:8000; the client posts to URL + "/v1/embeddings"
	// (a path in URL prefixes it). Required.
	URL string `yaml:"url"`
	// Model is the embedding model's name, sent as "model". Required.
	Model string `yaml:"model"`
	// Timeout bounds one embeddings call, 1ms to 1m; a lookup whose call
	// times out goes to the engines. Default 1s.
	Timeout time.Duration `yaml:"timeout"`
	// Dimensions is the dimension the model's embeddings have, checked on
	// every answer; 0 takes what the first answer has (store: memory
	// only). Required with store: pgvector (the column is
	// vector(dimensions), at most 2000).
	Dimensions int `yaml:"dimensions"`
	// APIKeyFile is a file holding the bearer token the endpoint wants,
	// "" for none.
	APIKeyFile string `yaml:"api_key_file"`
}

// PostgresConfig is the database of store: pgvector.
type PostgresConfig struct {
	// DSN is a postgres:// URL or a key=value connection string.
	// Required with store: pgvector.
	DSN string `yaml:"dsn"`
	// Table is the table, [a-z_][a-z0-9_]*. Default
	// "inferrail_semantic_cache". Use one table per embedding model.
	Table string `yaml:"table"`
	// Timeout bounds each store call, 1ms to 10s; a lookup that times out
	// goes to the engines. Default 200ms.
	Timeout time.Duration `yaml:"timeout"`
	// MaxConns bounds the pool's connections, 1 to 1000. Default 4.
	MaxConns int32 `yaml:"max_conns"`
}

// DefaultConfig returns the defaults: disabled, in memory, threshold 0.95.
func DefaultConfig() Config {
	return Config{
		Threshold:     DefaultThreshold,
		Store:         StoreMemory,
		TTL:           DefaultTTL,
		MaxEntryBytes: DefaultMaxEntryBytes,
		MaxTextBytes:  DefaultMaxTextBytes,
		Embeddings:    EmbeddingsConfig{Timeout: DefaultEmbedTimeout},
		Postgres:      PostgresConfig{Table: DefaultTable, Timeout: DefaultPGTimeout, MaxConns: DefaultPGMaxConns},
	}
}

// FieldError is one invalid field: Field is its YAML path inside the
// semantic_cache block (such as "embeddings.url").
type FieldError struct {
	Field string
	Msg   string
}

// Error returns "semantic_cache.<field>: <msg>".
func (e *FieldError) Error() string { return "semantic_cache." + e.Field + ": " + e.Msg }

// Validate checks every field and returns all problems at once (each a
// *FieldError, joined), nil when the configuration is usable. A disabled
// cache is checked as well, except for what only an enabled one needs
// (embeddings.url and model, postgres.dsn).
func (c *Config) Validate() error {
	var errs []error
	fail := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	e := &c.Embeddings
	switch {
	case e.URL == "" && c.Enabled:
		fail("embeddings.url", "required: the base URL of an OpenAI-compatible server with /v1/embeddings, such as http://10.0.0.5:8000")
	case e.URL != "":
		if err := checkBaseURL(e.URL); err != nil {
			fail("embeddings.url", "%v", err)
		}
	}
	if e.Model == "" && c.Enabled {
		fail("embeddings.model", "required: the embedding model's name as the server knows it")
	}
	if e.Timeout < time.Millisecond || e.Timeout > maxEmbedTimeout {
		fail("embeddings.timeout", "must be from 1ms to %v, got %v", maxEmbedTimeout, e.Timeout)
	}
	if e.Dimensions < 0 || e.Dimensions > maxEmbedDimensions {
		fail("embeddings.dimensions", "must be from 0 (take the model's) to %d, got %d", maxEmbedDimensions, e.Dimensions)
	}
	if math.IsNaN(c.Threshold) || c.Threshold < minThreshold || c.Threshold > 1 {
		fail("threshold", "must be from %v to 1, got %v: below %v different questions hit (one user's answer was served to another at 0.91); default %v",
			minThreshold, c.Threshold, minThreshold, DefaultThreshold)
	}
	if c.TTL < time.Second || c.TTL > maxTTL {
		fail("ttl", "must be from 1s to %v, got %v", maxTTL, c.TTL)
	}
	if c.MaxEntries < 0 || c.MaxEntries > maxMaxEntries {
		fail("max_entries", "must be from 1 to %d (0 for the default %d), got %d", maxMaxEntries, DefaultMaxEntries, c.MaxEntries)
	}
	if c.MaxEntryBytes < 1 || c.MaxEntryBytes > maxEntryBytesLimit {
		fail("max_entry_bytes", "must be from 1 to %d bytes, got %d", maxEntryBytesLimit, c.MaxEntryBytes)
	}
	if c.MaxTextBytes < 1 || c.MaxTextBytes > maxTextBytesLimit {
		fail("max_text_bytes", "must be from 1 to %d bytes, got %d", maxTextBytesLimit, c.MaxTextBytes)
	}
	p := &c.Postgres
	switch c.Store {
	case StoreMemory:
		if c.MaxBytes < 0 || c.MaxBytes > maxMemoryBytesLimit {
			fail("max_bytes", "must be from 1 to %d bytes (0 for the default %d), got %d", int64(maxMemoryBytesLimit), DefaultMaxBytes, c.MaxBytes)
		} else if c.MaxBytes > 0 && c.MaxEntryBytes > c.MaxBytes {
			fail("max_entry_bytes", "must not exceed max_bytes (%d), got %d", c.MaxBytes, c.MaxEntryBytes)
		}
		if p.DSN != "" {
			fail("postgres.dsn", "is only read with store: pgvector; remove it or set store: pgvector")
		}
	case StorePgvector:
		if c.MaxBytes != 0 {
			fail("max_bytes", "must be 0 with store: pgvector (it bounds the memory store; max_entries bounds each scope's rows), got %d", c.MaxBytes)
		}
		if p.DSN == "" && c.Enabled {
			fail("postgres.dsn", "required with store: pgvector, such as postgres://inferrail@10.0.0.7/inferrail")
		}
		if e.Dimensions == 0 {
			fail("embeddings.dimensions", "required with store: pgvector: the column is vector(dimensions); the mock engine's embeddings have 256")
		} else if e.Dimensions > maxPGDim {
			fail("embeddings.dimensions", "must be at most %d with store: pgvector (pgvector's HNSW limit), got %d", maxPGDim, e.Dimensions)
		}
		if p.Table == "" || !tableName.MatchString(p.Table) {
			fail("postgres.table", "must be [a-z_][a-z0-9_]*, at most 63 bytes, got %q", p.Table)
		}
		if p.Timeout < time.Millisecond || p.Timeout > maxPGTimeout {
			fail("postgres.timeout", "must be from 1ms to %v, got %v", maxPGTimeout, p.Timeout)
		}
		if p.MaxConns < 1 || p.MaxConns > maxPGMaxConns {
			fail("postgres.max_conns", "must be from 1 to %d, got %d", maxPGMaxConns, p.MaxConns)
		}
	default:
		fail("store", "must be %q or %q, got %q", StoreMemory, StorePgvector, c.Store)
	}
	return errors.Join(errs...)
}

// checkBaseURL checks an http(s) base URL with a host, no credentials,
// query or fragment.
func checkBaseURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("must be an http:// or https:// URL, got %q: %w", s, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("must be an http:// or https:// URL, got %q", s)
	case u.Host == "":
		return fmt.Errorf("must name a host, such as http://10.0.0.5:8000, got %q", s)
	case u.User != nil:
		return fmt.Errorf("must not hold a user or password (use api_key_file), got %q", s)
	case u.RawQuery != "" || u.ForceQuery:
		return fmt.Errorf("must not have a query (?...), got %q", s)
	case u.Fragment != "":
		return fmt.Errorf("must not have a fragment (#...), got %q", s)
	case strings.HasSuffix(u.Path, "/v1/embeddings"):
		return fmt.Errorf("is the base URL: drop /v1/embeddings from %q, the client adds it", s)
	}
	return nil
}

// maxEntries is MaxEntries or its default.
func (c *Config) maxEntries() int {
	if c.MaxEntries == 0 {
		return DefaultMaxEntries
	}
	return c.MaxEntries
}
