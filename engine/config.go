package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/inferrail/inferrail/internal/yamlerr"
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
	// KVBytesPerToken is the KV cache one token takes on this engine, in
	// bytes, over every layer and every GPU of the engine (one data-parallel
	// rank): 2 (K and V) x layers x KV heads x head_dim x dtype bytes for
	// grouped-query attention, times the tensor-parallel GPUs that each hold
	// a share (or a replica). It prices loads from the lower KV tiers and P/D
	// transfers (TransferTime); 0 means unknown (no tiers allowed, transfers
	// cost their base latency only).
	KVBytesPerToken float64 `yaml:"kv_bytes_per_token" json:"kv_bytes_per_token"`
	// KVTiers are the CPU and disk tiers under the GPU prefix cache (vLLM's
	// KV offloading); all zero is off.
	KVTiers KVTiers `yaml:"kv_tiers,omitempty" json:"kv_tiers,omitempty"`
	// PDTransfer prices moving a prompt's KV from a prefill engine to a
	// decode engine (TransferTime). The engine itself never waits for a
	// transfer: a driver delays a RemotePrefill request by it.
	PDTransfer PDTransfer `yaml:"pd_transfer,omitempty" json:"pd_transfer,omitempty"`
}

// KVTiers configures the lower KV cache tiers of one engine (one rank): a
// GPU block whose cached hash is evicted moves to the CPU tier, an LRU of
// CPUBlocks hashes, whose least recently used hash moves on to the disk
// tier (an LRU of DiskBlocks) or is dropped. A prompt whose next blocks
// after its GPU prefix hit are in a lower tier loads them back before it
// computes, at the tier's bandwidth. Blocks are GPU-sized (block_size
// tokens). Zero values are off; see docs/tiered-kv.md.
type KVTiers struct {
	// CPUBlocks is the capacity of the CPU tier in blocks (vLLM's
	// OffloadingConnector num_cpu_blocks, BLIS --kv-cpu-blocks); 0 is off.
	CPUBlocks int `yaml:"cpu_blocks,omitempty" json:"cpu_blocks,omitempty"`
	// CPUBandwidthGBps is how fast blocks load from host memory back to the
	// GPUs of the engine, in GB/s (1e9 bytes per second); 0 takes CPULink's.
	CPUBandwidthGBps float64 `yaml:"cpu_bandwidth_gbps,omitempty" json:"cpu_bandwidth_gbps,omitempty"`
	// CPULink names a bandwidth preset for the CPU tier (pcie-gen4,
	// pcie-gen5; see LinkPresets), used when CPUBandwidthGBps is 0.
	CPULink string `yaml:"cpu_link,omitempty" json:"cpu_link,omitempty"`
	// DiskBlocks is the capacity of the disk tier in blocks; it needs a CPU
	// tier. 0 is off.
	DiskBlocks int `yaml:"disk_blocks,omitempty" json:"disk_blocks,omitempty"`
	// DiskBandwidthGBps is how fast blocks load from disk back to the GPUs,
	// in GB/s; 0 takes DiskLink's.
	DiskBandwidthGBps float64 `yaml:"disk_bandwidth_gbps,omitempty" json:"disk_bandwidth_gbps,omitempty"`
	// DiskLink names a bandwidth preset for the disk tier (nvme, pcie-gen4,
	// pcie-gen5), used when DiskBandwidthGBps is 0.
	DiskLink string `yaml:"disk_link,omitempty" json:"disk_link,omitempty"`
	// HostMemoryGB is the host memory available to the CPU tier, in GB (1e9
	// bytes); when set, cpu_blocks x block_size x kv_bytes_per_token must fit
	// in it. 0 is unchecked.
	HostMemoryGB float64 `yaml:"host_memory_gb,omitempty" json:"host_memory_gb,omitempty"`
}

// Link is a named bandwidth preset for a KV tier.
type Link struct {
	Name          string
	BandwidthGBps float64
	// Disk reports that the preset describes a storage device, valid for
	// the disk tier only.
	Disk bool
}

// links are the bandwidth presets kv_tiers.cpu_link and kv_tiers.disk_link
// accept: effective host-to-device rates, below the links' raw rates.
//
//   - pcie-gen5: a PCIe 5.0 x16 link carries 32 GT/s x 16 lanes with
//     128b/130b coding, 63 GB/s per direction; pinned host-to-device copies
//     reach about 50 GB/s (H100/H200/B200 hosts).
//   - pcie-gen4: PCIe 4.0 x16, 31.5 GB/s raw per direction; about 25 GB/s
//     effective (A100, L40S, RTX 4090 hosts).
//   - nvme: one PCIe 4.0 x4 NVMe SSD, about 7 GB/s sequential read on data
//     sheets (e.g. 7.0-7.4 GB/s); 6 GB/s for block-sized reads through the
//     file system.
//
// The presets are one link: an engine whose tensor-parallel GPUs each load
// their share of a block over their own link moves TP times as much; give
// the bandwidth explicitly then (cpu_bandwidth_gbps: 4 x 50 for TP 4 on
// PCIe 5.0).
var links = []Link{
	{Name: "pcie-gen5", BandwidthGBps: 50},
	{Name: "pcie-gen4", BandwidthGBps: 25},
	{Name: "nvme", BandwidthGBps: 6, Disk: true},
}

// LinkPresets returns the KV tier bandwidth presets (a copy).
func LinkPresets() []Link { return slices.Clone(links) }

// linkBandwidth returns a preset's bandwidth, 0 for "" or an unknown name
// (or one not valid for the tier).
func linkBandwidth(name string, disk bool) float64 {
	for _, l := range links {
		if l.Name == name && (disk || !l.Disk) {
			return l.BandwidthGBps
		}
	}
	return 0
}

func linkNames(disk bool) string {
	var b []byte
	for _, l := range links {
		if l.Disk && !disk {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = fmt.Appendf(b, "%s (%g GB/s)", l.Name, l.BandwidthGBps)
	}
	return string(b)
}

// CPUBandwidth returns the CPU tier's load bandwidth in GB/s:
// CPUBandwidthGBps, else CPULink's preset, else 0.
func (t KVTiers) CPUBandwidth() float64 {
	if t.CPUBandwidthGBps != 0 {
		return t.CPUBandwidthGBps
	}
	return linkBandwidth(t.CPULink, false)
}

// DiskBandwidth returns the disk tier's load bandwidth in GB/s:
// DiskBandwidthGBps, else DiskLink's preset, else 0.
func (t KVTiers) DiskBandwidth() float64 {
	if t.DiskBandwidthGBps != 0 {
		return t.DiskBandwidthGBps
	}
	return linkBandwidth(t.DiskLink, true)
}

// Enabled reports whether the engine has a CPU tier (and so any tier).
func (t KVTiers) Enabled() bool { return t.CPUBlocks > 0 }

// WithLinks returns t with cpuLink and diskLink as the link presets of the
// tiers that are on (blocks set) and give neither a bandwidth nor a link:
// a driver's default links, which never override the profile. The names
// are checked by Config.Validate.
func (t KVTiers) WithLinks(cpuLink, diskLink string) KVTiers {
	if t.CPUBlocks > 0 && t.CPUBandwidthGBps == 0 && t.CPULink == "" {
		t.CPULink = cpuLink
	}
	if t.DiskBlocks > 0 && t.DiskBandwidthGBps == 0 && t.DiskLink == "" {
		t.DiskLink = diskLink
	}
	return t
}

// The P/D transfer defaults, BLIS's (inference-sim --pd-transfer-bandwidth,
// "NIXL RDMA default", and --pd-transfer-base-latency).
const (
	DefaultPDBandwidthGBps = 25
	DefaultPDBaseLatencyMs = 0.05
)

// PDTransfer prices the KV transfer of disaggregated prefill: base latency
// plus bytes over bandwidth. The zero value (a Config built without
// DefaultConfig) means the defaults; once any field is set, the bandwidth
// must be positive, and a profile that writes bandwidth_gbps at all must
// give a positive one.
type PDTransfer struct {
	// BandwidthGBps is the transfer bandwidth between a prefill and a
	// decode engine, in GB/s (default 25).
	BandwidthGBps float64 `yaml:"bandwidth_gbps" json:"bandwidth_gbps"`
	// BaseLatencyMs is the fixed cost of one transfer, in milliseconds
	// (default 0.05).
	BaseLatencyMs float64 `yaml:"base_latency_ms" json:"base_latency_ms"`
}

// DefaultPDTransfer returns BLIS's defaults: 25 GB/s, 0.05 ms.
func DefaultPDTransfer() PDTransfer {
	return PDTransfer{BandwidthGBps: DefaultPDBandwidthGBps, BaseLatencyMs: DefaultPDBaseLatencyMs}
}

// Resolved is p, or the defaults for the zero value: the transfer
// TransferTime prices.
func (p PDTransfer) Resolved() PDTransfer {
	if p == (PDTransfer{}) {
		return DefaultPDTransfer()
	}
	return p
}

// KVBytes returns the KV cache bytes of tokens tokens on this engine.
func (c *Config) KVBytes(tokens int) float64 {
	return float64(float64(tokens) * c.KVBytesPerToken)
}

// TransferTime returns the modelled time to move the KV of tokens tokens
// from a prefill engine to this one: pd_transfer.base_latency_ms +
// tokens x kv_bytes_per_token / pd_transfer.bandwidth_gbps, rounded to the
// nanosecond (1 GB/s is one byte per nanosecond). tokens <= 0 costs the
// base latency; an invalid configuration (a bandwidth not positive) costs
// the base latency plus nothing for the bytes. It saturates at the largest
// Duration.
func (c *Config) TransferTime(tokens int) time.Duration {
	p := c.PDTransfer.Resolved()
	ns := float64(p.BaseLatencyMs * 1e6)
	if tokens > 0 && p.BandwidthGBps > 0 {
		ns += float64(c.KVBytes(tokens) / p.BandwidthGBps)
	}
	return nanoseconds(ns)
}

// nanoseconds rounds ns to a Duration, saturating past the largest one.
func nanoseconds(ns float64) time.Duration {
	if !(ns < math.MaxInt64) {
		return math.MaxInt64
	}
	return time.Duration(math.Round(ns))
}

// TierLoadTime returns the modelled time to load cpuBlocks blocks from the
// CPU tier and diskBlocks from the disk tier back to the GPU: the sum over
// the tiers of blocks x block_size x kv_bytes_per_token / bandwidth,
// rounded to the nanosecond once. A tier without a positive bandwidth
// costs nothing.
func (c *Config) TierLoadTime(cpuBlocks, diskBlocks int) time.Duration {
	ns := 0.0
	if bw := c.KVTiers.CPUBandwidth(); cpuBlocks > 0 && bw > 0 {
		ns += float64(c.KVBytes(cpuBlocks*c.BlockSize) / bw)
	}
	if bw := c.KVTiers.DiskBandwidth(); diskBlocks > 0 && bw > 0 {
		ns += float64(c.KVBytes(diskBlocks*c.BlockSize) / bw)
	}
	return nanoseconds(ns)
}

// LowerTierBlocks is what a replica of this engine holds in its lower KV
// tiers (CPU and disk, every data-parallel rank's), in blocks: the capacity
// a router's tier index gives each replica; 0 without tiers.
func (c *Config) LowerTierBlocks() int {
	return (c.KVTiers.CPUBlocks + c.KVTiers.DiskBlocks) * c.Ranks()
}

// TierLoadNsPerToken is the time to load one token's KV back from the CPU
// tier, in nanoseconds (kv_bytes_per_token over the tier's GB/s, unrounded),
// for a router that prices tier hits; 0 without a CPU tier.
func (c *Config) TierLoadNsPerToken() float64 {
	bw := c.KVTiers.CPUBandwidth()
	if !c.KVTiers.Enabled() || !(bw > 0) {
		return 0
	}
	return c.KVBytesPerToken / bw
}

// DefaultConfig approximates an 8B model (bf16) on one 24 GB GPU: about
// 64k tokens of KV cache (4,096 blocks of 16), ~12 ms decode steps, ~0.1 ms per
// prefill token. Its KV is Llama-3.1-8B's in bf16, 2 x 32 layers x 8 KV
// heads x 128 x 2 bytes = 131,072 bytes per token; no KV tiers; BLIS's P/D
// transfer defaults.
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
		KVBytesPerToken: 131072,
		PDTransfer:      DefaultPDTransfer(),
	}
}

// Validate checks c once; every message names the YAML field and what is allowed.
func (c *Config) Validate() error { return c.validate(false) }

// maxKVBytesPerToken bounds kv_bytes_per_token (a typo guard: the largest
// models keep a few MB per token).
const maxKVBytesPerToken = 1 << 30

// maxTierBlocks bounds kv_tiers.cpu_blocks and disk_blocks (a tier grows
// with its content, but a block id is an int32).
const maxTierBlocks = 1 << 28

// validate is Validate; pdBandwidthGiven says that a profile wrote
// pd_transfer.bandwidth_gbps, which must then be positive even if the
// section reads as the zero value.
func (c *Config) validate(pdBandwidthGiven bool) error {
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
	errs = c.validateKV(errs, pdBandwidthGiven)
	return errors.Join(errs...)
}

// validateKV checks kv_bytes_per_token, kv_tiers and pd_transfer.
func (c *Config) validateKV(errs []error, pdBandwidthGiven bool) []error {
	finite := func(name string, v float64) bool {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("%s: must be a finite number, got %v", name, v))
			return false
		}
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s: must be zero or positive, got %v", name, v))
			return false
		}
		return true
	}
	kvOK := finite("kv_bytes_per_token", c.KVBytesPerToken)
	if kvOK && c.KVBytesPerToken > maxKVBytesPerToken {
		errs = append(errs, fmt.Errorf("kv_bytes_per_token: must be at most %g bytes, got %g", float64(maxKVBytesPerToken), c.KVBytesPerToken))
		kvOK = false
	}

	t := c.KVTiers
	blocks := func(name string, v int) bool {
		if v < 0 || v > maxTierBlocks {
			errs = append(errs, fmt.Errorf("%s: must be 0 (off) or an integer up to %d, got %d", name, maxTierBlocks, v))
			return false
		}
		return true
	}
	cpuOK := blocks("kv_tiers.cpu_blocks", t.CPUBlocks)
	diskOK := blocks("kv_tiers.disk_blocks", t.DiskBlocks)
	link := func(name, v string, disk bool) {
		if v != "" && linkBandwidth(v, disk) == 0 {
			errs = append(errs, fmt.Errorf("%s: unknown link %q, want one of %s", name, v, linkNames(disk)))
		}
	}
	link("kv_tiers.cpu_link", t.CPULink, false)
	link("kv_tiers.disk_link", t.DiskLink, true)
	cpuBW := finite("kv_tiers.cpu_bandwidth_gbps", t.CPUBandwidthGBps)
	diskBW := finite("kv_tiers.disk_bandwidth_gbps", t.DiskBandwidthGBps)
	hostOK := finite("kv_tiers.host_memory_gb", t.HostMemoryGB)
	if cpuOK && t.CPUBlocks > 0 {
		if cpuBW && t.CPUBandwidth() <= 0 {
			errs = append(errs, fmt.Errorf("kv_tiers.cpu_bandwidth_gbps: must be positive when cpu_blocks is set (or set kv_tiers.cpu_link to one of %s)", linkNames(false)))
		}
		if kvOK && c.KVBytesPerToken <= 0 {
			errs = append(errs, errors.New("kv_bytes_per_token: must be positive when kv_tiers.cpu_blocks is set (a tier's load time is bytes over bandwidth)"))
		}
		if c.DisablePrefixCaching {
			errs = append(errs, errors.New("kv_tiers.cpu_blocks: a KV tier holds evicted prefix-cache blocks, so it needs the prefix cache: drop disable_prefix_caching or the tiers"))
		}
		if need := float64(t.CPUBlocks) * float64(c.BlockSize) * c.KVBytesPerToken; hostOK && kvOK && t.HostMemoryGB > 0 && need > t.HostMemoryGB*1e9 {
			errs = append(errs, fmt.Errorf("kv_tiers.cpu_blocks: %d blocks x %d tokens x %g bytes per token = %.4g GB do not fit in kv_tiers.host_memory_gb %g GB; at most %d blocks fit",
				t.CPUBlocks, c.BlockSize, c.KVBytesPerToken, need/1e9, t.HostMemoryGB, int(t.HostMemoryGB*1e9/(float64(c.BlockSize)*c.KVBytesPerToken))))
		}
	}
	if diskOK && t.DiskBlocks > 0 {
		if cpuOK && t.CPUBlocks == 0 {
			errs = append(errs, errors.New("kv_tiers.disk_blocks: a disk tier needs a CPU tier (blocks reach disk from the CPU tier): set kv_tiers.cpu_blocks"))
		}
		if diskBW && t.DiskBandwidth() <= 0 {
			errs = append(errs, fmt.Errorf("kv_tiers.disk_bandwidth_gbps: must be positive when disk_blocks is set (or set kv_tiers.disk_link to one of %s)", linkNames(true)))
		}
	}

	p := c.PDTransfer
	bwOK := finite("pd_transfer.bandwidth_gbps", p.BandwidthGBps)
	finite("pd_transfer.base_latency_ms", p.BaseLatencyMs)
	if bwOK && p.BandwidthGBps == 0 && (pdBandwidthGiven || p != (PDTransfer{})) {
		errs = append(errs, errors.New("pd_transfer.bandwidth_gbps: must be positive, got 0 (omit it for the default 25 GB/s)"))
	}
	return errs
}

// ParseConfig reads a profile from YAML: fields absent from data keep their
// DefaultConfig values, unknown fields are errors, and the result is validated.
func ParseConfig(data []byte) (Config, error) {
	c := DefaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("parse profile: %w", yamlerr.Explain(err, reflect.TypeFor[Config]()))
	}
	// A bandwidth written as 0 is an error even where the zero section
	// would mean the defaults: find out whether the profile wrote one.
	var given struct {
		PDTransfer *struct {
			BandwidthGBps *float64 `yaml:"bandwidth_gbps"`
		} `yaml:"pd_transfer"`
	}
	_ = yaml.Unmarshal(data, &given) // the decode above reported any error
	pdBandwidthGiven := given.PDTransfer != nil && given.PDTransfer.BandwidthGBps != nil
	if err := c.validate(pdBandwidthGiven); err != nil {
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
