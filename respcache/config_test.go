package respcache

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestDefaultConfigValid(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Enabled {
		t.Error("the cache is on by default")
	}
	c.Enabled, c.Store, c.Redis.Addr = true, StoreRedis, "127.0.0.1:6379"
	if err := c.Validate(); err != nil {
		t.Errorf("redis: %v", err)
	}
}

// TestValidate: each bad field is named, with what to change.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		field string
		set   func(c *Config)
		want  string
	}{
		{"store", func(c *Config) { c.Store = "disk" }, `"memory"`},
		{"ttl", func(c *Config) { c.TTL = 0 }, "1s to"},
		{"ttl", func(c *Config) { c.TTL = 31 * 24 * time.Hour }, "1s to"},
		{"ttl", func(c *Config) { c.TTL = time.Second + time.Microsecond }, "milliseconds"},
		{"max_bytes", func(c *Config) { c.MaxBytes = -1 }, "256MiB"},
		{"max_bytes", func(c *Config) { c.Store, c.Redis.Addr, c.MaxBytes = StoreRedis, "r:6379", MiB }, "maxmemory"},
		{"max_entry_bytes", func(c *Config) { c.MaxEntryBytes = 10 }, "1KiB"},
		{"max_entry_bytes", func(c *Config) { c.MaxBytes = 4 * MiB }, "eighth"},
		{"max_temperature", func(c *Config) { c.MaxTemperature = 2.5 }, "0 (greedy"},
		{"max_temperature", func(c *Config) { c.MaxTemperature = -0.1 }, "0 (greedy"},
		{"tenant_header", func(c *Config) { c.TenantHeader = "x tenant" }, "header name"},
		{"max_wait", func(c *Config) { c.MaxWait = -time.Second }, "no coalescing"},
		{"max_wait", func(c *Config) { c.MaxWait = time.Hour }, "no coalescing"},
		{"redis.addr", func(c *Config) { c.Store = StoreRedis }, "required"},
		{"redis.addr", func(c *Config) { c.Store, c.Redis.Addr = StoreRedis, "redis://x:1" }, "host:port"},
		{"redis.addr", func(c *Config) { c.Store, c.Redis.Addr = StoreRedis, "unix://rel.sock" }, "absolute"},
		{"redis.key_prefix", func(c *Config) { c.Redis.KeyPrefix = "" }, "empty"},
		{"redis.key_prefix", func(c *Config) { c.Redis.KeyPrefix = "a{b}" }, "braces"},
		{"redis.key_prefix", func(c *Config) { c.Redis.KeyPrefix = strings.Repeat("p", 65) }, "64"},
		{"redis.timeout", func(c *Config) { c.Redis.Timeout = 0 }, "1ms to 10s"},
	} {
		c := DefaultConfig()
		c.Enabled = true
		tc.set(&c)
		err := c.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a %s error saying %q", tc.field, err, tc.field, tc.want)
			continue
		}
		if !strings.HasPrefix(err.Error(), "response_cache."+tc.field+": ") {
			t.Errorf("error %q does not start with its field", err)
		}
		if _, err := New(c, Deps{}); err == nil {
			t.Errorf("%s: New accepted it", tc.field)
		}
	}
	// Every problem at once.
	c := Config{Store: "x"}
	if n := strings.Count(c.Validate().Error(), "response_cache."); n < 5 {
		t.Errorf("%d problems reported in %q", n, c.Validate())
	}
}

func TestConfigYAML(t *testing.T) {
	c := DefaultConfig()
	doc := `
enabled: true
store: memory
ttl: 10m
max_bytes: 64MiB
max_entry_bytes: 524288
max_temperature: 0.1
tenant_header: X-Inferrail-Tenant
max_wait: 5s
redis: {key_prefix: "gw:", timeout: 20ms}
`
	if err := yaml.Unmarshal([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	want := Config{Enabled: true, Store: StoreMemory, TTL: 10 * time.Minute, MaxBytes: 64 * MiB, MaxEntryBytes: 512 * KiB,
		MaxTemperature: 0.1, TenantHeader: "X-Inferrail-Tenant", MaxWait: 5 * time.Second,
		Redis: RedisConfig{KeyPrefix: "gw:", Timeout: 20 * time.Millisecond}}
	if c != want {
		t.Errorf("decoded %+v, want %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"max_bytes: 12XB", "max_bytes: [1]", "max_bytes: 99999999999GiB"} {
		c := DefaultConfig()
		if err := yaml.Unmarshal([]byte(bad), &c); err == nil {
			t.Errorf("%q decoded", bad)
		}
	}
	// A negative size decodes (the one size type reads any integer) and
	// Validate refuses it, naming the field.
	neg := DefaultConfig()
	if err := yaml.Unmarshal([]byte("max_bytes: -1"), &neg); err != nil {
		t.Fatal(err)
	}
	if err := neg.Validate(); err == nil || !strings.Contains(err.Error(), "max_bytes") {
		t.Errorf("max_bytes -1: Validate says %v", err)
	}
	if got := (256 * MiB).String(); got != "256MiB" {
		t.Errorf("String %q", got)
	}
}
