package ledger

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/inferrail/inferrail/internal/testredis"
)

var bg = context.Background()

// TestMain silences go-redis's own log (its dial failures while a test has
// stopped the server); the ledger reports errors through OnError.
func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

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

// newClient is a go-redis client of its own (each gateway has one).
func newClient(t testing.TB, srv *testredis.Server) *redis.Client {
	c := redis.NewClient(clientOptions(srv.Network, srv.Addr))
	t.Cleanup(func() { c.Close() })
	return c
}

var modelSeq atomic.Uint64

// uniqueModel names a model no other test uses, so that each test's ledger
// has keys of its own on a shared server.
func uniqueModel() string { return fmt.Sprintf("m%d", modelSeq.Add(1)) }

// newLedger is a Redis ledger for model on a client of its own, closed when
// the test ends. Zero Timeout: 2s (a shared 2-core machine; the tests that
// are about latency set their own).
func newLedger(t testing.TB, srv *testredis.Server, model string, cfg Config) *Redis {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
		if cfg.LeaseTTL == 0 {
			cfg.LeaseTTL = 10 * time.Second
		}
		cfg.Timeout = min(cfg.Timeout, cfg.LeaseTTL/3)
	}
	r, err := NewRedis(newClient(t, srv), model, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// refresh runs r's heartbeat now and fails the test if it fails.
func refresh(t testing.TB, r *Redis) {
	t.Helper()
	if err := r.Refresh(bg); err != nil {
		t.Fatalf("refresh: %v", err)
	}
}

// waitFor polls cond every 5ms for at most d and reports how long it took.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// refTryAdd is the reference TryAdd on a LocalLedger: the Reserver contract
// for one gateway alone.
func refTryAdd(l interface {
	Reserved(int) int
	Add(int, int)
}, replica, weight, limit int) bool {
	if replica < 0 || replica >= MaxReplicas || weight < 0 {
		return false
	}
	if r := l.Reserved(replica); r != 0 && r+weight > limit {
		return false
	}
	l.Add(replica, weight)
	return true
}

// settle waits (at most 5s) until r's state is past its recovery window:
// a fresh state (a new model's keys) admits nothing for 2 x
// refresh_interval.
func settle(t testing.TB, r *Redis) {
	t.Helper()
	waitFor(t, 5*time.Second, "the recovery window to end", func() bool {
		return r.Refresh(bg) == nil && !r.State().Recovering
	})
}
