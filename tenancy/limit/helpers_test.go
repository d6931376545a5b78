package limit

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/inferrail/inferrail/internal/testredis"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

var bg = context.Background()

// TestMain silences go-redis's own log (its dial failures while a test has
// stopped the server); the limiter reports errors through OnError.
func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// fakeClock is a synthetic clock for Local.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// harness makes limiters of one implementation: fresh state each, and a
// function that moves the limiter's clock forward.
type harness struct {
	name string
	// exact: the clock does not move between calls (synthetic); false for a
	// real server, whose clock runs a little between calls.
	exact bool
	new   func(t *testing.T, cfg Config) (Limiter, func(time.Duration))
}

func localHarness() harness {
	return harness{name: "local", exact: true, new: func(t *testing.T, cfg Config) (Limiter, func(time.Duration)) {
		clk := newFakeClock()
		cfg.Now = clk.Now
		l, err := NewLocal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return l, clk.Advance
	}}
}

var prefixSeq atomic.Uint64

func uniquePrefix() string { return fmt.Sprintf("t%d", prefixSeq.Add(1)) }

// clientOptions are what the tests (and a gateway) give go-redis: context
// deadlines honoured, no maintenance-notification handshake (a Redis Cloud
// feature that Debian's 7.0 does not know).
func clientOptions(network, addr string) *redis.Options {
	return &redis.Options{
		Network:                  network,
		Addr:                     addr,
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

func newClient(t testing.TB, network, addr string) *redis.Client {
	c := redis.NewClient(clientOptions(network, addr))
	t.Cleanup(func() { c.Close() })
	return c
}

func newRedisLimiter(t testing.TB, c redis.Scripter, cfg RedisConfig) *Redis {
	t.Helper()
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = uniquePrefix()
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second // shared 2-core machine: the tests are not about latency
	}
	r, err := NewRedis(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// miniHarness runs the Redis limiter on miniredis, whose TIME is frozen by
// SetTime: the scripts' clock moves only by advance.
func miniHarness() harness {
	return harness{name: "miniredis", exact: true, new: func(t *testing.T, cfg Config) (Limiter, func(time.Duration)) {
		m := miniredis.RunT(t)
		m.SetTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		r := newRedisLimiter(t, newClient(t, "tcp", m.Addr()), RedisConfig{Config: cfg})
		return r, r.advance
	}}
}

// realHarness runs the Redis limiter on one real redis-server, started now
// for t, each limiter under its own key prefix.
func realHarness(t *testing.T) harness {
	srv := testredis.Start(t)
	return harness{name: "redis", new: func(st *testing.T, cfg Config) (Limiter, func(time.Duration)) {
		r := newRedisLimiter(st, newClient(st, srv.Network, srv.Addr), RedisConfig{Config: cfg})
		return r, r.advance
	}}
}

func reserve(t *testing.T, l Limiter, req Request) Decision {
	t.Helper()
	d, err := l.Reserve(bg, req)
	if err != nil {
		t.Fatalf("reserve: %v", err)
	}
	return d
}

func finish(t *testing.T, l Limiter, d Decision, used int) {
	t.Helper()
	if err := l.Finish(bg, d.Reservation, used); err != nil {
		t.Fatalf("finish: %v", err)
	}
}

func one(id string, lim Limits) []Bucket { return []Bucket{{ID: id, Limits: lim}} }

// near reports whether got is within tol of want.
func near(got, want, tol time.Duration) bool { return got >= want-tol && got <= want+tol }
