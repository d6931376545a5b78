package gateway

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkCore measures one request through the core: Submit (dispatched
// at once: eligibility, kv admission, the router's index lookup of a
// 512-block prompt over every replica, the policy, the reservation),
// FirstByte (reconciling the reservation) and Finished (releasing it and
// recording the exchange). It mirrors router's BenchmarkRoute: the index
// already holds 32 such prompts.
func BenchmarkCore(b *testing.B) {
	for _, pol := range []string{"round_robin", "cost_model", "llmd"} {
		for _, n := range []int{8, 64} {
			b.Run(fmt.Sprintf("%s/%d", pol, n), func(b *testing.B) {
				benchCore(b, testConfig(pol), n)
			})
		}
	}
}

// BenchmarkQueue measures one push and one pop (peek, pop, and the
// deadline heap's push and pop) on a queue holding n requests, spread over
// 3 priority classes and 1 or 64 tenants of mixed weights: the queue stays
// full, so the cost per pair shows how it grows with n.
func BenchmarkQueue(b *testing.B) {
	alive := func(Ticket) bool { return true }
	for _, n := range []int{1_000, 10_000, 100_000} {
		for _, tenants := range []int{1, 64} {
			b.Run(fmt.Sprintf("n=%d/tenants=%d", n, tenants), func(b *testing.B) {
				var q queue
				names := make([]string, tenants)
				for i := range names {
					names[i] = fmt.Sprint("t", i)
				}
				push := func(i int) {
					t := Ticket(i + 1)
					q.push(t, i%3, names[i%tenants], 1+i%4, false)
					q.dl.Push(time.Duration(i), t)
				}
				for i := range n {
					push(i)
				}
				// Reach the steady state (the classes' shares settle).
				pop := func() {
					_, c, ok := q.peek(alive)
					if !ok {
						b.Fatal("empty")
					}
					q.pop(c, 0)
					q.dl.Pop()
				}
				i := n
				for ; i < 4*n; i++ {
					push(i)
					pop()
				}
				b.ReportAllocs()
				for b.Loop() {
					push(i)
					pop()
					i++
				}
				if q.live != n || q.dl.Len() != n {
					b.Fatalf("%d queued, %d deadlines", q.live, q.dl.Len())
				}
			})
		}
	}
}

// BenchmarkCoreQueued measures a queued request through the core at n
// queued: Submit (queued behind a busy replica) and the Finished that
// dispatches the head, Advance keeping the deadlines current.
func BenchmarkCoreQueued(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			cfg := testConfig("round_robin")
			cfg.Queue.MaxRequests = MaxQueueRequests
			// Each waits n ms; a dispatched request's deadline stays in the
			// heap (lazily) until it passes.
			cfg.Queue.Timeout = time.Duration(2*n) * time.Millisecond
			c := newCore(b, cfg, 1, ReplicaConfig{MaxInFlight: 1})
			now := time.Duration(0)
			cur, _ := c.Submit(now, plainReq(0, 100, 10))
			id := uint64(1)
			one := func() {
				now += time.Millisecond
				q := plainReq(id, 100, 10)
				q.Tenant = tenantNames[id%uint64(len(tenantNames))]
				id++
				if d, _ := c.Submit(now, q); d.Kind != Queued {
					b.Fatalf("%+v", d)
				}
				ds := c.Finished(now, cur.Ticket, Usage{}, nil)
				if len(ds) != 1 {
					b.Fatalf("%+v", ds)
				}
				cur = ds[0]
				c.Advance(now)
			}
			for range n {
				now += time.Millisecond
				q := plainReq(id, 100, 10)
				q.Tenant = tenantNames[id%uint64(len(tenantNames))]
				id++
				c.Submit(now, q)
			}
			for range 3 * n {
				one()
			}
			b.ReportAllocs()
			for b.Loop() {
				one()
			}
			if c.Queued() != n {
				b.Fatalf("%d queued", c.Queued())
			}
		})
	}
}

var tenantNames = func() []string {
	s := make([]string, 16)
	for i := range s {
		s[i] = fmt.Sprint("tenant", i)
	}
	return s
}()
