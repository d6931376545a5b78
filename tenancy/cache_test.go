package tenancy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeStore serves GetKey from a map, counting lookups; gate, when set,
// holds every lookup until it is closed; fail makes lookups fail.
type fakeStore struct {
	mu      sync.Mutex
	keys    map[string]Key
	gets    atomic.Int64
	gate    chan struct{}
	started chan struct{} // gets a value when a lookup starts, if set
	fail    atomic.Bool
}

func newFakeStore(keys ...Key) *fakeStore {
	s := &fakeStore{keys: map[string]Key{}}
	for _, k := range keys {
		s.keys[k.ID] = k
	}
	return s
}

func (s *fakeStore) put(k Key) { s.mu.Lock(); s.keys[k.ID] = k; s.mu.Unlock() }
func (s *fakeStore) del(id string) {
	s.mu.Lock()
	delete(s.keys, id)
	s.mu.Unlock()
}

func (s *fakeStore) GetKey(ctx context.Context, id string) (Key, error) {
	s.gets.Add(1)
	if s.started != nil {
		s.started <- struct{}{}
	}
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return Key{}, ctx.Err()
		}
	}
	if s.fail.Load() {
		return Key{}, errors.New("store down")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.keys[id]
	if !ok {
		return Key{}, fmt.Errorf("key %s: %w", id, ErrNotFound)
	}
	return k, nil
}

func (s *fakeStore) CreateKey(context.Context, Key) (Key, error) { return Key{}, errors.ErrUnsupported }
func (s *fakeStore) ListKeys(context.Context) ([]Key, error)     { return nil, errors.ErrUnsupported }
func (s *fakeStore) DeleteKey(context.Context, string) error     { return errors.ErrUnsupported }
func (s *fakeStore) AddUsage(context.Context, []Usage) error     { return errors.ErrUnsupported }
func (s *fakeStore) Close() error                                { return nil }
func (s *fakeStore) Usage(context.Context, UsageQuery) ([]Usage, error) {
	return nil, errors.ErrUnsupported
}
func (s *fakeStore) UpdateKey(context.Context, string, KeyPatch) (Key, error) {
	return Key{}, errors.ErrUnsupported
}

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newTestKey(t testing.TB) (Key, string) {
	t.Helper()
	k, plain, err := NewKey("cached", now)
	if err != nil {
		t.Fatal(err)
	}
	return k, plain
}

func TestCacheHitAndTTL(t *testing.T) {
	k, _ := newTestKey(t)
	st := newFakeStore(k)
	clk := &clock{t: now}
	c := NewCache(st, CacheConfig{TTL: 5 * time.Second, Now: clk.now})
	ctx := t.Context()
	for range 3 {
		got, err := c.GetKey(ctx, k.ID)
		if err != nil || got.ID != k.ID {
			t.Fatalf("GetKey: %+v, %v", got, err)
		}
	}
	if n := st.gets.Load(); n != 1 {
		t.Errorf("%d lookups for 3 gets within the TTL, want 1", n)
	}
	// A change in the store shows after the TTL.
	k2 := k
	k2.Disabled = true
	st.put(k2)
	clk.add(4 * time.Second)
	if got, _ := c.GetKey(ctx, k.ID); got.Disabled {
		t.Error("the change showed before the TTL")
	}
	clk.add(time.Second)
	if got, _ := c.GetKey(ctx, k.ID); !got.Disabled {
		t.Error("the change did not show after the TTL")
	}
	if n := st.gets.Load(); n != 2 {
		t.Errorf("%d lookups, want 2", n)
	}
	s := c.Stats()
	if s.Hits != 3 || s.Lookups != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestCacheNegative(t *testing.T) {
	st := newFakeStore()
	clk := &clock{t: now}
	c := NewCache(st, CacheConfig{TTL: 5 * time.Second, NegativeTTL: time.Second, Now: clk.now})
	ctx := t.Context()
	for range 5 {
		if _, err := c.GetKey(ctx, "unknownid000"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetKey unknown: %v", err)
		}
	}
	if n := st.gets.Load(); n != 1 {
		t.Errorf("%d lookups for 5 gets of an unknown id, want 1", n)
	}
	// The key appears: seen once the negative entry expires.
	k, _ := newTestKey(t)
	k.ID = "unknownid000"
	st.put(k)
	if _, err := c.GetKey(ctx, k.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("before NegativeTTL: %v, want the cached not found", err)
	}
	clk.add(time.Second)
	if _, err := c.GetKey(ctx, k.ID); err != nil {
		t.Errorf("after NegativeTTL: %v", err)
	}
	if kk, unknown := c.Len(); kk != 1 || unknown != 0 {
		t.Errorf("Len = %d, %d; want 1, 0", kk, unknown)
	}
	// Deleted from the store: not found after the TTL.
	st.del(k.ID)
	clk.add(5 * time.Second)
	if _, err := c.GetKey(ctx, k.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("after deletion and TTL: %v", err)
	}
}

// A burst of requests for one id is one lookup.
func TestCacheSingleflight(t *testing.T) {
	k, plain := newTestKey(t)
	st := newFakeStore(k)
	st.gate = make(chan struct{})
	st.started = make(chan struct{}, 100)
	c := NewCache(st, CacheConfig{})
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Authenticate(t.Context(), plain); err != nil {
				errs <- err
			}
		}()
	}
	<-st.started
	time.Sleep(20 * time.Millisecond) // let the others pile up on the lookup in flight
	close(st.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Goroutines that came after the lookup finished hit the cache; the
	// ones during it shared it: either way one lookup.
	if got := st.gets.Load(); got != 1 {
		t.Errorf("%d lookups for %d concurrent requests, want 1", got, n)
	}
	if s := c.Stats(); s.Shared+s.Hits != n-1 {
		t.Errorf("stats %+v: want shared + hits = %d", s, n-1)
	}
	t.Logf("%d requests: %+v", n, c.Stats())
}

// A request that gives up does not cancel the lookup others wait on.
func TestCacheCallerCancel(t *testing.T) {
	k, _ := newTestKey(t)
	st := newFakeStore(k)
	st.gate = make(chan struct{})
	st.started = make(chan struct{}, 10)
	c := NewCache(st, CacheConfig{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { _, err := c.GetKey(ctx, k.ID); done <- err }()
	<-st.started
	other := make(chan error, 1)
	go func() { _, err := c.GetKey(t.Context(), k.ID); other <- err }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller: %v", err)
	}
	close(st.gate)
	if err := <-other; err != nil {
		t.Errorf("the other caller: %v", err)
	}
	if got := st.gets.Load(); got != 1 {
		t.Errorf("%d lookups, want 1", got)
	}
}

func TestCacheInvalidate(t *testing.T) {
	k, _ := newTestKey(t)
	st := newFakeStore(k)
	c := NewCache(st, CacheConfig{TTL: time.Hour, NegativeTTL: time.Hour})
	ctx := t.Context()
	if _, err := c.GetKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	// Revoked through the admin API: at once.
	st.del(k.ID)
	c.Invalidate(k.ID)
	if _, err := c.GetKey(ctx, k.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("after Invalidate: %v, want not found", err)
	}
	// Created again: the negative entry goes too.
	st.put(k)
	c.Invalidate(k.ID)
	if _, err := c.GetKey(ctx, k.ID); err != nil {
		t.Errorf("after Invalidate: %v", err)
	}
}

// A lookup in flight when Invalidate is called is not cached: it may have
// read the store before the write.
func TestCacheInvalidateDuringLookup(t *testing.T) {
	k, _ := newTestKey(t)
	st := newFakeStore(k)
	st.gate = make(chan struct{})
	st.started = make(chan struct{}, 10)
	c := NewCache(st, CacheConfig{TTL: time.Hour})
	done := make(chan Key, 1)
	go func() { got, _ := c.GetKey(t.Context(), k.ID); done <- got }()
	<-st.started
	k2 := k
	k2.Disabled = true
	st.put(k2) // (the gated lookup reads after this, but the point is the order)
	c.Invalidate(k.ID)
	close(st.gate)
	<-done
	st.gate = nil
	st.started = nil
	if got, err := c.GetKey(t.Context(), k.ID); err != nil || !got.Disabled {
		t.Errorf("after Invalidate during a lookup: %+v, %v; want the new key", got, err)
	}
	if n := st.gets.Load(); n != 2 {
		t.Errorf("%d lookups, want 2 (the first was not cached)", n)
	}
}

func TestCacheBounded(t *testing.T) {
	st := newFakeStore()
	c := NewCache(st, CacheConfig{MaxEntries: 10, MaxNegative: 5})
	ctx := t.Context()
	var keys []Key
	for range 50 {
		k, _ := newTestKey(t)
		st.put(k)
		keys = append(keys, k)
		if _, err := c.GetKey(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		c.GetKey(ctx, fmt.Sprintf("unknown%05d", i))
	}
	if kk, unknown := c.Len(); kk != 10 || unknown != 5 {
		t.Errorf("Len = %d, %d; want 10, 5", kk, unknown)
	}
	if e := c.Stats().Evictions; e != 40+45 {
		t.Errorf("%d evictions, want 85", e)
	}
	// Evicted keys are looked up again and still work.
	for _, k := range keys {
		if _, err := c.GetKey(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// When the store fails, entries are served for MaxStale past their TTL,
// then the error comes through; unknown ids are not served stale.
func TestCacheStaleOnError(t *testing.T) {
	k, _ := newTestKey(t)
	st := newFakeStore(k)
	clk := &clock{t: now}
	c := NewCache(st, CacheConfig{TTL: 5 * time.Second, MaxStale: 50 * time.Second, Now: clk.now})
	ctx := t.Context()
	if _, err := c.GetKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	st.fail.Store(true)
	clk.add(30 * time.Second)
	if got, err := c.GetKey(ctx, k.ID); err != nil || got.ID != k.ID {
		t.Errorf("stale within MaxStale: %v", err)
	}
	clk.add(30 * time.Second)
	if _, err := c.GetKey(ctx, k.ID); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotFound) {
		t.Errorf("past MaxStale: %v, want the store's error", err)
	}
	if _, err := c.GetKey(ctx, "otherid00000"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("unknown id with the store down: %v, want the store's error", err)
	}
	if c.Stats().Stale != 1 {
		t.Errorf("stats %+v", c.Stats())
	}
	// Back up: fresh again.
	st.fail.Store(false)
	if _, err := c.GetKey(ctx, k.ID); err != nil {
		t.Error(err)
	}
}

func TestAuthenticate(t *testing.T) {
	k, plain := newTestKey(t)
	st := newFakeStore(k)
	c := NewCache(st, CacheConfig{})
	ctx := t.Context()
	got, err := c.Authenticate(ctx, plain)
	if err != nil || got.ID != k.ID {
		t.Fatalf("Authenticate: %+v, %v", got, err)
	}
	// Same id, another secret: a forged key does not pass on a cached id.
	_, other := newTestKey(t)
	forged := plain[:len(KeyPrefix)+IDLen+1] + other[len(KeyPrefix)+IDLen+1:]
	if _, err := c.Authenticate(ctx, forged); !errors.Is(err, ErrInvalidKey) || HTTPStatus(err) != 401 {
		t.Errorf("forged: %v", err)
	}
	if _, err := c.Authenticate(ctx, other); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("unknown id: %v", err)
	}
	if _, err := c.Authenticate(ctx, "Bearer "+plain); !errors.Is(err, ErrMalformedKey) || HTTPStatus(err) != 401 {
		t.Errorf("malformed: %v", err)
	}
	if n := st.gets.Load(); n != 2 {
		t.Errorf("%d lookups, want 2 (malformed keys are not looked up)", n)
	}
	st.fail.Store(true)
	c.Invalidate(k.ID)
	if _, err := c.Authenticate(ctx, plain); !errors.Is(err, ErrUnavailable) || HTTPStatus(err) != 503 || !strings.Contains(err.Error(), "store down") {
		t.Errorf("store down, nothing cached: %v (status %d)", err, HTTPStatus(err))
	}
}

func BenchmarkCacheHit(b *testing.B) {
	k, _ := newTestKey(b)
	c := NewCache(newFakeStore(k), CacheConfig{TTL: time.Hour})
	ctx := context.Background()
	if _, err := c.GetKey(ctx, k.ID); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.GetKey(ctx, k.ID); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCacheHitParallel(b *testing.B) {
	st := newFakeStore()
	var ids []string
	for range 64 {
		k, _ := newTestKey(b)
		st.put(k)
		ids = append(ids, k.ID)
	}
	c := NewCache(st, CacheConfig{TTL: time.Hour})
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := c.GetKey(ctx, ids[i%len(ids)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// What the proxy pays per request to authenticate: parse, cache hit,
// verify (SHA-256 and a constant-time compare), and the Allows check.
func BenchmarkAuthenticate(b *testing.B) {
	k, plain := newTestKey(b)
	k.Models = []string{"a", "b", "c"}
	c := NewCache(newFakeStore(k), CacheConfig{TTL: time.Hour})
	ctx := context.Background()
	if _, err := c.Authenticate(ctx, plain); err != nil {
		b.Fatal(err)
	}
	at := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		got, err := c.Authenticate(ctx, plain)
		if err != nil {
			b.Fatal(err)
		}
		if err := got.Allows("c", at); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseAPIKey(b *testing.B) {
	_, plain := newTestKey(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ParseAPIKey(plain); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	k, plain := newTestKey(b)
	_, secret, _ := ParseAPIKey(plain)
	b.ReportAllocs()
	for b.Loop() {
		if !k.Verify(secret) {
			b.Fatal("no")
		}
	}
}
