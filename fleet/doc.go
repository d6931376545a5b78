// Package fleet holds the replicas and what the gateways know of them. Today
// it is the virtual fleet: N engines (package engine) driven from one event
// heap on virtual time, fed by a workload source, with every request taken
// by a gateway core (package router/gateway: admission, the queue, the
// routing policy and KV index, the per-replica view), the same state
// machine the live proxy drives on wall-clock time.
//
// A gateway sees only what a real gateway sees: its own counters (requests
// in flight, waiting for a first token, their prompt tokens, KV blocks
// reserved) exact and current; the engines' own numbers (running, waiting,
// KV usage) only as of its last scrape, every ScrapeInterval; KV events
// KVEventDelay late. Several gateways (Config.Gateways) each scrape at their
// own phase and keep their own index, against one shared reservation ledger
// or one each (Config.Ledger).
//
// Tenants with rate limits (workload.Config.Tenants) are charged at
// arrival, before their gateway sees the request, by the proxy's own
// limiter (tenancy/limit) on virtual time; a refused request is rejected at
// once with reason rate_limited (tenancy.go says how, and how several
// gateways share the buckets). Config.NoLimits runs the same traffic
// without them.
//
// Without a rate, Config.DefaultRate (rate.go) offers each replica the
// workload's measured default-profile rate, scaled by how much the
// profile's engines serve (EstimateThroughput), so that a faster GPU is not
// left nearly idle. A request an engine refuses fails with the reason
// (results.Record.Fail), and Config.FailureReasons says what each reason
// means with the run's limits (max_model_len, the KV cache's blocks).
//
// With Config.TwoCores the router's KV index works on a second core
// (internal/lane); the engines' steps leave their prefix-cache insertions
// to it (engine.Group.HandOffStores), and prepare.go takes an open-loop
// source's arrivals ahead and hashes them, both as spare work of either
// core; a run gives the same bytes on one core or two.
//
// Start with Simulate (sim.go); events.go holds the event heap.
package fleet
