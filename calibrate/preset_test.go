package calibrate

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/engine"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestPresetNamesAllValid(t *testing.T) {
	names := PresetNames()
	if len(names) < 15 {
		t.Fatalf("only %d presets: %v", len(names), names)
	}
	for _, n := range names {
		c, err := Preset(n)
		if err != nil {
			t.Errorf("%s: %v", n, err)
			continue
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", n, err)
		}
		if info, err := PresetInfo(n); err != nil || !strings.Contains(info, "decode_ctx_token_ns") {
			t.Errorf("%s: info %q, %v", n, info, err)
		}
	}
}

func TestPresetTensorParallelChoice(t *testing.T) {
	for name, want := range map[string]string{
		"Llama-3.1-70B@H100":   "Llama-3.1-70B@4xH100",
		"Llama-3.1-70B@A100":   "Llama-3.1-70B@4xA100",
		"Llama-3.1-70B@H200":   "Llama-3.1-70B@2xH200",
		"Llama-3.1-8B@RTX4090": "Llama-3.1-8B@RTX4090",
		"Qwen3-32B@H100":       "Qwen3-32B@2xH100",
		"qwen3-32b@h200":       "Qwen3-32B@H200",
	} {
		c, err := Preset(name)
		if err != nil || c.Name != want {
			t.Errorf("%s: got %q (%v), want %s", name, c.Name, err, want)
		}
	}
}

func TestPresetErrors(t *testing.T) {
	for name, mention := range map[string]string{
		"Llama-3.1-70B@1xH100":  "does not fit",
		"Llama-3.1-70B@RTX4090": "", // fits on 8
		"Llama-3.1-8B":          "MODEL@GPU",
		"GPT-5@H100":            "unknown model",
		"Llama-3.1-8B@TPUv5":    "unknown GPU",
		"Llama-3.1-8B@16xH100":  "1 to 8",
		"Llama-3.1-8B@3xH100":   "KV heads",
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

// TestPresetSanity checks the roofline against known numbers: the real
// RTX 4090 log's KV capacity (2,588 blocks) and the default profile.
func TestPresetSanity(t *testing.T) {
	c, err := Preset("Llama-3.1-8B@RTX4090")
	if err != nil {
		t.Fatal(err)
	}
	if c.NumGPUBlocks < 2300 || c.NumGPUBlocks > 2900 {
		t.Errorf("RTX 4090 8B: %d KV blocks, vLLM 0.19 measured 2588", c.NumGPUBlocks)
	}
	def := engine.DefaultConfig().Latency
	if r := c.Latency.StepFixedMs / def.StepFixedMs; r < 0.8 || r > 2.5 {
		t.Errorf("step_fixed_ms %v vs default %v", c.Latency.StepFixedMs, def.StepFixedMs)
	}
	h100, _ := Preset("Llama-3.1-8B@H100")
	if h100.Latency.StepFixedMs >= c.Latency.StepFixedMs || h100.Latency.PrefillTokenUs >= c.Latency.PrefillTokenUs {
		t.Errorf("H100 should be faster than an RTX 4090: %+v vs %+v", h100.Latency, c.Latency)
	}
}

// TestPresetMoreGPUsProperty: more tensor parallel GPUs never shrink the KV
// cache nor slow a step that fills the token budget; for a dense model they
// never slow a prefill token either. A mixture of experts with few active
// parameters can lose per token (Qwen3-30B-A3B on 4 instead of 2 L40S: the
// all-reduce over PCIe grows more than the 3B active parameters' compute
// shrinks), which is real, but the weights it streams per step halve.
func TestPresetMoreGPUsProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := rapid.SampledFrom(models).Draw(t, "model")
		g := rapid.SampledFrom(gpus).Draw(t, "gpu")
		tp := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "tp")
		a, errA := NewRoofline(m, g, tp)
		b, errB := NewRoofline(m, g, tp*2)
		if errA != nil {
			return
		}
		if errB != nil {
			t.Fatalf("%s fits on %dx%s but not on %dx: %v", m.Name, tp, g.Name, tp*2, errB)
		}
		full := func(c engine.Config) time.Duration {
			return c.Latency.StepTime(engine.Batch{PrefillTokens: int64(c.MaxNumBatchedTokens)})
		}
		slower := b.Config.Latency.PrefillTokenUs > a.Config.Latency.PrefillTokenUs && m.Experts == 0
		if b.Config.NumGPUBlocks < a.Config.NumGPUBlocks || full(b.Config) > full(a.Config) || slower {
			t.Fatalf("%s on %s: tp %d %+v, tp %d %+v", m.Name, g.Name, tp, a.Config, tp*2, b.Config)
		}
	})
}

func TestWriteProfileRoundTripGolden(t *testing.T) {
	c, err := Preset("Llama-3.1-8B@H100")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteProfile(&buf, c); err != nil {
		t.Fatal(err)
	}
	back, err := engine.ParseConfig(buf.Bytes())
	if err != nil || back != c {
		t.Fatalf("round trip: %+v, %v; want %+v", back, err, c)
	}
	golden := filepath.Join("testdata", "preset-llama-3.1-8b-h100.yaml")
	if *update {
		os.MkdirAll("testdata", 0o755)
		os.WriteFile(golden, buf.Bytes(), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(want, buf.Bytes()) {
		t.Errorf("profile differs from %s (rerun with -update if intended):\n%s", golden, buf.String())
	}
}

func TestResolveProfile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.yaml")
	c, _ := Preset("Qwen3-32B@H200")
	if err := SaveProfile(path, c); err != nil {
		t.Fatal(err)
	}
	for _, arg := range []string{path, "Qwen3-32B@H200"} {
		got, err := ResolveProfile(arg)
		if err != nil || got != c {
			t.Errorf("%s: %+v, %v", arg, got, err)
		}
	}
	for _, bad := range []string{"", "nothing", filepath.Join(dir, "missing.yaml"), "X@Y"} {
		if _, err := ResolveProfile(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
	if got := MeasurementsPath("a/b.yaml"); got != "a/b.measurements.json" {
		t.Errorf("measurements path %q", got)
	}
}

func FuzzPreset(f *testing.F) {
	for _, s := range []string{"Llama-3.1-8B@H100", "Llama-3.1-70B@4xH100", "x@0xH100", "@", "a@bxc", "Qwen3-32B@-2xH200",
		"Qwen3-30B-A3B@H100:dp2:ep", "DeepSeek-V3@8xH200:dp2:ep", "gpt-oss-120b@H100:ep:dp9", "Mixtral-8x7B@H100::", "Qwen3-8B@B200:dp99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Preset(s)
		if err == nil {
			if err := c.Validate(); err != nil {
				t.Fatalf("%q: invalid preset: %v", s, err)
			}
		}
	})
}

// Every preset sets kv_bytes_per_token to the KV of one token on its rank's
// GPUs (for tier loads and P/D transfers) and leaves the KV tiers off.
func TestPresetKVBytesPerToken(t *testing.T) {
	for name, want := range map[string]float64{
		"Llama-3.1-8B@H100":    2 * 32 * 8 * 128 * 2, // 131072, as engine.DefaultConfig
		"Llama-3.1-70B@4xH100": 2 * 80 * 8 * 128 * 2, // the 8 KV heads split over 4 GPUs
		"Llama-3.1-8B@16xH100": 0,                    // refused: not a preset
		"DeepSeek-V3@8xH200":   8 * 61 * (512 + 64) * 2,
	} {
		c, err := Preset(name)
		if want == 0 {
			if err == nil {
				t.Errorf("%s: no error", name)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if c.KVBytesPerToken != want || c.KVTiers != (engine.KVTiers{}) || c.PDTransfer != engine.DefaultPDTransfer() {
			t.Errorf("%s: kv_bytes_per_token %v (want %v), tiers %+v, pd_transfer %+v", name, c.KVBytesPerToken, want, c.KVTiers, c.PDTransfer)
		}
	}
	for _, n := range PresetNames() {
		r, err := PresetRoofline(n)
		if err != nil {
			t.Fatal(err)
		}
		if c := r.Config; c.KVBytesPerToken != r.KVBytesTokenGPU*float64(r.TP) || c.KVBytesPerToken <= 0 {
			t.Errorf("%s: kv_bytes_per_token %v, per GPU %v x TP %d", n, c.KVBytesPerToken, r.KVBytesTokenGPU, r.TP)
		}
	}
}
