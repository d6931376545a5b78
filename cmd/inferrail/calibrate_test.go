package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
)

// calibrateCLI runs the CLI with args once main.go registers calibrate.
func calibrateCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	registered := false
	for _, c := range newRootCmd(io.Discard, io.Discard).Commands() {
		if c.Name() == "calibrate" {
			registered = true
		}
	}
	if !registered {
		t.Skip("calibrate is not registered in main.go yet (root.AddCommand(newCalibrateCmd(stdout, stderr)))")
	}
	return runCLI(append([]string{"calibrate"}, args...)...)
}

func TestCalibrateBadFlags(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "p.yaml")
	cases := []struct {
		args    []string
		mention string
	}{
		{nil, "exactly one of"},
		{[]string{"--url", "http://127.0.0.1:1", "--from-log", dir, "--out", out}, "exactly one of"},
		{[]string{"--preset", "Llama-3.1-8B@H100"}, "--out"},
		{[]string{"--preset", "Llama-3.1-8B@H100", "--out", out, "--holdout", "0.5"}, "--holdout"},
		{[]string{"--preset", "Llama-3.1-8B@TPU", "--out", out}, "unknown GPU"},
		{[]string{"--preset", "Llama-3.1-70B@1xRTX4090", "--out", out}, "does not fit"},
		{[]string{"--from-log", dir, "--out", out, "--holdout", "1"}, "--holdout"},
		{[]string{"--from-log", dir, "--out", out, "--budget", "1m"}, "--budget"},
		{[]string{"--url", "localhost:8000", "--out", out}, "--url"},
		{[]string{"--url", "http://127.0.0.1:1", "--out", out, "--holdout", "0.2"}, "--holdout"},
		{[]string{"--url", "http://127.0.0.1:1", "--out", out, "--budget", "0s"}, "--budget"},
		{[]string{"--url", "http://127.0.0.1:1", "--out", out, "--repeats", "-1"}, "--repeats"},
		{[]string{"--from-log", dir, "--out", out, "--repeats", "2"}, "--repeats"},
		{[]string{"--list-presets", "--out", out}, "--out"},
		{[]string{"stray", "--list-presets"}, "no arguments"},
	}
	for _, c := range cases {
		code, stdout, stderr := calibrateCLI(t, c.args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", c.args, code, stderr)
		}
		if stdout != "" {
			t.Errorf("%v: wrote to stdout: %q", c.args, stdout)
		}
		if strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, c.mention) {
			t.Errorf("%v: stderr %q should be one line naming %q", c.args, stderr, c.mention)
		}
	}
}

func TestCalibratePresetWritesLoadableProfile(t *testing.T) {
	out := filepath.Join(t.TempDir(), "70b.yaml")
	code, _, stderr := calibrateCLI(t, "--preset", "Llama-3.1-70B@4xH100", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	cfg, err := engine.LoadConfig(out)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Name != "Llama-3.1-70B@4xH100" || !strings.Contains(stderr, "step_fixed_ms") {
		t.Errorf("profile %q, stderr %q: want the preset and its derivation", cfg.Name, stderr)
	}
}

func TestCalibrateListPresets(t *testing.T) {
	code, stdout, _ := calibrateCLI(t, "--list-presets")
	if code != 0 || !strings.Contains(stdout, "Llama-3.1-8B@H100") || !strings.Contains(stdout, "Qwen3-32B@H200") {
		t.Errorf("exit %d, stdout %q: want the presets listed", code, stdout)
	}
}

func TestCalibrateFromLog(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "shared", "traces", "vllm-logs", "RTX4090-Llama-3.1-8B")
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("shared vLLM log %s not found; skipping", dir)
	}
	tmp := t.TempDir()
	out, rep := filepath.Join(tmp, "p.yaml"), filepath.Join(tmp, "fit.json")
	code, stdout, stderr := calibrateCLI(t, "--from-log", dir, "--holdout", "0.5", "--max-evals", "60", "--out", out, "--report", rep)
	if code != 0 || stdout != "" {
		t.Fatalf("exit %d, stdout %q, stderr %s", code, stdout, stderr)
	}
	if _, err := engine.LoadConfig(out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	var fit struct {
		Holdout *struct {
			E2EMAPE float64 `json:"e2e_mape"`
		} `json:"holdout"`
	}
	if err := json.Unmarshal(b, &fit); err != nil || fit.Holdout == nil {
		t.Fatalf("report %s: %v", bytes.TrimSpace(b[:min(len(b), 200)]), err)
	}
	if fit.Holdout.E2EMAPE > 15 {
		t.Errorf("holdout E2E MAPE %.1f%%: the fit should do much better", fit.Holdout.E2EMAPE)
	}
}

// TestCalibrateProbesMockEngine runs calibrate --url against the mock
// engine on 127.0.0.1 (wall clock, a tiny fast profile and design: only the
// plumbing is checked here; calibrate's own tests check accuracy on virtual
// time).
func TestCalibrateProbesMockEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time test; skipped with -short")
	}
	cfg := engine.DefaultConfig()
	cfg.MaxModelLen = 2048
	// Prefill per token large enough (1,024 tokens: 51 ms) that a busy
	// machine's scheduling jitter of a few ms cannot hide its slope.
	cfg.Latency = engine.Profile{StepFixedMs: 4, PrefillTokenUs: 50, PrefillPairNs: 0.2, DecodeSeqUs: 20, DecodeCtxTokenNs: 10}
	s, err := server.New(server.Config{Engine: cfg, EnablePromptTokensDetails: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { s.Run(ctx); close(runDone) }()
	srv := httptest.NewServer(s.Handler()) // 127.0.0.1
	defer func() { srv.Close(); cancel(); <-runDone }()

	out := filepath.Join(t.TempDir(), "probed.yaml")
	code, stdout, stderr := calibrateCLI(t, "--url", srv.URL, "--out", out, "--budget", "60s",
		"--max-prompt-tokens", "1024", "--max-batch", "4", "--repeats", "1", "--max-num-batched-tokens", "2048")
	if code != 0 || stdout != "" {
		t.Fatalf("exit %d, stdout %q, stderr %s", code, stdout, stderr)
	}
	got, err := engine.LoadConfig(out)
	if err != nil {
		t.Fatal(err)
	}
	// Every fitted term is in the profile, the TTFT overhead (no profile
	// field) as a comment.
	if b, _ := os.ReadFile(out); !strings.Contains(string(b), "#   ttft_overhead_ms") || !strings.Contains(string(b), "#   step_fixed_ms") {
		t.Errorf("profile lacks the fitted terms:\n%s", b)
	}
	if got.MaxModelLen != cfg.MaxModelLen || got.NumGPUBlocks != cfg.NumGPUBlocks {
		t.Errorf("limits max_model_len %d, num_gpu_blocks %d: want %d, %d from /v1/models and /metrics", got.MaxModelLen, got.NumGPUBlocks, cfg.MaxModelLen, cfg.NumGPUBlocks)
	}
	if !strings.Contains(stderr, "relative RMS") {
		t.Errorf("stderr does not report the fit: %s", stderr)
	}
	if _, err := os.Stat(strings.TrimSuffix(out, ".yaml") + ".measurements.json"); err != nil {
		t.Errorf("measurements not written beside the profile: %v", err)
	}
}

// calibrate --fidelity writes the report; --validate predicts another run;
// a log that gives no KV size is refused with the flag to pass.
func TestCalibrateFromLogModes(t *testing.T) {
	shared := filepath.Join("..", "..", "..", "shared", "traces", "vllm-logs")
	a, b := filepath.Join(shared, "RTX4090-Llama-3.1-8B"), filepath.Join(shared, "RTXPRO6000-Qwen3-32B")
	if _, err := os.Stat(a); err != nil {
		t.Skipf("shared vLLM logs %s not found; skipping", shared)
	}
	tmp := t.TempDir()
	md := filepath.Join(tmp, "fidelity.md")
	code, _, stderr := calibrateCLI(t, "--from-log", a, "--from-log", b, "--gpu", "RTXPRO6000", "--max-evals", "40", "--fidelity", md)
	if code != 0 {
		t.Fatalf("--fidelity: exit %d: %s", code, stderr)
	}
	doc, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"RTX4090-Llama-3.1-8B", "RTXPRO6000-Qwen3-32B", "scheduled to first token", "| scale |", "| preset |"} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("fidelity report lacks %q", want)
		}
	}
	out := filepath.Join(tmp, "p.yaml")
	code, _, stderr = calibrateCLI(t, "--from-log", a, "--validate", a, "--max-evals", "40", "--out", out)
	if code != 0 || !strings.Contains(stderr, "validate 1") || !strings.Contains(stderr, "scale") {
		t.Errorf("--validate: exit %d: %s", code, stderr)
	}
	bare := filepath.Join(tmp, "bare")
	if err := os.MkdirAll(bare, 0o755); err != nil {
		t.Fatal(err)
	}
	reqs, _ := os.ReadFile(filepath.Join(a, "requests.jsonl"))
	meta := `{"schema_version":1,"model":"meta-llama/Llama-3.1-8B","engine_kwargs":{"max_num_seqs":256,"max_num_batched_tokens":2048}}`
	os.WriteFile(filepath.Join(bare, "requests.jsonl"), reqs, 0o644)
	os.WriteFile(filepath.Join(bare, "meta.json"), []byte(meta), 0o644)
	code, _, stderr = calibrateCLI(t, "--from-log", bare, "--out", out)
	if code != 2 || !strings.Contains(stderr, "--num-gpu-blocks") {
		t.Errorf("no KV size: exit %d, stderr %q; want 2 and --num-gpu-blocks named", code, stderr)
	}
	if code, _, stderr = calibrateCLI(t, "--from-log", bare, "--num-gpu-blocks", "2588", "--max-evals", "30", "--out", out); code != 0 {
		t.Errorf("--num-gpu-blocks 2588: exit %d: %s", code, stderr)
	}
}
