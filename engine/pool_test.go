package engine

import (
	"slices"
	"testing"

	"github.com/inferrail/inferrail/engine/kvblock"

	"pgregory.net/rapid"
)

// The free queue pops blocks in the order of a plain LRU list: released
// blocks join the back, a block reused from the cache leaves wherever it
// is, and allocation takes the front.
func TestFreeQueueMatchesList(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const n = 16
		p := newPool(n, 16, true)
		var list []int32 // the reference: free blocks, front first
		for i := range n {
			list = append(list, int32(i))
		}
		held := map[int32]bool{}
		for range rapid.IntRange(0, 2000).Draw(t, "ops") {
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0: // allocate
				if len(list) == 0 {
					continue
				}
				id := p.alloc()
				if id != list[0] {
					t.Fatalf("alloc %d, want %d", id, list[0])
				}
				list = list[1:]
				held[id] = true
			case 1: // release a held block
				if len(held) == 0 {
					continue
				}
				ids := make([]int32, 0, len(held))
				for id := range held {
					ids = append(ids, id)
				}
				slices.Sort(ids)
				id := rapid.SampledFrom(ids).Draw(t, "release")
				delete(held, id)
				p.release([]int32{id})
				list = append(list, id)
			case 2: // reuse a free block from the cache
				if len(list) == 0 {
					continue
				}
				id := rapid.SampledFrom(list).Draw(t, "touch")
				p.touch(id)
				list = slices.DeleteFunc(list, func(x int32) bool { return x == id })
				held[id] = true
			}
			if p.nfree != len(list) {
				t.Fatalf("nfree %d, want %d", p.nfree, len(list))
			}
		}
	})
}

// BenchmarkPoolChurn allocates blocks, releases them and reuses some from
// the free queue, as a full cache under prefix hits does.
func BenchmarkPoolChurn(b *testing.B) {
	p := newPool(4096, 16, true)
	ids := make([]int32, 0, 64)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ids = ids[:0]
		for range 64 {
			ids = append(ids, p.alloc())
		}
		p.release(ids)
		p.touch(ids[i%64])
		p.release(ids[i%64 : i%64+1])
		i++
	}
}

// eachCached calls f for every cached block, with its hash (for the
// tests' checks: the table itself may hold stale entries).
func (p *pool) eachCached(f func(kvblock.Hash, int32)) {
	for i := range p.blocks {
		if b := &p.blocks[i]; b.hashed {
			f(b.hash, int32(i))
		}
	}
}
