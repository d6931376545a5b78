package limit

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed reserve.lua
	reserveSrc string
	//go:embed finish.lua
	finishSrc string
	//go:embed renew.lua
	renewSrc string

	// One Script each: EVALSHA by content hash, EVAL (which loads it) on
	// NOSCRIPT. A changed script has a new hash, so gateways of two versions
	// never run each other's code during a rolling deploy.
	reserveScript = redis.NewScript(reserveSrc)
	finishScript  = redis.NewScript(finishSrc)
	renewScript   = redis.NewScript(renewSrc)
)

// RedisConfig configures Redis. Field names are the YAML keys.
type RedisConfig struct {
	Config `yaml:",inline" json:",inline"`
	// KeyPrefix starts every key (default "ir").
	KeyPrefix string `yaml:"key_prefix" json:"key_prefix"`
	// HashTag is the Redis Cluster hash tag every key carries (default
	// "rl"): keys are <key_prefix>:{<hash_tag>}:r:<bucket id> and
	// <key_prefix>:{<hash_tag>}:c:<bucket id>, all in one slot.
	HashTag string `yaml:"hash_tag" json:"hash_tag"`
	// OnRedisError is the failure policy: closed (default), open or local.
	OnRedisError Policy `yaml:"on_redis_error" json:"on_redis_error"`
	// Gateways is how many gateways share the limits (default 1): under
	// the local policy each enforces limit/gateways (at least 1).
	Gateways int `yaml:"gateways" json:"gateways"`
	// Timeout bounds each Redis call (default 20ms). It needs a client
	// with ContextTimeoutEnabled, which NewRedis checks.
	Timeout time.Duration `yaml:"timeout" json:"timeout"`
	// OnError, when set, is called with every Redis error (op is reserve,
	// finish or renew), e.g. to count it in Prometheus or log it. It must
	// not block.
	OnError func(op string, err error) `yaml:"-" json:"-"`
}

// RedisStats counts Redis errors and the decisions the policy made.
type RedisStats struct {
	Errors uint64 // every failed call: reserve, finish, renew
	Closed uint64 // reserves refused as limiter_unavailable
	Open   uint64 // reserves admitted by the open policy
	Local  uint64 // reserves decided by the local fallback
}

// Redis is the Limiter shared by every gateway through one Redis (or one
// slot of a Redis Cluster). Each Reserve, Finish and Renew is one EVALSHA;
// Finish without leases and without a TPM correction is no call at all.
type Redis struct {
	c        redis.Scripter
	cfg      RedisConfig
	pre      string // "<key_prefix>:{<hash_tag>}:"
	window   int64  // µs
	ttl      int64  // µs
	fallback *Local
	instance string // lease members: instance + sequence
	seq      atomic.Uint64
	offset   atomic.Int64 // µs added to the server's TIME: tests only

	errs, closed, open, local atomic.Uint64
}

var _ Limiter = (*Redis)(nil)

// NewRedis returns a Redis limiter on c (a *redis.Client, *redis.ClusterClient
// or anything that runs scripts). Zero fields of cfg take their defaults.
// It makes no call: a Redis that is down at startup is the failure policy's
// business, like one that goes down later.
func NewRedis(c redis.Scripter, cfg RedisConfig) (*Redis, error) {
	if c == nil {
		return nil, invalid("nil redis client")
	}
	base, err := cfg.Config.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.Config = base
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = "ir"
	}
	if cfg.HashTag == "" {
		cfg.HashTag = "rl"
	}
	if strings.ContainsAny(cfg.KeyPrefix, "{}") {
		return nil, invalid("key_prefix %q contains a brace", cfg.KeyPrefix)
	}
	if strings.ContainsAny(cfg.HashTag, "{}") {
		return nil, invalid("hash_tag %q contains a brace", cfg.HashTag)
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
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Timeout < time.Millisecond || cfg.Timeout > 10*time.Second {
		return nil, invalid("timeout %v is outside [1ms, 10s]", cfg.Timeout)
	}
	if cfg.Window%time.Microsecond != 0 || cfg.LeaseTTL%time.Microsecond != 0 {
		return nil, invalid("window and lease_ttl must be whole microseconds")
	}
	if !contextTimeouts(c) {
		return nil, invalid("the redis client needs ContextTimeoutEnabled: true, or timeout cannot bound a call")
	}
	fb, err := NewLocal(cfg.Config)
	if err != nil {
		return nil, err
	}
	var id [6]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand's contract)
	return &Redis{
		c:        c,
		cfg:      cfg,
		pre:      cfg.KeyPrefix + ":{" + cfg.HashTag + "}:",
		window:   cfg.Window.Microseconds(),
		ttl:      cfg.LeaseTTL.Microseconds(),
		fallback: fb,
		instance: hex.EncodeToString(id[:]) + ":",
	}, nil
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

// Stats returns the error and fallback counters.
func (r *Redis) Stats() RedisStats {
	return RedisStats{Errors: r.errs.Load(), Closed: r.closed.Load(), Open: r.open.Load(), Local: r.local.Load()}
}

// Key is the Redis key of a bucket's levels; leases are under the same key
// with "c:" for "r:". For tools and tests.
func (r *Redis) Key(bucketID string) string { return r.pre + "r:" + bucketID }

func (r *Redis) micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// Reserve implements Limiter: one EVALSHA of reserve.lua over every bucket.
func (r *Redis) Reserve(ctx context.Context, req Request) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("limit: reserve: %w", err)
	}
	if err := req.validate(); err != nil {
		return Decision{}, err
	}
	if d, ok := req.tooLarge(); ok {
		return d, nil
	}
	n := len(req.Buckets)
	if n == 0 {
		return Decision{Allowed: true, At: time.Now(), Reservation: &Reservation{kind: kindNone}}, nil
	}
	leased := req.leased()
	member := ""
	if leased {
		member = r.instance + strconv.FormatUint(r.seq.Add(1), 36)
	}
	keys := make([]string, 2*n)
	args := make([]any, 6+3*n)
	args[0], args[1], args[2], args[3], args[4], args[5] = r.offset.Load(), r.window, r.ttl, member, req.Tokens, n
	for i := range req.Buckets {
		b := &req.Buckets[i]
		keys[2*i] = r.pre + "r:" + b.ID
		keys[2*i+1] = r.pre + "c:" + b.ID
		args[6+3*i], args[7+3*i], args[8+3*i] = b.RPM, b.TPM, b.MaxConcurrency
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	v, err := reserveScript.Run(cctx, r.c, keys, args...).Int64Slice()
	cancel()
	if err == nil && (len(v) != 8 || v[0] < 0 || v[0] > 3 || (v[0] > 0 && (v[1] < 1 || v[1] > int64(n)))) {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return Decision{}, fmt.Errorf("limit: reserve: %w", cerr)
		}
		return r.fail(&req, err), nil
	}
	b0 := &req.Buckets[0]
	d := Decision{At: time.UnixMicro(v[3])}
	if b0.RPM > 0 {
		d.Requests = Quota{Limit: b0.RPM, Remaining: int(v[4]), Reset: r.micros(v[5])}
	}
	if b0.TPM > 0 {
		d.Tokens = Quota{Limit: b0.TPM, Remaining: int(v[6]), Reset: r.micros(v[7])}
	}
	if v[0] != 0 {
		d.Reason = [...]Reason{1: ReasonRPM, 2: ReasonTPM, 3: ReasonConcurrency}[v[0]]
		d.Bucket = req.Buckets[v[1]-1].ID
		d.RetryAfter = r.micros(v[2])
		return d, nil
	}
	res := &Reservation{kind: kindRedis, owner: r, tokens: req.Tokens, member: member, keys: keys, ttl: r.cfg.LeaseTTL, leased: leased}
	res.setBuckets(req.Buckets)
	d.Allowed, d.Reservation = true, res
	return d, nil
}

// fail counts a Redis error and applies the policy to req.
func (r *Redis) fail(req *Request, err error) Decision {
	r.noteErr("reserve", err)
	switch r.cfg.OnRedisError {
	case PolicyOpen:
		r.open.Add(1)
		return Decision{Allowed: true, At: time.Now(), Fallback: PolicyOpen, Reservation: &Reservation{kind: kindOpen}}
	case PolicyLocal:
		r.local.Add(1)
		sh := Request{Buckets: make([]Bucket, len(req.Buckets)), Tokens: req.Tokens}
		for i, b := range req.Buckets {
			b.RPM = share(b.RPM, r.cfg.Gateways)
			b.TPM = share(b.TPM, r.cfg.Gateways)
			b.MaxConcurrency = share(b.MaxConcurrency, r.cfg.Gateways)
			sh.Buckets[i] = b
			// A request that fits the whole limit but not this gateway's
			// share is charged the share now and the rest at Finish (debt),
			// rather than refused as too_large.
			if b.TPM > 0 && sh.Tokens > b.TPM {
				sh.Tokens = b.TPM
			}
		}
		d := r.fallback.reserve(&sh, sh.Tokens)
		d.Fallback = PolicyLocal
		return d
	default:
		r.closed.Add(1)
		return Decision{Reason: ReasonUnavailable, RetryAfter: concurrencyRetry, At: time.Now(), Fallback: PolicyClosed}
	}
}

func (r *Redis) noteErr(op string, err error) {
	r.errs.Add(1)
	if r.cfg.OnError != nil {
		r.cfg.OnError(op, fmt.Errorf("limit: redis %s: %w", op, err))
	}
}

// own sorts a reservation: handled (done, err) or to be run against Redis.
func (r *Redis) own(res *Reservation) (bool, error) {
	if res == nil {
		return true, errNilReservation
	}
	switch {
	case res.kind == kindNone || res.kind == kindOpen:
		return true, nil
	case res.kind == kindLocal && res.owner == r.fallback:
		return true, nil
	case res.kind != kindRedis || res.owner != r:
		return true, errForeign()
	}
	return false, nil
}

// Finish implements Limiter: one EVALSHA of finish.lua, or none when there
// is neither a lease to release nor a TPM correction.
func (r *Redis) Finish(ctx context.Context, res *Reservation, usedTokens int) error {
	if done, err := r.own(res); done {
		if err == nil && res.kind == kindLocal {
			return r.fallback.Finish(ctx, res, usedTokens)
		}
		if err == nil {
			res.done.Store(true)
		}
		return err
	}
	if !res.done.CompareAndSwap(false, true) {
		return nil
	}
	delta := int64(usedDelta(res.tokens, usedTokens))
	tpm := false
	for i := range res.buckets {
		tpm = tpm || res.buckets[i].TPM > 0
	}
	if !res.leased && (delta == 0 || !tpm) {
		return nil
	}
	n := len(res.buckets)
	args := make([]any, 5+3*n)
	args[0], args[1], args[2], args[3], args[4] = r.offset.Load(), r.window, res.member, delta, n
	for i := range res.buckets {
		b := &res.buckets[i]
		args[5+3*i], args[6+3*i], args[7+3*i] = b.RPM, b.TPM, b.MaxConcurrency
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	defer cancel()
	if err := finishScript.Run(cctx, r.c, res.keys, args...).Err(); err != nil {
		r.noteErr("finish", err)
		return fmt.Errorf("limit: redis finish: %w", err)
	}
	return nil
}

// Renew implements Limiter: one EVALSHA of renew.lua over the reservation's
// lease sets.
func (r *Redis) Renew(ctx context.Context, res *Reservation) error {
	if done, err := r.own(res); done {
		if err == nil && res.kind == kindLocal {
			return r.fallback.Renew(ctx, res)
		}
		return err
	}
	if !res.leased || res.done.Load() {
		return nil
	}
	keys := make([]string, 0, len(res.buckets))
	ids := make([]string, 0, len(res.buckets))
	for i := range res.buckets {
		if res.buckets[i].MaxConcurrency > 0 {
			keys = append(keys, res.keys[2*i+1])
			ids = append(ids, res.buckets[i].ID)
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	defer cancel()
	v, err := renewScript.Run(cctx, r.c, keys, r.offset.Load(), r.ttl, res.member).Int64Slice()
	if err == nil && len(v) != 2 {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	if err != nil {
		r.noteErr("renew", err)
		return fmt.Errorf("limit: redis renew: %w", err)
	}
	if v[0] > 0 && !res.done.Load() { // not lost if Finish released it meanwhile
		id := ""
		if v[1] >= 1 && int(v[1]) <= len(ids) {
			id = ids[v[1]-1]
		}
		return fmt.Errorf("%w: bucket %q", ErrLeaseLost, id)
	}
	return nil
}

// advance moves the scripts' clock forward: tests only, so that leases and
// refills can be checked on a real server without waiting.
func (r *Redis) advance(d time.Duration) { r.offset.Add(d.Microseconds()) }

// IsUnavailable reports whether a decision was refused because the limiter's
// backend failed (a 503 rather than a 429).
func (d *Decision) IsUnavailable() bool { return d.Reason == ReasonUnavailable }
