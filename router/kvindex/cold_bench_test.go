package kvindex

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// BenchmarkRecordPinnedCold pins and releases prompts of 4, 12 and 16
// blocks (a few hundred tokens), all new, on one of three full replicas of
// 4,096 blocks, with the core's own caches flushed before each (a pass
// over 2 MiB): a proxy's request on a machine its engines share, where the
// index is cold by the time the next request comes. ns/op includes the
// flush; cold-ns/op is the record and release alone.
func BenchmarkRecordPinnedCold(b *testing.B) {
	for _, blocks := range []int{4, 12, 16} {
		b.Run(strconv.Itoa(blocks), func(b *testing.B) {
			x := New(Config{DefaultCapacityBlocks: 4096})
			rng := rand.New(rand.NewPCG(5, 6))
			for r := range 3 {
				for _, p := range randomPrompts(rng, 512, 16) {
					x.Record(r, p)
				}
			}
			ps := randomPrompts(rng, 4096, blocks)
			flush := make([]byte, 2<<20)
			var timed time.Duration
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				for j := 0; j < len(flush); j += 64 {
					flush[j]++
				}
				t0 := time.Now()
				x.Release(x.RecordPinned(n%3, ps[n%len(ps)]))
				timed += time.Since(t0)
				n++
			}
			b.ReportMetric(float64(timed.Nanoseconds())/float64(n), "cold-ns/op")
		})
	}
}
