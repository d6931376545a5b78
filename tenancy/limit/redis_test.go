package limit

import (
	"errors"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferrail/inferrail/internal/testredis"
	"github.com/redis/go-redis/v9"
)

// Redis stopped: each policy decides as configured; Redis restarted on the
// same address: the same limiter, on the same client, works again.
func TestRedisOutageAndRestart(t *testing.T) {
	t.Parallel() // real time: overlaps the other waits
	srv := testredis.Start(t)
	for _, pol := range []Policy{PolicyClosed, PolicyOpen, PolicyLocal} {
		t.Run(string(pol), func(t *testing.T) {
			var hook atomic.Int64
			var lastErr atomic.Value
			r := newRedisLimiter(t, newClient(t, srv.Network, srv.Addr), RedisConfig{
				OnRedisError: pol, Gateways: 3, Timeout: 200 * time.Millisecond,
				OnError: func(op string, err error) { hook.Add(1); lastErr.Store(err) },
			})
			req := Request{Buckets: one("key", Limits{RPM: 9, MaxConcurrency: 9})}
			before := reserve(t, r, req)
			if !before.Allowed || before.Fallback != "" {
				t.Fatalf("redis up: %+v", before)
			}

			srv.Stop()
			start := time.Now()
			d := reserve(t, r, req)
			if el := time.Since(start); el > time.Second {
				t.Errorf("decision with redis down took %v", el)
			}
			switch pol {
			case PolicyClosed:
				if d.Allowed || d.Reason != ReasonUnavailable || !d.IsUnavailable() || d.Fallback != PolicyClosed || d.RetryAfterSeconds() != 1 {
					t.Fatalf("closed: %+v", d)
				}
			case PolicyOpen:
				if !d.Allowed || d.Fallback != PolicyOpen {
					t.Fatalf("open: %+v", d)
				}
				finish(t, r, d, 5)
			case PolicyLocal:
				// this gateway's share: 9/3 = 3 requests
				n := 1
				for ; n < 10; n++ {
					if !d.Allowed || d.Fallback != PolicyLocal {
						break
					}
					finish(t, r, d, 0) // the local reservation, through the Redis limiter
					d = reserve(t, r, req)
				}
				if n != 4 || d.Reason != ReasonRPM || d.Fallback != PolicyLocal {
					t.Fatalf("local share: %d admitted (want 3), last %+v", n-1, d)
				}
			}
			// a reservation made before the outage cannot be finished: an
			// error (counted), not a panic; its lease expires by itself
			if err := r.Finish(bg, before.Reservation, 0); err == nil {
				t.Fatal("finish with redis down: no error")
			}
			st := r.Stats()
			if st.Errors < 2 || hook.Load() != int64(st.Errors) {
				t.Fatalf("stats %+v, hook %d", st, hook.Load())
			}
			if e, _ := lastErr.Load().(error); e == nil || !strings.HasPrefix(e.Error(), "limit: redis ") {
				t.Fatalf("hook error %v", e)
			}
			switch pol {
			case PolicyClosed:
				if st.Closed == 0 || st.Open+st.Local != 0 {
					t.Fatalf("stats %+v", st)
				}
			case PolicyOpen:
				if st.Open == 0 || st.Closed+st.Local != 0 {
					t.Fatalf("stats %+v", st)
				}
			case PolicyLocal:
				if st.Local != 4 || st.Closed+st.Open != 0 {
					t.Fatalf("stats %+v", st)
				}
			}

			srv.Restart()
			errsBefore := r.Stats().Errors
			start = time.Now()
			attempts := 0
			for {
				attempts++
				d = reserve(t, r, req)
				if d.Fallback == "" || attempts == 5 {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if !d.Allowed || d.Fallback != "" {
				t.Fatalf("after restart (%d attempts): %+v", attempts, d)
			}
			// the restarted server is empty: limits restart from zero
			if d.Requests.Remaining != 8 {
				t.Fatalf("after restart: remaining %d, want 8 (empty server)", d.Requests.Remaining)
			}
			finish(t, r, d, 0)
			t.Logf("%s: recovered on attempt %d, %v after restart; %d errors during the outage", pol, attempts, time.Since(start).Round(time.Millisecond), errsBefore)
		})
	}
}

// A hung server (SIGSTOP): each call is bounded by Timeout and the policy
// applies; SIGCONT: back to normal.
func TestRedisHang(t *testing.T) {
	srv := testredis.Start(t)
	r := newRedisLimiter(t, newClient(t, srv.Network, srv.Addr), RedisConfig{Timeout: 50 * time.Millisecond})
	req := Request{Buckets: one("k", Limits{RPM: 100})}
	if d := reserve(t, r, req); !d.Allowed {
		t.Fatal(d)
	}
	srv.Pause()
	var worst time.Duration
	for range 3 {
		start := time.Now()
		d := reserve(t, r, req)
		worst = max(worst, time.Since(start))
		if d.Reason != ReasonUnavailable {
			t.Fatalf("hung redis, closed policy: %+v", d)
		}
	}
	srv.Resume()
	if worst > 500*time.Millisecond {
		t.Fatalf("a call to a hung redis took %v with timeout 50ms", worst)
	}
	var d Decision
	for range 20 {
		if d = reserve(t, r, req); d.Allowed {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !d.Allowed {
		t.Fatalf("after SIGCONT: %+v", d)
	}
	t.Logf("slowest call while hung: %v (timeout 50ms)", worst.Round(time.Millisecond))
}

// Keys carry the hash tag and a TTL, and idle buckets vanish.
func TestRedisKeys(t *testing.T) {
	t.Parallel() // real time: overlaps the other waits
	srv := testredis.Start(t)
	c := newClient(t, srv.Network, srv.Addr)
	r := newRedisLimiter(t, c, RedisConfig{KeyPrefix: "ir", HashTag: "rl", Config: Config{LeaseTTL: 2 * time.Second}})
	d := reserve(t, r, Request{Buckets: []Bucket{
		{ID: "key:k1", Limits: Limits{RPM: 6000, MaxConcurrency: 3}},
		{ID: "global", Limits: Limits{TPM: 60000}},
	}, Tokens: 10})
	if !d.Allowed {
		t.Fatal(d)
	}
	keys, err := c.Keys(bg, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"ir:{rl}:r:key:k1": true, "ir:{rl}:c:key:k1": true, "ir:{rl}:r:global": true}
	if len(keys) != len(want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	for _, k := range keys {
		if !want[k] {
			t.Fatalf("unexpected key %q", k)
		}
	}
	if r.Key("global") != "ir:{rl}:r:global" {
		t.Fatal(r.Key("global"))
	}
	// level 1 of 6000/min drains in 10ms; 10 tokens of 60000/min in 10ms:
	// TTL = drain time + 1s. The lease set lives LeaseTTL + 1s.
	for k, lo := range map[string]time.Duration{"ir:{rl}:r:key:k1": 900 * time.Millisecond, "ir:{rl}:r:global": 900 * time.Millisecond, "ir:{rl}:c:key:k1": 2900 * time.Millisecond} {
		ttl, err := c.PTTL(bg, k).Result()
		if err != nil || ttl < lo || ttl > lo+200*time.Millisecond {
			t.Fatalf("%s: pttl %v (%v), want about %v", k, ttl, err, lo+100*time.Millisecond)
		}
	}
	finish(t, r, d, 10)
	time.Sleep(1100 * time.Millisecond)
	if n, _ := c.Exists(bg, "ir:{rl}:r:key:k1", "ir:{rl}:r:global").Result(); n != 0 {
		t.Fatalf("%d idle level keys still there after their TTL", n)
	}
	// the released lease set is empty: Redis deletes an empty zset
	if n, _ := c.Exists(bg, "ir:{rl}:c:key:k1").Result(); n != 0 {
		t.Fatal("empty lease set still there")
	}
}

// Leases on the real server's clock: a crashed holder's slot is free after
// LeaseTTL; a renewed one is kept.
func TestRedisLeaseRealTime(t *testing.T) {
	t.Parallel() // real time: overlaps the other waits
	srv := testredis.Start(t)
	ttl := 300 * time.Millisecond
	r := newRedisLimiter(t, newClient(t, srv.Network, srv.Addr), RedisConfig{Config: Config{LeaseTTL: ttl}})
	req := Request{Buckets: one("k", Limits{MaxConcurrency: 1})}
	crashed := reserve(t, r, req)
	if !crashed.Allowed {
		t.Fatal(crashed)
	}
	start := time.Now()
	var freed time.Duration
	for time.Since(start) < 3*ttl {
		if d := reserve(t, r, req); d.Allowed {
			freed = time.Since(start)
			finish(t, r, d, 0)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if freed == 0 || freed > ttl+100*time.Millisecond || freed < ttl-50*time.Millisecond {
		t.Fatalf("crashed holder's slot freed after %v, want about the TTL %v", freed, ttl)
	}
	held := reserve(t, r, req)
	var lost atomic.Value
	stop := Keep(r, held.Reservation, ttl/3, func(err error) { lost.Store(err) })
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		if d := reserve(t, r, req); d.Allowed {
			t.Fatal("a kept lease expired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if e := lost.Load(); e != nil {
		t.Fatalf("renewal error: %v", e)
	}
	finish(t, r, held, 0)
	if d := reserve(t, r, req); !d.Allowed {
		t.Fatal("slot not free after finish")
	}
	t.Logf("crashed holder's slot free after %v (lease TTL %v)", freed.Round(time.Millisecond), ttl)
}

// SCRIPT FLUSH (or a restarted server): EVALSHA's NOSCRIPT falls back to
// EVAL, which loads the script again.
func TestRedisScriptFlush(t *testing.T) {
	srv := testredis.Start(t)
	c := newClient(t, srv.Network, srv.Addr)
	r := newRedisLimiter(t, c, RedisConfig{})
	req := Request{Buckets: one("k", Limits{RPM: 10, TPM: 100, MaxConcurrency: 2}), Tokens: 10}
	d := reserve(t, r, req)
	if err := c.ScriptFlush(bg).Err(); err != nil {
		t.Fatal(err)
	}
	finish(t, r, d, 20)
	if err := c.ScriptFlush(bg).Err(); err != nil {
		t.Fatal(err)
	}
	d = reserve(t, r, req)
	if !d.Allowed || d.Requests.Remaining != 8 || d.Tokens.Remaining != 70 {
		t.Fatalf("after flushes: %+v", d)
	}
	if err := c.ScriptFlush(bg).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Renew(bg, d.Reservation); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Errors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRedisConfig(t *testing.T) {
	good := redis.NewClient(clientOptions("unix", "/nonexistent"))
	defer good.Close()
	for _, c := range []struct {
		cfg RedisConfig
		msg string
	}{
		{RedisConfig{OnRedisError: "sometimes"}, `on_redis_error "sometimes"`},
		{RedisConfig{Gateways: -1}, "gateways -1"},
		{RedisConfig{Timeout: -time.Second}, "timeout -1s"},
		{RedisConfig{HashTag: "a}b"}, "hash_tag"},
		{RedisConfig{KeyPrefix: "{x"}, "key_prefix"},
		{RedisConfig{Config: Config{Window: -time.Minute}}, "window -1m0s"},
		{RedisConfig{Config: Config{LeaseTTL: time.Nanosecond}}, "lease_ttl 1ns"},
	} {
		_, err := NewRedis(good, c.cfg)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%+v: %v, want an error about %s", c.cfg, err, c.msg)
		}
	}
	plain := redis.NewClient(&redis.Options{Network: "unix", Addr: "/nonexistent"})
	defer plain.Close()
	if _, err := NewRedis(plain, RedisConfig{}); err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
		t.Errorf("a client without context timeouts: %v", err)
	}
	if _, err := NewRedis(nil, RedisConfig{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil client: %v", err)
	}
	r, err := NewRedis(good, RedisConfig{})
	if err != nil || r.cfg.OnRedisError != PolicyClosed || r.cfg.Timeout != DefaultTimeout || r.cfg.Gateways != 1 || r.cfg.Window != time.Minute {
		t.Fatalf("defaults: %+v %v", r.cfg, err)
	}
	// redis unreachable from the start: closed by default, no error
	d, err := r.Reserve(bg, Request{Buckets: one("k", Limits{RPM: 1})})
	if err != nil || d.Reason != ReasonUnavailable {
		t.Fatalf("unreachable: %+v %v", d, err)
	}
}

// Three gateways (three limiters, three go-redis clients) on one real
// Redis, 64 goroutines on one key, for three windows of 1 s of real time
// on the server's clock. Checked on the server's timestamps of every
// admission: the pairwise bound on requests and on tokens (invariant 2),
// concurrency never above its limit.
func TestRedisThreeGateways(t *testing.T) {
	if testing.Short() {
		t.Skip("3 s of real time")
	}
	srv := testredis.Start(t)
	const (
		w       = time.Second
		rpm     = 200
		tpm     = 12000
		conc    = 8
		workers = 64
		runFor  = 3 * time.Second
	)
	prefix := uniquePrefix()
	var lims [3]*Redis
	for i := range lims {
		lims[i] = newRedisLimiter(t, newClient(t, srv.Network, srv.Addr), RedisConfig{
			Config: Config{Window: w}, KeyPrefix: prefix, Timeout: 5 * time.Second, Gateways: 3,
		})
	}
	type admit struct {
		at     time.Time
		tokens int
	}
	var (
		mu       sync.Mutex
		admits   []admit
		reasons  = map[Reason]int{}
		calls    atomic.Int64
		inflight atomic.Int64
		peak     atomic.Int64
		wg       sync.WaitGroup
	)
	stopAt := time.Now().Add(runFor)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := lims[g%3]
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for time.Now().Before(stopAt) {
				est := 20 + rng.IntN(91)
				d, err := l.Reserve(bg, Request{Buckets: one("key:shared", Limits{RPM: rpm, TPM: tpm, MaxConcurrency: conc}), Tokens: est})
				calls.Add(1)
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					mu.Lock()
					reasons[d.Reason]++
					mu.Unlock()
					time.Sleep(time.Duration(1+rng.IntN(3)) * time.Millisecond)
					continue
				}
				n := inflight.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				mu.Lock()
				admits = append(admits, admit{d.At, est})
				mu.Unlock()
				time.Sleep(time.Duration(5+rng.IntN(11)) * time.Millisecond)
				inflight.Add(-1)
				if err := l.Finish(bg, d.Reservation, est); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	for i, l := range lims {
		if st := l.Stats(); st.Errors != 0 {
			t.Fatalf("gateway %d: redis errors %+v", i, st)
		}
	}
	// server order: by the server's timestamps (one script at a time, so
	// this is the admission order up to equal microseconds)
	sort.Slice(admits, func(i, j int) bool { return admits[i].at.Before(admits[j].at) })
	at := make([]time.Time, len(admits))
	ones := make([]float64, len(admits))
	toks := make([]float64, len(admits))
	for i, a := range admits {
		at[i], ones[i], toks[i] = a.at, 1, float64(a.tokens)
	}
	checkPairwise(t, at, ones, rpm, w, 0)
	checkPairwise(t, at, toks, tpm, w, 0)
	if p := peak.Load(); p > conc {
		t.Fatalf("peak in flight %d > max_concurrency %d", p, conc)
	}
	span := at[len(at)-1].Sub(at[0])
	reqBound := rpm + float64(span)*rpm/float64(w)
	tokBound := tpm + float64(span)*tpm/float64(w)
	totalTok := 0.0
	for _, x := range toks {
		totalTok += x
	}
	if float64(len(at)) > reqBound || totalTok > tokBound {
		t.Fatalf("total %d requests / %.0f tokens over %v, bounds %.1f / %.0f", len(at), totalTok, span, reqBound, tokBound)
	}
	perReq := windowSums(at, ones, at[0], w)
	perTok := windowSums(at, toks, at[0], w)
	t.Logf("3 gateways, %d goroutines, %v: %d calls, %d admitted over %v on the server clock (bound L + span·L/W = %.1f), %.0f tokens (bound %.0f)",
		workers, runFor, calls.Load(), len(at), span.Round(time.Millisecond), reqBound, totalTok, tokBound)
	t.Logf("per 1 s window (W): requests %v (RPM %d), tokens %v (TPM %d); peak in flight %d (max %d); refusals %v",
		perReq, rpm, perTok, tpm, peak.Load(), conc, reasons)
}
