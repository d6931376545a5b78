package tokenize

import (
	"strings"
	"sync"
)

// wordCache maps pre-tokenized words to their ids: sharded by the word's
// hash, each shard bounded and emptied when full (so that a cache of
// more words than it holds forgets a part at a time). Safe for concurrent
// use: one lock, taken once for a batch of words (appendBatch).
//
// A lookup is on the hot path of every prompt, one per word, and at
// production sizes (tens of thousands of distinct words, several MB) it
// misses the processor's caches. A Go map of strings to slices touches
// four or five cache lines per lookup (the group's control word, the slot,
// the key's bytes, the slice's ids), so most words live inline instead: a
// word of up to inlineWordBytes bytes with up to inlineIDs ids fills one
// 64-byte slot of an open-addressed table, and a lookup reads one line.
// Longer words, or words of more ids, go to a map as before. A batch's
// lookups first load every word's slot, independent loads whose misses
// overlap, then probe: one lock for the batch, where a lock a word would
// order the loads (a locked instruction waits for the loads before it).
type wordCache struct {
	mu       sync.RWMutex
	shards   [wordCacheShards]wordShard
	perShard int // entries a shard holds before it is emptied
}

const (
	wordCacheShards = 32
	inlineWordBytes = 22
	inlineIDs       = 8
)

// wordSlot is one entry of a shard's inline table, 64 bytes: the word's
// hash, its length (0: an empty slot), its ids' count, the word and the
// ids.
type wordSlot struct {
	h    uint64
	n    uint8
	k    uint8
	word [inlineWordBytes]byte
	ids  [inlineIDs]uint32
}

type wordShard struct {
	slots []wordSlot // a power of two, at least twice n; nil until the first put
	n     int        // slots in use
	long  map[string][]uint32
}

func newWordCache(entries int) *wordCache {
	c := &wordCache{perShard: max(1, entries/wordCacheShards)}
	for i := range c.shards {
		c.shards[i].long = make(map[string][]uint32)
	}
	return c
}

// slotIndex is where h's probe starts in a table of mask+1 slots: bits of
// h above those that chose the shard.
func slotIndex(h uint64, mask int) int { return int(h>>32) & mask }

// appendIDs appends the cached ids of w (whose hash is h) to dst; false if
// w is not cached.
func (c *wordCache) appendIDs(dst []uint32, h uint64, w string) ([]uint32, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.shards[h%wordCacheShards].appendIDs(dst, h, w)
}

// appendBatch appends the ids of words (hashes[i] the hash of words[i])
// while they are cached: done is how many it appended, so words[done] is
// the first not cached (or done == len(words)).
func (c *wordCache) appendBatch(dst []uint32, words []string, hashes []uint64, sc *scratch) (out []uint32, done int) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var acc uint64
	for _, h := range hashes {
		s := &c.shards[h%wordCacheShards]
		if len(s.slots) > 0 {
			acc += uint64(s.slots[slotIndex(h, len(s.slots)-1)].n)
		}
	}
	sc.sink = acc
	for i, w := range words {
		var ok bool
		if dst, ok = c.shards[hashes[i]%wordCacheShards].appendIDs(dst, hashes[i], w); !ok {
			return dst, i
		}
	}
	return dst, len(words)
}

func (s *wordShard) appendIDs(dst []uint32, h uint64, w string) ([]uint32, bool) {
	if i := s.find(h, w); i >= 0 {
		e := &s.slots[i]
		return append(dst, e.ids[:e.k]...), true
	}
	if len(s.long) == 0 {
		return dst, false
	}
	// A word too long to inline, or a short one of more ids than a slot
	// holds.
	ids, ok := s.long[w]
	if !ok {
		return dst, false
	}
	return append(dst, ids...), true
}

// put caches ids as the ids of w (whose hash is h), emptying w's shard
// first when it is full.
func (c *wordCache) put(h uint64, w string, ids []uint32) {
	if w == "" {
		return // never looked up; and a slot of length 0 is an empty one
	}
	inline := len(w) <= inlineWordBytes && len(ids) <= inlineIDs
	var own []uint32
	var key string
	if !inline {
		own = append([]uint32(nil), ids...)
		key = strings.Clone(w)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.shards[h%wordCacheShards]
	if s.n+len(s.long) >= c.perShard {
		clear(s.slots)
		s.n = 0
		clear(s.long)
	}
	if !inline {
		// A word's ids never change, but keep the cache exact whatever its
		// caller does: one entry per word.
		if i := s.find(h, w); i >= 0 {
			s.deleteAt(i)
		}
		s.long[key] = own
		return
	}
	if len(s.long) > 0 {
		delete(s.long, w)
	}
	i := s.find(h, w) // another worker may have cached it first
	if i < 0 {
		if 2*(s.n+1) > len(s.slots) {
			s.grow()
		}
		mask := len(s.slots) - 1
		for i = slotIndex(h, mask); s.slots[i].n != 0; i = (i + 1) & mask {
		}
		s.n++
	}
	e := &s.slots[i]
	e.h, e.n, e.k = h, uint8(len(w)), uint8(len(ids))
	copy(e.word[:], w)
	copy(e.ids[:], ids)
}

// grow doubles the inline table (or makes its first): at most half full,
// so probes stay short, and no larger than that needs, so that the table
// stays as small as the words it holds (a lookup that misses the
// processor's caches costs as much as the rest of a word's tokenization).
func (s *wordShard) grow() {
	old := s.slots
	s.slots = make([]wordSlot, max(minWordSlots, 2*len(old)))
	mask := len(s.slots) - 1
	for k := range old {
		if old[k].n == 0 {
			continue
		}
		i := slotIndex(old[k].h, mask)
		for s.slots[i].n != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = old[k]
	}
}

const minWordSlots = 64

// find returns the slot of the inline table holding w, or -1.
func (s *wordShard) find(h uint64, w string) int {
	if len(w) > inlineWordBytes || s.slots == nil {
		return -1
	}
	mask := len(s.slots) - 1
	for i := slotIndex(h, mask); s.slots[i].n != 0; i = (i + 1) & mask {
		e := &s.slots[i]
		if e.h == h && int(e.n) == len(w) && string(e.word[:e.n]) == w {
			return i
		}
	}
	return -1
}

// deleteAt empties slot i, shifting later members of its probe chain back
// so that every chain stays unbroken.
func (s *wordShard) deleteAt(i int) {
	mask := len(s.slots) - 1
	for j := (i + 1) & mask; s.slots[j].n != 0; j = (j + 1) & mask {
		// The entry at j may move into the hole at i unless its home lies
		// in (i, j].
		if (j-slotIndex(s.slots[j].h, mask))&mask >= (j-i)&mask {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = wordSlot{}
	s.n--
}

// reset empties every shard.
func (c *wordCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.shards {
		s := &c.shards[i]
		clear(s.slots)
		s.n = 0
		clear(s.long)
	}
}
