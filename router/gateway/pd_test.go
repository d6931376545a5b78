package gateway

import (
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/router"
)

// pdCore builds a core with replicas of the given roles, r0, r1, ...
func pdCore(tb interface{ Fatal(...any) }, cfg Config, roles ...Role) *Core {
	c, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	for i, role := range roles {
		if _, err := c.AddReplica(ReplicaConfig{Name: "r" + string(rune('0'+i)), Role: role}); err != nil {
			tb.Fatal(err)
		}
	}
	return c
}

// thresholdConfig is testConfig with llm-d's threshold decider.
func thresholdConfig(pol string) Config {
	cfg := testConfig(pol)
	cfg.PD.Decider = DecideThreshold
	return cfg
}

func TestPDDispatchesPrefillRemotely(t *testing.T) {
	c := pdCore(t, thresholdConfig("cost_model"), RolePrefill, RoleDecode)
	d, _ := c.Submit(0, promptReq(1, 1000, 10))
	mustKind(t, d, Dispatched)
	if d.Replica != 1 || d.Prefill != 0 || d.PrefillName != "r0" {
		t.Fatalf("decision %+v: want decode on r1, prefill on r0", d)
	}
	p, dec := c.State(0, 0).Load, c.State(0, 1).Load
	if p.InFlight != 1 || p.Pending != 1 || p.PendingPrefillTokens != 1000 {
		t.Errorf("prefill replica load %+v: want the request's prefill", p)
	}
	if dec.InFlight != 1 || dec.Pending != 1 || dec.PendingPrefillTokens != 0 {
		t.Errorf("decode replica load %+v: want the request in flight with no prefill", dec)
	}
	c.PrefillDone(time.Millisecond, d.Ticket)
	if p := c.State(0, 0).Load; p.InFlight != 0 || p.Pending != 0 || p.PendingPrefillTokens != 0 || p.InFlightPromptTokens != 0 {
		t.Errorf("prefill replica after PrefillDone: %+v, want idle", p)
	}
	c.FirstByte(2*time.Millisecond, d.Ticket, -1)
	c.Finished(3*time.Millisecond, d.Ticket, Usage{Known: true, PromptTokens: 1000, CompletionTokens: 10}, nil)
	if l := c.State(0, 1).Load; l.InFlight != 0 || l.InFlightPromptTokens != 0 {
		t.Errorf("decode replica after Finished: %+v", l)
	}
	if got := c.PDStats(); got.Remote != 1 || got.Done != 1 {
		t.Errorf("stats %+v", got)
	}
	// The decode replica holds the transferred prompt: a repeat has too
	// little uncached to be worth a remote prefill.
	d2, _ := c.Submit(4*time.Millisecond, promptReq(1, 1000, 10))
	if d2.Prefill != -1 || d2.PredictedCachedTokens != 992 {
		t.Errorf("repeat %+v: want a local prefill of the last block", d2)
	}
	// A longer prompt with the same start: the prefill replica is predicted
	// to hold the first 1000 tokens too.
	d3, _ := c.Submit(5*time.Millisecond, Request{ID: 3, PromptTokens: 2000, PromptKnown: true,
		BlockHashes: append(hashesOf(1, 1000)[:62:62], hashesOf(9, 1008)...), MaxTokens: 10})
	if d3.Prefill != 0 || d3.PrefillCachedTokens != 992 {
		t.Errorf("extension %+v: want a remote prefill with the first 992 tokens cached there", d3)
	}
}

func TestPDDeciders(t *testing.T) {
	for _, tc := range []struct {
		decider string
		prompt  int
		remote  bool
	}{
		{DecideThreshold, 8, false}, // 8 uncached < 16
		{DecideThreshold, 64, true},
		{DecideNever, 4000, false},
		{DecideAlways, 8, true},
		{DecideDynamo, 1000, true}, // uncached/prompt = 1 >= 0.7
		{DecideCost, 8, false},
		{DecideCost, 1000, false}, // both idle: the transfer only adds
		{DecideAuto, 8, false},    // cost_model's own: cost
		{DecideAuto, 1000, false}, // idle: local
	} {
		cfg := testConfig("cost_model")
		cfg.PD.Decider = tc.decider
		c := pdCore(t, cfg, RolePrefill, RoleDecode)
		d, _ := c.Submit(0, plainReq(1, tc.prompt, 10))
		mustKind(t, d, Dispatched)
		if got := d.Prefill >= 0; got != tc.remote {
			t.Errorf("%s, %d tokens: remote %v, want %v (%+v)", tc.decider, tc.prompt, got, tc.remote, d)
		}
		if d.Replica != 1 {
			t.Errorf("%s: decode on r%d, want r1 (r0 is prefill-only)", tc.decider, d.Replica)
		}
	}
}

// An embedding is computed where it is routed: no decider sends it to a
// prefill replica, however long its prompt.
func TestPDEmbeddingsStayLocal(t *testing.T) {
	for _, dec := range []string{DecideAlways, DecideThreshold, DecideDynamo} {
		cfg := testConfig("cost_model")
		cfg.PD.Decider = dec
		c := pdCore(t, cfg, RolePrefill, RoleDecode)
		d, _ := c.Submit(0, prefillReq(plainReq(1, 4000, 0)))
		mustKind(t, d, Dispatched)
		if d.Prefill != -1 || d.Replica != 1 {
			t.Errorf("%s: %+v, want r1 with a local prefill", dec, d)
		}
		// A request whose API has no KV hand-over (LocalPrefill) too; the
		// same one without it prefills remotely under "always".
		local := plainReq(2, 4000, 16)
		local.LocalPrefill = true
		d, _ = c.Submit(0, local)
		mustKind(t, d, Dispatched)
		if d.Prefill != -1 || d.Replica != 1 {
			t.Errorf("%s: local prefill only: %+v", dec, d)
		}
		if dec == DecideAlways {
			if d, _ := c.Submit(0, plainReq(3, 4000, 16)); d.Prefill != 0 {
				t.Errorf("always: %+v, want a remote prefill", d)
			}
		}
	}
}

// The cost decider prefills remotely when the decode replica is busy
// prefilling and the prefill replica is idle, locally when the transfer
// costs more than it saves.
func TestPDCostDecider(t *testing.T) {
	cfg := testConfig("cost_model")
	cfg.PD.Decider = DecideCost
	c := pdCore(t, cfg, RolePrefill, RoleDecode)
	// Load the decode replica with a local prefill of 30k tokens.
	cfg2 := cfg
	cfg2.PD.Decider = DecideNever
	busy := pdCore(t, cfg2, RolePrefill, RoleDecode)
	busy.Submit(0, plainReq(1, 30000, 10))
	d, _ := busy.Submit(0, plainReq(2, 2000, 10))
	if d.Prefill != -1 {
		t.Fatalf("never: %+v", d)
	}
	// The same state under the cost decider: the idle prefill replica wins.
	c.pd.decider = DecideNever
	c.Submit(0, plainReq(1, 30000, 10))
	c.pd.decider = DecideCost
	d, _ = c.Submit(0, plainReq(2, 2000, 10))
	if d.Prefill != 0 {
		t.Errorf("cost with a busy decode replica: %+v, want a remote prefill", d)
	}
	// A slow link makes the transfer dearer than the local prefill.
	c.cfg.PD.Transfer.BandwidthGBps = 0.001
	d, _ = c.Submit(0, plainReq(3, 2000, 10))
	if d.Prefill != -1 {
		t.Errorf("cost over a slow link: %+v, want a local prefill", d)
	}
}

func TestPDPrefillFailedFallsBackLocal(t *testing.T) {
	c := pdCore(t, thresholdConfig("cost_model"), RolePrefill, RoleDecode)
	d, _ := c.Submit(0, plainReq(1, 500, 10))
	if d.Prefill != 0 {
		t.Fatalf("%+v", d)
	}
	c.PrefillFailed(time.Millisecond, d.Ticket, true)
	if p := c.State(time.Millisecond, 0); p.Load.InFlight != 0 || p.Failures != 1 {
		t.Errorf("prefill replica after a failure: %+v", p)
	}
	if l := c.State(time.Millisecond, 1).Load; l.PendingPrefillTokens != 500 || l.Pending != 1 {
		t.Errorf("decode replica after the fallback: %+v, want the local prefill pending", l)
	}
	// Late or repeated calls change nothing.
	c.PrefillDone(time.Millisecond, d.Ticket)
	c.PrefillFailed(time.Millisecond, d.Ticket, true)
	if p := c.State(time.Millisecond, 0); p.Failures != 1 {
		t.Errorf("a repeated PrefillFailed counted: %+v", p)
	}
	c.FirstByte(2*time.Millisecond, d.Ticket, 0)
	c.Finished(3*time.Millisecond, d.Ticket, Usage{}, nil)
	for i := range 2 {
		if l := c.State(0, i).Load; l != (router.Load{Engine: l.Engine}) {
			t.Errorf("r%d after the request: %+v", i, l)
		}
	}
	if got := c.PDStats(); got.Failed != 1 || got.Done != 0 {
		t.Errorf("stats %+v", got)
	}
}

func TestPDNoDecodeReplica(t *testing.T) {
	c := pdCore(t, testConfig("cost_model"), RolePrefill, RolePrefill)
	d, _ := c.Submit(0, plainReq(1, 500, 10))
	if d.Kind != Rejected || d.Reason != ReasonNoReplica {
		t.Errorf("%+v: want a rejection, no replica can decode", d)
	}
}

func TestPDAutoIsThePolicysOwn(t *testing.T) {
	for pol, want := range map[string]string{"llmd": DecideThreshold, "dynamo": DecideDynamo, "cost_model": DecideCost, "round_robin": DecideThreshold} {
		c := pdCore(t, testConfig(pol), RolePrefill, RoleDecode)
		if c.pd.decider != want || c.pd.pol.Name() != pol {
			t.Errorf("%s: decider %s, prefill policy %s; want %s and %s", pol, c.pd.decider, c.pd.pol.Name(), want, pol)
		}
	}
}

func TestPDConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		set  func(*PDConfig)
		want string
	}{
		{func(p *PDConfig) { p.Decider = "sometimes" }, "pd.decider"},
		{func(p *PDConfig) { p.Transfer.BandwidthGBps = -1 }, "pd.transfer"},
		{func(p *PDConfig) { p.KVBytesPerToken = -1 }, "pd.kv_bytes_per_token"},
		{func(p *PDConfig) { p.NonCachedTokens = -1 }, "pd.non_cached_tokens"},
		{func(p *PDConfig) { p.PrefillPolicy = "nope" }, "pd.prefill_policy"},
	} {
		cfg := testConfig("cost_model")
		tc.set(&cfg.PD)
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v: want one naming %s", err, tc.want)
		}
	}
	if _, err := ParseRole("mixed"); err == nil || !strings.Contains(err.Error(), "prefill, decode, both") {
		t.Errorf("ParseRole(mixed) = %v", err)
	}
}

// TestPropertyPD drives a P/D core with random lifecycle calls: a decode
// never lands on a prefill-only replica, a prefill only on one, each
// replica's counters match the requests it holds, and everything returns
// to zero once every request has ended.
func TestPropertyPD(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		roles := rapid.SliceOfN(rapid.SampledFrom([]Role{RoleBoth, RolePrefill, RoleDecode}), 2, 5).Draw(t, "roles")
		cfg := testConfig(rapid.SampledFrom([]string{"cost_model", "round_robin", "llmd"}).Draw(t, "policy"))
		cfg.PD.Decider = rapid.SampledFrom(Deciders()).Draw(t, "decider")
		c := pdCore(t, cfg, roles...)
		type live struct {
			t        Ticket
			prefill  int
			replica  int
			streamed bool
		}
		var reqs []*live
		now := time.Duration(0)
		take := func(d Decision) {
			if d.Kind != Dispatched {
				return
			}
			if roles[d.Replica] == RolePrefill {
				t.Fatalf("decode on prefill-only r%d: %+v", d.Replica, d)
			}
			if d.Prefill >= 0 && roles[d.Prefill] != RolePrefill {
				t.Fatalf("prefill on r%d of role %v", d.Prefill, roles[d.Prefill])
			}
			for _, m := range reqs {
				if m.t == d.Ticket {
					m.prefill, m.replica = d.Prefill, d.Replica
					return
				}
			}
			reqs = append(reqs, &live{t: d.Ticket, prefill: d.Prefill, replica: d.Replica})
		}
		takeAll := func(ds []Decision) {
			for _, d := range ds {
				take(d)
			}
		}
		drop := func(m *live) {
			for i, x := range reqs {
				if x == m {
					reqs = append(reqs[:i], reqs[i+1:]...)
					return
				}
			}
		}
		check := func() {
			inflight := make([]int, len(roles))
			for _, m := range reqs {
				inflight[m.replica]++
				if m.prefill >= 0 {
					inflight[m.prefill]++
				}
			}
			for i := range roles {
				if got := c.State(now, i).Load.InFlight; got != inflight[i] {
					t.Fatalf("r%d (%v): %d in flight, want %d", i, roles[i], got, inflight[i])
				}
			}
		}
		id := uint64(0)
		steps := rapid.IntRange(1, 60).Draw(t, "steps")
		for range steps {
			now += time.Millisecond
			if len(reqs) == 0 || rapid.IntRange(0, 3).Draw(t, "new") == 0 {
				id++
				d, o := c.Submit(now, promptReq(id%4, rapid.IntRange(1, 3000).Draw(t, "tokens"), 10))
				take(d)
				takeAll(o)
				check()
				continue
			}
			m := reqs[rapid.IntRange(0, len(reqs)-1).Draw(t, "req")]
			switch rapid.IntRange(0, 6).Draw(t, "op") {
			case 0:
				if m.prefill >= 0 {
					takeAll(c.PrefillDone(now, m.t))
					m.prefill = -1
				}
			case 1:
				if m.prefill >= 0 {
					takeAll(c.PrefillFailed(now, m.t, true))
					m.prefill = -1
				}
			case 2:
				if m.prefill < 0 && !m.streamed {
					takeAll(c.FirstByte(now, m.t, -1))
					m.streamed = true
				}
			case 3:
				if m.prefill < 0 {
					drop(m)
					takeAll(c.Finished(now, m.t, Usage{}, nil))
				}
			case 4:
				if !m.streamed {
					drop(m)
					d, o := c.Retry(now, m.t, true)
					take(d)
					takeAll(o)
				}
			case 5:
				drop(m)
				takeAll(c.Fail(now, m.t, false))
			case 6:
				drop(m)
				takeAll(c.Abort(now, m.t))
			}
			check()
		}
		for len(reqs) > 0 {
			m := reqs[0]
			drop(m)
			takeAll(c.Abort(now, m.t))
		}
		now += time.Minute
		c.Advance(now)
		for len(reqs) > 0 { // whatever the last aborts dispatched from the queue
			m := reqs[0]
			drop(m)
			takeAll(c.Abort(now, m.t))
		}
		for i := range roles {
			st := c.State(now, i)
			if l := st.Load; l.InFlight != 0 || l.Pending != 0 || l.PendingPromptTokens != 0 || l.PendingPrefillTokens != 0 || l.InFlightPromptTokens != 0 {
				t.Fatalf("r%d after every request ended: %+v", i, l)
			}
			if st.ReservedBlocks != 0 {
				t.Fatalf("r%d holds %d reserved blocks", i, st.ReservedBlocks)
			}
		}
	})
}
