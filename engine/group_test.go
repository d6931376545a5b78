package engine

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

func mustGroup(t testing.TB, cfg Config) *Group {
	t.Helper()
	g, err := NewGroup(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// The load balancer sends a request to the rank with the lowest
// 4*waiting + running, ties to the first rank from the start index.
func TestGroupPickScore(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataParallelSize = 3
	g := mustGroup(t, cfg)
	for _, tc := range []struct {
		counts []lbCount
		start  int
		want   int
	}{
		{[]lbCount{{0, 0}, {0, 0}, {0, 0}}, 0, 0},
		{[]lbCount{{0, 0}, {0, 0}, {0, 0}}, 1, 1},
		{[]lbCount{{0, 0}, {0, 0}, {0, 0}}, 2, 2},
		{[]lbCount{{0, 3}, {1, 0}, {0, 9}}, 0, 0}, // 3 running beat 1 waiting (4)
		{[]lbCount{{1, 0}, {0, 3}, {0, 9}}, 0, 1},
		{[]lbCount{{0, 4}, {1, 0}, {0, 9}}, 0, 0}, // 4 == 4: the first from the start
		{[]lbCount{{0, 4}, {1, 0}, {0, 9}}, 1, 1},
		{[]lbCount{{0, 4}, {1, 0}, {0, 4}}, 2, 2},
		{[]lbCount{{0, 5}, {1, 0}, {0, 9}}, 0, 1},
		{[]lbCount{{2, 1}, {1, 6}, {0, 9}}, 0, 0}, // 9, 10, 9: ties broken from the start
		{[]lbCount{{2, 1}, {1, 6}, {0, 9}}, 1, 2},
	} {
		copy(g.lb, tc.counts)
		g.lbStart = tc.start
		if got := g.pick(); got != tc.want {
			t.Errorf("counts %v from %d: picked %d, want %d", tc.counts, tc.start, got, tc.want)
		}
	}
}

// Between the coordinator's publications the balancer counts its own
// choices as waiting; at each 100 ms boundary it takes the ranks' counts.
func TestGroupBalancerRefreshesEvery100ms(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataParallelSize = 2
	g := mustGroup(t, cfg)
	var id RequestID
	add := func(now time.Duration, out int) int {
		t.Helper()
		id++
		if err := g.Add(now, mkReq(id, cfg.BlockSize, []kvblock.Segment{{ID: uint64(id), Len: 64}}, out)); err != nil {
			t.Fatal(err)
		}
		r, _ := g.RankOf(id)
		return r
	}
	run := func(until time.Duration) {
		for {
			at, ok := g.NextStep()
			if !ok || at >= until {
				return
			}
			g.Step(at)
		}
	}
	// Phase 1 at t=0: long requests alternate with short ones (one token).
	var got []int
	for i := range 9 {
		out := 1000
		if i%2 == 1 {
			out = 1
		}
		got = append(got, add(0, out))
	}
	if want := []int{0, 1, 0, 1, 0, 1, 0, 1, 0}; !reflect.DeepEqual(got, want) {
		t.Fatalf("phase 1 ranks %v, want %v", got, want)
	}
	if want := []lbCount{{5, 0}, {4, 0}}; !reflect.DeepEqual(g.lb, want) {
		t.Fatalf("balancer counts %v, want the local increments %v", g.lb, want)
	}
	// Until 100 ms the view stays as it was, although rank 1 is idle by then.
	run(99 * time.Millisecond)
	if m := g.RankMetrics(1); m.Running+m.Waiting != 0 {
		t.Fatalf("rank 1 holds %d requests at 99 ms", m.Running+m.Waiting)
	}
	if want := []lbCount{{5, 0}, {4, 0}}; !reflect.DeepEqual(g.lb, want) {
		t.Fatalf("balancer counts at 99 ms %v, want %v", g.lb, want)
	}
	// The first call at or after 100 ms reads the ranks: five running on
	// rank 0, none on rank 1.
	run(110 * time.Millisecond)
	got = append(got[:0], add(110*time.Millisecond, 1000))
	if want := []lbCount{{0, 5}, {1, 0}}; !reflect.DeepEqual(g.lb, want) {
		t.Fatalf("balancer counts after 100 ms %v, want %v", g.lb, want)
	}
	for range 2 {
		got = append(got, add(110*time.Millisecond, 1000))
	}
	// 5 vs 0 -> 1; 5 vs 4 -> 1; 5 vs 8 -> 0. Without the refresh (20 vs 16)
	// it would be 1, 0, 1.
	if want := []int{1, 1, 0}; !reflect.DeepEqual(got, want) {
		t.Fatalf("phase 2 ranks %v, want %v", got, want)
	}
}

// In lockstep a group step lasts as long as the slowest rank's step, and
// every rank's tokens come at its end; independent ranks keep their own
// times.
func TestGroupLockstepStepIsTheSlowestRank(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataParallelSize = 2
	big := mkReq(1, cfg.BlockSize, []kvblock.Segment{{ID: 1, Len: 1500}}, 2)
	small := mkReq(2, cfg.BlockSize, []kvblock.Segment{{ID: 2, Len: 100}}, 2)
	pBig, pSmall := cfg.Latency.PrefillTime(1500, 0), cfg.Latency.PrefillTime(100, 0)

	cfg.ExpertParallel = true
	g := mustGroup(t, cfg)
	for _, r := range []Request{big, small} {
		if err := g.Add(0, r); err != nil {
			t.Fatal(err)
		}
	}
	if r, _ := g.RankOf(2); r != 1 {
		t.Fatalf("second request on rank %d, want 1", r)
	}
	res := g.Step(0)
	if res.Duration != pBig || res.Start != 0 || res.OutputAt != pBig {
		t.Fatalf("lockstep prefill: start %v duration %v output %v, want 0, %v, %v", res.Start, res.Duration, res.OutputAt, pBig, pBig)
	}
	if len(res.Emitted) != 2 || res.Emitted[0].ID != 1 || res.Emitted[1].ID != 2 || res.Scheduled != 2 {
		t.Fatalf("lockstep emissions %+v (scheduled %d), want requests 1 then 2", res.Emitted, res.Scheduled)
	}
	if at, _ := g.NextStep(); at != pBig {
		t.Fatalf("next lockstep step at %v, want %v", at, pBig)
	}
	// The decode step: both ranks decode one token; the longer context sets it.
	dBig := cfg.Latency.StepTime(Batch{DecodeSeqs: 1, DecodeCtxTokens: 1501})
	res = g.Step(pBig)
	if res.Duration != dBig || !res.Emitted[0].Finished || !res.Emitted[1].Finished {
		t.Fatalf("lockstep decode: duration %v (want %v), emissions %+v", res.Duration, dBig, res.Emitted)
	}
	if _, ok := g.NextStep(); ok {
		t.Fatal("group has work after both requests finished")
	}
	m := g.Metrics()
	if m.Steps != 2 || m.BusyTime != pBig+dBig || m.RequestsFinished != 2 || m.NumGPUBlocks != 2*cfg.NumGPUBlocks {
		t.Fatalf("lockstep metrics %+v", m)
	}

	// One rank with work: the other runs dummy batches, which cost no more
	// than any real step, so the step is that rank's.
	if err := g.Add(pBig+dBig, mkReq(3, cfg.BlockSize, []kvblock.Segment{{ID: 3, Len: 100}}, 1)); err != nil {
		t.Fatal(err)
	}
	if res = g.Step(pBig + dBig); res.Duration != pSmall {
		t.Fatalf("lockstep step with one idle rank lasts %v, want %v", res.Duration, pSmall)
	}

	// Independent ranks: the small prompt's token comes at its own prefill's end.
	cfg.ExpertParallel = false
	g = mustGroup(t, cfg)
	g.Add(0, big)
	g.Add(0, small)
	ends := map[RequestID]time.Duration{}
	for {
		at, ok := g.NextStep()
		if !ok {
			break
		}
		res := g.Step(at)
		for _, em := range res.Emitted {
			if em.Output == 1 {
				ends[em.ID] = res.OutputAt
			}
		}
	}
	if ends[1] != pBig || ends[2] != pSmall {
		t.Fatalf("independent first tokens at %v, want 1: %v, 2: %v", ends, pBig, pSmall)
	}
}

// A dummy batch sets the lockstep step when it is the longest: with a
// profile whose fixed cost dominates, a rank's real step is never shorter.
func TestGroupLockstepDummyBatch(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataParallelSize = 3
	cfg.ExpertParallel = true
	g := mustGroup(t, cfg)
	g.Add(0, mkReq(1, cfg.BlockSize, []kvblock.Segment{{ID: 1, Len: 16}}, 1))
	res := g.Step(0)
	if want := cfg.Latency.PrefillTime(16, 0); res.Duration != want || res.Duration < g.dummy {
		t.Fatalf("one busy rank of three: %v, want %v (dummy %v)", res.Duration, want, g.dummy)
	}
	if g.dummy != time.Duration(cfg.Latency.StepFixedMs*1e6) {
		t.Fatalf("dummy batch %v, want StepFixedMs", g.dummy)
	}
}

func hashes(ids ...uint64) []kvblock.Hash {
	out := make([]kvblock.Hash, len(ids))
	for i, id := range ids {
		out[i] = kvblock.Hash{Lo: id, Hi: id}
	}
	return out
}

// The group reports a hash stored when its first rank stores it and removed
// when its last rank drops it; runs are split around hashes already held.
func TestGroupKVEventRefCount(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataParallelSize = 2
	cfg.EnableKVEvents = true
	g := mustGroup(t, cfg)
	stored := func(parent uint64, ids ...uint64) KVEvent {
		ev := KVEvent{Kind: BlockStored, BlockHashes: hashes(ids...), BlockSize: 16, Medium: MediumGPU}
		if parent != 0 {
			ev.ParentBlockHash, ev.HasParent = hashes(parent)[0], true
		}
		return ev
	}
	removed := func(ids ...uint64) KVEvent {
		return KVEvent{Kind: BlockRemoved, BlockHashes: hashes(ids...), Medium: MediumGPU}
	}
	for i, step := range []struct {
		in, want []KVEvent
	}{
		{[]KVEvent{stored(0, 1, 2, 3)}, []KVEvent{stored(0, 1, 2, 3)}},               // rank 0
		{[]KVEvent{stored(0, 1, 2, 3, 4, 5)}, []KVEvent{stored(3, 4, 5)}},            // rank 1: 1-3 held
		{[]KVEvent{stored(0, 6, 2, 7, 8)}, []KVEvent{stored(0, 6), stored(2, 7, 8)}}, // split around 2
		{[]KVEvent{removed(1)}, nil},                                                 // rank 0: rank 1 holds 1
		{[]KVEvent{removed(1)}, []KVEvent{removed(1)}},                               // rank 1: the last
		{[]KVEvent{removed(2, 4, 3)}, []KVEvent{removed(4)}},                         // 2, 3 held elsewhere
		{[]KVEvent{removed(2, 3)}, []KVEvent{removed(3)}},
		{[]KVEvent{removed(2)}, []KVEvent{removed(2)}}, // 2 was held three times
		{[]KVEvent{stored(0, 1)}, []KVEvent{stored(0, 1)}},
	} {
		got := g.filterEvents(nil, step.in)
		if !reflect.DeepEqual(got, step.want) {
			t.Fatalf("step %d: %v gave %v, want %v", i, step.in, got, step.want)
		}
	}
	// 1 (stored again), 5, 6, 7 and 8 are held.
	if len(g.held) != 5 {
		t.Fatalf("group holds %d hashes, want 5: %v", len(g.held), g.held)
	}
}

// The same through real engines: a prompt cached on both ranks is stored
// once and removed only when the second rank evicts it.
func TestGroupKVEventsThroughRanks(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataParallelSize = 2
	cfg.EnableKVEvents = true
	cfg.BlockSize = 4
	cfg.NumGPUBlocks = 8
	g := mustGroup(t, cfg)
	p1 := []kvblock.Segment{{ID: 1, Len: 16}}
	p2 := []kvblock.Segment{{ID: 2, Len: 28}}
	var events []KVEvent
	run := func() {
		for {
			at, ok := g.NextStep()
			if !ok {
				return
			}
			res := g.Step(at)
			events = append(events, res.Events...)
		}
	}
	count := func(kind KVEventKind) (n int) {
		for _, ev := range events {
			if ev.Kind == kind {
				n += max(len(ev.BlockHashes), 1)
			}
		}
		return n
	}
	g.Add(0, mkReq(1, 4, p1, 1))
	g.Add(0, mkReq(2, 4, p1, 1))
	if r1, _ := g.RankOf(1); r1 != 0 {
		t.Fatalf("request 1 on rank %d", r1)
	}
	if r2, _ := g.RankOf(2); r2 != 1 {
		t.Fatalf("request 2 on rank %d", r2)
	}
	run()
	if n := count(BlockStored); n != 4 || count(BlockRemoved) != 0 {
		t.Fatalf("two ranks caching one 16-token prompt: %d stored, want 4 (events %v)", n, events)
	}
	for r := range 2 {
		if m := g.RankMetrics(r); m.CachedBlocks != 4 {
			t.Fatalf("rank %d caches %d blocks, want 4", r, m.CachedBlocks)
		}
	}
	// A 28-token prompt needs 7 of 8 blocks: it evicts 3 of p1's 4 blocks on
	// its rank. On rank 0 the group stays quiet; on rank 1 it reports them.
	events = nil
	at := 200 * time.Millisecond
	g.Add(at, mkReq(3, 4, p2, 1))
	run()
	if count(BlockRemoved) != 0 || count(BlockStored) != 7 {
		t.Fatalf("rank 0 evicting what rank 1 holds: events %v", events)
	}
	if m := g.RankMetrics(0); m.CachedBlocks != 8 {
		t.Fatalf("rank 0 caches %d blocks, want 8 (1 of p1, 7 of p2)", m.CachedBlocks)
	}
	events = nil
	g.Add(at, mkReq(4, 4, p2, 1))
	run()
	if count(BlockRemoved) != 3 || count(BlockStored) != 0 {
		t.Fatalf("rank 1 evicting p1's last copies: events %v", events)
	}
	ok, evs := g.ResetPrefixCache()
	if !ok || len(evs) != 1 || evs[0].Kind != AllBlocksCleared || len(g.held) != 0 {
		t.Fatalf("reset: ok %v events %v held %d", ok, evs, len(g.held))
	}
}

// Reset fails on every rank while one holds a block.
func TestGroupResetAllOrNothing(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataParallelSize = 2
	g := mustGroup(t, cfg)
	g.Add(0, mkReq(1, 16, []kvblock.Segment{{ID: 1, Len: 64}}, 1))
	g.Add(0, mkReq(2, 16, []kvblock.Segment{{ID: 2, Len: 64}}, 50))
	for range 2 {
		at, _ := g.NextStep()
		g.Step(at)
	}
	if ok, _ := g.ResetPrefixCache(); ok {
		t.Fatal("reset succeeded while rank 1 runs a request")
	}
	if m := g.RankMetrics(0); m.CachedBlocks == 0 {
		t.Fatal("a refused reset cleared rank 0")
	}
}

// Ids are the group's: a duplicate on another rank is refused, aborts find
// the rank, and limits are per rank.
func TestGroupRequests(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataParallelSize = 2
	cfg.NumGPUBlocks = 10
	g := mustGroup(t, cfg)
	if err := g.Add(0, mkReq(7, 16, []kvblock.Segment{{ID: 1, Len: 64}}, 5)); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(0, mkReq(7, 16, []kvblock.Segment{{ID: 2, Len: 64}}, 5)); !errors.Is(err, ErrDuplicateID) {
		t.Fatalf("duplicate id on another rank: %v", err)
	}
	// 15 blocks fit the group's 20 but no rank's 10.
	if err := g.Add(0, mkReq(8, 16, []kvblock.Segment{{ID: 3, Len: 230}}, 10)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a request larger than a rank: %v", err)
	}
	if err := g.Add(0, mkReq(9, 16, []kvblock.Segment{{ID: 4, Len: 64}}, 5)); err != nil {
		t.Fatal(err)
	}
	if r, ok := g.RankOf(9); !ok || r != 1 || g.Len() != 2 {
		t.Fatalf("request 9 on rank %d (%v), len %d", r, ok, g.Len())
	}
	if err := g.Abort(0, 9); err != nil {
		t.Fatal(err)
	}
	if err := g.Abort(0, 9); !errors.Is(err, ErrUnknownID) {
		t.Fatalf("second abort: %v", err)
	}
	if m := g.RankMetrics(1); m.RequestsAborted != 1 || m.Waiting != 0 || g.Len() != 1 {
		t.Fatalf("rank 1 after the abort: %+v, len %d", m, g.Len())
	}
}

// stepTrace is what a step returned, copied out of the reused buffers.
type stepTrace struct {
	Start, Duration, OutputAt time.Duration
	Batch                     Batch
	Scheduled                 int
	Emitted                   []Emission
	Preempted, Admitted       []RequestID
	Events                    []KVEvent
}

func traceOf(r *Result) stepTrace {
	return stepTrace{r.Start, r.Duration, r.OutputAt, r.Batch, r.Scheduled,
		append([]Emission(nil), r.Emitted...), append([]RequestID(nil), r.Preempted...), append([]RequestID(nil), r.Admitted...),
		append([]KVEvent(nil), r.Events...)}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// A group of one rank gives what a bare engine gives, call for call: the
// pass-through, and the general independent and lockstep paths forced on
// one rank.
func TestGroupOfOneIsAnEngine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.BlockSize = rapid.SampledFrom([]int{4, 16}).Draw(t, "bs")
		cfg.NumGPUBlocks = rapid.IntRange(8, 120).Draw(t, "blocks")
		cfg.MaxNumSeqs = rapid.IntRange(1, 8).Draw(t, "seqs")
		cfg.MaxNumBatchedTokens = rapid.IntRange(8, 256).Draw(t, "budget")
		cfg.LongPrefillTokenThreshold = rapid.SampledFrom([]int{0, 0, 32}).Draw(t, "threshold")
		cfg.EnableKVEvents = rapid.Bool().Draw(t, "events")
		cfg.Latency.OutputLagSteps = rapid.SampledFrom([]float64{0, 0, 1, 0.5}).Draw(t, "lag")
		cfg.Latency.OutputDelayMs = rapid.SampledFrom([]float64{0, 0, 2}).Draw(t, "delay")
		mode := rapid.IntRange(0, 2).Draw(t, "mode")
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		gcfg := cfg
		gcfg.ExpertParallel = mode == 2
		g, err := NewGroup(gcfg)
		if err != nil {
			t.Fatal(err)
		}
		if mode > 0 { // the general path, with one rank
			g.one = nil
			g.init()
		}
		var now time.Duration
		nextID := RequestID(1)
		for i := range rapid.IntRange(1, 120).Draw(t, "ops") {
			switch rapid.IntRange(0, 6).Draw(t, "op") {
			case 0, 1:
				nseg := rapid.IntRange(1, 3).Draw(t, "nseg")
				prompt := make([]kvblock.Segment, nseg)
				for k := range prompt {
					prompt[k] = kvblock.Segment{ID: rapid.Uint64Range(1, 4).Draw(t, "seg"), Len: rapid.IntRange(1, 60).Draw(t, "len")}
				}
				req := mkReq(nextID, cfg.BlockSize, prompt, rapid.IntRange(1, 40).Draw(t, "out"))
				if rapid.IntRange(0, 9).Draw(t, "dup") == 0 && nextID > 1 {
					req.ID = nextID - 1
				} else {
					nextID++
				}
				if a, b := errText(e.Add(now, req)), errText(g.Add(now, req)); a != b {
					t.Fatalf("op %d: add %d: engine %q, group %q", i, req.ID, a, b)
				}
			case 2:
				id := RequestID(rapid.IntRange(1, int(nextID)).Draw(t, "abort"))
				if a, b := errText(e.Abort(now, id)), errText(g.Abort(now, id)); a != b {
					t.Fatalf("op %d: abort %d: engine %q, group %q", i, id, a, b)
				}
			case 3:
				a1, a2 := e.ResetPrefixCache()
				b1, b2 := g.ResetPrefixCache()
				if a1 != b1 || !reflect.DeepEqual(append([]KVEvent(nil), a2...), append([]KVEvent(nil), b2...)) {
					t.Fatalf("op %d: reset: engine %v %v, group %v %v", i, a1, a2, b1, b2)
				}
			case 4:
				now += time.Duration(rapid.IntRange(0, 50).Draw(t, "wait")) * time.Millisecond
			default:
				at, ok := e.NextStep()
				gat, gok := g.NextStep()
				if at != gat || ok != gok {
					t.Fatalf("op %d: next step: engine %v %v, group %v %v", i, at, ok, gat, gok)
				}
				if !ok {
					continue
				}
				now = max(now, at)
				a, b := traceOf(e.Step(now)), traceOf(g.Step(now))
				if !reflect.DeepEqual(a, b) {
					t.Fatalf("op %d: step at %v:\nengine %+v\ngroup  %+v", i, now, a, b)
				}
				now = a.Start + a.Duration
			}
			if a, b := e.Metrics(), g.Metrics(); a != b {
				t.Fatalf("op %d: metrics:\nengine %+v\ngroup  %+v", i, a, b)
			}
			if e.Len() != g.Len() {
				t.Fatalf("op %d: len: engine %d, group %d", i, e.Len(), g.Len())
			}
		}
	})
}

// The group's Metrics add up its ranks', as vLLM's /metrics page does.
func TestGroupMetricsSum(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataParallelSize = 2
	g := mustGroup(t, cfg)
	for i := range 6 {
		g.Add(0, mkReq(RequestID(i+1), 16, []kvblock.Segment{{ID: uint64(i), Len: 100 + 50*i}}, 3+i))
	}
	for range 5 {
		at, _ := g.NextStep()
		g.Step(at)
	}
	m, a, b := g.Metrics(), g.RankMetrics(0), g.RankMetrics(1)
	if m.Running != a.Running+b.Running || m.Waiting != a.Waiting+b.Waiting || m.UsedBlocks != a.UsedBlocks+b.UsedBlocks ||
		m.NumGPUBlocks != 2*cfg.NumGPUBlocks || m.GenerationTokens != a.GenerationTokens+b.GenerationTokens ||
		m.PrefixCacheQueries != a.PrefixCacheQueries+b.PrefixCacheQueries || m.Steps != a.Steps+b.Steps ||
		m.BusyTime != (a.BusyTime+b.BusyTime)/2 {
		t.Fatalf("group %+v\nrank 0 %+v\nrank 1 %+v", m, a, b)
	}
	if want := float64(a.UsedBlocks+b.UsedBlocks) / float64(2*cfg.NumGPUBlocks); m.KVCacheUsage != want {
		t.Fatalf("kv usage %v, want %v", m.KVCacheUsage, want)
	}
	if m.Running+m.Waiting == 0 || a.Running == 0 || b.Running == 0 {
		t.Fatalf("scenario does not load both ranks: %+v", m)
	}
}

func ExampleGroup() {
	cfg := DefaultConfig()
	cfg.DataParallelSize = 2
	g, _ := NewGroup(cfg)
	for id := RequestID(1); id <= 3; id++ {
		g.Add(0, Request{ID: id, PromptTokens: 100, OutputTokens: 2})
		r, _ := g.RankOf(id)
		fmt.Printf("request %d on rank %d\n", id, r)
	}
	// Output:
	// request 1 on rank 0
	// request 2 on rank 1
	// request 3 on rank 0
}

// Under random traffic a group of several ranks keeps its books: the
// group's KV event stream describes the union of the ranks' caches (and
// its holder counts how many ranks cache each hash), every request ends
// with its tokens in order on one rank, and the metrics add up.
func TestGroupInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.DataParallelSize = rapid.IntRange(2, 3).Draw(t, "ranks")
		cfg.ExpertParallel = rapid.Bool().Draw(t, "ep")
		cfg.BlockSize = 4
		cfg.NumGPUBlocks = rapid.IntRange(12, 60).Draw(t, "blocks")
		cfg.MaxNumSeqs = rapid.IntRange(1, 6).Draw(t, "seqs")
		cfg.MaxNumBatchedTokens = rapid.IntRange(8, 128).Draw(t, "budget")
		cfg.EnableKVEvents = true
		cfg.Latency.OutputLagSteps = rapid.SampledFrom([]float64{0, 1}).Draw(t, "lag")
		g, err := NewGroup(cfg)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[kvblock.Hash]bool{} // what the group's events say is cached somewhere
		apply := func(evs []KVEvent) {
			for _, ev := range evs {
				switch ev.Kind {
				case BlockStored:
					for _, h := range ev.BlockHashes {
						if seen[h] {
							t.Fatalf("hash %v stored twice", h)
						}
						seen[h] = true
					}
				case BlockRemoved:
					for _, h := range ev.BlockHashes {
						if !seen[h] {
							t.Fatalf("hash %v removed but not stored", h)
						}
						delete(seen, h)
					}
				case AllBlocksCleared:
					clear(seen)
				}
			}
		}
		lives := map[RequestID]*life{}
		rankOf := map[RequestID]int{}
		var now, lastOut time.Duration
		next := RequestID(1)
		for range rapid.IntRange(1, 150).Draw(t, "ops") {
			switch rapid.IntRange(0, 7).Draw(t, "op") {
			case 0, 1, 2:
				prompt := []kvblock.Segment{{ID: rapid.Uint64Range(1, 4).Draw(t, "seg"), Len: rapid.IntRange(1, 40).Draw(t, "len")}}
				out := rapid.IntRange(1, 20).Draw(t, "out")
				if err := g.Add(now, mkReq(next, 4, prompt, out)); err == nil {
					lives[next] = &life{out: out}
					rankOf[next], _ = g.RankOf(next)
				} else if !errors.Is(err, ErrTooLarge) {
					t.Fatal(err)
				}
				next++
			case 3:
				for id, l := range lives {
					if !l.finished && !l.aborted {
						if err := g.Abort(now, id); err != nil {
							t.Fatal(err)
						}
						l.aborted = true
						break
					}
				}
			case 4:
				if ok, evs := g.ResetPrefixCache(); ok {
					apply(evs)
				}
			case 5:
				now += time.Duration(rapid.IntRange(0, 150).Draw(t, "wait")) * time.Millisecond
			default:
				at, ok := g.NextStep()
				if !ok {
					continue
				}
				now = max(now, at)
				res := g.Step(now)
				apply(res.Events)
				for _, em := range res.Emitted {
					l := lives[em.ID]
					l.tokens++
					if em.Output != l.tokens || l.finished || l.aborted {
						t.Fatalf("request %d: emission %+v after %d tokens", em.ID, em, l.tokens)
					}
					l.finished = em.Finished
				}
				if res.Duration > 0 && cfg.ExpertParallel {
					if res.OutputAt < lastOut {
						t.Fatalf("lockstep output at %v before %v", res.OutputAt, lastOut)
					}
					lastOut = res.OutputAt
				}
			}
			// The union of the ranks' caches is what the events say.
			holders := map[kvblock.Hash]int32{}
			var sum Metrics
			for r := range g.Ranks() {
				e := g.Rank(r)
				e.pool.eachCached(func(h kvblock.Hash, _ int32) { holders[h]++ })
				m := e.Metrics()
				sum.Running += m.Running
				sum.Waiting += m.Waiting
				sum.UsedBlocks += m.UsedBlocks
			}
			if !reflect.DeepEqual(holders, g.held) && !(len(holders) == 0 && len(g.held) == 0) {
				t.Fatalf("holders %v, group counts %v", holders, g.held)
			}
			if len(holders) != len(seen) {
				t.Fatalf("ranks cache %d hashes, the group's events say %d", len(holders), len(seen))
			}
			for h := range holders {
				if !seen[h] {
					t.Fatalf("hash %v cached on a rank, never reported", h)
				}
			}
			m := g.Metrics()
			if m.Running != sum.Running || m.Waiting != sum.Waiting || m.UsedBlocks != sum.UsedBlocks || m.Running+m.Waiting != g.Len() {
				t.Fatalf("group metrics %+v, ranks %+v, len %d", m, sum, g.Len())
			}
		}
		for i := 0; ; i++ {
			at, ok := g.NextStep()
			if !ok {
				break
			}
			if i > 100_000 {
				t.Fatal("group did not drain")
			}
			res := g.Step(max(now, at))
			now = res.End()
			for _, em := range res.Emitted {
				lives[em.ID].tokens++
				lives[em.ID].finished = em.Finished
			}
		}
		for id, l := range lives {
			if !l.aborted && (!l.finished || l.tokens != l.out) {
				t.Fatalf("request %d on rank %d: finished %v with %d of %d tokens", id, rankOf[id], l.finished, l.tokens, l.out)
			}
		}
		if g.Len() != 0 || g.Metrics().UsedBlocks != 0 {
			t.Fatalf("idle group holds %d requests, %d blocks", g.Len(), g.Metrics().UsedBlocks)
		}
	})
}
