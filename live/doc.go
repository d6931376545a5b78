// Package live is `inferrail live`: the production OpenAI-compatible proxy
// that routes each request with the same router the simulator proves (every
// policy, the approximate and the event-fed KV index) in front of real vLLM
// or SGLang replicas.
//
// A request's body is forwarded byte for byte (only its model field is
// read, and rewritten for an alias); its prompt is tokenized at the edge on a
// bounded worker pool to predict what each replica has cached; the response
// streams back frame by frame. Failures before the first response byte are
// retried on untried replicas; replicas that keep failing are ejected for a
// growing time, never more than a set share of a model's replicas; each
// replica's concurrency and queue are capped exactly.
//
// Start with Server (server.go), then proxy.go (one request's life), model.go
// (routing state and health) and kvsync.go (KV events to the index).
package live
