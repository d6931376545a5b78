package engine

import (
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// BenchmarkStep measures one scheduler iteration of an engine that keeps 64
// requests decoding (refilled as they finish), reported per scheduled request.
func BenchmarkStep(b *testing.B) {
	cfg := DefaultConfig()
	e, _ := New(cfg)
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
