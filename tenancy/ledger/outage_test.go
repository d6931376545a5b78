package ledger

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferrail/inferrail/internal/testredis"
)

// Redis stopped mid-run: each policy decides as configured, Add is kept
// locally; Redis restarted (empty) on the same address: the same ledger, on
// the same client, works again without a rebuild, and Redis holds exactly
// what the gateway holds, including what it admitted during the outage.
func TestRedisOutageAndRestart(t *testing.T) {
	t.Parallel() // real time: overlaps the other waits
	srv := testredis.Start(t)
	for _, pol := range []Policy{PolicyClosed, PolicyOpen, PolicyLocal} {
		t.Run(string(pol), func(t *testing.T) {
			model := uniqueModel()
			var hook atomic.Int64
			var lastErr atomic.Value
			a := newLedger(t, srv, model, Config{
				OnRedisError: pol, Gateways: 3, Timeout: 200 * time.Millisecond, LeaseTTL: 3 * time.Second,
				OnError: func(op string, err error) { hook.Add(1); lastErr.Store(err) },
			})
			other := newLedger(t, srv, model, Config{LeaseTTL: 3 * time.Second})
			settle(t, a)
			// Before: this gateway holds 6 of 30 on replica 0, another 9.
			if !a.TryAdd(0, 6, 30) || !other.TryAdd(0, 9, 30) {
				t.Fatal("refused with redis up")
			}
			refresh(t, a)
			if a.Reserved(0) != 15 {
				t.Fatalf("reserved %d, want 15", a.Reserved(0))
			}

			srv.Stop()
			start := time.Now()
			first := a.TryAdd(0, 4, 30)
			if el := time.Since(start); el > time.Second {
				t.Errorf("the first decision with redis down took %v", el)
			}
			st := a.Stats()
			if !st.Down || st.Errors < 1 || hook.Load() < 1 {
				t.Fatalf("after the first failure: %+v, hook %d", st, hook.Load())
			}
			if e, _ := lastErr.Load().(error); e == nil || !strings.HasPrefix(e.Error(), "ledger: redis try_add: ") {
				t.Fatalf("hook error %v", e)
			}
			// Down: the next calls do not go to Redis.
			start = time.Now()
			var more []bool
			for range 100 {
				more = append(more, a.TryAdd(0, 1, 30))
			}
			if el := time.Since(start); el > 50*time.Millisecond {
				t.Errorf("100 decisions while down took %v: the request path is still calling redis", el)
			}
			if calls := a.Stats().Calls; calls > st.Calls+2 { // the heartbeat's probes
				t.Errorf("%d calls while down (before: %d)", calls, st.Calls)
			}
			admittedDown := 0
			for _, ok := range more {
				if ok {
					admittedDown++
				}
			}
			switch pol {
			case PolicyClosed:
				if first || admittedDown != 0 || a.Reserved(0) != 15 {
					t.Fatalf("closed: admitted %v and %d, reserved %d (own 6 + the others' 9)", first, admittedDown, a.Reserved(0))
				}
			case PolicyOpen:
				// Admitted past the limit; Reserved shows only its own.
				if !first || admittedDown != 100 || a.Reserved(0) != 110 {
					t.Fatalf("open: admitted %v and %d, reserved %d (want 6 + 4 + 100)", first, admittedDown, a.Reserved(0))
				}
			case PolicyLocal:
				// Its share is 30/3 = 10: 6 + 4, then nothing more.
				if !first || admittedDown != 0 || a.Reserved(0) != 10 || a.Stats().LocalRefused != 100 {
					t.Fatalf("local: admitted %v and %d, reserved %d, %+v", first, admittedDown, a.Reserved(0), a.Stats())
				}
				// A replica it holds nothing on takes one request, whatever its size.
				if !a.TryAdd(1, 50, 30) || a.TryAdd(1, 1, 30) {
					t.Fatal("local: an empty share")
				}
				a.Add(1, -50)
			}
			want := a.Reserved(0) - 6 // the release below, kept locally
			a.Add(0, -6)
			if a.Reserved(0) != want {
				t.Fatalf("Add while down: reserved %d, want %d", a.Reserved(0), want)
			}

			srv.Restart()
			restarted := time.Now()
			// The heartbeat's probe finds Redis again (backoff at most 1s).
			waitFor(t, 5*time.Second, "recovery", func() bool { return !a.Stats().Down })
			t.Logf("%s: recovered %v after the restart, %d calls failed meanwhile", pol, time.Since(restarted).Round(time.Millisecond), a.Stats().Errors)
			if a.Stats().Recoveries != 1 {
				t.Fatalf("recoveries %+v", a.Stats())
			}
			// The first write after the outage restored this gateway's
			// whole vector; the other gateway's comes back with its own
			// heartbeat, within refresh_interval.
			own := a.State().Own[0]
			wantOwn := map[Policy]int{PolicyClosed: 0, PolicyOpen: 104, PolicyLocal: 4}[pol]
			if own != wantOwn {
				t.Fatalf("own %d after the outage, want %d", own, wantOwn)
			}
			obs := newLedger(t, srv, model, Config{LeaseTTL: 3 * time.Second})
			waitFor(t, 5*time.Second, "both gateways' vectors back in redis", func() bool {
				return obs.Refresh(bg) == nil && obs.Reserved(0) == own+9
			})
			// The same ledger admits through Redis again once the fresh
			// state's recovery window has passed.
			settle(t, a)
			before := a.Stats().Admitted
			if !a.TryAdd(2, 5, 30) || a.Stats().Admitted != before+1 {
				t.Fatalf("after the restart: %+v", a.Stats())
			}
			if pol == PolicyOpen && a.TryAdd(0, 1, 30) {
				t.Fatal("open: past the limit with redis back")
			}
		})
	}
}

// A hung Redis (SIGSTOP): the first call waits its timeout, then the
// policy decides and the request path stops calling; SIGCONT: the probe
// finds it again. The write that timed out reaches Redis when it resumes,
// possibly after newer ones: its sequence number keeps it from undoing
// them.
func TestRedisPaused(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	model := uniqueModel()
	const timeout = 100 * time.Millisecond
	a := newLedger(t, srv, model, Config{Timeout: timeout, LeaseTTL: 3 * time.Second})
	settle(t, a)
	if !a.TryAdd(0, 5, 100) {
		t.Fatal("refused")
	}
	srv.Pause()
	paused := true
	defer func() {
		if paused {
			srv.Resume()
		}
	}()
	start := time.Now()
	ok := a.TryAdd(0, 5, 100)
	el := time.Since(start)
	if ok || el < timeout || el > timeout+400*time.Millisecond {
		t.Fatalf("the first call against a hung redis: %v after %v (timeout %v)", ok, el, timeout)
	}
	start = time.Now()
	for range 1000 {
		if a.TryAdd(0, 1, 100) {
			t.Fatal("closed: admitted while down")
		}
	}
	a.Add(0, -5)
	fast := time.Since(start)
	if fast > 100*time.Millisecond {
		t.Errorf("1000 decisions while down took %v", fast)
	}
	time.Sleep(300 * time.Millisecond) // probes time out meanwhile
	srv.Resume()
	paused = false
	resumed := time.Now()
	waitFor(t, 5*time.Second, "recovery", func() bool { return !a.Stats().Down })
	rec := time.Since(resumed)
	t.Logf("hung redis: the first call returned after %v (timeout %v), 1000 more in %v; recovered %v after SIGCONT; %+v", el.Round(time.Millisecond), timeout, fast, rec.Round(time.Millisecond), a.Stats())
	// Whatever order the timed-out writes ran in on resume, Redis holds
	// what the gateway holds: 0.
	obs := newLedger(t, srv, model, Config{})
	time.Sleep(50 * time.Millisecond)
	refresh(t, a)
	refresh(t, obs)
	if got := obs.Reserved(0); got != 0 {
		t.Fatalf("redis holds %d of a gateway that holds 0", got)
	}
}

// After Redis comes up empty, the gateways that held reservations have not
// written them back yet: for 2 x refresh_interval nothing is admitted, then
// admission resumes against every gateway's vector, and Freed says so.
func TestRestartRecoveryWindow(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	model := uniqueModel()
	cfg := Config{RefreshInterval: 100 * time.Millisecond, LeaseTTL: 3 * time.Second}
	a := newLedger(t, srv, model, cfg)
	b := newLedger(t, srv, model, cfg)
	settle(t, a)
	if !b.TryAdd(0, 25, 30) {
		t.Fatal("refused")
	}
	srv.Stop()
	srv.Restart() // empty: b's 25 blocks are not in Redis
	restarted := time.Now()
	for len(a.Freed()) > 0 {
		<-a.Freed()
	}
	// Without the window a would see an empty replica and take 20.
	if a.TryAdd(0, 20, 30) {
		t.Fatalf("admitted on a fresh state: %+v", a.Stats())
	}
	if st := a.Stats(); st.RecoveryRefused == 0 || !st.Recovering {
		t.Fatalf("stats %+v", st)
	}
	var first time.Duration
	waitFor(t, 5*time.Second, "admission to resume", func() bool {
		if a.TryAdd(0, 5, 30) {
			first = time.Since(restarted)
			return true
		}
		return false
	})
	t.Logf("redis restarted empty: admission resumed after %v (window 2 x refresh_interval = %v)", first.Round(time.Millisecond), 2*cfg.RefreshInterval)
	if first < 2*cfg.RefreshInterval-20*time.Millisecond {
		t.Errorf("admitted %v after the restart, before the window's end", first)
	}
	// b's vector is back: 25 + 5 is the limit.
	if a.TryAdd(0, 1, 30) {
		t.Fatal("admitted past b's reservation")
	}
	select {
	case <-a.Freed():
	case <-time.After(time.Second):
		t.Fatal("no Freed signal at the window's end")
	}
}

// Redis unreachable from the start: NewRedis succeeds (no call), the policy
// decides at once, and errors name the operation.
func TestRedisDownAtStart(t *testing.T) {
	srv := testredis.Start(t)
	srv.Stop()
	var errs atomic.Int64
	a := newLedger(t, srv, uniqueModel(), Config{Timeout: 100 * time.Millisecond, OnError: func(string, error) { errs.Add(1) }})
	if a.TryAdd(0, 1, 10) {
		t.Fatal("closed: admitted")
	}
	err := a.Refresh(bg)
	if err == nil || !strings.HasPrefix(err.Error(), "ledger: redis refresh: ") {
		t.Fatalf("refresh: %v", err)
	}
	if err := a.Close(); err == nil || !strings.Contains(err.Error(), "lease_ttl") {
		t.Fatalf("close: %v", err)
	}
	if a.Close() != nil {
		t.Fatal("second close")
	}
	if st := a.Stats(); errs.Load() < 3 || st.Errors != uint64(errs.Load()) || st.Closed != 1 {
		t.Fatalf("%d errors reported, %+v", errs.Load(), st)
	}
}

// rawSync runs sync.lua as gateway r with a chosen nonce, sequence number
// and vector: a write that reached Redis late, or another incarnation's.
func rawSync(t *testing.T, r *Redis, nonce string, seq uint64, vec ...int) int64 {
	t.Helper()
	r.call.Lock()
	defer r.call.Unlock()
	r.args = append(r.args[:0], r.ttl, r.id, nonce, seq, r.window, 0, 0, 0, len(vec))
	for _, b := range vec {
		r.args = append(r.args, b)
	}
	v, err := r.run(syncScript)
	if err != nil {
		t.Fatal(err)
	}
	return v[0]
}

// A write older than the one stored (same instance, lower sequence number)
// is discarded; a write of another incarnation under the same gateway id
// (a restart) replaces the stored vector, and the next write of the
// current one replaces it back.
func TestStaleWriteDiscarded(t *testing.T) {
	srv := testredis.Start(t)
	model := uniqueModel()
	a := newLedger(t, srv, model, Config{})
	obs := newLedger(t, srv, model, Config{})
	settle(t, a)
	a.halt() // only this test's refreshes write a's vector: a heartbeat between two steps would undo the other incarnation's write
	a.Add(0, 7)
	a.mu.Lock()
	seq := a.seq
	a.mu.Unlock()
	if code := rawSync(t, a, a.nonce, seq-1, 100); code != -1 {
		t.Fatalf("an older write: code %d, want -1 (stale)", code)
	}
	refresh(t, obs)
	if obs.Reserved(0) != 7 {
		t.Fatalf("after a stale write redis holds %d, want 7", obs.Reserved(0))
	}
	if code := rawSync(t, a, "another", 1, 3); code != 1 {
		t.Fatalf("another incarnation's write: code %d", code)
	}
	refresh(t, obs)
	if obs.Reserved(0) != 3 {
		t.Fatalf("after another incarnation's write: %d, want 3", obs.Reserved(0))
	}
	refresh(t, a)
	refresh(t, obs)
	if obs.Reserved(0) != 7 {
		t.Fatalf("after the current incarnation wrote again: %d, want 7", obs.Reserved(0))
	}
}
