package live

import (
	"github.com/inferrail/inferrail/internal/testfleet"
	"math"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/bench"
	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/workload"
)

// W1 through bench -> live -> 3 engines and through sim with 3 replicas and
// the same policy: TTFT p50, p99 and hit rate within 10% of each other. On
// virtual time (synctest), so the comparison is of routing, not of this
// machine's timers.
func TestFidelityWithSimulation(t *testing.T) {
	if raceEnabled {
		t.Skip("the numbers of a 300-request run: the run without the race detector checks them")
	}
	n := 900
	if testing.Short() {
		n = 300
	}
	wl, err := workload.DefaultConfig("w1")
	if err != nil {
		t.Fatal(err)
	}
	wl.Requests, wl.Rate, wl.Seed = n, fleet.DefaultRate("w1", 3), 3
	b, s := fidelityRun(t, wl, 60*time.Second)
	if b.Failed != 0 {
		t.Fatalf("%d failed through the gateway", b.Failed)
	}
	t.Logf("TTFT p50/p99: live %.1f/%.1f ms, sim %.1f/%.1f ms; hit rate live %.3f, sim %.3f",
		b.TTFT.P50, b.TTFT.P99, s.TTFT.P50, s.TTFT.P99, b.HitRate, s.HitRate)
	within(t, 0.10, []closeTo{{"TTFT p50", b.TTFT.P50, s.TTFT.P50}, {"TTFT p99", b.TTFT.P99, s.TTFT.P99}, {"hit rate", b.HitRate, s.HitRate}})
}

// W7 (overload bursts) with kv admission through bench -> live -> 3
// engines and through sim: the queue's wait p50 and p99 and the rejections
// within 10% of each other, and no engine failure on either side.
func TestFidelityOverload(t *testing.T) {
	if testing.Short() {
		t.Skip("an overload of 400 heavy requests: run without -short")
	}
	wl, err := workload.DefaultConfig("w7")
	if err != nil {
		t.Fatal(err)
	}
	wl.Requests, wl.Rate, wl.Seed = 600, fleet.DefaultRate("w7", 3), 3
	b, s := fidelityRun(t, wl, 0)
	t.Logf("queue p50/p99: live %.0f/%.0f ms, sim %.0f/%.0f ms; rejected live %d %v, sim %d %v; completed live %d, sim %d; preemptions sim %d",
		b.QueueMs.P50, b.QueueMs.P99, s.QueueMs.P50, s.QueueMs.P99, b.RejectedTotal, b.Rejected, s.RejectedTotal, s.Rejected, b.Completed, s.Completed, s.Preemptions)
	if b.EngineFailed != 0 || s.EngineFailed != 0 || s.Preemptions != 0 {
		t.Fatalf("engine failures live %d, sim %d; preemptions sim %d", b.EngineFailed, s.EngineFailed, s.Preemptions)
	}
	if s.RejectedTotal == 0 || s.QueueMs.P50 == 0 {
		t.Fatalf("the overload queued nothing or rejected nothing in the simulation: %+v", s.Rejected)
	}
	within(t, 0.10, []closeTo{
		{"queue p50", b.QueueMs.P50, s.QueueMs.P50}, {"queue p99", b.QueueMs.P99, s.QueueMs.P99},
		{"rejected", float64(b.RejectedTotal), float64(s.RejectedTotal)},
	})
}

type closeTo struct {
	name string
	x, y float64
}

func within(t *testing.T, tol float64, cs []closeTo) {
	t.Helper()
	for _, c := range cs {
		if math.Abs(c.x-c.y) > tol*c.y {
			t.Errorf("%s: live %.4g, sim %.4g: more than %.0f%% apart", c.name, c.x, c.y, 100*tol)
		}
	}
}

// asClient makes a simulated request carry the max_tokens bench sends: its
// true output length (bench asks for exactly that, with ignore_eos, so an
// engine writes the workload's answer).
type asClient struct{ workload.Source }

func (a asClient) Next() (*workload.Request, bool) { return a.fix(a.Source.Next()) }
func (a asClient) Done(r *workload.Request, at time.Duration, ok bool) (*workload.Request, bool) {
	return a.fix(a.Source.Done(r, at, ok))
}
func (a asClient) fix(r *workload.Request, ok bool) (*workload.Request, bool) {
	if ok {
		r.MaxTokens = r.OutputTokens
	}
	return r, ok
}

// fidelityRun runs wl through bench -> live (cost_model, kv admission, the
// approximate index, builtin:sim) -> 3 engines on virtual time and through
// the simulator with the same gateway settings, and returns both summaries.
func fidelityRun(t *testing.T, wl workload.Config, warmup time.Duration) (live, simulated results.Summary) {
	t.Helper()
	ec := engine.DefaultConfig()
	const policy = "cost_model"
	// Both sides run the gateway core with live's default admission (kv).
	fc := fleet.DefaultConfig()
	fc.Seed, fc.Workload, fc.Policy, fc.Replicas, fc.Engine = wl.Seed, wl, policy, 3, ec
	fc.ScrapeInterval, fc.Index, fc.SLO, fc.Warmup = 100*time.Millisecond, fleet.IndexApproximate, results.DefaultSLO(), warmup
	fc.Admission = gateway.Admission(config.DefaultModel().Admission)
	fc.Source = func(seed uint64) (workload.Source, error) {
		w := wl
		w.Seed = seed
		src, err := workload.New(w)
		return asClient{src}, err
	}
	fc.SourceName = wl.Workload
	so, err := fleet.Simulate(fc)
	if err != nil {
		t.Fatal(err)
	}
	var out *bench.Output
	synctest.Test(t, func(t *testing.T) {
		out = testfleet.Run(t, testfleet.Config{Engine: ec, Replicas: 3, Workload: wl, Warmup: warmup,
			Gateway: func(reps []config.Replica, tr http.RoundTripper) (testfleet.Gateway, error) {
				o := config.Default()
				mo := config.DefaultModel()
				mo.Name, mo.Policy, mo.Index, mo.MaxConcurrency, mo.MaxPending = server.DefaultModelName, policy, config.IndexApproximate, 1024, 1024
				mo.MaxModelLen = ec.MaxModelLen // as the simulator's core knows it
				mo.Replicas = reps
				o.Models = []config.Model{mo}
				return New(&o, Deps{Transport: tr, Encoders: map[string]Encoder{mo.Name: simModel(t)}})
			}})
	})
	return out.Summary, so.Summary
}
