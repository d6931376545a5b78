package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"go.yaml.in/yaml/v3"
)

// Profile is the latency model: the duration of one engine step is linear in
// features of the batch, so that calibration can fit it by least squares:
//
//	T = StepFixed
//	  + PrefillToken   * prefill_tokens
//	  + PrefillPair    * sum_i new_i*(ctx_i + new_i/2)     (prefill attention)
//	  + DecodeSeq      * decode_seqs
//	  + DecodeCtxToken * decode_ctx_tokens                   (KV read by decodes)
//
// For one prompt of u uncached tokens after c cached ones this is the familiar
// P(u,c) = a*u + b*u*(c+u/2) + d.
type Profile struct {
	// StepFixedMs is the cost of any step (weights read, launch, sampling), in milliseconds.
	StepFixedMs float64 `yaml:"step_fixed_ms" json:"step_fixed_ms"`
	// PrefillTokenUs is the cost of each prefill token, in microseconds.
	PrefillTokenUs float64 `yaml:"prefill_token_us" json:"prefill_token_us"`
	// PrefillPairNs is the cost of each (new token, attended token) pair in prefill, in nanoseconds.
	PrefillPairNs float64 `yaml:"prefill_pair_ns" json:"prefill_pair_ns"`
	// DecodeSeqUs is the cost of each decoding sequence in the batch, in microseconds.
	DecodeSeqUs float64 `yaml:"decode_seq_us" json:"decode_seq_us"`
	// DecodeCtxTokenNs is the cost of each context token a decode reads, in nanoseconds.
	DecodeCtxTokenNs float64 `yaml:"decode_ctx_token_ns" json:"decode_ctx_token_ns"`
	// OutputLagSteps models vLLM's asynchronous scheduling: the tokens a
	// step produces reach the API server this many step durations after the
	// step ends (0: at its end; vLLM with async scheduling: about 1). The
	// scheduler's own state (slots, blocks) changes at the step's end.
	OutputLagSteps float64 `yaml:"output_lag_steps,omitempty" json:"output_lag_steps,omitempty"`
	// OutputDelayMs is the fixed time from a step's outputs to the API
	// server (output processing, IPC, detokenization), in milliseconds: it
	// shifts every token, so TTFT and end-to-end latency but not TPOT.
	OutputDelayMs float64 `yaml:"output_delay_ms,omitempty" json:"output_delay_ms,omitempty"`
}

// Batch holds the features of one step that the latency model prices.
type Batch struct {
	PrefillTokens   int64
	PrefillPairs    float64 // sum of new*(ctx+new/2) over prefill chunks
	DecodeSeqs      int64
	DecodeCtxTokens int64
}

// StepTime returns the modelled duration of a step with batch b, rounded to
// the nanosecond.
func (p Profile) StepTime(b Batch) time.Duration {
	// Explicit float64 conversions keep every product rounded on its own, so
	// the result does not depend on fused multiply-add on any platform.
	ms := float64(p.StepFixedMs) +
		float64(p.PrefillTokenUs*float64(b.PrefillTokens))/1e3 +
		float64(p.PrefillPairNs*b.PrefillPairs)/1e6 +
		float64(p.DecodeSeqUs*float64(b.DecodeSeqs))/1e3 +
		float64(p.DecodeCtxTokenNs*float64(b.DecodeCtxTokens))/1e6
	return time.Duration(math.Round(ms * 1e6))
}

// OutputAt returns when the tokens of a step that ends at end and lasted d
// reach the API server, given that the previous step's reached it at prev:
// end + OutputLagSteps*d + OutputDelayMs, but never before prev, so that a
// request's tokens never arrive out of order. With both terms zero it is
// end (steps end in order).
func (p Profile) OutputAt(end, d, prev time.Duration) time.Duration {
	at := end
	if p.OutputLagSteps != 0 {
		at += time.Duration(math.Round(float64(p.OutputLagSteps * float64(d))))
	}
	if p.OutputDelayMs != 0 {
		at += time.Duration(math.Round(float64(p.OutputDelayMs * 1e6)))
	}
	return max(at, prev)
}

// PrefillTime returns the modelled time of prefilling u uncached tokens after
// c cached ones alone in one step (no chunking): P(u,c).
func (p Profile) PrefillTime(u, c int) time.Duration {
	return p.StepTime(Batch{PrefillTokens: int64(u), PrefillPairs: float64(u) * (float64(c) + float64(u)/2)})
}

// Config is one engine's configuration: scheduler limits, KV cache and latency
// profile. Field names follow vLLM's flags.
type Config struct {
	// Name identifies the profile (model x GPU), for reports.
	Name string `yaml:"name" json:"name"`
	// BlockSize is tokens per KV block (--block-size).
	BlockSize int `yaml:"block_size" json:"block_size"`
	// NumGPUBlocks is the KV cache capacity in blocks (--num-gpu-blocks-override).
	NumGPUBlocks int `yaml:"num_gpu_blocks" json:"num_gpu_blocks"`
	// MaxNumSeqs caps running sequences (--max-num-seqs).
	MaxNumSeqs int `yaml:"max_num_seqs" json:"max_num_seqs"`
	// MaxNumBatchedTokens is the token budget of one step (--max-num-batched-tokens).
	MaxNumBatchedTokens int `yaml:"max_num_batched_tokens" json:"max_num_batched_tokens"`
	// LongPrefillTokenThreshold caps the prefill chunk of one request per
	// step; 0 means no cap beyond the budget (--long-prefill-token-threshold).
	LongPrefillTokenThreshold int `yaml:"long_prefill_token_threshold" json:"long_prefill_token_threshold"`
	// MaxModelLen bounds prompt + max_tokens (--max-model-len).
	MaxModelLen int `yaml:"max_model_len" json:"max_model_len"`
	// DisablePrefixCaching turns the prefix cache off (--no-enable-prefix-caching).
	DisablePrefixCaching bool `yaml:"disable_prefix_caching" json:"disable_prefix_caching"`
	// DataParallelSize is the number of engine ranks behind one endpoint
	// (--data-parallel-size); 0 or 1 is one rank. Each rank has its own
	// scheduler with the limits above (max_num_seqs, max_num_batched_tokens,
	// num_gpu_blocks are per rank, as vLLM's flags are), and vLLM's internal
	// load balancer spreads requests over them.
	DataParallelSize int `yaml:"data_parallel_size,omitempty" json:"data_parallel_size,omitempty"`
	// ExpertParallel (--enable-expert-parallel) makes the ranks of a
	// data-parallel group step in lockstep, as vLLM runs an expert-parallel
	// MoE model: every rank runs each forward pass together (an idle rank a
	// dummy batch), so a group step lasts as long as its slowest rank's.
	ExpertParallel bool `yaml:"enable_expert_parallel,omitempty" json:"enable_expert_parallel,omitempty"`
	// EnableKVEvents makes Step report BlockStored/BlockRemoved/AllBlocksCleared.
	EnableKVEvents bool `yaml:"enable_kv_events" json:"enable_kv_events"`
	// Latency is the step-time model.
	Latency Profile `yaml:"latency" json:"latency"`
}

// DefaultConfig approximates an 8B model (bf16) on one 24 GB GPU: about
// 64k tokens of KV cache (4,096 blocks of 16), ~12 ms decode steps, ~0.1 ms per
// prefill token.
func DefaultConfig() Config {
	return Config{
		Name:                "default-8b-24gb",
		BlockSize:           16,
		NumGPUBlocks:        4096,
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 2048,
		MaxModelLen:         32768,
		Latency: Profile{
			StepFixedMs:      12,
			PrefillTokenUs:   90,
			PrefillPairNs:    3.3,
			DecodeSeqUs:      150,
			DecodeCtxTokenNs: 128,
		},
	}
}

// Validate checks c once; every message names the YAML field and what is allowed.
func (c *Config) Validate() error {
	var errs []error
	// The upper bounds keep a typo from allocating more memory than any
	// machine has (the block pool is allocated up front).
	pos := func(name string, v, most int) {
		if v <= 0 || v > most {
			errs = append(errs, fmt.Errorf("%s: must be an integer from 1 to %d, got %d", name, most, v))
		}
	}
	pos("block_size", c.BlockSize, 1024)
	pos("num_gpu_blocks", c.NumGPUBlocks, 1<<24)
	pos("max_num_seqs", c.MaxNumSeqs, 1<<20)
	pos("max_num_batched_tokens", c.MaxNumBatchedTokens, 1<<24)
	pos("max_model_len", c.MaxModelLen, 1<<26)
	if c.DataParallelSize < 0 || c.DataParallelSize > 1024 {
		errs = append(errs, fmt.Errorf("data_parallel_size: must be 0 or 1 (one rank) up to 1024, got %d", c.DataParallelSize))
	}
	if c.LongPrefillTokenThreshold < 0 {
		errs = append(errs, fmt.Errorf("long_prefill_token_threshold: must be 0 (off) or positive, got %d", c.LongPrefillTokenThreshold))
	}
	coef := func(name string, v float64, strict bool) {
		switch {
		case math.IsNaN(v) || math.IsInf(v, 0):
			errs = append(errs, fmt.Errorf("latency.%s: must be a finite number, got %v", name, v))
		case strict && v <= 0:
			errs = append(errs, fmt.Errorf("latency.%s: must be positive, got %v", name, v))
		case v < 0:
			errs = append(errs, fmt.Errorf("latency.%s: must be zero or positive, got %v", name, v))
		}
	}
	coef("step_fixed_ms", c.Latency.StepFixedMs, true)
	coef("prefill_token_us", c.Latency.PrefillTokenUs, true)
	coef("prefill_pair_ns", c.Latency.PrefillPairNs, false)
	coef("decode_seq_us", c.Latency.DecodeSeqUs, false)
	coef("decode_ctx_token_ns", c.Latency.DecodeCtxTokenNs, false)
	coef("output_lag_steps", c.Latency.OutputLagSteps, false)
	coef("output_delay_ms", c.Latency.OutputDelayMs, false)
	if c.Latency.OutputLagSteps > 8 {
		errs = append(errs, fmt.Errorf("latency.output_lag_steps: must be at most 8 steps, got %v", c.Latency.OutputLagSteps))
	}
	return errors.Join(errs...)
}

// ParseConfig reads a profile from YAML: fields absent from data keep their
// DefaultConfig values, unknown fields are errors, and the result is validated.
func ParseConfig(data []byte) (Config, error) {
	c := DefaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("parse profile: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("invalid profile: %w", err)
	}
	return c, nil
}

// LoadConfig reads a profile YAML file (see ParseConfig).
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read profile: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Ranks returns the number of engine ranks in the group: DataParallelSize,
// at least 1.
func (c *Config) Ranks() int { return max(c.DataParallelSize, 1) }
