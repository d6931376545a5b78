package engine

import "github.com/inferrail/inferrail/engine/kvblock"

// hashTable maps block hashes to block ids: open addressing with linear
// probing and backward-shift deletion. Block hashes are already uniformly
// distributed, so the low bits of Lo index the table directly; this is about
// three times faster than a Go map with a 16-byte key on the prefix-cache hot
// path. It never holds more entries than there are blocks, and its capacity
// is at least four times that: at most a quarter full, probes and the
// backward shifts of deletions stay short (measured a few percent of a
// fleet simulation faster than at half full, for twice the 8-byte slots).
//
// A slot holds only the low 32 bits of the hash (its home and a tag) and the
// block id: the full hash is the block's own (block.hash), read on a tag
// match. So a slot is 8 bytes, not 24, and the tables of a fleet's engines
// stay in cache. Every method takes the pool's blocks; an entry matches a
// key only while its block's hash is that key, so the pool may leave an
// evicted block's entry behind (stale: its block's hash is zero or another
// key's) and rebuild the table later (pool.alloc).
type hashTable struct {
	slots []slot
	mask  uint32
	n     int
}

type slot struct {
	lo  uint32 // uint32(hash.Lo)
	ref uint32 // block id + 1; 0 when empty
}

func newHashTable(maxEntries int) hashTable {
	size := 16
	for size < 4*maxEntries {
		size <<= 1
	}
	return hashTable{slots: make([]slot, size), mask: uint32(size - 1)}
}

func (t *hashTable) len() int { return t.n }

// get returns the block holding h.
func (t *hashTable) get(h kvblock.Hash, blocks []block) (int32, bool) {
	lo := uint32(h.Lo)
	slots, mask := t.slots, t.mask
	for i := lo & mask; ; i = (i + 1) & mask {
		s := slots[i]
		if s.ref == 0 {
			return nilBlock, false
		}
		if s.lo == lo && blocks[s.ref-1].hash == h {
			return int32(s.ref - 1), true
		}
	}
}

// insert maps h to id unless h is present; it reports whether it inserted.
// blocks[id].hash must be h by the time the table is next read.
func (t *hashTable) insert(h kvblock.Hash, id int32, blocks []block) bool {
	lo := uint32(h.Lo)
	slots, mask := t.slots, t.mask
	for i := lo & mask; ; i = (i + 1) & mask {
		s := &slots[i]
		if s.ref == 0 {
			*s = slot{lo: lo, ref: uint32(id) + 1}
			t.n++
			return true
		}
		if s.lo == lo && blocks[s.ref-1].hash == h {
			return false
		}
	}
}

// deleteIf removes h if it maps to id: blocks[id].hash is h, so the slot to
// empty is the one of id in h's probe chain.
func (t *hashTable) deleteIf(h kvblock.Hash, id int32) bool {
	ref := uint32(id) + 1
	slots, mask := t.slots, t.mask
	i := uint32(h.Lo) & mask
	for {
		s := slots[i]
		if s.ref == 0 {
			return false
		}
		if s.ref == ref {
			break
		}
		i = (i + 1) & mask
	}
	// Backward-shift deletion keeps every probe chain unbroken: s moves
	// into the hole at i unless its home lies in (i, j].
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := slots[j]
		if s.ref == 0 {
			break
		}
		if (j-s.lo)&mask >= (j-i)&mask {
			slots[i] = s
			i = j
		}
	}
	slots[i] = slot{}
	t.n--
	return true
}

// clear empties the table.
func (t *hashTable) clear() {
	clear(t.slots)
	t.n = 0
}

// each calls f for every entry.
func (t *hashTable) each(blocks []block, f func(kvblock.Hash, int32)) {
	for _, s := range t.slots {
		if s.ref != 0 {
			f(blocks[s.ref-1].hash, int32(s.ref-1))
		}
	}
}
