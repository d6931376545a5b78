package calibrate

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/engine"
)

// near reports whether got is want to the four significant digits
// roundProfile keeps.
func near(got, want float64) bool { return math.Abs(got-want) <= 5e-4*math.Abs(want) }

// checkProfile compares a preset's coefficients with a hand calculation.
func checkProfile(t *testing.T, name string, got, want engine.Profile) {
	t.Helper()
	for _, c := range []struct {
		field     string
		got, want float64
	}{
		{"step_fixed_ms", got.StepFixedMs, want.StepFixedMs},
		{"prefill_token_us", got.PrefillTokenUs, want.PrefillTokenUs},
		{"prefill_pair_ns", got.PrefillPairNs, want.PrefillPairNs},
		{"decode_seq_us", got.DecodeSeqUs, want.DecodeSeqUs},
		{"decode_ctx_token_ns", got.DecodeCtxTokenNs, want.DecodeCtxTokenNs},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s: %s %v, hand calculation %.6g", name, c.field, c.got, c.want)
		}
	}
}

// The Qwen3-30B-A3B numbers every hand calculation below uses.
const (
	q3Params = 30.53e9
	// Every routed expert: 48 layers x 128 experts x (gate, up, down) 3 x 2048 x 768.
	q3Routed = 48 * 128 * 3 * 2048 * 768.0 // 28.99e9
	// A token goes to 8 of the 128 experts: 3.351e9 active parameters.
	q3Active = q3Params - q3Routed*(1-8.0/128)
	h100Mem  = 79.6 * gib
)

// TestMoEPresetQwen3H100 checks Qwen3-30B-A3B@H100, which MaxWeightShare
// puts on 2 GPUs (61 GB of bf16 weights > 0.70 x 85.5 GB), against a hand
// calculation: tensor parallel, every GPU holds half of every expert.
func TestMoEPresetQwen3H100(t *testing.T) {
	r, err := PresetRoofline("Qwen3-30B-A3B@H100")
	if err != nil {
		t.Fatal(err)
	}
	c := r.Config
	if c.Name != "Qwen3-30B-A3B@2xH100" || c.DataParallelSize != 0 || c.ExpertParallel || r.ExpertsPerGPU != 128 {
		t.Fatalf("%s: dp %d, ep %v, experts per GPU %d; want 2xH100, one rank, no EP, a slice of all 128", c.Name, c.DataParallelSize, c.ExpertParallel, r.ExpertsPerGPU)
	}
	weights := q3Params * 2 / 2 // bf16, half on each GPU: 30.53 GB
	// 8192 tokens x (4 x hidden + 8 experts x (3 x 768 / TP 2 + hidden)) x 2 bytes = 553.6 MB.
	act := 8192.0 * (4*2048 + 8*(3*768/2+2048)) * 2
	kvMem := 0.90*h100Mem - weights - gib - act // 44.77 GB
	kvToken := 2 * 48 * 4 * 128 * 2 / 2.0       // K and V, 4 KV heads split over 2 GPUs: 48 KiB
	blocks := int(kvMem / (kvToken * 16))       // 56,922
	if c.NumGPUBlocks != blocks || blocks != 56922 {
		t.Errorf("num_gpu_blocks %d, hand calculation %d (56,922)", c.NumGPUBlocks, blocks)
	}
	if c.MaxModelLen != 40960 || c.MaxNumSeqs != 1024 || c.MaxNumBatchedTokens != 8192 {
		t.Errorf("limits %+v", c)
	}
	// 96 all-reduces (2 per layer) of 8 us; each moves 2 x (2-1)/2 of a bf16 hidden state.
	allReduce := 2 * 48 * 2048 * 2 * 2 * 0.5 / 450e9
	prefill := (2*q3Active/2/(989e12*0.75) + allReduce) * 1e6 // 4.518 + 0.874 = 5.391 us
	checkProfile(t, c.Name, c.Latency, engine.Profile{
		StepFixedMs:      weights/(3.35e12*0.85)*1e3 + 96*8e-3 + 1.5, // 10.72 + 0.77 + 1.5 = 12.99 ms
		PrefillTokenUs:   prefill,
		PrefillPairNs:    4 * 48 * 32 * 128 / 2.0 / (989e12 * 0.5) * 1e9, // 0.7952 ns
		DecodeSeqUs:      prefill + 10,
		DecodeCtxTokenNs: kvToken / (3.35e12 * 0.65) * 1e9, // 22.57 ns
	})
}

// TestMoEPresetQwen3H100DP2EP checks Qwen3-30B-A3B@H100:dp2:ep against a
// hand calculation: two ranks of one GPU, each with 64 whole experts per
// layer, an all-to-all in every layer.
func TestMoEPresetQwen3H100DP2EP(t *testing.T) {
	r, err := PresetRoofline("Qwen3-30B-A3B@H100:dp2:ep")
	if err != nil {
		t.Fatal(err)
	}
	c := r.Config
	if c.Name != "Qwen3-30B-A3B@H100:dp2:ep" || r.TP != 1 || c.DataParallelSize != 2 || !c.ExpertParallel || r.ExpertsPerGPU != 64 {
		t.Fatalf("%s: tp %d, dp %d, ep %v, experts per GPU %d; want TP 1, 2 ranks, EP, 64", c.Name, r.TP, c.DataParallelSize, c.ExpertParallel, r.ExpertsPerGPU)
	}
	// Attention, embeddings and routers on both GPUs; half the experts on each (bf16).
	weights := (q3Params-q3Routed)*2 + q3Routed/2*2 // 3.078 + 28.99 = 32.07 GB
	act := 8192.0 * (4*2048 + 8*(3*768+2048)) * 2   // whole experts: 704.6 MB
	kvMem := 0.90*h100Mem - weights - gib - act     // 43.07 GB
	kvToken := 2 * 48 * 4 * 128 * 2.0               // TP 1 holds every KV head: 96 KiB
	blocks := int(kvMem / (kvToken * 16))           // 27,386 per rank
	if c.NumGPUBlocks != blocks || blocks != 27386 {
		t.Errorf("num_gpu_blocks %d per rank, hand calculation %d (27,386)", c.NumGPUBlocks, blocks)
	}
	// The busiest GPU does 1.25 x the mean routed work: the routed experts'
	// active share (8/128 of them) grows by a quarter.
	compute := 2 * (q3Active + 0.25*q3Routed*8/128) / (989e12 * 0.75) // 10.26 us
	// Dispatch and combine: 48 layers x 2 x 8 experts x 2048 x 2 bytes, x 1.25,
	// half of the copies to the other GPU, at 0.75 of 450 GB/s.
	a2a := 48 * 2 * 8 * 2048 * 2.0 * 1.25 * 0.5 / (450e9 * 0.75) // 5.825 us
	if r.AllToAllBytesToken != 48*2*8*2048*2 {
		t.Errorf("all-to-all bytes per token %v, want 48 x 2 x 8 x 2048 x 2", r.AllToAllBytesToken)
	}
	prefill := (compute + a2a) * 1e6 // 16.08 us
	checkProfile(t, c.Name, c.Latency, engine.Profile{
		// 96 all-to-alls (dispatch and combine in 48 layers) of 15 us; no all-reduce at TP 1.
		StepFixedMs:      weights/(3.35e12*0.85)*1e3 + 96*15e-3 + 1.5, // 11.26 + 1.44 + 1.5 = 14.20 ms
		PrefillTokenUs:   prefill,
		PrefillPairNs:    4 * 48 * 32 * 128 / (989e12 * 0.5) * 1e9, // 1.590 ns
		DecodeSeqUs:      prefill + 10,
		DecodeCtxTokenNs: kvToken / (3.35e12 * 0.65) * 1e9, // 45.15 ns
	})
}

// TestMoEDeepSeekMLA: DeepSeek-V3's KV cache is the MLA latent, 61 layers x
// (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes (bf16: vLLM's
// --kv-cache-dtype auto keeps the activation dtype; an FP8 cache would halve
// it) = 70,272 bytes per token, whole on every TP rank.
func TestMoEDeepSeekMLA(t *testing.T) {
	m, _ := findModel("DeepSeek-V3")
	const want = 61 * (512 + 64) * 2
	if got := m.kvBytesPerToken(); got != want {
		t.Errorf("KV bytes per token %v, want %d", got, want)
	}
	r, err := PresetRoofline("DeepSeek-V3@H200")
	if err != nil {
		t.Fatal(err)
	}
	if r.Config.Name != "DeepSeek-V3@8xH200" || r.KVBytesTokenGPU != want {
		t.Errorf("%s: %v KV bytes per token per GPU, want %d (not split by TP)", r.Config.Name, r.KVBytesTokenGPU, want)
	}
	// FP8 weights, bf16 embeddings and LM head (2 x 129280 x 7168): 672.9 GB, 84.1 GB per GPU.
	if w := (671e9 + 2*129280*7168.0) / 8; !near(r.WeightBytesGPU, w) {
		t.Errorf("weights per GPU %.4g, want %.4g", r.WeightBytesGPU, w)
	}
	if !near(r.Config.Latency.DecodeCtxTokenNs, want/(4.8e12*0.65)*1e9) {
		t.Errorf("decode_ctx_token_ns %v", r.Config.Latency.DecodeCtxTokenNs)
	}
	for _, name := range []string{"DeepSeek-V3@H100", "DeepSeek-V3@8xH100", "DeepSeek-V3@RTXPRO6000"} {
		if _, err := Preset(name); err == nil || !strings.Contains(err.Error(), "does not fit") {
			t.Errorf("%s: %v, want does not fit", name, err)
		}
	}

	// Two nodes: 16 experts per GPU, half of the all-to-all off the node.
	r, err = PresetRoofline("DeepSeek-V3@8xH200:dp2:ep")
	if err != nil {
		t.Fatal(err)
	}
	if r.ExpertsPerGPU != 16 || r.Config.DataParallelSize != 2 || !r.Config.ExpertParallel || r.KVBytesTokenGPU != want {
		t.Errorf("%s: %d experts per GPU, dp %d, ep %v", r.Config.Name, r.ExpertsPerGPU, r.Config.DataParallelSize, r.Config.ExpertParallel)
	}
	// 58 MoE layers x 2 x 8 x 7168 x 2 bytes, the rank's 8 GPUs sharing its tokens.
	if got, want := r.AllToAllBytesToken, 58*2*8*7168*2/8.0; got != want {
		t.Errorf("all-to-all bytes per token per GPU %v, want %v", got, want)
	}
	// 7 of 16 copies to this node's other GPUs, 8 of 16 over the 50 GB/s NIC, which sets the pace.
	if got, want := allToAllSecondsPerByte(r.GPU, 16), 0.5/(50e9*0.75); got != want {
		t.Errorf("all-to-all seconds per byte %v, want %v", got, want)
	}
}

// TestMoEGptOss: gpt-oss-120b's MXFP4 experts make its weights 65 GB (the
// checkpoint is 60.8 GiB), and only its 18 full-attention layers count in
// the KV cache per token.
func TestMoEGptOss(t *testing.T) {
	m, _ := findModel("gpt-oss-120b")
	if got, want := m.kvBytesPerToken(), 18*2*8*64*2.0; got != want {
		t.Errorf("KV bytes per token %v, want %v (18 full-attention layers)", got, want)
	}
	routed := 36 * 128 * 3 * 2880 * 2880.0
	if got, want := m.weightBytes(), (116.8e9-routed)*2+routed*4.25/8; !near(got, want) || math.Abs(got/(60.8*gib)-1) > 0.01 {
		t.Errorf("weights %.4g bytes, want %.4g, within 1%% of 60.8 GiB", got, want)
	}
	c, err := Preset("gpt-oss-120b@RTXPRO6000")
	if err != nil || c.Name != "gpt-oss-120b@RTXPRO6000" {
		t.Errorf("gpt-oss-120b fits one RTX PRO 6000: %s, %v", c.Name, err)
	}
}

// TestMoEParamsFromArchitecture checks each published total against the
// config.json fields, and the derived active count against the published
// one (counting the input embedding, as Params does).
func TestMoEParamsFromArchitecture(t *testing.T) {
	gqa := func(m Model) float64 { // q, k, v, o projections per layer
		return float64(m.Hidden) * float64(2*m.Heads*m.HeadDim+2*m.KVHeads*m.HeadDim)
	}
	// DeepSeek-V3 MLA per layer: q_a (7168x1536), q_b (1536 x 128 heads x 192),
	// kv_a (7168 x 576), kv_b (512 x 128 x 256), o (128 x 128 x 7168).
	mla := 7168*1536 + 1536*128*192 + 7168*576 + 512*128*256 + 128*128*7168.0
	for _, c := range []struct {
		name         string
		attn, dense  float64 // attention per layer; dense MLPs and shared experts in all
		activePublic float64
	}{
		{"Qwen3-30B-A3B", 0, 0, 3.3e9},
		{"Qwen3-235B-A22B", 0, 0, 22e9},
		{"DeepSeek-V3", mla, 3*3*7168*18432 + 58*3*7168*2048, 37e9},
		{"Mixtral-8x7B", 0, 0, 12.9e9},
		{"gpt-oss-120b", 0, 0, 5.13e9 + 201088*2880},
	} {
		m, ok := findModel(c.name)
		if !ok {
			t.Fatalf("%s missing", c.name)
		}
		attn := c.attn
		if attn == 0 {
			attn = gqa(m)
		}
		router := float64(m.moeLayers() * m.Hidden * m.Experts)
		arch := float64(m.Layers)*attn + c.dense + m.routedExpertParams() + router + m.embedParams()
		if math.Abs(arch/m.Params-1) > 0.01 {
			t.Errorf("%s: %.4gB from config.json, %.4gB published", c.name, arch/1e9, m.Params/1e9)
		}
		if math.Abs(m.activeParams()/c.activePublic-1) > 0.03 {
			t.Errorf("%s: %.4gB active, %.4gB published", c.name, m.activeParams()/1e9, c.activePublic/1e9)
		}
	}
}

func TestPresetSuffixErrors(t *testing.T) {
	for name, mention := range map[string]string{
		"Qwen3-30B-A3B@H100:dp2":          "add :ep",
		"Llama-3.1-8B@H100:ep":            "drop :ep",
		"Qwen3-30B-A3B@1xH200:ep":         "more than one GPU",
		"Qwen3-30B-A3B@H100:dp0:ep":       "1 to 64",
		"Qwen3-30B-A3B@H100:dp65:ep":      "1 to 64",
		"Qwen3-30B-A3B@H100:dpx":          "dpN",
		"Qwen3-30B-A3B@H100:dp":           "dpN",
		"Qwen3-30B-A3B@H100:ep:ep":        "twice",
		"Qwen3-30B-A3B@H100:dp2:dp4:ep":   "twice",
		"Qwen3-30B-A3B@H100:":             "nothing after",
		"Qwen3-30B-A3B@H100::ep":          "empty suffix",
		"Qwen3-30B-A3B@H100:tp2":          "Qwen3-30B-A3B@2xH100",
		"Qwen3-30B-A3B@H100:fast":         "unknown suffix",
		"Mixtral-8x7B@8xH100:dp2:ep":      "at most 8 GPUs",
		"DeepSeek-V3@3xH200":              "attention heads",
		"Qwen3-30B-A3B@TPUv5:dp2:ep":      "unknown GPU",
		"Qwen3-30B-A3B@H100:ep:dp2":       "", // any order
		"Llama-3.1-8B@H100:dp4":           "",
		"Qwen3-30B-A3B@RTXPRO6000:dp2:ep": "",
		"Qwen3-30B-A3B@2xH100:ep":         "", // EP over the TP group
		"Qwen3-30B-A3B@H100:DP2:EP":       "",
	} {
		_, err := Preset(name)
		if mention == "" {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), mention) {
			t.Errorf("%s: err %v, want one naming %q", name, err, mention)
		}
	}
}

// TestPresetDataParallelDense: a dense model's ranks are independent copies;
// each rank is the single-rank preset.
func TestPresetDataParallelDense(t *testing.T) {
	one, _ := Preset("Llama-3.1-8B@H100")
	four, err := Preset("Llama-3.1-8B@H100:dp4")
	if err != nil {
		t.Fatal(err)
	}
	if four.Name != "Llama-3.1-8B@H100:dp4" || four.DataParallelSize != 4 || four.ExpertParallel {
		t.Errorf("%+v", four)
	}
	four.Name, four.DataParallelSize = one.Name, 0
	if four != one {
		t.Errorf("a rank of dp4 %+v differs from the one-rank preset %+v", four, one)
	}
}

// TestPresetNamesMoE: every MoE model is listed on the data-center GPUs
// where it fits on 8, every listed name and every Config.Name resolves to
// the same configuration.
func TestPresetNamesMoE(t *testing.T) {
	names := PresetNames()
	for _, m := range moeModels {
		for _, g := range []string{"A100", "H100", "H200", "B200", "RTXPRO6000"} {
			name := m.Name + "@" + g
			_, fits := defaultTP(m, findGPUOrFail(t, g), Parallel{})
			if fits != slices.Contains(names, name) {
				t.Errorf("%s: fits %v, listed %v", name, fits, !fits)
			}
		}
	}
	for _, want := range []string{"DeepSeek-V3@H200", "DeepSeek-V3@B200", "DeepSeek-V3@H200:dp8:ep", "Qwen3-30B-A3B@H100:dp2:ep", "gpt-oss-120b@RTXPRO6000", "Mixtral-8x7B@B200"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s not listed", want)
		}
	}
	for _, n := range names {
		c, err := Preset(n)
		if err != nil {
			t.Errorf("%s: %v", n, err)
			continue
		}
		back, err := Preset(c.Name)
		if err != nil || back != c {
			t.Errorf("%s is %s, which resolves to %+v, %v", n, c.Name, back, err)
		}
	}
	// An explicit 1x that Preset would not pick keeps its 1x.
	if c, err := Preset("Qwen3-30B-A3B@1xH100"); err != nil || c.Name != "Qwen3-30B-A3B@1xH100" {
		t.Errorf("%s, %v", c.Name, err)
	}
}

func findGPUOrFail(t *testing.T, name string) GPU {
	g, ok := findGPU(name)
	if !ok {
		t.Fatalf("GPU %s missing", name)
	}
	return g
}

func TestPresetModelForID(t *testing.T) {
	for id, want := range map[string]string{
		"Qwen/Qwen3-30B-A3B":                      "Qwen3-30B-A3B",
		"Qwen/Qwen3-30B-A3B-Instruct-2507":        "Qwen3-30B-A3B",
		"Qwen/Qwen3-235B-A22B-Thinking-2507":      "Qwen3-235B-A22B",
		"meta-llama/Llama-3.1-8B-Instruct":        "Llama-3.1-8B",
		"meta-llama/Meta-Llama-3.1-70B-Instruct":  "Llama-3.1-70B",
		"openai/gpt-oss-120b":                     "gpt-oss-120b",
		"deepseek-ai/DeepSeek-V3-0324":            "DeepSeek-V3",
		"deepseek-ai/DeepSeek-V3":                 "DeepSeek-V3",
		"mistralai/Mixtral-8x7B-Instruct-v0.1":    "Mixtral-8x7B",
		"qwen3-32b":                               "Qwen3-32B",
		"Qwen/Qwen3-8B":                           "Qwen3-8B",
		"Qwen/Qwen3-8B-FP8":                       "",
		"Qwen/Qwen3-30B-A3B-GPTQ-Int4":            "",
		"RedHatAI/Qwen3-30B-A3B-quantized.w4a16":  "",
		"Qwen/Qwen3-235B-A22B-Instruct-2507-FP8":  "",
		"unsloth/gpt-oss-120b-BF16":               "",
		"Qwen/Qwen3-32B-AWQ":                      "",
		"deepseek-ai/DeepSeek-V3.2-Exp":           "",
		"Qwen/Qwen3-30B":                          "",
		"mistralai/Mixtral-8x22B-Instruct-v0.1":   "",
		"":                                        "",
		"openai/gpt-oss-20b":                      "",
		"meta-llama/Llama-3.1-8B-Instruct-FP8-kv": "",
	} {
		m, ok := ModelForID(id)
		if ok != (want != "") || m.Name != want {
			t.Errorf("ModelForID(%q) = %q, %v; want %q", id, m.Name, ok, want)
		}
	}
}

func TestPresetGPUForDevice(t *testing.T) {
	for device, want := range map[string]string{
		"NVIDIA B200": "B200",
		"NVIDIA RTX PRO 6000 Blackwell Server Edition": "RTXPRO6000",
		"NVIDIA H100 80GB HBM3":                        "H100",
		"NVIDIA H200":                                  "H200",
		"NVIDIA A100-SXM4-80GB":                        "A100",
		"NVIDIA GeForce RTX 4090":                      "RTX4090",
		"NVIDIA L40S":                                  "L40S",
		"NVIDIA RTX 6000 Ada Generation":               "",
		"Tesla T4":                                     "",
	} {
		g, ok := GPUForDevice(device)
		if ok != (want != "") || g.Name != want {
			t.Errorf("GPUForDevice(%q) = %q, %v; want %q", device, g.Name, ok, want)
		}
	}
	// gpuIn takes the first GPU whose name a device name contains: no name
	// may contain an earlier one, or the later GPU would never be found.
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, " ", "")) }
	for i, a := range gpus {
		for _, b := range gpus[i+1:] {
			if strings.Contains(norm(b.Name), norm(a.Name)) {
				t.Errorf("%s shadows %s in gpuIn: list %s first", a.Name, b.Name, b.Name)
			}
		}
	}
}

// TestPresetRoundProfileKeepsEveryField: the output-lag terms survive rounding.
func TestPresetRoundProfileKeepsEveryField(t *testing.T) {
	p := roundProfile(engine.Profile{StepFixedMs: 7.14159, PrefillTokenUs: 21.6549, PrefillPairNs: 1.06012, DecodeSeqUs: 31.6549, DecodeCtxTokenNs: 60.1912, OutputLagSteps: 1.000049, OutputDelayMs: 0.1234567})
	want := engine.Profile{StepFixedMs: 7.142, PrefillTokenUs: 21.65, PrefillPairNs: 1.06, DecodeSeqUs: 31.65, DecodeCtxTokenNs: 60.19, OutputLagSteps: 1, OutputDelayMs: 0.1235}
	if p != want {
		t.Errorf("roundProfile = %+v, want %+v", p, want)
	}
}
