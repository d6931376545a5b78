package semcache

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"
)

// Memory store defaults.
const (
	DefaultMaxEntries = 1000
	DefaultMaxBytes   = 64 << 20
	// entryOverhead is what an entry costs besides its answer and vector
	// (its struct, list elements and slot), for the byte bound.
	entryOverhead = 160
	// sweepInterval is how often Put sweeps every scope's expired entries.
	sweepInterval = time.Minute
)

// MemoryOptions configure a MemoryStore.
type MemoryOptions struct {
	// MaxEntries bounds each scope's entries (a lookup compares with all
	// of them). 0 means DefaultMaxEntries.
	MaxEntries int
	// MaxBytes bounds the store's answers and vectors together; past it
	// the least recently used entries of any scope are evicted. 0 means
	// DefaultMaxBytes.
	MaxBytes int64
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// MemoryStore is the in-process store: per scope, brute-force cosine
// similarity over at most MaxEntries vectors kept in one contiguous slab,
// LRU eviction within the scope and, for MaxBytes, across scopes; TTL.
// Lookups run in parallel (a read lock while scanning); Put and a hit's
// LRU update take the write lock briefly. Fine for thousands of entries a
// scope (see BenchmarkMemoryNearest).
type MemoryStore struct {
	maxEntries int
	maxBytes   int64
	now        func() time.Time

	mu        sync.RWMutex
	scopes    map[Scope]*mscope
	lru       list.List // every *mentry, most recently used first
	bytes     int64
	nextSweep time.Time
}

type mscope struct {
	key  Scope
	dim  int
	vecs []float32 // slot i is vecs[i*dim : (i+1)*dim]
	ents []*mentry // slot -> entry, nil when free
	free []int32
	lru  list.List // this scope's *mentry, most recently used first
}

type mentry struct {
	sc       *mscope // nil once removed
	slot     int32
	answer   []byte
	stored   time.Time
	expires  time.Time
	size     int64
	gel, sel *list.Element
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty store.
func NewMemoryStore(o MemoryOptions) (*MemoryStore, error) {
	if o.MaxEntries < 0 || o.MaxBytes < 0 {
		return nil, fmt.Errorf("semcache: memory store: max entries %d and max bytes %d must not be negative", o.MaxEntries, o.MaxBytes)
	}
	s := &MemoryStore{maxEntries: o.MaxEntries, maxBytes: o.MaxBytes, now: o.Now, scopes: map[Scope]*mscope{}}
	if s.maxEntries == 0 {
		s.maxEntries = DefaultMaxEntries
	}
	if s.maxBytes == 0 {
		s.maxBytes = DefaultMaxBytes
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// Put implements Store.
func (s *MemoryStore) Put(_ context.Context, scope Scope, vec []float32, answer []byte, ttl time.Duration) error {
	if err := scope.validate(); err != nil {
		return err
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	u, err := unit(vec)
	if err != nil {
		return err
	}
	size := int64(len(answer)) + 4*int64(len(u)) + entryOverhead
	if size > s.maxBytes {
		return fmt.Errorf("%w: %d bytes with its vector, the store holds %d", ErrTooLarge, size, s.maxBytes)
	}
	ans := append([]byte(nil), answer...)
	now := s.now()

	s.mu.Lock()
	defer s.mu.Unlock()
	if !now.Before(s.nextSweep) {
		s.sweepLocked(now)
		s.nextSweep = now.Add(sweepInterval)
	}
	sc := s.scopes[scope]
	if sc == nil {
		sc = &mscope{key: scope, dim: len(u)}
		s.scopes[scope] = sc
	} else if sc.dim != len(u) {
		return fmt.Errorf("%w: %d dimensions, the scope's entries have %d", ErrVector, len(u), sc.dim)
	}
	// The same vector replaces its entry.
	if e, sim := sc.best(u, now); e != nil && sim >= sameVector {
		s.bytes += int64(len(ans)) - int64(len(e.answer))
		e.size += int64(len(ans)) - int64(len(e.answer))
		e.answer, e.stored, e.expires = ans, now, now.Add(ttl)
		s.touchLocked(e)
		s.evictBytesLocked()
		return nil
	}
	if sc.count() >= s.maxEntries {
		sc.dropExpired(s, now)
		for sc.count() >= s.maxEntries {
			s.removeLocked(sc.lru.Back().Value.(*mentry))
		}
		s.scopes[scope] = sc // removing its last entry unlisted it
	}
	e := &mentry{sc: sc, answer: ans, stored: now, expires: now.Add(ttl), size: size}
	e.slot = sc.alloc()
	copy(sc.vecs[int(e.slot)*sc.dim:], u)
	sc.ents[e.slot] = e
	e.sel = sc.lru.PushFront(e)
	e.gel = s.lru.PushFront(e)
	s.bytes += size
	s.evictBytesLocked()
	return nil
}

// Nearest implements Store.
func (s *MemoryStore) Nearest(_ context.Context, scope Scope, vec []float32, threshold float64) (Match, bool, error) {
	if err := scope.validate(); err != nil {
		return Match{}, false, err
	}
	if err := checkThreshold(threshold); err != nil {
		return Match{}, false, err
	}
	u, err := unit(vec)
	if err != nil {
		return Match{}, false, err
	}
	now := s.now()
	s.mu.RLock()
	sc := s.scopes[scope]
	if sc == nil {
		s.mu.RUnlock()
		return Match{}, false, nil
	}
	if sc.dim != len(u) {
		s.mu.RUnlock()
		return Match{}, false, fmt.Errorf("%w: %d dimensions, the scope's entries have %d", ErrVector, len(u), sc.dim)
	}
	e, sim := sc.best(u, now)
	s.mu.RUnlock()
	if e == nil || sim < threshold {
		return Match{}, false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.sc == nil || !now.Before(e.expires) {
		// Removed or replaced between the two locks: a miss.
		return Match{}, false, nil
	}
	s.touchLocked(e)
	return Match{Answer: append([]byte(nil), e.answer...), Similarity: sim, StoredAt: e.stored}, true, nil
}

// Close implements Store; it drops every entry.
func (s *MemoryStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scopes = map[Scope]*mscope{}
	s.lru.Init()
	s.bytes = 0
	return nil
}

// Len returns the number of entries held, expired ones not yet swept
// included.
func (s *MemoryStore) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lru.Len()
}

// Bytes returns the bytes the byte bound counts.
func (s *MemoryStore) Bytes() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.bytes
}

// Sweep removes every expired entry and returns how many.
func (s *MemoryStore) Sweep() int {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sweepLocked(now)
}

func (s *MemoryStore) sweepLocked(now time.Time) int {
	n := 0
	for _, sc := range s.scopes {
		n += sc.dropExpired(s, now)
	}
	return n
}

func (s *MemoryStore) touchLocked(e *mentry) {
	s.lru.MoveToFront(e.gel)
	e.sc.lru.MoveToFront(e.sel)
}

func (s *MemoryStore) evictBytesLocked() {
	for s.bytes > s.maxBytes {
		s.removeLocked(s.lru.Back().Value.(*mentry))
	}
}

func (s *MemoryStore) removeLocked(e *mentry) {
	sc := e.sc
	s.lru.Remove(e.gel)
	sc.lru.Remove(e.sel)
	sc.ents[e.slot] = nil
	sc.free = append(sc.free, e.slot)
	s.bytes -= e.size
	e.sc, e.answer = nil, nil
	if sc.lru.Len() == 0 {
		delete(s.scopes, sc.key)
	}
}

func (sc *mscope) count() int { return sc.lru.Len() }

// alloc returns a free slot, growing the slab when there is none.
func (sc *mscope) alloc() int32 {
	if n := len(sc.free); n > 0 {
		slot := sc.free[n-1]
		sc.free = sc.free[:n-1]
		return slot
	}
	sc.ents = append(sc.ents, nil)
	sc.vecs = append(sc.vecs, make([]float32, sc.dim)...)
	return int32(len(sc.ents) - 1)
}

// best returns the live entry most similar to the unit vector u.
func (sc *mscope) best(u []float32, now time.Time) (*mentry, float64) {
	var best *mentry
	bestSim := float32(-2)
	dim := sc.dim
	for i, e := range sc.ents {
		if e == nil || !now.Before(e.expires) {
			continue
		}
		if d := dot(u, sc.vecs[i*dim:(i+1)*dim]); d > bestSim {
			best, bestSim = e, d
		}
	}
	return best, float64(bestSim)
}

// dropExpired removes the scope's expired entries (the scope itself when
// that empties it) and returns how many.
func (sc *mscope) dropExpired(s *MemoryStore, now time.Time) int {
	var dead []*mentry
	for _, e := range sc.ents {
		if e != nil && !now.Before(e.expires) {
			dead = append(dead, e)
		}
	}
	for _, e := range dead {
		s.removeLocked(e)
	}
	return len(dead)
}
