package limit

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Limiter is the rate limiter the proxy calls: Reserve at admission, Renew
// while the request runs (only when the reservation holds leases), Finish
// at the end. Implementations are safe for concurrent use.
type Limiter interface {
	// Reserve decides whether req may start and, when it may, charges every
	// bucket at once: one request on RPM, req.Tokens on TPM, one slot on
	// concurrency. The error is non-nil only for an invalid request (wraps
	// ErrInvalid) or when ctx is done before a decision; a backend failure
	// is not an error but a Decision made by the failure policy.
	Reserve(ctx context.Context, req Request) (Decision, error)
	// Finish releases the reservation's leases and reconciles TPM with the
	// tokens really used (prompt + completion): a refund when fewer than the
	// estimate, an extra charge (possibly into debt) when more. usedTokens <
	// 0 (UsageUnknown) keeps the estimate. A second Finish of the same
	// reservation does nothing. Finish ignores ctx's cancellation (a client
	// that went away must still release its slot) and is bounded by the
	// implementation's own timeout. Its error is for logging: nothing needs
	// undoing, and an unreleased lease expires within LeaseTTL.
	Finish(ctx context.Context, r *Reservation, usedTokens int) error
	// Renew extends the reservation's leases by LeaseTTL from now. It
	// returns an error wrapping ErrLeaseLost when a lease had already expired
	// (the slot may have been given to another request; the request may go
	// on, uncounted), another error when the backend failed (try again at the
	// next renewal), nil when there is nothing to renew.
	Renew(ctx context.Context, r *Reservation) error
}

// UsageUnknown passed to Finish keeps the estimate as the charge: for a
// stream that died before the engine reported usage.
const UsageUnknown = -1

// MaxBuckets is the most buckets one request may name.
const MaxBuckets = 8

// MaxLimit is the largest RPM, TPM, concurrency or token count accepted
// (2^40, about 1.1e12): beyond it a double's rounding would matter.
const MaxLimit = 1 << 40

// Limits of one bucket; 0 means unlimited for that dimension.
type Limits struct {
	RPM            int `yaml:"rpm" json:"rpm"`                         // requests per Window (per minute by default)
	TPM            int `yaml:"tpm" json:"tpm"`                         // tokens per Window, prompt + completion
	MaxConcurrency int `yaml:"max_concurrency" json:"max_concurrency"` // requests in flight at once
}

// Zero reports whether every dimension is unlimited.
func (l Limits) Zero() bool { return l.RPM == 0 && l.TPM == 0 && l.MaxConcurrency == 0 }

// Validate checks each field: negative or above MaxLimit is an error (a
// *FieldError wrapping ErrInvalid) naming the field as configured (rpm, tpm,
// max_concurrency).
func (l Limits) Validate() error { return l.validate("") }

func (l Limits) validate(bucket string) error {
	for _, f := range [...]struct {
		name string
		v    int
	}{{"rpm", l.RPM}, {"tpm", l.TPM}, {"max_concurrency", l.MaxConcurrency}} {
		if f.v < 0 {
			return &FieldError{Bucket: bucket, Field: f.name, Value: f.v, Problem: "is negative"}
		}
		if f.v > MaxLimit {
			return &FieldError{Bucket: bucket, Field: f.name, Value: f.v, Problem: "is above 2^40"}
		}
	}
	return nil
}

// Bucket is one set of limits a request is charged against. Its ID names
// the state (e.g. "key:k_123", "key:k_123:model:llama-8b", "global"); two
// requests share a bucket when they use the same ID. Limits come with each
// request, so a changed limit applies from the next request on, without
// resetting what was used.
type Bucket struct {
	ID string
	Limits
}

// Request is what Reserve decides on.
type Request struct {
	// Buckets charged all-or-nothing, at most MaxBuckets, IDs distinct and
	// non-empty. The first is the one the x-ratelimit headers describe (the
	// key's). No buckets: admitted, nothing charged.
	Buckets []Bucket
	// Tokens is the estimate charged on TPM: prompt tokens + max_tokens.
	Tokens int
}

// Reason says why a request was refused.
type Reason string

// Reasons. The first four are a 429; ReasonUnavailable is a 503.
const (
	ReasonNone        Reason = ""
	ReasonRPM         Reason = "rpm"                 // requests per minute
	ReasonTPM         Reason = "tpm"                 // tokens per minute
	ReasonConcurrency Reason = "concurrency"         // too many requests in flight
	ReasonTooLarge    Reason = "too_large"           // the estimate alone exceeds a TPM limit: it can never fit
	ReasonUnavailable Reason = "limiter_unavailable" // Redis failed and on_redis_error is closed
)

// Policy is what Redis does when Redis fails.
type Policy string

// Policies for on_redis_error.
const (
	PolicyClosed Policy = "closed" // refuse: ReasonUnavailable (the default)
	PolicyOpen   Policy = "open"   // admit, charge nothing
	PolicyLocal  Policy = "local"  // decide in process on this gateway's share of each limit
)

// Quota is one dimension of the header bucket (Request.Buckets[0]) after
// the decision: what OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}
// report. Limit 0: no limit on this dimension (no headers).
type Quota struct {
	Limit     int
	Remaining int           // whole units that could be admitted now: floor(Limit − level), ≥ 0
	Reset     time.Duration // until the bucket is back to its full allowance (level 0)
}

// Decision is Reserve's answer.
type Decision struct {
	Allowed bool
	// Reason and Bucket (its ID) say which limit refused; when several
	// refuse, the one with the longest wait. Empty when allowed.
	Reason Reason
	Bucket string
	// RetryAfter is when the request could be admitted if nothing else
	// arrived: the longest wait over every refusing bucket; 1 s for a
	// concurrency refusal (a slot frees when a request ends, which the
	// limiter cannot foresee) and for limiter_unavailable; 0 for too_large.
	RetryAfter time.Duration
	// Requests and Tokens describe the header bucket after this decision
	// (after the charge when allowed). Zero for too_large and for decisions
	// made without the backend (open, closed).
	Requests, Tokens Quota
	// At is the limiter's clock at the decision: the Redis server's TIME for
	// Redis, the injected clock for Local; the gateway's clock for a
	// decision made without the backend; zero for too_large (no clock read).
	At time.Time
	// Fallback is set when Redis failed and this decision was made by the
	// policy (closed, open or local).
	Fallback Policy
	// Reservation is non-nil when Allowed: pass it to Renew and Finish.
	Reservation *Reservation
}

// Errors.
var (
	// ErrInvalid is wrapped by every error about a malformed request or
	// configuration.
	ErrInvalid = errors.New("limit: invalid")
	// ErrLeaseLost is wrapped by Renew's error when a lease had expired.
	ErrLeaseLost = errors.New("limit: lease lost")
)

// FieldError names the field of a bucket's limits that is wrong; it wraps
// ErrInvalid.
type FieldError struct {
	Bucket  string // the bucket's ID, "" for Limits.Validate
	Field   string // rpm, tpm or max_concurrency
	Value   int
	Problem string
}

func (e *FieldError) Error() string {
	if e.Bucket == "" {
		return fmt.Sprintf("limit: %s %s (%d)", e.Field, e.Problem, e.Value)
	}
	return fmt.Sprintf("limit: bucket %q: %s %s (%d)", e.Bucket, e.Field, e.Problem, e.Value)
}

func (e *FieldError) Unwrap() error { return ErrInvalid }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

func (req *Request) validate() error {
	if len(req.Buckets) > MaxBuckets {
		return invalid("%d buckets, at most %d", len(req.Buckets), MaxBuckets)
	}
	if req.Tokens < 0 {
		return invalid("tokens is negative (%d)", req.Tokens)
	}
	if req.Tokens > MaxLimit {
		return invalid("tokens is above 2^40 (%d)", req.Tokens)
	}
	for i := range req.Buckets {
		b := &req.Buckets[i]
		if b.ID == "" {
			return invalid("bucket %d: empty id", i)
		}
		if len(b.ID) > 1024 {
			return invalid("bucket %d: id longer than 1024 bytes", i)
		}
		if err := b.validate(b.ID); err != nil {
			return err
		}
		for j := range i {
			if req.Buckets[j].ID == b.ID {
				return invalid("bucket %q named twice", b.ID)
			}
		}
	}
	return nil
}

// tooLarge finds the first bucket whose TPM the estimate exceeds.
func (req *Request) tooLarge() (Decision, bool) {
	for i := range req.Buckets {
		b := &req.Buckets[i]
		if b.TPM > 0 && req.Tokens > b.TPM {
			return Decision{Reason: ReasonTooLarge, Bucket: b.ID}, true
		}
	}
	return Decision{}, false
}

func (req *Request) leased() bool {
	for i := range req.Buckets {
		if req.Buckets[i].MaxConcurrency > 0 {
			return true
		}
	}
	return false
}

// Config is common to Local and Redis.
type Config struct {
	// Window is the period RPM and TPM count over: 1m (the default) makes
	// them per minute. Tests shrink it to run minutes in seconds.
	Window time.Duration `yaml:"window" json:"window"`
	// LeaseTTL is how long a concurrency slot lives without renewal: a
	// crashed gateway's slots are free within it. Default 30s.
	LeaseTTL time.Duration `yaml:"lease_ttl" json:"lease_ttl"`
	// Now is Local's clock (default time.Now, monotonic). Redis uses the
	// server's clock and ignores it.
	Now func() time.Time `yaml:"-" json:"-"`
}

// Defaults.
const (
	DefaultWindow   = time.Minute
	DefaultLeaseTTL = 30 * time.Second
	DefaultTimeout  = 20 * time.Millisecond
	// concurrencyRetry is the Retry-After of a concurrency refusal and of
	// limiter_unavailable.
	concurrencyRetry = time.Second
)

func (c *Config) withDefaults() (Config, error) {
	out := *c
	if out.Window == 0 {
		out.Window = DefaultWindow
	}
	if out.LeaseTTL == 0 {
		out.LeaseTTL = DefaultLeaseTTL
	}
	if out.Now == nil {
		out.Now = time.Now
	}
	if out.Window < time.Millisecond || out.Window > 366*24*time.Hour {
		return out, invalid("window %v is outside [1ms, 366d]", out.Window)
	}
	if out.LeaseTTL < time.Millisecond || out.LeaseTTL > 24*time.Hour {
		return out, invalid("lease_ttl %v is outside [1ms, 24h]", out.LeaseTTL)
	}
	return out, nil
}

type resKind uint8

const (
	kindNone  resKind = iota // no buckets: nothing to undo
	kindLocal                // held by a *Local
	kindRedis                // held in Redis
	kindOpen                 // admitted by the open policy: nothing held
)

// Reservation is what an admitted request holds until Finish: the buckets
// it charged, its estimate and its lease. Its methods are safe for
// concurrent use with Renew and Finish.
type Reservation struct {
	kind    resKind
	owner   any // the *Local or *Redis that made it
	buckets []Bucket
	inline  [3]Bucket
	tokens  int // charged on TPM
	lease   uint64
	member  string   // Redis lease member
	keys    []string // Redis keys, two per bucket
	ttl     time.Duration
	leased  bool
	done    atomic.Bool
}

func (r *Reservation) setBuckets(bs []Bucket) {
	if len(bs) <= len(r.inline) {
		r.buckets = r.inline[:copy(r.inline[:], bs)]
		return
	}
	r.buckets = append([]Bucket(nil), bs...)
}

// Tokens is the estimate the reservation charged on TPM.
func (r *Reservation) Tokens() int { return r.tokens }

// Leased reports whether the reservation holds concurrency leases, i.e.
// whether it needs Renew while the request runs longer than LeaseTTL.
func (r *Reservation) Leased() bool { return r != nil && r.leased }

// LeaseTTL is the lease's lifetime without renewal.
func (r *Reservation) LeaseTTL() time.Duration { return r.ttl }

// Finished reports whether Finish was called.
func (r *Reservation) Finished() bool { return r.done.Load() }

var errNilReservation = invalid("nil reservation")

func errForeign() error { return invalid("reservation made by another limiter") }

// usedDelta is the TPM reconciliation: used − charged, 0 for unknown usage.
func usedDelta(charged, used int) float64 {
	if used < 0 {
		return 0
	}
	if used > MaxLimit {
		used = MaxLimit
	}
	return float64(used - charged)
}
