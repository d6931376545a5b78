package openai

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// Kind is what an event is.
type Kind uint8

// The kinds of event.
const (
	// KindChunk is a completion chunk: a choice's delta, a finish reason,
	// usage, or any mix of them (or none: every JSON object that is not an
	// error is a chunk).
	KindChunk Kind = iota + 1
	// KindDone is the stream's last event: data: [DONE], or a Responses
	// API stream's response.completed or response.incomplete (which carry
	// the usage).
	KindDone
	// KindError is an error the server wrote into the stream after its
	// start, as vLLM does: data: {"error": {...}}. An {"object": "error",
	// ...} object (older vLLM, SGLang) is one too, and in a Responses API
	// stream an error event ({"type": "error", "code": ..., "message":
	// ...}) or response.failed.
	KindError
)

func (k Kind) String() string {
	switch k {
	case KindChunk:
		return "chunk"
	case KindDone:
		return "done"
	case KindError:
		return "error"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one server-sent event of a /v1/completions or
// /v1/chat/completions stream, decoded as far as the load generator, the
// calibrator and the proxy need it. Of the choices only the first is read
// (the streams this project sends ask for n = 1; vLLM sends the choices of
// n > 1 in separate chunks, each with its Index).
//
// A /v1/responses stream (the Responses API) is read into the same
// fields: response.output_text.delta's delta is Text, a reasoning delta
// Reasoning, the usage of the response an event carries (input_tokens,
// output_tokens) is Usage, and its id ResponseID.
//
// Text, Reasoning and ResponseID point into the Reader's memory: they are
// valid until its next Feed, End or Reset.
type Event struct {
	Kind Kind
	// At is the clock reading passed to the Feed (or End) whose bytes
	// completed the event.
	At time.Duration
	// Choices is the length of the chunk's choices array: 0 in a usage-only
	// chunk.
	Choices int
	// Index is the first choice's index.
	Index int
	// Text is the first choice's generated text, decoded: text
	// (completions), delta.content (chat), or message.content (a
	// non-streamed chat response). Empty in a role-only or finish-only
	// chunk.
	Text []byte
	// Reasoning is the first choice's reasoning text (reasoning_content,
	// else reasoning, of its delta or message), which reasoning models
	// stream apart from Text.
	Reasoning []byte
	// FinishReason is the first choice's finish_reason, "" while null.
	FinishReason string
	// Usage is the chunk's usage, when HasUsage: the last chunk of a stream
	// with stream_options.include_usage, or every chunk with
	// continuous_usage_stats.
	Usage    Usage
	HasUsage bool
	// Error is what a KindError event says.
	Error *ErrorInfo
	// ResponseID is the id of the Responses API response the event
	// carries, or of a response body; nil for anything else.
	ResponseID []byte
}

// Generated reports whether the event carried generated text, visible or
// reasoning: a token (or several) the server produced.
func (e *Event) Generated() bool { return len(e.Text) > 0 || len(e.Reasoning) > 0 }

// Usage is a response's token counts.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// The Responses API calls PromptTokens input_tokens and
	// CompletionTokens output_tokens.
	//
	// CachedTokens is prompt_tokens_details.cached_tokens, the prompt tokens
	// found in the prefix cache; -1 when the server left it out (vLLM
	// without --enable-prompt-tokens-details).
	CachedTokens int
}

// ErrorBody is OpenAI's error body, {"error": {...}}: a failed request's
// JSON response, and the data of the error event vLLM writes into a stream
// (see AppendErrorEvent).
type ErrorBody struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo is an error body's error. As an error, it reads "TYPE (CODE):
// MESSAGE".
type ErrorInfo struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	// Param names the request field at fault, or is nil (null).
	Param *string `json:"param"`
	Code  Code    `json:"code"`
}

func (e *ErrorInfo) Error() string {
	s := e.Message
	if s == "" {
		s = "no message"
	}
	switch c := e.Code.String(); {
	case e.Type != "" && c != "":
		return fmt.Sprintf("%s (%s): %s", e.Type, c, s)
	case e.Type != "":
		return e.Type + ": " + s
	case c != "":
		return c + ": " + s
	}
	return s
}

type codeKind uint8

const (
	codeNull codeKind = iota
	codeString
	codeNumber
)

// Code is an error's code: a string identifier in OpenAI's API (such as
// "rate_limit_exceeded"; inferrail live's refusals say "queue_full" and the
// like), a number in vLLM's (the HTTP status), or null, the zero Code.
type Code struct {
	kind  codeKind
	s     string // the string, or the number as written
	n     int
	isInt bool
}

// StringCode is the code s.
func StringCode(s string) Code { return Code{kind: codeString, s: s} }

// NumberCode is the code n, as vLLM writes an HTTP status.
func NumberCode(n int) Code { return Code{kind: codeNumber, s: strconv.Itoa(n), n: n, isInt: true} }

// IsNull reports whether the code is null (or absent).
func (c Code) IsNull() bool { return c.kind == codeNull }

// String returns a string code, a number code as written, or "" for null.
func (c Code) String() string { return c.s }

// Text returns a string code, and false for a number or null.
func (c Code) Text() (string, bool) {
	if c.kind != codeString {
		return "", false
	}
	return c.s, true
}

// Number returns a number code that is an integer, and false for anything
// else.
func (c Code) Number() (int, bool) { return c.n, c.kind == codeNumber && c.isInt }

// MarshalJSON writes the code as a JSON string, number or null.
func (c Code) MarshalJSON() ([]byte, error) {
	switch c.kind {
	case codeString:
		return json.Marshal(c.s)
	case codeNumber:
		return []byte(c.s), nil
	}
	return []byte("null"), nil
}

// UnmarshalJSON reads a JSON string or number; anything else is null.
func (c *Code) UnmarshalJSON(b []byte) error {
	var d decoder
	d.b = trimJSONSpace(b)
	*c = d.code()
	if d.err == nil && d.i < len(d.b) {
		d.fail("invalid character after the code")
	}
	return d.err
}
