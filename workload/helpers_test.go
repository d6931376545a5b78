package workload

import (
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/timeheap"
)

// tb is what the helpers need of *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func mustConfig(t tb, name string) Config {
	t.Helper()
	c, err := DefaultConfig(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustNew(t tb, c Config) Source {
	t.Helper()
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// drainOpen takes every open-loop arrival of src.
func drainOpen(src Source) []*Request {
	var out []*Request
	for {
		r, ok := src.Next()
		if !ok {
			return out
		}
		out = append(out, r)
	}
}

// simEvent is an arrival (done == false) or a completion.
type simEvent struct {
	at   time.Duration
	req  *Request
	done bool
}

// simResult is what simulate observed.
type simResult struct {
	reqs     []*Request               // in arrival order
	finish   map[uint64]time.Duration // completion (or failure) time by request ID
	failed   map[uint64]bool
	followed map[uint64]*Request // follow-up returned by Done, by request ID
}

// simulate drives src like the simulator: every arrival is served for
// service(r) and then reported to Done (failed when fail(r)); open-loop
// arrivals are pulled from Next one at a time.
func simulate(t tb, src Source, service func(*Request) time.Duration, fail func(*Request) bool) simResult {
	t.Helper()
	res := simResult{finish: map[uint64]time.Duration{}, failed: map[uint64]bool{}, followed: map[uint64]*Request{}}
	var h timeheap.Heap[simEvent]
	push := func(e simEvent) { h.Push(e.at, e) }
	pull := func() {
		if r, ok := src.Next(); ok {
			push(simEvent{at: r.Arrival, req: r})
		}
	}
	pull()
	var now time.Duration
	for h.Len() > 0 {
		e := h.Pop().V
		if e.at < now {
			t.Fatalf("time went backwards: %v < %v", e.at, now)
		}
		now = e.at
		if !e.done {
			res.reqs = append(res.reqs, e.req)
			if e.req.Turn == 0 {
				pull()
			}
			push(simEvent{at: now + service(e.req), req: e.req, done: true})
			continue
		}
		ok := fail == nil || !fail(e.req)
		res.finish[e.req.ID] = now
		res.failed[e.req.ID] = !ok
		if nr, more := src.Done(e.req, now, ok); more {
			if nr.Arrival <= now {
				t.Fatalf("follow-up %d arrives at %v, not after completion %v", nr.ID, nr.Arrival, now)
			}
			res.followed[e.req.ID] = nr
			push(simEvent{at: nr.Arrival, req: nr})
		}
	}
	return res
}

// serviceTime is a deterministic pseudo service time of 1..5s.
func serviceTime(r *Request) time.Duration {
	return time.Second + time.Duration(kvblock.Mix64(r.ID)%4000)*time.Millisecond
}

// genArrival draws a valid arrival process.
func genArrival(t *rapid.T, c *Config) {
	if rapid.Bool().Draw(t, "gamma") {
		c.Arrival = ArrivalParams{Process: ArrivalGamma, CV: rapid.Float64Range(0.05, 10).Draw(t, "cv")}
	}
}
