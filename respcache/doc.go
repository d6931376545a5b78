// Package respcache is the exact response cache of `inferrail live`: a
// deterministic request whose identical twin (same canonical body, same
// resolved model, same tenant, same cache_salt) was answered within ttl is
// answered again from the cache, byte for byte, without reaching an engine.
// It is off by default and configured per model (Config, embedded in
// live/config as response_cache). docs/response-cache.md is the operator's
// page: configuration, rules, key, metrics, Redis sizing and what is never
// cached.
//
// Start with cache.go: New builds a Cache from a validated Config, and
// Lookup decides each request's fate once the proxy has read its body,
// resolved its model and authenticated its tenant:
//
//	res, err := cache.Lookup(ctx, respcache.Request{Path: path, Body: body, Model: model, KeyID: keyID, Header: r.Header})
//	if err != nil { ... } // the client left while waiting for an identical request
//	switch res.Outcome {
//	case respcache.Hit:
//		respcache.Replay(w, res.Entry, writeTimeout) // meter 0 engine tokens
//		return
//	case respcache.Miss:
//		w = res.Capture.Wrap(w)  // tees the engine's answer as it streams
//		defer res.Capture.Finish() // stores it if it ended whole and well
//	}
//	// ... route and relay to an engine as usual, writing to w
//
// Then request.go (the determinism rules and the key), canonical.go (the
// canonical JSON the key hashes), capture.go (the miss's ResponseWriter and
// what is stored), replay.go (a hit's answer), store.go (the Store
// interface and the in-memory LRU), redis.go (the shared store), entry.go
// (an entry and its binary encoding) and config.go.
//
// # Determinism rules
//
// A request is cacheable only when its answer is a function of its body:
//
//   - temperature is 0, or at most max_temperature (default 0). An absent
//     temperature is OpenAI's default 1: cached only with max_temperature
//     >= 1. A temperature that is not a number is not cached.
//   - n and best_of are absent, null or 1: several samples differ.
//   - With temperature > 0, no truncation sampling: top_p < 1, and vLLM's
//     top_k (other than 0 or -1) and min_p (other than 0) make the request
//     uncacheable; at temperature 0 they change nothing and are only part
//     of the key.
//   - seed is part of the key and never makes a request cacheable by
//     itself: a request with temperature above max_temperature is not
//     cached even with a seed. vLLM's seeded sampling repeats only on the
//     same batch composition and hardware (OpenAI calls seed "best
//     effort"), so a seeded sampled answer is not a function of the body;
//     a cacheable request with a seed is keyed by it, so two seeds never
//     share an entry.
//   - logprobs, top_logprobs, tools, tool_choice, response_format, stop,
//     max_tokens, penalties, logit_bias, user and every field this package
//     does not know are part of the key and do not prevent caching.
//   - stream must be a boolean (or absent), stream_options an object.
//
// The body must be one JSON object without duplicate keys, invalid UTF-8
// or lone surrogate escapes (Canonical's errors); the request needs a
// tenant (an API key id, or the tenant_header's value) and the completions
// or chat completions path. Every other request is bypassed, with a reason
// (the Reason* consts).
//
// # Key
//
// SHA-256 over a versioned, length-prefixed concatenation of: the path,
// the resolved model, the API key id, the tenant header's value, the
// canonical cache_salt, the kind of answer (JSON or SSE) with a stream's
// canonical stream_options (include_usage changes the bytes), and the
// canonical JSON of the body without model, stream, stream_options and
// cache_salt (Canonical: keys sorted, numbers exact and normalised so 1,
// 1.0 and 1e0 are one, strings unescaped, no whitespace). Two tenants never
// share an entry, so hit latency tells no tenant what another asked.
//
// # Entries
//
// An entry is the engine's answer exactly as sent (Entry): a JSON body
// with its content type, or the raw SSE bytes with the end offset of each
// event, replayed event by event with a flush after each. Only whole,
// successful answers are stored: status 200, no Content-Encoding, a JSON
// body that is a completion, or a stream that ended with data: [DONE] and
// carried no error event; an answer bigger than max_entry_bytes is relayed
// but not stored (too_large). The usage the answer carried is kept
// (Entry.Usage): on a hit the client sees it again, while the proxy meters
// zero engine tokens.
//
// # Coalescing
//
// Identical misses that overlap are computed once: the first leads (its
// Capture's Finish releases the others), the others wait at most max_wait
// and until their context ends, then replay the leader's answer. If the
// leader's answer is not stored (an error, a broken stream, too large) or
// it is too slow, each waiter goes to an engine itself: an error is never
// shared. Coalescing is per process; gateways sharing a Redis store share
// entries but not flights.
//
// # Stores
//
// MemoryStore: a map and a recency list, O(1) Get and Set, bounded by the
// entries' total Size with LRU eviction and lazy TTL expiry, safe for
// concurrent use. RedisStore: one string per entry, SET key blob PX ttl,
// the blob versioned (entry.go); Redis's own maxmemory with allkeys-lru
// bounds its bytes (RedisStore.CheckEviction tells). Both pass one
// conformance suite (conformance_test.go); the Redis test runs a real
// redis-server (internal/testredis).
package respcache
