package calibrate

import (
	"fmt"
	"math"
	"strings"
)

// Mixture-of-experts and multi-GPU factors of the roofline (see preset.go
// for the others).
//
// How a preset prices a mixture of experts:
//
//   - Compute per token comes from the active parameters: everything but
//     the routed experts, plus top-k of them (Model.activeParams).
//   - Weights streamed per step: all of a GPU's weights, every one of its
//     experts included. The assumption is that a busy step sends tokens to
//     every expert: with top-k of E experts a batch of B tokens leaves a
//     given expert idle with probability (1-k/E)^B, 1.6% for top-8 of 128 at
//     B = 64. Small decode batches touch fewer experts and run faster than
//     the preset says; a step-time model linear in the batch cannot say
//     both.
//   - Without EP every GPU holds a 1/TP slice of every expert; with EP
//     (--enable-expert-parallel) the routed experts are dealt out whole over
//     TP x DP GPUs, and every MoE layer runs an all-to-all dispatch of each
//     token's hidden state (bf16) to its top-k experts and a combine that
//     brings the results back, priced as bytes over the link
//     (EffAllToAll, ScaleOutLinkBs across nodes) plus AllToAllLatencyUs
//     each in step_fixed_ms. Counting one copy per expert is what DeepEP's
//     low-latency (decode) kernels send; kernels that send one copy per GPU
//     send less.
//   - Data-parallel ranks of an MoE model step in lockstep (the engine's
//     ExpertParallel); EPLoadImbalance prices the wait for the busiest GPU.
const (
	// EffAllToAll is the fraction of link bandwidth an expert-parallel
	// dispatch or combine reaches. DeepEP's README measures 153-158 GB/s of
	// H800's ~160 GB/s NVLink and 43-58 GB/s of a 400 Gb/s (~50 GB/s) NIC
	// with 4,096-token batches; decode-sized batches reach less.
	EffAllToAll = 0.75
	// AllToAllLatencyUs is the fixed cost of one all-to-all (launch and the
	// handshake with every peer); an expert-parallel step runs two per MoE
	// layer (dispatch and combine), added to step_fixed_ms.
	AllToAllLatencyUs = 15.0
	// EPLoadImbalance is how much more routed work the busiest GPU of an
	// expert-parallel group gets than the mean (routing is skewed; vLLM's
	// EPLB narrows it). A lockstep MoE layer waits for that GPU, so the
	// routed experts' compute and the all-to-all bytes are scaled by it.
	// Without EP each GPU holds a slice of every expert and is balanced.
	EPLoadImbalance = 1.25
	// ScaleOutLinkBs is the per-GPU bandwidth between nodes, one 400 Gb/s
	// NIC per GPU as in DGX and HGX H100, H200 and B200 systems, bytes/s; the
	// share of an all-to-all that leaves the node goes over it.
	ScaleOutLinkBs = 50e9
	// GPUsPerNode is the number of GPUs one node's link joins; an
	// expert-parallel group over more spans nodes.
	GPUsPerNode = 8
	// MaxDataParallel is the largest data-parallel size (:dpN) a preset takes.
	MaxDataParallel = 64
)

// moeModels are the known mixture-of-experts architectures. The numbers are
// the config.json fields named in Model's comments, from each model's
// Hugging Face repository; Params is the published total (main model only,
// no multi-token-prediction layers), which TestMoEParamsFromArchitecture
// checks against the fields.
var moeModels = []Model{
	// Qwen/Qwen3-30B-A3B config.json: num_hidden_layers 48, hidden_size 2048,
	// num_attention_heads 32, num_key_value_heads 4, head_dim 128,
	// num_experts 128, num_experts_per_tok 8, moe_intermediate_size 768,
	// intermediate_size 6144 (unused: mlp_only_layers is empty),
	// vocab_size 151936, max_position_embeddings 40960, bfloat16.
	// Model card: 30.5B parameters, 3.3B activated.
	{Name: "Qwen3-30B-A3B", Params: 30.53e9, Layers: 48, Hidden: 2048, Heads: 32, KVHeads: 4, HeadDim: 128, Intermediate: 6144, Vocab: 151936, MaxContext: 40960,
		Experts: 128, TopK: 8, MoEIntermediate: 768},
	// Qwen/Qwen3-235B-A22B config.json: num_hidden_layers 94, hidden_size
	// 4096, num_attention_heads 64, num_key_value_heads 4, head_dim 128,
	// num_experts 128, num_experts_per_tok 8, moe_intermediate_size 1536,
	// intermediate_size 12288 (unused), vocab_size 151936,
	// max_position_embeddings 40960, bfloat16. Model card: 235B, 22B activated.
	{Name: "Qwen3-235B-A22B", Params: 235.1e9, Layers: 94, Hidden: 4096, Heads: 64, KVHeads: 4, HeadDim: 128, Intermediate: 12288, Vocab: 151936, MaxContext: 40960,
		Experts: 128, TopK: 8, MoEIntermediate: 1536},
	// deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61, hidden_size
	// 7168, num_attention_heads 128, num_key_value_heads 128 (MLA: the cache
	// is the latent), kv_lora_rank 512, q_lora_rank 1536, qk_nope_head_dim
	// 128, qk_rope_head_dim 64, v_head_dim 128, n_routed_experts 256,
	// n_shared_experts 1, num_experts_per_tok 8, moe_intermediate_size 2048,
	// first_k_dense_replace 3, intermediate_size 18432, vocab_size 129280,
	// max_position_embeddings 163840; quantization_config fp8 (e4m3, 128x128
	// blocks; embeddings and LM head bf16). README_WEIGHTS: 671B parameters,
	// 37B activated.
	{Name: "DeepSeek-V3", Params: 671e9, Layers: 61, Hidden: 7168, Heads: 128, KVHeads: 128, HeadDim: 128, Intermediate: 18432, Vocab: 129280, MaxContext: 163840,
		Experts: 256, TopK: 8, SharedExperts: 1, MoEIntermediate: 2048, DenseLayers: 3,
		KVLoraRank: 512, QKRopeHeadDim: 64, WeightBytes: 1},
	// mistralai/Mixtral-8x7B-v0.1 config.json: num_hidden_layers 32,
	// hidden_size 4096, num_attention_heads 32, num_key_value_heads 8 (head
	// dim 4096/32 = 128), num_local_experts 8, num_experts_per_tok 2,
	// intermediate_size 14336 (per expert), vocab_size 32000,
	// max_position_embeddings 32768, sliding_window null, bfloat16.
	// Published: 46.7B parameters, 12.9B active.
	{Name: "Mixtral-8x7B", Params: 46.7e9, Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 8, HeadDim: 128, Intermediate: 14336, Vocab: 32000, MaxContext: 32768,
		Experts: 8, TopK: 2, MoEIntermediate: 14336},
	// openai/gpt-oss-120b config.json: num_hidden_layers 36, hidden_size
	// 2880, num_attention_heads 64, num_key_value_heads 8, head_dim 64,
	// num_local_experts 128, num_experts_per_tok 4, intermediate_size 2880
	// (per expert), vocab_size 201088, max_position_embeddings 131072,
	// sliding_window 128, layer_types alternating "sliding_attention" and
	// "full_attention" (18 each); quantization_config mxfp4 for the experts
	// (4-bit values and an 8-bit scale per 32: 4.25 bits), the rest bf16
	// (modules_to_not_convert). Model card: 116.8B parameters, 5.1B active
	// (not counting the input embedding), a 60.8 GiB checkpoint.
	{Name: "gpt-oss-120b", Params: 116.8e9, Layers: 36, Hidden: 2880, Heads: 64, KVHeads: 8, HeadDim: 64, Intermediate: 2880, Vocab: 201088, MaxContext: 131072,
		Experts: 128, TopK: 4, MoEIntermediate: 2880,
		SlidingWindow: 128, SlidingLayers: 18, ExpertBytes: 4.25 / 8},
}

// moeLayers is the number of layers with routed experts.
func (m Model) moeLayers() int {
	if m.Experts == 0 {
		return 0
	}
	return m.Layers - m.DenseLayers
}

// expertParams is the size of one expert: gate, up and down projections.
func (m Model) expertParams() float64 { return 3 * float64(m.Hidden) * float64(m.MoEIntermediate) }

// routedExpertParams counts every routed expert of every MoE layer.
func (m Model) routedExpertParams() float64 {
	return float64(m.moeLayers()*m.Experts) * m.expertParams()
}

// activeParams is what one token computes with: all parameters but the
// routed experts it is not sent to. Like a dense model's Params it counts
// the input embedding, which OpenAI's "5.1B active" for gpt-oss-120b does not.
func (m Model) activeParams() float64 {
	if m.Experts == 0 {
		return m.Params
	}
	return m.Params - m.routedExpertParams()*(1-float64(m.TopK)/float64(m.Experts))
}

// computeParams is activeParams with the routed experts' share scaled by
// EPLoadImbalance under expert parallelism: the busiest GPU sets the pace.
func (m Model) computeParams(p Parallel) float64 {
	if m.Experts == 0 || !p.EP {
		return m.activeParams()
	}
	return m.activeParams() + m.routedExpertParams()*float64(m.TopK)/float64(m.Experts)*(EPLoadImbalance-1)
}

// allToAllBytesToken is what the dispatch and combine of every MoE layer
// move for one token of a rank, per GPU of the rank (the rank's TP GPUs
// share its tokens): the bf16 hidden state to each of its top-k experts and
// back.
func (m Model) allToAllBytesToken(p Parallel) float64 {
	return float64(m.moeLayers()) * 2 * float64(m.TopK) * float64(m.Hidden) * 2 / float64(p.TP)
}

// allToAllShares splits an all-to-all over n GPUs by where each copy goes:
// to another GPU of the node, or off the node (experts spread evenly, one
// node holding GPUsPerNode of the n GPUs).
func allToAllShares(n int) (onNode, offNode float64) {
	off := float64(max(0, n-GPUsPerNode)) / float64(n)
	return float64(min(n, GPUsPerNode)-1) / float64(n), off
}

// allToAllSecondsPerByte is the time per all-to-all byte (before the share
// that stays on the GPU is taken off) over n GPUs: the on-node and off-node
// shares go at once, over the link and the NICs, and the slower sets the pace.
func allToAllSecondsPerByte(g GPU, n int) float64 {
	on, off := allToAllShares(n)
	return math.Max(on/(g.LinkBs*EffAllToAll), off/(ScaleOutLinkBs*EffAllToAll))
}

// attentionKind describes the attention of m, for PresetInfo.
func (m Model) attentionKind() string {
	switch {
	case m.KVLoraRank > 0:
		return fmt.Sprintf("MLA kv_lora_rank %d + rope %d", m.KVLoraRank, m.QKRopeHeadDim)
	case m.SlidingLayers > 0:
		return fmt.Sprintf("%d KV heads x %d, %d of %d layers sliding-window %d", m.KVHeads, m.HeadDim, m.SlidingLayers, m.Layers, m.SlidingWindow)
	}
	return fmt.Sprintf("%d KV heads x %d", m.KVHeads, m.HeadDim)
}

// moeInfo writes PresetInfo's mixture-of-experts lines.
func (r *Roofline) moeInfo(b *strings.Builder) {
	m, g, par := r.Model, r.GPU, r.Parallel
	fmt.Fprintf(b, "  experts: %d routed x %d wide, top-%d", m.Experts, m.MoEIntermediate, m.TopK)
	if m.SharedExperts > 0 {
		fmt.Fprintf(b, " + %d shared", m.SharedExperts)
	}
	fmt.Fprintf(b, ", in %d of %d layers: %.2fB of the %.2fB params; %.2fB active per token\n",
		m.moeLayers(), m.Layers, m.routedExpertParams()/1e9, m.Params/1e9, m.activeParams()/1e9)
	switch {
	case par.EP:
		fmt.Fprintf(b, "  experts per GPU: %d whole experts of %d per MoE layer (expert parallel over %d GPUs); the rest split by TP %d\n",
			r.ExpertsPerGPU, m.Experts, par.GPUs(), par.TP)
	case par.TP > 1:
		fmt.Fprintf(b, "  experts per GPU: a 1/%d slice of each of the %d experts (tensor parallel)\n", par.TP, m.Experts)
	default:
		fmt.Fprintf(b, "  experts per GPU: all %d\n", m.Experts)
	}
	idle := math.Pow(1-float64(m.TopK)/float64(m.Experts), 64)
	fmt.Fprintf(b, "  weights streamed per step: all of a GPU's weights, every expert's: a busy step is assumed to send tokens to every expert (a batch of 64 leaves one idle with probability %.2g); smaller decode batches touch fewer and run faster than this\n", idle)
	if par.EP {
		on, off := allToAllShares(par.GPUs())
		fmt.Fprintf(b, "  all-to-all: dispatch and combine of each token's bf16 hidden state to each of its top-%d experts in %d MoE layers = %.0f KB per token per GPU; %.0f%% to other GPUs of the node at %.0f GB/s",
			m.TopK, m.moeLayers(), r.AllToAllBytesToken/1e3, 100*on, g.LinkBs/1e9)
		if off > 0 {
			fmt.Fprintf(b, ", %.0f%% off the node at %.0f GB/s", 100*off, ScaleOutLinkBs/1e9)
		}
		fmt.Fprintf(b, ", at %.2f of the link; %.0f us latency each; ranks step in lockstep (enable_expert_parallel)\n", EffAllToAll, AllToAllLatencyUs)
	}
}
