// What a run measures and says about itself: failures by reason, busy
// against token-budget use, default rates that follow the profile, and the
// steady-state check.

package fleet

import (
	"math"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/results"
)

// TestEngineRefusalsSayWhy: requests an engine refuses (here: more KV than
// its whole cache, which the gateway's max_model_len check lets through)
// fail with that reason, and the summary says what the limit was.
func TestEngineRefusalsSayWhy(t *testing.T) {
	c := smallConfig(t, "w6", 200)
	c.Engine.NumGPUBlocks = 80 // 1,280 tokens: w6's longer prompts do not fit
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	s := out.Summary
	n := s.FailedBy[results.FailTooLarge]
	if n == 0 || n != s.Failed || s.EngineFailed != n {
		t.Fatalf("failed %d (engine %d) by %v, want every failure too_large", s.Failed, s.EngineFailed, s.FailedBy)
	}
	for _, r := range out.Records {
		if r.Outcome == results.OutcomeFailed && r.Fail != results.FailTooLarge {
			t.Errorf("request %d failed with reason %q", r.ID, r.Fail)
		}
	}
	if m := s.FailureReasons[results.FailTooLarge]; !strings.Contains(m, "80") {
		t.Errorf("too_large means %q, want the cache's 80 blocks named", m)
	}
	if txt := s.FailureText(); !strings.Contains(txt, " failed: prompt + output need more KV blocks than an engine's 80 ") {
		t.Errorf("FailureText() = %q", txt)
	}
}

// TestGatewayRefusalsSayWhy: a prompt over max_model_len is refused by the
// gateway (too_long), and the summary names the limit.
func TestGatewayRefusalsSayWhy(t *testing.T) {
	c := smallConfig(t, "w6", 200)
	c.Engine.MaxModelLen = 1500 // w6's longer prompts + max_tokens are over it
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	s := out.Summary
	if s.FailedBy[results.RejectTooLong] == 0 || s.FailedBy[results.RejectTooLong] != s.Failed {
		t.Fatalf("failed %d by %v, want every failure too_long", s.Failed, s.FailedBy)
	}
	want := "prompt + max_tokens over max_model_len 1500"
	if m := s.FailureReasons[results.RejectTooLong]; m != want {
		t.Errorf("too_long means %q, want %q", m, want)
	}
}

// TestBusyIsAnyStepBudgetIsTheWork: at the default rate (about 70% of what
// round robin sustains) every engine is busy nearly all the time, since one
// request in flight keeps it stepping, while its token budget is far from
// full; more load fills more of the budget, and busy cannot say so.
func TestBusyIsAnyStepBudgetIsTheWork(t *testing.T) {
	use := func(scale float64) (busy, budget float64) {
		c := smallConfig(t, "w1", 1500)
		c.Workload.Rate *= scale
		out, err := Simulate(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range out.Summary.PerReplica {
			if r.TokenBudgetUse <= 0 || r.TokenBudgetUse > r.BusyFraction {
				t.Errorf("%s: budget use %v, want in (0, busy %v]", r.Replica, r.TokenBudgetUse, r.BusyFraction)
			}
			busy += r.BusyFraction / float64(len(out.Summary.PerReplica))
			budget += r.TokenBudgetUse / float64(len(out.Summary.PerReplica))
		}
		return busy, budget
	}
	busy, budget := use(1)
	if busy < 0.9 || budget > 0.5 {
		t.Errorf("at the default rate: busy %.3f, budget use %.3f; want busy near 1 and most of the budget unused", busy, budget)
	}
	lightBusy, light := use(0.5)
	if !(light < 0.75*budget) {
		t.Errorf("budget use %.3f at half the rate, %.3f at the default: want it to follow the load", light, budget)
	}
	t.Logf("busy %.3f / %.3f, budget use %.3f / %.3f at the default rate / half of it", busy, lightBusy, budget, light)
}

// TestDefaultRateFollowsTheProfile: without a rate, a fleet of faster
// engines is offered more, in proportion to what it serves; the default
// profile keeps the measured per-replica rates exactly.
func TestDefaultRateFollowsTheProfile(t *testing.T) {
	for _, wl := range []string{"w1", "w2", "w6"} {
		c := smallConfig(t, wl, 100)
		c.Replicas = 6
		if got, want := c.DefaultRate(), RatePerReplica(wl)*6; got != want {
			t.Errorf("%s on the default profile: default rate %v, want %v", wl, got, want)
		}
		fast := c
		fast.Engine.Latency = scaleProfile(c.Engine.Latency, 0.25) // every step 4x faster
		if got, want := fast.DefaultRate(), 4*RatePerReplica(wl)*6; math.Abs(got-want) > 1e-9 {
			t.Errorf("%s on 4x faster engines: default rate %v, want %v", wl, got, want)
		}
		dp := c
		dp.Engine.DataParallelSize = 2
		if got, want := dp.DefaultRate(), 2*RatePerReplica(wl)*6; math.Abs(got-want) > 1e-9 {
			t.Errorf("%s on two data-parallel ranks per replica: default rate %v, want %v", wl, got, want)
		}
		small := c
		small.Engine.NumGPUBlocks /= 8 // a cache too small for a full batch
		if got := small.DefaultRate(); !(got < c.DefaultRate()) {
			t.Errorf("%s with an eighth of the KV cache: default rate %v, want below %v", wl, got, c.DefaultRate())
		}
	}
}

// TestDefaultRateKeepsAFasterFleetLoaded: a fleet of 4x faster engines at
// its default rate is about as loaded as the default fleet at its own, not
// nearly idle.
func TestDefaultRateKeepsAFasterFleetLoaded(t *testing.T) {
	budget := func(c Config) float64 {
		c.Workload.Rate = c.DefaultRate()
		out, err := Simulate(c)
		if err != nil {
			t.Fatal(err)
		}
		var u float64
		for _, r := range out.Summary.PerReplica {
			u += r.TokenBudgetUse / float64(len(out.Summary.PerReplica))
		}
		return u
	}
	base := smallConfig(t, "w6", 2000)
	fast := base
	fast.Engine.Latency = scaleProfile(base.Engine.Latency, 0.25)
	b, f := budget(base), budget(fast)
	if f < 0.7*b {
		t.Errorf("token budget use %.3f on 4x faster engines at their default rate, %.3f on the default: the faster fleet runs nearly idle", f, b)
	}
}

func scaleProfile(p engine.Profile, k float64) engine.Profile {
	p.StepFixedMs *= k
	p.PrefillTokenUs *= k
	p.PrefillPairNs *= k
	p.DecodeSeqUs *= k
	p.DecodeCtxTokenNs *= k
	return p
}

// TestSteadyStateWarnsOnAClosedLoopRampingUp: w2's chats take minutes to
// ramp up to their rate, so a short run answers for a lighter load than it
// names, and says so; a run of an open-loop workload at its default rate
// does not warn.
func TestSteadyStateWarnsOnAClosedLoopRampingUp(t *testing.T) {
	c := smallConfig(t, "w2", 2000)
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	if st := out.Summary.Steady; !st.Checked || !strings.Contains(st.Warning, "configured") {
		t.Errorf("w2, 2,000 requests: steady state %+v, want a warning that the rate was not reached", st)
	}
	c = smallConfig(t, "w6", 2000)
	out, err = Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	if st := out.Summary.Steady; !st.Checked || st.Warning != "" {
		t.Errorf("w6 at its default rate: steady state %+v, want checked and steady", st)
	}
}
