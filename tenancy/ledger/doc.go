// Package ledger shares the gateway core's admission ledger (the KV blocks
// reserved on each replica, router/gateway.Ledger) between gateways through
// Redis, so that several gateways in front of one fleet admit as one: the
// reservations of all of them together never exceed a replica's limit.
//
// # Where to start
//
// [Redis] is a gateway.Reserver for one served model: give it to the
// model's core as Config.Ledger and the core reserves each dispatch with
// [Redis.TryAdd], one Lua script that checks and reserves atomically
// against every live gateway's reservations, and releases with
// [Redis.Add]:
//
//	client := redis.NewClient(&redis.Options{Network: "unix", Addr: sock, ContextTimeoutEnabled: true})
//	led, err := ledger.NewRedis(client, "llama-3-8b", ledger.Config{Gateways: 3})
//	if err != nil { ... }
//	defer led.Close()                     // this gateway's reservations leave Redis at once
//	cfg.Ledger = led                      // gateway.Config
//	go func() {                           // other gateways freed room: try the queue again
//		for {
//			select {
//			case <-led.Freed():
//				lock(); deliver(core.Poke(now())); unlock()
//			case <-ctx.Done():
//				return
//			}
//		}
//	}()
//
// Then read redis.go, the scripts (prelude.lua, prepended to try_add.lua,
// sync.lua and leave.lua), and the tests: conformance_test.go (the same
// answers as a gateway.LocalLedger for one gateway), gateways_test.go
// (three cores under overload against one Redis, and the over-admission of
// three local ledgers beside it), property_test.go (three cores on Redis
// under random interleavings), lease_test.go (a killed gateway's
// reservations expire), outage_test.go (Redis stopped, paused, restarted,
// and late writes). The core's side of the contract is in router/gateway
// (Reserver, ledger.go; Core.reserve, core.go; reserver_test.go).
//
// # The model in Redis
//
// Each gateway holds its own reservations as a vector, blocks per replica
// index (the cores' indices, which must agree between gateways: the same
// replica names in the same order), and writes the whole vector, never a
// delta, with every call: keys (one hash tag per model, so one Redis
// Cluster slot holds a model's ledger):
//
//	<key_prefix>:{ledger:<model>}:l   sorted set: gateway id -> lease expiry (µs, the server's clock)
//	<key_prefix>:{ledger:<model>}:v   hash: gateway id -> "nonce,seq,b0,b1,..."
//	<key_prefix>:{ledger:<model>}:e   the epoch: when this state began (µs, the server's clock)
//
// Every script reads the server's clock (redis.call('TIME')); no gateway
// clock is ever sent. It first drops the gateways whose lease expired
// (their vectors are deleted: they stop counting), sums the other live
// gateways' vectors per replica, writes this gateway's vector and renews its
// lease to now + lease_ttl, and returns the others' sums for every replica.
// try_add.lua writes the vector with the weight added only when the
// replica's total before it is 0 or stays within the limit after it (and
// the state is not recovering, below);
// sync.lua (Add and the heartbeat) writes it as it is; leave.lua (Close)
// deletes it. The keys expire lease_ttl + 1s after the last write, so an
// abandoned deployment leaves nothing behind.
//
// Writing absolute vectors makes every call idempotent and self-healing: an
// Add that failed, a reservation taken while Redis was down, a vector lost
// with a restarted Redis or deleted because this gateway's own lease expired
// (a long pause) are all repaired by the next successful call, at the latest
// the heartbeat. Writes carry (nonce, seq), the instance's random nonce and a
// sequence number: a write that reaches Redis after a newer one of the same
// instance (it timed out here, was buffered in the socket of a paused
// server and ran on resume) is discarded; a new instance with the same
// gateway id (a restart) replaces the old one's vector.
//
// # Invariants
//
//  1. At every admission (a try_add that said yes), the replica's total over
//     every live gateway was 0 before it or is at most the limit after it,
//     evaluated atomically on the server. Nothing else increases a total but
//     Add with a positive delta (the first byte's resize when less was
//     cached than predicted), which is never refused, as with a local
//     ledger. So while Redis answers, the gateways together never admit
//     past a limit that a single gateway would not.
//  2. This gateway's own reservations are exact locally: Add and TryAdd
//     change them in memory at once, whatever Redis does; Redis holds them
//     as of the last successful call.
//  3. A gateway that stops calling (killed, hung, partitioned) stops
//     counting lease_ttl after its last successful call, at the first
//     script any gateway runs then; it counts again, with its whole vector,
//     from its next successful call. The price of leases: a gateway that
//     is alive but cannot reach Redis for longer than lease_ttl is not
//     counted meanwhile, so lease_ttl should exceed the outages that
//     on_redis_error is meant to ride through.
//  4. Reserved never calls Redis: it returns this gateway's own blocks (exact)
//     plus the other gateways' sums as of the last reply (a script reply on
//     every TryAdd and Add, and the heartbeat every refresh_interval, 250ms
//     by default). The snapshot may be stale either way; it only pre-filters
//     the candidates (the core's admit), and TryAdd decides on fresh state.
//     Stale-low: the pick's TryAdd is refused and the core routes again
//     without it; stale-high: a replica with room looks full until the next
//     reply, at most refresh_interval later for an idle gateway, and Freed
//     tells the owner to let its queue try again when a reply shows room.
//
// # Failure policy
//
// Every call is bounded by Timeout (20ms). When a call fails this gateway
// is "down": calls on the request path stop going to Redis (a hung server
// would otherwise cost the timeout on every dispatch, under the core's
// lock), the heartbeat probes with backoff (50ms doubling to
// min(refresh_interval, 1s)), and on_redis_error decides each TryAdd:
//
//   - closed (the default): refused; the request queues until Redis answers
//     again or its queue deadline passes.
//   - open: admitted and kept in this gateway's own reservations; Reserved
//     shows only those (the gateway admits as if alone).
//   - local: admitted within this gateway's share, limit / gateways
//     (rounded down, at least 1; an empty share always takes one request);
//     Reserved shows only its own reservations.
//
// Add is always applied locally. When Redis answers again the first call
// (the probe) writes this gateway's whole vector: Redis then holds exactly
// what the gateway holds, including what was admitted meanwhile; nothing is
// replayed, so recovery is idempotent. go-redis reconnects by itself: the
// same [Redis] value works again after the server restarts, without a
// rebuild.
//
// A Redis that comes up empty (a restart without persistence, lost data, a
// first start) has forgotten every gateway: each writes its vector back at
// its next call, within refresh_interval for every live gateway (the
// heartbeat). Until then a gateway that wrote first would see replicas
// emptier than they are, so for 2 x refresh_interval after a script finds
// no epoch (a fresh state) try_add admits nothing: requests queue, and
// Freed fires when the window ends. Every gateway of a deployment needs the
// same refresh_interval (and lease_ttl) for that to hold.
//
// Errors are counted ([Redis.Stats]) and passed to Config.OnError; go-redis's
// own log should be silenced or routed by the caller (redis.SetLogger).
package ledger
