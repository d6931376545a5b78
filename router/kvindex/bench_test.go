package kvindex

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// randomPrompts returns n prompts of blocks random (hence distinct) hashes.
func randomPrompts(rng *rand.Rand, n, blocks int) [][]kvblock.Hash {
	all := make([]kvblock.Hash, n*blocks)
	for i := range all {
		all[i] = kvblock.Hash{Hi: rng.Uint64(), Lo: rng.Uint64()}
	}
	ps := make([][]kvblock.Hash, n)
	for i := range ps {
		ps[i] = all[i*blocks : (i+1)*blocks : (i+1)*blocks]
	}
	return ps
}

// lookupFixture is 64 replicas, replica i holding the first 8(i+1) blocks of
// a 512-block prompt, and about 100k unrelated blocks.
func lookupFixture() (x *Index, prompt []kvblock.Hash, replicas []int) {
	rng := rand.New(rand.NewPCG(1, 2))
	x = New(Config{})
	for i, p := range randomPrompts(rng, 196, 512) {
		x.Record(i%64, p)
	}
	prompt = randomPrompts(rng, 1, 512)[0]
	replicas = make([]int, 64)
	for i := range replicas {
		replicas[i] = i
		x.Record(i, prompt[:8*(i+1)])
	}
	return x, prompt, replicas
}

// BenchmarkLookup512x64 looks up a 512-block prompt over 64 replicas, each
// holding a different-depth prefix, among ~100k unrelated blocks. It also
// reports the median time of one Lookup (timer overhead included).
func BenchmarkLookup512x64(b *testing.B) {
	x, prompt, replicas := lookupFixture()
	depths := make([]int, len(replicas))
	x.Lookup(prompt, replicas, depths)
	for i, d := range depths {
		if d != 8*(i+1) {
			b.Fatalf("replica %d depth %d, want %d", i, d, 8*(i+1))
		}
	}
	samples := make([]time.Duration, 1<<14)
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		t0 := time.Now()
		x.Lookup(prompt, replicas, depths)
		samples[n&(len(samples)-1)] = time.Since(t0)
		n++
	}
	b.StopTimer()
	s := slices.Clone(samples[:min(n, len(samples))])
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2].Nanoseconds()), "p50-ns")
}

// recordFixture is one replica at its default capacity (16384 blocks)
// and 64 distinct 512-block prompts, twice what it holds.
func recordFixture() (*Index, [][]kvblock.Hash) {
	x := New(Config{})
	ps := randomPrompts(rand.New(rand.NewPCG(3, 4)), 64, 512)
	for _, p := range ps {
		x.Record(0, p)
	}
	return x, ps
}

// BenchmarkRecord512 records 512-block prompts on one replica at capacity:
// "insert" cycles through prompts it no longer holds (512 inserts and 512
// evictions each), "touch" re-records one it holds.
func BenchmarkRecord512(b *testing.B) {
	b.Run("insert", func(b *testing.B) {
		x, ps := recordFixture()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			x.Record(0, ps[i%len(ps)])
			i++
		}
	})
	b.Run("touch", func(b *testing.B) {
		x, ps := recordFixture()
		b.ReportAllocs()
		for b.Loop() {
			x.Record(0, ps[len(ps)-1])
		}
	})
}

// BenchmarkRecordPinnedRelease512 pins 512-block prompts on one replica at
// capacity and releases them, as the router does for a request from routing
// to completion: "insert" cycles through prompts the replica no longer holds
// (512 inserts and 512 evictions each, the evictions at insertion since a
// full replica has unpinned blocks), "touch" pins and releases one it holds,
// and "inflight8" keeps 8 requests in flight, releasing the oldest as it
// pins a new one. Compare with BenchmarkRecord512.
func BenchmarkRecordPinnedRelease512(b *testing.B) {
	b.Run("insert", func(b *testing.B) {
		x, ps := recordFixture()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			x.Release(x.RecordPinned(0, ps[i%len(ps)]))
			i++
		}
	})
	b.Run("touch", func(b *testing.B) {
		x, ps := recordFixture()
		b.ReportAllocs()
		for b.Loop() {
			x.Release(x.RecordPinned(0, ps[len(ps)-1]))
		}
	})
	b.Run("inflight8", func(b *testing.B) {
		x, ps := recordFixture()
		var ring [8]Receipt
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			x.Release(ring[i%len(ring)])
			ring[i%len(ring)] = x.RecordPinned(0, ps[i%len(ps)])
			i++
		}
	})
}

// BenchmarkStored applies 16-block BlockStored events of fresh blocks to a
// replica at capacity (each inserts 16 blocks and evicts 16).
func BenchmarkStored(b *testing.B) {
	x, ps := recordFixture()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p := ps[(i/32)%len(ps)]
		k := 16 * (i % 32)
		x.Stored(0, p[k:k+16])
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(16*b.N), "ns/block")
}

// fillFleet fills 64 replicas to 16384 blocks each (1M (block, replica)
// pairs) with 512-block prompts, each recorded on share replicas, and
// returns the bytes the index added to the live heap and the pairs.
func fillFleet(share int) (x *Index, heap int64, pairs int) {
	const replicas, perReplica = 64, 32 // prompts per replica
	ps := randomPrompts(rand.New(rand.NewPCG(5, 6)), replicas*perReplica/share, 512)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x = New(Config{})
	for i, p := range ps {
		for k := range share {
			x.Record((i*share+k)%replicas, p)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	for r := range replicas {
		pairs += x.Blocks(r)
	}
	runtime.KeepAlive(ps)
	return x, int64(after.HeapAlloc) - int64(before.HeapAlloc), pairs
}

// TestBytesPerPair checks the memory target, at most 150 bytes per
// (block, replica) pair, with no sharing (every pair a distinct block, the
// worst case) and with each block on 4 replicas.
func TestBytesPerPair(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("fills a million pairs")
	}
	for _, share := range []int{1, 4} {
		x, heap, pairs := fillFleet(share)
		if pairs != 64*16384 {
			t.Fatalf("share %d: %d pairs, want %d", share, pairs, 64*16384)
		}
		perBytes := float64(x.Bytes()) / float64(pairs)
		perHeap := float64(heap) / float64(pairs)
		t.Logf("share %d: %d pairs, %d blocks: Bytes %.1f B/pair, heap %.1f B/pair", share, pairs, x.shared.n, perBytes, perHeap)
		if perBytes > 150 || perHeap > 150 {
			t.Errorf("share %d: %.1f (Bytes) and %.1f (heap) bytes per pair, want at most 150", share, perBytes, perHeap)
		}
	}
}

// BenchmarkMemory reports bytes per (block, replica) pair for a full
// 64-replica fleet, by Bytes and by the live heap.
func BenchmarkMemory(b *testing.B) {
	for _, share := range []int{1, 4} {
		b.Run(map[int]string{1: "distinct", 4: "share4"}[share], func(b *testing.B) {
			var x *Index
			var heap int64
			var pairs int
			for b.Loop() {
				x, heap, pairs = fillFleet(share)
			}
			b.ReportMetric(float64(x.Bytes())/float64(pairs), "Bytes/pair")
			b.ReportMetric(float64(heap)/float64(pairs), "heap/pair")
		})
	}
}

// TestSteadyStateAllocs checks that Lookup, Record, Stored, pinned records
// with their release or take-back, and speculative records with their expiry
// do not allocate once the tables have grown.
func TestSteadyStateAllocs(t *testing.T) {
	x, ps := recordFixture()
	replicas := []int{0, 1, 2, 70}
	depths := make([]int, len(replicas))
	i := 0
	check := func(name string, f func()) {
		t.Helper()
		for range 200 { // let the tables and the queue grow
			f()
		}
		if n := testing.AllocsPerRun(50, f); n != 0 {
			t.Errorf("%s: %v allocations per run", name, n)
		}
	}
	check("Lookup", func() { x.Lookup(ps[len(ps)-1], replicas, depths) })
	check("Record", func() { x.Record(0, ps[i%len(ps)]); i++ })
	check("Stored", func() { x.Stored(0, ps[i%len(ps)][:16]); i++ })
	now := time.Duration(0)
	check("RecordPinned+Release", func() { x.Release(x.RecordPinned(0, ps[i%len(ps)])); i++ })
	check("RecordPinned+TakeBack", func() { x.TakeBack(x.RecordPinned(0, ps[i%len(ps)])); i++ })
	var ring [8]Receipt
	check("RecordPinned in flight", func() {
		x.Release(ring[i%len(ring)])
		ring[i%len(ring)] = x.RecordPinned(0, ps[i%len(ps)])
		i++
	})
	check("RecordSpeculative+Expire", func() {
		x.RecordSpeculative(1, ps[i%len(ps)][:64], now+10)
		x.Expire(now)
		now++
		i++
	})
}
