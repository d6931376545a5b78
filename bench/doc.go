// Package bench is `inferrail bench`: an open-loop load generator for
// OpenAI-compatible servers (vLLM, SGLang, inferrail engine, inferrail
// live). It sends a workload or a replayed trace on its own schedule,
// whatever the server's responses, renders prompts as real text from the
// request model's segments (builtin:sim words), and measures time to first
// token, time per output token, inter-token latency and end-to-end latency
// from each request's scheduled time, so a slow server cannot hide its
// queueing (no coordinated omission). Send lag, the delay between a
// request's schedule and its bytes leaving, is recorded too.
//
// Its records and summary are the simulator's (package results), so runs
// against live servers and simulations compare side by side, but it never
// makes up what the server did not say: the router's cached-token
// predictions come only from answers that carried
// x-inferrail-predicted-cached-tokens (Output.Predictions), and without
// prompt_tokens_details.cached_tokens in any answer the hit rate is unknown
// (Output.HitRateKnown, Output.Warnings).
//
// Start with Run. Responses are read with internal/openai's stream reader;
// Output.Report is what --json prints (and --out writes as summary.json),
// Output.WriteText what the command prints otherwise; ParseHeader reads a
// --header.
package bench
