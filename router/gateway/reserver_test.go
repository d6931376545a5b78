package gateway

import (
	"maps"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/router"
)

// tryCall is one TryAdd a fake Reserver was asked.
type tryCall struct{ replica, weight, limit int }

// fakeReserver is a LocalLedger whose TryAdd checks as a shared ledger
// would (empty, or within limit after the add), except that it refuses
// every call on a replica in refuse: another gateway took the room.
type fakeReserver struct {
	LocalLedger
	refuse map[int]bool
	calls  []tryCall
	adds   int // Add calls
}

func newFakeReserver() *fakeReserver { return &fakeReserver{refuse: map[int]bool{}} }

func (f *fakeReserver) Add(replica, delta int) {
	f.adds++
	f.LocalLedger.Add(replica, delta)
}

func (f *fakeReserver) TryAdd(replica, weight, limit int) bool {
	f.calls = append(f.calls, tryCall{replica, weight, limit})
	if f.refuse[replica] {
		return false
	}
	if r := f.Reserved(replica); r != 0 && r+weight > limit {
		return false
	}
	f.LocalLedger.Add(replica, weight)
	return true
}

var _ Reserver = (*fakeReserver)(nil)

// The policy's pick is refused by TryAdd: the core takes back what routing
// recorded there, routes again without it and dispatches elsewhere; the
// refused replica holds nothing.
func TestReserverRetryWithoutTheWinner(t *testing.T) {
	f := newFakeReserver()
	cfg := testConfig("kv_aware")
	cfg.Router.Index = router.IndexApproximate
	cfg.Ledger = f
	c := newCore(t, cfg, 2, ReplicaConfig{CapacityBlocks: 100})
	// Warm one replica with the prompt so that the policy prefers it.
	a := submit(t, c, 0, promptReq(1, 320, 0), Dispatched)
	c.Finished(time.Second, a.Ticket, Usage{}, hashesOf(1, 320))
	hot, cold := a.Replica, 1-a.Replica
	if f.Reserved(hot) != 0 {
		t.Fatalf("warm-up left %d reserved", f.Reserved(hot))
	}
	f.calls, f.adds = nil, 0
	f.refuse[hot] = true
	d := submit(t, c, time.Second, promptReq(1, 320, 0), Dispatched)
	if d.Replica != cold {
		t.Fatalf("dispatched to %d, want %d (%d refused)", d.Replica, cold, hot)
	}
	// The hot replica is predicted to hold 19 blocks: weight 1 there, 20
	// on the cold one.
	want := []tryCall{{hot, 1, 100}, {cold, 20, 100}}
	if !slices.Equal(f.calls, want) {
		t.Fatalf("TryAdd calls %+v, want %+v", f.calls, want)
	}
	if d.Weight != 20 || f.Reserved(cold) != 20 || f.Reserved(hot) != 0 {
		t.Fatalf("weight %d, reserved hot %d cold %d", d.Weight, f.Reserved(hot), f.Reserved(cold))
	}
	// The refused pick left no pin on the hot replica; the cold one pins
	// the prompt.
	if got := c.Router().Index().PinnedBlocks(hot); got != 0 {
		t.Fatalf("the refused replica keeps %d pinned blocks of the refused attempt", got)
	}
	if got := c.Router().Index().PinnedBlocks(cold); got != 20 {
		t.Fatalf("the chosen replica pins %d blocks, want 20", got)
	}
	if f.adds != 0 {
		t.Fatalf("the dispatch also called Add %d times: reserved twice", f.adds)
	}
	// The end releases through Add, once.
	c.Finished(2*time.Second, d.Ticket, Usage{}, nil)
	if f.adds != 1 || f.Reserved(cold) != 0 {
		t.Fatalf("after the end: %d adds, %d reserved", f.adds, f.Reserved(cold))
	}
}

// Every replica refuses: each is asked once, the request queues as when
// nothing admits (or is refused at once with NoQueue), and it is dispatched
// by the next call that drains once a replica takes it again.
func TestReserverAllRefuseQueues(t *testing.T) {
	f := newFakeReserver()
	cfg := testConfig("round_robin")
	cfg.Ledger = f
	c := newCore(t, cfg, 3, ReplicaConfig{CapacityBlocks: 100})
	for i := range 3 {
		f.refuse[i] = true
	}
	q := submit(t, c, 0, plainReq(1, 160, 0), Queued)
	// Two attempts (Submit's own, then the drain once it is queued, as
	// without a Reserver), each asking every replica once.
	if len(f.calls) != 6 {
		t.Fatalf("%d TryAdd calls, want two attempts of one per replica: %+v", len(f.calls), f.calls)
	}
	for a := range 2 {
		seen := map[int]bool{}
		for _, call := range f.calls[3*a : 3*a+3] {
			if seen[call.replica] {
				t.Fatalf("replica %d asked twice in one attempt: %+v", call.replica, f.calls)
			}
			seen[call.replica] = true
		}
	}
	nq := plainReq(2, 160, 0)
	nq.NoQueue = true
	r := submit(t, c, 0, nq, Rejected)
	if r.Status != http.StatusTooManyRequests || r.Reason != ReasonNoCapacity {
		t.Fatalf("NoQueue: %+v", r)
	}
	for i := range 3 {
		if f.Reserved(i) != 0 {
			t.Fatalf("replica %d holds %d after refusals", i, f.Reserved(i))
		}
	}
	// A replica takes requests again; the queue drains on the next call.
	f.refuse[2] = false
	ds := c.Poke(time.Second)
	if len(ds) != 1 || ds[0].Ticket != q.Ticket || ds[0].Kind != Dispatched || ds[0].Replica != 2 || ds[0].Queued != time.Second {
		t.Fatalf("after the refusal ended: %+v", ds)
	}
	if f.Reserved(2) != 10 {
		t.Fatalf("reserved %d, want 10", f.Reserved(2))
	}
	// The queue's deadline still applies to a request every replica refuses.
	f.refuse[2] = true
	w := submit(t, c, time.Second, plainReq(3, 16, 0), Queued)
	ds = c.Advance(time.Second + cfg.Queue.Timeout)
	if len(ds) != 1 || ds[0].Ticket != w.Ticket || ds[0].Reason != ReasonQueueTimeout {
		t.Fatalf("deadline: %+v", ds)
	}
}

// TryAdd is asked with the limit admit compares the ledger against
// (capacity x overcommit, rounded down, for kv; the capacity for
// tokenflow), and not at all where admission does not weigh requests
// against the ledger: admission none, the peers' rules, a replica of
// unknown capacity. There the reservation is a plain Add, as before.
func TestReserverLimitAndWhenUsed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		adm      Admission
		over     float64
		capacity int
		want     []tryCall
	}{
		{"kv", AdmitKV, 1, 100, []tryCall{{0, 10, 100}}},
		{"kv overcommit rounds down", AdmitKV, 1.5, 101, []tryCall{{0, 10, 151}}},
		{"kv overcommit below 1", AdmitKV, 0.5, 33, []tryCall{{0, 10, 16}}},
		{"tokenflow", AdmitTokenFlow, 1.5, 101, []tryCall{{0, 10, 101}}},
		{"kv, capacity unknown", AdmitKV, 1, 0, nil},
		{"none", AdmitNone, 1, 100, nil},
		{"llmd-concurrency", AdmitLLMDConcurrency, 1, 100, nil},
		{"dynamo", AdmitDynamo, 1, 100, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeReserver()
			cfg := testConfig("round_robin")
			cfg.Admission, cfg.Overcommit, cfg.Ledger = tc.adm, tc.over, f
			c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: tc.capacity})
			d := submit(t, c, 0, plainReq(1, 160, 0), Dispatched)
			if !slices.Equal(f.calls, tc.want) {
				t.Fatalf("TryAdd calls %+v, want %+v", f.calls, tc.want)
			}
			wantAdds := 0
			if tc.want == nil {
				wantAdds = 1
			}
			if f.adds != wantAdds || f.Reserved(0) != d.Weight {
				t.Fatalf("%d adds (want %d), %d reserved for weight %d", f.adds, wantAdds, f.Reserved(0), d.Weight)
			}
		})
	}
}

// The capacity known only from the engine's report counts as known.
func TestReserverReportedCapacity(t *testing.T) {
	f := newFakeReserver()
	cfg := testConfig("round_robin")
	cfg.Ledger = f
	c := newCore(t, cfg, 1, ReplicaConfig{})
	c.Report(0, 0, Report{NumGPUBlocks: 40})
	submit(t, c, 0, plainReq(1, 160, 0), Dispatched)
	if want := []tryCall{{0, 10, 40}}; !slices.Equal(f.calls, want) {
		t.Fatalf("TryAdd calls %+v, want %+v", f.calls, want)
	}
}

// agreeingReserver is a LocalLedger whose TryAdd refuses exactly what the
// core's own check already refused: a core on it must decide as on a
// plain LocalLedger.
type agreeingReserver struct{ LocalLedger }

func (a *agreeingReserver) TryAdd(replica, weight, limit int) bool {
	if r := a.Reserved(replica); r != 0 && r+weight > limit {
		return false
	}
	a.Add(replica, weight)
	return true
}

// TestPropertyReserverTransparent runs the core's property suite (every
// admission mode, random calls, the model's checks after each) twice per
// scenario, on a LocalLedger and on a Reserver that never contradicts the
// core's own check: the decisions are the same, so the TryAdd hook changes
// nothing for one gateway alone (and the simulator, whose LocalLedger is no
// Reserver, is untouched by construction).
func TestPropertyReserverTransparent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sc := genScenario(t, []Admission{AdmitKV, AdmitKV, AdmitTokenFlow, AdmitNone, AdmitLLMDConcurrency}, 150)
		sc.cfg.Ledger = nil
		a := runScenario(t, &sc)
		sc.cfg.Ledger = &agreeingReserver{}
		b := runScenario(t, &sc)
		if !slices.Equal(a, b) {
			for i := range min(len(a), len(b)) {
				if a[i] != b[i] {
					t.Fatalf("decision %d: %+v on a LocalLedger, %+v on a Reserver", i, a[i], b[i])
				}
			}
			t.Fatalf("%d decisions on a LocalLedger, %d on a Reserver", len(a), len(b))
		}
	})
}

// contendedReserver is one core's view of a ledger shared with other
// gateways, played by the test: before each TryAdd the others reserve or
// release blocks on the replica (rapid draws how many), so the core's
// pre-filter (Reserved, read before the pick) is stale by then, and TryAdd
// refuses what no longer fits. It keeps the core's own part apart from the
// others' and the admissions not yet matched by a dispatch.
type contendedReserver struct {
	t      *rapid.T
	own    LocalLedger
	others LocalLedger
	// admitted are the TryAdds that said yes, in order, until the test
	// matches each with its dispatch.
	admitted []tryCall
	refused  int
}

func (c *contendedReserver) Reserved(replica int) int {
	return c.own.Reserved(replica) + c.others.Reserved(replica)
}

func (c *contendedReserver) Add(replica, delta int) { c.own.Add(replica, delta) }

func (c *contendedReserver) TryAdd(replica, weight, limit int) bool {
	if d := rapid.IntRange(-50, 50).Draw(c.t, "others_delta"); d != 0 {
		c.others.Add(replica, d) // the other gateways move first
	}
	if before := c.Reserved(replica); before != 0 && before+weight > limit {
		c.refused++
		return false
	}
	c.own.Add(replica, weight)
	c.admitted = append(c.admitted, tryCall{replica, weight, limit})
	return true
}

// TestPropertyReserverContended drives a core whose ledger is shared with
// other gateways that move between its check and its TryAdd. Whatever they
// do: every dispatch is exactly one admitted TryAdd on its replica with its
// weight and the limit admit uses (so nothing is dispatched past a refusal,
// and nothing is reserved twice), every admitted TryAdd is a dispatch, the
// core's own reservation on each replica is the sum of its requests' in
// flight there, and it returns to 0 once every request has ended. With the
// ledger's contract (TryAdd admits only into an empty replica or within
// the limit), the total reserved on a replica that held anything never
// exceeds the limit through this core's admissions.
var contendedRefused, contendedSteps atomic.Int64

func TestPropertyReserverContended(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		res := &contendedReserver{t: t}
		cfg := testConfig(rapid.SampledFrom(propPolicies).Draw(t, "policy"))
		cfg.Admission = rapid.SampledFrom([]Admission{AdmitKV, AdmitTokenFlow}).Draw(t, "admission")
		cfg.Overcommit = rapid.SampledFrom([]float64{0.5, 1, 1.5}).Draw(t, "overcommit")
		cfg.Queue.MaxRequests = rapid.SampledFrom([]int{0, 4, 30}).Draw(t, "max_requests")
		cfg.Ledger = res
		n := rapid.IntRange(1, 4).Draw(t, "replicas")
		caps := make([]int, n)
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			caps[i] = rapid.IntRange(20, 200).Draw(t, "capacity")
			if _, err := c.AddReplica(ReplicaConfig{Name: string(rune('a' + i)), CapacityBlocks: caps[i]}); err != nil {
				t.Fatal(err)
			}
		}
		limit := func(i int) int {
			if cfg.Admission == AdmitKV {
				return int(float64(caps[i]) * cfg.Overcommit)
			}
			return caps[i]
		}
		inflight := map[Ticket]Decision{}
		queued := map[Ticket]bool{}
		now := time.Duration(0)
		note := func(ds ...Decision) {
			for _, d := range ds {
				switch d.Kind {
				case Dispatched:
					if len(res.admitted) == 0 {
						t.Fatalf("dispatched %+v without an admitted TryAdd", d)
					}
					a := res.admitted[0]
					res.admitted = res.admitted[1:]
					if a != (tryCall{d.Replica, d.Weight, limit(d.Replica)}) {
						t.Fatalf("dispatched %+v after TryAdd %+v", d, a)
					}
					delete(queued, d.Ticket)
					inflight[d.Ticket] = d
				case Queued:
					queued[d.Ticket] = true
				case Rejected:
					delete(queued, d.Ticket)
				}
			}
		}
		check := func(step int) {
			if len(res.admitted) != 0 {
				t.Fatalf("step %d: admitted TryAdds %+v without a dispatch", step, res.admitted)
			}
			for i := range n {
				sum := 0
				for _, d := range inflight {
					if d.Replica == i {
						sum += d.Weight
					}
				}
				if r := res.own.Reserved(i); r != sum {
					t.Fatalf("step %d: replica %d: the core's own reservation is %d, its requests in flight weigh %d", step, i, r, sum)
				}
			}
		}
		pick := func() (Ticket, bool) {
			if len(inflight) == 0 {
				return 0, false
			}
			keys := make([]Ticket, 0, len(inflight))
			for k := range inflight {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			return keys[rapid.IntRange(0, len(keys)-1).Draw(t, "pick")], true
		}
		steps := rapid.IntRange(10, 200).Draw(t, "steps")
		for step := range steps {
			now += time.Duration(rapid.IntRange(0, 50).Draw(t, "dt_ms")) * time.Millisecond
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0, 1, 2, 3:
				q := plainReq(uint64(step+1), rapid.IntRange(1, 1600).Draw(t, "prompt"), rapid.IntRange(0, 400).Draw(t, "max_tokens"))
				q.NoQueue = rapid.IntRange(0, 5).Draw(t, "no_queue") == 0
				d, o := c.Submit(now, q)
				note(o...)
				note(d)
			case 4, 5, 6:
				if tk, ok := pick(); ok {
					delete(inflight, tk)
					note(c.Finished(now, tk, Usage{}, nil)...)
				}
			case 7:
				if tk, ok := pick(); ok {
					delete(inflight, tk)
					d, o := c.Retry(now, tk, false)
					note(d)
					note(o...)
				}
			case 8:
				note(c.Poke(now)...)
			case 9:
				note(c.Advance(now)...)
			}
			check(step)
		}
		// Everything ends: the core's own part is 0 everywhere.
		for len(inflight) > 0 || len(queued) > 0 {
			now += cfg.Queue.Timeout
			for _, tk := range slices.Sorted(maps.Keys(inflight)) {
				delete(inflight, tk)
				note(c.Finished(now, tk, Usage{}, nil)...)
			}
			res.others = LocalLedger{} // the other gateways finish too
			note(c.Advance(now)...)
			check(steps)
		}
		for i := range n {
			if r := res.own.Reserved(i); r != 0 {
				t.Fatalf("replica %d: %d of the core's own blocks left reserved after every request ended", i, r)
			}
		}
		contendedRefused.Add(int64(res.refused))
		contendedSteps.Add(int64(steps))
	})
	t.Logf("%d steps, %d TryAdds refused", contendedSteps.Load(), contendedRefused.Load())
}

// TestReserverContendedRefuses checks that the contended runs exercise the
// retry: some TryAdds are refused.
func TestReserverContendedRefuses(t *testing.T) {
	f := newFakeReserver()
	cfg := testConfig("least_request")
	cfg.Ledger = f
	c := newCore(t, cfg, 2, ReplicaConfig{CapacityBlocks: 100})
	f.refuse[0], f.refuse[1] = true, false
	for i := range 5 {
		d := submit(t, c, 0, plainReq(uint64(i), 160, 0), Dispatched)
		if d.Replica != 1 {
			t.Fatalf("request %d dispatched to %d, which refuses", i, d.Replica)
		}
	}
	if f.Reserved(0) != 0 || f.Reserved(1) != 50 {
		t.Fatalf("reserved %d, %d", f.Reserved(0), f.Reserved(1))
	}
}
