package traces

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestVLLMLog(t *testing.T) {
	entries, meta, err := ReadVLLMLog("testdata/vllm-log")
	if err != nil {
		t.Fatal(err)
	}
	const model = "meta-llama/Llama-3.1-8B"
	if len(entries) != 3 {
		t.Fatalf("%d entries, want 3", len(entries))
	}
	var recs []Record
	for _, e := range entries {
		recs = append(recs, e.Record)
	}
	checkRecords(t, recs, []Record{
		{ID: 1, Model: model, InputTokens: 2358, OutputTokens: 531},
		{ID: 2, Arrival: 500 * time.Millisecond, Model: model, InputTokens: 1034, OutputTokens: 769},
		{ID: 3, Arrival: 1750 * time.Millisecond, Model: model, InputTokens: 12, OutputTokens: 0},
	})
	e := entries[0]
	if e.RequestID != "bench-0" || e.ArrivalTime != 1787267980.5 || e.Timing != (VLLMTiming{100, 100.25, 100.75, 110.5}) {
		t.Errorf("entry 0: %+v", e)
	}
	if e.Timing.TTFT() != 750*time.Millisecond || e.Timing.E2E() != 10500*time.Millisecond {
		t.Errorf("TTFT %v, E2E %v", e.Timing.TTFT(), e.Timing.E2E())
	}
	if tm := entries[2].Timing; tm != (VLLMTiming{Queued: 101.75}) {
		t.Errorf("entry 2: timing %+v, want only Queued", tm)
	}

	if meta.SchemaVersion != 1 || meta.Model != model || meta.VLLMVersion != "0.19.0" || meta.NumRequests != 3 || meta.TickSeconds != 1 {
		t.Errorf("meta: %+v", meta)
	}
	if !meta.StartedAt.Equal(time.Date(2026, 8, 20, 23, 19, 39, 992496000, time.UTC)) || !meta.FinishedAt.IsZero() {
		t.Errorf("meta times %v, %v", meta.StartedAt, meta.FinishedAt)
	}
	k := meta.EngineKwargs
	if k.MaxNumSeqs != 256 || k.MaxNumBatchedTokens != 2048 || k.MaxModelLen != 0 || k.TensorParallelSize != 1 || k.Seed != 42 || k.Dtype != "bfloat16" {
		t.Errorf("engine kwargs %+v", k)
	}
	if string(k.Extra["enforce_eager"]) != "true" || len(k.Extra) != 1 {
		t.Errorf("engine kwargs extra %v", k.Extra)
	}
	if kv := meta.KVCache; kv == nil || kv.NumGPUBlocks != 2588 || kv.BlockSize != 16 || !kv.EnablePrefixCaching || kv.NumKVTokens != 41408 || kv.Extra != nil {
		t.Errorf("kv cache %+v", meta.KVCache)
	}
	if meta.Hardware != nil {
		t.Errorf("hardware %+v, want nil", meta.Hardware)
	}
	if _, ok := meta.Extra["resolved_config"]; !ok || len(meta.Extra) != 1 {
		t.Errorf("extra keys %v, want resolved_config", meta.Extra)
	}
}

func TestVLLMLogWithoutMeta(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile("testdata/vllm-log/requests.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "requests.jsonl"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	r, meta, err := NewVLLMLog(dir, Options{Model: "mine"})
	if err != nil || meta != nil {
		t.Fatalf("NewVLLMLog: %v, meta %v", err, meta)
	}
	defer r.(io.Closer).Close()
	recs := mustReadAll(t, r)
	if len(recs) != 3 || recs[0].Model != "mine" {
		t.Errorf("%d records, model %q", len(recs), recs[0].Model)
	}

	if err := os.WriteFile(filepath.Join(dir, "meta.json"), []byte(`{"model": 5}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := NewVLLMLog(dir, Options{}); err == nil || !strings.Contains(err.Error(), "meta.json") {
		t.Errorf("bad meta.json: %v", err)
	}
	// Open reads a requests file by another name, without meta.json beside it.
	if err := os.Rename(filepath.Join(dir, "requests.jsonl"), filepath.Join(dir, "run1.jsonl")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "meta.json")); err != nil {
		t.Fatal(err)
	}
	r, c, err := Open(filepath.Join(dir, "run1.jsonl"), "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if recs := mustReadAll(t, r); len(recs) != 3 {
		t.Errorf("Open(run1.jsonl): %d records, want 3", len(recs))
	}
	if _, _, err := NewVLLMLog(t.TempDir(), Options{}); err == nil {
		t.Error("no requests.jsonl: no error")
	}
	if _, _, err := ReadVLLMLog(t.TempDir()); err == nil {
		t.Error("ReadVLLMLog without requests.jsonl: no error")
	}
}

func TestVLLMBadLines(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`{"request_id": "b", "output_toks": 1, "arrival_time": 2}`, "missing input_toks"},
		{`{"request_id": "b", "input_toks": 1, "arrival_time": 2}`, "missing output_toks"},
		{`{"request_id": "b", "input_toks": 1, "output_toks": 1}`, "missing arrival_time"},
		{`{"request_id": "b", "input_toks": 1, "output_toks": 1, "arrival_time": 2, "queued_ts": "x"}`, "invalid JSON"},
		{`{"request_id": "b", "input_toks": 0, "output_toks": 1, "arrival_time": 2}`, "input length 0"},
		{`{"request_id": "b", "input_toks": 1, "output_toks": 1, "arrival_time": 0.5}`, "before the trace's start"},
	} {
		in := `{"request_id": 7, "input_toks": 3, "output_toks": 1, "arrival_time": 1}` + "\n" + tc.line + "\n"
		r := NewVLLMRequests(strings.NewReader(in), "requests.jsonl", Options{})
		e, err := r.NextEntry()
		if err != nil || e.RequestID != "7" {
			t.Fatalf("first entry %+v, %v", e, err)
		}
		_, err = r.Next()
		wantLineError(t, err, "requests.jsonl", 2, true, tc.want)
		if _, err := r.Next(); !errors.Is(err, io.EOF) {
			t.Errorf("after the bad line: %v", err)
		}
	}
}

func TestVLLMRealLogs(t *testing.T) {
	for _, tc := range []struct {
		dir, model        string
		maxSeqs, tp, gpuB int
	}{
		{"vllm-logs/RTX4090-Llama-3.1-8B", "meta-llama/Llama-3.1-8B", 256, 1, 2588},
		{"vllm-logs/RTXPRO6000-Qwen3-32B", "Qwen/Qwen3-32B", 128, 2, 0},
	} {
		dir := sharedPath(t, tc.dir)
		entries, meta, err := ReadVLLMLog(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 300 || meta.NumRequests != 300 {
			t.Errorf("%s: %d entries, meta says %d; want 300", tc.dir, len(entries), meta.NumRequests)
		}
		if meta.Model != tc.model || meta.EngineKwargs.MaxNumSeqs != tc.maxSeqs || meta.EngineKwargs.TensorParallelSize != tc.tp || meta.EngineKwargs.MaxNumBatchedTokens != 2048 {
			t.Errorf("%s: meta %+v", tc.dir, meta)
		}
		if tc.gpuB > 0 {
			if meta.KVCache == nil || meta.KVCache.NumGPUBlocks != tc.gpuB || meta.KVCache.BlockSize != 16 || meta.Hardware == nil || meta.Hardware.DeviceName != "NVIDIA GeForce RTX 4090" {
				t.Errorf("%s: kv cache %+v, hardware %+v", tc.dir, meta.KVCache, meta.Hardware)
			}
			if _, ok := meta.Extra["resolved_config"]; !ok {
				t.Errorf("%s: no resolved_config in Extra", tc.dir)
			}
		} else if meta.KVCache != nil {
			t.Errorf("%s: kv cache %+v, want nil", tc.dir, meta.KVCache)
		}
		for i, e := range entries {
			tm := e.Timing
			if e.Record.Model != tc.model || e.RequestID == "" || tm.TTFT() <= 0 || tm.E2E() < tm.TTFT() ||
				!(tm.Queued <= tm.Scheduled && tm.Scheduled <= tm.FirstToken && tm.FirstToken <= tm.LastToken) {
				t.Fatalf("%s: entry %d: %+v", tc.dir, i, e)
			}
			if i > 0 && e.Record.Arrival < entries[i-1].Record.Arrival {
				t.Fatalf("%s: entry %d arrives before the one before it", tc.dir, i)
			}
		}
		// 300 requests at 10 per second: about 30 s of arrivals.
		if last := entries[len(entries)-1].Record.Arrival; last < 25*time.Second || last > 35*time.Second {
			t.Errorf("%s: last arrival %v, want about 30 s", tc.dir, last)
		}
	}
}

func TestVLLMMetaNull(t *testing.T) {
	var m VLLMMeta
	if err := m.UnmarshalJSON([]byte("null")); err != nil || m.Model != "" {
		t.Errorf("null meta: %+v, %v", m, err)
	}
}

func FuzzVLLMRequests(f *testing.F) {
	f.Add([]byte(`{"request_id": "bench-0", "input_toks": 2358, "output_toks": 531, "arrival_time": 1787267980.0827403, "queued_ts": 27536.660701067, "scheduled_ts": 27536.660721646, "first_token_ts": 27537.350135653, "last_token_ts": 27554.231018618}` + "\n" +
		`{"request_id": 1, "input_toks": 0, "output_toks": 1, "arrival_time": 1787267979}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSkipping(t, data, func(r io.Reader, name string, opts Options) Reader { return NewVLLMRequests(r, name, opts) })
	})
}
