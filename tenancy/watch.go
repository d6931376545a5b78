package tenancy

import "context"

// KeyWatcher is a Store that announces key changes as they commit, made
// by any gateway or by hand: the Postgres store LISTENs for its table's
// trigger. A gateway's Cache follows it (Follow), so that a key revoked,
// disabled or changed through another gateway stops or changes here at
// once instead of within the cache's TTL.
type KeyWatcher interface {
	// WatchKeys calls changed with the id of each key created, changed,
	// revoked or deleted, until ctx ends; then it returns nil. It calls
	// changed with "" each time the watch starts and starts again (a lost
	// connection is retried with backoff): changes may have been missed
	// meanwhile, so every key is to be read again. state is called with
	// the error when the watch is lost, and with nil when it is
	// established.
	WatchKeys(ctx context.Context, changed func(id string), state func(err error)) error
}

// Follow applies w's announcements to c until ctx ends: a key's id drops
// what c holds for it (Invalidate), "" makes everything stale
// (ExpireAll). state is as for WatchKeys.
func (c *Cache) Follow(ctx context.Context, w KeyWatcher, state func(err error)) error {
	return w.WatchKeys(ctx, func(id string) {
		if id == "" {
			c.ExpireAll()
			return
		}
		c.Invalidate(id)
	}, state)
}

// ExpireAll makes every key c holds stale, so that the next request for
// each reads the store, and forgets the unknown ids. The keys are kept
// for a store that fails meanwhile: served up to MaxStale past their TTL,
// as any stale key (a watch that comes back to a flapping store must not
// turn its outage into refusals). A lookup in flight still answers its
// waiters but is not cached.
func (c *Cache) ExpireAll() {
	now := c.cfg.Now()
	c.mu.Lock()
	c.gen.Add(1)
	for id, e := range c.pos {
		if now.Before(e.fresh) {
			// A new entry: readers hold the old one outside the lock.
			c.pos[id] = &cacheEntry{key: e.key, fresh: now, staleBy: e.staleBy}
		}
	}
	clear(c.neg)
	c.mu.Unlock()
}
