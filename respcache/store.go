package respcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Store holds entries by key for a time. Implementations are safe for
// concurrent use and pass the same conformance tests (conformance_test.go):
// MemoryStore and RedisStore.
type Store interface {
	// Get returns the entry stored under k, or nil (and no error) when
	// there is none or it expired. The entry must not be modified.
	Get(ctx context.Context, k Key) (*Entry, error)
	// Set stores e under k for ttl (replacing what was there). The store
	// keeps e: the caller does not modify it afterwards.
	Set(ctx context.Context, k Key, e *Entry, ttl time.Duration) error
}

// A Store whose Remote method reports true answers over the network: the
// Cache stores its answers off the request path (the client's last bytes
// are not held up by a Redis round trip).
type remoteStore interface{ Remote() bool }

// ErrEntryTooLarge: an entry is bigger than the memory store's whole bound.
var ErrEntryTooLarge = errors.New("respcache: entry larger than the store's max_bytes")

// Eviction reasons (MemoryStore's onEvict).
const (
	EvictLRU = "lru" // room was needed for a newer entry
	EvictTTL = "ttl" // the entry expired
)

// MemoryStore keeps entries in this process: a map and a list in recency
// order, bounded by the entries' total Size. Get and Set are O(1) (an
// eviction that makes room is O(1) per evicted entry); expired entries are
// dropped when read, and Set drops up to two expired ones at the cold end
// on the way. Time is time.Now (testing/synctest's virtual clock in
// tests). One mutex guards it: the critical sections are a map access and
// a few pointer moves.
type MemoryStore struct {
	mu      sync.Mutex
	max     int64
	used    int64
	items   map[Key]*memNode
	root    memNode // sentinel: root.next is the most recent, root.prev the least
	onEvict func(reason string, n int)
}

type memNode struct {
	key        Key
	e          *Entry
	size       int64
	expires    time.Time
	prev, next *memNode
}

// NewMemoryStore returns an empty store bounded by maxBytes (> 0).
// onEvict, when set, is called (outside the lock; it must not block) with
// the number of entries each Set or Get dropped, by reason.
func NewMemoryStore(maxBytes int64, onEvict func(reason string, n int)) (*MemoryStore, error) {
	if maxBytes <= 0 {
		return nil, fmt.Errorf("respcache: memory store bound must be positive, got %d", maxBytes)
	}
	s := &MemoryStore{max: maxBytes, items: make(map[Key]*memNode), onEvict: onEvict}
	s.root.next, s.root.prev = &s.root, &s.root
	return s, nil
}

var _ Store = (*MemoryStore)(nil)

func (s *MemoryStore) unlink(n *memNode) {
	n.prev.next, n.next.prev = n.next, n.prev
	n.prev, n.next = nil, nil
}

func (s *MemoryStore) pushFront(n *memNode) {
	n.prev, n.next = &s.root, s.root.next
	s.root.next.prev = n
	s.root.next = n
}

func (s *MemoryStore) remove(n *memNode) {
	s.unlink(n)
	delete(s.items, n.key)
	s.used -= n.size
}

// Get returns k's entry and marks it most recently used.
func (s *MemoryStore) Get(ctx context.Context, k Key) (*Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := time.Now()
	s.mu.Lock()
	n := s.items[k]
	if n == nil {
		s.mu.Unlock()
		return nil, nil
	}
	if !now.Before(n.expires) {
		s.remove(n)
		s.mu.Unlock()
		s.evicted(EvictTTL, 1)
		return nil, nil
	}
	if s.root.next != n {
		s.unlink(n)
		s.pushFront(n)
	}
	e := n.e
	s.mu.Unlock()
	return e, nil
}

// Set stores e under k for ttl, evicting the least recently used entries
// until it fits.
func (s *MemoryStore) Set(ctx context.Context, k Key, e *Entry, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := e.validate(); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("respcache: ttl must be positive, got %v", ttl)
	}
	size := e.Size()
	if size > s.max {
		return fmt.Errorf("%w: %d > %d bytes", ErrEntryTooLarge, size, s.max)
	}
	now := time.Now()
	s.mu.Lock()
	if old := s.items[k]; old != nil {
		s.remove(old)
	}
	expired := 0
	for range 2 { // the cold end's expired entries go first
		tail := s.root.prev
		if tail == &s.root || now.Before(tail.expires) {
			break
		}
		s.remove(tail)
		expired++
	}
	lru := 0
	for s.used+size > s.max {
		s.remove(s.root.prev)
		lru++
	}
	n := &memNode{key: k, e: e, size: size, expires: now.Add(ttl)}
	s.items[k] = n
	s.used += size
	s.pushFront(n)
	s.mu.Unlock()
	s.evicted(EvictTTL, expired)
	s.evicted(EvictLRU, lru)
	return nil
}

func (s *MemoryStore) evicted(reason string, n int) {
	if n > 0 && s.onEvict != nil {
		s.onEvict(reason, n)
	}
}

// Len returns the number of entries held (expired ones not yet dropped
// included).
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.items)
}

// Bytes returns the entries' total Size.
func (s *MemoryStore) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}
