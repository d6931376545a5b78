package calibrate

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/traces"
)

// Log is a vLLM request log ready to replay: its requests in arrival order
// and the engine configuration its meta.json describes.
type Log struct {
	// Name identifies the log in reports (its directory).
	Name string
	// Config is the engine configuration from meta.json; its Latency is what
	// a fit replaces.
	Config engine.Config
	// Requests are in arrival (queued) order.
	Requests []LogRequest
	// Notes say what meta.json lacked and what was assumed instead.
	Notes []string
	// Meta is the log's meta.json (nil when absent).
	Meta *traces.VLLMMeta
}

// LogRequest is one logged request: when the engine queued it, its lengths
// and what the engine measured.
type LogRequest struct {
	// Arrival is queued_ts relative to the log's first queued_ts.
	Arrival      time.Duration
	PromptTokens int
	OutputTokens int
	// TTFT and E2E are measured from queued_ts, in seconds.
	TTFT, E2E float64
}

// ReadLog reads a vLLM request log directory (requests.jsonl and meta.json,
// see traces.ReadVLLMLog) and builds the engine configuration to replay it
// with (see LogConfig).
func ReadLog(dir string) (*Log, error) {
	entries, meta, err := traces.ReadVLLMLog(dir)
	if err != nil {
		return nil, err
	}
	l, err := NewLog(entries, meta, filepath.Base(filepath.Clean(dir)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	l.Name = dir
	return l, nil
}

// NewLog orders entries by queued time and configures the engine from meta
// (see LogConfig for gpuHint). Entries without queued, first-token and last-token times are errors.
func NewLog(entries []traces.VLLMEntry, meta *traces.VLLMMeta, gpuHint string) (*Log, error) {
	if len(entries) == 0 {
		return nil, errors.New("the log has no requests")
	}
	order := make([]int, len(entries))
	for i := range order {
		order[i] = i
	}
	for i, e := range entries {
		t := e.Timing
		if t.Queued == 0 || t.FirstToken == 0 || t.LastToken == 0 {
			return nil, fmt.Errorf("request %d (%q): needs queued_ts, first_token_ts and last_token_ts to be fitted", i, e.RequestID)
		}
		if t.FirstToken < t.Queued || t.LastToken < t.FirstToken {
			return nil, fmt.Errorf("request %d (%q): timestamps out of order (queued %v, first token %v, last token %v)", i, e.RequestID, t.Queued, t.FirstToken, t.LastToken)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(entries[a].Timing.Queued, entries[b].Timing.Queued) })
	q0 := entries[order[0]].Timing.Queued
	l := &Log{Meta: meta, Requests: make([]LogRequest, len(entries))}
	longest := 0
	for i, k := range order {
		e := entries[k]
		l.Requests[i] = LogRequest{
			Arrival:      time.Duration(math.Round((e.Timing.Queued - q0) * 1e9)),
			PromptTokens: e.Record.InputTokens,
			OutputTokens: e.Record.OutputTokens,
			TTFT:         e.Timing.FirstToken - e.Timing.Queued,
			E2E:          e.Timing.LastToken - e.Timing.Queued,
		}
		longest = max(longest, e.Record.InputTokens+e.Record.OutputTokens)
	}
	cfg, notes, err := LogConfig(meta, longest, gpuHint)
	if err != nil {
		return nil, err
	}
	l.Config, l.Notes = cfg, notes
	return l, nil
}

// LogConfig builds the engine configuration a vLLM log ran with from its
// meta.json: max_num_seqs, max_num_batched_tokens, max_model_len, block size,
// num_gpu_blocks and prefix caching. What meta leaves out is taken from the
// roofline preset of the model and GPU when both are known (KV capacity), or
// else from engine.DefaultConfig; every such assumption is returned as a
// note. longest is the longest request (prompt plus output) in the log, a
// floor for max_model_len; gpuHint names the GPU when meta.json does not.
func LogConfig(meta *traces.VLLMMeta, longest int, gpuHint string) (engine.Config, []string, error) {
	cfg := engine.DefaultConfig()
	var notes []string
	if meta == nil {
		notes = append(notes, "no meta.json: engine limits are the default profile's")
		cfg.MaxModelLen = max(cfg.MaxModelLen, longest)
		return cfg, notes, nil
	}
	cfg.Name = "fit"
	if meta.Model != "" {
		cfg.Name = "fit-" + shortModel(meta.Model)
	}
	k := meta.EngineKwargs
	if k.MaxNumSeqs > 0 {
		cfg.MaxNumSeqs = k.MaxNumSeqs
	} else {
		notes = append(notes, fmt.Sprintf("max_num_seqs not logged: assumed %d", cfg.MaxNumSeqs))
	}
	if k.MaxNumBatchedTokens > 0 {
		cfg.MaxNumBatchedTokens = k.MaxNumBatchedTokens
	} else {
		notes = append(notes, fmt.Sprintf("max_num_batched_tokens not logged: assumed %d", cfg.MaxNumBatchedTokens))
	}
	if k.MaxModelLen > 0 {
		cfg.MaxModelLen = k.MaxModelLen
	}
	roof, source := logRoofline(meta, gpuHint)
	if roof != nil {
		if k.MaxModelLen <= 0 {
			cfg.MaxModelLen = roof.Model.MaxContext
		}
	}
	if kv := meta.KVCache; kv != nil && kv.NumGPUBlocks > 0 {
		cfg.NumGPUBlocks = kv.NumGPUBlocks
		if kv.BlockSize > 0 {
			cfg.BlockSize = kv.BlockSize
		}
		cfg.DisablePrefixCaching = !kv.EnablePrefixCaching
	} else if roof != nil {
		cfg.NumGPUBlocks = roof.Config.NumGPUBlocks
		notes = append(notes, fmt.Sprintf("num_gpu_blocks not logged: %d blocks of 16 from the roofline preset %s (GPU from %s)", cfg.NumGPUBlocks, roof.Config.Name, source))
	} else {
		notes = append(notes, fmt.Sprintf("num_gpu_blocks not logged and model or GPU unknown: assumed %d", cfg.NumGPUBlocks))
	}
	cfg.MaxModelLen = max(cfg.MaxModelLen, longest)
	if err := cfg.Validate(); err != nil {
		return engine.Config{}, nil, fmt.Errorf("engine configuration from meta.json: %w", err)
	}
	return cfg, notes, nil
}

// shortModel drops the organisation from a Hugging Face model id.
func shortModel(id string) string {
	if i := strings.LastIndexByte(id, '/'); i >= 0 {
		return id[i+1:]
	}
	return id
}

// logRoofline returns the roofline preset matching a log's model, GPU and
// tensor parallel size, nil when either is unknown. The GPU is read from
// meta.hardware.device_name, or else from hint (ReadLog passes the log
// directory's name, which by LLMServingSim's convention starts with the GPU).
func logRoofline(meta *traces.VLLMMeta, hint string) (*Roofline, string) {
	m, ok := findModel(shortModel(meta.Model))
	if !ok {
		return nil, ""
	}
	source := "meta.json hardware"
	g, ok := GPU{}, false
	if meta.Hardware != nil {
		g, ok = gpuIn(meta.Hardware.DeviceName)
	}
	if !ok && hint != "" {
		g, ok = gpuIn(hint)
		source = fmt.Sprintf("the log's name %q", hint)
	}
	if !ok {
		return nil, ""
	}
	r, err := NewRoofline(m, g, max(meta.EngineKwargs.TensorParallelSize, 1))
	if err != nil {
		return nil, ""
	}
	return r, source
}

// gpuIn finds a known GPU named in s ("NVIDIA GeForce RTX 4090", "H100 80GB HBM3").
func gpuIn(s string) (GPU, bool) {
	norm := func(s string) string {
		return strings.ToLower(strings.NewReplacer(" ", "", "-", "", "_", "").Replace(s))
	}
	n := norm(s)
	for _, g := range gpus {
		if strings.Contains(n, norm(g.Name)) {
			return g, true
		}
	}
	return GPU{}, false
}

// replayer replays a log through the engine model: the engine is rebuilt for
// every profile, the buffers are reused.
type replayer struct {
	log         *Log
	first, last []time.Duration // predicted, relative to arrival
}

func newReplayer(l *Log) *replayer {
	return &replayer{log: l, first: make([]time.Duration, len(l.Requests)), last: make([]time.Duration, len(l.Requests))}
}

// run replays every request with profile p and fills first and last.
func (r *replayer) run(p engine.Profile) error {
	cfg := r.log.Config
	cfg.Latency = p
	e, err := engine.New(cfg)
	if err != nil {
		return err
	}
	reqs := r.log.Requests
	clear(r.first)
	clear(r.last)
	next, done := 0, 0
	for done < len(reqs) {
		at, ok := e.NextStep()
		if next < len(reqs) && (!ok || reqs[next].Arrival <= at) {
			q := reqs[next]
			if err := e.Add(q.Arrival, engine.Request{ID: engine.RequestID(next + 1), PromptTokens: q.PromptTokens, OutputTokens: q.OutputTokens}); err != nil {
				return fmt.Errorf("replay request %d: %w", next, err)
			}
			next++
			continue
		}
		if !ok {
			return fmt.Errorf("replay: engine idle with %d of %d requests unfinished", len(reqs)-done, len(reqs))
		}
		res := e.Step(at)
		if res.Scheduled == 0 {
			return fmt.Errorf("replay: the engine could not schedule anything at %v (KV cache too small for the waiting request?)", at)
		}
		end := res.End()
		for _, em := range res.Emitted {
			i := int(em.ID) - 1
			if em.Output == 1 {
				r.first[i] = end - reqs[i].Arrival
			}
			if em.Finished {
				r.last[i] = end - reqs[i].Arrival
				done++
			}
		}
	}
	return nil
}

// errors returns the mean absolute percentage errors (as fractions) of TTFT
// and E2E over requests [lo, hi).
func (r *replayer) errors(lo, hi int) (ttft, e2e float64) {
	reqs := r.log.Requests
	for i := lo; i < hi; i++ {
		ttft += relErr(r.first[i].Seconds(), reqs[i].TTFT)
		e2e += relErr(r.last[i].Seconds(), reqs[i].E2E)
	}
	n := float64(max(hi-lo, 1))
	return ttft / n, e2e / n
}

// ttftFloor keeps a near-zero measured TTFT from dominating the mean
// relative error: errors are relative to at least 1 ms.
const ttftFloor = 1e-3

func relErr(pred, meas float64) float64 {
	return math.Abs(pred-meas) / math.Max(meas, ttftFloor)
}
