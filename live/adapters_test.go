package live

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/fleet/remote"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/workload"
)

// decided is one decision as both adapters must make it.
type decided struct {
	At     time.Duration
	Kind   gateway.Kind
	Ticket gateway.Ticket
	ID     uint64
	Where  int
	Reason string
}

func decisionsOf(evs []gateway.TraceEvent) []decided {
	var out []decided
	add := func(at time.Duration, d gateway.Decision) {
		where := -1
		if d.Kind == gateway.Dispatched {
			where = d.Replica
		}
		out = append(out, decided{at, d.Kind, d.Ticket, d.ID, where, d.Reason})
	}
	for _, ev := range evs {
		if ev.Op == "submit" || ev.Op == "retry" {
			add(ev.At, ev.Decision)
		}
		for _, d := range ev.Others {
			add(ev.At, d)
		}
	}
	return out
}

// The simulator's adapter (package fleet) and live's (model.go) drive the
// same core and must decide the same for the same input: a recorded run of
// the simulator (an overload with kv admission: dispatches, queueing,
// timeouts) is replayed call by call into live's model on virtual time, and
// every decision, its time, ticket, replica and reason, is the same.
func TestAdaptersDecideAlike(t *testing.T) {
	wl, err := workload.DefaultConfig("w7")
	if err != nil {
		t.Fatal(err)
	}
	wl.Requests, wl.Rate, wl.Seed = 260, 1, 5
	wl.W7.BurstRequests, wl.W7.FirstBurst = 120, 5*time.Second
	ec := engine.DefaultConfig()
	fc := fleet.DefaultConfig()
	fc.Seed, fc.Workload, fc.Policy, fc.Replicas, fc.Engine = 5, wl, "cost_model", 3, ec
	fc.Admission = gateway.AdmitKV
	fc.QueueTimeout = 20 * time.Second
	var rec []gateway.TraceEvent
	fc.Trace = func(_ int, ev gateway.TraceEvent) { rec = append(rec, ev) }
	if _, err := fleet.Simulate(fc); err != nil {
		t.Fatal(err)
	}
	want := decisionsOf(rec)
	kinds := map[gateway.Kind]int{}
	for _, d := range want {
		kinds[d.Kind]++
	}
	if kinds[gateway.Queued] == 0 || kinds[gateway.Rejected] == 0 || kinds[gateway.Dispatched] == 0 {
		t.Fatalf("the recorded run should dispatch, queue and reject: %v", kinds)
	}

	var got []gateway.TraceEvent
	synctest.Test(t, func(t *testing.T) {
		c := config.Default()
		c.Seed = fc.Seed
		mo := config.DefaultModel()
		mo.Name, mo.Policy, mo.Admission = wl.Model, fc.Policy, string(fc.Admission)
		mo.MaxConcurrency, mo.MaxPending = 1<<20, 1<<20
		mo.MaxModelLen = ec.MaxModelLen
		mo.Queue.Timeout = fc.QueueTimeout
		for i := range fc.Replicas {
			// The same names as the simulator's; nothing is ever sent there.
			mo.Replicas = append(mo.Replicas, config.Replica{Name: fmt.Sprintf("replica-%d", i), URL: fmt.Sprintf("http://engine-%d:80", i)})
		}
		c.Models = []config.Model{mo}
		s, err := New(&c, Deps{Encoders: map[string]Encoder{mo.Name: nil}, Trace: func(_ string, ev gateway.TraceEvent) { got = append(got, ev) }})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		m := s.models[0]
		attempts := map[gateway.Ticket]*attempt{}
		wait := func(a *attempt) {
			g := <-a.ch
			a.take(g.d, g.rep, g.pre)
		}
		for _, ev := range rec {
			if d := ev.At - m.now(); d > 0 {
				time.Sleep(d)
			}
			synctest.Wait() // queued requests have taken their grants
			switch ev.Op {
			case "submit":
				a := &attempt{}
				d := m.submit(a, ev.Request)
				attempts[ev.Decision.Ticket] = a
				if d.Kind == gateway.Queued {
					go wait(a)
				}
			case "first_byte":
				m.firstByte(attempts[ev.Ticket])
			case "finished":
				m.finish(attempts[ev.Ticket], ev.Held, ev.Usage)
			case "fail":
				m.fail(attempts[ev.Ticket], ev.Fault, false)
			case "report":
				r := ev.Report
				m.report(m.reps[ev.Replica], remote.Load{Running: r.Running, Waiting: r.Waiting, KVUsage: r.KVUsage, NumGPUBlocks: r.NumGPUBlocks,
					PrefixQueries: r.PrefixQueries, PrefixHits: r.PrefixHits, Preemptions: r.Preemptions})
			case "advance":
				// live's own deadline goroutine calls Advance at the deadline.
			default:
				t.Fatalf("the recording has a %s call the replay does not know", ev.Op)
			}
		}
		synctest.Wait()
	})
	have := decisionsOf(got)
	if len(have) != len(want) {
		t.Errorf("live made %d decisions, the simulator %d", len(have), len(want))
	}
	for i := range min(len(have), len(want)) {
		if have[i] != want[i] {
			t.Fatalf("decision %d: live %+v, simulator %+v", i, have[i], want[i])
		}
	}
	t.Logf("%d decisions alike (%d dispatched, %d queued, %d rejected)", len(want), kinds[gateway.Dispatched], kinds[gateway.Queued], kinds[gateway.Rejected])
}
