package calibrate

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
)

// copyLog copies a vLLM log directory's files into dir, applying edit to
// meta.json's decoded form when edit is not nil.
func copyLog(t *testing.T, from, dir string, edit func(map[string]any)) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"requests.jsonl", "meta.json", "timeseries.csv"} {
		b, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "meta.json" && edit != nil {
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			edit(m)
			if b, err = json.Marshal(m); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A log's directory name plays no part: renamed, or spelled with a trailing
// slash, it fits to the identical profile.
func TestFitLogPathSpelling(t *testing.T) {
	src := sharedDir(t, "traces/vllm-logs/RTX4090-Llama-3.1-8B")
	tmp := t.TempDir()
	renamed := filepath.Join(tmp, "run-without-a-gpu-name")
	copyLog(t, src, renamed, nil)
	var profiles []engine.Config
	for _, dir := range []string{src, src + "/", renamed, renamed + string(filepath.Separator)} {
		l, err := ReadLog(dir, ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		fit, err := FitLog(l, LogOptions{Holdout: 0.5, MaxEvaluations: 60})
		if err != nil {
			t.Fatal(err)
		}
		profiles = append(profiles, fit.Config)
	}
	for i := 1; i < len(profiles); i++ {
		if !reflect.DeepEqual(profiles[i], profiles[0]) {
			t.Errorf("spelling %d fits to %+v, want %+v", i, profiles[i], profiles[0])
		}
	}
}

// The KV cache size comes from the log (meta.json, else timeseries.csv's
// usage); a log that gives none is refused with the flag to pass.
func TestReadLogKVSize(t *testing.T) {
	src := sharedDir(t, "traces/vllm-logs/RTX4090-Llama-3.1-8B")
	tmp := t.TempDir()
	l, err := ReadLog(src, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Config.NumGPUBlocks != 2588 || l.KVSource != kvFromMeta || l.GPU != "RTX4090" {
		t.Fatalf("from meta.json: %d blocks (%s), GPU %q; want 2588, RTX4090", l.Config.NumGPUBlocks, l.KVSource, l.GPU)
	}
	noKV := filepath.Join(tmp, "nokv")
	copyLog(t, src, noKV, func(m map[string]any) { delete(m, "kv_cache") })
	l, err = ReadLog(noKV, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Config.NumGPUBlocks; got < 2588*9/10 || got > 2588*11/10 || !strings.Contains(l.KVSource, "timeseries") {
		t.Errorf("from timeseries.csv: %d blocks (%s), want within 10%% of the engine's 2588", got, l.KVSource)
	}
	if l, err = ReadLog(noKV, ReadOptions{NumGPUBlocks: 3000}); err != nil || l.Config.NumGPUBlocks != 3000 {
		t.Errorf("--num-gpu-blocks 3000: %v, %d blocks", err, l.Config.NumGPUBlocks)
	}
	// No kv_cache, no usage column, never held at max_num_seqs, no GPU.
	bare := filepath.Join(tmp, "bare")
	copyLog(t, src, bare, func(m map[string]any) { delete(m, "kv_cache"); delete(m, "hardware") })
	if err := os.WriteFile(filepath.Join(bare, "timeseries.csv"), []byte("t,running,waiting\n1.0,3,0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = ReadLog(bare, ReadOptions{})
	if err == nil || !strings.Contains(err.Error(), "--num-gpu-blocks") || strings.Contains(err.Error(), "\n") {
		t.Errorf("no KV size anywhere: got %v, want one line naming --num-gpu-blocks", err)
	}
	// A GPU named on the command line gives the roofline's size, said so.
	if l, err = ReadLog(bare, ReadOptions{GPU: "RTX4090"}); err != nil || !strings.Contains(l.KVSource, "roofline") {
		t.Errorf("--gpu RTX4090: %v (%s)", err, l.KVSource)
	}
	if _, err = ReadLog(bare, ReadOptions{GPU: "TPU"}); err == nil || !strings.Contains(err.Error(), "known") {
		t.Errorf("--gpu TPU: %v, want the known GPUs listed", err)
	}
}

func TestReadLogBadInput(t *testing.T) {
	src := sharedDir(t, "traces/vllm-logs/RTX4090-Llama-3.1-8B")
	tmp := t.TempDir()
	v2 := filepath.Join(tmp, "v2")
	copyLog(t, src, v2, func(m map[string]any) { m["schema_version"] = 2 })
	if _, err := ReadLog(v2, ReadOptions{}); err == nil || !strings.Contains(err.Error(), "schema_version 2") {
		t.Errorf("schema 2: %v", err)
	}
	bad := filepath.Join(tmp, "order")
	copyLog(t, src, bad, nil)
	b, _ := os.ReadFile(filepath.Join(bad, "requests.jsonl"))
	lines := strings.Split(string(b), "\n")
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[2]), &rec); err != nil {
		t.Fatal(err)
	}
	rec["first_token_ts"] = rec["queued_ts"].(float64) - 1
	nb, _ := json.Marshal(rec)
	lines[2] = string(nb)
	if err := os.WriteFile(filepath.Join(bad, "requests.jsonl"), []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ReadLog(bad, ReadOptions{})
	if err == nil || !strings.Contains(err.Error(), ":3") || !strings.Contains(err.Error(), "out of order") {
		t.Errorf("timestamps out of order on line 3: got %v", err)
	}
}

// writeSynthLog writes a synthetic vLLM log directory: requests through the
// engine with profile p, timed as vLLM would log them.
func writeSynthLog(t *testing.T, dir string, p engine.Profile, n int, seed uint64) {
	t.Helper()
	l := synthLog(t, p, n, seed)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rp := newReplayer(l)
	if err := rp.run(p); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	base := 1000.0
	for i, q := range l.Requests {
		at := base + q.Arrival.Seconds()
		fmt.Fprintf(&b, `{"request_id":"r-%d","input_toks":%d,"output_toks":%d,"arrival_time":%.9f,"queued_ts":%.9f,"scheduled_ts":%.9f,"first_token_ts":%.9f,"last_token_ts":%.9f}`+"\n",
			i, q.PromptTokens, q.OutputTokens, at+5000, at, at+rp.sched[i].Seconds(), at+rp.first[i].Seconds(), at+rp.last[i].Seconds())
	}
	cfg := l.Config
	meta := fmt.Sprintf(`{"schema_version":1,"model":"meta-llama/Llama-3.1-8B","engine_kwargs":{"tensor_parallel_size":1,"data_parallel_size":1,"max_num_seqs":%d,"max_num_batched_tokens":%d,"max_model_len":%d},
"kv_cache":{"num_gpu_blocks":%d,"block_size":%d,"enable_prefix_caching":true},"hardware":{"device_name":"NVIDIA GeForce RTX 4090"}}`,
		cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens, cfg.MaxModelLen, cfg.NumGPUBlocks, cfg.BlockSize)
	for name, body := range map[string]string{"requests.jsonl": b.String(), "meta.json": meta} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Fit on one whole run, predict another run of the same setup; the fidelity
// report says what it found.
func TestFitLogsValidateAndFidelity(t *testing.T) {
	tmp := t.TempDir()
	truth := engine.DefaultConfig().Latency
	a, b := filepath.Join(tmp, "a"), filepath.Join(tmp, "b")
	writeSynthLog(t, a, truth, 150, 1)
	writeSynthLog(t, b, truth, 150, 2)
	la, err := ReadLog(a, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := ReadLog(b, ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fit, err := FitLogs([]*Log{la}, LogOptions{MaxEvaluations: 150, Validate: []*Log{lb}})
	if err != nil {
		t.Fatal(err)
	}
	if len(fit.Validation) != 1 || fit.Validation[0].Report.E2EMAPE > 5 || fit.Validation[0].Report.TTFTMAPE > 10 {
		t.Errorf("validation on a second run of the same engine: %+v", fit.Validation)
	}
	if len(fit.Baselines) != 2 || fit.Baselines[0].Name != "preset" || fit.Baselines[1].Name != "scale" || len(fit.Baselines[1].Validation) != 1 {
		t.Errorf("baselines: %+v", fit.Baselines)
	}
	runs, err := Fidelity([]string{a, b}, FidelityOptions{Holdout: 0.5, MaxEvaluations: 60})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs[0].CrossRuns) != 1 || len(runs[1].CrossRuns) != 1 {
		t.Fatalf("two runs of one setup: cross runs %d and %d, want 1 each", len(runs[0].CrossRuns), len(runs[1].CrossRuns))
	}
	var md strings.Builder
	if err := WriteFidelityMarkdown(&md, runs, "test"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| `a` |", "| `a` | `b` |", "scale", "preset", "identified", "BLIS"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("fidelity report lacks %q:\n%s", want, md.String())
		}
	}
}

// A term the log cannot see is reported as not identified: with one-token
// answers there is no decode step, so the decode terms fit anything.
func TestFitLogNotIdentified(t *testing.T) {
	truth := engine.DefaultConfig().Latency
	rng := rand.New(rand.NewPCG(4, 1))
	l := &Log{Name: "prefill-only", Config: engine.DefaultConfig()}
	var at time.Duration
	for range 120 {
		at += time.Duration(rng.ExpFloat64() * float64(40*time.Millisecond))
		l.Requests = append(l.Requests, LogRequest{Arrival: at, PromptTokens: 100 + rng.IntN(3000), OutputTokens: 1, Queue: -1})
	}
	rp := newReplayer(l)
	if err := rp.run(truth); err != nil {
		t.Fatal(err)
	}
	for i := range l.Requests {
		l.Requests[i].TTFT, l.Requests[i].E2E = rp.first[i].Seconds(), rp.last[i].Seconds()
	}
	fit, err := FitLog(l, LogOptions{MaxEvaluations: 120})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, c := range fit.Coefficients {
		got[c.Name] = c.Identified
	}
	if got["decode_seq_us"] || got["decode_ctx_token_ns"] {
		t.Errorf("decode terms identified from a log without decodes: %+v", fit.Coefficients)
	}
	if !got["prefill_token_us"] {
		t.Errorf("prefill_token_us not identified from a prefill-only log: %+v", fit.Coefficients)
	}
}

// A log whose engine delivers tokens a step late (vLLM's asynchronous
// scheduling) is fitted with the lag: scheduled-to-first-token time comes
// out right, where a profile without lag under-predicts it.
func TestFitLogRecoversOutputLag(t *testing.T) {
	truth := engine.DefaultConfig().Latency
	truth.OutputLagSteps, truth.OutputDelayMs = 1, 3
	l := synthLog(t, truth, 160, 5)
	noLag := truth
	noLag.OutputLagSteps, noLag.OutputDelayMs = 0, 0
	rp := newReplayer(l)
	if err := rp.run(noLag); err != nil {
		t.Fatal(err)
	}
	if r := rp.report(0, len(l.Requests)); r.SchedToFirstRatio > 0.8 {
		t.Fatalf("without lag the median scheduled-to-first-token ratio is %.2f; the test needs a lag that matters", r.SchedToFirstRatio)
	}
	start := noLag
	start.OutputLagSteps, start.OutputDelayMs = 0.3, 0.5 // not the truth, not the search's default start
	fit, err := FitLog(l, LogOptions{Holdout: 0.25, Start: start, MaxEvaluations: 300})
	if err != nil {
		t.Fatal(err)
	}
	if r := fit.Holdout; r.SchedToFirstRatio < 0.9 || r.SchedToFirstRatio > 1.1 || r.E2EMAPE > 3 {
		t.Errorf("fitted %+v: holdout scheduled-to-first-token median ratio %.2f, E2E %.2f%%", fit.Profile, r.SchedToFirstRatio, r.E2EMAPE)
	}
}

// A profile fitted from a log prices KV tier loads and P/D transfers with
// the KV bytes per token of the log's model (2 x layers x KV heads x
// head_dim x element bytes, over the engine's tensor-parallel GPUs), not
// the default 8B Llama's; an unknown model keeps the default, said so.
func TestReadLogKVBytesPerToken(t *testing.T) {
	src := sharedDir(t, "traces/vllm-logs/RTX4090-Llama-3.1-8B")
	tmp := t.TempDir()
	for i, c := range []struct {
		model, kvDtype, dtype string
		tp                    int
		want                  float64
		note                  string
	}{
		{"meta-llama/Llama-3.1-8B", "auto", "bfloat16", 1, 2 * 32 * 8 * 128 * 2, ""},
		{"Qwen/Qwen3-32B", "auto", "bfloat16", 1, 2 * 64 * 8 * 128 * 2, ""},
		{"Qwen/Qwen3-32B", "fp8_e4m3", "bfloat16", 1, 2 * 64 * 8 * 128, ""},
		{"Qwen/Qwen3-32B", "auto", "float32", 1, 2 * 64 * 8 * 128 * 4, ""},
		// TP 2: each GPU holds half the KV heads; the engine, all of them.
		{"Qwen/Qwen3-32B", "auto", "bfloat16", 2, 2 * 64 * 8 * 128 * 2, ""},
		// TP 16 over 8 KV heads: each GPU holds one, replicated twice.
		{"Qwen/Qwen3-32B", "auto", "bfloat16", 16, 2 * 64 * 1 * 128 * 2 * 16, ""},
		{"acme/NotAModel-7B", "auto", "bfloat16", 1, engine.DefaultConfig().KVBytesPerToken, "not a preset model"},
		{"Qwen/Qwen3-32B", "int3", "bfloat16", 1, 2 * 64 * 8 * 128 * 2, "not one calibrate knows"},
	} {
		dir := filepath.Join(tmp, fmt.Sprint(i))
		copyLog(t, src, dir, func(m map[string]any) {
			m["model"] = c.model
			k := m["engine_kwargs"].(map[string]any)
			k["model"], k["kv_cache_dtype"], k["dtype"], k["tensor_parallel_size"] = c.model, c.kvDtype, c.dtype, c.tp
		})
		l, err := ReadLog(dir, ReadOptions{})
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if l.Config.KVBytesPerToken != c.want {
			t.Errorf("%s, kv_cache_dtype %s, dtype %s, TP %d: kv_bytes_per_token %.0f, want %.0f", c.model, c.kvDtype, c.dtype, c.tp, l.Config.KVBytesPerToken, c.want)
		}
		noted := strings.Contains(strings.Join(l.Notes, "\n"), "kv_bytes_per_token")
		if c.note != "" && !strings.Contains(strings.Join(l.Notes, "\n"), c.note) || c.note == "" && noted {
			t.Errorf("%s, kv_cache_dtype %s: notes %q, want a note %q", c.model, c.kvDtype, l.Notes, c.note)
		}
	}
}
