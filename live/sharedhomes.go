package live

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// sharedHomes is homes shared through tenancy.redis by every gateway in
// front of the same engines: each stored response's replica, and with
// auth: keys its key, under KEY_PREFIX:resp:ID for sharedHomeTTL. A
// gateway that did not pass a response on reads its home there before it
// searches the replicas (locate.go); with auth: keys it is the only way to
// know the response's key, so a key's continuation through another gateway
// reaches its replica and another key's is refused.
//
// Writes never hold a request: each goes out on its own goroutine, at most
// maxHomeWrites at once (one more is dropped, counted); reads and writes
// are each bounded by tenancy.redis.timeout. While Redis fails, the
// gateway works from its own homes and searches as without it.
type sharedHomes struct {
	c       *redis.Client
	prefix  string
	timeout time.Duration
	slots   chan struct{}
	wg      sync.WaitGroup
	// failing is set from an outage's first error to the next success.
	failing atomic.Bool
	onError func(op string, err error) // counts (and logs an outage's first)
	onOK    func()                     // logs an outage's end
}

const (
	sharedHomeTTL = 24 * time.Hour
	maxHomeWrites = 64
)

// newSharedHomes connects to tenancy.redis when it has an address; nil
// otherwise.
func (s *Server) newSharedHomes() (*sharedHomes, error) {
	rc := s.cfg.Tenancy.Redis
	if rc.Address == "" {
		return nil, nil
	}
	c, err := newRedisClient(rc)
	if err != nil {
		return nil, err
	}
	h := &sharedHomes{c: c, prefix: rc.KeyPrefix + ":resp:", timeout: rc.Timeout, slots: make(chan struct{}, maxHomeWrites)}
	h.onError = func(op string, err error) {
		s.met.responseHomeErrors.WithLabelValues(op).Inc()
		if h.failing.CompareAndSwap(false, true) {
			s.log.Warn("redis response homes failing; stored responses are found by search meanwhile", "op", op, "error", err.Error())
		}
	}
	h.onOK = func() {
		if h.failing.CompareAndSwap(true, false) {
			s.log.Info("redis response homes reachable again")
		}
	}
	return h, nil
}

// put shares id's home, without waiting.
func (h *sharedHomes) put(id string, at home) {
	if h == nil {
		return
	}
	select {
	case h.slots <- struct{}{}:
	default:
		h.onError("put", errors.New("too many writes in flight"))
		return
	}
	h.wg.Go(func() {
		defer func() { <-h.slots }()
		ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
		defer cancel()
		if err := h.c.Set(ctx, h.prefix+id, at.model+"\n"+at.replica+"\n"+at.owner, sharedHomeTTL).Err(); err != nil {
			h.onError("put", err)
			return
		}
		h.onOK()
	})
}

// get reads id's home; false when no gateway shared it (or Redis failed).
func (h *sharedHomes) get(ctx context.Context, id string) (home, bool) {
	if h == nil {
		return home{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	v, err := h.c.Get(ctx, h.prefix+id).Result()
	switch {
	case errors.Is(err, redis.Nil):
		h.onOK()
		return home{}, false
	case err != nil:
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			h.onError("get", err)
		}
		return home{}, false
	}
	h.onOK()
	parts := strings.SplitN(v, "\n", 3)
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return home{}, false
	}
	return home{model: parts[0], replica: parts[1], owner: parts[2]}, true
}

// close waits for the writes in flight (each bounded) and closes the
// client.
func (h *sharedHomes) close() {
	if h == nil {
		return
	}
	h.wg.Wait()
	h.c.Close()
}
