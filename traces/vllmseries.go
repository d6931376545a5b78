package traces

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
)

const vllmSeriesFile = "timeseries.csv"

// VLLMTick is one row of a vLLM log's timeseries.csv: the engine's gauges
// sampled every meta.tick_seconds.
type VLLMTick struct {
	// T is seconds since meta.started_at.
	T                float64
	PromptThroughput float64 // prompt tokens per second
	GenThroughput    float64 // generated tokens per second
	Running, Waiting int
	// KVCachePct is the KV cache usage in percent (0 when not logged).
	KVCachePct float64
}

// ReadVLLMSeries reads a vLLM log directory's timeseries.csv (columns t,
// prompt_throughput, gen_throughput, running, waiting, kv_cache_pct, in any
// order); it returns nil and no error when the directory has none. A
// malformed row is an error naming its line.
func ReadVLLMSeries(dir string) ([]VLLMTick, error) {
	path := filepath.Join(dir, vllmSeriesFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read vllm timeseries: %w", err)
	}
	defer f.Close()
	return parseVLLMSeries(f, path)
}

func parseVLLMSeries(r io.Reader, name string) ([]VLLMTick, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, fmt.Errorf("%s: header: %w", name, err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[h] = i
	}
	for _, need := range []string{"t", "running", "waiting"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("%s: header has no %q column (want t, prompt_throughput, gen_throughput, running, waiting, kv_cache_pct)", name, need)
		}
	}
	var out []VLLMTick
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		num := func(c string) (float64, error) {
			i, ok := col[c]
			if !ok || i >= len(rec) || rec[i] == "" {
				return 0, nil
			}
			v, err := strconv.ParseFloat(rec[i], 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return 0, &LineError{File: name, Line: line, Err: badf("%s %q: want a non-negative number", c, rec[i])}
			}
			return v, nil
		}
		var t VLLMTick
		var run, wait float64
		for _, f := range []struct {
			c   string
			dst *float64
		}{{"t", &t.T}, {"prompt_throughput", &t.PromptThroughput}, {"gen_throughput", &t.GenThroughput}, {"running", &run}, {"waiting", &wait}, {"kv_cache_pct", &t.KVCachePct}} {
			if *f.dst, err = num(f.c); err != nil {
				return nil, err
			}
		}
		if t.KVCachePct > 100 {
			return nil, &LineError{File: name, Line: line, Err: badf("kv_cache_pct %v: a percentage is at most 100", t.KVCachePct)}
		}
		t.Running, t.Waiting = int(run), int(wait)
		out = append(out, t)
	}
}
