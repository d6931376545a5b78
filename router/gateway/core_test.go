package gateway

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/router"
)

func submit(tb testing.TB, c *Core, now time.Duration, q Request, want Kind) Decision {
	tb.Helper()
	d, _ := c.Submit(now, q)
	return mustKind(tb, d, want)
}

func TestWeight(t *testing.T) {
	for _, tc := range []struct {
		name   string
		adm    Admission
		defMax int
		maxLen int
		req    Request
		want   int
	}{
		{"prompt and max_tokens", AdmitKV, 0, 0, promptReq(1, 100, 50), 10},          // ceil(150/16)
		{"max_tokens over the default", AdmitKV, 64, 0, promptReq(1, 100, 16), 8},    // ceil(116/16)
		{"DefaultMaxTokens", AdmitKV, 64, 0, promptReq(1, 100, 0), 11},               // ceil(164/16)
		{"MaxModelLen minus the prompt", AdmitKV, 0, 1000, promptReq(1, 100, 0), 63}, // ceil(1000/16)
		{"prompt alone", AdmitKV, 0, 0, promptReq(1, 100, 0), 7},                     // ceil(100/16)
		{"no prompt, no output", AdmitKV, 0, 0, plainReq(1, 0, 0), 1},
		{"prefill only over DefaultMaxTokens", AdmitKV, 64, 0, prefillReq(promptReq(1, 100, 50)), 7}, // ceil(100/16)
		{"prefill only under MaxModelLen", AdmitKV, 0, 1000, prefillReq(promptReq(1, 100, 0)), 7},    // ceil(100/16)
		{"prefill only, tokenflow", AdmitTokenFlow, 64, 1000, prefillReq(promptReq(1, 100, 0)), 7},   // ceil(100/16)
		{"tokenflow", AdmitTokenFlow, 0, 0, promptReq(1, 100, 50), 10},
		// n = 4: the prompt's 6 full blocks once, each sequence's tail
		// (ceil(150/16) - 6 = 4 blocks) four times.
		{"four choices", AdmitKV, 0, 0, seqReq(promptReq(1, 100, 50), 4), 6 + 4*4},
		{"four choices, tokenflow", AdmitTokenFlow, 0, 0, seqReq(promptReq(1, 100, 50), 4), 6 + 4*4},
		{"four choices without hashes", AdmitKV, 0, 0, seqReq(plainReq(1, 100, 50), 4), 6 + 4*4},
		{"four choices under MaxModelLen", AdmitKV, 0, 1000, seqReq(promptReq(1, 100, 0), 4), 6 + 4*57}, // ceil(1000/16) - 6
		{"n 0 is one", AdmitKV, 0, 0, seqReq(promptReq(1, 100, 50), 0), 10},
		{"an embedding has one sequence", AdmitKV, 64, 0, prefillReq(seqReq(promptReq(1, 100, 50), 4)), 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("round_robin")
			cfg.Admission, cfg.DefaultMaxTokens, cfg.MaxModelLen = tc.adm, tc.defMax, tc.maxLen
			c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 10000})
			d := submit(t, c, 0, tc.req, Dispatched)
			if d.Weight != tc.want || d.PredictedCachedTokens != 0 {
				t.Fatalf("weight %d (predicted %d), want %d", d.Weight, d.PredictedCachedTokens, tc.want)
			}
			if got := c.State(0, 0).ReservedBlocks; got != tc.want {
				t.Fatalf("reserved %d, want %d", got, tc.want)
			}
		})
	}
}

// The cache credit: a prompt the replica is predicted to hold costs only
// its uncached blocks, except under tokenflow; the first byte's count of
// cached tokens resizes the reservation.
func TestWeightCacheCredit(t *testing.T) {
	for _, adm := range []Admission{AdmitKV, AdmitTokenFlow} {
		t.Run(string(adm), func(t *testing.T) {
			cfg := testConfig("round_robin")
			cfg.Admission = adm
			c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 10000})
			a := submit(t, c, 0, promptReq(1, 100, 50), Dispatched)
			b := submit(t, c, 0, promptReq(1, 100, 50), Dispatched)
			// 6 full blocks held; the last token is always computed.
			if b.PredictedCachedTokens != 96 {
				t.Fatalf("predicted %d, want 96", b.PredictedCachedTokens)
			}
			want := 10 - 6
			if adm == AdmitTokenFlow {
				want = 10
			}
			if b.Weight != want {
				t.Fatalf("weight %d, want %d", b.Weight, want)
			}
			// Not known yet: unchanged.
			c.FirstByte(0, a.Ticket, -1)
			if got := c.State(0, 0).ReservedBlocks; got != 10+want {
				t.Fatalf("reserved %d after a first byte without cached tokens, want %d", got, 10+want)
			}
			// The engine found 2 blocks of b's prompt, not 6.
			c.FirstByte(0, b.Ticket, 32)
			wantB := 10 - 2
			if adm == AdmitTokenFlow {
				wantB = 10
			}
			if got := c.State(0, 0).ReservedBlocks; got != 10+wantB {
				t.Fatalf("reserved %d after reconciling, want %d", got, 10+wantB)
			}
			c.Finished(0, a.Ticket, Usage{}, nil)
			c.Finished(0, b.Ticket, Usage{}, nil)
			if got := c.State(0, 0).ReservedBlocks; got != 0 {
				t.Fatalf("reserved %d once both ended", got)
			}
		})
	}
}

// A request with no hashes (not tokenized) gets no cache credit and no
// prediction, even when its prompt is held.
func TestWeightWithoutHashes(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 1, ReplicaConfig{CapacityBlocks: 10000})
	submit(t, c, 0, promptReq(1, 100, 50), Dispatched)
	d := submit(t, c, 0, plainReq(2, 100, 50), Dispatched)
	if d.PredictedCachedTokens != 0 || d.Weight != 10 {
		t.Fatalf("%+v: want no prediction, weight 10", d)
	}
	if l := c.State(0, 0).Load; l.PendingPrefillTokens != 200 || l.PendingPromptTokens != 200 || l.InFlightPromptTokens != 200 {
		t.Fatalf("load %+v", l)
	}
}

// Once OutputMinSamples answers are known, kv admission reserves their
// quantile (at most max_tokens) for the output; tokenflow never does.
func TestWeightLearnsOutputLength(t *testing.T) {
	for _, adm := range []Admission{AdmitKV, AdmitTokenFlow} {
		t.Run(string(adm), func(t *testing.T) {
			cfg := testConfig("round_robin")
			cfg.Admission, cfg.OutputQuantile, cfg.OutputMinSamples = adm, 0.5, 4
			c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 10000})
			for i, n := range []int{20, 40, 60, 80} {
				if i == 3 {
					// Three answers: not enough yet.
					if d := submit(t, c, 0, plainReq(9, 100, 1000), Dispatched); d.Weight != 69 {
						t.Fatalf("weight %d before enough answers, want 69", d.Weight)
					} else {
						c.Abort(0, d.Ticket)
					}
				}
				d := submit(t, c, 0, plainReq(uint64(i), 10, 1000), Dispatched)
				c.Finished(0, d.Ticket, Usage{Known: true, PromptTokens: 10, CompletionTokens: n}, nil)
			}
			// Unknown usage teaches nothing.
			d := submit(t, c, 0, plainReq(8, 10, 1000), Dispatched)
			c.Finished(0, d.Ticket, Usage{CompletionTokens: 5000}, nil)
			want := 69 // ceil((100+1000)/16)
			if adm == AdmitKV {
				want = 10 // ceil((100+60)/16): the median of 20, 40, 60, 80 as served
			}
			if d := submit(t, c, 0, plainReq(10, 100, 1000), Dispatched); d.Weight != want {
				t.Fatalf("weight %d after four answers, want %d", d.Weight, want)
			}
			// Never more than the request's own max_tokens.
			if d := submit(t, c, 0, plainReq(11, 100, 16), Dispatched); d.Weight != 8 {
				t.Fatalf("weight %d with max_tokens 16, want 8", d.Weight)
			}
		})
	}
}

// A request of n choices: the cache credit counts the shared prompt
// once, an answer teaches one sequence's length (its completion tokens are
// the sum over its choices), and a replica without room for every
// sequence's tail is not given it.
func TestWeightChoices(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Admission, cfg.OutputQuantile, cfg.OutputMinSamples = AdmitKV, 0.5, 4
	c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 10000})
	a := submit(t, c, 0, promptReq(1, 100, 50), Dispatched)
	b := submit(t, c, 0, seqReq(promptReq(1, 100, 50), 3), Dispatched)
	if b.PredictedCachedTokens != 96 || b.Weight != 3*4 {
		t.Fatalf("n 3 on a held prompt: predicted %d, weight %d; want 96, 12 (three tails, no prompt)", b.PredictedCachedTokens, b.Weight)
	}
	c.Abort(0, a.Ticket)
	c.Abort(0, b.Ticket)
	for i, n := range []int{20, 40, 60, 80} {
		d := submit(t, c, 0, seqReq(plainReq(uint64(10+i), 10, 1000), 4), Dispatched)
		c.Finished(0, d.Ticket, Usage{Known: true, PromptTokens: 10, CompletionTokens: 4 * n}, nil)
	}
	if d := submit(t, c, 0, plainReq(20, 100, 1000), Dispatched); d.Weight != 10 { // ceil((100+60)/16)
		t.Fatalf("weight %d after four answers of four choices, want 10 (a sequence's median, 60)", d.Weight)
	}

	// A replica of 30 blocks holding one of 10: n 3 (6 + 3 tails of 4,
	// 18 blocks) fits, n 4 (22) does not.
	small := newCore(t, testConfig("round_robin"), 1, ReplicaConfig{CapacityBlocks: 30})
	first := submit(t, small, 0, plainReq(1, 100, 50), Dispatched)
	d, _ := small.Submit(0, seqReq(plainReq(2, 100, 50), 4))
	if d.Kind == Dispatched {
		t.Fatalf("n 4 (22 blocks) dispatched beside 10 on a replica of 30: %+v", d)
	}
	small.Abort(0, d.Ticket)
	submit(t, small, 0, seqReq(plainReq(3, 100, 50), 3), Dispatched)
	small.Abort(0, first.Ticket)
}

// An embedding's answer (prefill only, no output) teaches nothing of the
// answers' lengths: the generations' reservations stay as they were.
func TestPrefillOnlyTeachesNoOutputLength(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Admission, cfg.OutputQuantile, cfg.OutputMinSamples = AdmitKV, 0.5, 2
	c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 10000})
	for i := range 4 {
		d := submit(t, c, 0, prefillReq(plainReq(uint64(i), 100, 0)), Dispatched)
		c.Finished(0, d.Ticket, Usage{Known: true, PromptTokens: 100, CompletionTokens: 0}, nil)
	}
	if d := submit(t, c, 0, plainReq(9, 100, 1000), Dispatched); d.Weight != 69 { // ceil((100+1000)/16)
		t.Fatalf("weight %d after four embeddings, want 69 (nothing learned)", d.Weight)
	}
}

// A request with no bound on its output (no max_tokens, DefaultMaxTokens or
// MaxModelLen) reserves nothing for it until answers are known, then their
// quantile.
func TestWeightWithoutAnyOutputBound(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.OutputQuantile, cfg.OutputMinSamples = 0.5, 4
	cfg.DefaultMaxTokens, cfg.MaxModelLen = 0, 0
	c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 10000})
	if d := submit(t, c, 0, plainReq(1, 100, 0), Dispatched); d.Weight != 7 {
		t.Fatalf("weight %d before any answer, want 7 (the prompt alone)", d.Weight)
	} else {
		c.Abort(0, d.Ticket)
	}
	for i, n := range []int{20, 40, 60, 80} {
		d := submit(t, c, 0, plainReq(uint64(10+i), 10, 1000), Dispatched)
		c.Finished(0, d.Ticket, Usage{Known: true, PromptTokens: 10, CompletionTokens: n}, nil)
	}
	if d := submit(t, c, 0, plainReq(2, 100, 0), Dispatched); d.Weight != 10 {
		t.Fatalf("weight %d after four answers, want 10 (ceil((100+60)/16))", d.Weight)
	}
}

// A reservation reconciled at the first byte keeps the output it was
// admitted with, even when the output estimate has moved since.
func TestReconcileKeepsAdmittedOutput(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.OutputQuantile, cfg.OutputMinSamples = 1, 1
	c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 1000})
	d := submit(t, c, 0, plainReq(1, 160, 1000), Dispatched)
	c.Finished(0, d.Ticket, Usage{Known: true, CompletionTokens: 16}, nil)
	a := submit(t, c, 0, plainReq(2, 160, 1000), Dispatched)
	if a.Weight != 11 {
		t.Fatalf("weight %d, want 11 (160 prompt + 16 learned)", a.Weight)
	}
	for i := range 16 { // the estimate grows to 1000
		x := submit(t, c, 0, plainReq(uint64(10+i), 16, 1000), Dispatched)
		c.Finished(0, x.Ticket, Usage{Known: true, CompletionTokens: 1000}, nil)
	}
	c.FirstByte(0, a.Ticket, 0)
	if got := c.State(0, 0).ReservedBlocks; got != 11 {
		t.Fatalf("reservation %d after a first byte that found what was predicted, want 11", got)
	}
}

// The empty-replica rule: a request larger than a replica's whole capacity
// still goes to an empty replica; nothing joins it until it ends.
func TestEmptyReplicaTakesAnyRequest(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 1, ReplicaConfig{CapacityBlocks: 10})
	big := submit(t, c, 0, plainReq(1, 1000, 0), Dispatched)
	if big.Weight != 63 || c.State(0, 0).ReservedBlocks != 63 {
		t.Fatalf("%+v, reserved %d", big, c.State(0, 0).ReservedBlocks)
	}
	small := submit(t, c, 0, plainReq(2, 10, 0), Queued)
	ds := c.Finished(time.Second, big.Ticket, Usage{}, nil)
	if len(ds) != 1 || ds[0].Kind != Dispatched || ds[0].Ticket != small.Ticket || ds[0].Queued != time.Second {
		t.Fatalf("after the big request ended: %+v", ds)
	}
}

// kv admission: a replica takes requests while its reservations fit its
// capacity times Overcommit.
func TestKVAdmissionCapacity(t *testing.T) {
	for _, tc := range []struct {
		over  float64
		admit int
	}{{1, 10}, {0.5, 5}, {1.5, 15}} {
		cfg := testConfig("round_robin")
		cfg.Overcommit = tc.over
		c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 100})
		n := 0
		for i := range 20 {
			if d, _ := c.Submit(0, plainReq(uint64(i), 160, 0)); d.Kind == Dispatched { // 10 blocks each
				n++
			}
		}
		if n != tc.admit || c.Queued() != 20-tc.admit {
			t.Errorf("overcommit %v: %d dispatched, %d queued; want %d dispatched", tc.over, n, c.Queued(), tc.admit)
		}
	}
}

// Unknown capacity: kv admission does not limit the replica.
func TestKVAdmissionUnknownCapacity(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 1, ReplicaConfig{})
	for i := range 50 {
		submit(t, c, 0, plainReq(uint64(i), 1600, 0), Dispatched)
	}
	// A reported capacity limits it from then on.
	c.Report(0, 0, Report{NumGPUBlocks: 100})
	submit(t, c, 0, plainReq(99, 16, 0), Queued)
	if s := c.State(0, 0); s.CapacityBlocks != 100 {
		t.Fatalf("capacity %d, want the reported 100", s.CapacityBlocks)
	}
	// A configured capacity wins over the report.
	c2 := newCore(t, testConfig("round_robin"), 1, ReplicaConfig{CapacityBlocks: 300})
	c2.Report(0, 0, Report{NumGPUBlocks: 100})
	if s := c2.State(0, 0); s.CapacityBlocks != 300 {
		t.Fatalf("capacity %d, want the configured 300", s.CapacityBlocks)
	}
	// And Config.DefaultCapacityBlocks stands in for both.
	cfg := testConfig("round_robin")
	cfg.DefaultCapacityBlocks = 50
	c3 := newCore(t, cfg, 1, ReplicaConfig{})
	if s := c3.State(0, 0); s.CapacityBlocks != 50 || c3.Router().Index().Capacity(0) != 50 {
		t.Fatalf("capacity %d (index %d), want the default 50", s.CapacityBlocks, c3.Router().Index().Capacity(0))
	}
}

// The engine's scraped KV usage corrects the reservations: a fresh report of
// high usage blocks admission, a report older than MaxAge is ignored.
func TestScrapedUsageCorrection(t *testing.T) {
	setup := func() *Core {
		cfg := testConfig("round_robin")
		cfg.MaxAge = 500 * time.Millisecond
		c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 100})
		submit(t, c, 0, plainReq(1, 160, 0), Dispatched) // 10 blocks
		return c
	}
	// Control: without a report the next 10 blocks fit.
	c := setup()
	submit(t, c, 100*time.Millisecond, plainReq(2, 160, 0), Dispatched)

	// Fresh: 95 of 100 blocks used (other gateways' requests) + 10 > 100.
	c = setup()
	c.Report(0, 0, Report{KVUsage: 0.95})
	q := submit(t, c, 100*time.Millisecond, plainReq(2, 160, 0), Queued)
	if s := c.State(100*time.Millisecond, 0); !s.Load.Engine.Valid || s.Load.Engine.KVCacheUsage != 0.95 || s.ReportAge != 100*time.Millisecond {
		t.Fatalf("state %+v", s)
	}
	// A new report of lower usage admits it.
	ds := c.Report(200*time.Millisecond, 0, Report{KVUsage: 0.5})
	if len(ds) != 1 || ds[0].Ticket != q.Ticket || ds[0].Kind != Dispatched {
		t.Fatalf("report of lower usage: %+v", ds)
	}

	// Stale: the same report, older than MaxAge, counts as missing.
	c = setup()
	c.Report(0, 0, Report{KVUsage: 0.95})
	submit(t, c, time.Second, plainReq(2, 160, 0), Dispatched)
	if s := c.State(time.Second, 0); s.Load.Engine.Valid || s.ReportAge != time.Second {
		t.Fatalf("stale report still valid: %+v", s)
	}

	// The usage never overrides the empty-replica rule.
	cfg := testConfig("round_robin")
	c = newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 100})
	c.Report(0, 0, Report{KVUsage: 1})
	submit(t, c, 0, plainReq(1, 160, 0), Dispatched)
}

// ContextLen, the length the engines report, rejects as MaxModelLen does
// (which wins when both are set) but leaves a request without max_tokens
// weighed as with no length at all: its prompt, not the whole context.
func TestContextLen(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.ContextLen = 100
	c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 10000})
	submit(t, c, 0, plainReq(1, 90, 20), Rejected)
	if d := submit(t, c, 0, promptReq(2, 50, 0), Dispatched); d.Weight != 4 { // ceil(50/16), not ceil(100/16)
		t.Fatalf("weight %d, want 4", d.Weight)
	}
	if ex := c.Explain(0, plainReq(3, 90, 20)); ex.Admission.Reason != ReasonTooLong || !strings.Contains(ex.Why, "max_model_len 100") {
		t.Fatalf("explained: %+v %s", ex.Admission, ex.Why)
	}
	cfg.MaxModelLen = 200
	c = newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 10000})
	submit(t, c, 0, plainReq(1, 150, 20), Dispatched)
	submit(t, c, 0, plainReq(2, 190, 20), Rejected)
	cfg.MaxModelLen, cfg.ContextLen = 0, -1
	if err := cfg.Validate(); err == nil {
		t.Fatal("a negative context length validated")
	}
}

func TestTooLong(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.MaxModelLen = 100
	c := newCore(t, cfg, 1, ReplicaConfig{})
	for _, tc := range []struct {
		req  Request
		want Kind
	}{
		{plainReq(1, 90, 20), Rejected},
		{plainReq(2, 100, 0), Rejected}, // the engine generates at least one token
		{plainReq(3, 90, 10), Dispatched},
		{plainReq(4, 99, 0), Dispatched},
		{Request{ID: 5, PromptTokens: 500}, Dispatched},                                       // an estimate: not checked
		{Request{ID: 6, PromptTokens: 100, PromptKnown: true, PrefillOnly: true}, Dispatched}, // an embedding generates nothing
		{Request{ID: 7, PromptTokens: 101, PromptKnown: true, PrefillOnly: true}, Rejected},
	} {
		d, others := c.Submit(0, tc.req)
		if d.Kind != tc.want || len(others) != 0 {
			t.Fatalf("%+v: %+v %v", tc.req, d, others)
		}
		if d.Kind == Rejected && (d.Status != http.StatusBadRequest || d.Reason != ReasonTooLong || d.Ticket != 0 || d.ID != tc.req.ID || d.RetryAfter != 0) {
			t.Fatalf("%+v: %+v", tc.req, d)
		}
	}
	if s := c.State(0, 0); s.Load.InFlight != 4 {
		t.Fatalf("in flight %d", s.Load.InFlight)
	}
}

func TestQueueFull(t *testing.T) {
	t.Run("requests", func(t *testing.T) {
		cfg := testConfig("round_robin")
		cfg.Queue.MaxRequests = 2
		c := newCore(t, cfg, 1, ReplicaConfig{MaxInFlight: 1})
		submit(t, c, 0, plainReq(1, 10, 0), Dispatched)
		submit(t, c, 0, plainReq(2, 10, 0), Queued)
		submit(t, c, 0, plainReq(3, 10, 0), Queued)
		d := submit(t, c, 0, plainReq(4, 10, 0), Rejected)
		if d.Status != http.StatusTooManyRequests || d.Reason != ReasonQueueFull || d.RetryAfter < time.Second {
			t.Fatalf("%+v", d)
		}
		if c.Queued() != 2 {
			t.Fatalf("queued %d", c.Queued())
		}
	})
	t.Run("bytes", func(t *testing.T) {
		cfg := testConfig("round_robin")
		cfg.Queue.MaxBytes = 100
		c := newCore(t, cfg, 1, ReplicaConfig{MaxInFlight: 1})
		big := func(id uint64, n int64) Request { q := plainReq(id, 10, 0); q.Bytes = n; return q }
		submit(t, c, 0, big(1, 60), Dispatched) // a dispatched request's bytes do not count
		a := submit(t, c, 0, big(2, 60), Queued)
		d := submit(t, c, 0, big(3, 60), Rejected)
		if d.Status != http.StatusTooManyRequests || d.Reason != ReasonQueueFull {
			t.Fatalf("%+v", d)
		}
		submit(t, c, 0, big(4, 40), Queued) // exactly 100
		if c.QueuedBytes() != 100 {
			t.Fatalf("queued bytes %d", c.QueuedBytes())
		}
		c.Abort(0, a.Ticket)
		if c.QueuedBytes() != 40 {
			t.Fatalf("queued bytes %d after an abort", c.QueuedBytes())
		}
		submit(t, c, 0, big(5, 60), Queued)
	})
}

func TestNoQueue(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 1, ReplicaConfig{MaxInFlight: 1})
	q := plainReq(1, 10, 0)
	q.NoQueue = true
	submit(t, c, 0, q, Dispatched) // room: NoQueue changes nothing
	q.ID = 2
	d := submit(t, c, 0, q, Rejected)
	if d.Status != http.StatusTooManyRequests || d.Reason != ReasonNoCapacity || d.RetryAfter < time.Second {
		t.Fatalf("%+v", d)
	}
	if c.Queued() != 0 {
		t.Fatal("queued")
	}
	// MaxRequests 0 disables queueing for every request.
	cfg := testConfig("round_robin")
	cfg.Queue.MaxRequests = 0
	c = newCore(t, cfg, 1, ReplicaConfig{MaxInFlight: 1})
	submit(t, c, 0, plainReq(1, 10, 0), Dispatched)
	if d := submit(t, c, 0, plainReq(2, 10, 0), Rejected); d.Reason != ReasonNoCapacity || d.Status != http.StatusTooManyRequests {
		t.Fatalf("%+v", d)
	}
}

// drainAtOnePerSecond queues four requests behind a busy replica and serves
// two of them a second apart: the measured drain rate is 1/s, two wait.
func drainAtOnePerSecond(t *testing.T, cfg Config) *Core {
	t.Helper()
	c := newCore(t, cfg, 1, ReplicaConfig{MaxInFlight: 1})
	cur := submit(t, c, 0, plainReq(1, 10, 0), Dispatched).Ticket
	for id := uint64(2); id <= 5; id++ {
		submit(t, c, 0, plainReq(id, 10, 0), Queued)
	}
	for _, at := range []time.Duration{time.Second, 2 * time.Second} {
		ds := c.Finished(at, cur, Usage{}, nil)
		if len(ds) != 1 || ds[0].Kind != Dispatched {
			t.Fatalf("%+v", ds)
		}
		cur = ds[0].Ticket
	}
	if c.Queued() != 2 {
		t.Fatalf("queued %d", c.Queued())
	}
	return c
}

func TestShedOnSLO(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Queue.ShedOnSLO = true
	c := drainAtOnePerSecond(t, cfg)
	now := 2 * time.Second
	withTimeout := func(id uint64, timeout time.Duration, prio int) Request {
		q := plainReq(id, 10, 0)
		q.Timeout, q.Priority = timeout, prio
		return q
	}
	// Two ahead at 1/s: about 3s to wait.
	d := submit(t, c, now, withTimeout(10, 2*time.Second, 0), Rejected)
	if d.Status != http.StatusTooManyRequests || d.Reason != ReasonSLOShed || d.RetryAfter != 3*time.Second {
		t.Fatalf("%+v: want 429 slo_shed, retry after 3s", d)
	}
	submit(t, c, now, withTimeout(11, 5*time.Second, 0), Queued)
	// Now three ahead: 4s > 3s.
	submit(t, c, now, withTimeout(12, 3*time.Second, 0), Rejected)
	// A higher class waits behind nothing: 1s < 2s.
	submit(t, c, now, withTimeout(13, 2*time.Second, 5), Queued)

	// Without ShedOnSLO the same request waits.
	cfg.Queue.ShedOnSLO = false
	c = drainAtOnePerSecond(t, cfg)
	submit(t, c, now, withTimeout(10, 2*time.Second, 0), Queued)

	// Without a measured rate nothing is shed.
	cfg.Queue.ShedOnSLO = true
	c = newCore(t, cfg, 1, ReplicaConfig{MaxInFlight: 1})
	submit(t, c, 0, plainReq(1, 10, 0), Dispatched)
	for id := uint64(2); id < 10; id++ {
		submit(t, c, 0, withTimeout(id, time.Millisecond, 0), Queued)
	}
}

func TestRetryAfter(t *testing.T) {
	// No measured rate: 1s.
	cfg := testConfig("round_robin")
	cfg.Queue.MaxRequests = 2
	c := newCore(t, cfg, 1, ReplicaConfig{MaxInFlight: 1})
	submit(t, c, 0, plainReq(1, 10, 0), Dispatched)
	submit(t, c, 0, plainReq(2, 10, 0), Queued)
	submit(t, c, 0, plainReq(3, 10, 0), Queued)
	if d := submit(t, c, 0, plainReq(4, 10, 0), Rejected); d.RetryAfter != time.Second {
		t.Fatalf("%+v: want retry after 1s", d)
	}
	// 1/s with two ahead: 3s; capped at the queue timeout.
	for _, tc := range []struct {
		timeout time.Duration
		want    time.Duration
	}{{30 * time.Second, 3 * time.Second}, {2 * time.Second, 2 * time.Second}, {500 * time.Millisecond, time.Second}} {
		cfg := testConfig("round_robin")
		cfg.Queue.Timeout = tc.timeout
		c := drainAtOnePerSecond(t, cfg)
		q := plainReq(9, 10, 0)
		q.NoQueue = true
		d := submit(t, c, 2*time.Second, q, Rejected)
		if d.Reason != ReasonNoCapacity || d.RetryAfter != tc.want {
			t.Errorf("timeout %v: %+v, want retry after %v", tc.timeout, d, tc.want)
		}
	}
}

func TestRetry(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 3, ReplicaConfig{})
	d := submit(t, c, 0, promptReq(1, 100, 10), Dispatched)
	seen := map[int]bool{d.Replica: true}
	for range 2 {
		nd, others := c.Retry(0, d.Ticket, false)
		if nd.Kind != Dispatched || nd.Ticket != d.Ticket || seen[nd.Replica] || len(others) != 0 {
			t.Fatalf("retry: %+v %v (tried %v)", nd, others, seen)
		}
		seen[nd.Replica] = true
		// Only the current attempt counts.
		for i := range 3 {
			want := 0
			if i == nd.Replica {
				want = 1
			}
			if s := c.State(0, i); s.Load.InFlight != want || s.Load.Pending != want {
				t.Fatalf("replica %d: %+v", i, s.Load)
			}
		}
		d = nd
	}
	nd, _ := c.Retry(0, d.Ticket, false)
	if nd.Kind != Rejected || nd.Status != http.StatusBadGateway || nd.Reason != ReasonNoReplica {
		t.Fatalf("every replica tried: %+v", nd)
	}
	for i := range 3 {
		if s := c.State(0, i); s.Load != (router.Load{}) || s.ReservedBlocks != 0 {
			t.Fatalf("replica %d after the request ended: %+v, %d reserved", i, s.Load, s.ReservedBlocks)
		}
	}
	// The ticket is gone.
	if ds := c.Finished(0, d.Ticket, Usage{}, nil); len(ds) != 0 {
		t.Fatal(ds)
	}
	// A failed attempt before its first byte leaves nothing in the index.
	if n := c.Router().Index().Blocks(0) + c.Router().Index().Blocks(1) + c.Router().Index().Blocks(2); n != 0 {
		t.Fatalf("%d blocks indexed after every attempt failed", n)
	}
}

// A retried request that cannot be dispatched waits at the head of its line.
func TestRetryQueuesAtTheHead(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 2, ReplicaConfig{MaxInFlight: 1})
	a := submit(t, c, 0, plainReq(1, 10, 0), Dispatched)
	b := submit(t, c, 0, plainReq(2, 10, 0), Dispatched)
	cq := submit(t, c, 0, plainReq(3, 10, 0), Queued)
	ra, _ := c.Retry(time.Second, a.Ticket, true)
	if ra.Kind != Queued || ra.Ticket != a.Ticket || c.Queued() != 2 {
		t.Fatalf("retry with the other replica busy: %+v, %d queued", ra, c.Queued())
	}
	// The retried request heads the line: c waits behind it although a's
	// replica is free (a may not go back there).
	if s := c.State(time.Second, a.Replica); s.Load.InFlight != 0 {
		t.Fatalf("%+v", s.Load)
	}
	ds := c.Finished(2*time.Second, b.Ticket, Usage{}, nil)
	if len(ds) != 2 || ds[0].Ticket != a.Ticket || ds[0].Replica != b.Replica || ds[0].Queued != 2*time.Second ||
		ds[1].Ticket != cq.Ticket || ds[1].Replica != a.Replica {
		t.Fatalf("b's replica freed: %+v, want the retried request there, then c on a's", ds)
	}
}

func TestEjection(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Health = Health{EjectAfter: 2, EjectTime: time.Second, MaxEjectTime: 4 * time.Second, MaxEjectedShare: 0.5}
	c := newCore(t, cfg, 4, ReplicaConfig{})
	// Exponential backoff, capped.
	for _, tc := range []struct{ at, until time.Duration }{
		{0, time.Second}, {2 * time.Second, 4 * time.Second}, {5 * time.Second, 9 * time.Second}, {10 * time.Second, 14 * time.Second}, {20 * time.Second, 24 * time.Second},
	} {
		if c.Failure(tc.at, 0) {
			t.Fatalf("at %v: ejected after one failure", tc.at)
		}
		if !c.Failure(tc.at, 0) {
			t.Fatalf("at %v: not ejected after two", tc.at)
		}
		s := c.State(tc.at, 0)
		if s.EjectedUntil != tc.until || !s.EjectedNow || s.Healthy || s.Failures != 0 {
			t.Fatalf("at %v: %+v, want ejected until %v", tc.at, s, tc.until)
		}
		// Failures while ejected do not extend it.
		c.Failure(tc.at, 0)
		c.Failure(tc.at, 0)
		if s := c.State(tc.at, 0); s.EjectedUntil != tc.until {
			t.Fatalf("ejection extended to %v", s.EjectedUntil)
		}
		// No request goes there meanwhile.
		for i := range 8 {
			if d := submit(t, c, tc.at, plainReq(uint64(i), 10, 0), Dispatched); d.Replica == 0 {
				t.Fatalf("dispatched to an ejected replica: %+v", d)
			} else {
				c.Finished(tc.at, d.Ticket, Usage{}, nil)
			}
		}
		// (The failures counted during the ejection would carry over:
		// reset them.)
		c.Success(0)
		if s := c.State(tc.until, 0); !s.Healthy || s.EjectedNow {
			t.Fatalf("after the ejection: %+v", s)
		}
	}
	if s := c.State(30*time.Second, 0); s.Ejections != 5 {
		t.Fatalf("%d ejections", s.Ejections)
	}
	// At most MaxEjectedShare of the replicas: 2 of 4.
	now := 21 * time.Second // replica 0 is ejected until 24s
	c.Failure(now, 1)
	if !c.Failure(now, 1) {
		t.Fatal("second replica not ejected")
	}
	c.Failure(now, 2)
	if c.Failure(now, 2) || !c.State(now, 2).Healthy {
		t.Fatal("a third of four replicas ejected")
	}
	// Success resets the consecutive failures.
	c.Failure(now, 3)
	c.Success(3)
	if c.Failure(now, 3) {
		t.Fatal("ejected after one failure since a success")
	}
}

// Faulty request failures count toward ejection; others do not.
func TestEjectionByRequests(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Health = Health{EjectAfter: 1, EjectTime: time.Second, MaxEjectTime: time.Second, MaxEjectedShare: 1}
	c := newCore(t, cfg, 2, ReplicaConfig{})
	d := submit(t, c, 0, plainReq(1, 10, 0), Dispatched)
	c.Fail(0, d.Ticket, false)
	if !c.State(0, d.Replica).Healthy {
		t.Fatal("a failure that was not the replica's fault ejected it")
	}
	d = submit(t, c, 0, plainReq(2, 10, 0), Dispatched)
	c.FirstByte(0, d.Ticket, 0)
	c.Fail(0, d.Ticket, true)
	if c.State(0, d.Replica).Healthy {
		t.Fatal("a faulty failure after the first byte did not count")
	}
	other := 1 - d.Replica
	d = submit(t, c, 0, plainReq(3, 10, 0), Dispatched)
	if d.Replica != other {
		t.Fatalf("%+v", d)
	}
	nd, _ := c.Retry(0, d.Ticket, true)
	if c.State(0, other).Healthy {
		t.Fatal("a faulty retry did not count")
	}
	// Both ejected now: the retry has nowhere to go.
	if nd.Kind != Rejected || nd.Status != http.StatusBadGateway {
		t.Fatalf("%+v", nd)
	}
	// And a new request gets 503.
	d = submit(t, c, 0, plainReq(4, 10, 0), Rejected)
	if d.Status != http.StatusServiceUnavailable || d.Reason != ReasonNoReplica || d.RetryAfter < time.Second {
		t.Fatalf("%+v", d)
	}
	// Back after the ejection.
	submit(t, c, time.Second, plainReq(5, 10, 0), Dispatched)
}

// While requests wait, NextDeadline includes the end of an ejection, and
// Advance then dispatches to the replica.
func TestEjectionEndDrains(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Health = Health{EjectAfter: 1, EjectTime: time.Second, MaxEjectTime: time.Second, MaxEjectedShare: 0.5}
	c := newCore(t, cfg, 2, ReplicaConfig{MaxInFlight: 1})
	if !c.Failure(0, 0) {
		t.Fatal("not ejected")
	}
	if _, ok := c.NextDeadline(0); ok {
		t.Fatal("a deadline with nothing queued")
	}
	if d := submit(t, c, 0, plainReq(1, 10, 0), Dispatched); d.Replica != 1 {
		t.Fatalf("%+v", d)
	}
	b := submit(t, c, 500*time.Millisecond, plainReq(2, 10, 0), Queued)
	if at, ok := c.NextDeadline(500 * time.Millisecond); !ok || at != time.Second {
		t.Fatalf("NextDeadline = %v, %v; want the ejection's end, 1s", at, ok)
	}
	if ds := c.Advance(999 * time.Millisecond); len(ds) != 0 {
		t.Fatal(ds)
	}
	ds := c.Advance(time.Second)
	if len(ds) != 1 || ds[0].Ticket != b.Ticket || ds[0].Replica != 0 {
		t.Fatalf("%+v", ds)
	}
}

func TestQueueTimeout(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Queue.Timeout = 2 * time.Second
	cfg.Health = Health{EjectAfter: 1, EjectTime: 10 * time.Second, MaxEjectTime: 10 * time.Second, MaxEjectedShare: 1}
	c := newCore(t, cfg, 1, ReplicaConfig{MaxInFlight: 1})
	submit(t, c, 0, plainReq(1, 10, 0), Dispatched)
	a := submit(t, c, 0, plainReq(2, 10, 0), Queued)
	q := plainReq(3, 10, 0)
	q.Timeout = time.Second // shortens the queue's
	b := submit(t, c, 0, q, Queued)
	q = plainReq(4, 10, 0)
	q.Timeout = time.Hour // never lengthens it
	cq := submit(t, c, 500*time.Millisecond, q, Queued)
	if at, ok := c.NextDeadline(0); !ok || at != time.Second {
		t.Fatalf("NextDeadline = %v, %v", at, ok)
	}
	if ds := c.Advance(999 * time.Millisecond); len(ds) != 0 {
		t.Fatal(ds)
	}
	ds := c.Advance(time.Second)
	if len(ds) != 1 || ds[0].Ticket != b.Ticket || ds[0].Kind != Rejected || ds[0].Status != http.StatusTooManyRequests || ds[0].Reason != ReasonQueueTimeout || ds[0].Queued != time.Second {
		t.Fatalf("%+v", ds)
	}
	if at, ok := c.NextDeadline(time.Second); !ok || at != 2*time.Second {
		t.Fatalf("NextDeadline = %v, %v", at, ok)
	}
	// No replica healthy: 503.
	c.Failure(time.Second, 0)
	ds = c.Advance(5 * time.Second)
	if len(ds) != 2 || ds[0].Ticket != a.Ticket || ds[1].Ticket != cq.Ticket {
		t.Fatalf("%+v", ds)
	}
	for _, d := range ds {
		if d.Status != http.StatusServiceUnavailable || d.Reason != ReasonQueueTimeout || d.RetryAfter < time.Second || d.RetryAfter > 2*time.Second {
			t.Fatalf("%+v", d)
		}
	}
	if c.Queued() != 0 || c.QueuedBytes() != 0 {
		t.Fatal("still queued")
	}
	if _, ok := c.NextDeadline(5 * time.Second); ok {
		t.Fatal("a deadline with nothing queued")
	}
}

// Deadlines are kept behind a head that cannot be admitted, and an aborted
// request's deadline is skipped.
func TestNextDeadlineSkipsEnded(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 1, ReplicaConfig{MaxInFlight: 1})
	submit(t, c, 0, plainReq(1, 10, 0), Dispatched)
	var ts []Ticket
	for i := range 3 {
		q := plainReq(uint64(10+i), 10, 0)
		q.Timeout = time.Duration(i+1) * time.Second
		ts = append(ts, submit(t, c, 0, q, Queued).Ticket)
	}
	c.Abort(0, ts[0])
	if at, ok := c.NextDeadline(0); !ok || at != 2*time.Second {
		t.Fatalf("NextDeadline = %v, %v", at, ok)
	}
	ds := c.Advance(10 * time.Second)
	if len(ds) != 2 || ds[0].Ticket != ts[1] || ds[1].Ticket != ts[2] {
		t.Fatalf("%+v", ds)
	}
}

// Aborting the head of the line that blocked it lets the next request in.
func TestAbortQueuedHeadDrains(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 1, ReplicaConfig{CapacityBlocks: 100})
	submit(t, c, 0, plainReq(1, 960, 0), Dispatched)      // 60 blocks
	big := submit(t, c, 0, plainReq(2, 960, 0), Queued)   // 60 more do not fit
	small := submit(t, c, 0, plainReq(3, 160, 0), Queued) // 10 would, but waits its turn
	ds := c.Abort(time.Second, big.Ticket)
	if len(ds) != 1 || ds[0].Ticket != small.Ticket || ds[0].Kind != Dispatched {
		t.Fatalf("after aborting the blocking head: %+v", ds)
	}
}

// A first byte frees a pending slot even without the cached count.
func TestFirstByteFreesPending(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 1, ReplicaConfig{MaxPending: 1})
	a := submit(t, c, 0, plainReq(1, 10, 0), Dispatched)
	b := submit(t, c, 0, plainReq(2, 10, 0), Queued)
	ds := c.FirstByte(time.Second, a.Ticket, -1)
	if len(ds) != 1 || ds[0].Ticket != b.Ticket {
		t.Fatalf("%+v", ds)
	}
	if l := c.State(time.Second, 0).Load; l.InFlight != 2 || l.Pending != 1 {
		t.Fatalf("%+v", l)
	}
}

// Priorities are capped at MaxPriority and negative ones count as 0.
func TestPriorityCap(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Queue.MaxPriority = 2
	c := newCore(t, cfg, 1, ReplicaConfig{MaxInFlight: 1})
	cur := submit(t, c, 0, plainReq(1, 10, 0), Dispatched).Ticket
	for _, x := range []struct {
		id   uint64
		prio int
	}{{10, -3}, {11, 0}, {12, 2}, {13, 5}, {14, 1}} {
		q := plainReq(x.id, 10, 0)
		q.Priority = x.prio
		submit(t, c, 0, q, Queued)
	}
	// 12 and 13 share class 2 (FIFO), then 14, then 10 and 11 in class 0.
	var order []uint64
	for c.Queued() > 0 {
		ds := c.Finished(time.Second, cur, Usage{}, nil)
		if len(ds) != 1 {
			t.Fatalf("%+v", ds)
		}
		order = append(order, ds[0].ID)
		cur = ds[0].Ticket
	}
	if want := []uint64{12, 13, 14, 10, 11}; !equalIDs(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
}

func equalIDs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Calls naming a ticket that ended, or never was, change nothing.
func TestStaleTickets(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 1, ReplicaConfig{MaxInFlight: 1})
	a := submit(t, c, 0, plainReq(1, 10, 0), Dispatched)
	q := submit(t, c, 0, plainReq(2, 10, 0), Queued)
	c.Finished(0, a.Ticket, Usage{}, nil) // dispatches q
	for _, tk := range []Ticket{a.Ticket, 0, Ticket(1<<40 | 7), q.Ticket + 1<<32} {
		if ds := c.Finished(0, tk, Usage{}, nil); len(ds) != 0 {
			t.Fatal(ds)
		}
		if ds := c.FirstByte(0, tk, 0); len(ds) != 0 {
			t.Fatal(ds)
		}
		if ds := c.Fail(0, tk, true); len(ds) != 0 {
			t.Fatal(ds)
		}
		if ds := c.Abort(0, tk); len(ds) != 0 {
			t.Fatal(ds)
		}
		if d, ds := c.Retry(0, tk, true); d.Kind != Rejected || len(ds) != 0 {
			t.Fatal(d, ds)
		}
	}
	s := c.State(0, 0)
	if s.Load.InFlight != 1 || s.Load.Pending != 1 || s.Failures != 0 {
		t.Fatalf("%+v", s)
	}
	// A new request reusing a's slot gets a new ticket.
	c.Finished(0, q.Ticket, Usage{}, nil)
	b := submit(t, c, 0, plainReq(3, 10, 0), Dispatched)
	if b.Ticket == a.Ticket || b.Ticket == q.Ticket {
		t.Fatalf("ticket %v reused", b.Ticket)
	}
	for _, old := range []Ticket{a.Ticket, q.Ticket} {
		if ds := c.Finished(0, old, Usage{}, nil); len(ds) != 0 || c.State(0, 0).Load.InFlight != 1 {
			t.Fatal("an old ticket ended the request in its slot")
		}
	}
}

func TestRestartDetection(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 2, ReplicaConfig{})
	idx := c.Router().Index()
	// fill has each replica hold some prompts.
	fill := func() {
		t.Helper()
		for i := range 4 {
			d := submit(t, c, 0, promptReq(uint64(100+i), 320, 0), Dispatched)
			c.Finished(0, d.Ticket, Usage{}, hashesOf(uint64(100+i), 320))
		}
		if idx.Blocks(0) < 20 || idx.Blocks(1) < 20 {
			t.Fatalf("blocks %d, %d; want 20 or more each", idx.Blocks(0), idx.Blocks(1))
		}
	}
	fill()
	held := idx.Blocks(0)
	c.Report(0, 0, Report{PrefixQueries: 100, PrefixHits: 50, Preemptions: 1})
	c.Report(0, 0, Report{PrefixQueries: 120, PrefixHits: 50, Preemptions: 1})
	if idx.Blocks(0) != held || c.State(0, 0).Restarts != 0 {
		t.Fatal("counters going forward cleared the index")
	}
	for i, rep := range []Report{
		{PrefixQueries: 10, PrefixHits: 50, Preemptions: 1},
		{PrefixQueries: 10, PrefixHits: 5, Preemptions: 1},
		{PrefixQueries: 10, PrefixHits: 5, Preemptions: 0},
	} {
		if i > 0 {
			fill()
		}
		other := idx.Blocks(1)
		c.Report(0, 0, rep)
		if s := c.State(0, 0); idx.Blocks(0) != 0 || s.Restarts != i+1 {
			t.Fatalf("report %+v: %d blocks, %d restarts", rep, idx.Blocks(0), s.Restarts)
		}
		if idx.Blocks(1) != other {
			t.Fatal("another replica's restart cleared replica 1")
		}
		if d := submit(t, c, 0, promptReq(100, 320, 0), Dispatched); d.Replica == 0 && d.PredictedCachedTokens != 0 {
			t.Fatalf("prediction after a restart: %+v", d)
		} else {
			c.Abort(0, d.Ticket)
		}
		// The new counters are the reference from now on.
		c.Report(0, 0, rep)
		if c.State(0, 0).Restarts != i+1 {
			t.Fatal("the same counters again counted as a restart")
		}
	}
	// A capacity change is a restart; a report without one is not.
	other := idx.Blocks(1)
	c.Report(0, 1, Report{NumGPUBlocks: 1000})
	if idx.Capacity(1) != 1000 || c.State(0, 1).CapacityBlocks != 1000 || idx.Blocks(1) != other {
		t.Fatalf("first capacity: index capacity %d, %d blocks", idx.Capacity(1), idx.Blocks(1))
	}
	c.Report(0, 1, Report{})
	if idx.Blocks(1) != other || c.State(0, 1).Restarts != 0 {
		t.Fatal("a report without capacity counted as a restart")
	}
	c.Report(0, 1, Report{NumGPUBlocks: 1000})
	c.Report(0, 1, Report{NumGPUBlocks: 2000})
	if s := c.State(0, 1); idx.Blocks(1) != 0 || s.Restarts != 1 || idx.Capacity(1) != 2000 || s.CapacityBlocks != 2000 {
		t.Fatalf("capacity change: %d blocks, %+v, index capacity %d", idx.Blocks(1), s, idx.Capacity(1))
	}
}

// A replica removed and added again comes back under its index, with its
// capacity in the index.
func TestReAddReplica(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 2, ReplicaConfig{CapacityBlocks: 100})
	d := submit(t, c, 0, promptReq(1, 160, 0), Dispatched)
	c.RemoveReplica(0, d.Replica)
	if s := c.State(0, d.Replica); !s.Gone || s.Healthy {
		t.Fatalf("%+v", s)
	}
	if c.Router().Index().Blocks(d.Replica) != 0 {
		t.Fatal("a removed replica's blocks are still indexed")
	}
	// Nothing goes there; its request ends normally.
	for i := range 4 {
		if nd := submit(t, c, 0, plainReq(uint64(10+i), 16, 0), Dispatched); nd.Replica == d.Replica {
			t.Fatalf("dispatched to a removed replica: %+v", nd)
		}
	}
	c.Finished(0, d.Ticket, Usage{}, nil)
	if s := c.State(0, d.Replica); s.Load.InFlight != 0 || s.ReservedBlocks != 0 {
		t.Fatalf("%+v", s)
	}
	i, err := c.AddReplica(ReplicaConfig{Name: d.Name, CapacityBlocks: 100})
	if err != nil || i != d.Replica || c.Replicas() != 2 {
		t.Fatalf("re-added as %d, %v (%d replicas)", i, err, c.Replicas())
	}
	if got := c.Router().Index().Capacity(i); got != 100 {
		t.Fatalf("index capacity %d after re-adding, want 100", got)
	}
	if j, ok := c.ReplicaIndex(d.Name); !ok || j != i {
		t.Fatal("ReplicaIndex")
	}
	if _, ok := c.ReplicaIndex("nope"); ok {
		t.Fatal("ReplicaIndex found an unknown name")
	}
	if s := c.State(0, 99); s != (ReplicaState{}) {
		t.Fatalf("state of an unknown replica: %+v", s)
	}
	for _, bad := range []ReplicaConfig{{}, {Name: "x", MaxInFlight: -1}, {Name: "x", MaxPending: -1}, {Name: "x", CapacityBlocks: -1}} {
		if _, err := c.AddReplica(bad); err == nil {
			t.Errorf("AddReplica(%+v) accepted", bad)
		}
	}
}

// Removing every replica leaves new requests nowhere: 503.
func TestNoReplicas(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 0, ReplicaConfig{})
	d := submit(t, c, 0, plainReq(1, 10, 0), Rejected)
	if d.Status != http.StatusServiceUnavailable || d.Reason != ReasonNoReplica {
		t.Fatalf("%+v", d)
	}
}

func TestLLMDUtilization(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Admission = AdmitLLMDUtilization
	c := newCore(t, cfg, 2, ReplicaConfig{})
	// No reports: both count as saturated.
	q := submit(t, c, 0, plainReq(1, 10, 0), Queued)
	// r0 at 0.5, r1 missing (1): mean 0.75 < 1, and r0 alone scores below 1.
	ds := c.Report(0, 0, Report{KVUsage: 0.4})
	if len(ds) != 1 || ds[0].Ticket != q.Ticket || ds[0].Replica != 0 {
		t.Fatalf("%+v", ds)
	}
	for i := range 4 {
		if d := submit(t, c, 0, plainReq(uint64(10+i), 10, 0), Dispatched); d.Replica != 0 {
			t.Fatalf("dispatched to the saturated replica: %+v", d)
		}
	}
	now := 10 * time.Millisecond
	for _, tc := range []struct {
		r0, r1 Report
		open   bool
		to     int // the replica it goes to (-1: either)
	}{
		{Report{Waiting: 10}, Report{KVUsage: 0.4}, false, 0},             // 2 and 0.5: 1.25
		{Report{Waiting: 5}, Report{KVUsage: 0.8}, false, 0},              // 1 and 1: the mean reaches 1
		{Report{Waiting: 4, KVUsage: 0.1}, Report{KVUsage: 0.9}, true, 0}, // 0.8 and 1.125: 0.9625
		{Report{Waiting: 1, KVUsage: 0.72}, Report{Waiting: 4}, true, -1}, // max(0.2, 0.9) and 0.8
		{Report{Waiting: 1, KVUsage: 0.88}, Report{Waiting: 4}, true, 1},  // 1.1 and 0.8: 0.95
	} {
		c.Report(now, 0, tc.r0)
		c.Report(now, 1, tc.r1)
		d, _ := c.Submit(now, plainReq(99, 10, 0))
		if (d.Kind == Dispatched) != tc.open || d.Kind == Dispatched && tc.to >= 0 && d.Replica != tc.to {
			t.Fatalf("r0 %+v, r1 %+v: %+v, want open %v (to %d)", tc.r0, tc.r1, d, tc.open, tc.to)
		}
		if d.Kind == Queued {
			c.Abort(now, d.Ticket)
		}
		now += 10 * time.Millisecond
	}
	// Stale reports (older than 200ms) count as saturated.
	c.Report(now, 0, Report{})
	c.Report(now, 1, Report{})
	submit(t, c, now+100*time.Millisecond, plainReq(100, 10, 0), Dispatched)
	submit(t, c, now+300*time.Millisecond, plainReq(101, 10, 0), Queued)
}

func TestLLMDConcurrency(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Admission = AdmitLLMDConcurrency
	cfg.Peers.LLMDMaxConcurrency = 2
	c := newCore(t, cfg, 2, ReplicaConfig{})
	var first Decision
	for i := range 4 {
		d := submit(t, c, 0, plainReq(uint64(i), 10, 0), Dispatched)
		if i == 0 {
			first = d
		}
	}
	for i := range 2 {
		if l := c.State(0, i).Load; l.InFlight != 2 {
			t.Fatalf("replica %d: %+v", i, l)
		}
	}
	q := submit(t, c, 0, plainReq(9, 10, 0), Queued)
	ds := c.Finished(0, first.Ticket, Usage{}, nil)
	if len(ds) != 1 || ds[0].Ticket != q.Ticket || ds[0].Replica != first.Replica {
		t.Fatalf("%+v", ds)
	}
}

func TestDynamoThreshold(t *testing.T) {
	cfg := testConfig("round_robin")
	cfg.Admission = AdmitDynamo
	cfg.Router.Options.MaxNumBatchedTokens = 100
	cfg.Peers.DynamoQueueThreshold = 1
	c := newCore(t, cfg, 1, ReplicaConfig{})
	a := submit(t, c, 0, promptReq(1, 96, 0), Dispatched) // 96 prefill tokens queued: not busy (<= 100)
	// The same prompt: 80 tokens predicted cached, 16 to prefill.
	if b := submit(t, c, 0, promptReq(1, 96, 0), Dispatched); b.PredictedCachedTokens != 80 {
		t.Fatalf("%+v", b)
	}
	if l := c.State(0, 0).Load; l.PendingPrefillTokens != 112 {
		t.Fatalf("%+v", l)
	}
	q := submit(t, c, 0, plainReq(3, 10, 0), Queued) // 112 > 100: busy
	ds := c.FirstByte(0, a.Ticket, -1)               // 16 left
	if len(ds) != 1 || ds[0].Ticket != q.Ticket {
		t.Fatalf("%+v", ds)
	}
}

// Two cores sharing one ledger see each other's reservations; with their
// own ledgers they do not.
func TestSharedLedger(t *testing.T) {
	for _, shared := range []bool{true, false} {
		var la, lb Ledger = NewLocalLedger(), NewLocalLedger()
		if shared {
			lb = la
		}
		cfg := testConfig("round_robin")
		cfg.Ledger = la
		a := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 100})
		cfg.Ledger = lb
		b := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 100})
		x := submit(t, a, 0, plainReq(1, 960, 0), Dispatched) // 60 blocks
		if got := b.State(0, 0).ReservedBlocks; shared && got != 60 || !shared && got != 0 {
			t.Fatalf("shared %v: the other core sees %d reserved", shared, got)
		}
		want := Queued
		if !shared {
			want = Dispatched
		}
		y := submit(t, b, 0, plainReq(2, 960, 0), want)
		if !shared {
			continue
		}
		a.Finished(time.Second, x.Ticket, Usage{}, nil)
		ds := b.Advance(time.Second)
		if len(ds) != 1 || ds[0].Ticket != y.Ticket {
			t.Fatalf("after the first core released: %+v", ds)
		}
		if la.Reserved(0) != 60 {
			t.Fatalf("ledger holds %d", la.Reserved(0))
		}
	}
}

func TestLocalLedger(t *testing.T) {
	l := NewLocalLedger()
	if l.Reserved(3) != 0 || l.Reserved(-1) != 0 {
		t.Fatal("empty ledger")
	}
	l.Add(3, 10)
	l.Add(3, -4)
	l.Add(-1, 5)
	if l.Reserved(3) != 6 || l.Reserved(0) != 0 {
		t.Fatal(l.Reserved(3))
	}
	l.Add(3, -100)
	if l.Reserved(3) != 0 {
		t.Fatal("below zero")
	}
}

func TestConfigValidate(t *testing.T) {
	ok := testConfig("round_robin")
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field string
		mod   func(*Config)
	}{
		{"admission", func(c *Config) { c.Admission = "fifo" }},
		{"overcommit", func(c *Config) { c.Overcommit = 0 }},
		{"overcommit", func(c *Config) { c.Overcommit = 4.5 }},
		{"overcommit", func(c *Config) { c.Overcommit = math.NaN() }},
		{"output_quantile", func(c *Config) { c.OutputQuantile = 1.5 }},
		{"output_quantile", func(c *Config) { c.OutputQuantile = math.NaN() }},
		{"output_min_samples", func(c *Config) { c.OutputMinSamples = 0 }},
		{"default_max_tokens", func(c *Config) { c.DefaultMaxTokens = -1 }},
		{"max_model_len", func(c *Config) { c.MaxModelLen = -1 }},
		{"kv_capacity_blocks", func(c *Config) { c.DefaultCapacityBlocks = -1 }},
		{"max_age", func(c *Config) { c.MaxAge = -1 }},
		{"queue.max_requests", func(c *Config) { c.Queue.MaxRequests = -1 }},
		{"queue.max_requests", func(c *Config) { c.Queue.MaxRequests = MaxQueueRequests + 1 }},
		{"queue.max_bytes", func(c *Config) { c.Queue.MaxBytes = 0 }},
		{"queue.timeout", func(c *Config) { c.Queue.Timeout = 0 }},
		{"queue.max_priority", func(c *Config) { c.Queue.MaxPriority = -1 }},
		{"queue.max_priority", func(c *Config) { c.Queue.MaxPriority = MaxPriorityLimit + 1 }},
		{"health.eject_after", func(c *Config) { c.Health.EjectAfter = 0 }},
		{"health.eject_time", func(c *Config) { c.Health.EjectTime = 0 }},
		{"max_eject_time", func(c *Config) { c.Health.MaxEjectTime = c.Health.EjectTime - 1 }},
		{"health.max_ejected_share", func(c *Config) { c.Health.MaxEjectedShare = 1.5 }},
		{"peers.llmd_queue_threshold", func(c *Config) { c.Peers.LLMDQueueThreshold = 0 }},
		{"peers.llmd_kv_threshold", func(c *Config) { c.Peers.LLMDKVThreshold = -1 }},
		{"peers.llmd_staleness", func(c *Config) { c.Peers.LLMDStaleness = 0 }},
		{"peers.llmd_max_concurrency", func(c *Config) { c.Peers.LLMDMaxConcurrency = 0 }},
		{"peers.dynamo_queue_threshold", func(c *Config) { c.Peers.DynamoQueueThreshold = 0 }},
	} {
		cfg := testConfig("round_robin")
		tc.mod(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v", tc.field, err)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: one bad field gave several errors: %v", tc.field, err)
		}
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted the config", tc.field)
		}
	}
	// Every error is reported at once.
	bad := Config{}
	err := bad.Validate()
	if err == nil || strings.Count(err.Error(), "\n") < 5 {
		t.Fatalf("zero config: %v", err)
	}
	// The router's own configuration is checked by New.
	cfg := testConfig("nope")
	if _, err := New(cfg); err == nil {
		t.Fatal("unknown policy accepted")
	}
	for _, a := range Admissions() {
		if got, err := ParseAdmission(a); err != nil || string(got) != a {
			t.Fatal(a, err)
		}
	}
	if _, err := ParseAdmission("KV"); err == nil {
		t.Fatal("ParseAdmission is case-sensitive")
	}
}

// A retry after the stream started ends the request (never replayed) and
// gives back everything it held.
func TestRetryAfterFirstByteEnds(t *testing.T) {
	c := newCore(t, testConfig("round_robin"), 2, ReplicaConfig{CapacityBlocks: 100})
	d, _ := c.Submit(0, promptReq(1, 160, 16))
	mustKind(t, d, Dispatched)
	c.FirstByte(sec(1), d.Ticket, -1)
	r, _ := c.Retry(sec(2), d.Ticket, true)
	mustKind(t, r, Rejected)
	st := c.State(sec(2), d.Replica)
	if st.Load.InFlight != 0 || st.ReservedBlocks != 0 {
		t.Fatalf("after a retry of a started stream: in flight %d, reserved %d", st.Load.InFlight, st.ReservedBlocks)
	}
	if c.entryOf(d.Ticket) != nil {
		t.Fatal("the ticket outlived its end")
	}
}

// Removing the last replica refuses at once what waits for it.
func TestRemoveReplicaRefusesItsQueue(t *testing.T) {
	cfg := testConfig("round_robin")
	c := newCore(t, cfg, 1, ReplicaConfig{CapacityBlocks: 20, MaxInFlight: 1})
	a, _ := c.Submit(0, promptReq(1, 160, 16))
	mustKind(t, a, Dispatched)
	q, _ := c.Submit(0, promptReq(2, 160, 16))
	mustKind(t, q, Queued)
	ds := c.RemoveReplica(sec(1), 0)
	if len(ds) != 1 || ds[0].Ticket != q.Ticket || ds[0].Kind != Rejected || ds[0].Status != 503 {
		t.Fatalf("decisions after removing the only replica: %+v", ds)
	}
	if c.Queued() != 0 {
		t.Fatalf("%d still queued", c.Queued())
	}
}
