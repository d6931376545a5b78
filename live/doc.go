// Package live is `inferrail live`: the production OpenAI-compatible proxy
// that routes each request with the same router and the same gateway core
// the simulator proves (every policy, the approximate and the event-fed KV
// index, every admission rule, the queue) in front of real vLLM or SGLang
// replicas.
//
// Everything between "a request arrived" and "send it to replica r" is the
// deterministic state machine of package router/gateway, one Core per
// model, told the wall-clock time. This package adds only HTTP, sockets and
// one lock around the core (model.go holds it; no other file touches the
// core): the core's view of each replica (counters, caps, health and
// ejection, reports and restarts, KV events), admission and the queue are
// the simulator's, not a copy of them.
//
// A request's body is forwarded byte for byte (only its model, user,
// cache_salt, prompt and max_tokens fields are read, the model rewritten
// for an alias, and a client's kv_transfer_params dropped: only the proxy
// sets them); its prompt is tokenized at the edge on a bounded worker pool
// to predict what each replica has cached and to weigh its KV demand. The
// core then dispatches it, queues it, or rejects it. A queued request waits
// (by priority from the x-inferrail-priority header, fairly across tenants
// from x-inferrail-tenant or the body's user) until a later core call frees
// capacity and dispatches it, or until its deadline, which one goroutine per
// model sleeps until; a client that leaves takes it out of the queue. Every
// rejection is an OpenAI error: 429 with Retry-After (queue full, timed out,
// no capacity, shed), 503 with Retry-After (no healthy replica), 400 (too
// long); every answer says in x-inferrail-queued-ms how long it waited.
//
// The response streams back frame by frame. Failures before the first
// response byte (a streamed try silent past first_byte_timeout included) are
// retried on untried replicas (core.Retry); replicas that keep failing are
// ejected for a growing time, never more than a set share of a model's
// replicas; each replica's concurrency and pending requests are capped
// exactly. Each dispatch ends in the core exactly once (an attempt owns it),
// however the handler returns.
//
// With auth: keys a request needs an API key (tenancy, in a SQLite or
// Postgres store), whose id is its tenant and whose priority caps its own;
// limits per key, per key and model and global (RPM, TPM charged on the
// estimate and reconciled with the engine's usage, concurrency leases), in
// process or shared by every gateway through Redis, answer 429 with
// OpenAI's x-ratelimit-* headers; each request's usage is metered per key,
// model and hour, written in batches off the request path.
//
// Every wait is bounded and every failure visible: body reads, each write to
// the client, each engine's first byte and its silences mid-stream, the
// request as a whole; a client that reads slowly never holds an engine slot
// (a blocked write hands the engine's side to a goroutine that buffers it);
// a stream that breaks ends with vLLM's error event and an aborted response.
// Listeners cap their connections (internal/netguard), serve TLS with
// certificates re-read on change, and drain on shutdown with readiness
// failing first.
//
// Start with Server and New (server.go: the configuration is one
// live/config.Config, Deps what YAML cannot hold) and Serve (serve.go:
// listeners, TLS, drain), then proxy.go (one request's life up to its
// dispatch), relay.go (tries, the header policy, streaming the answer back),
// upstream.go (the HTTP/1.1 client to the engines), answer.go (what each
// answer teaches, read with internal/openai), streamusage.go (a stream's
// usage asked for the client and kept from it), model.go (the core, its lock,
// the waiters and the deadline goroutine), background.go (scrapes, probes,
// discovery), maxlen.go (max_model_len from the engines' /v1/models), kvsync.go (KV events to the core; kvmux.go the
// central mode, one bound socket every engine publishes to), pd.go (disaggregated
// prefill/decode: a request the core sends to a prefill replica first is
// prefilled there as vLLM's NixlConnector protocol says, then decoded, or
// prefilled locally when the prefill fails; docs/pd-live.md) and
// logging.go (the access log). responses.go is the Responses API's part:
// its prompt as the chat vLLM renders, and the replica that holds each
// stored response (a continuation is pinned there; GET /v1/responses/{id}
// passed to it); locate.go finds that replica for a response another
// gateway answered. tenancy.go is API keys, rate limits and usage metering on the
// request path (authenticate before the body, authorize once the model is
// known, reserve once the request is weighed, release when it ends), and
// admin.go the admin API that manages keys and reads usage and status.
// epp.go is `inferrail epp` (ServeEPP; epp_tls.go its TLS): the same inbound.go path
// behind Envoy's ext_proc as the Gateway API Inference Extension's endpoint
// picker (one stream's life in epp_stream.go, an InferencePool's pods as
// replicas in epp_pool.go, its InferenceObjectives' priorities in
// epp_objectives.go).
package live
