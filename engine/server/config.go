package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
)

// Config configures a mock engine server.
type Config struct {
	// Engine is the engine model: scheduler limits, KV blocks and the
	// step-time profile.
	Engine engine.Config
	// ServedModelNames are the model ids the server answers to (vLLM's
	// --served-model-name); the first is the one reported in responses and
	// metrics. Default: "inferrail-sim".
	ServedModelNames []string
	// EnablePromptTokensDetails adds usage.prompt_tokens_details.cached_tokens
	// (vLLM's --enable-prompt-tokens-details).
	EnablePromptTokensDetails bool
	// OutputTokens is where the mock model "stops" (emits its end of
	// sequence) when a request does not set ignore_eos: it generates
	// min(max_tokens, OutputTokens) tokens. 0 means it never stops early.
	OutputTokens int
	// DefaultMaxTokens is max_tokens for /v1/completions requests that omit
	// it (vLLM: 16). Chat requests that omit it may run to max_model_len.
	DefaultMaxTokens int
	// Seed makes generated text and injected faults reproducible.
	Seed uint64
	// Version is reported by /version.
	Version string
	// Faults injects failures for tests; the zero value injects none.
	Faults Faults
	// KVEvents, when set, receives every step's KV cache events (in step
	// order, from the engine goroutine; it must not block). Token ids of
	// stored blocks are available through tokens while the call lasts. It
	// needs Engine.EnableKVEvents.
	KVEvents func(at time.Time, events []engine.KVEvent, tokens func(kvblock.Hash) []uint32)
	// ResponsesStore is how many finished Responses API responses are kept
	// for GET /v1/responses/{id} and previous_response_id, the oldest
	// dropped first (vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1, which never
	// drops one). 0, the default, keeps none and ignores a request's
	// store: true, as vLLM does without that variable.
	ResponsesStore int
	// APIKey is vLLM's --api-key (VLLM_API_KEY): every request under /v1
	// must carry Authorization: Bearer APIKey, or is answered 401 as vLLM
	// answers it; the other paths (/health, /metrics, /version, ...) are
	// open. "" (the default) asks for none.
	APIKey string
	// MaxBodyBytes caps request bodies (default 64 MiB).
	MaxBodyBytes int64
	// KVTransfer is vLLM's --kv-transfer-config: the engine's part in
	// disaggregated prefill/decode (kvtransfer.go). The zero value is off.
	KVTransfer KVTransfer
	// TransferDial, when set, dials a producer's side channel for a
	// consumer's KV reads (tests: an in-memory network); default a TCP
	// dialer.
	TransferDial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Faults are failures injected at random (seeded) into requests, for
// testing clients and gateways. Rates are fractions of generation requests.
type Faults struct {
	// ErrorRate answers requests with ErrorStatus (default 500) and vLLM's
	// error body.
	ErrorRate   float64
	ErrorStatus int
	// CloseRate closes the connection before answering.
	CloseRate float64
	// HangRate never answers (the request is not scheduled) until the
	// client goes away.
	HangRate float64
	// StallRate stops a streaming response after half its tokens and keeps
	// the connection open until the client goes away.
	StallRate float64
	// GarbageMetrics serves an unparsable /metrics page.
	GarbageMetrics bool
}

func (f Faults) any() bool {
	return f.ErrorRate > 0 || f.CloseRate > 0 || f.HangRate > 0 || f.StallRate > 0
}

// DefaultModelName is the served model name when none is configured.
const DefaultModelName = "inferrail-sim"

func (c *Config) setDefaults() {
	if len(c.ServedModelNames) == 0 {
		c.ServedModelNames = []string{DefaultModelName}
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = 16
	}
	if c.Faults.ErrorStatus == 0 {
		c.Faults.ErrorStatus = 500
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 64 << 20
	}
	if c.Version == "" {
		c.Version = "dev"
	}
}

// Validate reports every problem with the configuration.
func (c Config) Validate() error {
	var errs []error
	if err := c.Engine.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("engine: %w", err))
	}
	for i, n := range c.ServedModelNames {
		if n == "" {
			errs = append(errs, fmt.Errorf("served model name %d is empty", i))
		}
	}
	if c.OutputTokens < 0 {
		errs = append(errs, fmt.Errorf("output tokens %d: must be >= 0", c.OutputTokens))
	}
	if c.DefaultMaxTokens < 0 {
		errs = append(errs, fmt.Errorf("default max tokens %d: must be >= 0", c.DefaultMaxTokens))
	}
	if c.ResponsesStore < 0 {
		errs = append(errs, fmt.Errorf("responses store %d: must be 0 (keep no responses) or the number of responses to keep", c.ResponsesStore))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max body bytes %d: must be >= 0", c.MaxBodyBytes))
	}
	f := c.Faults
	for _, r := range []struct {
		name string
		v    float64
	}{{"error rate", f.ErrorRate}, {"close rate", f.CloseRate}, {"hang rate", f.HangRate}, {"stall rate", f.StallRate}} {
		if !(r.v >= 0 && r.v <= 1) {
			errs = append(errs, fmt.Errorf("fault %s %v: must be within [0, 1]", r.name, r.v))
		}
	}
	if sum := f.ErrorRate + f.CloseRate + f.HangRate + f.StallRate; sum > 1 {
		errs = append(errs, fmt.Errorf("fault rates add up to %v: must be at most 1", sum))
	}
	if f.ErrorStatus != 0 && (f.ErrorStatus < 400 || f.ErrorStatus > 599) {
		errs = append(errs, fmt.Errorf("fault error status %d: must be a 4xx or 5xx code", f.ErrorStatus))
	}
	if err := c.KVTransfer.validate(); err != nil {
		errs = append(errs, fmt.Errorf("kv transfer config: %w", err))
	}
	if c.KVEvents != nil && !c.Engine.EnableKVEvents {
		errs = append(errs, errors.New("a KV event sink needs engine.enable_kv_events"))
	}
	return errors.Join(errs...)
}
