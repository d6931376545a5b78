package limit

import (
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestFormatReset(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                           "0s",
		-time.Second:                "0s",
		17 * time.Millisecond:       "17ms",
		999 * time.Microsecond:      "1ms",
		1200 * time.Millisecond:     "1.2s",
		1234567891:                  "1.235s",
		6 * time.Minute:             "6m0s",
		time.Hour + time.Second:     "1h0m1s",
		59999999 * time.Microsecond: "1m0s",
	} {
		if got := FormatReset(d); got != want {
			t.Errorf("FormatReset(%v) = %q, want %q", d, got, want)
		}
	}
	for d, want := range map[time.Duration]int{0: 0, 1: 1, time.Second: 1, time.Second + time.Millisecond: 2, 6 * time.Second: 6} {
		if got := (&Decision{RetryAfter: d}).RetryAfterSeconds(); got != want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", d, got, want)
		}
	}
	// an allowed decision never carries Retry-After
	h := http.Header{}
	(&Decision{Allowed: true, RetryAfter: time.Second}).SetHeaders(h)
	if len(h) != 0 {
		t.Fatal(h)
	}
}

func TestShare(t *testing.T) {
	for _, c := range [][3]int{{0, 3, 0}, {9, 3, 3}, {10, 3, 3}, {2, 3, 1}, {1, 10, 1}, {100, 1, 100}, {100, 0, 100}} {
		if got := share(c[0], c[1]); got != c[2] {
			t.Errorf("share(%d, %d) = %d, want %d", c[0], c[1], got, c[2])
		}
	}
}

func TestLocalConfig(t *testing.T) {
	if _, err := NewLocal(Config{Window: time.Microsecond}); !errors.Is(err, ErrInvalid) {
		t.Errorf("window 1µs: %v", err)
	}
	if _, err := NewLocal(Config{LeaseTTL: -time.Second}); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative lease ttl: %v", err)
	}
}

// Idle buckets are swept: drained and without a live lease.
func TestLocalSweep(t *testing.T) {
	clk := newFakeClock()
	l, err := NewLocal(Config{Now: clk.Now, LeaseTTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		reserve(t, l, Request{Buckets: one("b"+string(rune('0'+i%10))+string(rune('0'+i/10)), Limits{RPM: 10, TPM: 1000}), Tokens: 10})
	}
	held := reserve(t, l, Request{Buckets: one("held", Limits{MaxConcurrency: 1})})
	if l.size() != 101 {
		t.Fatalf("size %d", l.size())
	}
	clk.Advance(2 * time.Minute)
	reserve(t, l, Request{Buckets: one("new", Limits{RPM: 1})})
	if n := l.size(); n != 2 {
		t.Fatalf("after the sweep: %d buckets, want 2 (held's live lease, new)", n)
	}
	finish(t, l, held, 0)
	// a Finish after its bucket was swept recreates it for an extra charge
	d := reserve(t, l, Request{Buckets: one("debt", Limits{TPM: 100}), Tokens: 10})
	clk.Advance(3 * time.Minute)
	reserve(t, l, Request{Buckets: one("x", Limits{RPM: 1})}) // sweeps "debt"
	finish(t, l, d, 150)                                      // 140 extra
	if d := reserve(t, l, Request{Buckets: one("debt", Limits{TPM: 100})}); d.Allowed || d.Reason != ReasonTPM {
		t.Fatalf("extra charge on a swept bucket lost: %+v", d)
	}
}

// Keep renews while the request runs, on a fake clock (synctest): the slot
// stays held for minutes; after stop, it expires within the TTL. A lease
// already lost ends the renewals with ErrLeaseLost.
func TestKeep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := NewLocal(Config{LeaseTTL: 30 * time.Second}) // time.Now: the bubble's clock
		if err != nil {
			t.Fatal(err)
		}
		req := Request{Buckets: one("k", Limits{MaxConcurrency: 1})}
		a := reserve(t, l, req)
		var errs atomic.Int64
		stop := Keep(l, a.Reservation, 0, func(error) { errs.Add(1) })
		time.Sleep(5 * time.Minute)
		if d := reserve(t, l, req); d.Allowed {
			t.Fatal("a kept lease expired")
		}
		stop()
		stop() // twice is fine
		time.Sleep(30*time.Second + time.Millisecond)
		b := reserve(t, l, req)
		if !b.Allowed || errs.Load() != 0 {
			t.Fatalf("after stop + TTL: %+v, %d renewal errors", b, errs.Load())
		}
		// a's lease is gone: Keep reports it and stops by itself
		var lost error
		var mu sync.Mutex
		stopA := Keep(l, a.Reservation, time.Second, func(err error) { mu.Lock(); lost = err; mu.Unlock() })
		time.Sleep(2 * time.Second)
		synctest.Wait()
		mu.Lock()
		if !errors.Is(lost, ErrLeaseLost) {
			t.Fatalf("renewing a lost lease: %v", lost)
		}
		mu.Unlock()
		stopA()
		// no lease: nothing started
		c := reserve(t, l, Request{Buckets: one("r", Limits{RPM: 5})})
		Keep(l, c.Reservation, 0, nil)()
		Keep(l, nil, 0, nil)()
	})
}

// The hot path's allocations: Reserve (the Reservation) and Finish (none).
func TestLocalAllocs(t *testing.T) {
	l, err := NewLocal(Config{})
	if err != nil {
		t.Fatal(err)
	}
	req := benchRequest(true)
	n := testing.AllocsPerRun(1000, func() {
		d, _ := l.Reserve(bg, req)
		_ = l.Finish(bg, d.Reservation, 300)
	})
	if n > 1 {
		t.Fatalf("%.1f allocations per Reserve+Finish, want ≤ 1", n)
	}
}

func TestLocalForeignAndOpen(t *testing.T) {
	a, _ := NewLocal(Config{})
	b, _ := NewLocal(Config{})
	d := reserve(t, a, Request{Buckets: one("k", Limits{MaxConcurrency: 1})})
	if err := b.Renew(bg, d.Reservation); !errors.Is(err, ErrInvalid) {
		t.Fatalf("renew on another limiter: %v", err)
	}
	open := &Reservation{kind: kindOpen}
	if a.Finish(bg, open, 1) != nil || a.Renew(bg, open) != nil {
		t.Fatal("open reservations are no-ops")
	}
}

// The config structs decode from YAML with the documented field names.
func TestRedisConfigYAML(t *testing.T) {
	var cfg RedisConfig
	src := "window: 1m\nlease_ttl: 45s\nkey_prefix: gw\nhash_tag: limits\non_redis_error: local\ngateways: 3\ntimeout: 25ms\n"
	if err := yaml.Unmarshal([]byte(src), &cfg); err != nil {
		t.Fatal(err)
	}
	want := RedisConfig{Config: Config{Window: time.Minute, LeaseTTL: 45 * time.Second}, KeyPrefix: "gw", HashTag: "limits", OnRedisError: PolicyLocal, Gateways: 3, Timeout: 25 * time.Millisecond}
	if cfg.Window != want.Window || cfg.LeaseTTL != want.LeaseTTL || cfg.KeyPrefix != want.KeyPrefix || cfg.HashTag != want.HashTag ||
		cfg.OnRedisError != want.OnRedisError || cfg.Gateways != want.Gateways || cfg.Timeout != want.Timeout {
		t.Fatalf("decoded %+v", cfg)
	}
	var lim Limits
	if err := yaml.Unmarshal([]byte("rpm: 60\ntpm: 90000\nmax_concurrency: 4\n"), &lim); err != nil || lim != (Limits{60, 90000, 4}) {
		t.Fatalf("limits %+v %v", lim, err)
	}
}
