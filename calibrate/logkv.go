package calibrate

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/traces"
)

// KV sources, as LogFit.KVSource and the notes name them.
const (
	kvFromFlag = "--num-gpu-blocks"
	kvFromMeta = "meta.json kv_cache.num_gpu_blocks"
)

// logKVBlocks finds a log's KV cache size in blocks per engine rank, from
// the first of:
//
//  1. meta.json's kv_cache (num_gpu_blocks, or num_kv_tokens / block size);
//  2. --num-gpu-blocks (opts.NumGPUBlocks);
//  3. timeseries.csv's kv_cache_pct: at each tick the blocks held by the
//     requests the log shows in the engine (scheduled, not finished; prompt
//     plus the tokens generated so far) over the usage fraction, median over
//     ticks with usage from 10% to 98%;
//  4. the roofline of the log's model on its GPU (meta.json's hardware or
//     --gpu), derived, not measured, and said so;
//  5. the log's proof that sequences, not KV, limited the batch: while
//     requests waited, running stayed at max_num_seqs (x ranks); then any
//     cache that holds max_num_seqs of the log's longest requests replays
//     alike, and that is the size used.
//
// Otherwise it fails with the flag to pass: a KV size is never assumed.
func logKVBlocks(meta *traces.VLLMMeta, entries []traces.VLLMEntry, series []traces.VLLMTick, cfg engine.Config, opts ReadOptions, roof *Roofline) (int, string, error) {
	if kv := meta.KVCache; kv != nil {
		if kv.NumGPUBlocks > 0 {
			return kv.NumGPUBlocks, kvFromMeta, nil
		}
		if kv.NumKVTokens > 0 {
			return kv.NumKVTokens / cfg.BlockSize, "meta.json kv_cache.num_kv_tokens / block size", nil
		}
	}
	if opts.NumGPUBlocks > 0 {
		return opts.NumGPUBlocks, kvFromFlag, nil
	}
	if n, ticks := kvFromSeries(meta, entries, series, cfg); n > 0 {
		return n, fmt.Sprintf("estimated from timeseries.csv's kv_cache_pct (median of %d ticks; pass --num-gpu-blocks for the engine's own number)", ticks), nil
	}
	if roof != nil && roof.Config.BlockSize == cfg.BlockSize {
		return roof.Config.NumGPUBlocks, fmt.Sprintf("derived by roofline for %s, not measured (pass --num-gpu-blocks for the engine's own number)", roof.Config.Name), nil
	}
	ranks := cfg.Ranks()
	if share, ticks := seqLimited(series, cfg.MaxNumSeqs*ranks); ticks >= 5 && share >= 0.9 {
		longest := 0
		for _, e := range entries {
			longest = max(longest, e.Record.InputTokens+e.Record.OutputTokens)
		}
		n := min(cfg.MaxNumSeqs*((longest+cfg.BlockSize-1)/cfg.BlockSize), 1<<24)
		return n, fmt.Sprintf("not logged, but sequences, not KV, limited the batch (running at max_num_seqs %d in %.0f%% of the %d ticks with requests waiting), so a cache that holds %d of the longest request replays the same; pass --num-gpu-blocks to write the real size into the profile",
			cfg.MaxNumSeqs*ranks, 100*share, ticks, cfg.MaxNumSeqs), nil
	}
	return 0, "", errors.New("the log does not give the KV cache size (meta.json has no kv_cache.num_gpu_blocks, timeseries.csv no kv_cache_pct, and the engine was not held at max_num_seqs): pass --num-gpu-blocks N (vLLM prints it at start-up as \"GPU KV cache size\" / \"# GPU blocks\") or --gpu NAME")
}

// kvFromSeries estimates the KV cache size per rank from kv_cache_pct (see
// logKVBlocks); 0 when the series has too few ticks with a usable usage.
func kvFromSeries(meta *traces.VLLMMeta, entries []traces.VLLMEntry, series []traces.VLLMTick, cfg engine.Config) (int, int) {
	if len(series) == 0 || meta.StartedAt.IsZero() || len(entries) == 0 {
		return 0, 0
	}
	// The ticks count seconds from started_at (wall clock); the request
	// timestamps are on the engine's monotonic clock. arrival_time (wall)
	// minus queued_ts (monotonic) is the offset, up to the network's delay.
	offs := make([]float64, 0, len(entries))
	for _, e := range entries {
		offs = append(offs, e.ArrivalTime-e.Timing.Queued)
	}
	slices.Sort(offs)
	offset := offs[len(offs)/2]
	start := float64(meta.StartedAt.UnixNano()) / 1e9
	bs := float64(cfg.BlockSize)
	var est []float64
	for _, tk := range series {
		if tk.KVCachePct < 10 || tk.KVCachePct > 98 {
			continue
		}
		now := start + tk.T - offset
		used := 0.0
		for _, e := range entries {
			t := e.Timing
			sched := t.Scheduled
			if sched == 0 {
				sched = t.FirstToken
			}
			if now < sched || now >= t.LastToken {
				continue
			}
			gen := 0.0
			if now >= t.FirstToken && t.LastToken > t.FirstToken {
				gen = 1 + float64(e.Record.OutputTokens-1)*(now-t.FirstToken)/(t.LastToken-t.FirstToken)
			}
			used += math.Ceil((float64(e.Record.InputTokens) + gen) / bs)
		}
		if used > 0 {
			est = append(est, used/(tk.KVCachePct/100))
		}
	}
	if len(est) < 5 {
		return 0, 0
	}
	slices.Sort(est)
	return int(math.Round(est[len(est)/2] / float64(cfg.Ranks()))), len(est)
}

// seqLimited returns the share of ticks with requests waiting, from the first
// tick that reached the sequence cap on, in which running stood at the cap
// (within one, as a tick can fall between a finish and the next admission).
func seqLimited(series []traces.VLLMTick, seqCap int) (float64, int) {
	reached := false
	at, n := 0, 0
	for _, tk := range series {
		if tk.Running >= seqCap-1 {
			reached = true
		}
		if !reached || tk.Waiting == 0 {
			continue
		}
		n++
		if tk.Running >= seqCap-1 {
			at++
		}
	}
	if n == 0 {
		return 0, 0
	}
	return float64(at) / float64(n), n
}
