package kvindex

import "github.com/inferrail/inferrail/engine/kvblock"

// entry is one slot of the shared table: a block hash and the set of
// replicas holding it.
type entry struct {
	h    kvblock.Hash
	bits uint64 // replicas 0..63
	ext  int32  // head of the entry's list of further words in table.ext, or nilExt
	live uint32 // 1 when the slot holds an entry
}

// extWord is one further word of an entry's replica set: replicas
// 64*word..64*word+63. An entry's words form a singly linked list; free
// words form another.
type extWord struct {
	bits uint64
	word int32
	next int32
}

const nilExt = -1

// table maps block hashes to replica sets: open addressing with linear
// probing and backward-shift deletion, indexed by the low bits of Lo (block
// hashes are uniformly distributed), at most 3/4 full. It holds an entry
// exactly when some replica holds the block.
type table struct {
	slots   []entry
	mask    uint64
	n       int
	ext     []extWord
	extFree int32
}

const minTableSize = 16

func newTable() table {
	return table{slots: make([]entry, minTableSize), mask: minTableSize - 1, extFree: nilExt}
}

// find returns the slot holding h, or -1.
func (t *table) find(h kvblock.Hash) int {
	slots, mask := t.slots, t.mask
	for i := h.Lo & mask; ; i = (i + 1) & mask {
		s := &slots[i]
		if s.live == 0 {
			return -1
		}
		if s.h == h {
			return int(i)
		}
	}
}

// word returns word w of the replica set of h (0 when h is absent).
func (t *table) word(h kvblock.Hash, w int) uint64 {
	for i := h.Lo & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.live == 0 {
			return 0
		}
		if s.h == h {
			if w == 0 {
				return s.bits
			}
			return t.extBits(s.ext, w)
		}
	}
}

// extBits returns word w of the list starting at e.
func (t *table) extBits(e int32, w int) uint64 {
	for ; e != nilExt; e = t.ext[e].next {
		if int(t.ext[e].word) == w {
			return t.ext[e].bits
		}
	}
	return 0
}

// add records that replica r holds h.
func (t *table) add(h kvblock.Hash, r int) {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.resize(2 * len(t.slots))
	}
	slots, mask := t.slots, t.mask
	i := h.Lo & mask
	for ; slots[i].live != 0; i = (i + 1) & mask {
		if slots[i].h == h {
			break
		}
	}
	s := &slots[i]
	if s.live == 0 {
		*s = entry{h: h, ext: nilExt, live: 1}
		t.n++
	}
	if r < 64 {
		s.bits |= 1 << uint(r)
		return
	}
	w, b := int32(r>>6), uint64(1)<<uint(r&63)
	for e := s.ext; e != nilExt; e = t.ext[e].next {
		if t.ext[e].word == w {
			t.ext[e].bits |= b
			return
		}
	}
	e := t.allocExt()
	t.ext[e] = extWord{bits: b, word: w, next: s.ext}
	s.ext = e
}

// remove records that replica r no longer holds h, deleting the entry when
// no replica does.
func (t *table) remove(h kvblock.Hash, r int) {
	i := t.find(h)
	if i < 0 {
		return
	}
	s := &t.slots[i]
	if r < 64 {
		s.bits &^= 1 << uint(r)
	} else {
		w := int32(r >> 6)
		prev := int32(nilExt)
		for e := s.ext; e != nilExt; prev, e = e, t.ext[e].next {
			x := &t.ext[e]
			if x.word != w {
				continue
			}
			x.bits &^= 1 << uint(r&63)
			if x.bits == 0 {
				if prev == nilExt {
					s.ext = x.next
				} else {
					t.ext[prev].next = x.next
				}
				t.freeExt(e)
			}
			break
		}
	}
	if s.bits == 0 && s.ext == nilExt {
		t.deleteAt(uint64(i))
	}
}

// deleteAt empties slot i, shifting later members of its probe chain back so
// that every chain stays unbroken.
func (t *table) deleteAt(i uint64) {
	slots, mask := t.slots, t.mask
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := &slots[j]
		if s.live == 0 {
			break
		}
		// s may move into the hole at i unless its home lies in (i, j].
		if (j-s.h.Lo)&mask >= (j-i)&mask {
			slots[i] = *s
			i = j
		}
	}
	slots[i] = entry{}
	t.n--
}

// resize rehashes every entry into a table of size slots (a power of two
// that leaves the table at most 3/4 full).
func (t *table) resize(size int) {
	old := t.slots
	t.slots = make([]entry, size)
	t.mask = uint64(size - 1)
	for k := range old {
		if old[k].live == 0 {
			continue
		}
		for i := old[k].h.Lo & t.mask; ; i = (i + 1) & t.mask {
			if t.slots[i].live == 0 {
				t.slots[i] = old[k]
				break
			}
		}
	}
}

// maybeShrink halves the table while it is at most 1/8 full, after mass
// deletions (Forget, Clear, a capacity shrink).
func (t *table) maybeShrink() {
	size := len(t.slots)
	for size > minTableSize && 8*t.n <= size {
		size /= 2
	}
	if 4*t.n > 3*size {
		size *= 2
	}
	if size < len(t.slots) {
		t.resize(size)
	}
}

func (t *table) allocExt() int32 {
	if e := t.extFree; e != nilExt {
		t.extFree = t.ext[e].next
		return e
	}
	t.ext = append(t.ext, extWord{})
	return int32(len(t.ext) - 1)
}

func (t *table) freeExt(e int32) {
	t.ext[e] = extWord{next: t.extFree}
	t.extFree = e
}
