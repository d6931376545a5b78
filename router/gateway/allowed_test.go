package gateway

import (
	"net/http"
	"testing"
	"time"
)

// Request.Allowed restricts a request to some replicas: the policy picks
// only among them, a queued one waits for them alone, a retry stays among
// them, and none healthy (or none at all) is a 503 though others are
// healthy. Without it every replica is eligible, as before.
func TestAllowedReplicas(t *testing.T) {
	t.Run("policy picks among them", func(t *testing.T) {
		c := newCore(t, testConfig("round_robin"), 3, ReplicaConfig{CapacityBlocks: 10000})
		for i := range 6 {
			q := plainReq(uint64(i), 16, 4)
			q.Allowed = []int{1, 2}
			d := submit(t, c, 0, q, Dispatched)
			if d.Replica != 1 && d.Replica != 2 {
				t.Fatalf("request %d went to %d, outside {1, 2}", i, d.Replica)
			}
		}
		seen := map[int]bool{}
		for i := range 3 {
			seen[submit(t, c, 0, plainReq(uint64(10+i), 16, 4), Dispatched).Replica] = true
		}
		if len(seen) != 3 {
			t.Fatalf("without Allowed round robin reached %v, want all three", seen)
		}
	})
	t.Run("empty is a 503", func(t *testing.T) {
		c := newCore(t, testConfig("round_robin"), 2, ReplicaConfig{CapacityBlocks: 10000})
		q := plainReq(1, 16, 4)
		q.Allowed = []int{}
		d := submit(t, c, 0, q, Rejected)
		if d.Status != http.StatusServiceUnavailable || d.Reason != ReasonNoReplica || d.RetryAfter <= 0 {
			t.Fatalf("%+v: want 503 no_replica with a Retry-After", d)
		}
	})
	t.Run("none healthy is a 503", func(t *testing.T) {
		cfg := testConfig("round_robin")
		cfg.Health = Health{EjectAfter: 1, EjectTime: time.Second, MaxEjectTime: time.Second, MaxEjectedShare: 1}
		c := newCore(t, cfg, 2, ReplicaConfig{CapacityBlocks: 10000})
		if !c.Failure(0, 1) {
			t.Fatal("replica 1 was not ejected")
		}
		q := plainReq(1, 16, 4)
		q.Allowed = []int{1}
		if d := submit(t, c, 0, q, Rejected); d.Status != http.StatusServiceUnavailable {
			t.Fatalf("%+v: want 503 while the only allowed replica is ejected", d)
		}
		if d := submit(t, c, 0, plainReq(2, 16, 4), Dispatched); d.Replica != 0 {
			t.Fatalf("without Allowed: %+v, want replica 0", d)
		}
		// An index that names no replica is no replica.
		q.Allowed = []int{7}
		if d := submit(t, c, 0, q, Rejected); d.Status != http.StatusServiceUnavailable {
			t.Fatalf("%+v: want 503 for an unknown replica", d)
		}
	})
	t.Run("queued for its replica alone", func(t *testing.T) {
		c := newCore(t, testConfig("least_request"), 2, ReplicaConfig{MaxInFlight: 1, CapacityBlocks: 10000})
		q := plainReq(1, 16, 4)
		q.Allowed = []int{0}
		first := submit(t, c, 0, q, Dispatched)
		q.ID = 2
		waiting := submit(t, c, 0, q, Queued)
		if c.State(0, 1).Load.InFlight != 0 {
			t.Fatal("the free replica outside Allowed took the request")
		}
		others := c.Finished(sec(1), first.Ticket, Usage{}, nil)
		if len(others) != 1 || others[0].Ticket != waiting.Ticket || others[0].Kind != Dispatched || others[0].Replica != 0 {
			t.Fatalf("after replica 0 freed: %+v, want the queued request dispatched there", others)
		}
	})
	t.Run("retry stays among them", func(t *testing.T) {
		c := newCore(t, testConfig("round_robin"), 3, ReplicaConfig{CapacityBlocks: 10000})
		q := plainReq(1, 16, 4)
		q.Allowed = []int{0, 2}
		d := submit(t, c, 0, q, Dispatched)
		r, _ := c.Retry(0, d.Ticket, false)
		if r.Kind != Dispatched || r.Replica == d.Replica || r.Replica == 1 {
			t.Fatalf("retry after %d: %+v, want the other allowed replica", d.Replica, r)
		}
		if r2, _ := c.Retry(0, r.Ticket, false); r2.Kind != Rejected || r2.Status != http.StatusBadGateway {
			t.Fatalf("second retry: %+v, want rejected (every allowed replica tried)", r2)
		}
		if in := c.State(0, 1).Load.InFlight; in != 0 {
			t.Fatalf("replica 1 holds %d", in)
		}
	})
	t.Run("queued and its replica removed", func(t *testing.T) {
		c := newCore(t, testConfig("round_robin"), 2, ReplicaConfig{MaxInFlight: 1, CapacityBlocks: 10000})
		q := plainReq(1, 16, 4)
		q.Allowed = []int{1}
		submit(t, c, 0, q, Dispatched)
		q.ID = 2
		w := submit(t, c, 0, q, Queued)
		others := c.RemoveReplica(sec(1), 1)
		if len(others) != 1 || others[0].Ticket != w.Ticket || others[0].Kind != Rejected || others[0].Status != http.StatusServiceUnavailable {
			t.Fatalf("after its replica left: %+v, want the queued request rejected 503", others)
		}
	})
}
