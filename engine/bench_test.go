package engine

import (
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// BenchmarkStep measures one scheduler iteration of an engine that keeps 64
// requests decoding (refilled as they finish), reported per scheduled request.
func BenchmarkStep(b *testing.B) { benchStep(b, DefaultConfig()) }

// BenchmarkStepTiers is BenchmarkStep with a CPU and a disk tier: the
// blocks of finished requests that the free queue evicts are offloaded
// (a request's unique suffix never repeats, so nothing loads back).
func BenchmarkStepTiers(b *testing.B) {
	cfg := DefaultConfig()
	cfg.KVTiers = KVTiers{CPUBlocks: 2048, CPULink: "pcie-gen5", DiskBlocks: 8192, DiskLink: "nvme"}
	benchStep(b, cfg)
}

func benchStep(b *testing.B, cfg Config) {
	e, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var id RequestID
	add := func(now time.Duration) {
		id++
		req := mkReq(id, cfg.BlockSize, []kvblock.Segment{{ID: uint64(id % 8), Len: 512}, {ID: uint64(id) << 8, Len: 64}}, 200)
		if err := e.Add(now, req); err != nil {
			b.Fatal(err)
		}
	}
	for range 64 {
		add(0)
	}
	var now time.Duration
	scheduled := 0
	b.ReportAllocs()
	for b.Loop() {
		res := e.Step(now)
		now = res.End()
		scheduled += res.Scheduled
		for _, em := range res.Emitted {
			if em.Finished {
				add(now)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(scheduled, 1)), "ns/request-step")
}

// BenchmarkGroupStep is BenchmarkStep through a Group: one rank (the
// pass-through every replica of a DP=1 fleet pays), two independent ranks
// and two in lockstep, 64 requests per rank.
func BenchmarkGroupStep(b *testing.B) {
	for _, tc := range []struct {
		name  string
		ranks int
		ep    bool
	}{{"dp1", 1, false}, {"dp2", 2, false}, {"dp2-ep", 2, true}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.DataParallelSize = tc.ranks
			cfg.ExpertParallel = tc.ep
			g, _ := NewGroup(cfg)
			var id RequestID
			add := func(now time.Duration) {
				id++
				req := mkReq(id, cfg.BlockSize, []kvblock.Segment{{ID: uint64(id % 8), Len: 512}, {ID: uint64(id) << 8, Len: 64}}, 200)
				if err := g.Add(now, req); err != nil {
					b.Fatal(err)
				}
			}
			for range 64 * tc.ranks {
				add(0)
			}
			scheduled := 0
			b.ReportAllocs()
			for b.Loop() {
				at, _ := g.NextStep()
				res := g.Step(at)
				scheduled += res.Scheduled
				for _, em := range res.Emitted {
					if em.Finished {
						add(res.End())
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(scheduled, 1)), "ns/request-step")
		})
	}
}
