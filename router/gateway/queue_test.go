package gateway

import (
	"fmt"
	"testing"
	"time"
)

// serialCore is a core whose one replica takes one request at a time, with
// a request in flight: every request submitted now queues.
func serialCore(t *testing.T, cfg Config) (*Core, Ticket) {
	t.Helper()
	c := newCore(t, cfg, 1, ReplicaConfig{MaxInFlight: 1})
	d := submit(t, c, 0, Request{ID: 1 << 40, PromptTokens: 10, PromptKnown: true, Tenant: "blocker"}, Dispatched)
	return c, d.Ticket
}

// serve finishes the request in flight n times and returns the ids the
// queue dispatched, in order.
func serve(t *testing.T, c *Core, cur Ticket, n int) []uint64 {
	t.Helper()
	ids, _ := serveFrom(t, c, cur, n)
	return ids
}

// serveFrom is serve that also returns the request left in flight.
func serveFrom(t *testing.T, c *Core, cur Ticket, n int) ([]uint64, Ticket) {
	t.Helper()
	var ids []uint64
	for range n {
		ds := c.Finished(time.Second, cur, Usage{}, nil)
		if len(ds) != 1 || ds[0].Kind != Dispatched {
			t.Fatalf("%+v", ds)
		}
		ids = append(ids, ds[0].ID)
		cur = ds[0].Ticket
	}
	return ids, cur
}

func tenantReq(id uint64, tenant string, weight, prio int) Request {
	return Request{ID: id, PromptTokens: 10, PromptKnown: true, Tenant: tenant, TenantWeight: weight, Priority: prio}
}

func TestQueueFIFO(t *testing.T) {
	c, cur := serialCore(t, testConfig("round_robin"))
	for id := range uint64(10) {
		submit(t, c, 0, tenantReq(id, "a", 1, 0), Queued)
	}
	if got, want := fmt.Sprint(serve(t, c, cur, 10)), fmt.Sprint([]uint64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}); got != want {
		t.Fatalf("order %s, want %s", got, want)
	}
}

// Deficit round robin over the tenants of a class: each turn a tenant
// sends its weight's worth (0 counts as 1).
func TestQueueTenantWeights(t *testing.T) {
	c, cur := serialCore(t, testConfig("round_robin"))
	for i := range uint64(8) {
		submit(t, c, 0, tenantReq(100+i, "a", 1, 0), Queued)
		submit(t, c, 0, tenantReq(200+i, "b", 3, 0), Queued)
		submit(t, c, 0, tenantReq(300+i, "c", 0, 0), Queued)
	}
	got := fmt.Sprint(serve(t, c, cur, 15))
	want := fmt.Sprint([]uint64{100, 200, 201, 202, 300, 101, 203, 204, 205, 301, 102, 206, 207, 300 + 2, 103})
	if got != want {
		t.Fatalf("order %s, want %s", got, want)
	}
}

// A tenant whose line emptied and fills again joins the round again.
func TestQueueTenantComesBack(t *testing.T) {
	c, cur := serialCore(t, testConfig("round_robin"))
	submit(t, c, 0, tenantReq(1, "a", 1, 0), Queued)
	submit(t, c, 0, tenantReq(2, "b", 1, 0), Queued)
	submit(t, c, 0, tenantReq(3, "b", 1, 0), Queued)
	ids, cur := serveFrom(t, c, cur, 2) // a1, b2: a's line is empty
	if fmt.Sprint(ids) != "[1 2]" {
		t.Fatal(ids)
	}
	submit(t, c, 0, tenantReq(4, "a", 1, 0), Queued)
	// b, alone, began its next turn while a was away; a joins the round
	// after it.
	if ids := serve(t, c, cur, 2); fmt.Sprint(ids) != "[3 4]" {
		t.Fatal(ids)
	}
	if c.Queued() != 0 {
		t.Fatal(c.Queued())
	}
}

// Tokenflow has one global FIFO: priorities and tenants are ignored.
func TestQueueTokenFlowFIFO(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Admission = AdmitTokenFlow
	c, cur := serialCore(t, cfg)
	for i := range uint64(6) {
		submit(t, c, 0, tenantReq(i, fmt.Sprint("t", i%3), int(i), int(i)), Queued)
	}
	if got := fmt.Sprint(serve(t, c, cur, 6)); got != "[0 1 2 3 4 5]" {
		t.Fatalf("order %s", got)
	}
}

// Requests that leave the queue other than from its head (aborted, timed
// out) do not pin memory behind a head that cannot be dispatched.
func TestQueueCompaction(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Queue.MaxRequests = 100000
	c, cur := serialCore(t, cfg)
	var ts []Ticket
	for i := range 5000 {
		ts = append(ts, submit(t, c, 0, tenantReq(uint64(i), fmt.Sprint("t", i%50), 1, 0), Queued).Ticket)
	}
	for _, tk := range ts[:4900] {
		c.Abort(0, tk)
	}
	// Compaction runs once the dead outnumber the live by 64.
	bound := func() int { return 2*c.Queued() + 65 }
	items, _, _ := queueSize(c)
	if c.Queued() != 100 || items > bound() {
		t.Fatalf("%d queued, %d tickets kept", c.Queued(), items)
	}
	// Timeouts too, and tenants with nothing left are forgotten.
	for i := range 5000 {
		q := tenantReq(uint64(10000+i), fmt.Sprint("x", i), 1, 0)
		q.Timeout = time.Millisecond
		submit(t, c, time.Second, q, Queued)
	}
	c.Advance(2 * time.Second)
	items, flows, ring := queueSize(c)
	if c.Queued() != 100 || items > bound() || flows > 50 || ring > 50 {
		t.Fatalf("%d queued, %d tickets kept in %d flows (%d in the ring)", c.Queued(), items, flows, ring)
	}
	// A class where everything timed out keeps nothing either.
	for i := range 5000 {
		q := tenantReq(uint64(20000+i), fmt.Sprint("y", i), 1, 3)
		q.Timeout = time.Millisecond
		submit(t, c, 3*time.Second, q, Queued)
	}
	c.Advance(4 * time.Second)
	if items, flows, ring = queueSize(c); flows > 50 || ring > 50 {
		t.Fatalf("%d tickets kept in %d flows (%d in the ring)", items, flows, ring)
	}
	// And the 100 left are still served, in their order.
	ids := serve(t, c, cur, 100)
	for i, id := range ids {
		if want := uint64(4900 + i); id != want {
			t.Fatalf("dispatch %d: id %d, want %d", i, id, want)
		}
	}
}

// queueSize counts the tickets the queue's lines keep (live or not), its
// flows and its rings' flows.
func queueSize(c *Core) (items, flows, ring int) {
	for _, cl := range c.q.classes {
		for _, f := range cl.byTenant {
			items += f.items.len()
			flows++
		}
		ring += len(cl.ring)
	}
	return
}

// The internal queue: strict priority across classes, DRR inside one.
func TestQueueInternal(t *testing.T) {
	var q queue
	alive := func(Ticket) bool { return true }
	q.push(1, 0, "a", 1, false)
	q.push(2, 3, "a", 1, false)
	q.push(3, 1, "a", 1, false)
	q.push(4, 3, "b", 1, false)
	q.push(5, 3, "a", 1, true) // to the front of its line
	if q.ahead(3) != 3 || q.ahead(1) != 4 || q.ahead(0) != 5 || q.ahead(4) != 0 {
		t.Fatal(q.ahead(3), q.ahead(1), q.ahead(0))
	}
	var got []Ticket
	for {
		tk, c, ok := q.peek(alive)
		if !ok {
			break
		}
		q.pop(c, 0)
		got = append(got, tk)
	}
	if fmt.Sprint(got) != "[5 4 2 3 1]" || q.live != 0 {
		t.Fatalf("order %v, %d live", got, q.live)
	}
}

// A tenant whose requests all left while it had the turn passes the turn,
// with its quantum, to the next tenant, whether peek or compaction (with
// enough other requests timing out at once) finds its line empty.
func TestQueueTurnPassesOn(t *testing.T) {
	for _, compact := range []bool{false, true} {
		c, cur := serialCore(t, testConfig("round_robin"))
		short := func(q Request) Request { q.Timeout = time.Millisecond; return q }
		for i := range uint64(3) {
			submit(t, c, 0, short(tenantReq(100+i, "a", 1, 0)), Queued)
		}
		for i := range uint64(4) {
			submit(t, c, 0, tenantReq(200+i, "b", 2, 0), Queued)
			submit(t, c, 0, tenantReq(300+i, "c", 1, 0), Queued)
		}
		if compact {
			for i := range uint64(100) {
				submit(t, c, 0, short(tenantReq(1000+i, fmt.Sprint("n", i), 1, 0)), Queued)
			}
		}
		if ds := c.Advance(time.Second); compact && len(ds) != 103 || !compact && len(ds) != 3 {
			t.Fatalf("%d timed out", len(ds))
		}
		if _, flows, ring := queueSize(c); compact && (flows != 2 || ring != 2) {
			t.Fatalf("not compacted: %d flows, %d in the ring", flows, ring)
		}
		if got := fmt.Sprint(serve(t, c, cur, 8)); got != "[200 201 300 202 203 301 302 303]" {
			t.Fatalf("compacted %v: order %s", compact, got)
		}
	}
}

// TestQueuedByClass: the queue's depth per priority class, highest first,
// as requests queue and leave.
func TestQueuedByClass(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Queue.MaxPriority = 10
	c, cur := serialCore(t, cfg)
	for i, p := range []int{0, 5, 5, 0, 0, 9} {
		submit(t, c, 0, Request{ID: uint64(i + 1), PromptTokens: 10, PromptKnown: true, Priority: p}, Queued)
	}
	want := []ClassDepth{{9, 1}, {5, 2}, {0, 3}}
	if got := c.QueuedByClass(nil); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("QueuedByClass = %v, want %v", got, want)
	}
	serve(t, c, cur, 3) // the 9 and both 5s go first
	if got := c.QueuedByClass(nil); fmt.Sprint(got) != fmt.Sprint([]ClassDepth{{0, 3}}) {
		t.Fatalf("after three left: %v", got)
	}
}
