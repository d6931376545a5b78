package tenancy

import (
	"context"
	"errors"
	"testing"
	"time"
)

// scriptWatcher announces ids given on a channel.
type scriptWatcher struct{ ids chan string }

func (w scriptWatcher) WatchKeys(ctx context.Context, changed func(string), state func(error)) error {
	state(nil)
	for {
		select {
		case <-ctx.Done():
			return nil
		case id := <-w.ids:
			changed(id)
		}
	}
}

// A followed cache drops a key announced as changed, and makes everything
// stale when the watch starts again (""): read again, but still served
// while the store fails; the others stay cached.
func TestCacheFollow(t *testing.T) {
	k1, _ := newTestKey(t)
	k2, _ := newTestKey(t)
	st := newFakeStore(k1, k2)
	c := NewCache(st, CacheConfig{TTL: time.Hour, NegativeTTL: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	w := scriptWatcher{ids: make(chan string)}
	done := make(chan error, 1)
	go func() { done <- c.Follow(ctx, w, func(error) {}) }()
	for _, k := range []Key{k1, k2} {
		if _, err := c.GetKey(t.Context(), k.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.GetKey(t.Context(), "nosuch"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	gets := st.gets.Load()
	st.del(k1.ID)
	w.ids <- k1.ID
	w.ids <- "sync" // the channel is unbuffered: k1's announcement was applied
	if _, err := c.GetKey(t.Context(), k1.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a key announced revoked: %v, want not found", err)
	}
	if _, err := c.GetKey(t.Context(), k2.ID); err != nil || st.gets.Load() != gets+1 {
		t.Fatalf("another key: %v, %d lookups, want it cached (%d)", err, st.gets.Load(), gets+1)
	}
	// The watch starts again: everything is read again, unknown ids too;
	// a key the store cannot answer for meanwhile is served stale.
	st.put(Key{ID: "nosuch", Name: "now known", SecretHash: k2.SecretHash})
	w.ids <- ""
	w.ids <- "sync"
	if _, unknown := c.Len(); unknown != 0 {
		t.Fatalf("after \"\": %d unknown ids held; want none", unknown)
	}
	if _, err := c.GetKey(t.Context(), "nosuch"); err != nil {
		t.Fatalf("an id unknown before: %v", err)
	}
	gets = st.gets.Load()
	st.fail.Store(true)
	if got, err := c.GetKey(t.Context(), k2.ID); err != nil || got.ID != k2.ID || st.gets.Load() != gets+1 {
		t.Fatalf("a key made stale, the store failing: %v, %d lookups (want 1 and the key served stale)", err, st.gets.Load()-gets)
	}
	st.fail.Store(false)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Follow: %v", err)
	}
}
