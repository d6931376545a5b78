// Package engine models one vLLM v1 engine as a deterministic state machine
// that is told the time.
//
// The engine never reads a clock, sleeps, starts goroutines or draws random
// numbers. The caller owns time (a time.Duration since the run started):
//
//	e.Add(now, req)          // enqueue
//	e.Abort(now, id)         // the client went away: free its slot and blocks at once
//	res := e.Step(now)       // run one scheduler iteration starting at now
//	at, ok := e.NextStep()   // when the engine wants to run next
//
// Step forms one continuous batch the way vLLM v1's scheduler does: running
// requests first (one decode token each, or the next chunk of a chunked
// prefill) within max_num_batched_tokens, then waiting requests in FIFO order
// while blocks, budget and max_num_seqs last, with no admissions in a step that
// preempted. Blocks live in a pool with a prefix cache keyed by chained block
// hashes (package kvblock), ref counts and an LRU free queue. The step's
// duration comes from the linear latency model in Profile; the scheduler's
// state (slots, blocks, finished requests) and the KV events change at the
// step's end, now+Duration, and its tokens reach the API server at
// Result.OutputAt: the end, or later by Profile.OutputLagSteps step
// durations and Profile.OutputDelayMs (vLLM's asynchronous scheduling and
// output processing), never before the previous step's tokens.
//
// KV tiers (tier.go, Config.KVTiers; off by default): a cached GPU block
// whose slot is reallocated offloads its hash to a CPU tier, an LRU whose
// oldest entries move on to an optional disk tier. An admission whose GPU
// prefix hit continues in the tiers loads those blocks back: the request
// waits in its place in the queue, skipped and without budget, for blocks
// x block_size x kv_bytes_per_token over the tier's bandwidth, then its
// loaded blocks count as cached. KV events carry the medium (GPU, CPU,
// DISK). A Request with RemotePrefill is the decode side of disaggregated
// prefill: its prompt's KV arrived from another engine, so it starts with
// the prompt computed but its last token; Config.TransferTime prices the
// transfer for the caller. See docs/tiered-kv.md.
//
// A Group (group.go) is what one endpoint serves: Config.Ranks() engines
// (data_parallel_size) behind vLLM's internal data-parallel load balancer,
// independent or, with enable_expert_parallel, stepping in lockstep. It has
// Engine's methods, so drivers take a Group: fleet's simulator (one replica
// is one Group), the mock server in engine/server, and with one rank it is a
// thin pass-through to that rank's Engine.
//
// Start with Engine (engine.go), then scheduler.go and pool.go; Config and
// Profile (config.go) hold the knobs and their YAML form; tier.go holds the
// lower KV tiers; group.go models data parallelism; handoff.go lets a
// step's prefix-cache insertions run on another goroutine.
package engine
