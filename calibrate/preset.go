package calibrate

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/inferrail/inferrail/engine"
)

// Roofline efficiency factors: the fraction of a GPU's peak that a real
// engine reaches on each part of a step. They are the only free numbers in a
// preset; everything else comes from the model's architecture and the GPU's
// data sheet.
const (
	// EffBandwidth is the fraction of peak memory bandwidth reached when
	// streaming the weights once per step (step_fixed_ms).
	EffBandwidth = 0.85
	// EffKVBandwidth is the fraction of peak memory bandwidth reached by
	// paged attention reading the KV cache in decode (decode_ctx_token_ns).
	EffKVBandwidth = 0.65
	// EffFLOPs is the fraction of peak dense bf16 FLOP/s reached by the
	// linear layers (prefill_token_us, and the compute part of decode_seq_us).
	EffFLOPs = 0.75
	// EffAttnFLOPs is the fraction of peak reached by (flash) attention in
	// prefill (prefill_pair_ns).
	EffAttnFLOPs = 0.50
	// StepOverheadMs is the per-step host cost (scheduling, input
	// preparation, sampling, launch), added to step_fixed_ms.
	StepOverheadMs = 1.5
	// SeqOverheadUs is the per-sequence host cost of a decode (sampling,
	// detokenization, output processing), added to decode_seq_us.
	SeqOverheadUs = 10.0
	// TPLatencyUs is the latency of one tensor-parallel all-reduce; a step
	// runs two per layer, added to step_fixed_ms when TP > 1.
	TPLatencyUs = 8.0
	// MemoryUtilization is vLLM's default --gpu-memory-utilization.
	MemoryUtilization = 0.90
	// ReserveBytes is the fixed per-GPU memory kept back from the KV cache
	// (CUDA context, CUDA graphs, non-torch allocations); the activation peak
	// of a max_num_batched_tokens forward pass is reserved on top of it.
	ReserveBytes = 1.0 * (1 << 30)
	// MaxWeightShare is the largest fraction of one GPU's memory the weights
	// may take when a preset picks the tensor-parallel size itself; the
	// smallest TP in 1, 2, 4, 8 under it is chosen.
	MaxWeightShare = 0.70
)

// Model is the architecture of a dense decoder-only transformer in bf16.
type Model struct {
	Name         string
	Params       float64 // parameter count
	Layers       int
	Hidden       int
	Heads        int
	KVHeads      int
	HeadDim      int
	Intermediate int
	Vocab        int
	MaxContext   int
}

// weightBytes is the size of the weights in bf16.
func (m Model) weightBytes() float64 { return 2 * m.Params }

// kvBytesPerToken is the KV cache size of one token over all layers (K and V, bf16).
func (m Model) kvBytesPerToken() float64 {
	return float64(2 * m.Layers * m.KVHeads * m.HeadDim * 2)
}

// attnFLOPsPerPair is the attention cost of one (query, key) pair: QK^T and
// PV, 2 FLOPs per multiply-add, over every head of every layer.
func (m Model) attnFLOPsPerPair() float64 {
	return float64(4 * m.Layers * m.Heads * m.HeadDim)
}

// GPU is what a preset needs of one accelerator.
type GPU struct {
	Name        string
	MemoryBytes float64 // total device memory as the driver reports it
	BandwidthBs float64 // peak memory bandwidth, bytes/s
	PeakFLOPs   float64 // peak dense bf16 tensor FLOP/s (FP32 accumulate)
	LinkBs      float64 // per-GPU interconnect bandwidth for all-reduce, bytes/s
}

const gib = 1 << 30

// models are the known architectures (from each model's config.json).
var models = []Model{
	{Name: "Llama-3.1-8B", Params: 8.03e9, Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 8, HeadDim: 128, Intermediate: 14336, Vocab: 128256, MaxContext: 131072},
	{Name: "Qwen3-8B", Params: 8.19e9, Layers: 36, Hidden: 4096, Heads: 32, KVHeads: 8, HeadDim: 128, Intermediate: 12288, Vocab: 151936, MaxContext: 40960},
	{Name: "Qwen3-32B", Params: 32.8e9, Layers: 64, Hidden: 5120, Heads: 64, KVHeads: 8, HeadDim: 128, Intermediate: 25600, Vocab: 151936, MaxContext: 40960},
	{Name: "Llama-3.1-70B", Params: 70.6e9, Layers: 80, Hidden: 8192, Heads: 64, KVHeads: 8, HeadDim: 128, Intermediate: 28672, Vocab: 128256, MaxContext: 131072},
}

// gpus are the known accelerators (vendor data sheets; dense, not sparse,
// bf16 tensor FLOP/s; memory as CUDA reports it).
var gpus = []GPU{
	{Name: "A100", MemoryBytes: 80 * gib, BandwidthBs: 2.039e12, PeakFLOPs: 312e12, LinkBs: 300e9},      // A100 SXM 80GB, NVLink 3
	{Name: "H100", MemoryBytes: 79.6 * gib, BandwidthBs: 3.35e12, PeakFLOPs: 989e12, LinkBs: 450e9},     // H100 SXM 80GB, NVLink 4
	{Name: "H200", MemoryBytes: 140.4 * gib, BandwidthBs: 4.8e12, PeakFLOPs: 989e12, LinkBs: 450e9},     // H200 SXM 141GB
	{Name: "L40S", MemoryBytes: 45.0 * gib, BandwidthBs: 864e9, PeakFLOPs: 362e12, LinkBs: 25e9},        // PCIe 4.0 x16
	{Name: "RTX4090", MemoryBytes: 23.52 * gib, BandwidthBs: 1.008e12, PeakFLOPs: 165e12, LinkBs: 25e9}, // 24GB, PCIe 4.0 x16
	{Name: "RTXPRO6000", MemoryBytes: 95.0 * gib, BandwidthBs: 1.792e12, PeakFLOPs: 504e12, LinkBs: 50e9},
}

// presetModels and presetGPUs are the lookup tables, keyed by lower-case name.
func findModel(name string) (Model, bool) {
	for _, m := range models {
		if strings.EqualFold(m.Name, name) {
			return m, true
		}
	}
	return Model{}, false
}

func findGPU(name string) (GPU, bool) {
	norm := func(s string) string {
		return strings.ToLower(strings.NewReplacer(" ", "", "-", "", "_", "").Replace(s))
	}
	for _, g := range gpus {
		if norm(g.Name) == norm(name) {
			return g, true
		}
	}
	return GPU{}, false
}

func modelNames() []string {
	var s []string
	for _, m := range models {
		s = append(s, m.Name)
	}
	return s
}

func gpuNames() []string {
	var s []string
	for _, g := range gpus {
		s = append(s, g.Name)
	}
	return s
}

// Roofline is a preset's derivation: the inputs and every intermediate
// number, for PresetInfo and for tests.
type Roofline struct {
	Model           Model
	GPU             GPU
	TP              int
	WeightBytesGPU  float64 // weights per GPU
	KVBytesTokenGPU float64 // KV cache bytes per token per GPU
	ActivationBytes float64 // activation reserve per GPU
	KVBytesGPU      float64 // memory left for the KV cache per GPU
	KVTokens        int
	Config          engine.Config
}

// parsePreset splits "MODEL@GPU" or "MODEL@NxGPU"; tp is 0 when not given.
func parsePreset(name string) (Model, GPU, int, error) {
	mname, gname, ok := strings.Cut(strings.TrimSpace(name), "@")
	if !ok {
		return Model{}, GPU{}, 0, fmt.Errorf("preset %q: want MODEL@GPU or MODEL@NxGPU, for example Llama-3.1-8B@H100 or Llama-3.1-70B@4xH100 (see --list-presets)", name)
	}
	m, ok := findModel(mname)
	if !ok {
		return Model{}, GPU{}, 0, fmt.Errorf("preset %q: unknown model %q, known: %s", name, mname, strings.Join(modelNames(), ", "))
	}
	tp := 0
	if n, rest, ok := strings.Cut(gname, "x"); ok {
		if v, err := strconv.Atoi(n); err == nil {
			if v < 1 || v > 8 {
				return Model{}, GPU{}, 0, fmt.Errorf("preset %q: tensor parallel size %d must be 1 to 8", name, v)
			}
			tp, gname = v, rest
		}
	}
	g, ok := findGPU(gname)
	if !ok {
		return Model{}, GPU{}, 0, fmt.Errorf("preset %q: unknown GPU %q, known: %s", name, gname, strings.Join(gpuNames(), ", "))
	}
	return m, g, tp, nil
}

// defaultTP is the smallest power of two up to 8 whose weight share per GPU
// is at most MaxWeightShare of its memory.
func defaultTP(m Model, g GPU) (int, bool) {
	for tp := 1; tp <= 8; tp *= 2 {
		if m.weightBytes()/float64(tp) <= MaxWeightShare*g.MemoryBytes {
			return tp, true
		}
	}
	return 0, false
}

// NewRoofline derives an engine configuration for model m on tp GPUs g
// (vLLM defaults for the scheduler limits). It fails when the weights and the
// activation reserve leave no room for a KV cache that holds one block.
func NewRoofline(m Model, g GPU, tp int) (*Roofline, error) {
	if tp < 1 {
		return nil, fmt.Errorf("tensor parallel size must be at least 1, got %d", tp)
	}
	if m.KVHeads%tp != 0 && tp%m.KVHeads != 0 {
		return nil, fmt.Errorf("%s has %d KV heads: tensor parallel size %d must divide it or be a multiple of it", m.Name, m.KVHeads, tp)
	}
	r := &Roofline{Model: m, GPU: g, TP: tp}
	// vLLM's defaults for the OpenAI server: bigger limits on GPUs of 70 GiB or more.
	maxSeqs, maxBatched := 256, 2048
	if g.MemoryBytes >= 70*gib {
		maxSeqs, maxBatched = 1024, 8192
	}
	ftp := float64(tp)
	r.WeightBytesGPU = m.weightBytes() / ftp
	// With TP above the KV head count, heads are replicated: each GPU holds one.
	r.KVBytesTokenGPU = m.kvBytesPerToken() / float64(min(tp, m.KVHeads))
	// The activation peak of one max_num_batched_tokens pass: residual and
	// attention projections (4*hidden) and the MLP's gate and up (2*intermediate), bf16.
	r.ActivationBytes = float64(maxBatched) * float64(4*m.Hidden+2*m.Intermediate/tp) * 2
	r.KVBytesGPU = MemoryUtilization*g.MemoryBytes - r.WeightBytesGPU - ReserveBytes - r.ActivationBytes
	const blockSize = 16
	blocks := int(r.KVBytesGPU / (r.KVBytesTokenGPU * blockSize))
	if r.KVBytesGPU <= 0 || blocks < 1 {
		return nil, fmt.Errorf("%s does not fit on %dx%s: %.1f GB of weights per GPU leave no KV cache in %.1f GB x %.2f; use more GPUs (for example %s@%dx%s)",
			m.Name, tp, g.Name, r.WeightBytesGPU/1e9, g.MemoryBytes/1e9, MemoryUtilization, m.Name, tp*2, g.Name)
	}
	r.KVTokens = blocks * blockSize

	// All-reduce cost per token: ring all-reduce moves 2(tp-1)/tp of the
	// hidden state (bf16) twice per layer.
	commPerToken := 0.0
	fixedComm := 0.0
	if tp > 1 {
		bytes := 2 * float64(m.Layers) * float64(m.Hidden) * 2 * 2 * (ftp - 1) / ftp
		commPerToken = bytes / g.LinkBs
		fixedComm = 2 * float64(m.Layers) * TPLatencyUs * 1e-6
	}
	computePerToken := 2 * m.Params / ftp / (g.PeakFLOPs * EffFLOPs)
	p := engine.Profile{
		StepFixedMs:      (r.WeightBytesGPU/(g.BandwidthBs*EffBandwidth)+fixedComm)*1e3 + StepOverheadMs,
		PrefillTokenUs:   (computePerToken + commPerToken) * 1e6,
		PrefillPairNs:    m.attnFLOPsPerPair() / ftp / (g.PeakFLOPs * EffAttnFLOPs) * 1e9,
		DecodeSeqUs:      (computePerToken+commPerToken)*1e6 + SeqOverheadUs,
		DecodeCtxTokenNs: r.KVBytesTokenGPU / (g.BandwidthBs * EffKVBandwidth) * 1e9,
	}
	maxLen := min(m.MaxContext, r.KVTokens)
	r.Config = engine.Config{
		Name:                presetName(m, g, tp),
		BlockSize:           blockSize,
		NumGPUBlocks:        blocks,
		MaxNumSeqs:          maxSeqs,
		MaxNumBatchedTokens: maxBatched,
		MaxModelLen:         maxLen,
		Latency:             roundProfile(p),
	}
	if err := r.Config.Validate(); err != nil {
		return nil, fmt.Errorf("preset %s: %w", r.Config.Name, err)
	}
	return r, nil
}

func presetName(m Model, g GPU, tp int) string {
	if tp == 1 {
		return m.Name + "@" + g.Name
	}
	return fmt.Sprintf("%s@%dx%s", m.Name, tp, g.Name)
}

// roundProfile keeps four significant digits, so YAML stays readable.
func roundProfile(p engine.Profile) engine.Profile {
	r := func(v float64) float64 {
		if v == 0 {
			return 0
		}
		e := math.Pow(10, 3-math.Floor(math.Log10(math.Abs(v))))
		return math.Round(v*e) / e
	}
	return engine.Profile{StepFixedMs: r(p.StepFixedMs), PrefillTokenUs: r(p.PrefillTokenUs), PrefillPairNs: r(p.PrefillPairNs), DecodeSeqUs: r(p.DecodeSeqUs), DecodeCtxTokenNs: r(p.DecodeCtxTokenNs)}
}

// PresetRoofline resolves a preset name ("MODEL@GPU" picks the tensor
// parallel size, "MODEL@NxGPU" states it) to its derivation.
func PresetRoofline(name string) (*Roofline, error) {
	m, g, tp, err := parsePreset(name)
	if err != nil {
		return nil, err
	}
	if tp == 0 {
		var ok bool
		if tp, ok = defaultTP(m, g); !ok {
			return nil, fmt.Errorf("preset %q: %s (%.0f GB of weights) does not fit on up to 8 %s", name, m.Name, m.weightBytes()/1e9, g.Name)
		}
	}
	return NewRoofline(m, g, tp)
}

// Preset returns the engine configuration of a MODEL@GPU or MODEL@NxGPU
// preset, derived by roofline (see PresetInfo for the derivation).
func Preset(name string) (engine.Config, error) {
	r, err := PresetRoofline(name)
	if err != nil {
		return engine.Config{}, err
	}
	return r.Config, nil
}

// PresetNames lists every known model on every known GPU with the tensor
// parallel size Preset picks; combinations that need more than 8 GPUs are
// left out.
func PresetNames() []string {
	var names []string
	for _, m := range models {
		for _, g := range gpus {
			tp, ok := defaultTP(m, g)
			if !ok {
				continue
			}
			if _, err := NewRoofline(m, g, tp); err != nil {
				continue
			}
			names = append(names, m.Name+"@"+g.Name)
		}
	}
	slices.Sort(names)
	return names
}

// PresetInfo describes how a preset was derived: architecture, GPU, memory
// budget and every efficiency factor behind each coefficient.
func PresetInfo(name string) (string, error) {
	r, err := PresetRoofline(name)
	if err != nil {
		return "", err
	}
	m, g, c := r.Model, r.GPU, r.Config
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s (%.2fB params, %d layers, hidden %d, %d heads, %d KV heads x %d, bf16) on %d x %s\n",
		c.Name, m.Name, m.Params/1e9, m.Layers, m.Hidden, m.Heads, m.KVHeads, m.HeadDim, r.TP, g.Name)
	fmt.Fprintf(&b, "  GPU: %.1f GiB, %.0f GB/s, %.0f TFLOP/s dense bf16, link %.0f GB/s\n",
		g.MemoryBytes/gib, g.BandwidthBs/1e9, g.PeakFLOPs/1e12, g.LinkBs/1e9)
	fmt.Fprintf(&b, "  memory per GPU: %.2f x %.1f GB - weights %.1f GB - reserve %.2f GB - activations %.2f GB = KV %.1f GB\n",
		MemoryUtilization, g.MemoryBytes/1e9, r.WeightBytesGPU/1e9, ReserveBytes/1e9, r.ActivationBytes/1e9, r.KVBytesGPU/1e9)
	fmt.Fprintf(&b, "  KV: %.0f KiB per token per GPU -> %d blocks of %d = %d tokens; max_model_len %d\n",
		r.KVBytesTokenGPU/1024, c.NumGPUBlocks, c.BlockSize, r.KVTokens, c.MaxModelLen)
	fmt.Fprintf(&b, "  scheduler (vLLM defaults): max_num_seqs %d, max_num_batched_tokens %d\n", c.MaxNumSeqs, c.MaxNumBatchedTokens)
	p := c.Latency
	fmt.Fprintf(&b, "  step_fixed_ms %.4g = weights / (bandwidth x %.2f) + %.1f ms host overhead", p.StepFixedMs, EffBandwidth, StepOverheadMs)
	if r.TP > 1 {
		fmt.Fprintf(&b, " + 2 x layers x %.0f us all-reduce latency", TPLatencyUs)
	}
	fmt.Fprintf(&b, "\n  prefill_token_us %.4g = 2 x params / TP / (peak x %.2f)", p.PrefillTokenUs, EffFLOPs)
	if r.TP > 1 {
		b.WriteString(" + all-reduce bytes per token / link")
	}
	fmt.Fprintf(&b, "\n  prefill_pair_ns %.4g = 4 x layers x heads x head_dim / TP / (peak x %.2f)\n", p.PrefillPairNs, EffAttnFLOPs)
	fmt.Fprintf(&b, "  decode_seq_us %.4g = prefill_token_us + %.0f us per-sequence host overhead\n", p.DecodeSeqUs, SeqOverheadUs)
	fmt.Fprintf(&b, "  decode_ctx_token_ns %.4g = KV bytes per token per GPU / (bandwidth x %.2f)\n", p.DecodeCtxTokenNs, EffKVBandwidth)
	return b.String(), nil
}
