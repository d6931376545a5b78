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
//   - w2: multi-turn chat, closed loop. Sessions start as an open-loop
//     process; each turn resends the whole conversation so far, and the next
//     turn arrives a think time after the previous one completes.
//   - w3: agent loops, closed loop. A task is a session: an agent type's
//     system prompt and a fresh task description, then steps that each
//     resend the whole context plus the previous step's short output (a tool
//     call) and a fresh tool result, a tool latency after the previous step
//     completes. Steps are planned at the task's start and cut to
//     max_model_len.
//   - w4: RAG over popular documents. A shared system prompt, a few distinct
//     documents of a corpus drawn by Zipf popularity and placed most popular
//     first (or shuffled), and a fresh question.
//   - w5: few-shot evaluation batches, bursty. Batches of requests arrive
//     within a short window and share a long few-shot prefix (fresh per batch
//     or one of a few benchmarks), each with a fresh question and a short
//     answer; requests are handed out in arrival order.
//   - w6: no sharing, the control. Every prompt is one fresh segment.
//   - w7: overload bursts. Periodic bursts of heavy requests (long, mostly
//     unique prompts after a short shared system prompt), each burst
//     arriving within a short window and asking for about 6x the KV cache
//     of four default replicas, over a light open-loop background stream
//     (see W7Params for the arithmetic).
//
// Every open-loop process (the requests of w1, w4 and w6; the session, task
// and batch starts of w2, w3 and w5; the background of w7) follows
// Config.Arrival: Poisson by default, or gamma inter-arrival times of a
// chosen coefficient of variation for bursty (cv > 1) or smooth (cv < 1)
// load.
//
// Any workload may carry a tenant/priority mix (Config.Mix, or ParseMix for
// a flag such as "a:0:0.7,b:1:0.3"): each request, or for w2 and w3 each
// session, draws a class by its share and gets its Request.Tenant and
// Request.Priority. Without a mix every request has tenant "" and priority
// 0.
//
// Tenants of the mix may have rate limits (Config.Tenants, tenants.go), as
// API keys have in live:
//
//	mix:
//	  - {tenant: alpha, priority: 0, share: 2}
//	  - {tenant: noisy, priority: 0, share: 9}
//	tenants:
//	  alpha: {rpm: 300}
//	  noisy: {rpm: 54, tpm: 0, max_concurrency: 0}
//
// rpm, tpm and max_concurrency are requests per minute, tokens per minute
// (prompt + completion) and requests in flight, 0 meaning unlimited. This
// package only validates them (each in [0, 2^40], every tenant one of the
// mix, a TPM that at least one request could fit); the simulator (package
// fleet) charges them through the same limiter the proxy uses
// (tenancy/limit). A tenant's offered rate is Rate × its share / the sum of
// shares, so a noisy tenant at 10x its limit is a share whose rate is ten
// times its rpm / 60 (above: 15 req/s in all, noisy 9 req/s = 540 per
// minute against rpm 54). Config.WithoutTenants leaves tenants out of a
// run while drawing their requests, so the other tenants' requests are
// exactly those of the whole workload: the baseline that shows what a
// noisy tenant costs the others (examples/tenants-noisy.yaml).
//
// Start reading at Request and Source (request.go), then Config
// (config.go): DefaultConfig or LoadConfig, then New. Generation is
// deterministic: every generator owns its random streams, seeded from
// Config.Seed and a per-purpose label, so the same Config yields the same
// request stream bit for bit, and there is no global mutable state. The mix
// draws from a stream of its own, so adding one changes no prompt, output or
// arrival. The default streams of w1, w2 and w6 are pinned by
// testdata/golden_streams.txt; those of w7 and of w1, w2 and w7 under a mix
// by testdata/golden_w7_mix.txt.
package workload
