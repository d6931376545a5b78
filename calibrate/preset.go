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
// data sheet. The mixture-of-experts factors (all-to-all, load imbalance)
// are in preset_moe.go.
const (
	// EffBandwidth is the fraction of peak memory bandwidth reached when
	// streaming the weights once per step (step_fixed_ms).
	EffBandwidth = 0.85
	// EffKVBandwidth is the fraction of peak memory bandwidth reached by
	// paged attention reading the KV cache in decode (decode_ctx_token_ns).
	EffKVBandwidth = 0.65
	// EffFLOPs is the fraction of peak dense tensor FLOP/s (bf16, or FP8
	// for FP8 weights on a GPU with FP8 tensor cores) reached by the linear
	// layers (prefill_token_us, and the compute part of decode_seq_us).
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
	// runs two per layer (after attention and after the MLP; only the first
	// in an expert-parallel MoE layer, whose MLP output comes back by the
	// all-to-all), added to step_fixed_ms when TP > 1.
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

// Model is the architecture of a decoder-only transformer, dense or a
// mixture of experts (Experts > 0, see preset_moe.go), and the precision of
// its weights. The comments name the config.json fields (Hugging Face) each
// number comes from.
type Model struct {
	Name         string
	Params       float64 // total parameter count, every expert included
	Layers       int     // num_hidden_layers
	Hidden       int     // hidden_size
	Heads        int     // num_attention_heads
	KVHeads      int     // num_key_value_heads
	HeadDim      int     // head_dim (MLA: qk_nope_head_dim, which is also v_head_dim)
	Intermediate int     // intermediate_size: the MLP width of a dense layer
	Vocab        int     // vocab_size
	MaxContext   int     // max_position_embeddings

	// Mixture of experts; all zero for a dense model.

	Experts         int // routed experts per MoE layer: num_experts, n_routed_experts or num_local_experts
	TopK            int // routed experts per token: num_experts_per_tok
	SharedExperts   int // experts every token goes through: n_shared_experts
	MoEIntermediate int // the MLP width of one expert: moe_intermediate_size (Mixtral, gpt-oss: intermediate_size)
	DenseLayers     int // leading layers with a dense MLP instead of experts: first_k_dense_replace

	// Attention other than grouped-query attention over every layer.

	KVLoraRank    int // MLA: width of the compressed latent KV, kv_lora_rank
	QKRopeHeadDim int // MLA: the decoupled RoPE key of each token, qk_rope_head_dim
	SlidingWindow int // sliding_window of the sliding-window layers
	SlidingLayers int // layers whose layer_types entry is "sliding_attention"

	// Precision in bytes per parameter; 0 means bf16 (2). The token
	// embeddings and the LM head are bf16 whatever these say.

	WeightBytes float64 // linear weights outside the routed experts
	ExpertBytes float64 // routed expert weights; 0 means WeightBytes
}

// kvElemBytes is the size of one KV cache element: vLLM's default
// --kv-cache-dtype auto keeps the model's activation dtype, bf16 for every
// known model (DeepSeek-V3's FP8 checkpoint included).
const kvElemBytes = 2

// bytesPerParam is the size of a linear weight outside the routed experts.
func (m Model) bytesPerParam() float64 {
	if m.WeightBytes == 0 {
		return 2
	}
	return m.WeightBytes
}

// expertBytesPerParam is the size of a routed expert weight.
func (m Model) expertBytesPerParam() float64 {
	if m.ExpertBytes == 0 {
		return m.bytesPerParam()
	}
	return m.ExpertBytes
}

// embedParams counts the token embedding and the LM head (none of the known
// models ties them).
func (m Model) embedParams() float64 { return 2 * float64(m.Vocab) * float64(m.Hidden) }

// weightBytes is the size of all the weights: embeddings in bf16, routed
// experts at expertBytesPerParam, the rest at bytesPerParam.
func (m Model) weightBytes() float64 {
	wb := m.bytesPerParam()
	return m.Params*wb + m.embedParams()*(2-wb) + m.routedExpertParams()*(m.expertBytesPerParam()-wb)
}

// attnLayers is the number of layers whose attention sees the whole context.
func (m Model) attnLayers() int { return m.Layers - m.SlidingLayers }

// kvBytesPerToken is the KV cache size of one token over the layers that
// keep the whole context. GQA: K and V of every KV head. MLA: one latent of
// kv_lora_rank plus the qk_rope_head_dim RoPE key, shared by all heads.
// Sliding-window layers are left out, as vLLM's hybrid allocator sizes its
// pool (one block holds a block of each full-attention layer): they keep at
// most a window per sequence, whose read NewRooflineParallel prices per
// decoding sequence. vLLM takes those window blocks (window/16 + 1 per
// running request) from the same pool; the preset does not reserve them.
func (m Model) kvBytesPerToken() float64 {
	if m.KVLoraRank > 0 {
		return float64(m.Layers * (m.KVLoraRank + m.QKRopeHeadDim) * kvElemBytes)
	}
	return float64(2 * m.attnLayers() * m.KVHeads * m.HeadDim * kvElemBytes)
}

// kvBytesPerTokenGPU is the KV cache of one token on each of tp GPUs. GQA
// KV heads are split by TP; with TP above the KV head count they are
// replicated, each GPU holding one. MLA's latent is not split: vLLM
// replicates it on every TP rank.
func (m Model) kvBytesPerTokenGPU(tp int) float64 {
	if m.KVLoraRank > 0 {
		return m.kvBytesPerToken()
	}
	return m.kvBytesPerToken() / float64(min(tp, m.KVHeads))
}

// kvForm says how kvBytesPerToken counts, for PresetInfo.
func (m Model) kvForm() string {
	switch {
	case m.KVLoraRank > 0:
		return fmt.Sprintf("MLA: %d layers x (kv_lora_rank %d + qk_rope_head_dim %d) x %d bytes, the whole latent on every TP rank",
			m.Layers, m.KVLoraRank, m.QKRopeHeadDim, kvElemBytes)
	case m.SlidingLayers > 0:
		return fmt.Sprintf("K and V of %d KV heads x %d x %d bytes over the %d full-attention layers / min(TP, KV heads); the %d sliding-window layers keep at most %d tokens per sequence and are not counted",
			m.KVHeads, m.HeadDim, kvElemBytes, m.attnLayers(), m.SlidingLayers, m.SlidingWindow)
	}
	return fmt.Sprintf("K and V of %d KV heads x %d x %d bytes x %d layers / min(TP, KV heads)", m.KVHeads, m.HeadDim, kvElemBytes, m.Layers)
}

// qkDim and vDim are the widths of one head's query-key product and value.
func (m Model) qkDim() int { return m.HeadDim + m.QKRopeHeadDim }
func (m Model) vDim() int  { return m.HeadDim }

// attnFLOPsPerPair is the attention cost of one (query, key) pair: QK^T and
// PV, 2 FLOPs per multiply-add, over every head of every full-context
// layer. MLA prefill runs as multi-head attention (qk_nope + qk_rope, v).
func (m Model) attnFLOPsPerPair() float64 {
	return float64(2 * m.attnLayers() * m.Heads * (m.qkDim() + m.vDim()))
}

// linearPeak is the tensor FLOP/s the linear layers run at: FP8 weights use
// FP8 tensor cores where the GPU has them (vLLM's W8A8 block-FP8 path),
// everything else bf16 (MXFP4 experts included: W4A16 kernels).
func (m Model) linearPeak(g GPU) float64 {
	if m.bytesPerParam() == 1 && g.PeakFP8FLOPs > 0 {
		return g.PeakFP8FLOPs
	}
	return g.PeakFLOPs
}

// precision names the weight formats, for PresetInfo.
func (m Model) precision() string {
	name := func(bytes float64) string {
		switch bytes {
		case 2:
			return "bf16"
		case 1:
			return "FP8"
		case 4.25 / 8:
			return "MXFP4 (4.25 bits)"
		}
		return fmt.Sprintf("%.3g bytes per weight", bytes)
	}
	wb, eb := m.bytesPerParam(), m.expertBytesPerParam()
	switch {
	case wb == 2 && eb == 2:
		return "bf16"
	case wb == eb:
		return name(wb) + ", bf16 embeddings"
	}
	return name(eb) + " experts, " + name(wb) + " otherwise"
}

// nativeTags are the precision words a Hugging Face id of m's own weights
// may carry (ModelForID refuses the others: a quantized variant).
func (m Model) nativeTags() []string {
	switch {
	case m.bytesPerParam() == 1:
		return []string{"fp8"}
	case m.expertBytesPerParam() < 1:
		return []string{"mxfp4"}
	}
	return []string{"bf16", "fp16"}
}

// GPU is what a preset needs of one accelerator.
type GPU struct {
	Name         string
	MemoryBytes  float64 // total device memory as the driver reports it
	BandwidthBs  float64 // peak memory bandwidth, bytes/s
	PeakFLOPs    float64 // peak dense bf16 tensor FLOP/s (FP32 accumulate)
	PeakFP8FLOPs float64 // peak dense FP8 tensor FLOP/s; 0 without FP8 tensor cores
	LinkBs       float64 // per-GPU interconnect bandwidth in one direction (all-reduce, all-to-all), bytes/s
}

const gib = 1 << 30

// denseModels are the known dense architectures (from each model's
// config.json, all bf16).
var denseModels = []Model{
	{Name: "Llama-3.1-8B", Params: 8.03e9, Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 8, HeadDim: 128, Intermediate: 14336, Vocab: 128256, MaxContext: 131072},
	{Name: "Qwen3-8B", Params: 8.19e9, Layers: 36, Hidden: 4096, Heads: 32, KVHeads: 8, HeadDim: 128, Intermediate: 12288, Vocab: 151936, MaxContext: 40960},
	{Name: "Qwen3-32B", Params: 32.8e9, Layers: 64, Hidden: 5120, Heads: 64, KVHeads: 8, HeadDim: 128, Intermediate: 25600, Vocab: 151936, MaxContext: 40960},
	{Name: "Llama-3.1-70B", Params: 70.6e9, Layers: 80, Hidden: 8192, Heads: 64, KVHeads: 8, HeadDim: 128, Intermediate: 28672, Vocab: 128256, MaxContext: 131072},
}

// models are the known architectures: dense, then mixtures of experts.
var models = slices.Concat(denseModels, moeModels)

// gpus are the known accelerators (vendor data sheets; dense, not sparse,
// tensor FLOP/s; memory as CUDA reports it; link bandwidth per direction).
// gpuIn matches device names by substring in this order, so a name that
// contains another must come first.
var gpus = []GPU{
	{Name: "A100", MemoryBytes: 80 * gib, BandwidthBs: 2.039e12, PeakFLOPs: 312e12, LinkBs: 300e9},                               // A100 SXM 80GB, NVLink 3; no FP8
	{Name: "H100", MemoryBytes: 79.6 * gib, BandwidthBs: 3.35e12, PeakFLOPs: 989e12, PeakFP8FLOPs: 1979e12, LinkBs: 450e9},       // H100 SXM 80GB, NVLink 4
	{Name: "H200", MemoryBytes: 140.4 * gib, BandwidthBs: 4.8e12, PeakFLOPs: 989e12, PeakFP8FLOPs: 1979e12, LinkBs: 450e9},       // H200 SXM 141GB, NVLink 4
	{Name: "B200", MemoryBytes: 179.0 * gib, BandwidthBs: 8.0e12, PeakFLOPs: 2250e12, PeakFP8FLOPs: 4500e12, LinkBs: 900e9},      // B200 180GB (nvidia-smi 183359 MiB), NVLink 5
	{Name: "L40S", MemoryBytes: 45.0 * gib, BandwidthBs: 864e9, PeakFLOPs: 362e12, PeakFP8FLOPs: 733e12, LinkBs: 25e9},           // PCIe 4.0 x16
	{Name: "RTX4090", MemoryBytes: 23.52 * gib, BandwidthBs: 1.008e12, PeakFLOPs: 165e12, PeakFP8FLOPs: 330e12, LinkBs: 25e9},    // 24GB, PCIe 4.0 x16
	{Name: "RTXPRO6000", MemoryBytes: 95.0 * gib, BandwidthBs: 1.792e12, PeakFLOPs: 504e12, PeakFP8FLOPs: 1008e12, LinkBs: 50e9}, // RTX PRO 6000 Blackwell Server Edition, 96GB GDDR7 (CUDA: 95.0 GiB), PCIe 5.0 x16, no NVLink
}

// findModel looks a model up by its exact name, ignoring case.
func findModel(name string) (Model, bool) {
	for _, m := range models {
		if strings.EqualFold(m.Name, name) {
			return m, true
		}
	}
	return Model{}, false
}

// ModelForID finds the known architecture of a Hugging Face model id: the
// organisation ("Qwen/") is dropped, and so is a suffix after the model's
// name ("-Instruct", "-Instruct-2507", "-0324", "-v0.1"), so both
// "Qwen/Qwen3-30B-A3B-Instruct-2507" and "meta-llama/Meta-Llama-3.1-8B-Instruct"
// are found. An id that names another precision ("-FP8", "-AWQ",
// "-GPTQ-Int4", "-BF16" of gpt-oss) is a different set of weights and is not
// found.
func ModelForID(id string) (Model, bool) {
	name := strings.ToLower(strings.TrimSpace(id))
	name = name[strings.LastIndexByte(name, '/')+1:]
	best, found := Model{}, false
	for _, cand := range []string{name, strings.TrimPrefix(name, "meta-")} {
		for _, m := range models {
			rest, ok := strings.CutPrefix(cand, strings.ToLower(m.Name))
			if !ok || (rest != "" && rest[0] != '-' && rest[0] != '_') || otherPrecision(m, rest) {
				continue
			}
			if !found || len(m.Name) > len(best.Name) {
				best, found = m, true
			}
		}
	}
	return best, found
}

// quantTags are the words of a model id suffix that name a weight format.
var quantTags = []string{"fp8", "fp4", "nvfp4", "mxfp4", "int4", "int8", "awq", "gptq", "gguf", "bnb", "4bit", "8bit", "w4a16", "w8a8", "w8a16", "w4a8", "exl2", "quantized", "bf16", "fp16"}

// otherPrecision reports whether an id suffix names a weight format other
// than m's own.
func otherPrecision(m Model, suffix string) bool {
	for _, w := range strings.FieldsFunc(suffix, func(r rune) bool { return r == '-' || r == '_' || r == '.' }) {
		if slices.Contains(quantTags, w) && !slices.Contains(m.nativeTags(), w) {
			return true
		}
	}
	return false
}

// GPUForDevice finds the known GPU a device name reports, as CUDA and
// nvidia-smi spell it ("NVIDIA B200", "NVIDIA H100 80GB HBM3",
// "NVIDIA RTX PRO 6000 Blackwell Server Edition").
func GPUForDevice(name string) (GPU, bool) { return gpuIn(name) }

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

// Parallel is how one engine is spread over GPUs, as vLLM's flags say it.
type Parallel struct {
	// TP is the tensor-parallel size of each rank (--tensor-parallel-size).
	TP int
	// DP is the number of data-parallel ranks (--data-parallel-size), each
	// with its own scheduler and KV cache; 0 or 1 is one rank.
	DP int
	// EP (--enable-expert-parallel) spreads a mixture of experts' routed
	// experts whole over all TP x DP GPUs instead of slicing each by TP,
	// and makes the ranks step in lockstep.
	EP bool
}

// ranks is DP, at least 1.
func (p Parallel) ranks() int { return max(p.DP, 1) }

// GPUs is the number of GPUs the engine runs on: TP x DP.
func (p Parallel) GPUs() int { return p.TP * p.ranks() }

// validate checks what does not depend on the tensor-parallel size.
func (p Parallel) validate(m Model, g GPU) error {
	if p.DP < 0 || p.DP > MaxDataParallel {
		return fmt.Errorf("data parallel size %d must be 1 to %d", p.DP, MaxDataParallel)
	}
	if p.EP && m.Experts == 0 {
		return fmt.Errorf("%s is a dense model: expert parallel applies to mixtures of experts only; drop :ep", m.Name)
	}
	if m.Experts > 0 && p.ranks() > 1 && !p.EP {
		example := m.Name + "@"
		if p.TP > 0 {
			example += strconv.Itoa(p.TP) + "x"
		}
		example += g.Name + ":dp" + strconv.Itoa(p.ranks()) + ":ep"
		return fmt.Errorf("%s is a mixture of experts: with data parallel ranks vLLM runs the experts of all ranks as one group, which a preset models only as expert parallel; add :ep (%s)", m.Name, example)
	}
	return nil
}

// Roofline is a preset's derivation: the inputs and every intermediate
// number, for PresetInfo and for tests. With data parallelism the numbers
// are those of one rank and of each of its GPUs.
type Roofline struct {
	Model           Model
	GPU             GPU
	TP              int      // Parallel.TP
	Parallel        Parallel // TP, DP (at least 1) and EP
	WeightBytesGPU  float64  // weights per GPU
	KVBytesTokenGPU float64  // KV cache bytes per token per GPU
	ActivationBytes float64  // activation reserve per GPU
	KVBytesGPU      float64  // memory left for the KV cache per GPU
	KVTokens        int      // KV cache capacity of one rank, in tokens
	// ExpertsPerGPU is the routed experts each GPU holds per MoE layer:
	// whole experts with EP, a 1/TP slice of every expert without; 0 for a
	// dense model.
	ExpertsPerGPU int
	// AllToAllBytesToken is what the expert-parallel dispatch and combine
	// move per token of a rank per GPU over all MoE layers, before the
	// share that stays on the GPU is taken off; 0 without EP.
	AllToAllBytesToken float64
	Config             engine.Config
}

// parsePreset splits "MODEL@GPU", "MODEL@NxGPU" and their ":dpN" and ":ep"
// suffixes; the tensor-parallel size is 0 when not given.
func parsePreset(name string) (Model, GPU, Parallel, error) {
	fail := func(format string, a ...any) (Model, GPU, Parallel, error) {
		return Model{}, GPU{}, Parallel{}, fmt.Errorf("preset %q: "+format, append([]any{name}, a...)...)
	}
	mname, rest, ok := strings.Cut(strings.TrimSpace(name), "@")
	if !ok {
		return fail("want MODEL@GPU, MODEL@NxGPU and optionally :dpN and :ep, for example Llama-3.1-8B@H100, Llama-3.1-70B@4xH100 or Qwen3-30B-A3B@H100:dp2:ep (see --list-presets)")
	}
	m, ok := findModel(mname)
	if !ok {
		return fail("unknown model %q, known: %s", mname, strings.Join(modelNames(), ", "))
	}
	gname, suffixes, _ := strings.Cut(rest, ":")
	var par Parallel
	if n, g, ok := strings.Cut(gname, "x"); ok {
		if v, err := strconv.Atoi(n); err == nil {
			if v < 1 || v > 8 {
				return fail("tensor parallel size %d must be 1 to 8", v)
			}
			par.TP, gname = v, g
		}
	}
	g, ok := findGPU(gname)
	if !ok {
		return fail("unknown GPU %q, known: %s", gname, strings.Join(gpuNames(), ", "))
	}
	if suffixes == "" && strings.HasSuffix(rest, ":") {
		return fail("nothing after the last \":\"; want :dpN (data parallel ranks) or :ep (expert parallel), or drop the \":\"")
	}
	seen := map[string]bool{}
	for s := range strings.SplitSeq(suffixes, ":") {
		if suffixes == "" {
			break // no suffixes: SplitSeq yields one empty one
		}
		low := strings.ToLower(s)
		switch {
		case low == "":
			return fail("empty suffix in %q; want :dpN or :ep, each once", ":"+suffixes)
		case low == "ep":
			if seen["ep"] {
				return fail(":ep given twice; give it once")
			}
			seen["ep"], par.EP = true, true
		case strings.HasPrefix(low, "dp"):
			if seen["dp"] {
				return fail(":dpN given twice; give one data parallel size")
			}
			v, err := strconv.Atoi(low[2:])
			if err != nil || v < 1 || v > MaxDataParallel {
				return fail("data parallel suffix %q: want dpN with N from 1 to %d, for example :dp2", s, MaxDataParallel)
			}
			seen["dp"], par.DP = true, v
		case strings.HasPrefix(low, "tp"):
			return fail("suffix %q: the tensor parallel size goes before the GPU, for example %s@%sx%s", s, m.Name, s[2:], g.Name)
		default:
			return fail("unknown suffix %q: want :dpN (data parallel ranks) or :ep (expert parallel), for example %s@%s:dp2:ep", s, m.Name, g.Name)
		}
	}
	if err := par.validate(m, g); err != nil {
		return fail("%v", err)
	}
	return m, g, par, nil
}

// weightBytesGPU is the weights each GPU holds, and the routed experts per
// MoE layer it holds (see Roofline.ExpertsPerGPU). Everything but the
// routed experts is split by TP and replicated over DP ranks; the routed
// experts are split by TP, or with EP dealt out whole over TP x DP GPUs
// (the busiest GPU holding the rounded-up share).
func (m Model) weightBytesGPU(p Parallel) (float64, int) {
	tp := float64(p.TP)
	if m.Experts == 0 {
		return m.weightBytes() / tp, 0
	}
	routed := m.routedExpertParams() * m.expertBytesPerParam()
	rest := (m.weightBytes() - routed) / tp
	if !p.EP {
		return rest + routed/tp, m.Experts
	}
	e := (m.Experts + p.GPUs() - 1) / p.GPUs()
	return rest + float64(m.moeLayers()*e)*m.expertParams()*m.expertBytesPerParam(), e
}

// activationWidth is the activation elements per batched token at the peak
// of a forward pass: residual and attention projections (4 x hidden) and
// the MLP's gate and up (2 x intermediate / TP); for an MoE layer the fused
// MoE workspace of each of the top-k experts (gate, up and down: 3 x the
// expert width, split by TP) and its output (hidden). With EP each GPU
// computes whole experts for 1/TP of the routed tokens of its rank (its
// share of all ranks' tokens), so the whole workspace is divided by TP.
func (m Model) activationWidth(p Parallel) int {
	if m.Experts == 0 {
		return 4*m.Hidden + 2*m.Intermediate/p.TP
	}
	mlp := m.TopK * (3*m.MoEIntermediate/p.TP + m.Hidden)
	if p.EP {
		mlp = m.TopK * (3*m.MoEIntermediate + m.Hidden) / p.TP
	}
	if m.DenseLayers > 0 {
		mlp = max(mlp, 2*m.Intermediate/p.TP)
	}
	return 4*m.Hidden + mlp
}

// defaultTP is the smallest power of two up to 8 whose weight share per GPU
// (with p's DP and EP) is at most MaxWeightShare of its memory.
func defaultTP(m Model, g GPU, p Parallel) (int, bool) {
	for tp := 1; tp <= 8; tp *= 2 {
		p.TP = tp
		if w, _ := m.weightBytesGPU(p); w <= MaxWeightShare*g.MemoryBytes {
			return tp, true
		}
	}
	return 0, false
}

// NewRoofline derives an engine configuration for model m on tp GPUs g
// (vLLM defaults for the scheduler limits); see NewRooflineParallel.
func NewRoofline(m Model, g GPU, tp int) (*Roofline, error) {
	return NewRooflineParallel(m, g, Parallel{TP: tp})
}

// NewRooflineParallel derives an engine configuration for model m on
// par.TP x par.DP GPUs g. The configuration describes one data-parallel
// rank, as vLLM's flags do (num_gpu_blocks, max_num_seqs and
// max_num_batched_tokens per rank), with DataParallelSize and
// ExpertParallel set from par. It fails when the weights and the activation
// reserve leave no room for a KV cache that holds one block.
//
// A mixture of experts computes with its active parameters (the routed
// experts a token goes to, plus everything else) but a step streams all of a
// GPU's weights: the preset assumes a busy step sends tokens to every expert
// (see preset_moe.go).
func NewRooflineParallel(m Model, g GPU, par Parallel) (*Roofline, error) {
	tp := par.TP
	if tp < 1 {
		return nil, fmt.Errorf("tensor parallel size must be at least 1, got %d", tp)
	}
	if err := par.validate(m, g); err != nil {
		return nil, err
	}
	par.DP = par.ranks()
	if m.KVLoraRank > 0 {
		if m.Heads%tp != 0 {
			return nil, fmt.Errorf("%s has %d attention heads: tensor parallel size %d must divide it", m.Name, m.Heads, tp)
		}
	} else if m.KVHeads%tp != 0 && tp%m.KVHeads != 0 {
		return nil, fmt.Errorf("%s has %d KV heads: tensor parallel size %d must divide it or be a multiple of it", m.Name, m.KVHeads, tp)
	}
	if par.EP && par.GPUs() == 1 {
		return nil, fmt.Errorf("expert parallel needs more than one GPU: add :dpN or use NxGPU, for example %s@%s:dp2:ep", m.Name, g.Name)
	}
	if par.EP && par.GPUs() > m.Experts {
		return nil, fmt.Errorf("%s has %d experts: expert parallel over %d GPUs leaves some without one; use at most %d GPUs", m.Name, m.Experts, par.GPUs(), m.Experts)
	}
	r := &Roofline{Model: m, GPU: g, TP: tp, Parallel: par}
	// vLLM's defaults for the OpenAI server: bigger limits on GPUs of 70 GiB or more.
	maxSeqs, maxBatched := 256, 2048
	if g.MemoryBytes >= 70*gib {
		maxSeqs, maxBatched = 1024, 8192
	}
	ftp := float64(tp)
	r.WeightBytesGPU, r.ExpertsPerGPU = m.weightBytesGPU(par)
	r.KVBytesTokenGPU = m.kvBytesPerTokenGPU(tp)
	r.ActivationBytes = float64(maxBatched) * float64(m.activationWidth(par)) * 2
	r.KVBytesGPU = MemoryUtilization*g.MemoryBytes - r.WeightBytesGPU - ReserveBytes - r.ActivationBytes
	const blockSize = 16
	blocks := int(r.KVBytesGPU / (r.KVBytesTokenGPU * blockSize))
	if r.KVBytesGPU <= 0 || blocks < 1 {
		return nil, fmt.Errorf("%s does not fit on %dx%s: %.1f GB of weights per GPU leave no KV cache in %.1f GB x %.2f; %s",
			m.Name, tp, g.Name, r.WeightBytesGPU/1e9, g.MemoryBytes/1e9, MemoryUtilization, moreGPUs(m, g, par))
	}
	r.KVTokens = blocks * blockSize

	// Tensor-parallel all-reduce cost per token: ring all-reduce moves
	// 2(tp-1)/tp of the hidden state (bf16), twice per layer (once per MoE
	// layer with EP, whose MLP output comes back by the all-to-all).
	commPerToken := 0.0
	fixedComm := 0.0
	if tp > 1 {
		allReduces := float64(2 * m.Layers)
		if par.EP {
			allReduces = float64(2*m.DenseLayers + m.moeLayers())
		}
		bytes := allReduces * float64(m.Hidden) * 2 * 2 * (ftp - 1) / ftp
		commPerToken = bytes / g.LinkBs
		fixedComm = allReduces * TPLatencyUs * 1e-6
	}
	// Expert-parallel dispatch and combine (preset_moe.go).
	a2aPerToken := 0.0
	if par.EP {
		r.AllToAllBytesToken = m.allToAllBytesToken(par)
		a2aPerToken = r.AllToAllBytesToken * EPLoadImbalance * allToAllSecondsPerByte(g, par.GPUs())
		fixedComm += 2 * float64(m.moeLayers()) * AllToAllLatencyUs * 1e-6
	}
	computePerToken := 2 * m.computeParams(par) / ftp / (m.linearPeak(g) * EffFLOPs)
	// Sliding-window layers: a prefill token attends to at most a window
	// (counted as a full window, per token), a decode reads the window's KV
	// (per sequence); neither grows with the context.
	slidingPrefill, slidingDecode := 0.0, 0.0
	if m.SlidingLayers > 0 {
		slidingPrefill = float64(2*m.SlidingLayers*m.Heads*(m.qkDim()+m.vDim())) * float64(m.SlidingWindow) / ftp / (g.PeakFLOPs * EffAttnFLOPs)
		kv := float64(m.SlidingLayers*2*m.KVHeads*m.HeadDim*kvElemBytes) / float64(min(tp, m.KVHeads))
		slidingDecode = kv * float64(m.SlidingWindow) / (g.BandwidthBs * EffKVBandwidth)
	}
	p := engine.Profile{
		StepFixedMs:      (r.WeightBytesGPU/(g.BandwidthBs*EffBandwidth)+fixedComm)*1e3 + StepOverheadMs,
		PrefillTokenUs:   (computePerToken + commPerToken + a2aPerToken + slidingPrefill) * 1e6,
		PrefillPairNs:    m.attnFLOPsPerPair() / ftp / (g.PeakFLOPs * EffAttnFLOPs) * 1e9,
		DecodeSeqUs:      (computePerToken+commPerToken+a2aPerToken+slidingDecode)*1e6 + SeqOverheadUs,
		DecodeCtxTokenNs: r.KVBytesTokenGPU / (g.BandwidthBs * EffKVBandwidth) * 1e9,
	}
	maxLen := min(m.MaxContext, r.KVTokens)
	r.Config = engine.Config{
		Name:                presetName(m, g, par),
		BlockSize:           blockSize,
		NumGPUBlocks:        blocks,
		MaxNumSeqs:          maxSeqs,
		MaxNumBatchedTokens: maxBatched,
		MaxModelLen:         maxLen,
		ExpertParallel:      par.EP,
		Latency:             roundProfile(p),
		// The KV of one token on the rank's TP GPUs (shares or replicas),
		// for tier loads and P/D transfers; the tiers stay off.
		KVBytesPerToken: r.KVBytesTokenGPU * ftp,
		PDTransfer:      engine.DefaultPDTransfer(),
	}
	if par.DP > 1 {
		r.Config.DataParallelSize = par.DP
	}
	if err := r.Config.Validate(); err != nil {
		return nil, fmt.Errorf("preset %s: %w", r.Config.Name, err)
	}
	return r, nil
}

// moreGPUs suggests a preset with more GPUs for a model that does not fit.
func moreGPUs(m Model, g GPU, par Parallel) string {
	if par.TP < 8 {
		par.TP *= 2
		return "use more GPUs (for example " + presetName(m, g, par) + ")"
	}
	if par.EP && par.GPUs()*2 <= m.Experts {
		par.DP *= 2
		return "use more expert-parallel ranks (for example " + presetName(m, g, par) + ")"
	}
	return "use a GPU with more memory"
}

// presetName is the canonical name of a preset, which Preset resolves back
// to the same configuration: "MODEL@GPU" for one GPU per rank when Preset
// would pick one, "MODEL@NxGPU" otherwise (1x included), then ":dpN" and
// ":ep".
func presetName(m Model, g GPU, par Parallel) string {
	s := m.Name + "@"
	if tp, ok := defaultTP(m, g, par); par.TP != 1 || !ok || tp != 1 {
		s += strconv.Itoa(par.TP) + "x"
	}
	s += g.Name
	if par.DP > 1 {
		s += ":dp" + strconv.Itoa(par.DP)
	}
	if par.EP {
		s += ":ep"
	}
	return s
}

// roundProfile keeps four significant digits of every coefficient, so YAML
// stays readable.
func roundProfile(p engine.Profile) engine.Profile {
	r := func(v float64) float64 {
		if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return v
		}
		e := math.Pow(10, 3-math.Floor(math.Log10(math.Abs(v))))
		return math.Round(v*e) / e
	}
	return engine.Profile{
		StepFixedMs:      r(p.StepFixedMs),
		PrefillTokenUs:   r(p.PrefillTokenUs),
		PrefillPairNs:    r(p.PrefillPairNs),
		DecodeSeqUs:      r(p.DecodeSeqUs),
		DecodeCtxTokenNs: r(p.DecodeCtxTokenNs),
		OutputLagSteps:   r(p.OutputLagSteps),
		OutputDelayMs:    r(p.OutputDelayMs),
	}
}

// PresetRoofline resolves a preset name to its derivation: "MODEL@GPU"
// picks the tensor parallel size, "MODEL@NxGPU" states it, and ":dpN"
// (data parallel ranks) and ":ep" (expert parallel) may follow, for example
// "DeepSeek-V3@8xH200:dp2:ep".
func PresetRoofline(name string) (*Roofline, error) {
	m, g, par, err := parsePreset(name)
	if err != nil {
		return nil, err
	}
	if par.TP == 0 {
		var ok bool
		if par.TP, ok = defaultTP(m, g, par); !ok {
			return nil, fmt.Errorf("preset %q: %s (%.0f GB of weights) does not fit on up to 8 %s per rank", name, m.Name, m.weightBytes()/1e9, g.Name)
		}
	}
	return NewRooflineParallel(m, g, par)
}

// Preset returns the engine configuration of a preset (MODEL@GPU,
// MODEL@NxGPU, optionally with :dpN and :ep), derived by roofline (see
// PresetInfo for the derivation).
func Preset(name string) (engine.Config, error) {
	r, err := PresetRoofline(name)
	if err != nil {
		return engine.Config{}, err
	}
	return r.Config, nil
}

// PresetNames lists every known model on every known GPU with the tensor
// parallel size Preset picks (combinations that need more than 8 GPUs are
// left out) and, for a mixture of experts, its data- and expert-parallel
// form on as many GPUs (at least 2, one GPU per rank): MODEL@GPU:dpN:ep.
func PresetNames() []string {
	var names []string
	for _, m := range models {
		for _, g := range gpus {
			tp, ok := defaultTP(m, g, Parallel{})
			if !ok {
				continue
			}
			if _, err := NewRoofline(m, g, tp); err == nil {
				names = append(names, m.Name+"@"+g.Name)
			}
			if m.Experts == 0 {
				continue
			}
			par := Parallel{DP: max(tp, 2), EP: true}
			if tp, ok := defaultTP(m, g, par); !ok || tp != 1 {
				continue
			}
			par.TP = 1
			if _, err := NewRooflineParallel(m, g, par); err == nil {
				names = append(names, presetName(m, g, par))
			}
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
	m, g, c, par := r.Model, r.GPU, r.Config, r.Parallel
	var b strings.Builder
	if m.Experts > 0 {
		fmt.Fprintf(&b, "%s: %s (mixture of experts, %.2fB params, %.2fB active per token; %d layers, hidden %d, %d heads, %s; %s)",
			c.Name, m.Name, m.Params/1e9, m.activeParams()/1e9, m.Layers, m.Hidden, m.Heads, m.attentionKind(), m.precision())
	} else {
		fmt.Fprintf(&b, "%s: %s (%.2fB params, %d layers, hidden %d, %d heads, %d KV heads x %d, %s)",
			c.Name, m.Name, m.Params/1e9, m.Layers, m.Hidden, m.Heads, m.KVHeads, m.HeadDim, m.precision())
	}
	fmt.Fprintf(&b, " on %d x %s", par.GPUs(), g.Name)
	if par.DP > 1 {
		fmt.Fprintf(&b, ": %d data-parallel ranks of TP %d", par.DP, par.TP)
	}
	if par.EP {
		fmt.Fprintf(&b, ", expert parallel over %d GPUs", par.GPUs())
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "  GPU: %.1f GiB, %.0f GB/s, %.0f TFLOP/s dense bf16", g.MemoryBytes/gib, g.BandwidthBs/1e9, g.PeakFLOPs/1e12)
	if g.PeakFP8FLOPs > 0 {
		fmt.Fprintf(&b, " (%.0f FP8)", g.PeakFP8FLOPs/1e12)
	}
	fmt.Fprintf(&b, ", link %.0f GB/s\n", g.LinkBs/1e9)
	if m.Experts > 0 {
		r.moeInfo(&b)
	}
	if par.DP > 1 {
		fmt.Fprintf(&b, "  per rank (as vLLM's flags are): the KV cache and scheduler limits below are each rank's; %d ranks\n", par.DP)
	}
	fmt.Fprintf(&b, "  memory per GPU: %.2f x %.1f GB - weights %.1f GB - reserve %.2f GB - activations %.2f GB = KV %.1f GB\n",
		MemoryUtilization, g.MemoryBytes/1e9, r.WeightBytesGPU/1e9, ReserveBytes/1e9, r.ActivationBytes/1e9, r.KVBytesGPU/1e9)
	fmt.Fprintf(&b, "  KV: %.1f KiB per token per GPU (%s) -> %d blocks of %d = %d tokens; max_model_len %d\n",
		r.KVBytesTokenGPU/1024, m.kvForm(), c.NumGPUBlocks, c.BlockSize, r.KVTokens, c.MaxModelLen)
	fmt.Fprintf(&b, "  kv_bytes_per_token %.0f = KV bytes per token per GPU x %d GPUs of the rank (prices KV tier loads and P/D transfers; no kv_tiers)\n",
		c.KVBytesPerToken, r.TP)
	fmt.Fprintf(&b, "  scheduler (vLLM defaults): max_num_seqs %d, max_num_batched_tokens %d\n", c.MaxNumSeqs, c.MaxNumBatchedTokens)
	p := c.Latency
	fmt.Fprintf(&b, "  step_fixed_ms %.4g = weights per GPU / (bandwidth x %.2f) + %.1f ms host overhead", p.StepFixedMs, EffBandwidth, StepOverheadMs)
	if r.TP > 1 {
		fmt.Fprintf(&b, " + all-reduces x %.0f us latency", TPLatencyUs)
	}
	if par.EP {
		fmt.Fprintf(&b, " + 2 x %d MoE layers x %.0f us all-to-all latency", m.moeLayers(), AllToAllLatencyUs)
	}
	if m.Experts > 0 {
		fmt.Fprintf(&b, "\n  prefill_token_us %.4g = 2 x active params", p.PrefillTokenUs)
		if par.EP {
			fmt.Fprintf(&b, " (routed experts' x %.2f imbalance)", EPLoadImbalance)
		}
		fmt.Fprintf(&b, " / TP / (peak x %.2f)", EffFLOPs)
	} else {
		fmt.Fprintf(&b, "\n  prefill_token_us %.4g = 2 x params / TP / (peak x %.2f)", p.PrefillTokenUs, EffFLOPs)
	}
	if m.linearPeak(g) != g.PeakFLOPs {
		b.WriteString(" at the FP8 peak")
	}
	if r.TP > 1 {
		b.WriteString(" + all-reduce bytes per token / link")
	}
	if par.EP {
		fmt.Fprintf(&b, " + all-to-all %.0f KB per token x %.2f / (link x %.2f)", r.AllToAllBytesToken/1e3, EPLoadImbalance, EffAllToAll)
	}
	if m.SlidingLayers > 0 {
		fmt.Fprintf(&b, " + %d sliding-window layers x %d tokens of attention", m.SlidingLayers, m.SlidingWindow)
	}
	if m.KVLoraRank > 0 || m.SlidingLayers > 0 {
		fmt.Fprintf(&b, "\n  prefill_pair_ns %.4g = 2 x %d full-context layers x heads x (qk %d + v %d) / TP / (peak x %.2f)\n",
			p.PrefillPairNs, m.attnLayers(), m.qkDim(), m.vDim(), EffAttnFLOPs)
	} else {
		fmt.Fprintf(&b, "\n  prefill_pair_ns %.4g = 4 x layers x heads x head_dim / TP / (peak x %.2f)\n", p.PrefillPairNs, EffAttnFLOPs)
	}
	fmt.Fprintf(&b, "  decode_seq_us %.4g = prefill_token_us", p.DecodeSeqUs)
	if m.SlidingLayers > 0 {
		b.WriteString(" (sliding-window KV read instead of its attention)")
	}
	fmt.Fprintf(&b, " + %.0f us per-sequence host overhead\n", SeqOverheadUs)
	fmt.Fprintf(&b, "  decode_ctx_token_ns %.4g = KV bytes per token per GPU / (bandwidth x %.2f)\n", p.DecodeCtxTokenNs, EffKVBandwidth)
	return b.String(), nil
}
