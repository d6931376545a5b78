// Package server is `inferrail engine`: a mock vLLM server whose requests are
// served by the same engine state machine the simulator uses (an
// engine.Group: one rank, or data_parallel_size ranks behind vLLM's load
// balancer), driven from one goroutine on wall-clock time. Steps start when
// the group asks; tokens stream out at each step's OutputAt.
//
// It speaks vLLM's OpenAI-compatible wire format (POST /v1/completions,
// /v1/chat/completions and /v1/responses, streaming and not, with GET
// /v1/responses/{id} behind Config.ResponsesStore; POST /v1/embeddings with package
// embed's deterministic embeddings; POST /score, /v1/score, /rerank,
// /v1/rerank and /v2/rerank scoring pairs with them; GET /v1/models, /health, /version,
// /metrics; POST /reset_prefix_cache), tokenizes with the builtin:sim
// tokenizer (engine/simtok), generates deterministic text (n > 1 as vLLM V1's
// parallel sampling: n engine requests sharing the prompt, merged into
// choices by index; choices.go), publishes KV cache
// events through a hook, aborts a request as soon as its client goes away and
// can inject faults for tests. With a KV connector (Config.KVTransfer,
// vLLM's --kv-transfer-config) it plays either side of disaggregated
// prefill/decode as vLLM's NixlConnector does: a producer answers a prefill
// with the kv_transfer_params a decode engine reads its KV with, a consumer
// reads that KV from the producer's side channel, waits the profile's
// transfer time and decodes (kvtransfer.go; docs/pd-live.md).
//
// Start with New and Server.Run (loop.go: the engine goroutine), then
// handlers.go (HTTP) and wire.go (the JSON bodies, field for field as vLLM
// writes them).
package server
