package ledger

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"

	"github.com/inferrail/inferrail/router/gateway"
)

var (
	//go:embed prelude.lua
	preludeSrc string
	//go:embed try_add.lua
	tryAddSrc string
	//go:embed sync.lua
	syncSrc string
	//go:embed leave.lua
	leaveSrc string

	// One Script per operation, each the prelude and its own end: EVALSHA
	// by content hash, EVAL (which loads it) on NOSCRIPT, so a restarted
	// Redis or a SCRIPT FLUSH costs one extra round trip, and gateways of
	// two versions never run each other's code.
	tryAddScript = redis.NewScript(preludeSrc + tryAddSrc)
	syncScript   = redis.NewScript(preludeSrc + syncSrc)
	leaveScript  = redis.NewScript(preludeSrc + leaveSrc)
)

// Policy is what TryAdd does while Redis fails.
type Policy string

// The failure policies (Config.OnRedisError).
const (
	PolicyClosed Policy = "closed" // refuse: requests queue (the default)
	PolicyOpen   Policy = "open"   // admit, as if this gateway were alone
	PolicyLocal  Policy = "local"  // admit within this gateway's share, limit / gateways
)

// Defaults and bounds of Config.
const (
	DefaultKeyPrefix = "ir"
	DefaultLeaseTTL  = 10 * time.Second
	DefaultRefresh   = 250 * time.Millisecond
	DefaultTimeout   = 20 * time.Millisecond
	// MaxReplicas bounds the replica indices: a vector is one argument per
	// replica on every call.
	MaxReplicas = 4096
	// probeMin and probeMax bound the heartbeat's backoff while down.
	probeMin = 50 * time.Millisecond
	probeMax = time.Second
)

// Config configures a Redis ledger. Field names are the YAML keys; zero
// fields take their defaults. The Redis address is the caller's: it builds
// the client.
type Config struct {
	// KeyPrefix starts every key, naming the deployment (default "ir"):
	// keys are <key_prefix>:{ledger:<model>}:l, :v and :e.
	KeyPrefix string `yaml:"key_prefix" json:"key_prefix"`
	// GatewayID names this gateway in Redis (default: 12 random hex
	// digits, new at every start). When set (a pod's name, say) it must be
	// unique among the gateways alive at once: a gateway restarted under
	// the same id replaces its previous incarnation's reservations.
	GatewayID string `yaml:"gateway_id" json:"gateway_id"`
	// LeaseTTL is how long this gateway's reservations count without a
	// successful call (default 10s, from 100ms to 10m): a crashed or
	// partitioned gateway's reservations stop counting within it.
	LeaseTTL time.Duration `yaml:"lease_ttl" json:"lease_ttl"`
	// RefreshInterval is how often the heartbeat renews the lease and
	// refreshes the other gateways' reservations as Reserved sees them
	// (default 250ms; at most lease_ttl/3, at least 10ms). After Redis
	// comes up empty (a first start, a restart, lost data) nothing is
	// admitted for 2 x refresh_interval, the time every live gateway takes
	// to write its reservations back: every gateway of a deployment needs
	// the same value.
	RefreshInterval time.Duration `yaml:"refresh_interval" json:"refresh_interval"`
	// Timeout bounds each Redis call (default 20ms, from 1ms to
	// lease_ttl/3). It needs a client with ContextTimeoutEnabled, which
	// NewRedis checks.
	Timeout time.Duration `yaml:"timeout" json:"timeout"`
	// OnRedisError is the failure policy: closed (default), open or local.
	OnRedisError Policy `yaml:"on_redis_error" json:"on_redis_error"`
	// Gateways is how many gateways share the ledger (default 1): under
	// the local policy each keeps to limit / gateways.
	Gateways int `yaml:"gateways" json:"gateways"`
	// OnError, when set, is called with every failed Redis call (op is
	// try_add, add, heartbeat, refresh or leave), e.g. to count or log it.
	// It is called without the ledger's locks held, but possibly under the
	// core's: it must not block.
	OnError func(op string, err error) `yaml:"-" json:"-"`
}

// Stats counts the ledger's calls and decisions.
type Stats struct {
	Calls    uint64 // Redis calls made (successful or not)
	Errors   uint64 // failed calls
	Admitted uint64 // TryAdds Redis admitted
	Refused  uint64 // TryAdds Redis refused: another gateway took the room
	// RecoveryRefused counts the TryAdds refused because Redis's state was
	// fresh (within 2 x refresh_interval of the epoch).
	RecoveryRefused uint64
	// Closed, Open and Local count the TryAdds decided by the policy while
	// Redis was down: refused, admitted, and decided on the share
	// (LocalRefused of them refused).
	Closed, Open, Local, LocalRefused uint64
	// Recoveries counts the returns from down to up.
	Recoveries uint64
	// Down: calls on the request path do not go to Redis now (the last
	// call failed; the heartbeat probes). Recovering: the last reply came
	// within the recovery window of a fresh state.
	Down, Recovering bool
}

// State is a copy of the ledger's view, per replica index, for status
// pages and tests.
type State struct {
	// Own is this gateway's reservations (exact), Others the other live
	// gateways' as of the last reply, Peak the largest total (every
	// gateway's) that any of this ledger's replies showed after its write.
	Own, Others, Peak []int
	Down, Recovering  bool
}

// Redis is one served model's ledger shared by every gateway through one
// Redis (or one slot of a Redis Cluster), a gateway.Reserver. It is safe for
// concurrent use; a core calls it under its own lock. TryAdd and Add are
// one EVALSHA each, bounded by Config.Timeout; Reserved is never a call.
type Redis struct {
	c     redis.Scripter
	cfg   Config
	keys  []string
	id    string
	nonce string
	ttl   int64 // µs
	// window is the recovery window (µs): 2 x refresh_interval.
	window int64

	// call serialises this ledger's Redis calls, so that they are sent
	// in the order of their sequence numbers. It is taken before mu.
	call sync.Mutex
	args []any // the call's arguments, reused under call

	mu         sync.Mutex // guards what follows; never held across a call
	own        []int
	others     []int
	peak       []int
	seq        uint64
	down       bool
	recovering bool
	closed     bool

	wake  chan struct{} // a call failed: the heartbeat probes soon
	freed chan struct{}
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once

	calls, errs, admitted, refused, recoveryRefused       atomic.Uint64
	fbClosed, fbOpen, fbLocal, fbLocalRefused, recoveries atomic.Uint64
}

var _ gateway.Reserver = (*Redis)(nil)

func invalid(format string, args ...any) error {
	return fmt.Errorf("ledger: "+format, args...)
}

// NewRedis returns model's ledger on c (a *redis.Client, *redis.ClusterClient
// or anything that runs scripts) and starts its heartbeat, which Close stops.
// It makes no call first: a Redis that is down at startup is the failure
// policy's business, like one that goes down later.
func NewRedis(c redis.Scripter, model string, cfg Config) (*Redis, error) {
	if c == nil {
		return nil, invalid("nil redis client")
	}
	if model == "" || strings.ContainsAny(model, "{}") || hasControl(model) {
		return nil, invalid("model %q must be non-empty, without braces or control characters", model)
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = DefaultKeyPrefix
	}
	if strings.ContainsAny(cfg.KeyPrefix, "{}") || hasControl(cfg.KeyPrefix) {
		return nil, invalid("key_prefix %q contains a brace or a control character", cfg.KeyPrefix)
	}
	if len(cfg.GatewayID) > 128 || hasControl(cfg.GatewayID) {
		return nil, invalid("gateway_id %q must be at most 128 bytes, without control characters", cfg.GatewayID)
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.LeaseTTL < 100*time.Millisecond || cfg.LeaseTTL > 10*time.Minute {
		return nil, invalid("lease_ttl %v is outside [100ms, 10m]", cfg.LeaseTTL)
	}
	if cfg.RefreshInterval == 0 {
		cfg.RefreshInterval = min(DefaultRefresh, cfg.LeaseTTL/3)
	}
	if cfg.RefreshInterval < 10*time.Millisecond || cfg.RefreshInterval > cfg.LeaseTTL/3 {
		return nil, invalid("refresh_interval %v is outside [10ms, lease_ttl/3 = %v]", cfg.RefreshInterval, cfg.LeaseTTL/3)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = min(DefaultTimeout, cfg.LeaseTTL/3)
	}
	if cfg.Timeout < time.Millisecond || cfg.Timeout > cfg.LeaseTTL/3 {
		return nil, invalid("timeout %v is outside [1ms, lease_ttl/3 = %v]", cfg.Timeout, cfg.LeaseTTL/3)
	}
	switch cfg.OnRedisError {
	case "":
		cfg.OnRedisError = PolicyClosed
	case PolicyClosed, PolicyOpen, PolicyLocal:
	default:
		return nil, invalid("on_redis_error %q is not closed, open or local", cfg.OnRedisError)
	}
	if cfg.Gateways < 0 || cfg.Gateways > 10000 {
		return nil, invalid("gateways %d is outside [0, 10000]", cfg.Gateways)
	}
	if cfg.Gateways == 0 {
		cfg.Gateways = 1
	}
	if !contextTimeouts(c) {
		return nil, invalid("the redis client needs ContextTimeoutEnabled: true, or timeout cannot bound a call")
	}
	nonce := randomHex(8)
	if cfg.GatewayID == "" {
		cfg.GatewayID = randomHex(6)
	}
	pre := cfg.KeyPrefix + ":{ledger:" + model + "}:"
	r := &Redis{
		c:      c,
		cfg:    cfg,
		keys:   []string{pre + "l", pre + "v", pre + "e"},
		id:     cfg.GatewayID,
		nonce:  nonce,
		ttl:    cfg.LeaseTTL.Microseconds(),
		window: 2 * cfg.RefreshInterval.Microseconds(),
		wake:   make(chan struct{}, 1),
		freed:  make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	go r.loop()
	return r, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand's contract)
	return hex.EncodeToString(b)
}

func hasControl(s string) bool {
	return strings.ContainsFunc(s, unicode.IsControl)
}

func contextTimeouts(c redis.Scripter) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true // unknown implementations: their business
}

// ID is this gateway's id in Redis.
func (r *Redis) ID() string { return r.id }

// Keys are the ledger's Redis keys: leases, vectors, epoch. For tools and
// tests.
func (r *Redis) Keys() []string { return append([]string(nil), r.keys...) }

// Freed receives (coalesced, never blocking the ledger) when a reply shows
// that other gateways hold less on some replica than the previous one did,
// or when Redis answers again after an outage: a request this gateway
// queued may fit now, so the owner should let the core's queue try again
// (Core.Poke under its lock). Nothing in the core waits on it.
func (r *Redis) Freed() <-chan struct{} { return r.freed }

// Stats returns the counters.
func (r *Redis) Stats() Stats {
	r.mu.Lock()
	down, rec := r.down, r.recovering
	r.mu.Unlock()
	return Stats{
		Calls: r.calls.Load(), Errors: r.errs.Load(), Admitted: r.admitted.Load(), Refused: r.refused.Load(), RecoveryRefused: r.recoveryRefused.Load(),
		Closed: r.fbClosed.Load(), Open: r.fbOpen.Load(), Local: r.fbLocal.Load(), LocalRefused: r.fbLocalRefused.Load(),
		Recoveries: r.recoveries.Load(), Down: down, Recovering: rec,
	}
}

// State returns a copy of the ledger's view.
func (r *Redis) State() State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return State{Own: clone(r.own), Others: clone(r.others), Peak: clone(r.peak), Down: r.down, Recovering: r.recovering}
}

func clone(s []int) []int { return append([]int{}, s...) }

func at(s []int, i int) int {
	if i < 0 || i >= len(s) {
		return 0
	}
	return s[i]
}

func grow(s []int, n int) []int {
	for len(s) < n {
		s = append(s, 0)
	}
	return s
}

// Reserved implements gateway.Ledger from memory: this gateway's own blocks
// on replica plus the other gateways' as of the last reply (only its own
// while Redis is down under the open and local policies).
func (r *Redis) Reserved(replica int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	own := at(r.own, replica)
	if r.closed || (r.down && r.cfg.OnRedisError != PolicyClosed) {
		return own
	}
	return own + at(r.others, replica)
}

// Add implements gateway.Ledger: this gateway's reservation on replica
// changes by delta at once (never below 0) and Redis learns it by one sync
// call, or by the first call after an outage. A replica index outside
// [0, MaxReplicas) is ignored.
func (r *Redis) Add(replica, delta int) {
	if replica < 0 || replica >= MaxReplicas || delta == 0 {
		return
	}
	r.mu.Lock()
	r.own = grow(r.own, replica+1)
	r.own[replica] = max(0, r.own[replica]+delta)
	skip := r.down || r.closed
	r.mu.Unlock()
	if skip {
		return // the heartbeat writes it when Redis answers again
	}
	_ = r.sync(context.Background(), "add")
}

// TryAdd implements gateway.Reserver with one try_add script: weight blocks
// are reserved on replica if its total over every live gateway is 0 before
// or at most limit after. While Redis is down the policy decides. A
// negative weight or a replica index outside [0, MaxReplicas) is refused.
func (r *Redis) TryAdd(replica, weight, limit int) bool {
	if replica < 0 || replica >= MaxReplicas || weight < 0 {
		return false
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return false
	}
	if r.down {
		defer r.mu.Unlock()
		return r.fallbackLocked(replica, weight, limit)
	}
	r.mu.Unlock()

	r.call.Lock()
	defer r.call.Unlock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return false
	}
	if r.down { // a call that failed meanwhile
		defer r.mu.Unlock()
		return r.fallbackLocked(replica, weight, limit)
	}
	sent := r.argsLocked(replica, weight, limit)
	r.mu.Unlock()

	v, err := r.run(tryAddScript)
	r.mu.Lock()
	if err == nil && v[0] < 0 {
		err = errStale
	}
	if err != nil {
		ok := r.fallbackLocked(replica, weight, limit)
		r.mu.Unlock()
		r.fail("try_add", err)
		return ok
	}
	ok := v[0] == 1
	switch {
	case ok:
		r.own = grow(r.own, replica+1)
		r.own[replica] += weight
		sent = grow(sent, replica+1)
		sent[replica] += weight
		r.admitted.Add(1)
	case v[1] == 1:
		r.recoveryRefused.Add(1)
	default:
		r.refused.Add(1)
	}
	r.applyLocked(v, sent)
	r.mu.Unlock()
	return ok
}

var errStale = errors.New("stale write: a newer write of this gateway is stored")

// fallbackLocked is the policy's decision while Redis is down.
func (r *Redis) fallbackLocked(replica, weight, limit int) bool {
	switch r.cfg.OnRedisError {
	case PolicyOpen:
		r.fbOpen.Add(1)
	case PolicyLocal:
		r.fbLocal.Add(1)
		own := at(r.own, replica)
		if own != 0 && own+weight > max(1, limit/r.cfg.Gateways) {
			r.fbLocalRefused.Add(1)
			return false
		}
	default:
		r.fbClosed.Add(1)
		return false
	}
	r.own = grow(r.own, replica+1)
	r.own[replica] += weight
	return true
}

// argsLocked fills r.args for one call and returns the vector it sends (a
// copy of own).
func (r *Redis) argsLocked(replica, weight, limit int) []int {
	r.seq++
	sent := clone(r.own)
	n := len(sent)
	if cap(r.args) < 9+n {
		r.args = make([]any, 0, 9+n+8)
	}
	r.args = append(r.args[:0], r.ttl, r.id, r.nonce, r.seq, r.window, replica, weight, limit, n)
	for _, b := range sent {
		r.args = append(r.args, b)
	}
	return sent
}

// run is one script call, bounded by the timeout; call must be held.
func (r *Redis) run(s *redis.Script) ([]int64, error) {
	r.calls.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
	defer cancel()
	v, err := s.Run(ctx, r.c, r.keys, r.args...).Int64Slice()
	if err == nil && (len(v) < 2 || v[0] < -1 || v[0] > 1) {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	return v, err
}

// applyLocked takes a reply's view of the other gateways; sent is what this
// gateway's vector in Redis is now.
func (r *Redis) applyLocked(v []int64, sent []int) {
	if r.down {
		r.down = false
		r.recoveries.Add(1)
		r.signalFreed()
	}
	if r.recovering && v[1] == 0 {
		r.signalFreed() // the recovery window ended: admissions resume
	}
	r.recovering = v[1] == 1
	others := v[2:]
	n := max(len(others), len(r.others))
	r.others = grow(r.others, n)
	freed := false
	for j := range n {
		o := 0
		if j < len(others) {
			o = int(others[j])
		}
		if o < r.others[j] {
			freed = true
		}
		r.others[j] = o
	}
	r.peak = grow(r.peak, max(n, len(sent)))
	for j := range r.peak {
		r.peak[j] = max(r.peak[j], at(r.others, j)+at(sent, j))
	}
	if freed {
		r.signalFreed()
	}
}

func (r *Redis) signalFreed() {
	select {
	case r.freed <- struct{}{}:
	default:
	}
}

// fail counts a failed call, marks the ledger down and wakes the heartbeat
// to probe; mu must not be held.
func (r *Redis) fail(op string, err error) {
	r.errs.Add(1)
	r.mu.Lock()
	r.down = true
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	if r.cfg.OnError != nil {
		r.cfg.OnError(op, fmt.Errorf("ledger: redis %s: %w", op, err))
	}
}

// sync writes this gateway's vector and renews its lease: one sync script.
func (r *Redis) sync(ctx context.Context, op string) error {
	r.call.Lock()
	defer r.call.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ledger: %s: %w", op, err)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return errClosed
	}
	sent := r.argsLocked(0, 0, 0)
	r.mu.Unlock()
	v, err := r.run(syncScript)
	if err == nil && v[0] < 0 {
		err = errStale
	}
	if err != nil {
		r.fail(op, err)
		return fmt.Errorf("ledger: redis %s: %w", op, err)
	}
	r.mu.Lock()
	r.applyLocked(v, sent)
	r.mu.Unlock()
	return nil
}

var errClosed = errors.New("ledger: closed")

// Refresh runs the heartbeat now: this gateway's vector is written, its
// lease renewed, and the other gateways' reservations as Reserved sees them
// refreshed. It also ends an outage at once when Redis answers.
func (r *Redis) Refresh(ctx context.Context) error { return r.sync(ctx, "refresh") }

// loop is the heartbeat: a sync at once (so that a new gateway shows up
// and a fresh state's recovery window starts early), then every refresh
// interval, and while down a probe with backoff. It ends when stop is
// closed.
func (r *Redis) loop() {
	defer close(r.done)
	t := time.NewTimer(0)
	defer t.Stop()
	backoff := time.Duration(0)
	for {
		select {
		case <-r.stop:
			return
		case <-r.wake:
			if backoff == 0 { // the first failure: probe soon, not a period later
				backoff = probeMin
				t.Reset(backoff)
			}
			continue
		case <-t.C:
		}
		if err := r.sync(context.Background(), "heartbeat"); err != nil {
			if errors.Is(err, errClosed) {
				return
			}
			backoff = min(max(2*backoff, probeMin), min(r.cfg.RefreshInterval, probeMax))
			t.Reset(backoff)
			continue
		}
		backoff = 0
		t.Reset(r.cfg.RefreshInterval)
	}
}

// halt stops the heartbeat without leaving: as if the process had died.
// Tests only. It waits at most a few timeouts for a call in progress.
func (r *Redis) halt() {
	r.once.Do(func() { close(r.stop) })
	select {
	case <-r.done:
	case <-time.After(4*r.cfg.Timeout + time.Second):
	}
}

// Close stops the heartbeat and deletes this gateway's reservations from
// Redis (one leave script), so they stop counting at once; if that call
// fails they expire within lease_ttl, and the error says so. Afterwards
// TryAdd refuses, Add changes only the local count and Reserved shows it.
// Close is idempotent; later calls return nil.
func (r *Redis) Close() error {
	r.halt()
	r.call.Lock()
	defer r.call.Unlock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.argsLocked(0, 0, 0)
	r.mu.Unlock()
	if _, err := r.run(leaveScript); err != nil {
		r.errs.Add(1)
		if r.cfg.OnError != nil {
			r.cfg.OnError("leave", fmt.Errorf("ledger: redis leave: %w", err))
		}
		return fmt.Errorf("ledger: redis leave (this gateway's reservations expire within lease_ttl %v): %w", r.cfg.LeaseTTL, err)
	}
	return nil
}
