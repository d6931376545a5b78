package gateway

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/router"
	"pgregory.net/rapid"
)

// xdriver drives a core with random calls and keeps what it decided.
type xdriver struct {
	t       *rapid.T
	c       *Core
	now     time.Duration
	nextID  uint64
	pending []Ticket // dispatched, no first byte
	flowing []Ticket // first byte seen
	decs    []Decision
}

// genExplainConfig draws a core's configuration: any policy, any
// admission, either index mode, a small queue or none.
func genExplainConfig(t *rapid.T) (Config, int, ReplicaConfig) {
	cfg := testConfig(rapid.SampledFrom(router.Names()).Draw(t, "policy"))
	cfg.Router.Options.Seed = rapid.Uint64().Draw(t, "seed")
	cfg.Router.Options.SessionAffinity = rapid.Bool().Draw(t, "affinity")
	cfg.Router.Index = rapid.SampledFrom([]router.IndexMode{router.IndexApproximate, router.IndexEvents}).Draw(t, "index")
	cfg.Router.SpeculationTTL = time.Second
	cfg.Admission = Admission(rapid.SampledFrom(Admissions()).Draw(t, "admission"))
	cfg.Queue.MaxRequests = rapid.SampledFrom([]int{0, 3, 64}).Draw(t, "queue")
	cfg.MaxModelLen = rapid.SampledFrom([]int{0, 3000}).Draw(t, "maxlen")
	cfg.Peers.LLMDMaxConcurrency = 3
	cfg.Peers.DynamoQueueThreshold = 1
	n := rapid.IntRange(1, 6).Draw(t, "replicas")
	rc := ReplicaConfig{
		MaxInFlight:    rapid.SampledFrom([]int{0, 2, 5}).Draw(t, "maxinflight"),
		CapacityBlocks: rapid.SampledFrom([]int{0, 150, 2000}).Draw(t, "capacity"),
	}
	return cfg, n, rc
}

// rcore is newCore for a rapid check.
func rcore(t *rapid.T, cfg Config, n int, rc ReplicaConfig) *Core {
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		rc := rc
		rc.Name = fmt.Sprintf("r%d", i)
		if _, err := c.AddReplica(rc); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func (d *xdriver) request() Request {
	t := d.t
	d.nextID++
	tokens := rapid.IntRange(1, 2500).Draw(t, "tokens")
	seg := rapid.Uint64Range(1, 4).Draw(t, "segment")
	q := Request{ID: d.nextID, PromptTokens: tokens, PromptKnown: true, MaxTokens: rapid.IntRange(0, 600).Draw(t, "maxtokens"),
		Priority: rapid.IntRange(0, 2).Draw(t, "prio"), Tenant: rapid.SampledFrom([]string{"", "a", "b"}).Draw(t, "tenant"),
		Session: rapid.Uint64Range(0, 3).Draw(t, "session"), Bytes: int64(tokens * 4)}
	if rapid.IntRange(0, 4).Draw(t, "tokenized") > 0 {
		q.BlockHashes = hashesOf(seg, tokens)
	}
	return q
}

func (d *xdriver) take(ds ...Decision) {
	for _, x := range ds {
		d.decs = append(d.decs, x)
		if x.Kind == Dispatched {
			d.pending = append(d.pending, x.Ticket)
		}
	}
}

func pop(t *rapid.T, l *[]Ticket, what string) (Ticket, bool) {
	if len(*l) == 0 {
		return 0, false
	}
	i := rapid.IntRange(0, len(*l)-1).Draw(t, what)
	tk := (*l)[i]
	*l = append((*l)[:i], (*l)[i+1:]...)
	return tk, true
}

// step makes one random call other than Submit.
func (d *xdriver) step() {
	t := d.t
	switch rapid.IntRange(0, 5).Draw(t, "op") {
	case 0:
		if tk, ok := pop(t, &d.pending, "fb"); ok {
			d.take(d.c.FirstByte(d.now, tk, -1)...)
			d.flowing = append(d.flowing, tk)
		}
	case 1:
		if tk, ok := pop(t, &d.flowing, "fin"); ok {
			d.take(d.c.Finished(d.now, tk, Usage{Known: true, CompletionTokens: rapid.IntRange(1, 300).Draw(t, "out")}, nil)...)
		}
	case 2:
		i := rapid.IntRange(0, d.c.Replicas()-1).Draw(t, "rep")
		d.take(d.c.Report(d.now, i, Report{Running: rapid.IntRange(0, 6).Draw(t, "run"), Waiting: rapid.IntRange(0, 8).Draw(t, "wait"),
			KVUsage: float64(rapid.IntRange(0, 10).Draw(t, "kv")) / 10})...)
	case 3:
		d.now += time.Duration(rapid.IntRange(1, 400).Draw(t, "dt")) * time.Millisecond
		d.take(d.c.Advance(d.now)...)
	case 4:
		if tk, ok := pop(t, &d.pending, "fail"); ok {
			d.take(d.c.Fail(d.now, tk, rapid.Bool().Draw(t, "fault"))...)
		}
	case 5:
		d.take(d.c.Poke(d.now)...)
	}
}

func (d *xdriver) submit(q Request) Decision {
	dec, others := d.c.Submit(d.now, q)
	d.take(dec)
	d.take(others...)
	return dec
}

// The explained verdict is the decision Submit makes right after, for the
// same state: its kind, reason and status, and for a dispatch its replica,
// prediction and weight. Explaining twice says the same.
func TestExplainMatchesSubmit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg, n, rc := genExplainConfig(t)
		if rapid.Bool().Draw(t, "shadow") {
			cfg.ShadowPolicy = rapid.SampledFrom(router.Names()).Draw(t, "shadowpolicy")
		}
		d := &xdriver{t: t, c: rcore(t, cfg, n, rc)}
		for range rapid.IntRange(1, 40).Draw(t, "rounds") {
			for range rapid.IntRange(0, 3).Draw(t, "steps") {
				d.step()
			}
			q := d.request()
			ex := d.c.Explain(d.now, q)
			again := d.c.Explain(d.now, q)
			a, err := json.Marshal(ex)
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := json.Marshal(again); string(a) != string(b) {
				t.Fatalf("explaining twice differs:\n%s\n%s", a, b)
			}
			dec := d.submit(q)
			checkVerdict(t, &ex, dec, a)
		}
	})
}

func checkVerdict(t *rapid.T, ex *Explanation, dec Decision, js []byte) {
	a := &ex.Admission
	switch dec.Kind {
	case Dispatched:
		if a.Verdict == VerdictQueue && a.QueuedAhead > 0 {
			// Queued behind others, then dispatched at once by the drain
			// (another tenant's turn): the state it was routed in moved.
			return
		}
		w := ex.Winner
		if a.Verdict != VerdictDispatch || w == nil || w.Replica != dec.Replica || w.WeightBlocks != dec.Weight || w.PredictedCachedTokens != dec.PredictedCachedTokens {
			t.Fatalf("dispatched %+v, explained %s", dec, js)
		}
		if sh := dec.Shadow; sh.Policy != "" {
			if ex.Shadow == nil || ex.Shadow.WinnerReplica != sh.Replica || ex.Shadow.Agree != sh.Agree {
				t.Fatalf("shadow %+v, explained %s", sh, js)
			}
		}
	case Queued:
		if a.Verdict != VerdictQueue {
			t.Fatalf("queued, explained %s", js)
		}
	case Rejected:
		if a.Verdict != VerdictReject || a.Reason != dec.Reason || a.Status != dec.Status {
			t.Fatalf("rejected %+v, explained %s", dec, js)
		}
	}
	if ex.Why == "" || !strings.HasPrefix(ex.Why, a.Verdict) {
		t.Fatalf("why %q for verdict %s", ex.Why, a.Verdict)
	}
}

// Explain changes nothing: a twin core fed the same calls, never
// explained, decides the same, call for call.
func TestExplainHasNoSideEffectsOnTheCore(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg, n, rc := genExplainConfig(t)
		cfg.ShadowPolicy = rapid.SampledFrom(append(router.Names(), "")).Draw(t, "shadowpolicy")
		a := &xdriver{t: t, c: rcore(t, cfg, n, rc)}
		b := &xdriver{t: t, c: rcore(t, cfg, n, rc)}
		for range rapid.IntRange(1, 60).Draw(t, "rounds") {
			// One draw sequence drives both: b replays a's draws.
			op := rapid.IntRange(0, 2).Draw(t, "kind")
			switch op {
			case 0:
				q := a.request()
				b.nextID++
				for range rapid.IntRange(0, 2).Draw(t, "explains") {
					a.c.Explain(a.now, q)
				}
				a.submit(q)
				b.submit(q)
			default:
				at := rapid.IntRange(0, 10).Draw(t, "dt")
				a.now += time.Duration(at) * time.Millisecond
				b.now = a.now
				if len(a.pending) > 0 {
					i := rapid.IntRange(0, len(a.pending)-1).Draw(t, "fb")
					ta, tb := a.pending[i], b.pending[i]
					a.pending = append(a.pending[:i], a.pending[i+1:]...)
					b.pending = append(b.pending[:i], b.pending[i+1:]...)
					a.take(a.c.FirstByte(a.now, ta, -1)...)
					b.take(b.c.FirstByte(b.now, tb, -1)...)
					a.take(a.c.Finished(a.now, ta, Usage{}, nil)...)
					b.take(b.c.Finished(b.now, tb, Usage{}, nil)...)
				}
			}
			if !reflect.DeepEqual(a.decs, b.decs) {
				t.Fatalf("the explained core decided\n%+v\nits twin\n%+v", a.decs, b.decs)
			}
		}
		sa, _ := a.c.ShadowStats()
		sb, _ := b.c.ShadowStats()
		if !reflect.DeepEqual(sa, sb) {
			t.Fatalf("shadow stats %+v and %+v", sa, sb)
		}
	})
}

// A shadow that is the real policy agrees on every decision, for every
// policy, whatever the traffic; and the shadow changes no decision.
func TestShadowOfItselfAgreesAlways(t *testing.T) {
	for _, pol := range router.Names() {
		t.Run(pol, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				cfg, n, rc := genExplainConfig(t)
				cfg.Router.Policy = pol
				plain := cfg
				cfg.ShadowPolicy = pol
				a := &xdriver{t: t, c: rcore(t, cfg, n, rc)}
				b := &xdriver{t: t, c: rcore(t, plain, n, rc)}
				for range rapid.IntRange(1, 50).Draw(t, "rounds") {
					q := a.request()
					b.nextID++
					da, db := a.submit(q), b.submit(q)
					if da.Kind == Dispatched && (!da.Shadow.Agree || da.Shadow.Policy != pol || da.Shadow.EstimatedTTFTMs != da.Shadow.ShadowEstimatedTTFTMs) {
						t.Fatalf("the shadow of itself disagreed: %+v", da.Shadow)
					}
					da.Shadow = ShadowPick{}
					if da != db {
						t.Fatalf("with a shadow %+v, without %+v", da, db)
					}
					if len(a.pending) > 0 && rapid.Bool().Draw(t, "end") {
						ta, tb := a.pending[0], b.pending[0]
						a.pending, b.pending = a.pending[1:], b.pending[1:]
						a.now += time.Millisecond
						b.now = a.now
						a.take(a.c.FirstByte(a.now, ta, -1)...)
						b.take(b.c.FirstByte(b.now, tb, -1)...)
						a.take(a.c.Finished(a.now, ta, Usage{}, nil)...)
						b.take(b.c.Finished(b.now, tb, Usage{}, nil)...)
					}
				}
				st, ok := a.c.ShadowStats()
				dispatched := uint64(0)
				for _, x := range a.decs {
					if x.Kind == Dispatched {
						dispatched++
					}
				}
				if !ok || st.Decisions != dispatched || st.Agreed != st.Decisions || (st.Decisions > 0 && st.Agreement() != 1) {
					t.Fatalf("stats %+v for %d dispatches", st, dispatched)
				}
				if st.EstimatedPrimary != st.EstimatedShadow || st.Measured[0].Count != 0 {
					t.Fatalf("estimates differ or a disagreement was measured: %+v", st)
				}
			})
		})
	}
}

func TestShadowTalliesAndMeasures(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Admission = AdmitNone
	cfg.ShadowPolicy = "cost_model"
	c := newCore(t, cfg, 2, ReplicaConfig{})
	// Replica 1 is loaded: round robin goes to 0, then 1; cost_model
	// would take 0 both times.
	var ts []Ticket
	for i := range 4 {
		d, _ := c.Submit(0, promptReq(uint64(i+1), 1000, 10))
		ts = append(ts, mustKind(t, d, Dispatched).Ticket)
	}
	c.FirstByte(sec(0.05), ts[0], -1)
	c.FirstByte(sec(0.2), ts[1], -1)
	st, _ := c.ShadowStats()
	if st.Primary != "round_robin" || st.Shadow != "cost_model" || st.Decisions != 4 {
		t.Fatalf("stats %+v", st)
	}
	if st.Measured[0].Count+st.Measured[1].Count != 2 || st.Measured[0].Sum+st.Measured[1].Sum != 0.25 {
		t.Fatalf("measured %+v", st.Measured)
	}
	if st.EstimatedPrimary.Count != 4 || st.EstimatedShadow.Sum > st.EstimatedPrimary.Sum {
		t.Fatalf("the shadow's estimates %+v exceed the real picks' %+v", st.EstimatedShadow, st.EstimatedPrimary)
	}
	if err := c.SetShadow("nope"); err == nil || !strings.Contains(err.Error(), "shadow_policy") {
		t.Fatalf("unknown shadow: %v", err)
	}
	if err := c.SetShadow(""); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.ShadowStats(); ok {
		t.Fatal("stats without a shadow")
	}
	// A measured first byte after shadow mode was turned off counts nowhere.
	c.FirstByte(sec(0.3), ts[2], -1)
}

func TestShadowPolicyValidated(t *testing.T) {
	cfg := testConfig("cost_model")
	cfg.ShadowPolicy = "fastest"
	_, err := New(cfg)
	if err == nil || !strings.Contains(err.Error(), "shadow_policy") || !strings.Contains(err.Error(), "round_robin") {
		t.Fatalf("error %v should name shadow_policy and the policies", err)
	}
}

func TestExplainVerdicts(t *testing.T) {
	cfg := testConfig("cost_model")
	cfg.Queue.MaxRequests = 1
	cfg.MaxModelLen = 4096
	c := newCore(t, cfg, 2, ReplicaConfig{CapacityBlocks: 100})
	ex := c.Explain(0, promptReq(1, 5000, 10))
	if ex.Admission.Verdict != VerdictReject || ex.Admission.Reason != ReasonTooLong || ex.Admission.Status != 400 {
		t.Fatalf("too long: %+v", ex.Admission)
	}
	ex = c.Explain(0, promptReq(1, 1000, 10))
	if ex.Admission.Verdict != VerdictDispatch || ex.Winner == nil || len(ex.Candidates) != 2 || !ex.Candidates[0].Considered {
		t.Fatalf("dispatch: %+v", ex)
	}
	if !strings.HasPrefix(ex.Why, "dispatch to r") || !strings.Contains(ex.Why, "lowest estimated TTFT") {
		t.Fatalf("why: %q", ex.Why)
	}
	// Fill both replicas: the next request queues, with each refusal named.
	for i := range 2 {
		d, _ := c.Submit(0, promptReq(uint64(10+i), 1500, 10))
		mustKind(t, d, Dispatched)
	}
	ex = c.Explain(0, promptReq(2, 1500, 10))
	if ex.Admission.Verdict != VerdictQueue || ex.Winner != nil || !strings.Contains(ex.Why, "r0 over_") {
		t.Fatalf("queue: %+v %q", ex.Admission, ex.Why)
	}
	if d, _ := c.Submit(0, promptReq(2, 1500, 10)); d.Kind != Queued {
		t.Fatalf("explained queue, submit %+v", d)
	}
	ex = c.Explain(0, promptReq(3, 1500, 10))
	if ex.Admission.Verdict != VerdictReject || ex.Admission.Reason != ReasonQueueFull || ex.Admission.QueuedAhead != 1 {
		t.Fatalf("queue full: %+v", ex.Admission)
	}
	b, err := json.Marshal(ex)
	if err != nil || !strings.Contains(string(b), `"admission":"over_`) {
		t.Fatalf("json %s (%v)", b, err)
	}
}

func TestSampled(t *testing.T) {
	n := 0
	for id := range uint64(100000) {
		if Sampled(id, 0.1) {
			n++
		}
		if first, again := Sampled(id, 0.1), Sampled(id, 0.1); first != again || Sampled(id, 0) || !Sampled(id, 1) {
			t.Fatal("not deterministic or not bounded")
		}
	}
	if n < 9500 || n > 10500 {
		t.Fatalf("sampled %d of 100000 at 0.1", n)
	}
}

// BenchmarkCoreShadow is BenchmarkCore with a shadow policy: the cost a
// shadow adds to one decision is the difference from the "none" rows.
func BenchmarkCoreShadow(b *testing.B) {
	for _, sh := range []string{"none", "round_robin", "cost_model", "llmd"} {
		for _, n := range []int{8, 64} {
			b.Run(fmt.Sprintf("cost_model+%s/%d", sh, n), func(b *testing.B) {
				cfg := testConfig("cost_model")
				if sh != "none" {
					cfg.ShadowPolicy = sh
				}
				benchCore(b, cfg, n)
			})
		}
	}
}

// BenchmarkCoreExplain measures one Explain of a request on the core of
// BenchmarkCore (off the decision path: the admin endpoint, sampled sim
// records).
func BenchmarkCoreExplain(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("cost_model/%d", n), func(b *testing.B) {
			c := newCore(b, testConfig("cost_model"), n, ReplicaConfig{CapacityBlocks: 16384})
			p := hashesOf(1, 8192)
			q := Request{ID: 1, PromptTokens: 8192, PromptKnown: true, BlockHashes: p, MaxTokens: 256}
			b.ReportAllocs()
			for b.Loop() {
				c.Explain(0, q)
			}
		})
	}
}

// benchCore is BenchmarkCore's loop for cfg on n replicas.
func benchCore(b *testing.B, cfg Config, n int) {
	c := newCore(b, cfg, n, ReplicaConfig{CapacityBlocks: 16384})
	prompts := make([][]kvblock.Hash, 32)
	for i := range prompts {
		prompts[i] = hashesOf(uint64(i+1), 8192)
	}
	one := func(i int) {
		p := prompts[i%len(prompts)]
		now := time.Duration(i)
		d, _ := c.Submit(now, Request{ID: uint64(i), PromptTokens: 8192, PromptKnown: true, BlockHashes: p, MaxTokens: 256})
		if d.Kind != Dispatched {
			b.Fatalf("request %d: %+v", i, d)
		}
		c.FirstByte(now, d.Ticket, d.PredictedCachedTokens)
		c.Finished(now, d.Ticket, Usage{}, p)
	}
	for i := range 4 * n {
		one(i)
	}
	b.ReportAllocs()
	i := 4 * n
	for b.Loop() {
		one(i)
		i++
	}
}

// BenchmarkShadowPick measures what a shadow policy adds to one decision,
// on its own: the shadow's pick over the candidates the router offered the
// real policy, the two estimates and the tally (shadowPick), for the
// candidates of BenchmarkCore's setup after a dispatch.
func BenchmarkShadowPick(b *testing.B) {
	for _, sh := range []string{"round_robin", "least_request", "prefix_hash", "kv_aware", "cost_model", "llmd", "dynamo", "sglang", "aibrix", "preble"} {
		for _, n := range []int{8, 64} {
			b.Run(fmt.Sprintf("%s/%d", sh, n), func(b *testing.B) {
				cfg := testConfig("cost_model")
				cfg.ShadowPolicy = sh
				c := newCore(b, cfg, n, ReplicaConfig{CapacityBlocks: 16384})
				for i := range 4 * n {
					p := hashesOf(uint64(i%32+1), 8192)
					d, _ := c.Submit(0, Request{ID: uint64(i), PromptTokens: 8192, PromptKnown: true, BlockHashes: p, MaxTokens: 256})
					if i%3 != 0 {
						c.FirstByte(0, d.Ticket, -1)
						c.Finished(0, d.Ticket, Usage{}, p)
					}
				}
				p := hashesOf(7, 8192)
				d, _ := c.Submit(0, Request{ID: 1 << 40, PromptTokens: 8192, PromptKnown: true, BlockHashes: p, MaxTokens: 256})
				if d.Kind != Dispatched || len(c.rt.Offered()) != n {
					b.Fatalf("%+v, %d offered", d, len(c.rt.Offered()))
				}
				c.rreq = router.Request{ID: 1 << 40, Model: testModel, PromptTokens: 8192, BlockHashes: p}
				e := &entry{}
				b.ReportAllocs()
				for b.Loop() {
					c.shadowPick(0, e, d.Replica)
				}
			})
		}
	}
}

// A policy that cannot explain (a wrapper) still gets the verdict right.
func TestExplainWrappedPolicy(t *testing.T) {
	c := newCore(t, testConfig("cost_model"), 2, ReplicaConfig{})
	type wrapped struct{ router.Policy }
	c.Router().SetPolicy(wrapped{c.Router().Policy()})
	ex := c.Explain(0, promptReq(1, 100, 10))
	if ex.Admission.Verdict != VerdictDispatch || ex.Winner != nil || !strings.Contains(ex.Why, "does not explain") {
		t.Fatalf("%+v: %q", ex.Admission, ex.Why)
	}
}
