package engine

import (
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// A group whose steps hand their prefix-cache insertions to another
// goroutine (HandOffStores, ApplyStores called all the time) steps exactly
// as one that makes them itself: the same results, the same metrics, after
// any sequence of additions, aborts, resets and steps.
func TestHandOffStoresSameSteps(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.BlockSize = rapid.SampledFrom([]int{4, 16}).Draw(t, "bs")
		cfg.NumGPUBlocks = rapid.IntRange(8, 160).Draw(t, "blocks")
		cfg.MaxNumSeqs = rapid.IntRange(1, 8).Draw(t, "seqs")
		cfg.MaxNumBatchedTokens = rapid.IntRange(8, 512).Draw(t, "budget")
		cfg.DataParallelSize = rapid.IntRange(1, 2).Draw(t, "ranks")
		plain, err := NewGroup(cfg)
		if err != nil {
			t.Fatal(err)
		}
		handing, err := NewGroup(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var pending atomic.Int64
		handing.HandOffStores(&pending)
		var stop atomic.Bool
		var wg sync.WaitGroup
		wg.Go(func() {
			for !stop.Load() {
				handing.ApplyStores()
			}
		})
		defer func() { stop.Store(true); wg.Wait() }()

		var now time.Duration
		nextID := RequestID(1)
		for i := range rapid.IntRange(1, 150).Draw(t, "ops") {
			switch rapid.IntRange(0, 7).Draw(t, "op") {
			case 0, 1:
				nseg := rapid.IntRange(1, 4).Draw(t, "nseg")
				prompt := make([]kvblock.Segment, nseg)
				for k := range prompt {
					prompt[k] = kvblock.Segment{ID: rapid.Uint64Range(1, 4).Draw(t, "seg"), Len: rapid.IntRange(1, 120).Draw(t, "len")}
				}
				req := mkReq(nextID, cfg.BlockSize, prompt, rapid.IntRange(1, 40).Draw(t, "out"))
				nextID++
				if a, b := errText(plain.Add(now, req)), errText(handing.Add(now, req)); a != b {
					t.Fatalf("op %d: add %d: %q, handing off %q", i, req.ID, a, b)
				}
			case 2:
				id := RequestID(rapid.IntRange(1, int(nextID)).Draw(t, "abort"))
				if a, b := errText(plain.Abort(now, id)), errText(handing.Abort(now, id)); a != b {
					t.Fatalf("op %d: abort %d: %q, handing off %q", i, id, a, b)
				}
			case 3:
				a, _ := plain.ResetPrefixCache()
				b, _ := handing.ResetPrefixCache()
				if a != b {
					t.Fatalf("op %d: reset: %v, handing off %v", i, a, b)
				}
			case 4:
				now += time.Duration(rapid.IntRange(0, 50).Draw(t, "wait")) * time.Millisecond
			case 5:
				if a, b := plain.Metrics(), handing.Metrics(); a != b {
					t.Fatalf("op %d: metrics:\n%+v\nhanding off %+v", i, a, b)
				}
			default:
				at, ok := plain.NextStep()
				if hat, hok := handing.NextStep(); at != hat || ok != hok {
					t.Fatalf("op %d: next step: %v %v, handing off %v %v", i, at, ok, hat, hok)
				}
				if !ok {
					continue
				}
				now = max(now, at)
				a, b := traceOf(plain.Step(now)), traceOf(handing.Step(now))
				if !reflect.DeepEqual(a, b) {
					t.Fatalf("op %d: step at %v:\n%+v\nhanding off %+v", i, now, a, b)
				}
				now = a.Start + a.Duration
			}
			a, b := plain.Metrics(), handing.LoadMetrics()
			a.CachedBlocks = 0
			if a != b {
				t.Fatalf("op %d: load metrics:\n%+v\nhanding off %+v", i, a, b)
			}
		}
		if a, b := plain.Metrics(), handing.Metrics(); a != b {
			t.Fatalf("end: metrics:\n%+v\nhanding off %+v", a, b)
		}
		if n := pending.Load(); n != 0 {
			t.Fatalf("end: %d lists counted pending after Metrics applied them all", n)
		}
	})
}

// With KV events or lower tiers a step's insertions are part of its
// result: HandOffStores leaves such engines as they are.
func TestHandOffStoresNotWithEvents(t *testing.T) {
	cfg := DefaultConfig()
	cfg.EnableKVEvents = true
	g := mustGroup(t, cfg)
	g.HandOffStores(new(atomic.Int64))
	if g.one.pool.hand.on {
		t.Fatal("hand-off on with KV events")
	}
	g = mustGroup(t, DefaultConfig())
	g.HandOffStores(nil) // a counter of its own
	if !g.one.pool.hand.on || g.one.pool.hand.pending == nil {
		t.Fatal("hand-off off, or without a counter, on a plain engine")
	}
	cfg = DefaultConfig()
	cfg.KVTiers.CPUBlocks, cfg.KVTiers.CPUBandwidthGBps = 64, 25
	g = mustGroup(t, cfg)
	g.HandOffStores(new(atomic.Int64))
	if g.one.pool.hand.on {
		t.Fatal("hand-off on with a CPU tier")
	}
}
