package ledger

import (
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/internal/testredis"
	"github.com/inferrail/inferrail/router/gateway"
)

// TestConformanceLocal: for one gateway alone, random sequences of
// Reserved, Add and TryAdd get the same answers from the Redis ledger as
// from a gateway.LocalLedger (with the reference TryAdd), and after each
// sequence a second gateway reading Redis sees exactly what the first holds.
func TestConformanceLocal(t *testing.T) {
	srv := testredis.Start(t)
	obsClient := newClient(t, srv)
	model := uniqueModel()
	settle(t, newLedger(t, srv, model, Config{}))
	rapid.Check(t, func(rt *rapid.T) {
		// A new gateway each time, on a settled state; each leaves at
		// its end (Close), so each starts from nothing, as a new
		// LocalLedger does.
		r, err := NewRedis(newClient(t, srv), model, Config{Timeout: 2e9})
		if err != nil {
			rt.Fatal(err)
		}
		defer r.Close()
		ref := gateway.NewLocalLedger()
		n := rapid.IntRange(1, 200).Draw(rt, "ops")
		for i := range n {
			rep := rapid.IntRange(-1, 6).Draw(rt, "replica")
			switch rapid.IntRange(0, 2).Draw(rt, "op") {
			case 0:
				if got, want := r.Reserved(rep), ref.Reserved(rep); got != want {
					rt.Fatalf("op %d: Reserved(%d) = %d, local %d", i, rep, got, want)
				}
			case 1:
				d := rapid.IntRange(-60, 60).Draw(rt, "delta")
				r.Add(rep, d)
				ref.Add(rep, d)
			case 2:
				w := rapid.IntRange(-1, 60).Draw(rt, "weight")
				lim := rapid.IntRange(0, 100).Draw(rt, "limit")
				if got, want := r.TryAdd(rep, w, lim), refTryAdd(ref, rep, w, lim); got != want {
					rt.Fatalf("op %d: TryAdd(%d, %d, %d) = %v, local %v", i, rep, w, lim, got, want)
				}
			}
		}
		for rep := range 8 {
			if got, want := r.Reserved(rep), ref.Reserved(rep); got != want {
				rt.Fatalf("end: Reserved(%d) = %d, local %d", rep, got, want)
			}
		}
		if st := r.Stats(); st.Errors != 0 || st.Down {
			rt.Fatalf("stats %+v", st)
		}
		// Another gateway sees the same in Redis.
		obs, err := NewRedis(obsClient, model, Config{Timeout: 2e9})
		if err != nil {
			rt.Fatal(err)
		}
		defer obs.Close()
		if err := obs.Refresh(bg); err != nil {
			rt.Fatal(err)
		}
		for rep := range 8 {
			if got, want := obs.Reserved(rep), ref.Reserved(rep); got != want {
				rt.Fatalf("another gateway sees Reserved(%d) = %d, local %d", rep, got, want)
			}
		}
	})
}

// Two gateways: each sees the other's reservations, TryAdd decides on the
// state in Redis even when the snapshot is stale, an empty replica takes
// any weight, and Close takes a gateway's reservations out at once.
func TestTwoGateways(t *testing.T) {
	srv := testredis.Start(t)
	model := uniqueModel()
	a := newLedger(t, srv, model, Config{})
	b := newLedger(t, srv, model, Config{})
	settle(t, a)
	refresh(t, b)
	// Only this test's calls refresh b's snapshot: a heartbeat between a's
	// reservation and the check below would show it to b (CI, loaded,
	// took more than the 250 ms between two once).
	b.halt()
	if a.ID() == b.ID() || len(a.ID()) != 12 {
		t.Fatalf("ids %q %q", a.ID(), b.ID())
	}
	if !a.TryAdd(2, 150, 100) { // empty: takes more than the limit
		t.Fatal("an empty replica refused")
	}
	if b.Reserved(2) != 0 { // b's snapshot predates a's reservation
		t.Fatalf("b's snapshot %d before any reply", b.Reserved(2))
	}
	if b.TryAdd(2, 1, 100) {
		t.Fatal("b admitted on a replica over the limit")
	}
	if b.Reserved(2) != 150 || b.Stats().Refused != 1 {
		t.Fatalf("b after a refusal: reserved %d, %+v", b.Reserved(2), b.Stats())
	}
	a.Add(2, -150)
	if !b.TryAdd(2, 60, 100) || !a.TryAdd(2, 40, 100) || a.TryAdd(2, 1, 100) || b.TryAdd(2, 1, 100) {
		t.Fatal("60 + 40 within 100, then nothing more")
	}
	refresh(t, a)
	if a.Reserved(2) != 100 || b.Reserved(2) != 100 {
		t.Fatalf("reserved %d / %d, want 100", a.Reserved(2), b.Reserved(2))
	}
	st := a.State()
	if st.Own[2] != 40 || st.Others[2] != 60 || st.Peak[2] != 150 {
		t.Fatalf("a's state %+v", st)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	refresh(t, a)
	if a.Reserved(2) != 40 {
		t.Fatalf("after b closed: %d", a.Reserved(2))
	}
	if b.TryAdd(2, 1, 100) || b.Close() != nil {
		t.Fatal("a closed ledger admitted, or a second Close failed")
	}
	select {
	case <-a.Freed():
	default:
		t.Fatal("no Freed signal after other gateways released")
	}
}

// The keys carry the prefix and one hash tag per model; bad settings are
// refused with the field named.
func TestConfig(t *testing.T) {
	srv := testredis.Start(t)
	r := newLedger(t, srv, "llama-3", Config{KeyPrefix: "dep1"})
	want := []string{"dep1:{ledger:llama-3}:l", "dep1:{ledger:llama-3}:v", "dep1:{ledger:llama-3}:e"}
	if got := r.Keys(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("keys %v", got)
	}
	d, err := NewRedis(newClient(t, srv), "x", Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if c := d.cfg; c.LeaseTTL != DefaultLeaseTTL || c.RefreshInterval != DefaultRefresh || c.Timeout != DefaultTimeout || c.OnRedisError != PolicyClosed || c.Gateways != 1 || c.KeyPrefix != "ir" {
		t.Fatalf("defaults %+v", c)
	}
	noTimeouts := newClient(t, srv)
	noTimeouts.Options().ContextTimeoutEnabled = false
	for _, tc := range []struct {
		model string
		cfg   Config
		field string
	}{
		{"", Config{}, "model"},
		{"a{b}", Config{}, "model"},
		{"m", Config{KeyPrefix: "x{"}, "key_prefix"},
		{"m", Config{GatewayID: strings.Repeat("g", 129)}, "gateway_id"},
		{"m", Config{LeaseTTL: 50e6}, "lease_ttl"},
		{"m", Config{RefreshInterval: 5e9}, "refresh_interval"},
		{"m", Config{RefreshInterval: 1e6}, "refresh_interval"},
		{"m", Config{Timeout: 5e9}, "timeout"},
		{"m", Config{OnRedisError: "maybe"}, "on_redis_error"},
		{"m", Config{Gateways: -1}, "gateways"},
	} {
		if _, err := NewRedis(newClient(t, srv), tc.model, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.field) || !strings.HasPrefix(err.Error(), "ledger: ") {
			t.Errorf("%q %+v: %v, want an error naming %s", tc.model, tc.cfg, err, tc.field)
		}
	}
	if _, err := NewRedis(noTimeouts, "m", Config{}); err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
		t.Errorf("client without context timeouts: %v", err)
	}
	if _, err := NewRedis(nil, "m", Config{}); err == nil {
		t.Error("nil client accepted")
	}
}
