package limit

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Local is the in-process Limiter: one mutex over a map of buckets, on an
// injected clock (Config.Now). It is what a single gateway uses, and what
// Redis falls back to under on_redis_error: local.
//
// Idle buckets (drained, no live lease) are deleted by a sweep that runs at
// most once per Window, inside a Reserve.
type Local struct {
	cfg    Config
	epoch  time.Time
	window int64 // ns
	ttl    int64 // ns

	mu      sync.Mutex
	buckets map[string]*localBucket
	seq     uint64
	swept   int64
}

type localBucket struct {
	r, t     float64 // levels: requests and tokens in use
	ts       int64   // ns since epoch of the last update
	rpm, tpm int     // the limits last seen, for the sweep's drain
	leases   map[uint64]int64
}

var _ Limiter = (*Local)(nil)

// NewLocal returns an in-process limiter. Zero fields of cfg take their
// defaults (Window 1m, LeaseTTL 30s, Now time.Now).
func NewLocal(cfg Config) (*Local, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Local{
		cfg:     c,
		epoch:   c.Now(),
		window:  int64(c.Window),
		ttl:     int64(c.LeaseTTL),
		buckets: make(map[string]*localBucket),
	}, nil
}

func (l *Local) clock() (int64, time.Time) {
	t := l.cfg.Now()
	return int64(t.Sub(l.epoch)), t
}

// Reserve implements Limiter.
func (l *Local) Reserve(ctx context.Context, req Request) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("limit: reserve: %w", err)
	}
	if err := req.validate(); err != nil {
		return Decision{}, err
	}
	if d, ok := req.tooLarge(); ok {
		return d, nil
	}
	return l.reserve(&req, req.Tokens), nil
}

// reserve decides on a validated request, charging cost tokens.
func (l *Local) reserve(req *Request, cost int) Decision {
	if len(req.Buckets) == 0 {
		_, at := l.clock()
		return Decision{Allowed: true, At: at, Reservation: &Reservation{kind: kindNone}}
	}
	c := float64(cost)
	l.mu.Lock()
	defer l.mu.Unlock()
	now, at := l.clock()
	if now-l.swept >= l.window {
		l.sweep(now)
	}

	var st [MaxBuckets]*localBucket
	var lr, lt [MaxBuckets]float64
	who, worst := -1, int64(0)
	var why Reason
	refuse := func(r Reason, i int, w int64) {
		if who < 0 || w > worst {
			who, worst, why = i, w, r
		}
	}
	for i := range req.Buckets {
		b := &req.Buckets[i]
		s := l.buckets[b.ID]
		st[i] = s
		if s != nil {
			el := now - s.ts
			if b.RPM > 0 {
				lr[i] = drain(s.r, el, l.window, b.RPM)
			}
			if b.TPM > 0 {
				lt[i] = drain(s.t, el, l.window, b.TPM)
			}
		}
		if b.RPM > 0 && !fits(lr[i], 1, b.RPM) {
			refuse(ReasonRPM, i, wait(lr[i], 1, b.RPM, l.window))
		}
		if b.TPM > 0 && !fits(lt[i], c, b.TPM) {
			refuse(ReasonTPM, i, wait(lt[i], c, b.TPM, l.window))
		}
		if b.MaxConcurrency > 0 && s != nil && s.live(now)+1 > b.MaxConcurrency {
			refuse(ReasonConcurrency, i, int64(concurrencyRetry))
		}
	}
	b0 := &req.Buckets[0]
	if who >= 0 {
		return Decision{
			Reason:     why,
			Bucket:     req.Buckets[who].ID,
			RetryAfter: time.Duration(worst),
			Requests:   quota(lr[0], b0.RPM, l.window, 1),
			Tokens:     quota(lt[0], b0.TPM, l.window, 1),
			At:         at,
		}
	}

	res := &Reservation{kind: kindLocal, owner: l, tokens: cost, ttl: l.cfg.LeaseTTL}
	res.setBuckets(req.Buckets)
	if req.leased() {
		l.seq++
		res.lease, res.leased = l.seq, true
	}
	for i := range req.Buckets {
		b := &req.Buckets[i]
		s := st[i]
		if s == nil {
			s = &localBucket{}
			l.buckets[b.ID] = s
		}
		if b.RPM > 0 {
			lr[i]++
		}
		if b.TPM > 0 {
			lt[i] += c
		}
		s.r, s.t, s.ts, s.rpm, s.tpm = lr[i], lt[i], later(s.ts, now), b.RPM, b.TPM
		if b.MaxConcurrency > 0 {
			if s.leases == nil {
				s.leases = make(map[uint64]int64, 4)
			}
			s.leases[res.lease] = now + l.ttl
		}
	}
	return Decision{
		Allowed:     true,
		Requests:    quota(lr[0], b0.RPM, l.window, 1),
		Tokens:      quota(lt[0], b0.TPM, l.window, 1),
		At:          at,
		Reservation: res,
	}
}

// quota is the header view of one dimension; unit converts the time unit to
// nanoseconds.
func quota(level float64, limit int, window int64, unit time.Duration) Quota {
	if limit <= 0 {
		return Quota{}
	}
	return Quota{
		Limit:     limit,
		Remaining: remaining(level, limit),
		Reset:     time.Duration(resetIn(level, limit, window)) * unit,
	}
}

// live counts the unexpired leases, dropping expired ones when the count
// matters (it would refuse).
func (s *localBucket) live(now int64) int {
	n := len(s.leases)
	if n == 0 {
		return 0
	}
	for id, exp := range s.leases {
		if exp <= now {
			delete(s.leases, id)
		}
	}
	return len(s.leases)
}

func (l *Local) sweep(now int64) {
	l.swept = now
	for id, s := range l.buckets {
		if s.live(now) > 0 {
			continue
		}
		el := now - s.ts
		if (s.rpm == 0 || drain(s.r, el, l.window, s.rpm) == 0) && (s.tpm == 0 || drain(s.t, el, l.window, s.tpm) == 0) {
			delete(l.buckets, id)
		}
	}
}

// Finish implements Limiter.
func (l *Local) Finish(_ context.Context, r *Reservation, usedTokens int) error {
	if r == nil {
		return errNilReservation
	}
	switch r.kind {
	case kindNone, kindOpen:
		r.done.Store(true)
		return nil
	}
	if r.owner != l {
		return errForeign()
	}
	if !r.done.CompareAndSwap(false, true) {
		return nil
	}
	delta := usedDelta(r.tokens, usedTokens)
	l.mu.Lock()
	defer l.mu.Unlock()
	var now int64
	if delta != 0 { // only a correction needs the clock
		now, _ = l.clock()
	}
	for i := range r.buckets {
		b := &r.buckets[i]
		s := l.buckets[b.ID]
		if b.MaxConcurrency > 0 && s != nil {
			delete(s.leases, r.lease)
		}
		if b.TPM == 0 || delta == 0 {
			continue
		}
		if s == nil { // swept: drained, so the level was 0
			s = &localBucket{ts: now}
			l.buckets[b.ID] = s
		}
		el := now - s.ts
		if b.RPM > 0 {
			s.r = drain(s.r, el, l.window, b.RPM)
		} else {
			s.r = 0
		}
		s.t = max(0, drain(s.t, el, l.window, b.TPM)+delta)
		s.ts, s.rpm, s.tpm = later(s.ts, now), b.RPM, b.TPM
	}
	return nil
}

// Renew implements Limiter.
func (l *Local) Renew(_ context.Context, r *Reservation) error {
	if r == nil {
		return errNilReservation
	}
	if r.kind == kindNone || r.kind == kindOpen || !r.leased {
		return nil
	}
	if r.owner != l {
		return errForeign()
	}
	if r.done.Load() {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.done.Load() { // finished while this call waited for the lock
		return nil
	}
	now, _ := l.clock()
	lost := ""
	for i := range r.buckets {
		b := &r.buckets[i]
		if b.MaxConcurrency == 0 {
			continue
		}
		s := l.buckets[b.ID]
		if s == nil {
			lost = b.ID
			continue
		}
		exp, ok := s.leases[r.lease]
		if !ok || exp <= now {
			delete(s.leases, r.lease)
			lost = b.ID
			continue
		}
		s.leases[r.lease] = now + l.ttl
	}
	if lost != "" {
		return fmt.Errorf("%w: bucket %q", ErrLeaseLost, lost)
	}
	return nil
}

// size is the number of buckets held (tests).
func (l *Local) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
