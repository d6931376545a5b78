package kvindex

import (
	"slices"
	"testing"

	"github.com/inferrail/inferrail/engine/kvblock"
)

func pinHashes(tag uint64, n int) []kvblock.Hash {
	hs := make([]kvblock.Hash, n)
	for i := range hs {
		hs[i] = kvblock.Hash{Hi: tag, Lo: uint64(i)*0x9E3779B97F4A7C15 + tag}
	}
	return hs
}

func depth(x *Index, r int, p []kvblock.Hash) int {
	d := []int{0}
	x.Lookup(p, []int{r}, d)
	return d[0]
}

func mustCheck(t *testing.T, x *Index) {
	t.Helper()
	if err := x.check(); err != nil {
		t.Fatal(err)
	}
}

// TestPinnedSurvivesPressure: a pinned prompt is not evicted by later
// records, however many; once released it is the most recent and the
// others' blocks go first.
func TestPinnedSurvivesPressure(t *testing.T) {
	x := New(Config{DefaultCapacityBlocks: 8})
	a := pinHashes(1, 4)
	rc := x.RecordPinned(0, a)
	for k := range 10 {
		x.Record(0, pinHashes(uint64(10+k), 3))
		mustCheck(t, x)
		if d := depth(x, 0, a); d != 4 {
			t.Fatalf("after %d records: pinned prompt depth %d, want 4", k+1, d)
		}
	}
	if got := x.Blocks(0); got != 8 {
		t.Fatalf("Blocks %d, want 8", got)
	}
	x.Release(rc)
	mustCheck(t, x)
	// a is now the most recent: a fresh 4-block prompt evicts the others.
	x.Record(0, pinHashes(99, 4))
	if d := depth(x, 0, a); d != 4 {
		t.Fatalf("after release and a fresh prompt: depth %d, want 4", d)
	}
	// Another fresh one evicts a, tail first.
	x.Record(0, pinHashes(98, 2))
	if d := depth(x, 0, a); d != 2 {
		t.Fatalf("depth %d, want 2 (tail evicted first)", d)
	}
}

// TestPinnedOverCapacity: with every block pinned, RecordPinned goes over
// capacity, Record inserts nothing, and Release evicts the excess, tail
// first.
func TestPinnedOverCapacity(t *testing.T) {
	x := New(Config{DefaultCapacityBlocks: 4})
	a, b := pinHashes(1, 3), pinHashes(2, 3)
	ra := x.RecordPinned(0, a)
	rb := x.RecordPinned(0, b)
	mustCheck(t, x)
	if got := x.Blocks(0); got != 6 {
		t.Fatalf("Blocks %d, want 6 (over capacity, all pinned)", got)
	}
	if rc := x.Record(0, pinHashes(3, 2)); rc.gen != 0 || x.Blocks(0) != 6 {
		t.Fatalf("Record with every block pinned: receipt %+v, %d blocks", rc, x.Blocks(0))
	}
	x.Release(ra)
	mustCheck(t, x)
	// 6 blocks, capacity 4: a's two tail blocks go.
	if got, d := x.Blocks(0), depth(x, 0, a); got != 4 || d != 1 {
		t.Fatalf("after releasing a: %d blocks, a depth %d; want 4 and 1", got, d)
	}
	x.Release(rb)
	x.Release(rb) // no-op
	mustCheck(t, x)
	if db, da := depth(x, 0, b), depth(x, 0, a); db != 3 || da != 1 {
		t.Fatalf("after releasing b: depths b %d a %d, want 3 and 1", db, da)
	}
	// Capacity 0: pinned blocks are held while pinned only.
	x.SetCapacity(1, 0)
	r1 := x.RecordPinned(1, a)
	if d := depth(x, 1, a); d != 3 {
		t.Fatalf("capacity 0, pinned: depth %d, want 3", d)
	}
	x.Release(r1)
	if got := x.Blocks(1); got != 0 {
		t.Fatalf("capacity 0 after release: %d blocks", got)
	}
	mustCheck(t, x)
}

// TestSharedPins: a block pinned by two receipts stays pinned until both
// are released; double releases and releases after TakeBack do nothing.
func TestSharedPins(t *testing.T) {
	x := New(Config{DefaultCapacityBlocks: 4})
	sys := pinHashes(1, 2)
	a := append(slices.Clone(sys), pinHashes(2, 1)...)
	b := append(slices.Clone(sys), pinHashes(3, 1)...)
	ra, rb := x.RecordPinned(0, a), x.RecordPinned(0, b)
	_, pinned := x.pinState(0)
	if pinned[sys[0]].pins != 2 || pinned[a[2]].pins != 1 {
		t.Fatalf("pins %v", pinned)
	}
	x.Release(ra)
	x.Release(ra)
	x.TakeBack(ra)
	_, pinned = x.pinState(0)
	if pinned[sys[0]].pins != 1 || pinned[sys[1]].pins != 1 || len(pinned) != 3 {
		t.Fatalf("after releasing a (thrice): pins %v", pinned)
	}
	// Fill with fresh blocks: only a's own block is evictable.
	x.Record(0, pinHashes(4, 3))
	if d := depth(x, 0, b); d != 3 {
		t.Fatalf("b depth %d, want 3", d)
	}
	x.TakeBack(rb) // b inserted its last block: taken back; sys was a's
	x.Release(rb)
	mustCheck(t, x)
	if d, ds := depth(x, 0, b), depth(x, 0, sys); d != 2 || ds != 2 {
		t.Fatalf("after taking b back: depth %d (sys %d), want 2", d, ds)
	}
	if _, pinned = x.pinState(0); len(pinned) != 0 {
		t.Fatalf("still pinned: %v", pinned)
	}
}

// TestReleaseIgnoresRemovedAndCleared: a block removed while pinned and
// inserted again, or a replica cleared or forgotten, keeps stale receipts
// from unpinning what others pinned since.
func TestReleaseIgnoresRemovedAndCleared(t *testing.T) {
	x := New(Config{DefaultCapacityBlocks: 4})
	a := pinHashes(1, 2)
	ra := x.RecordPinned(0, a)
	x.Removed(0, a[1:])
	rb := x.RecordPinned(0, a) // a[1] again, another block
	x.Release(ra)
	_, pinned := x.pinState(0)
	if pinned[a[0]].pins != 1 || pinned[a[1]].pins != 1 {
		t.Fatalf("after removing, re-pinning and releasing the first: pins %v", pinned)
	}
	x.Release(rb)
	mustCheck(t, x)

	for _, forget := range []bool{false, true} {
		rc := x.RecordPinned(0, a)
		if forget {
			x.Forget(0)
		} else {
			x.Clear(0)
		}
		rd := x.RecordPinned(0, a)
		x.Release(rc)
		x.TakeBack(rc)
		if _, pinned = x.pinState(0); pinned[a[0]].pins != 1 || pinned[a[1]].pins != 1 {
			t.Fatalf("forget %v: stale receipt changed pins: %v", forget, pinned)
		}
		x.Release(rd)
		mustCheck(t, x)
	}
}

// TestSetCapacityKeepsPinned: shrinking evicts unpinned blocks only.
func TestSetCapacityKeepsPinned(t *testing.T) {
	x := New(Config{DefaultCapacityBlocks: 16})
	a := pinHashes(1, 5)
	x.Record(0, pinHashes(2, 5))
	ra := x.RecordPinned(0, a)
	x.SetCapacity(0, 3)
	mustCheck(t, x)
	if got, d := x.Blocks(0), depth(x, 0, a); got != 5 || d != 5 {
		t.Fatalf("after shrink: %d blocks, pinned depth %d; want 5 and 5", got, d)
	}
	x.Release(ra)
	mustCheck(t, x)
	if got, d := x.Blocks(0), depth(x, 0, a); got != 3 || d != 3 {
		t.Fatalf("after release: %d blocks, depth %d; want 3 and 3", got, d)
	}
}

func TestPinnedBlocksCountsDistinctActiveBlocks(t *testing.T) {
	x := New(Config{DefaultCapacityBlocks: 100})
	a := pinHashes(1, 10)
	b := append(append([]kvblock.Hash(nil), a[:6]...), pinHashes(2, 4)...) // shares 6 blocks with a
	ra := x.RecordPinned(0, a)
	rb := x.RecordPinned(0, b)
	if got := x.PinnedBlocks(0); got != 14 {
		t.Fatalf("pinned %d distinct blocks, want 14", got)
	}
	x.Release(ra)
	if got := x.PinnedBlocks(0); got != 10 {
		t.Fatalf("after releasing a: %d, want 10", got)
	}
	x.Release(rb)
	if got, other := x.PinnedBlocks(0), x.PinnedBlocks(7); got != 0 || other != 0 {
		t.Fatalf("after releasing both: %d (unknown replica %d)", got, other)
	}
}

// TestPinnedDepth: the leading blocks requests in flight pin, not those
// merely cached; released pins no longer count.
func TestPinnedDepth(t *testing.T) {
	x := New(Config{DefaultCapacityBlocks: 64})
	p := pinHashes(1, 10)
	x.Record(0, p) // cached, not pinned
	if d := x.PinnedDepth(0, p); d != 0 {
		t.Fatalf("cached prompt: pinned depth %d, want 0", d)
	}
	rc := x.RecordPinned(0, p[:6])
	for _, n := range []int{0, 1, 5, 6, 7, 10} {
		if d, want := x.PinnedDepth(0, p[:n]), min(n, 6); d != want {
			t.Errorf("prefix of %d: pinned depth %d, want %d", n, d, want)
		}
	}
	if d := x.PinnedDepth(1, p); d != 0 {
		t.Fatalf("other replica: pinned depth %d", d)
	}
	x.Release(rc)
	if d := x.PinnedDepth(0, p); d != 0 {
		t.Fatalf("after release: pinned depth %d", d)
	}
}
