package respcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/textproto"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// HeaderCache is on every answer the cache saw: "hit" (replayed), "miss"
// (computed by an engine, stored when it ends well). A bypassed request
// gets none.
const HeaderCache = "X-Inferrail-Cache"

// Hooks are the cache's counters, for live/metrics.go to count in
// Prometheus (names in docs/response-cache.md). Every hook may be nil and
// must not block.
type Hooks struct {
	// Hit: a request was answered from the cache (Coalesced ones too).
	Hit func()
	// Miss: a cacheable request goes to an engine.
	Miss func()
	// Bypass: a request is not cacheable, by reason (the Reason* consts).
	Bypass func(reason string)
	// Coalesced: a hit that waited for an identical request's answer
	// instead of computing its own.
	Coalesced func()
	// Stored: an answer was stored, of bytes bytes.
	Stored func(bytes int)
	// NotStored: a miss's answer was not stored, by reason (the NotStored*
	// consts; too_large also calls TooLarge).
	NotStored func(reason string)
	// TooLarge: an answer passed max_entry_bytes and was not stored.
	TooLarge func()
	// Evicted: the memory store dropped n entries, by reason (lru, ttl).
	Evicted func(reason string, n int)
	// StoreError: a store call failed, by op (get, set, set_dropped).
	StoreError func(op string)
}

func (h *Hooks) hit() {
	if h.Hit != nil {
		h.Hit()
	}
}

func (h *Hooks) miss() {
	if h.Miss != nil {
		h.Miss()
	}
}

func (h *Hooks) bypass(reason string) {
	if h.Bypass != nil {
		h.Bypass(reason)
	}
}

func (h *Hooks) coalesced() {
	if h.Coalesced != nil {
		h.Coalesced()
	}
}

func (h *Hooks) stored(n int) {
	if h.Stored != nil {
		h.Stored(n)
	}
}

func (h *Hooks) notStored(reason string) {
	if reason == NotStoredTooLarge && h.TooLarge != nil {
		h.TooLarge()
	}
	if h.NotStored != nil {
		h.NotStored(reason)
	}
}

func (h *Hooks) storeError(op string) {
	if h.StoreError != nil {
		h.StoreError(op)
	}
}

// Deps are what a configuration cannot hold.
type Deps struct {
	// Store, when set, is the store, whatever cfg.Store names (tests, or
	// a store of the caller's own).
	Store Store
	// Redis, when set, is the client of store: redis (the proxy may share
	// the one tenancy uses); without it New dials cfg.Redis.Addr.
	Redis redis.UniversalClient
	// Hooks are the counters.
	Hooks Hooks
}

// Outcome is what Lookup decided.
type Outcome uint8

// The outcomes.
const (
	// Bypass: the request is not cacheable; proxy it as if there were no
	// cache.
	Bypass Outcome = iota
	// Hit: replay Result.Entry (Replay).
	Hit
	// Miss: proxy the request through Result.Capture.
	Miss
)

func (o Outcome) String() string {
	switch o {
	case Bypass:
		return "bypass"
	case Hit:
		return "hit"
	case Miss:
		return "miss"
	}
	return "Outcome(?)"
}

// Result is Lookup's answer.
type Result struct {
	Outcome Outcome
	// Reason says why a request was bypassed (a Reason* const).
	Reason string
	// Key is the request's key (Hit and Miss).
	Key Key
	// Kind is the kind of answer the request wants (Hit and Miss).
	Kind Kind
	// Entry is the answer to replay (Hit). Its Usage is what the client
	// is shown; no engine computed anything for this request.
	Entry *Entry
	// Coalesced: the hit waited for an identical request's answer.
	Coalesced bool
	// Capture tees the engine's answer to the client into the cache
	// (Miss): wrap the ResponseWriter with it and call Finish when the
	// handler is done with the answer, whatever way (defer it).
	Capture *Capture
}

// Cache is one model's exact response cache: the determinism rules, the
// key, a store and the coalescing of identical misses. It is safe for
// concurrent use.
type Cache struct {
	cfg   Config
	rules rules
	store Store
	// async: Set runs off the request path (a remote store), at most
	// cap(sets) at once.
	async bool
	sets  chan struct{}
	wg    sync.WaitGroup
	hooks Hooks
	close func() error
	canon sync.Pool // *canonicalizer

	mu      sync.Mutex
	flights map[Key]*flight
	gen     uint64 // flights ended: a miss that saw another gen looks again
}

// flight is the first of identical concurrent misses, computing the
// answer the others wait for.
type flight struct {
	done  chan struct{} // closed when the leader's answer is known
	entry *Entry        // set before done is closed; nil: it failed
}

// maxAsyncSets bounds the Redis writes in flight; a miss that ends while
// that many are pending is not stored (counted as set_dropped).
const maxAsyncSets = 64

// closeTimeout bounds how long Close waits for pending writes.
const closeTimeout = 5 * time.Second

// New validates cfg and builds its cache: a disabled one bypasses every
// request (reason disabled) and holds no store. store: redis dials
// cfg.Redis.Addr unless deps.Redis is set.
func New(cfg Config, deps Deps) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Cache{
		cfg:     cfg,
		rules:   rules{maxTemperature: cfg.MaxTemperature},
		hooks:   deps.Hooks,
		flights: make(map[Key]*flight),
		sets:    make(chan struct{}, maxAsyncSets),
	}
	if cfg.TenantHeader != "" {
		c.rules.tenantHeader = textproto.CanonicalMIMEHeaderKey(cfg.TenantHeader)
	}
	c.canon.New = func() any { return new(canonicalizer) }
	if !cfg.Enabled {
		return c, nil
	}
	switch {
	case deps.Store != nil:
		c.store = deps.Store
	case cfg.Store == StoreMemory:
		s, err := NewMemoryStore(cfg.maxBytes(), deps.Hooks.Evicted)
		if err != nil {
			return nil, err
		}
		c.store = s
	case cfg.Store == StoreRedis:
		client, own := deps.Redis, false
		if client == nil {
			cl, err := DialRedis(cfg.Redis)
			if err != nil {
				return nil, err
			}
			client, own = cl, true
		}
		s, err := NewRedisStore(client, cfg.Redis)
		if err != nil {
			if own {
				client.Close()
			}
			return nil, err
		}
		s.own = own
		c.store = s
	}
	if r, ok := c.store.(remoteStore); ok && r.Remote() {
		c.async = true
	}
	if cl, ok := c.store.(io.Closer); ok {
		c.close = cl.Close
	}
	return c, nil
}

// Store returns the cache's store (nil when disabled): the proxy reads a
// MemoryStore's Len and Bytes for gauges, or runs a RedisStore's
// CheckEviction at startup.
func (c *Cache) Store() Store { return c.store }

// Config returns the configuration the cache was built with.
func (c *Cache) Config() Config { return c.cfg }

// Close waits (at most 5s) for the writes still pending and closes the
// store when the cache opened it.
func (c *Cache) Close() error {
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	t := time.NewTimer(closeTimeout)
	defer t.Stop()
	var err error
	select {
	case <-done:
	case <-t.C:
		err = fmt.Errorf("respcache: close: writes still pending after %v", closeTimeout)
	}
	if c.close != nil {
		err = errors.Join(err, c.close())
	}
	return err
}

// Lookup decides what to do with one request: Bypass (not cacheable),
// Hit (replay Result.Entry) or Miss (proxy it through Result.Capture).
// A store that fails reads as a miss (counted in StoreError). A miss
// identical to one being computed waits for that one's answer (at most
// max_wait and until ctx ends) and replays it; when the first fails or
// is too slow, it goes to the engine itself. The error is ctx's, when it
// ended while waiting: the client is gone or its deadline passed.
func (c *Cache) Lookup(ctx context.Context, req Request) (Result, error) {
	if c == nil || !c.cfg.Enabled {
		return Result{Outcome: Bypass, Reason: ReasonDisabled}, nil
	}
	k, kind, reason := c.keyOf(&req)
	if reason != "" {
		c.hooks.bypass(reason)
		return Result{Outcome: Bypass, Reason: reason}, nil
	}
	if c.cfg.MaxWait <= 0 {
		if e := c.get(ctx, k); e != nil {
			return c.hit(k, kind, e, false), nil
		}
		return c.miss(k, kind, nil), nil
	}
	for look := 0; ; look++ {
		c.mu.Lock()
		f, gen := c.flights[k], c.gen
		c.mu.Unlock()
		if f != nil {
			return c.follow(ctx, k, kind, f)
		}
		if e := c.get(ctx, k); e != nil {
			return c.hit(k, kind, e, false), nil
		}
		c.mu.Lock()
		if f := c.flights[k]; f != nil {
			c.mu.Unlock()
			return c.follow(ctx, k, kind, f)
		}
		if c.gen != gen && look == 0 {
			// A flight ended between the two looks: its answer may be
			// in the store now.
			c.mu.Unlock()
			continue
		}
		f = &flight{done: make(chan struct{})}
		c.flights[k] = f
		c.mu.Unlock()
		return c.miss(k, kind, f), nil
	}
}

// Deterministic reports whether a request to path with body passes the
// determinism rules (temperature at most max_temperature, n and best_of 1,
// no sampling that makes answers differ, a valid body), and if not, why
// (a Reason* const). It does not look at the tenant: it is the rule the
// semantic cache (package semcache) takes as its semcache.Rule, so both
// layers cache exactly the same requests.
func (c *Cache) Deterministic(path string, body []byte) (bool, string) {
	// A placeholder model and tenant: only the rules are asked for.
	_, _, reason := c.keyOf(&Request{Path: path, Body: body, Model: "-", KeyID: "-"})
	return reason == "", reason
}

// keyOf runs the rules and computes the key with a pooled canonicalizer.
func (c *Cache) keyOf(req *Request) (Key, Kind, string) {
	cz := c.canon.Get().(*canonicalizer)
	k, kind, reason := cz.keyOf(req, &c.rules)
	cz.release()
	c.canon.Put(cz)
	return k, kind, reason
}

// get reads the store; an error is a miss.
func (c *Cache) get(ctx context.Context, k Key) *Entry {
	e, err := c.store.Get(ctx, k)
	if err != nil {
		c.hooks.storeError("get")
		return nil
	}
	return e
}

func (c *Cache) hit(k Key, kind Kind, e *Entry, coalesced bool) Result {
	c.hooks.hit()
	if coalesced {
		c.hooks.coalesced()
	}
	return Result{Outcome: Hit, Key: k, Kind: kind, Entry: e, Coalesced: coalesced}
}

func (c *Cache) miss(k Key, kind Kind, f *flight) Result {
	c.hooks.miss()
	return Result{Outcome: Miss, Key: k, Kind: kind, Capture: &Capture{c: c, key: k, kind: kind, flight: f, limit: int(c.cfg.MaxEntryBytes)}}
}

// follow waits for f's answer (bounded by max_wait and ctx): a hit when it
// was stored, else a miss of the follower's own (no flight: it computes
// its answer alone).
func (c *Cache) follow(ctx context.Context, k Key, kind Kind, f *flight) (Result, error) {
	select {
	case <-f.done:
		if f.entry != nil {
			return c.hit(k, kind, f.entry, true), nil
		}
		return c.miss(k, kind, nil), nil
	default:
	}
	t := time.NewTimer(c.cfg.MaxWait)
	defer t.Stop()
	select {
	case <-f.done:
		if f.entry != nil {
			return c.hit(k, kind, f.entry, true), nil
		}
		return c.miss(k, kind, nil), nil
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-t.C:
		// The leader is too slow (or was never finished): this request
		// computes its own answer, and the next identical one leads.
		c.mu.Lock()
		if c.flights[k] == f {
			delete(c.flights, k)
			c.gen++
		}
		c.mu.Unlock()
		return c.miss(k, kind, nil), nil
	}
}

// settle ends a miss: e is its answer (nil when it is not stored). The
// followers get e at once; the flight stays visible until the store has e,
// so that a request arriving meanwhile replays it too.
func (c *Cache) settle(k Key, f *flight, e *Entry) {
	if f != nil && e == nil {
		c.endFlight(k, f)
		close(f.done)
	}
	if e == nil {
		return
	}
	if f != nil {
		f.entry = e
		close(f.done)
	}
	if !c.async {
		c.set(k, e)
		c.endFlight(k, f)
		return
	}
	select {
	case c.sets <- struct{}{}:
	default:
		c.hooks.storeError("set_dropped")
		c.endFlight(k, f)
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() { <-c.sets }()
		c.set(k, e)
		c.endFlight(k, f)
	}()
}

func (c *Cache) set(k Key, e *Entry) {
	// Not the request's context: the answer is whole, the client may be
	// gone; the store bounds its own call.
	if err := c.store.Set(context.Background(), k, e, c.cfg.TTL); err != nil {
		c.hooks.storeError("set")
		return
	}
	c.hooks.stored(len(e.Body))
}

func (c *Cache) endFlight(k Key, f *flight) {
	if f == nil {
		return
	}
	c.mu.Lock()
	if c.flights[k] == f {
		delete(c.flights, k)
		c.gen++
	}
	c.mu.Unlock()
}

// release drops a canonicalizer's hold on the request body and on buffers
// grown past 1 MiB, before it goes back to the pool.
func (c *canonicalizer) release() {
	c.in = nil
	const keep = 1 << 20
	if cap(c.arena) > keep {
		c.arena = nil
	}
	if cap(c.out) > keep {
		c.out = nil
	}
	if cap(c.nodes) > keep/32 {
		c.nodes = nil
	}
	if cap(c.stack) > keep/4 {
		c.stack = nil
	}
}
