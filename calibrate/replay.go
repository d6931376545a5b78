package calibrate

import (
	"cmp"
	"encoding/json"
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
	// Name identifies the log in reports (its directory, cleaned). It never
	// changes the fit: the configuration comes from the log's contents.
	Name string
	// Config is the engine configuration from meta.json; its Latency is what
	// a fit replaces.
	Config engine.Config
	// Requests are in arrival (queued) order.
	Requests []LogRequest
	// Notes say where each part of the configuration came from when
	// meta.json did not state it.
	Notes []string
	// Meta is the log's meta.json (nil when absent).
	Meta *traces.VLLMMeta
	// Series is the log's timeseries.csv (nil when absent).
	Series []traces.VLLMTick
	// GPU is the GPU the start profile is derived for ("" when unknown).
	GPU string
	// KVSource says where Config.NumGPUBlocks came from.
	KVSource string
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
	// Queue is scheduled_ts - queued_ts in seconds, -1 when the log has no
	// scheduled_ts.
	Queue float64
	// InSystem is the number of requests in the engine (queued, not yet
	// finished) when this one arrived, itself included: the load it met.
	InSystem int
}

// ReadOptions give what a log may lack. The log's own values win: each
// option is used only where meta.json does not state its value, so one set
// of options can serve several logs.
type ReadOptions struct {
	// GPU names the GPU (a preset GPU name, see PresetNames) when meta.json
	// names none that is known; it picks the roofline start profile.
	GPU string
	// NumGPUBlocks is the KV cache size in blocks per engine rank.
	NumGPUBlocks int
	// BlockSize is tokens per KV block.
	BlockSize int
}

func (o ReadOptions) validate() error {
	if o.NumGPUBlocks < 0 || o.NumGPUBlocks > 1<<24 {
		return fmt.Errorf("num-gpu-blocks: must be 0 (from the log) or 1 to %d, got %d", 1<<24, o.NumGPUBlocks)
	}
	if o.BlockSize < 0 || o.BlockSize > 1024 {
		return fmt.Errorf("block-size: must be 0 (from the log) or 1 to 1024, got %d", o.BlockSize)
	}
	if o.GPU != "" {
		if _, ok := findGPU(o.GPU); !ok {
			return fmt.Errorf("gpu %q: not a known GPU; known: %s", o.GPU, strings.Join(gpuNames(), ", "))
		}
	}
	return nil
}

// ReadLog reads a vLLM request log directory (requests.jsonl, meta.json and
// timeseries.csv, see traces.ReadVLLMLog) and builds the engine
// configuration to replay it with (see LogConfig). The directory's name
// plays no part: a log renamed fits to the identical profile.
func ReadLog(dir string, opts ReadOptions) (*Log, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	entries, meta, err := traces.ReadVLLMLog(dir)
	if err != nil {
		return nil, err
	}
	series, err := traces.ReadVLLMSeries(dir)
	if err != nil {
		return nil, err
	}
	l, err := NewLog(entries, meta, series, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Clean(dir), err)
	}
	l.Name = filepath.Clean(dir)
	return l, nil
}

// NewLog orders entries by queued time and configures the engine from meta,
// series and opts (see LogConfig). Entries without queued, first-token and
// last-token times are errors.
func NewLog(entries []traces.VLLMEntry, meta *traces.VLLMMeta, series []traces.VLLMTick, opts ReadOptions) (*Log, error) {
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
			return nil, fmt.Errorf("request %d (%q, line %d): needs queued_ts, first_token_ts and last_token_ts to be fitted", i, e.RequestID, e.Record.ID)
		}
		if t.FirstToken < t.Queued || t.LastToken < t.FirstToken || (t.Scheduled != 0 && (t.Scheduled < t.Queued || t.FirstToken < t.Scheduled)) {
			return nil, fmt.Errorf("request %d (%q, line %d): timestamps out of order (queued %v, scheduled %v, first token %v, last token %v)", i, e.RequestID, e.Record.ID, t.Queued, t.Scheduled, t.FirstToken, t.LastToken)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(entries[a].Timing.Queued, entries[b].Timing.Queued) })
	q0 := entries[order[0]].Timing.Queued
	l := &Log{Meta: meta, Series: series, Requests: make([]LogRequest, len(entries))}
	ends := make([]float64, 0, len(entries)) // last_token_ts of earlier arrivals, a min-heap would do; n is small
	for i, k := range order {
		e := entries[k]
		q := LogRequest{
			Arrival:      time.Duration(math.Round((e.Timing.Queued - q0) * 1e9)),
			PromptTokens: e.Record.InputTokens,
			OutputTokens: e.Record.OutputTokens,
			TTFT:         e.Timing.FirstToken - e.Timing.Queued,
			E2E:          e.Timing.LastToken - e.Timing.Queued,
			Queue:        -1,
		}
		if e.Timing.Scheduled != 0 {
			q.Queue = e.Timing.Scheduled - e.Timing.Queued
		}
		kept := ends[:0]
		for _, end := range ends {
			if end > e.Timing.Queued {
				kept = append(kept, end)
			}
		}
		ends = append(kept, e.Timing.LastToken)
		q.InSystem = len(ends)
		l.Requests[i] = q
	}
	cfg, src, err := LogConfig(meta, entries, series, opts)
	if err != nil {
		return nil, err
	}
	l.Config, l.Notes, l.GPU, l.KVSource = cfg, src.notes, src.gpu, src.kv
	return l, nil
}

// logSource records where LogConfig took what it did not find in meta.json.
type logSource struct {
	notes []string
	gpu   string
	kv    string
}

func (s *logSource) notef(format string, args ...any) {
	s.notes = append(s.notes, fmt.Sprintf(format, args...))
}

// LogConfig builds the engine configuration a vLLM log ran with: the
// scheduler limits and parallelism from meta.json's engine_kwargs, the block
// size and KV cache size from meta.json's kv_cache (or opts), and otherwise
// from the log itself (see logKVBlocks). What cannot be determined is an
// error that names the flag to pass; nothing is assumed silently.
func LogConfig(meta *traces.VLLMMeta, entries []traces.VLLMEntry, series []traces.VLLMTick, opts ReadOptions) (engine.Config, logSource, error) {
	var src logSource
	if meta == nil {
		return engine.Config{}, src, errors.New("no meta.json: the engine's limits (max_num_seqs, max_num_batched_tokens) are unknown; add the meta.json the log was written with")
	}
	cfg := engine.DefaultConfig()
	cfg.Name = "fit"
	if meta.Model != "" {
		cfg.Name = "fit-" + shortModel(meta.Model)
	}
	k := meta.EngineKwargs
	if k.MaxNumSeqs > 0 {
		cfg.MaxNumSeqs = k.MaxNumSeqs
	} else {
		src.notef("max_num_seqs not logged: vLLM's default %d", cfg.MaxNumSeqs)
	}
	if k.MaxNumBatchedTokens > 0 {
		cfg.MaxNumBatchedTokens = k.MaxNumBatchedTokens
	} else {
		src.notef("max_num_batched_tokens not logged: vLLM's default %d", cfg.MaxNumBatchedTokens)
	}
	cfg.DataParallelSize = max(k.DataParallelSize, 1)
	cfg.ExpertParallel = k.EnableExpertParallel && cfg.DataParallelSize > 1
	if cfg.DataParallelSize == 1 {
		cfg.DataParallelSize = 0
	}
	longest := 0
	for _, e := range entries {
		longest = max(longest, e.Record.InputTokens+e.Record.OutputTokens)
	}

	// The GPU: the flag, else meta.json's hardware section.
	var gpu GPU
	named := ""
	if meta.Hardware != nil {
		named = meta.Hardware.DeviceName
	}
	if g, ok := gpuIn(named); ok && named != "" {
		gpu, src.gpu = g, g.Name
	} else if opts.GPU != "" {
		gpu, _ = findGPU(opts.GPU)
		src.gpu = gpu.Name
		if named == "" {
			src.notef("GPU %s from --gpu (meta.json names none)", gpu.Name)
		} else {
			src.notef("GPU %s from --gpu (meta.json names %q, not a preset GPU)", gpu.Name, named)
		}
	} else if named != "" {
		src.notef("GPU %q is not a preset GPU: the fit starts from the default profile (pass --gpu to start from a preset GPU's roofline)", named)
	} else {
		src.notef("meta.json names no GPU: the fit starts from the default profile (pass --gpu to start from a preset GPU's roofline)")
	}
	roof := logRoofline(meta, gpu)

	// Block size: the flag, meta.json, vLLM's resolved cache_config, else
	// vLLM's default of 16 on CUDA.
	switch {
	case meta.KVCache != nil && meta.KVCache.BlockSize > 0:
		cfg.BlockSize = meta.KVCache.BlockSize
	case resolvedBlockSize(meta) > 0:
		cfg.BlockSize = resolvedBlockSize(meta)
	case opts.BlockSize > 0:
		cfg.BlockSize = opts.BlockSize
	default:
		cfg.BlockSize = 16
		src.notef("block size not logged: vLLM's default on CUDA, 16 (pass --block-size otherwise)")
	}
	if meta.KVCache != nil {
		cfg.DisablePrefixCaching = !meta.KVCache.EnablePrefixCaching
	}
	switch {
	case k.MaxModelLen > 0:
		cfg.MaxModelLen = k.MaxModelLen
	case roof != nil:
		cfg.MaxModelLen = roof.Model.MaxContext
	default:
		cfg.MaxModelLen = max(cfg.MaxModelLen, longest)
	}
	cfg.MaxModelLen = max(cfg.MaxModelLen, longest)

	cfg.KVBytesPerToken = logKVBytesPerToken(meta, &src, cfg.KVBytesPerToken)

	blocks, how, err := logKVBlocks(meta, entries, series, cfg, opts, roof)
	if err != nil {
		return engine.Config{}, src, err
	}
	cfg.NumGPUBlocks, src.kv = blocks, how
	if how != "meta.json kv_cache.num_gpu_blocks" && how != "--num-gpu-blocks" {
		src.notef("num_gpu_blocks %d: %s", blocks, how)
	}
	if err := cfg.Validate(); err != nil {
		return engine.Config{}, src, fmt.Errorf("engine configuration from meta.json: %w", err)
	}
	return cfg, src, nil
}

// resolvedBlockSize reads resolved_config.cache_config.block_size, 0 when absent.
func resolvedBlockSize(meta *traces.VLLMMeta) int {
	raw, ok := meta.Extra["resolved_config"]
	if !ok {
		return 0
	}
	var rc struct {
		CacheConfig struct {
			BlockSize int `json:"block_size"`
		} `json:"cache_config"`
	}
	if json.Unmarshal(raw, &rc) != nil {
		return 0
	}
	return rc.CacheConfig.BlockSize
}

// logKVBytesPerToken is the KV cache one token takes on the log's engine
// (its tensor-parallel GPUs' shares or replicas), which prices KV tier loads
// and P/D transfers in profiles fitted from the log: from the model's
// architecture when it is a preset model, at 2 bytes an element (bf16 or
// fp16; kv_cache_dtype auto follows the model's dtype), 1 (an fp8 KV cache)
// or 4 (a float32 model); else def, said so.
func logKVBytesPerToken(meta *traces.VLLMMeta, src *logSource, def float64) float64 {
	m, ok := ModelForID(meta.Model)
	if !ok {
		src.notef("kv_bytes_per_token %.0f (an 8B Llama's, the default): model %q is not a preset model; set it in the profile if you use KV tiers or P/D", def, meta.Model)
		return def
	}
	tp := max(meta.EngineKwargs.TensorParallelSize, 1)
	b := m.kvBytesPerTokenGPU(tp) * float64(tp)
	switch dt := strings.ToLower(meta.EngineKwargs.KVCacheDtype); {
	case dt == "" || dt == "auto": // the model's dtype
		if d := strings.ToLower(meta.EngineKwargs.Dtype); d == "float32" || d == "float" {
			b *= 2
		}
	case dt == "bfloat16" || dt == "float16" || dt == "half":
	case strings.HasPrefix(dt, "fp8"):
		b /= 2
	default:
		src.notef("kv_bytes_per_token %.0f counts 2 bytes an element: kv_cache_dtype %q is not one calibrate knows", b, dt)
	}
	return b
}

// shortModel drops the organisation from a Hugging Face model id.
func shortModel(id string) string {
	if i := strings.LastIndexByte(id, '/'); i >= 0 {
		return id[i+1:]
	}
	return id
}

// logRoofline returns the roofline preset of a log's model on gpu with the
// log's parallelism, nil when the model or the GPU is unknown.
func logRoofline(meta *traces.VLLMMeta, gpu GPU) *Roofline {
	if gpu.Name == "" {
		return nil
	}
	m, ok := ModelForID(meta.Model)
	if !ok {
		return nil
	}
	k := meta.EngineKwargs
	par := Parallel{TP: max(k.TensorParallelSize, 1), DP: max(k.DataParallelSize, 1), EP: k.EnableExpertParallel}
	r, err := NewRooflineParallel(m, gpu, par)
	if err != nil {
		return nil
	}
	return r
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
	log *Log
	// Predicted, relative to arrival: first scheduled, first token, last token.
	sched, first, last []time.Duration
}

func newReplayer(l *Log) *replayer {
	n := len(l.Requests)
	return &replayer{log: l, sched: make([]time.Duration, n), first: make([]time.Duration, n), last: make([]time.Duration, n)}
}

// run replays every request with profile p and fills sched, first and last:
// one engine group (data-parallel ranks behind vLLM's load balancer, see
// engine.Group), tokens timed when they reach the API server
// (Result.OutputAt), as vLLM's first_token_ts and last_token_ts are.
func (r *replayer) run(p engine.Profile) error {
	cfg := r.log.Config
	cfg.Latency = p
	e, err := engine.NewGroup(cfg)
	if err != nil {
		return err
	}
	reqs := r.log.Requests
	clear(r.sched)
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
		for _, id := range res.Admitted {
			i := int(id) - 1
			r.sched[i] = res.Start - reqs[i].Arrival
		}
		out := res.OutputAt
		for _, em := range res.Emitted {
			i := int(em.ID) - 1
			if em.Output == 1 {
				r.first[i] = out - reqs[i].Arrival
			}
			if em.Finished {
				r.last[i] = out - reqs[i].Arrival
				done++
			}
		}
	}
	return nil
}

// Error floors: a near-zero measured latency must not dominate a mean
// relative error. TTFT and E2E errors are relative to at least 1 ms, the
// queue and scheduled-to-first-token phases to at least 10 ms (a request
// scheduled at once has a queue of microseconds that no model resolves).
const (
	ttftFloor  = 1e-3
	phaseFloor = 10e-3
)

func relErr(pred, meas float64) float64 { return relErrFloor(pred, meas, ttftFloor) }

func relErrFloor(pred, meas, floor float64) float64 {
	return math.Abs(pred-meas) / math.Max(meas, floor)
}

// logRatio is |ln(pred/meas)|, both at least 1 ms: the fit's symmetric error.
func logRatio(pred, meas float64) float64 {
	return math.Abs(math.Log(math.Max(pred, ttftFloor) / math.Max(meas, ttftFloor)))
}

// logErrors returns the mean absolute log ratios of TTFT, of E2E and of
// scheduled-to-first-token time (0 when the log has no scheduled_ts) over
// requests [lo, hi) of the last replay: the terms of the fit's objective.
func (r *replayer) logErrors(lo, hi int) (ttft, e2e, s2f float64) {
	reqs := r.log.Requests
	for i := lo; i < hi; i++ {
		ttft += logRatio(r.first[i].Seconds(), reqs[i].TTFT)
		e2e += logRatio(r.last[i].Seconds(), reqs[i].E2E)
		if q := reqs[i].Queue; q >= 0 {
			s2f += phaseLogRatio((r.first[i] - r.sched[i]).Seconds(), reqs[i].TTFT-q)
		}
	}
	n := float64(max(hi-lo, 1))
	return ttft / n, e2e / n, s2f / n
}

// phaseLogRatio is logRatio with the phases' 10 ms floor.
func phaseLogRatio(pred, meas float64) float64 {
	return math.Abs(math.Log(math.Max(pred, phaseFloor) / math.Max(meas, phaseFloor)))
}

// appendResiduals appends the signed log ratios of TTFT, of E2E and (when
// logged) of scheduled-to-first-token time of requests [lo, hi), as the
// objective weighs them.
func (r *replayer) appendResiduals(out []float64, lo, hi int) []float64 {
	reqs := r.log.Requests
	for i := lo; i < hi; i++ {
		out = append(out,
			math.Log(math.Max(r.first[i].Seconds(), ttftFloor)/math.Max(reqs[i].TTFT, ttftFloor)),
			math.Log(math.Max(r.last[i].Seconds(), ttftFloor)/math.Max(reqs[i].E2E, ttftFloor)))
		if q := reqs[i].Queue; q >= 0 {
			out = append(out, math.Log(math.Max((r.first[i]-r.sched[i]).Seconds(), phaseFloor)/math.Max(reqs[i].TTFT-q, phaseFloor)))
		}
	}
	return out
}

// report scores the last replay over requests [lo, hi).
func (r *replayer) report(lo, hi int) ErrorReport {
	reqs := r.log.Requests
	rep := ErrorReport{Requests: hi - lo, Phases: true}
	var sumT, sumE, sumQ, sumS, sumP float64
	var nP int
	var queued, ttft float64
	var ratios []float64
	mt, pt, me, pe := make([]float64, 0, hi-lo), make([]float64, 0, hi-lo), make([]float64, 0, hi-lo), make([]float64, 0, hi-lo)
	for i := lo; i < hi; i++ {
		q := reqs[i]
		pf, pl, ps := r.first[i].Seconds(), r.last[i].Seconds(), r.sched[i].Seconds()
		sumT += relErr(pf, q.TTFT)
		sumE += relErr(pl, q.E2E)
		if q.Queue < 0 {
			rep.Phases = false
		} else {
			sumQ += relErrFloor(ps, q.Queue, phaseFloor)
			sumS += relErrFloor(pf-ps, q.TTFT-q.Queue, phaseFloor)
			queued += q.Queue
			ratios = append(ratios, math.Max(pf-ps, 1e-6)/math.Max(q.TTFT-q.Queue, 1e-6))
		}
		ttft += q.TTFT
		if q.OutputTokens > 1 {
			k := float64(q.OutputTokens - 1)
			sumP += relErr((pl-pf)/k, (q.E2E-q.TTFT)/k)
			nP++
		}
		mt, me = append(mt, q.TTFT), append(me, q.E2E)
		pt, pe = append(pt, pf), append(pe, pl)
	}
	n := float64(max(hi-lo, 1))
	rep.TTFTMAPE, rep.E2EMAPE = round4(100*sumT/n), round4(100*sumE/n)
	if rep.Phases {
		rep.QueueMAPE, rep.SchedToFirstMAPE = round4(100*sumQ/n), round4(100*sumS/n)
		slices.Sort(ratios)
		rep.SchedToFirstRatio = round4(ratios[len(ratios)/2])
		if ttft > 0 {
			rep.QueueShare = round4(queued / ttft)
		}
	}
	if nP > 0 {
		rep.TPOTMAPE = round4(100 * sumP / float64(nP))
	}
	rep.TTFT = quantiles(mt, pt)
	rep.E2E = quantiles(me, pe)
	rep.ByLoad = r.byLoad(lo, hi)
	return rep
}

// byLoad splits requests [lo, hi) into thirds by the load each met (the
// number in the engine at its arrival) and scores each third.
func (r *replayer) byLoad(lo, hi int) []LoadBand {
	reqs := r.log.Requests
	idx := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		idx = append(idx, i)
	}
	if len(idx) < 3 {
		return nil
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(reqs[a].InSystem, reqs[b].InSystem) })
	var out []LoadBand
	for k := range 3 {
		part := idx[k*len(idx)/3 : (k+1)*len(idx)/3]
		b := LoadBand{MinInSystem: reqs[part[0]].InSystem, MaxInSystem: reqs[part[len(part)-1]].InSystem, Requests: len(part)}
		var t, e float64
		for _, i := range part {
			t += relErr(r.first[i].Seconds(), reqs[i].TTFT)
			e += relErr(r.last[i].Seconds(), reqs[i].E2E)
		}
		b.TTFTMAPE, b.E2EMAPE = round4(100*t/float64(len(part))), round4(100*e/float64(len(part)))
		out = append(out, b)
	}
	return out
}

// mergeReports combines the reports of several logs into one, weighting
// each by its requests (quantiles and load bands are the first log's when
// there are several: they do not add).
func mergeReports(reps []ErrorReport) ErrorReport {
	if len(reps) == 1 {
		return reps[0]
	}
	out := reps[0]
	var n float64
	var t, e, q, s, p, share float64
	out.Phases = true
	for _, r := range reps {
		w := float64(r.Requests)
		n += w
		t, e, q, s, p, share = t+w*r.TTFTMAPE, e+w*r.E2EMAPE, q+w*r.QueueMAPE, s+w*r.SchedToFirstMAPE, p+w*r.TPOTMAPE, share+w*r.QueueShare
		out.Phases = out.Phases && r.Phases
	}
	out.Requests = int(n)
	out.TTFTMAPE, out.E2EMAPE, out.TPOTMAPE = round4(t/n), round4(e/n), round4(p/n)
	out.QueueMAPE, out.SchedToFirstMAPE, out.QueueShare = round4(q/n), round4(s/n), round4(share/n)
	return out
}
