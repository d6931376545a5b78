package respcache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/inferrail/inferrail/internal/testredis"
)

// quietLogger silences go-redis's own log (its dial failures while a test
// has stopped the server); the cache reports errors through its hooks.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	m.Run()
}

func redisClient(t testing.TB, srv *testredis.Server) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Network: srv.Network, Addr: srv.Addr,
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { c.Close() })
	return c
}

var prefixSeq atomic.Uint64

// redisConfig is a Redis store's configuration with a key prefix no other
// test uses on the shared server.
func redisConfig(srv *testredis.Server) RedisConfig {
	return RedisConfig{Addr: "unix://" + srv.Addr, KeyPrefix: fmt.Sprintf("t%d:", prefixSeq.Add(1)), Timeout: time.Second}
}

func newRedisStore(t testing.TB, c *redis.Client, srv *testredis.Server) *RedisStore {
	s, err := NewRedisStore(c, redisConfig(srv))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRedisConformance runs the store suite against a real redis-server.
func TestRedisConformance(t *testing.T) {
	srv := testredis.Start(t)
	c := redisClient(t, srv)
	runConformance(t, func(t *testing.T, f func(*testing.T, Store, func(time.Duration))) {
		f(t, newRedisStore(t, c, srv), time.Sleep)
	})
}

// TestRedisLayout: one string per entry under the prefix, a versioned
// blob, written with a millisecond TTL.
func TestRedisLayout(t *testing.T) {
	srv := testredis.Start(t)
	c := redisClient(t, srv)
	s := newRedisStore(t, c, srv)
	k := testKey("layout")
	mustSet(t, s, k, sseEntry("x"), 1500*time.Millisecond)
	ctx := context.Background()
	keys, err := c.Keys(ctx, s.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != s.prefix+k.String() {
		t.Fatalf("keys %v, want [%s%s]", keys, s.prefix, k)
	}
	raw, err := c.Get(ctx, keys[0]).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if raw[0] != encodingVersion {
		t.Errorf("first byte %d, want the version %d", raw[0], encodingVersion)
	}
	pttl, err := c.PTTL(ctx, keys[0]).Result()
	if err != nil || pttl <= 0 || pttl > 1500*time.Millisecond || pttl < 1000*time.Millisecond {
		t.Errorf("PTTL %v (%v), want at most 1.5s", pttl, err)
	}

	// A value of another version, or of another key, is refused.
	bad := append([]byte{encodingVersion + 1}, raw[1:]...)
	if err := c.Set(ctx, keys[0], bad, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, k); !errors.Is(err, ErrCorrupt) {
		t.Errorf("another version: %v, want ErrCorrupt", err)
	}
	other := testKey("other")
	if err := c.Set(ctx, s.prefix+other.String(), raw, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, other); !errors.Is(err, ErrCorrupt) {
		t.Errorf("another key's entry: %v, want ErrCorrupt", err)
	}
	for n := range len(raw) {
		if _, err := decodeEntry(k, raw[:n]); err == nil {
			t.Fatalf("a blob cut at %d of %d bytes decoded", n, len(raw))
		}
	}
}

// TestRedisSharedByGateways: two caches over one Redis (two gateways)
// share entries; a corrupt value is a miss and counted.
func TestRedisSharedByGateways(t *testing.T) {
	srv := testredis.Start(t)
	cfg := testConfig()
	cfg.Store = StoreRedis
	cfg.Redis = redisConfig(srv)
	cntA, cntB := newCounters(), newCounters()
	eng := &fakeEngine{}
	a := &cachingProxy{t: t, c: newCache(t, cfg, Deps{Hooks: cntA.hooks()}), model: "m", upstream: eng}
	b := &cachingProxy{t: t, c: newCache(t, cfg, Deps{Hooks: cntB.hooks()}), model: "m", upstream: eng}
	first := do(a, "k", streamBody)
	// The Redis write runs off the request path: wait until it is in.
	waitFor(t, func() bool { return cntA.get("stored") == 1 })
	second := do(b, "k", streamBody)
	if second.Header().Get(HeaderCache) != "hit" || second.Body.String() != first.Body.String() {
		t.Fatalf("gateway b: %q, bodies equal %v", second.Header().Get(HeaderCache), second.Body.String() == first.Body.String())
	}
	if eng.calls.Load() != 1 {
		t.Errorf("engine called %d times", eng.calls.Load())
	}
	// Corrupt every entry: a miss, counted as a get error.
	c := redisClient(t, srv)
	keys, _ := c.Keys(context.Background(), cfg.Redis.KeyPrefix+"*").Result()
	for _, k := range keys {
		c.Set(context.Background(), k, "garbage", time.Minute)
	}
	if w := do(b, "k", streamBody); w.Header().Get(HeaderCache) != "miss" || w.Code != 200 {
		t.Errorf("over a corrupt value: %d %q", w.Code, w.Header().Get(HeaderCache))
	}
	if cntB.get("store_error:get") != 1 {
		t.Errorf("counters %v", cntB)
	}
}

// TestRedisDown: with Redis gone every request still gets its answer
// (a miss), within redis.timeout, and the errors are counted.
func TestRedisDown(t *testing.T) {
	srv := testredis.Start(t)
	cfg := testConfig()
	cfg.Store = StoreRedis
	cfg.Redis = redisConfig(srv)
	cfg.Redis.Timeout = 100 * time.Millisecond
	cnt := newCounters()
	eng := &fakeEngine{}
	p := &cachingProxy{t: t, c: newCache(t, cfg, Deps{Hooks: cnt.hooks()}), model: "m", upstream: eng}
	srv.Pause() // hung: every call waits for its timeout
	start := time.Now()
	w := do(p, "k", jsonBody)
	if w.Code != 200 || w.Header().Get(HeaderCache) != "miss" {
		t.Fatalf("%d %q", w.Code, w.Header().Get(HeaderCache))
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the lookup took %v with redis.timeout 100ms", took)
	}
	waitFor(t, func() bool { return cnt.get("store_error:set") == 1 })
	srv.Resume()
	srv.Stop() // gone: connections refused
	if w := do(p, "k", jsonBody); w.Code != 200 {
		t.Fatalf("redis stopped: %d", w.Code)
	}
	if cnt.get("store_error:get") != 2 {
		t.Errorf("counters %v", cnt)
	}
}

// TestRedisEviction: CheckEviction tells a server without maxmemory or
// with another policy; with maxmemory and allkeys-lru a full server
// evicts old entries and keeps taking new ones.
func TestRedisEviction(t *testing.T) {
	srv := testredis.Start(t)
	c := redisClient(t, srv)
	s := newRedisStore(t, c, srv)
	ctx := context.Background()
	if err := s.CheckEviction(ctx); err == nil || !strings.Contains(err.Error(), "maxmemory") {
		t.Errorf("no maxmemory: %v", err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "4mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckEviction(ctx); err == nil || !strings.Contains(err.Error(), "noeviction") {
		t.Errorf("noeviction: %v", err)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckEviction(ctx); err != nil {
		t.Errorf("allkeys-lru: %v", err)
	}
	body := strings.Repeat("x", 60<<10)
	e := &Entry{Kind: KindJSON, ContentType: "application/json", Body: []byte(body)}
	for i := range 300 { // 18 MB into 4 MB
		if err := s.Set(ctx, testKey(fmt.Sprint(i)), e, time.Hour); err != nil {
			t.Fatalf("set %d: %v", i, err)
		}
	}
	n, err := c.DBSize(ctx).Result()
	if err != nil || n >= 100 || n == 0 {
		t.Errorf("%d keys held in 4 MB (%v)", n, err)
	}
	if got, _ := s.Get(ctx, testKey("299")); got == nil {
		t.Error("the newest entry was evicted")
	}
	// Redis's LRU is approximate (a sample of keys, idle times in whole
	// seconds, all equal here), so any one old entry may survive by
	// chance: 1.1 of the 100 oldest a run on average over 60 runs. Most
	// may not.
	kept := 0
	for i := range 100 {
		if got, _ := s.Get(ctx, testKey(fmt.Sprint(i))); got != nil {
			kept++
		}
	}
	if kept >= 50 {
		t.Errorf("%d of the 100 oldest entries kept", kept)
	}
}

func TestRedisClientOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := NewRedisStore(c, RedisConfig{KeyPrefix: "p", Timeout: time.Second}); err == nil {
		t.Error("a client without ContextTimeoutEnabled was accepted")
	}
	if _, err := DialRedis(RedisConfig{Addr: "unix://relative.sock"}); err == nil {
		t.Error("a relative unix socket was accepted")
	}
}

// waitFor polls cond for up to 5s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
