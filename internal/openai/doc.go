// Package openai reads and writes the wire format of OpenAI-compatible
// inference servers (vLLM, SGLang, llm-d-inference-sim, inferrail engine)
// for the parts of this project that talk to them: the load generator
// (bench), the calibrator (calibrate) and the proxy (live).
//
// Start with Reader (reader.go): an incremental server-sent event reader
// for /v1/completions, /v1/chat/completions and /v1/responses (the
// Responses API's named events) streams, fed the body's
// bytes as they arrive together with a clock reading, so that what it
// returns is a pure function of its input:
//
//	var r openai.Reader
//	for each chunk p of the body, read at now:
//		events, err := r.Feed(p, now)
//		for i := range events { ... events[i].Text, .Usage, .Kind ... }
//	at the end of the body:
//		events, err := r.End(now)
//
// Each Event (event.go) holds the first choice's text delta (or reasoning
// delta), its finish reason, the usage, an error vLLM wrote into the
// stream, or [DONE]. Answer (answer.go) adds events up into what a whole
// response said. ParseResponse reads a non-streamed body into the same
// fields. decode.go is the JSON decoder behind both: strict, and free of
// allocations for text and usage.
//
// writer.go writes what vLLM writes when a stream fails after its start
// (AppendErrorEvent), and ErrorBody is OpenAI's error body. end.go reads a
// stream's end after its [DONE] within DoneGrace (ReadEnd), so that a
// client keeps its connection to an engine that ends the response in a
// write of its own, as vLLM's server does.
package openai
