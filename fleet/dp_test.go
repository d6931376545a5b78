package fleet

import (
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/workload"
)

// listSource replays a fixed list of open-loop requests.
type listSource struct {
	reqs []*workload.Request
	next int
}

func (l *listSource) Next() (*workload.Request, bool) {
	if l.next == len(l.reqs) {
		return nil, false
	}
	l.next++
	return l.reqs[l.next-1], true
}

func (l *listSource) Done(*workload.Request, time.Duration, bool) (*workload.Request, bool) {
	return nil, false
}

// oneOff is a request of prompt tokens (a segment of its own) and out
// output tokens arriving at at.
func oneOff(id uint64, at time.Duration, model string, prompt, out int) *workload.Request {
	return &workload.Request{
		ID: id, Arrival: at, Model: model,
		Prompt:    []kvblock.Segment{{ID: 1000 + id, Len: prompt}},
		MaxTokens: out, OutputTokens: out,
		Output: kvblock.Segment{ID: 1<<40 + id, Len: out},
	}
}

// listConfig runs reqs on one replica configured by ecfg.
func listConfig(ecfg engine.Config, reqs ...*workload.Request) Config {
	c := DefaultConfig()
	c.Replicas = 1
	c.Engine = ecfg
	c.SourceName = "list"
	c.Source = func(uint64) (workload.Source, error) { return &listSource{reqs: reqs}, nil }
	return c
}

func simulateAll(t *testing.T, c Config) *Output {
	t.Helper()
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range out.Records {
		if !r.HasFirstToken || r.End < r.FirstToken {
			t.Fatalf("request %d did not complete: %+v", r.ID, r)
		}
	}
	return out
}

// With one step of output lag and 2 ms of output delay the gateway sees a
// lone request's first token a prefill step after the prefill ends plus
// 2 ms, and its end a decode step after the last step plus 2 ms.
func TestSimOutputLagLoneRequest(t *testing.T) {
	ecfg := engine.DefaultConfig()
	model := DefaultConfig().Workload.Model
	p := ecfg.Latency.PrefillTime(100, 0)
	d2 := ecfg.Latency.StepTime(engine.Batch{DecodeSeqs: 1, DecodeCtxTokens: 101})
	d3 := ecfg.Latency.StepTime(engine.Batch{DecodeSeqs: 1, DecodeCtxTokens: 102})

	plain := simulateAll(t, listConfig(ecfg, oneOff(1, 0, model, 100, 3))).Records[0]
	if plain.FirstToken != p || plain.End != p+d2+d3 {
		t.Fatalf("without lag: first token %v, end %v; want %v, %v", plain.FirstToken, plain.End, p, p+d2+d3)
	}
	ecfg.Latency.OutputLagSteps = 1
	ecfg.Latency.OutputDelayMs = 2
	out := simulateAll(t, listConfig(ecfg, oneOff(1, 0, model, 100, 3)))
	r := out.Records[0]
	if want := p + p + 2*time.Millisecond; r.FirstToken != want {
		t.Fatalf("TTFT %v, want prefill %v twice + 2 ms = %v", r.FirstToken, p, want)
	}
	if want := p + d2 + d3 + d3 + 2*time.Millisecond; r.End != want {
		t.Fatalf("E2E %v, want %v", r.End, want)
	}
	// The engine's own time is not delayed: it was busy for the three steps.
	if busy := out.Engines[0].BusyTime; busy != p+d2+d3 {
		t.Fatalf("busy %v, want %v", busy, p+d2+d3)
	}
}

// A data-parallel replica with independent ranks starts a request on an
// idle rank at once, while the other rank is mid-step.
func TestSimDataParallelIdleRankStartsAtOnce(t *testing.T) {
	ecfg := engine.DefaultConfig()
	ecfg.DataParallelSize = 2
	model := DefaultConfig().Workload.Model
	pA, pB := ecfg.Latency.PrefillTime(1800, 0), ecfg.Latency.PrefillTime(50, 0)
	at := 3 * time.Millisecond
	out := simulateAll(t, listConfig(ecfg, oneOff(1, 0, model, 1800, 1), oneOff(2, at, model, 50, 1)))
	if a, b := out.Records[0], out.Records[1]; a.FirstToken != pA || b.FirstToken != at+pB {
		t.Fatalf("first tokens at %v and %v, want %v and %v (rank 1 idle when B arrives)", a.FirstToken, b.FirstToken, pA, at+pB)
	}
	if m := out.Engines[0]; m.NumGPUBlocks != 2*ecfg.NumGPUBlocks || m.RequestsFinished != 2 || m.Steps != 2 {
		t.Fatalf("replica metrics %+v", m)
	}
	if c := out.Summary.PerReplica; len(c) != 1 {
		t.Fatalf("%d replicas in the summary, want 1", len(c))
	}

	// With expert parallelism the ranks step together: B, on the idle rank,
	// waits for the group's step in progress (A's prefill) to end.
	ecfg.ExpertParallel = true
	out = simulateAll(t, listConfig(ecfg, oneOff(1, 0, model, 1800, 1), oneOff(2, at, model, 50, 1)))
	if a, b := out.Records[0], out.Records[1]; a.FirstToken != pA || b.FirstToken != pA+pB {
		t.Fatalf("lockstep: first tokens at %v and %v, want %v and %v", a.FirstToken, b.FirstToken, pA, pA+pB)
	}
	// Arriving together they share one lockstep step, as long as A's.
	out = simulateAll(t, listConfig(ecfg, oneOff(1, 0, model, 1800, 1), oneOff(2, 0, model, 50, 1)))
	if a, b := out.Records[0], out.Records[1]; a.FirstToken != pA || b.FirstToken != pA || a.Replica != 0 || b.Replica != 0 {
		t.Fatalf("lockstep together: first tokens at %v and %v, want both %v", a.FirstToken, b.FirstToken, pA)
	}
}

// groupReference drives an engine.Group as the simulator should for one
// replica without admission: every request added at its arrival, each
// step when the group asks, tokens at OutputAt. It returns each request's
// first-token and last-token times by id.
func groupReference(t *testing.T, ecfg engine.Config, reqs []*workload.Request) (first, last map[uint64]time.Duration) {
	t.Helper()
	g, err := engine.NewGroup(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	first, last = map[uint64]time.Duration{}, map[uint64]time.Duration{}
	salt := kvblock.Salt(reqs[0].Model, "", "")
	next := 0
	for next < len(reqs) || g.Len() > 0 {
		at, ok := g.NextStep()
		if next < len(reqs) && (!ok || reqs[next].Arrival < at) {
			r := reqs[next]
			segs := append(append([]kvblock.Segment(nil), r.Prompt...), r.Output)
			hs := kvblock.AppendSegmentHashesFrom(nil, salt, segs, ecfg.BlockSize, 0, -1)
			if err := g.Add(r.Arrival, engine.Request{ID: engine.RequestID(r.ID), PromptTokens: r.PromptTokens(), OutputTokens: r.OutputTokens, MaxTokens: r.MaxTokens, BlockHashes: hs}); err != nil {
				t.Fatal(err)
			}
			next++
			continue
		}
		if !ok {
			t.Fatal("reference group idle with requests left")
		}
		res := g.Step(at)
		for _, em := range res.Emitted {
			if em.Output == 1 {
				first[uint64(em.ID)] = res.OutputAt
			}
			if em.Finished {
				last[uint64(em.ID)] = res.OutputAt
			}
		}
	}
	return first, last
}

// The simulator's DP replica gives each request the times the group itself
// gives, with and without lockstep and output lag.
func TestSimDataParallelMatchesGroup(t *testing.T) {
	model := DefaultConfig().Workload.Model
	var reqs []*workload.Request
	for i := range 60 {
		// Odd arrival times, so that no arrival meets a step's end.
		at := time.Duration(i)*37*time.Millisecond + time.Duration(i*i%7)*time.Millisecond + 1357*time.Nanosecond
		reqs = append(reqs, oneOff(uint64(i+1), at, model, 40+97*i%900, 5+i*13%60))
	}
	for _, tc := range []struct {
		name     string
		ranks    int
		ep       bool
		lag, del float64
	}{
		{"dp2", 2, false, 0, 0},
		{"dp2-lag", 2, false, 1, 2},
		{"dp3-ep-lag", 3, true, 1, 0.5},
		{"dp1-lag", 1, false, 0.5, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ecfg := engine.DefaultConfig()
			ecfg.DataParallelSize = tc.ranks
			ecfg.ExpertParallel = tc.ep
			ecfg.Latency.OutputLagSteps = tc.lag
			ecfg.Latency.OutputDelayMs = tc.del
			first, last := groupReference(t, ecfg, reqs)
			out := simulateAll(t, listConfig(ecfg, reqs...))
			for _, r := range out.Records {
				if r.FirstToken != first[r.ID] || r.End != last[r.ID] {
					t.Fatalf("request %d: sim first %v end %v, group %v %v", r.ID, r.FirstToken, r.End, first[r.ID], last[r.ID])
				}
			}
		})
	}
}

// KV events of a data-parallel replica reach the index as one replica's.
func TestSimDataParallelEventsIndex(t *testing.T) {
	c := smallConfig(t, "w1", 400)
	c.Replicas = 2
	c.Engine.DataParallelSize = 2
	c.Index = IndexEvents
	c.Policy = "kv_aware"
	out := simulateAll(t, c)
	if out.Summary.Completed != 400 {
		t.Fatalf("completed %d of 400", out.Summary.Completed)
	}
	if out.Summary.HitRate < 0.3 {
		t.Fatalf("hit rate %v: shared prompts should hit on a DP replica", out.Summary.HitRate)
	}
	for i, m := range out.Engines {
		if m.NumGPUBlocks != 2*c.Engine.NumGPUBlocks || m.Running+m.Waiting != 0 {
			t.Fatalf("replica %d: %+v", i, m)
		}
	}
}
