package fleet

import "github.com/inferrail/inferrail/engine/kvblock"

// memoArenaLimit bounds the hashes a segmentMemo holds (32 MiB of them).
const memoArenaLimit = 1 << 21

// segmentMemo memoises the full-block hashes of prompt segments by (parent,
// segment) (see sim.hashes). The hashes live in one arena, so an entry costs
// no allocation of its own and a clear keeps the arena for reuse; the memo
// is cleared when it would hold more than maxEntries entries or maxHashes
// hashes (memoLimit and memoArenaLimit in a simulation). Its
// index is an open-addressing table with linear probing, at most half full,
// keyed by a mix of the parent hash (already uniform) and the segment: one
// probe where a Go map with a 32-byte key hashes the key first.
type segmentMemo struct {
	slots      []memoSlot
	mask       uint64
	n          int
	arena      []kvblock.Hash
	maxEntries int
	maxHashes  int
}

// memoSlot is one entry of the index: a key and where its hashes are in the
// arena (n is 0 for an empty slot: a memoised segment has a full block).
type memoSlot struct {
	key    memoKey
	off, n int32
}

const memoMinSlots = 1024

func newSegmentMemo(maxEntries, maxHashes int) segmentMemo {
	return segmentMemo{slots: make([]memoSlot, memoMinSlots), mask: memoMinSlots - 1, maxEntries: maxEntries, maxHashes: maxHashes}
}

// home is key's first slot.
func (m *segmentMemo) home(key memoKey) uint64 {
	return (key.parent.Lo ^ kvblock.Mix64(key.seg.ID^uint64(key.seg.Len)<<48)) & m.mask
}

// hashes returns the hashes of the full blocks of key.seg after key.parent
// (blockSize tokens each; the segment holds at least one full block),
// computing and memoising them if they are not memoised. The slice is valid
// until the next call.
func (m *segmentMemo) hashes(key memoKey, blockSize int) []kvblock.Hash {
	i := m.home(key)
	for ; m.slots[i].n != 0; i = (i + 1) & m.mask {
		if s := &m.slots[i]; s.key == key {
			return m.arena[s.off : s.off+s.n]
		}
	}
	if m.n >= m.maxEntries || len(m.arena)+key.seg.Len/blockSize > m.maxHashes {
		clear(m.slots)
		m.n = 0
		m.arena = m.arena[:0]
		i = m.home(key)
	} else if 2*(m.n+1) > len(m.slots) {
		m.grow()
		i = m.home(key)
		for m.slots[i].n != 0 {
			i = (i + 1) & m.mask
		}
	}
	off := len(m.arena)
	if need := off + key.seg.Len/blockSize; need > cap(m.arena) {
		// Double, rather than let append grow a large slice by a quarter
		// at a time (copying it each time).
		a := make([]kvblock.Hash, off, max(need, 2*cap(m.arena), 1024))
		copy(a, m.arena)
		m.arena = a
	}
	m.arena = kvblock.AppendSegmentHashesFrom(m.arena, key.parent, []kvblock.Segment{key.seg}, blockSize, 0, -1)
	m.slots[i] = memoSlot{key: key, off: int32(off), n: int32(len(m.arena) - off)}
	m.n++
	return m.arena[off:]
}

// grow doubles the index.
func (m *segmentMemo) grow() {
	old := m.slots
	m.slots = make([]memoSlot, 2*len(old))
	m.mask = uint64(len(m.slots) - 1)
	for _, s := range old {
		if s.n == 0 {
			continue
		}
		i := m.home(s.key)
		for m.slots[i].n != 0 {
			i = (i + 1) & m.mask
		}
		m.slots[i] = s
	}
}
