package kvindex

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// TestConcurrentUse records, pins, releases, looks up, forgets and more from
// several goroutines at once (run it with -race), checking consistency as it
// goes and, at the end, that once every pinned receipt is released nothing
// is pinned, and that the shared table is exactly the union of the
// replicas' LRUs.
func TestConcurrentUse(t *testing.T) {
	x := New(Config{DefaultCapacityBlocks: 64})
	// Prompts share prefixes: prompt i is base[:k] plus its own tail.
	base := make([]kvblock.Hash, 32)
	for i := range base {
		base[i] = kvblock.Hash{Hi: 1, Lo: uint64(i) * 0x9E3779B97F4A7C15}
	}
	prompts := make([][]kvblock.Hash, 64)
	for i := range prompts {
		p := append([]kvblock.Hash{}, base[:i%len(base)]...)
		for j := range 8 + i%24 {
			p = append(p, kvblock.Hash{Hi: uint64(2 + i), Lo: uint64(j)*0xBF58476D1CE4E5B9 + uint64(i)})
		}
		prompts[i] = p
	}
	replicas := []int{0, 1, 2, 3, 4, 5, 63, 64, 100}
	const workers, ops = 6, 3000
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			depths := make([]int, len(replicas))
			var receipts, pinned []Receipt
			defer func() {
				for _, rc := range pinned {
					x.Release(rc)
				}
			}()
			for i := range ops {
				r := replicas[rng.IntN(len(replicas))]
				p := prompts[rng.IntN(len(prompts))]
				switch rng.IntN(24) {
				case 0, 1, 2, 3:
					receipts = append(receipts, x.Record(r, p))
				case 4, 5:
					receipts = append(receipts, x.RecordSpeculative(r, p, time.Duration(i+rng.IntN(50))))
				case 6:
					if len(receipts) > 0 {
						x.TakeBack(receipts[rng.IntN(len(receipts))])
					}
				case 7, 8:
					x.Stored(r, p[:rng.IntN(len(p)+1)])
				case 9:
					x.Removed(r, p[rng.IntN(len(p)):])
				case 10:
					x.Expire(time.Duration(i))
				case 11:
					x.Forget(r)
				case 12:
					x.Clear(r)
				case 13:
					x.SetCapacity(r, rng.IntN(96))
				case 20, 21:
					rc := x.RecordPinned(r, p)
					receipts = append(receipts, rc)
					pinned = append(pinned, rc)
				case 22:
					if len(pinned) > 0 {
						k := rng.IntN(len(pinned))
						x.Release(pinned[k])
						if rng.IntN(4) == 0 { // keep it: a later release is a no-op
							break
						}
						pinned[k] = pinned[len(pinned)-1]
						pinned = pinned[:len(pinned)-1]
					}
				case 23:
					if len(pinned) > 0 {
						x.TakeBack(pinned[rng.IntN(len(pinned))])
					}
				case 14:
					if w == 0 {
						if err := x.check(); err != nil {
							errs <- err
							return
						}
					}
					_ = x.Bytes() + int64(x.Blocks(r)+x.Capacity(r))
				default:
					x.Lookup(p, replicas, depths)
					for _, d := range depths {
						if d < 0 || d > len(p) {
							t.Errorf("depth %d for a %d-block prompt", d, len(p))
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := x.check(); err != nil {
		t.Fatal(err)
	}
	for _, r := range replicas {
		p := x.get(r)
		if p == nil {
			continue
		}
		if p.npinned != 0 || len(p.pins) != len(p.pinFree) {
			t.Fatalf("replica %d: %d blocks and %d receipts still pinned after every release", r, p.npinned, len(p.pins)-len(p.pinFree))
		}
		if p.n > p.capacity {
			t.Fatalf("replica %d: %d blocks over capacity %d with nothing pinned", r, p.n, p.capacity)
		}
	}
	x.Expire(time.Hour)
	if err := x.check(); err != nil {
		t.Fatal(err)
	}
	for _, r := range replicas {
		x.Forget(r)
	}
	if err := x.check(); err != nil {
		t.Fatal(err)
	}
	if x.shared.n != 0 {
		t.Fatalf("shared table holds %d entries after every replica was forgotten", x.shared.n)
	}
}
