package semcache

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults (disabled): %v", err)
	}
	c.Enabled = true
	err := c.Validate()
	for _, f := range []string{"semantic_cache.embeddings.url", "semantic_cache.embeddings.model"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Fatalf("enabled without an endpoint: %v, want %s named", err, f)
		}
	}
	c.Embeddings.URL, c.Embeddings.Model = "http://127.0.0.1:8000", "e5"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Threshold != 0.95 || c.Store != StoreMemory || c.TTL != time.Hour {
		t.Fatalf("defaults %+v", c)
	}
}

// TestValidate: every bad field is reported, by its YAML path, with what
// to change.
func TestValidate(t *testing.T) {
	valid := func() Config {
		c := DefaultConfig()
		c.Enabled = true
		c.Embeddings.URL, c.Embeddings.Model = "http://127.0.0.1:8000", "e5"
		return c
	}
	pg := func(c *Config) {
		c.Store = StorePgvector
		c.Postgres.DSN = "postgres://u@127.0.0.1/db"
		c.Embeddings.Dimensions = 256
	}
	for _, tc := range []struct {
		field  string
		change func(*Config)
	}{
		{"embeddings.url", func(c *Config) { c.Embeddings.URL = "10.0.0.5:8000" }},
		{"embeddings.url", func(c *Config) { c.Embeddings.URL = "http://x/v1/embeddings" }},
		{"embeddings.url", func(c *Config) { c.Embeddings.URL = "http://x?q=1" }},
		{"embeddings.timeout", func(c *Config) { c.Embeddings.Timeout = 0 }},
		{"embeddings.timeout", func(c *Config) { c.Embeddings.Timeout = time.Hour }},
		{"embeddings.dimensions", func(c *Config) { c.Embeddings.Dimensions = -1 }},
		{"threshold", func(c *Config) { c.Threshold = 0.5 }},
		{"threshold", func(c *Config) { c.Threshold = 1.1 }},
		{"threshold", func(c *Config) { c.Threshold = 0 }},
		{"ttl", func(c *Config) { c.TTL = 0 }},
		{"ttl", func(c *Config) { c.TTL = 1000 * time.Hour }},
		{"max_entries", func(c *Config) { c.MaxEntries = -1 }},
		{"max_entries", func(c *Config) { c.MaxEntries = 1 << 20 }},
		{"max_entry_bytes", func(c *Config) { c.MaxEntryBytes = 0 }},
		{"max_entry_bytes", func(c *Config) { c.MaxBytes = 100 }},
		{"max_text_bytes", func(c *Config) { c.MaxTextBytes = 0 }},
		{"max_bytes", func(c *Config) { c.MaxBytes = -5 }},
		{"store", func(c *Config) { c.Store = "redis" }},
		{"postgres.dsn", func(c *Config) { c.Postgres.DSN = "postgres://x" }},
		{"postgres.dsn", func(c *Config) { pg(c); c.Postgres.DSN = "" }},
		{"embeddings.dimensions", func(c *Config) { pg(c); c.Embeddings.Dimensions = 0 }},
		{"embeddings.dimensions", func(c *Config) { pg(c); c.Embeddings.Dimensions = 3072 }},
		{"max_bytes", func(c *Config) { pg(c); c.MaxBytes = 1 << 20 }},
		{"postgres.table", func(c *Config) { pg(c); c.Postgres.Table = "Semantic-Cache" }},
		{"postgres.timeout", func(c *Config) { pg(c); c.Postgres.Timeout = 0 }},
		{"postgres.max_conns", func(c *Config) { pg(c); c.Postgres.MaxConns = 0 }},
	} {
		c := valid()
		tc.change(&c)
		err := c.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "semantic_cache."+tc.field+": ") {
			t.Errorf("%s: %v", tc.field, err)
		}
	}
	c := valid()
	pg(&c)
	if err := c.Validate(); err != nil {
		t.Fatalf("pgvector: %v", err)
	}
	// Several problems at once.
	c = valid()
	c.Threshold, c.TTL, c.Store = 2, 0, "x"
	if err := c.Validate(); err == nil || strings.Count(err.Error(), "semantic_cache.") != 3 {
		t.Fatalf("three problems: %v", err)
	}
}
