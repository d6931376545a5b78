package gateway

import (
	"strings"
	"testing"
	"time"
)

// A reconfiguration swaps the policy and the queue's bounds for new
// requests while the replicas, the index, the queue and every request's
// reservation stay.
func TestReconfigureKeepsState(t *testing.T) {
	cfg := testConfig("cost_model")
	cfg.Queue.MaxRequests = 1
	c := newCore(t, cfg, 2, ReplicaConfig{MaxInFlight: 1, CapacityBlocks: 10000})
	a := submit(t, c, 0, promptReq(1, 160, 8), Dispatched)
	b := submit(t, c, 0, promptReq(2, 160, 8), Dispatched)
	// b ends: its blocks are in the index; a waiting request takes its place.
	submit(t, c, 0, promptReq(3, 160, 8), Queued)
	if o := c.Finished(0, b.Ticket, Usage{}, hashesOf(2, 160)); len(o) != 1 || o[0].Kind != Dispatched {
		t.Fatalf("b's end dispatched %+v", o)
	}
	q := submit(t, c, 0, promptReq(4, 160, 8), Queued)
	submit(t, c, 0, promptReq(5, 160, 8), Rejected) // the queue holds 1
	c.Failure(0, a.Replica)
	reserved := c.State(0, 0).ReservedBlocks + c.State(0, 1).ReservedBlocks
	depth := func() int {
		d := []int{0}
		c.Router().Index().Lookup(hashesOf(2, 160), []int{b.Replica}, d)
		return d[0]
	}
	if depth() != 10 {
		t.Fatalf("setup: the index holds %d blocks of b's prompt", depth())
	}

	next := cfg
	next.Router.Policy = "round_robin"
	next.Queue.MaxRequests = 2
	next.Queue.Timeout = time.Second
	if o, err := c.Reconfigure(sec(1), next); err != nil || len(o) != 0 {
		t.Fatalf("Reconfigure: %v, %v", o, err)
	}
	if got := c.Router().Policy().Name(); got != "round_robin" {
		t.Fatalf("policy %s after the reload", got)
	}
	if got := c.State(sec(1), 0).ReservedBlocks + c.State(sec(1), 1).ReservedBlocks; got != reserved {
		t.Fatalf("reserved %d blocks after the reload, %d before", got, reserved)
	}
	if f := c.State(sec(1), a.Replica).Failures; f != 1 {
		t.Fatalf("replica %d has %d failures after the reload, want 1", a.Replica, f)
	}
	if depth() != 10 {
		t.Fatalf("the index holds %d blocks of b's prompt after the reload, want 10", depth())
	}
	// The queue takes one more now; the new request's deadline is the new
	// timeout, the old one keeps its 30s.
	r := submit(t, c, sec(1), promptReq(6, 160, 8), Queued)
	if at, _ := c.NextDeadline(sec(1)); at != sec(2) {
		t.Fatalf("next deadline %v, want 2s (the new timeout)", at)
	}
	o := c.Advance(sec(2))
	if len(o) != 1 || o[0].Ticket != r.Ticket || o[0].Reason != ReasonQueueTimeout {
		t.Fatalf("advance at 2s: %+v, want only the new request timed out", o)
	}
	if o := c.Finished(sec(3), a.Ticket, Usage{}, nil); len(o) != 1 || o[0].Ticket != q.Ticket || o[0].Kind != Dispatched {
		t.Fatalf("a's end dispatched %+v, want the request queued before the reload", o)
	}
}

// The same policy is not rebuilt (its state stays); another one is.
func TestReconfigureRebuildsPolicyOnlyWhenItChanges(t *testing.T) {
	cfg := testConfig("round_robin")
	c := newCore(t, cfg, 3, ReplicaConfig{})
	first := c.Router().Policy()
	next := cfg
	next.Queue.Timeout = time.Minute
	if _, err := c.Reconfigure(0, next); err != nil {
		t.Fatal(err)
	}
	if c.Router().Policy() != first {
		t.Fatal("an unchanged policy was rebuilt")
	}
	next.Router.Policy = "p2c"
	if _, err := c.Reconfigure(0, next); err != nil {
		t.Fatal(err)
	}
	if c.Router().Policy() == first || c.Router().Policy().Name() != "p2c" {
		t.Fatal("a new policy kept the old instance")
	}
}

// What the index is built on is refused, and so is an invalid
// configuration; nothing changes.
func TestReconfigureRefusesFixedSettings(t *testing.T) {
	cfg := testConfig("cost_model")
	c := newCore(t, cfg, 1, ReplicaConfig{})
	for _, tc := range []struct {
		name, want string
		edit       func(*Config)
	}{
		{"block size", "block size: cannot change", func(c *Config) { c.Router.Options.BlockSize = 32 }},
		{"index", "index: cannot change", func(c *Config) { c.Router.Index = "events" }},
		{"model", "model: cannot change", func(c *Config) { c.Model = "other" }},
		{"seed", "policy options", func(c *Config) { c.Router.Options.Seed = 7 }},
		{"policy", "unknown policy", func(c *Config) { c.Router.Policy = "nope" }},
		{"queue", "queue.timeout", func(c *Config) { c.Queue.Timeout = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := cfg
			tc.edit(&next)
			next.Queue.MaxRequests = 7
			if _, err := c.Reconfigure(0, next); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			if c.Config().Queue.MaxRequests == 7 || c.Router().Policy().Name() != "cost_model" {
				t.Fatal("a refused reconfiguration changed the core")
			}
		})
	}
}

// A looser admission dispatches what waits at once.
func TestReconfigureDrainsTheQueue(t *testing.T) {
	cfg := testConfig("round_robin")
	c := newCore(t, cfg, 1, ReplicaConfig{MaxInFlight: 1})
	submit(t, c, 0, plainReq(1, 16, 1), Dispatched)
	q := submit(t, c, 0, plainReq(2, 16, 1), Queued)
	next := cfg
	next.Admission = AdmitNone
	o, err := c.Reconfigure(sec(1), next)
	if err != nil || len(o) != 0 {
		t.Fatalf("Reconfigure: %+v, %v (the cap still holds)", o, err)
	}
	// The cap is the replica's, changed by AddReplica under its name.
	if _, err := c.AddReplica(ReplicaConfig{Name: "r0", MaxInFlight: 2}); err != nil {
		t.Fatal(err)
	}
	o = c.Poke(sec(1))
	if len(o) != 1 || o[0].Ticket != q.Ticket || o[0].Kind != Dispatched {
		t.Fatalf("after the cap rose: %+v, want the queued request dispatched", o)
	}
}

// A detached replica takes no new request, its requests in flight end
// there, and its name comes back as a new replica with nothing of the old.
func TestDetachReplica(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 2, ReplicaConfig{CapacityBlocks: 1000})
	var on0 Decision
	for id := uint64(1); on0.Ticket == 0; id++ {
		if d := submit(t, c, 0, promptReq(id, 64, 4), Dispatched); d.Replica == 0 {
			on0 = d
		}
	}
	for range 3 {
		c.Failure(0, 0)
	}
	if c.State(0, 0).Ejections != 1 {
		t.Fatal("setup: r0 not ejected")
	}
	c.DetachReplica(sec(2), 0)
	for id := uint64(100); id < 110; id++ {
		if d := submit(t, c, sec(2), promptReq(id, 64, 4), Dispatched); d.Replica == 0 {
			t.Fatal("a detached replica got a request")
		}
	}
	if st := c.State(sec(2), 0); !st.Gone || st.Name != "" || st.Load.InFlight != 1 {
		t.Fatalf("detached r0: %+v", st)
	}
	c.Finished(sec(3), on0.Ticket, Usage{}, nil)
	if st := c.State(sec(3), 0); st.Load.InFlight != 0 || st.ReservedBlocks != 0 {
		t.Fatalf("r0 after its request ended: in flight %d, reserved %d", st.Load.InFlight, st.ReservedBlocks)
	}
	i, err := c.AddReplica(ReplicaConfig{Name: "r0", CapacityBlocks: 1000})
	if err != nil || i != 2 {
		t.Fatalf("AddReplica(r0) = %d, %v: want a new replica, index 2", i, err)
	}
	if st := c.State(sec(3), i); st.Ejections != 0 || st.Failures != 0 || st.Gone || st.PeakInFlight != 0 {
		t.Fatalf("the new r0 inherited state: %+v", st)
	}
	if j, ok := c.ReplicaIndex("r0"); !ok || j != 2 {
		t.Fatalf("ReplicaIndex(r0) = %d, %v", j, ok)
	}
}

// A shadow policy is paired again with a new primary (its tally is of one
// pair), and goes when the configuration drops it.
func TestReconfigureShadowFollowsThePolicy(t *testing.T) {
	cfg := testConfig("cost_model")
	cfg.ShadowPolicy = "round_robin"
	c := newCore(t, cfg, 2, ReplicaConfig{})
	next := cfg
	next.Router.Policy = "p2c"
	if _, err := c.Reconfigure(0, next); err != nil {
		t.Fatal(err)
	}
	if st, ok := c.ShadowStats(); !ok || st.Primary != "p2c" || st.Shadow != "round_robin" {
		t.Fatalf("shadow after the primary changed: %+v, %v", st, ok)
	}
	next.ShadowPolicy = ""
	if _, err := c.Reconfigure(0, next); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.ShadowStats(); ok {
		t.Fatal("the shadow policy stayed after the configuration dropped it")
	}
}
