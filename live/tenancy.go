package live

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/tenancy"
	"github.com/inferrail/inferrail/tenancy/limit"
	"github.com/inferrail/inferrail/tenancy/sqlstore"
)

// This file is tenancy on the request path: API keys (auth: keys), rate
// limits and usage metering, in the order handleGenerate calls them:
//
//   - authenticate, before the body is read: the key in "Authorization:
//     Bearer ir-..." (no other header is read), through the
//     authentication cache; 401 for a missing, malformed, unknown, revoked,
//     expired or disabled key, 503 when the store fails and the key is not
//     cached.
//   - authorize, once the body names the model: 403 for a model the key
//     may not use (by its name or the alias asked for); the key's priority
//     caps the request's (x-inferrail-priority may lower it, never raise
//     it; without the header the request gets the key's).
//   - reserve, once weigh has estimated the request (prompt tokens plus
//     max_tokens, else the model's default_max_tokens, else the prompt
//     alone; the output bound once for each of its sequences): the key
//     is the request's tenant, and the limiter charges the key's bucket,
//     the key x model bucket (models[].key_limits) and the global one,
//     all or nothing; a refusal is 429 (503 for
//     limiter_unavailable) with Retry-After and the x-ratelimit-* headers,
//     which an admitted request's answer carries too.
//   - release, deferred beside the attempt's: the concurrency lease stops
//     being renewed, the limiter is told the tokens really used (prompt +
//     completion when the answer was whole, nothing when no engine
//     answered, the estimate otherwise) and one usage row is metered.
//
// With auth: none there is one key, "anonymous": key_limits and the global
// limits apply to all requests together, and usage is metered under that
// id when a store is configured. The tenant then stays the
// x-inferrail-tenant header or the body's user.

// anonymousKey is the key id of every request with auth: none.
const anonymousKey = "anonymous"

// Timeouts of the tenancy's own work.
const (
	// storeOpenTimeout bounds opening the store (and its migrations) in New.
	storeOpenTimeout = 15 * time.Second
	// flushTimeout bounds one write of usage rows.
	flushTimeout = 10 * time.Second
	// closeFlushTimeout bounds the last flush in Close.
	closeFlushTimeout = 5 * time.Second
)

// tenants is a Server's tenancy: nil when auth is none, no store is
// configured and no limit is.
type tenants struct {
	cfg   config.Tenancy
	auth  bool          // auth: keys
	store tenancy.Store // nil: no store
	dsn   tenancy.DSN
	// closeStore: New opened the store, Close closes it.
	closeStore bool
	cache      *tenancy.Cache // nil without a store
	// stopWatch ends the cache's watch of the store's key changes (a
	// store shared by gateways: Postgres) and watchDone closes when it
	// has; watchState is watchConnecting, watchListening or watchLost.
	stopWatch  context.CancelFunc
	watchDone  chan struct{}
	watchState atomic.Int32
	// lim is nil when no request can be limited (auth: none and no limit
	// configured); mode says which it is: "none", "local" or "redis".
	lim     limit.Limiter
	mode    string
	redis   *limit.Redis  // lim, when shared through Redis
	rclient *redis.Client // its client, closed by close
	global  limit.Limits
	// perModel holds each model's key_limits and default_max_tokens.
	perModel map[string]modelTenancy
	meter    *meter // nil without a store
	// active counts the reservations held now.
	active atomic.Int64
	// storeFailing is set while key lookups fail, so the outage is
	// logged once.
	storeFailing atomic.Bool
	// redisFailing is set while Redis calls fail, likewise.
	redisFailing atomic.Bool
	log          *slog.Logger
	met          *metrics
}

// modelTenancy is what the limiter needs of a model's configuration.
type modelTenancy struct {
	keyLimits        limit.Limits
	defaultMaxTokens int
}

func limitsOf(l config.Limits) limit.Limits {
	return limit.Limits{RPM: l.RPM, TPM: l.TPM, MaxConcurrency: l.MaxConcurrency}
}

// newTenants builds what cfg asks for: the store (deps.Store, else opened
// from tenancy.store), the authentication cache, the limiter (Redis when
// tenancy.redis.address is set, else in process) and the usage meter. It
// returns nil when tenancy is off. Its errors never hold the store's
// password.
func newTenants(cfg *config.Config, deps Deps, met *metrics, log *slog.Logger) (*tenants, error) {
	tc := cfg.Tenancy
	limited := !tc.Limits.Global.Zero()
	t := &tenants{cfg: tc, auth: cfg.Auth == config.AuthKeys, global: limitsOf(tc.Limits.Global), perModel: map[string]modelTenancy{}, mode: "none", log: log, met: met}
	for i := range cfg.Models {
		mc := &cfg.Models[i]
		limited = limited || !mc.KeyLimits.Zero()
		t.perModel[mc.Name] = modelTenancy{keyLimits: limitsOf(mc.KeyLimits), defaultMaxTokens: mc.DefaultMaxTokens}
	}
	if !t.auth && !limited && tc.Store == "" && deps.Store == nil {
		return nil, nil
	}
	switch {
	case deps.Store != nil:
		t.store = deps.Store
		if tc.Store != "" {
			t.dsn, _ = tenancy.ParseDSN(tc.Store)
		}
	case tc.Store != "":
		d, err := tenancy.ParseDSN(tc.Store)
		if err != nil {
			return nil, fmt.Errorf("tenancy.store: %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), storeOpenTimeout)
		st, err := sqlstore.Open(ctx, tc.Store)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("tenancy.store: %w", d.Redact(err))
		}
		t.store, t.dsn, t.closeStore = st, d, true
	}
	if t.store != nil {
		t.cache = tenancy.NewCache(t.store, tenancy.CacheConfig{TTL: tc.AuthCacheTTL})
		t.meter = newMeter(t.store, tc.UsageBuffer, tc.UsageFlushInterval, log, met)
		if w, ok := t.store.(tenancy.KeyWatcher); ok {
			t.watch(w)
		}
	}
	if t.auth || limited {
		if err := t.newLimiter(); err != nil {
			t.close()
			return nil, err
		}
	}
	return t, nil
}

// newLimiter makes the limiter: through Redis with an address, else in
// process.
func (t *tenants) newLimiter() error {
	lc := limit.Config{Window: t.cfg.Window, LeaseTTL: t.cfg.LeaseTTL}
	rc := t.cfg.Redis
	if rc.Address == "" {
		l, err := limit.NewLocal(lc)
		if err != nil {
			return fmt.Errorf("tenancy: %w", err)
		}
		t.lim, t.mode = l, "local"
		return nil
	}
	c, err := newRedisClient(rc)
	if err != nil {
		return err
	}
	r, err := limit.NewRedis(c, limit.RedisConfig{
		Config: lc, KeyPrefix: rc.KeyPrefix, OnRedisError: limit.Policy(rc.OnRedisError), Gateways: rc.Gateways, Timeout: rc.Timeout,
		OnError: t.redisError,
	})
	if err != nil {
		c.Close()
		return fmt.Errorf("tenancy.redis: %w", err)
	}
	t.lim, t.mode, t.redis, t.rclient = r, "redis", r, c
	return nil
}

// newRedisClient connects to tenancy.redis (lazily: go-redis dials on the
// first call and redials by itself after a failure).
func newRedisClient(rc config.Redis) (*redis.Client, error) {
	opt := &redis.Options{
		Network: "tcp", Addr: rc.Address, DB: rc.DB,
		// Each call's context (tenancy.redis.timeout) bounds it, dial
		// included; no maintenance-notification handshake (a feature of
		// hosted Redis that Debian's does not know).
		ContextTimeoutEnabled:    true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		DialTimeout:              time.Second,
	}
	if path, ok := strings.CutPrefix(rc.Address, "unix://"); ok {
		opt.Network, opt.Addr = "unix", path
	}
	if rc.PasswordFile != "" {
		pw, err := config.ReadSecret(rc.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("tenancy.redis.password_file: %w", err)
		}
		opt.Password = pw
	}
	quietRedis.Do(func() { redis.SetLogger(redisLog{}) })
	return redis.NewClient(opt), nil
}

// quietRedis silences go-redis's own log (one line per failed dial, on
// stderr: a flood while Redis is down) once per process: every failure
// reaches redisError, which counts it and logs the first of an outage.
var quietRedis sync.Once

// redisLog is go-redis's logger: nothing.
type redisLog struct{}

func (redisLog) Printf(context.Context, string, ...any) {}

// redisError counts a failed Redis call and logs the first of an outage
// (the limiter's next success ends it: see reserve).
func (t *tenants) redisError(op string, err error) {
	t.met.limiterErrors.WithLabelValues(op).Inc()
	if t.redisFailing.CompareAndSwap(false, true) {
		t.log.Warn("redis limiter failing; on_redis_error applies", "op", op, "policy", t.cfg.Redis.OnRedisError, "error", err.Error())
	}
}

// The states of the key store's watch.
const (
	watchConnecting int32 = iota
	watchListening
	watchLost
)

// watchStates names them in /admin/status.
var watchStates = [...]string{watchConnecting: "connecting", watchListening: "listening", watchLost: "lost"}

// watch has the cache follow w's key changes until close: a key revoked
// or changed through another gateway applies here at once, not within
// auth_cache_ttl. A lost watch is logged once, and retried by w; meanwhile
// the TTL bounds how long a change takes.
func (t *tenants) watch(w tenancy.KeyWatcher) {
	ctx, cancel := context.WithCancel(context.Background())
	t.stopWatch, t.watchDone = cancel, make(chan struct{})
	go func() {
		defer close(t.watchDone)
		t.cache.Follow(ctx, w, func(err error) {
			if err == nil {
				if t.watchState.Swap(watchListening) == watchLost {
					t.log.Info("key store watch back; every cached key is read again")
				}
				return
			}
			// Logged once a loss: the watch retries every few seconds.
			if t.watchState.Swap(watchLost) != watchLost {
				t.log.Warn("key store watch lost; changes made through other gateways apply within auth_cache_ttl until it is back", "ttl", t.cfg.AuthCacheTTL.String(), "error", t.dsn.Redact(err).Error())
			}
		})
	}()
}

// close flushes the usage left (bounded) and closes what New opened.
func (t *tenants) close() {
	if t == nil {
		return
	}
	if t.stopWatch != nil {
		t.stopWatch()
		<-t.watchDone // bounded: the watch's connection closes within a second
	}
	if t.meter != nil {
		t.meter.close()
	}
	if t.rclient != nil {
		t.rclient.Close()
	}
	if t.closeStore && t.store != nil {
		t.store.Close()
	}
}

// grant is one request's tenancy: its key, what the limiter charged it
// and how its answer went.
type grant struct {
	key   tenancy.Key // zero with auth: none
	keyID string      // the key's id, or anonymousKey
	// buckets are those the request was charged against (nb of them).
	buckets [3]limit.Bucket
	nb      int
	dec     limit.Decision
	stop    func() // ends the lease renewals
	// relayed: an engine's answer is relayed to the client; whole: the
	// relay returned (the stream was not cut short).
	relayed, whole bool
	// cached: the answer is a response cache's (cache.go): charged and
	// metered as a request of 0 engine tokens.
	cached bool
}

// errMissingKey: the request has no API key.
var errMissingKey = errors.New("no api key")

// bearer returns the API key of "Authorization: Bearer KEY".
func bearer(h http.Header) (string, error) {
	vs := h.Values("Authorization")
	switch {
	case len(vs) == 0:
		return "", errMissingKey
	case len(vs) > 1:
		return "", fmt.Errorf("%d authorization headers: %w", len(vs), tenancy.ErrMalformedKey)
	}
	scheme, tok, _ := strings.Cut(strings.TrimSpace(vs[0]), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", fmt.Errorf("authorization is not bearer: %w", tenancy.ErrMalformedKey)
	}
	if tok = strings.TrimSpace(tok); tok == "" {
		return "", errMissingKey
	}
	return tok, nil
}

// usable checks what a key allows before the request's model is known:
// that it is neither disabled nor expired.
func usable(k tenancy.Key, now time.Time) error {
	if k.Disabled {
		return fmt.Errorf("key %s: %w", k.ID, tenancy.ErrKeyDisabled)
	}
	if !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt) {
		return fmt.Errorf("key %s: %w", k.ID, tenancy.ErrKeyExpired)
	}
	return nil
}

// authenticate checks the request's API key (auth: keys) before its body
// is read. It returns the request's grant (nil when tenancy is off), or
// false once it has answered the client itself.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, ar *accessRecord) (*grant, bool) {
	t := s.ten
	if t == nil {
		return nil, true
	}
	g := &grant{keyID: anonymousKey}
	if !t.auth {
		return g, true
	}
	apiKey, err := bearer(r.Header)
	if err == nil {
		// During an outage, a lookup that reached the store (and was not
		// served stale) says it is back.
		failing := t.storeFailing.Load()
		var before tenancy.CacheStats
		if failing {
			before = t.cache.Stats()
		}
		g.key, err = t.cache.Authenticate(r.Context(), apiKey)
		switch {
		case errors.Is(err, tenancy.ErrUnavailable):
			s.met.storeErrors.WithLabelValues("auth").Inc()
			if t.storeFailing.CompareAndSwap(false, true) {
				s.log.Warn("key store unavailable: requests with keys not cached are answered 503", "store", t.dsn.String(), "error", t.dsn.Scrub(err.Error()))
			}
		case err == nil:
			if failing {
				if after := t.cache.Stats(); after.Lookups > before.Lookups && after.Stale == before.Stale && t.storeFailing.CompareAndSwap(true, false) {
					s.log.Info("key store reachable again", "store", t.dsn.String())
				}
			}
			err = usable(g.key, time.Now())
		}
	}
	if err != nil {
		e := s.keyError(r, err)
		ar.status, ar.outcome = e.status, e.outcome
		// The body is not read: the connection cannot be reused.
		w.Header().Set("Connection", "close")
		if e.status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="inferrail"`)
		}
		s.answerError(w, e)
		return nil, false
	}
	g.keyID = g.key.ID
	s.met.auth.WithLabelValues("ok").Inc()
	return g, true
}

// keyError is the answer to a request whose key was refused: never the key
// itself, nor whether its id exists.
func (s *Server) keyError(r *http.Request, err error) *apiError {
	e := &apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key", outcome: "unauthorized"}
	outcome := ""
	switch {
	case errors.Is(err, errMissingKey):
		outcome = "missing"
		e.msg = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
	case errors.Is(err, tenancy.ErrMalformedKey):
		outcome = "malformed"
		e.msg = "Incorrect API key provided: it is not an inferrail API key (Authorization: Bearer ir-<12 letters or digits>-<43 letters or digits>)."
	case errors.Is(err, tenancy.ErrInvalidKey):
		outcome = "invalid"
		e.msg = "Incorrect API key provided: no such key, or it was revoked."
	case errors.Is(err, tenancy.ErrKeyExpired):
		outcome = "expired"
		e.msg = "The API key has expired."
	case errors.Is(err, tenancy.ErrKeyDisabled):
		outcome = "disabled"
		e.msg = "The API key is disabled."
	case errors.Is(err, tenancy.ErrUnavailable):
		outcome = "unavailable"
		e.status, e.typ, e.code, e.outcome = http.StatusServiceUnavailable, "service_unavailable", "key_store_unavailable", "key_store_unavailable"
		e.msg, e.retryAfter = "The API key could not be checked: the key store is unavailable. Retry shortly.", time.Second
	case r.Context().Err() != nil:
		outcome = "client_gone"
		e.status, e.outcome = statusClientGone, "client_gone"
	default:
		outcome = "error"
		e.status, e.typ, e.code, e.outcome = http.StatusInternalServerError, "internal_error", "auth_failed", "auth_failed"
		e.msg = "The API key could not be checked."
		s.log.Error("authentication failed", "error", s.ten.dsn.Scrub(err.Error()))
	}
	s.met.auth.WithLabelValues(outcome).Inc()
	return e
}

// authorize checks the key against the request's model, now known, and
// caps the request's priority at the key's.
func (s *Server) authorize(g *grant, in *inbound, h http.Header) *apiError {
	if g == nil || !s.ten.auth {
		return nil
	}
	m, now := in.m, time.Now()
	asked := m.name
	if in.f.Model != nil && *in.f.Model != "" {
		asked = *in.f.Model
	}
	err := g.key.Allows(m.name, now)
	if errors.Is(err, tenancy.ErrModelNotAllowed) && asked != m.name && g.key.Allows(asked, now) == nil {
		err = nil // the key names the alias asked for
	}
	switch {
	case errors.Is(err, tenancy.ErrModelNotAllowed):
		s.met.auth.WithLabelValues("model_not_allowed").Inc()
		return &apiError{status: http.StatusForbidden, typ: "invalid_request_error", code: "model_not_allowed", outcome: "model_not_allowed", model: m.name,
			msg: fmt.Sprintf("This API key is not allowed to use the model `%.200s`.", asked)}
	case err != nil:
		// Disabled or expired since the headers were read.
		e := s.keyError(&http.Request{}, err)
		e.model = m.name
		return e
	}
	if strings.TrimSpace(h.Get(HeaderPriority)) == "" {
		in.req.Priority = g.key.Priority
	} else {
		in.req.Priority = min(in.req.Priority, g.key.Priority)
	}
	in.owner = g.key.ID
	if in.home != "" && in.homeOwner != in.owner {
		// Another key's stored response: as if it did not exist.
		return responseNotFoundErr(m.name, *in.f.PreviousResponseID)
	}
	return nil
}

// bucketKind names a bucket id's kind for metrics and messages.
func bucketKind(id string) string {
	switch {
	case id == "global":
		return "global"
	case strings.Contains(id, ":model:"):
		return "key_model"
	}
	return "key"
}

// estimate is what the limiter charges a request on TPM at admission: its
// prompt tokens plus its output bound (max_tokens, else the model's
// default_max_tokens, else nothing: the answer is charged at the end)
// for each of its sequences: each choice's (OpenAI's rule) of each
// prompt.
func (t *tenants) estimate(in *inbound) int {
	out := in.req.MaxTokens
	if out <= 0 && !in.req.PrefillOnly { // an embedding generates nothing
		out = t.perModel[in.m.name].defaultMaxTokens
	}
	if n := in.req.Sequences; n > 1 && !in.req.PrefillOnly {
		out = min(out, limit.MaxLimit) * n // 2^40 x gateway.MaxSequences (2^20) is in range
	}
	return min(max(in.req.PromptTokens, 0)+max(out, 0), limit.MaxLimit)
}

// reserve makes the key the request's tenant and charges the request to
// the limiter, once weigh has estimated it. It writes the x-ratelimit-*
// headers and returns nil when the request may go on (release must then
// follow), or the answer to a refused one.
func (s *Server) reserve(ctx context.Context, w http.ResponseWriter, g *grant, in *inbound) *apiError {
	if g == nil {
		return nil
	}
	t, m := s.ten, in.m
	if t.auth {
		in.req.Tenant = g.key.ID
	}
	if t.lim == nil {
		return nil
	}
	add := func(id string, l limit.Limits) {
		if !l.Zero() {
			g.buckets[g.nb] = limit.Bucket{ID: id, Limits: l}
			g.nb++
		}
	}
	if t.auth {
		add("key:"+g.keyID, limit.Limits{RPM: int(g.key.RPM), TPM: int(g.key.TPM), MaxConcurrency: g.key.MaxConcurrency})
	}
	add("key:"+g.keyID+":model:"+m.name, t.perModel[m.name].keyLimits)
	add("global", t.global)
	if g.nb == 0 {
		return nil
	}
	tokens := t.estimate(in)
	if g.cached {
		tokens = 0 // a request on RPM and concurrency, nothing on TPM
	}
	d, err := t.lim.Reserve(ctx, limit.Request{Buckets: g.buckets[:g.nb], Tokens: tokens})
	if err != nil {
		if ctx.Err() != nil {
			return &apiError{status: statusClientGone, outcome: "client_gone", model: m.name}
		}
		s.log.Error("rate limiter refused the request as invalid", "model", m.name, "key", g.keyID, "error", err.Error())
		return &apiError{status: http.StatusInternalServerError, typ: "internal_error", code: "limiter_error", outcome: "limiter_error", model: m.name,
			msg: "The rate limiter could not decide on the request."}
	}
	if d.Fallback != "" {
		s.met.ratelimitFallback.WithLabelValues(string(d.Fallback)).Inc()
	} else if t.redis != nil && t.redisFailing.CompareAndSwap(true, false) {
		s.log.Info("redis limiter reachable again")
	}
	d.SetHeaders(w.Header())
	if !d.Allowed {
		kind := bucketKind(d.Bucket)
		if d.IsUnavailable() {
			kind = "all"
		}
		s.met.ratelimit.WithLabelValues(kind, string(d.Reason)).Inc()
		return g.refusal(&d, in, tokens)
	}
	s.met.ratelimit.WithLabelValues("all", "allowed").Inc()
	g.dec = d
	t.active.Add(1)
	if d.Reservation.Leased() {
		g.stop = limit.Keep(t.lim, d.Reservation, 0, func(err error) {
			if errors.Is(err, limit.ErrLeaseLost) {
				s.met.limiterErrors.WithLabelValues("lease_lost").Inc()
				s.log.Debug("concurrency lease lost", "key", g.keyID, "model", m.name)
			}
		})
	}
	return nil
}

// refusal is the answer to a request the limiter refused, in OpenAI's
// words: which limit (the bucket's kind and the dimension), its value, and
// when to retry.
func (g *grant) refusal(d *limit.Decision, in *inbound, tokens int) *apiError {
	m := in.m
	e := &apiError{status: http.StatusTooManyRequests, typ: "requests", code: "rate_limit_exceeded", outcome: "rate_limited", model: m.name}
	if d.IsUnavailable() {
		e.status, e.typ, e.code, e.outcome = http.StatusServiceUnavailable, "service_unavailable", "limiter_unavailable", "limiter_unavailable"
		e.msg = "The rate limiter is unavailable (on_redis_error: closed). Retry shortly."
		return e
	}
	var lim limit.Limits
	for _, b := range g.buckets[:g.nb] {
		if b.ID == d.Bucket {
			lim = b.Limits
		}
	}
	kind := bucketKind(d.Bucket)
	whose := map[string]string{"key": "this API key", "key_model": "this API key on model `" + m.name + "`", "global": "the gateway (global)"}[kind]
	if kind != "global" && g.keyID == anonymousKey {
		whose = "model `" + m.name + "` (key_limits)"
	}
	retry := ""
	if d.RetryAfter > 0 {
		retry = " Please try again in " + limit.FormatReset(d.RetryAfter) + "."
	}
	switch d.Reason {
	case limit.ReasonRPM:
		e.msg = fmt.Sprintf("Rate limit reached for %s on requests per minute (RPM, bucket %s): Limit %d, Requested 1.%s", whose, kind, lim.RPM, retry)
	case limit.ReasonTPM:
		e.typ = "tokens"
		e.msg = fmt.Sprintf("Rate limit reached for %s on tokens per minute (TPM, bucket %s): Limit %d, Requested %d (prompt + max_tokens).%s", whose, kind, lim.TPM, tokens, retry)
	case limit.ReasonConcurrency:
		e.msg = fmt.Sprintf("Rate limit reached for %s on concurrent requests (max_concurrency, bucket %s): Limit %d.%s", whose, kind, lim.MaxConcurrency, retry)
	case limit.ReasonTooLarge:
		e.typ, e.outcome = "tokens", "request_too_large"
		e.msg = fmt.Sprintf("Request too large for %s on tokens per minute (TPM, bucket %s): Limit %d, Requested %d (prompt + max_tokens). It can never fit: reduce max_tokens or the prompt.", whose, kind, lim.TPM, tokens)
	default:
		e.msg = fmt.Sprintf("Rate limit reached for %s (%s, bucket %s).%s", whose, d.Reason, kind, retry)
	}
	return e
}

// rateLimitHeaders are the headers SetHeaders writes: an engine's own are
// dropped from an answer that carries the gateway's.
var rateLimitHeaders = []string{limit.HeaderLimitRequests, limit.HeaderRemainingRequests, limit.HeaderResetRequests,
	limit.HeaderLimitTokens, limit.HeaderRemainingTokens, limit.HeaderResetTokens}

// relaying marks that an engine's answer t goes to the client, whose
// headers are h: the engine's x-ratelimit-* headers give way to the
// gateway's, and the access record's output tokens start unknown (-1) so
// release can tell an answer without usage.
func (g *grant) relaying(h http.Header, t *try, ar *accessRecord) {
	if g == nil {
		return
	}
	g.relayed = true
	ar.outputTokens = -1
	if t.resp == nil {
		return
	}
	for _, k := range rateLimitHeaders {
		if _, ours := h[k]; ours {
			delete(t.resp.Header, k)
		}
	}
}

// done marks that the relay returned without breaking the stream.
func (g *grant) done() {
	if g != nil {
		g.whole = true
	}
}

// release ends the request's tenancy, whatever way handleGenerate
// returned: the lease renewals stop, the limiter is told the tokens used
// (Finish, once) and the request's usage row is metered. A response
// cache's answer is a request of 0 tokens (prompt, cached and output).
func (s *Server) release(g *grant, in *inbound, ar *accessRecord) {
	if g == nil {
		return
	}
	t := s.ten
	// A cached answer computed nothing: prompt and output stay 0.
	ok := (g.relayed || g.cached) && g.whole && ar.status == http.StatusOK
	output := ar.outputTokens // -1: the engine's answer said nothing of its length
	if ar.outputTokens < 0 {
		ar.outputTokens = 0
	}
	prompt := 0
	switch {
	case !g.relayed:
	case ar.promptCounted:
		prompt = ar.promptTokens // the engine's count: what it computed
	default:
		prompt = max(in.req.PromptTokens, 0)
	}
	if res := g.dec.Reservation; res != nil {
		used := 0 // no engine answered: nothing was computed
		switch {
		case ok && output >= 0:
			used = prompt + output
		case g.relayed:
			used = limit.UsageUnknown
		}
		if in.bg != nil {
			// A background response the engine generates still: its
			// reservation (its concurrency slot, renewed) ends with it,
			// charged what it used (bgwatch.go).
			in.bg.handOver(func(output int) {
				used := limit.UsageUnknown
				if output >= 0 {
					used = prompt + output
				}
				s.finishReservation(g, res, used)
			})
		} else {
			s.finishReservation(g, res, used)
		}
	}
	if t.meter == nil {
		return
	}
	u := tenancy.Usage{
		KeyID: g.keyID, Model: in.engineModel(), Hour: ar.began, Requests: 1,
		PromptTokens: int64(prompt), CachedTokens: int64(max(ar.cachedTokens, 0)), OutputTokens: int64(max(output, 0)),
		QueueSeconds: ar.queued.Seconds(), TTFTSeconds: ar.ttft.Seconds(), DurationSeconds: time.Since(ar.began).Seconds(),
	}
	if !ok {
		u.Errors = 1
	}
	t.meter.add(u)
}

// finishReservation ends g's reservation res: its lease renewals stop and
// the limiter is told the tokens used (limit.UsageUnknown keeps its
// estimate).
func (s *Server) finishReservation(g *grant, res *limit.Reservation, used int) {
	if g.stop != nil {
		g.stop()
	}
	if err := s.ten.lim.Finish(context.Background(), res, used); err != nil {
		s.log.Debug("rate limiter finish failed; the lease expires within lease_ttl", "key", g.keyID, "error", err.Error())
	}
	s.ten.active.Add(-1)
}

// meter holds usage rows (merged per key, model and hour as requests end)
// until a goroutine writes them to the store, every interval and once more
// at close. A full buffer drops new rows (counted); a failed write keeps
// its rows for the next one (within the same bound) and is logged once
// per outage.
type meter struct {
	store    tenancy.Store
	max      int
	interval time.Duration
	log      *slog.Logger
	met      *metrics

	mu   sync.Mutex
	rows map[usageKey]*tenancy.Usage

	flushMu sync.Mutex // one write at a time
	failing bool       // under flushMu: the last write failed

	dropped, flushes, flushErrors atomic.Uint64
	lastFlush                     atomic.Int64 // unix nanoseconds of the last good write

	stop chan struct{}
	done chan struct{}
	once sync.Once
	// ctx is cancelled by close, ending a periodic write in progress that
	// outlasts closeFlushTimeout.
	ctx    context.Context
	cancel context.CancelFunc
}

type usageKey struct {
	key, model string
	hour       int64
}

func newMeter(store tenancy.Store, buffer int, interval time.Duration, log *slog.Logger, met *metrics) *meter {
	m := &meter{store: store, max: max(buffer, 1), interval: interval, log: log, met: met,
		rows: map[usageKey]*tenancy.Usage{}, stop: make(chan struct{}), done: make(chan struct{})}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	go m.run()
	return m
}

// add merges one request's row into the buffer, or drops it when the
// buffer holds max rows and none of its key, model and hour.
func (m *meter) add(u tenancy.Usage) {
	u.Hour = tenancy.HourOf(u.Hour)
	k := usageKey{u.KeyID, u.Model, u.Hour.Unix()}
	m.mu.Lock()
	if r := m.rows[k]; r != nil {
		r.Add(u)
		m.mu.Unlock()
		return
	}
	if len(m.rows) >= m.max {
		m.mu.Unlock()
		m.drop(1)
		return
	}
	m.rows[k] = &u
	m.mu.Unlock()
}

func (m *meter) drop(n int) {
	m.dropped.Add(uint64(n))
	m.met.usageDropped.Add(float64(n))
}

// pending is the rows waiting for a write.
func (m *meter) pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.rows)
}

// flush writes the rows held now to the store. On failure they are merged
// back (what no longer fits is dropped) for the next flush.
func (m *meter) flush(ctx context.Context) error {
	m.flushMu.Lock()
	defer m.flushMu.Unlock()
	m.mu.Lock()
	held := m.rows
	if len(held) == 0 {
		m.mu.Unlock()
		return nil
	}
	m.rows = make(map[usageKey]*tenancy.Usage, len(held))
	m.mu.Unlock()
	rows := make([]tenancy.Usage, 0, len(held))
	for _, r := range held {
		rows = append(rows, *r)
	}
	err := m.store.AddUsage(ctx, rows)
	switch {
	case err == nil:
		m.flushes.Add(1)
		m.lastFlush.Store(time.Now().UnixNano())
		if m.failing {
			m.failing = false
			m.log.Info("usage writes to the store work again", "rows", len(rows))
		}
		return nil
	case errors.Is(err, tenancy.ErrInvalid):
		// The store will never take them: retrying would block the rest.
		m.drop(len(rows))
		m.log.Error("usage rows refused by the store as invalid; dropped", "rows", len(rows), "error", err.Error())
		return err
	}
	m.flushErrors.Add(1)
	m.met.storeErrors.WithLabelValues("usage_flush").Inc()
	if !m.failing {
		m.failing = true
		m.log.Warn("usage write to the store failed; its rows are kept for the next flush (tenancy.usage_buffer bounds them)", "rows", len(rows), "error", err.Error())
	}
	m.mu.Lock()
	lost := 0
	for k, r := range held {
		if cur := m.rows[k]; cur != nil {
			cur.Add(*r)
		} else if len(m.rows) < m.max {
			m.rows[k] = r
		} else {
			lost++
		}
	}
	m.mu.Unlock()
	if lost > 0 {
		m.drop(lost)
	}
	return err
}

// run flushes every interval until close.
func (m *meter) run() {
	defer close(m.done)
	tk := time.NewTicker(m.interval)
	defer tk.Stop()
	for {
		select {
		case <-m.stop:
			ctx, cancel := context.WithTimeout(context.Background(), closeFlushTimeout)
			m.flush(ctx)
			cancel()
			return
		case <-tk.C:
			ctx, cancel := context.WithTimeout(m.ctx, flushTimeout)
			m.flush(ctx)
			cancel()
		}
	}
}

// close ends run after one last flush (bounded by closeFlushTimeout). A
// periodic write in progress is let finish first, for up to
// closeFlushTimeout, and only then cancelled: it may have committed
// already, and a cancelled write's rows look unwritten, so the last flush
// would add them a second time. Close takes at most twice
// closeFlushTimeout.
func (m *meter) close() {
	m.once.Do(func() {
		close(m.stop)
		t := time.AfterFunc(closeFlushTimeout, m.cancel)
		<-m.done
		t.Stop()
		m.cancel()
	})
	<-m.done
}
