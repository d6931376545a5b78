package tokenize

import (
	"sync"

	"github.com/zeebo/xxh3"
)

// spanKey names a span of text: its XXH3-128 hash and length, plus whether
// it starts the text when that changes its ids.
type spanKey struct {
	hi, lo uint64
	n      int
	first  bool
}

func newSpanKey(s string, first bool) spanKey {
	h := xxh3.HashString128(s)
	return spanKey{hi: h.Hi, lo: h.Lo, n: len(s), first: first}
}

// spanCache maps long spans to their ids, bounded by the total number of
// cached ids, with CLOCK eviction. Safe for concurrent use.
type spanCache struct {
	mu     sync.Mutex
	m      map[spanKey]int // key -> slot in ring
	ring   []spanEntry
	free   []int
	hand   int
	tokens int
	max    int
}

type spanEntry struct {
	key  spanKey
	ids  []uint32 // nil for a free slot; never modified once stored
	used bool
}

func newSpanCache(maxTokens int) *spanCache {
	return &spanCache{m: map[spanKey]int{}, max: maxTokens}
}

func (c *spanCache) get(k spanKey) ([]uint32, bool) {
	c.mu.Lock()
	slot, ok := c.m[k]
	var ids []uint32
	if ok {
		c.ring[slot].used = true
		ids = c.ring[slot].ids
	}
	c.mu.Unlock()
	return ids, ok
}

func (c *spanCache) put(k spanKey, ids []uint32) {
	if len(ids) == 0 || len(ids) > c.max/4 {
		return
	}
	own := append([]uint32(nil), ids...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; ok {
		return
	}
	for c.tokens+len(own) > c.max {
		c.evictOne()
	}
	var slot int
	if n := len(c.free); n > 0 {
		slot = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		slot = len(c.ring)
		c.ring = append(c.ring, spanEntry{})
	}
	c.ring[slot] = spanEntry{key: k, ids: own}
	c.m[k] = slot
	c.tokens += len(own)
}

// evictOne advances the clock hand to the first entry not used since the
// hand last passed it, and drops it.
func (c *spanCache) evictOne() {
	for {
		if c.hand >= len(c.ring) {
			c.hand = 0
		}
		e := &c.ring[c.hand]
		c.hand++
		if e.ids == nil {
			continue
		}
		if e.used {
			e.used = false
			continue
		}
		delete(c.m, e.key)
		c.tokens -= len(e.ids)
		*e = spanEntry{}
		c.free = append(c.free, c.hand-1)
		return
	}
}

func (c *spanCache) reset() {
	c.mu.Lock()
	clear(c.m)
	c.ring, c.free, c.hand, c.tokens = nil, nil, 0, 0
	c.mu.Unlock()
}

// len reports the number of entries and cached ids (for tests).
func (c *spanCache) len() (entries, tokens int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m), c.tokens
}
