package tenancy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
)

// CacheConfig configures a Cache; zero fields take the defaults.
type CacheConfig struct {
	// TTL is how long a key found in the store is served without asking
	// again (default 5s): the longest a change made on another gateway
	// takes to show here. Writes through this gateway's admin API call
	// Invalidate and show at once.
	TTL time.Duration
	// NegativeTTL is how long an unknown id is remembered as unknown
	// (default 1s), so a stream of bad keys is not a stream of queries.
	NegativeTTL time.Duration
	// MaxStale is how long past its TTL an entry is still served when the
	// store fails (default 10 x TTL); past it, the store's error is
	// returned (the proxy answers 503).
	MaxStale time.Duration
	// MaxEntries bounds the keys held (default 10,000).
	MaxEntries int
	// MaxNegative bounds the unknown ids held (default 10,000), apart from
	// the keys, so a flood of random ids cannot push real keys out.
	MaxNegative int
	// LookupTimeout bounds one store lookup (default 5s). A lookup is
	// shared by every request for the id, so it does not stop when the
	// request that started it is cancelled.
	LookupTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (c *CacheConfig) fill() {
	if c.TTL <= 0 {
		c.TTL = 5 * time.Second
	}
	if c.NegativeTTL <= 0 {
		c.NegativeTTL = time.Second
	}
	if c.MaxStale <= 0 {
		c.MaxStale = 10 * c.TTL
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = 10_000
	}
	if c.MaxNegative <= 0 {
		c.MaxNegative = 10_000
	}
	if c.LookupTimeout <= 0 {
		c.LookupTimeout = 5 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// CacheStats counts what a Cache did.
type CacheStats struct {
	Hits         uint64 // served from a fresh entry
	NegativeHits uint64 // unknown id answered from the negative cache
	Lookups      uint64 // store lookups (one per burst of misses on an id)
	Shared       uint64 // misses that waited on another request's lookup
	Stale        uint64 // entries served past TTL because the store failed
	Evictions    uint64 // entries dropped to stay within the bounds
}

// Cache is a short authentication cache in front of a Store's GetKey.
// Entries are keyed by public id and hold the whole record, hash
// included; the secret is checked against it on every request (Verify),
// so a forged key with a known id but another secret never passes (the
// reason TensorZero keys its cache by id and hash).
//
// It is safe for concurrent use. Keys it returns share their Models and
// SecretHash slices with the cache: treat them as read-only.
type Cache struct {
	store Store
	cfg   CacheConfig
	group singleflight.Group
	gen   atomic.Uint64 // bumped by Invalidate

	mu  sync.RWMutex
	pos map[string]*cacheEntry
	neg map[string]time.Time // id -> until

	hits, negHits, lookups, shared, stale, evictions atomic.Uint64
}

type cacheEntry struct {
	key     Key
	fresh   time.Time // served without a lookup until then
	staleBy time.Time // served when the store fails until then
}

// NewCache returns a cache in front of s.
func NewCache(s Store, cfg CacheConfig) *Cache {
	cfg.fill()
	return &Cache{store: s, cfg: cfg, pos: make(map[string]*cacheEntry), neg: make(map[string]time.Time)}
}

// GetKey returns the key with this id, from the cache when fresh, else
// from the store (one lookup however many requests ask at once). An
// unknown id gives an error matching ErrNotFound; a failing store (with no
// entry young enough to serve stale) one matching ErrUnavailable.
func (c *Cache) GetKey(ctx context.Context, id string) (Key, error) {
	e, k, ok, err := c.cached(id)
	if ok {
		return k, err
	}
	return c.lookup(ctx, id, e)
}

// cached answers from the cache when it can (ok): a fresh entry, or a
// fresh negative one; else it returns the entry there is, if any.
func (c *Cache) cached(id string) (e *cacheEntry, k Key, ok bool, err error) {
	now := c.cfg.Now()
	c.mu.RLock()
	e = c.pos[id]
	var negUntil time.Time
	if e == nil {
		negUntil = c.neg[id]
	}
	c.mu.RUnlock()
	if e != nil && now.Before(e.fresh) {
		c.hits.Add(1)
		return e, e.key, true, nil
	}
	if e == nil && now.Before(negUntil) {
		c.negHits.Add(1)
		return nil, Key{}, true, fmt.Errorf("key %s: %w", id, ErrNotFound)
	}
	return e, Key{}, false, nil
}

type lookupResult struct {
	key Key
	err error
}

func (c *Cache) lookup(ctx context.Context, id string, old *cacheEntry) (Key, error) {
	led := false // set by the lookup when this call started it
	ch := c.group.DoChan(id, func() (any, error) {
		led = true
		// A lookup that ended between this call's look at the cache and
		// now has filled it: no second lookup.
		if _, k, ok, err := c.cached(id); ok {
			return lookupResult{k, err}, nil
		}
		c.lookups.Add(1)
		gen := c.gen.Load()
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.LookupTimeout)
		defer cancel()
		k, err := c.store.GetKey(lctx, id)
		c.remember(id, gen, k, err)
		return lookupResult{k, err}, nil
	})
	var r lookupResult
	select {
	case res := <-ch:
		if !led {
			c.shared.Add(1)
		}
		r = res.Val.(lookupResult)
	case <-ctx.Done():
		return Key{}, fmt.Errorf("key %s: lookup: %w", id, ctx.Err())
	}
	switch {
	case r.err == nil:
		return r.key, nil
	case errors.Is(r.err, ErrNotFound):
		return Key{}, r.err
	}
	// The store failed: serve what we had while it is not too old.
	if old == nil {
		c.mu.RLock()
		old = c.pos[id]
		c.mu.RUnlock()
	}
	if old != nil && c.cfg.Now().Before(old.staleBy) {
		c.stale.Add(1)
		return old.key, nil
	}
	return Key{}, fmt.Errorf("key %s: %w: %w", id, ErrUnavailable, r.err)
}

// remember stores a lookup's result unless an Invalidate happened since
// the lookup started (its result may predate the write).
func (c *Cache) remember(id string, gen uint64, k Key, err error) {
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen.Load() != gen {
		return
	}
	switch {
	case err == nil:
		delete(c.neg, id)
		if _, ok := c.pos[id]; !ok && len(c.pos) >= c.cfg.MaxEntries {
			c.evictPositive()
		}
		c.pos[id] = &cacheEntry{key: k, fresh: now.Add(c.cfg.TTL), staleBy: now.Add(c.cfg.TTL + c.cfg.MaxStale)}
	case errors.Is(err, ErrNotFound):
		delete(c.pos, id)
		if _, ok := c.neg[id]; !ok && len(c.neg) >= c.cfg.MaxNegative {
			c.evictNegative()
		}
		c.neg[id] = now.Add(c.cfg.NegativeTTL)
	}
}

// evictSample is how many entries eviction looks at: it drops the one
// closest to going stale among them (a sampled LRU, as Redis does, with
// O(1) work and no bookkeeping on hits).
const evictSample = 8

func (c *Cache) evictPositive() {
	var victim string
	var oldest time.Time
	n := 0
	for id, e := range c.pos {
		if n == 0 || e.staleBy.Before(oldest) {
			victim, oldest = id, e.staleBy
		}
		if n++; n == evictSample {
			break
		}
	}
	delete(c.pos, victim)
	c.evictions.Add(1)
}

func (c *Cache) evictNegative() {
	var victim string
	var oldest time.Time
	n := 0
	for id, until := range c.neg {
		if n == 0 || until.Before(oldest) {
			victim, oldest = id, until
		}
		if n++; n == evictSample {
			break
		}
	}
	delete(c.neg, victim)
	c.evictions.Add(1)
}

// Invalidate drops what the cache holds for id, so the next request reads
// the store; the admin API calls it after each write. A lookup in flight
// when it is called still answers its waiters but is not cached.
func (c *Cache) Invalidate(id string) {
	c.mu.Lock()
	c.gen.Add(1)
	delete(c.pos, id)
	delete(c.neg, id)
	c.mu.Unlock()
	c.group.Forget(id)
}

// Authenticate checks a plaintext API key: it parses it, finds the key
// (GetKey) and verifies the secret. A malformed key gives an error matching
// ErrMalformedKey; an unknown id or a wrong secret one matching
// ErrInvalidKey; a store failure (without a usable stale entry) one
// matching ErrUnavailable (503), wrapping the store's error. The caller then checks Key.Allows for the request.
func (c *Cache) Authenticate(ctx context.Context, apiKey string) (Key, error) {
	id, secret, err := ParseAPIKey(apiKey)
	if err != nil {
		return Key{}, err
	}
	k, err := c.GetKey(ctx, id)
	switch {
	case errors.Is(err, ErrNotFound):
		return Key{}, fmt.Errorf("key %s: %w", id, ErrInvalidKey)
	case err != nil:
		return Key{}, err
	case !k.Verify(secret):
		return Key{}, fmt.Errorf("key %s: %w", id, ErrInvalidKey)
	}
	return k, nil
}

// Len returns the number of keys and of unknown ids held.
func (c *Cache) Len() (keys, unknown int) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.pos), len(c.neg)
}

// Stats returns the counters so far.
func (c *Cache) Stats() CacheStats {
	return CacheStats{
		Hits: c.hits.Load(), NegativeHits: c.negHits.Load(), Lookups: c.lookups.Load(),
		Shared: c.shared.Load(), Stale: c.stale.Load(), Evictions: c.evictions.Load(),
	}
}
