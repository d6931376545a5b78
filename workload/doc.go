// Package workload is the simulator's request model and its seeded synthetic
// workload generators.
//
// A Request carries its prompt as a chain of kvblock.Segments: equal segment
// IDs mean equal tokens, so requests that share leading segments share KV-cache
// blocks. A Source produces one run's requests: open-loop arrivals through
// Next, and, for closed-loop workloads, follow-up requests through Done.
//
// The workloads (see Names):
//
//   - w1: shared system prompts. A fixed set of long system prompts, chosen
//     uniformly or by Zipf popularity, each followed by a fresh question.
//   - w2: multi-turn chat, closed loop. Sessions arrive as a Poisson process;
//     each turn resends the whole conversation so far, and the next turn
//     arrives a think time after the previous one completes.
//   - w6: no sharing, the control. Every prompt is one fresh segment.
//
// Start reading at Request and Source (request.go), then Config
// (config.go): DefaultConfig or LoadConfig, then New. Generation is
// deterministic: every generator owns its random streams, seeded from
// Config.Seed and a per-purpose label, so the same Config yields the same
// request stream bit for bit, and there is no global mutable state.
package workload
