package live

import (
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/tenancy/ledger"
)

// The shared ledger (tenancy.ledger.backend: redis): every model's gateway
// core reserves KV blocks in Redis, checked and reserved atomically against
// every gateway's reservations (tenancy/ledger), so gateways in front of
// the same engines admit together as one would. Another gateway's release
// wakes this core's queue through the ledger's Freed channel.

// sharedLedgers holds the Redis client and each model's ledger.
type sharedLedgers struct {
	client *redis.Client
	byName map[string]*ledger.Redis
	// failing is set from an outage's first error to the next success.
	failing atomic.Bool
}

// newSharedLedgers connects to tenancy.redis when the ledger is shared;
// nil otherwise.
func (s *Server) newSharedLedgers() (*sharedLedgers, error) {
	if s.cfg.Tenancy.Ledger.Backend != "redis" {
		return nil, nil
	}
	c, err := newRedisClient(s.cfg.Tenancy.Redis)
	if err != nil {
		return nil, err
	}
	return &sharedLedgers{client: c, byName: map[string]*ledger.Redis{}}, nil
}

// forModel is model's ledger: nil (the core's own) unless it is shared.
func (l *sharedLedgers) forModel(s *Server, model string) (gateway.Ledger, error) {
	if l == nil {
		return nil, nil
	}
	lc, rc := s.cfg.Tenancy.Ledger, s.cfg.Tenancy.Redis
	r, err := ledger.NewRedis(l.client, model, ledger.Config{
		KeyPrefix: rc.KeyPrefix, GatewayID: lc.GatewayID, LeaseTTL: lc.LeaseTTL, RefreshInterval: lc.RefreshInterval,
		Timeout: rc.Timeout, OnRedisError: ledger.Policy(lc.OnRedisError), Gateways: rc.Gateways,
		OnError: func(op string, err error) { l.failed(s, model, op, err) },
	})
	if err != nil {
		return nil, fmt.Errorf("tenancy.ledger: %w", err)
	}
	l.byName[model] = r
	return r, nil
}

// failed counts a failed ledger call and logs the first of an outage.
func (l *sharedLedgers) failed(s *Server, model, op string, err error) {
	if s.met != nil {
		s.met.ledgerErrors.WithLabelValues(model, op).Inc()
	}
	if l.failing.CompareAndSwap(false, true) {
		s.log.Warn("redis ledger failing; tenancy.ledger.on_redis_error applies", "model", model, "op", op,
			"policy", s.cfg.Tenancy.Ledger.OnRedisError, "error", err.Error())
	}
}

// watch pokes m's core whenever its ledger says room was freed elsewhere
// (another gateway released, Redis came back), until stop.
func (l *sharedLedgers) watch(m *model, stop <-chan struct{}) {
	r := l.byName[m.name]
	if r == nil {
		return
	}
	for {
		select {
		case <-stop:
			return
		case <-r.Freed():
			if l.failing.Load() && !r.Stats().Down {
				l.failing.Store(false)
			}
			m.poke()
		}
	}
}

// close releases this gateway's reservations (bounded by each call's
// timeout) and closes the client.
func (l *sharedLedgers) close() {
	if l == nil {
		return
	}
	for _, r := range l.byName {
		r.Close()
	}
	l.client.Close()
}
