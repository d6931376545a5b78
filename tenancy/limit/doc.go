// Package limit is the tenancy rate limiter: requests per minute (RPM),
// tokens per minute (TPM) and concurrency, charged against several buckets
// at once, in process ([Local]) or shared by every gateway through Redis
// ([Redis]).
//
// # Where to start
//
// [Limiter] is the whole API the proxy uses, three calls per request:
//
//	d, err := lim.Reserve(ctx, limit.Request{
//		Buckets: []limit.Bucket{
//			{ID: "key:" + keyID, Limits: key.Limits},                       // first: the headers describe it
//			{ID: "key:" + keyID + ":model:" + model, Limits: key.ModelLimits},
//			{ID: "global", Limits: cfg.Global},
//		},
//		Tokens: promptTokens + maxTokens, // the estimate
//	})
//	if err != nil { ... }                   // invalid request or ctx done: a 500 or nothing to answer
//	d.SetHeaders(w.Header())                // x-ratelimit-* and, when refused, Retry-After
//	if !d.Allowed { ... }                   // 429 (rpm, tpm, concurrency, too_large) or 503 (limiter_unavailable)
//	stop := limit.Keep(lim, d.Reservation, 0, nil) // renews the concurrency lease while the request runs
//	... proxy the request ...
//	stop()
//	lim.Finish(ctx, d.Reservation, usage.PromptTokens+usage.CompletionTokens) // or UsageUnknown
//
// Then read limit.go (the types), bucket.go (the arithmetic, shared by both
// implementations), local.go, redis.go with its three Lua scripts
// (reserve.lua, finish.lua, renew.lua), and conformance_test.go, the suite
// both implementations pass.
//
// # The model
//
// A [Request] names its buckets (typically per key, per key×model and
// global); each bucket has an RPM limit, a TPM limit and a maximum
// concurrency, 0 meaning unlimited for that dimension. Admission is
// all-or-nothing over every bucket and every dimension, in one critical
// section (one mutex for Local, one Lua script for Redis): a request
// refused by any bucket changes no bucket.
//
// RPM and TPM are token buckets with continuous refill, held as a "level"
// (units in use) that drains at limit/Window and may hold at most limit
// units at an admission: burst = the whole per-minute allowance, as OpenAI
// allows, and a request of cost c is admitted when level + c ≤ limit. This
// is GCRA expressed differently (GCRA's theoretical arrival time is
// last + level·Window/limit): the same decisions, but the state is a level
// bounded by the limit and a timestamp, so the arithmetic stays in small
// numbers where a double is exact enough for the Lua side (an absolute TAT
// at microsecond resolution loses the emission interval of a 10^9 TPM limit,
// 0.06 µs, in the double's rounding). Refunds subtract from the level (never
// below 0), and an extra charge adds to it beyond the limit: debt, which
// delays later requests and is never a rejection after the fact.
//
// TPM is charged at admission on the estimate (prompt tokens + max_tokens)
// and reconciled by Finish with the engine's real usage: a refund when less
// was used, an extra charge when more. A request whose estimate alone
// exceeds a bucket's TPM is refused with reason too_large: it could never
// fit, and waiting would be forever.
//
// Concurrency is a lease: a slot taken at admission, released by Finish, and
// valid for LeaseTTL unless renewed ([Limiter.Renew], or [Keep] which renews
// every LeaseTTL/3). A gateway that crashes never calls Finish; its slots
// are free again within LeaseTTL.
//
// # Invariants
//
// Per bucket and dimension, with L the limit and W the Window, on the
// limiter's clock (the injected, by default monotonic, clock for Local; the
// Redis server's TIME for Redis):
//
//  1. At every admission the level after the charge is ≤ L (up to a relative
//     1e-9 rounding tolerance).
//  2. Hence, for any instant a and any admission at time b ≥ a, the net
//     charges applied in [a, b] (estimates admitted, plus extra charges,
//     minus refunds) are at most L + (b−a)·L/W. For requests (cost 1, never
//     reconciled): admitted requests in any interval [a, b] ≤ L + (b−a)·L/W.
//     So: at most 2L in any window of length W (the burst, then a window's
//     refill); from a cold start at most
//     L + k·L over the first k windows; and at most L in a window (a, a+W]
//     that begins while the bucket is full (a request at a would be
//     refused), which is the steady state of a client that keeps sending:
//     exactly L per W. There is no fixed window: a client that used its
//     whole minute at once gets one request back every W/L.
//  3. Tokens: the same bound on net charges. In a window (a, a+W] that
//     begins while a request of estimate e is refused on TPM, the net
//     charges up to any admission in it are below L + e: TPM plus one
//     request's estimate. Actual
//     usage is charged at Finish; an extra charge is never refused, so a
//     request that used more than its estimate takes the bucket into debt
//     (level > L) and later requests wait until the level is back under
//     L − their estimate. Refunds never take the level below 0, so a
//     bucket never holds more than one window's allowance.
//  4. Concurrency: at every admission, live leases ≤ max_concurrency; a
//     lease lives until Finish or until LeaseTTL after its last renewal.
//  5. too_large: a request with Tokens > a bucket's TPM is refused without
//     touching any state.
//
// # Redis
//
// One Lua script per operation (reserve, finish, renew), run with EVALSHA
// through go-redis's Script (loaded once; NOSCRIPT after a restart or a
// SCRIPT FLUSH falls back to EVAL, which loads it again). The scripts read
// the server's clock (redis.call('TIME')); no gateway clock is ever sent
// (the scripts take a clock offset argument, always 0 outside this
// package's tests, which use it to move time on a real server). The server's
// clock is a wall clock and may step back: a bucket's timestamp never moves
// back with it (bucket.go's later), so nothing drains until the clock is
// past the last update again. Redis ≥ 5
// (effects replication, so TIME in a script that writes is allowed);
// Debian 12's 7.0 is what the tests run.
// Keys are `<key_prefix>:{<hash_tag>}:r:<bucket id>` (a hash: levels and
// timestamp, with a TTL until the level would have drained, so idle buckets
// vanish) and `<key_prefix>:{<hash_tag>}:c:<bucket id>` (a sorted set of
// leases scored by expiry; expired members are removed by the scripts).
// Every key shares one hash tag, so on Redis Cluster one slot holds them
// all: all-or-nothing across buckets needs a single slot, and the global
// bucket is shared by every request, so the limiter's keys live on one
// shard by design.
//
// When Redis fails (connection refused, timeout, script error) the policy
// on_redis_error decides: closed (the default) refuses with reason
// limiter_unavailable (a 503), open admits, local falls back to an
// in-process [Local] whose limits are this gateway's share (limit ÷
// gateways, rounded down, at least 1). Reconnection is go-redis's own: the
// next call after Redis comes back succeeds with the same [Redis] value.
// Errors are counted ([Redis.Stats]) and passed to RedisConfig.OnError; there
// is no global state.
package limit
