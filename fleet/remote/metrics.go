package remote

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"slices"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/encoding/protodelim"
)

// ErrUnreadable marks a /metrics page that answered but cannot be used: not
// in a Prometheus format, or lacking the families that say how busy the
// engine is. Such an engine is not idle; its load is unknown.
var ErrUnreadable = errors.New("not a usable vLLM or SGLang metrics page")

// Engine kinds reported in Load.Engine.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
)

// Load is one engine's state as its /metrics page reports it. With data
// parallelism (several ranks behind one address) counts are summed over the
// ranks and KV usage is their mean weighted by capacity.
type Load struct {
	// Engine is EngineVLLM or EngineSGLang.
	Engine string
	// Model is the served model (label model_name), "" if not labelled.
	Model string
	// Running and Waiting are requests in the running batch and in the
	// waiting queue (vllm:num_requests_running/_waiting,
	// sglang:num_running_reqs/num_queue_reqs).
	Running, Waiting int
	// KVUsage is the fraction of KV cache in use, within [0, 1]
	// (vllm:kv_cache_usage_perc, older vllm:gpu_cache_usage_perc,
	// sglang:token_usage).
	KVUsage float64
	// PrefixQueries and PrefixHits are cumulative prompt tokens looked up in
	// and found in the prefix cache (vllm:prefix_cache_queries_total and
	// _hits_total; for SGLang sglang:prompt_tokens_total and
	// sglang:cached_tokens_total). Preemptions is cumulative preempted
	// requests (vllm:num_preemptions_total,
	// sglang:num_retracted_requests_total). 0 where the page lacks them.
	PrefixQueries, PrefixHits, Preemptions int64
	// CacheHitRate is the engine's own recent prefix cache hit rate where it
	// reports one (sglang:cache_hit_rate), else 0.
	CacheHitRate float64
	// BlockSize is tokens per KV block and NumGPUBlocks the KV blocks of
	// all ranks together (vllm:cache_config_info); 0 if unknown.
	BlockSize, NumGPUBlocks int
	// KVTokens is the KV capacity in tokens of all ranks together
	// (BlockSize*NumGPUBlocks, or sglang:max_total_num_tokens); 0 if unknown.
	KVTokens int64
	// Ranks is the number of data-parallel ranks seen (at least 1).
	Ranks int
}

// CountersReset reports whether l's cumulative counters went backwards
// since prev (or its KV capacity changed): the engine restarted, so what
// was learnt about its cache (a KV index) no longer holds. A zero prev
// (nothing known before) never counts as a reset.
func (l Load) CountersReset(prev Load) bool {
	if prev.Engine == "" {
		return false
	}
	if l.PrefixQueries < prev.PrefixQueries || l.PrefixHits < prev.PrefixHits || l.Preemptions < prev.Preemptions {
		return true
	}
	return l.NumGPUBlocks != 0 && prev.NumGPUBlocks != 0 && l.NumGPUBlocks != prev.NumGPUBlocks
}

// role is what a metric family tells about an engine.
type role uint8

const (
	roleNone role = iota
	roleRunning
	roleWaiting
	roleKV
	roleKVOld // vLLM's pre-v1 name for KV usage, used only without roleKV
	roleQueries
	roleHits
	rolePreempt
	roleHitRate
	roleCacheInfo // vllm:cache_config_info: capacity in labels
	roleCapTokens // sglang:max_total_num_tokens
	numRoles
)

// additive roles are summed over ranks.
func (r role) additive() bool {
	return r == roleRunning || r == roleWaiting || r == roleQueries || r == roleHits || r == rolePreempt
}

const (
	kindVLLM = iota
	kindSGLang
	numKinds
)

var kindNames = [numKinds]string{EngineVLLM, EngineSGLang}

// classify maps a family name (counters without their _total suffix) to the
// engine kind and role it carries. (It takes bytes: switching on
// string(name) does not allocate.)
func classify(name []byte) (int, role) {
	switch string(name) {
	case "vllm:num_requests_running":
		return kindVLLM, roleRunning
	case "vllm:num_requests_waiting":
		return kindVLLM, roleWaiting
	case "vllm:kv_cache_usage_perc":
		return kindVLLM, roleKV
	case "vllm:gpu_cache_usage_perc":
		return kindVLLM, roleKVOld
	case "vllm:prefix_cache_queries":
		return kindVLLM, roleQueries
	case "vllm:prefix_cache_hits":
		return kindVLLM, roleHits
	case "vllm:num_preemptions":
		return kindVLLM, rolePreempt
	case "vllm:cache_config_info":
		return kindVLLM, roleCacheInfo
	case "sglang:num_running_reqs":
		return kindSGLang, roleRunning
	case "sglang:num_queue_reqs":
		return kindSGLang, roleWaiting
	case "sglang:token_usage":
		return kindSGLang, roleKV
	case "sglang:prompt_tokens":
		return kindSGLang, roleQueries
	case "sglang:cached_tokens":
		return kindSGLang, roleHits
	case "sglang:num_retracted_requests":
		return kindSGLang, rolePreempt
	case "sglang:cache_hit_rate":
		return kindSGLang, roleHitRate
	case "sglang:max_total_num_tokens":
		return kindSGLang, roleCapTokens
	}
	return 0, roleNone
}

// requiredNames are the families without which a page is unreadable.
var requiredNames = [numKinds][2]string{
	{"vllm:num_requests_running", "vllm:num_requests_waiting"},
	{"sglang:num_running_reqs", "sglang:num_queue_reqs"},
}

// maxCount bounds values converted to integers (beyond float64's exact
// integers a count is garbage).
const maxCount = 1 << 53

// ParseMetrics reads one /metrics page of a vLLM or SGLang engine to its
// end (the caller bounds its size). The content type selects the format:
// OpenMetrics 1.0 (application/openmetrics-text), delimited protobuf, or, for
// anything else including "", the Prometheus text format 0.0.4. Every
// failure wraps ErrUnreadable.
//
// Series of one family that differ in their engine or dp_rank label are
// data-parallel ranks: counts are summed, KV usage averaged weighted by each
// rank's capacity where every rank's is known (else a plain mean). Series
// whose tp_rank, pp_rank, attn_tp_rank or moe_ep_rank label is not "0" repeat
// rank 0's scheduler state (SGLang) and are ignored.
func ParseMetrics(r io.Reader, contentType string) (Load, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return Load{}, fmt.Errorf("read metrics page: %w: %w", err, ErrUnreadable)
	}
	return parsePage(b, contentType)
}

// Page formats.
const (
	formatText = iota
	formatOpenMetrics
	formatProto
)

// parsePage parses page, which it overwrites.
//
// Text and OpenMetrics pages are first filtered line by line: the samples
// of the families a Load needs are kept for expfmt's text parser, every
// other line is dropped after a cheap check that it looks like a sample or
// a comment. Real pages are mostly histograms; parsing only what is used
// makes a page about seven times cheaper (BenchmarkParseVLLM). OpenMetrics
// differs from the text format, for these families, only in its comments
// (dropped here) and its closing "# EOF", which must be there: without it
// the page may have been cut short. (expfmt's own OpenMetrics decoder, a
// general grammar parser, took over 300 ms for a 2.4 KB page.) Exemplars
// and float timestamps, which OpenMetrics allows and neither engine writes,
// make a kept sample unreadable.
func parsePage(page []byte, contentType string) (Load, error) {
	var a aggregator
	format, err := pageFormat(contentType)
	if err != nil {
		return Load{}, err
	}
	if format == formatProto {
		// Not expfmt's decoder: it allocates whatever size a length prefix
		// claims, so four bytes of garbage could ask for gigabytes.
		r := bytes.NewReader(page)
		opts := protodelim.UnmarshalOptions{MaxSize: int64(len(page))}
		for r.Len() > 0 {
			f := new(dto.MetricFamily)
			if err := opts.UnmarshalFrom(r, f); err != nil {
				return Load{}, fmt.Errorf("parse metrics (protobuf): %w: %w", err, ErrUnreadable)
			}
			if err := a.family(f); err != nil {
				return Load{}, err
			}
		}
		return a.load()
	}
	kept, lines, err := filterPage(page, format == formatOpenMetrics)
	if err != nil {
		return Load{}, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(kept))
	if err != nil {
		var pe expfmt.ParseError
		if errors.As(err, &pe) && pe.Line >= 1 && pe.Line <= len(lines) {
			return Load{}, fmt.Errorf("parse metrics: line %d: %s: %w", lines[pe.Line-1], pe.Msg, ErrUnreadable)
		}
		return Load{}, fmt.Errorf("parse metrics: %w: %w", err, ErrUnreadable)
	}
	for _, f := range fams {
		if err := a.family(f); err != nil {
			return Load{}, err
		}
	}
	return a.load()
}

// filterPage keeps, in place, the sample lines of the families classify
// knows and drops the others; see parsePage. lines[i] is the page's line
// number of kept line i+1.
func filterPage(page []byte, openMetrics bool) (kept []byte, lines []int, err error) {
	out := page[:0]
	eof := false
	for line, rest := 1, page; len(rest) > 0; line++ {
		i := bytes.IndexByte(rest, '\n')
		l := rest
		if i >= 0 {
			l, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		switch {
		case eof:
			if len(bytes.TrimSpace(l)) > 0 {
				return nil, nil, fmt.Errorf("parse metrics: line %d follows # EOF: %w", line, ErrUnreadable)
			}
		case len(l) == 0:
		case l[0] == '#':
			if openMetrics && string(l) == "# EOF" {
				eof = true
			}
		default:
			name, ok := sampleName(l)
			if !ok {
				return nil, nil, fmt.Errorf("parse metrics: line %d is neither a sample nor a comment (%.40q): %w", line, l, ErrUnreadable)
			}
			if wanted(name) {
				// Never overtakes what is still to be read: l lies at or
				// after len(out), and memmove copes with the overlap.
				out = append(out, l...)
				out = append(out, '\n')
				lines = append(lines, line)
			}
		}
	}
	if openMetrics && !eof {
		return nil, nil, fmt.Errorf("parse metrics: OpenMetrics page does not end with # EOF, so it may be cut short: %w", ErrUnreadable)
	}
	return out, lines, nil
}

// wanted reports whether a sample of this name feeds a Load.
func wanted(name []byte) bool {
	if _, rl := classify(name); rl != roleNone {
		return true
	}
	if n, ok := bytes.CutSuffix(name, []byte("_total")); ok {
		_, rl := classify(n)
		return rl != roleNone
	}
	return false
}

// sampleName returns the metric name a sample line starts with, and false
// if the line cannot be a sample. A quoted (UTF-8) name, which no engine
// writes, returns nil.
func sampleName(l []byte) ([]byte, bool) {
	if l[0] == '{' {
		return nil, true
	}
	end := 0
	for end < len(l) && isNameByte(l[end], end == 0) {
		end++
	}
	if end == 0 || end == len(l) || (l[end] != '{' && l[end] != ' ' && l[end] != '\t') {
		return nil, false
	}
	return l[:end], true
}

func isNameByte(b byte, first bool) bool {
	return b == '_' || b == ':' || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (!first && b >= '0' && b <= '9')
}

// pageFormat picks the format from the response's content type.
func pageFormat(contentType string) (int, error) {
	if contentType == "" {
		return formatText, nil
	}
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return formatText, nil // servers are sloppy with headers; try the text format
	}
	switch mt {
	case expfmt.OpenMetricsType:
		switch v := params["version"]; v {
		case "", expfmt.OpenMetricsVersion_0_0_1, expfmt.OpenMetricsVersion_1_0_0:
			return formatOpenMetrics, nil
		default:
			return 0, fmt.Errorf("openmetrics version %q cannot be read; serve text/plain;version=0.0.4: %w", v, ErrUnreadable)
		}
	case expfmt.ProtoType:
		if params["encoding"] != "delimited" {
			return 0, fmt.Errorf("protobuf encoding %q cannot be read; serve text/plain;version=0.0.4: %w", params["encoding"], ErrUnreadable)
		}
		return formatProto, nil
	}
	return formatText, nil
}

// rankAcc accumulates one rank's values.
type rankAcc struct {
	has [numRoles]bool
	v   [numRoles]float64
	// blockSize comes with roleCacheInfo, whose v is num_gpu_blocks.
	blockSize float64
}

// kindAcc accumulates one engine kind's families.
type kindAcc struct {
	ranks   map[string]*rankAcc
	present [numRoles]bool
	model   string
}

type aggregator struct {
	kinds [numKinds]kindAcc
}

// family folds one metric family into the aggregator.
func (a *aggregator) family(f *dto.MetricFamily) error {
	name := f.GetName()
	bname := []byte(name)
	kind, rl := classify(bname)
	if rl == roleNone {
		kind, rl = classify(bytes.TrimSuffix(bname, []byte("_total")))
		if rl == roleNone {
			return nil
		}
	}
	k := &a.kinds[kind]
	for _, m := range f.GetMetric() {
		if m == nil {
			continue
		}
		key, model, skip := seriesKey(m.GetLabel())
		if skip {
			continue
		}
		v, ok := value(m)
		if !ok {
			continue // a histogram or summary under a known name: not ours
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("metric %s has value %v, want a finite number >= 0: %w", name, v, ErrUnreadable)
		}
		if rl != roleKV && rl != roleKVOld && rl != roleHitRate && v > maxCount {
			return fmt.Errorf("metric %s has value %v, beyond any real count: %w", name, v, ErrUnreadable)
		}
		if k.ranks == nil {
			k.ranks = make(map[string]*rankAcc, 2)
		}
		ra := k.ranks[key]
		if ra == nil {
			ra = new(rankAcc)
			k.ranks[key] = ra
		}
		if rl == roleCacheInfo {
			blocks, bs, ok := cacheInfo(m.GetLabel())
			if !ok {
				continue
			}
			v = blocks
			ra.blockSize = max(ra.blockSize, bs)
		}
		switch {
		case rl.additive():
			ra.v[rl] += v
		default: // gauges repeated within a rank (several models, sources): the largest
			if !ra.has[rl] || v > ra.v[rl] {
				ra.v[rl] = v
			}
		}
		ra.has[rl] = true
		k.present[rl] = true
		if k.model == "" && (rl == roleRunning || rl == roleWaiting) {
			k.model = model
		}
	}
	return nil
}

// seriesKey returns the series' rank (its engine and dp_rank labels), its
// model, and whether it merely repeats rank 0 of a tensor, pipeline or
// expert parallel group.
func seriesKey(labels []*dto.LabelPair) (key, model string, skip bool) {
	var eng, dp string
	for _, l := range labels {
		switch l.GetName() {
		case "engine":
			eng = l.GetValue()
		case "dp_rank":
			dp = l.GetValue()
		case "model_name":
			model = l.GetValue()
		case "name":
			if model == "" {
				model = l.GetValue() // older SGLang
			}
		case "tp_rank", "pp_rank", "attn_tp_rank", "moe_ep_rank":
			if v := l.GetValue(); v != "0" && v != "" {
				skip = true
			}
		}
	}
	if eng == "" && dp == "" {
		return "", model, skip
	}
	return eng + "/" + dp, model, skip
}

// value returns a counter's, gauge's or untyped metric's value.
func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

// cacheInfo reads num_gpu_blocks and block_size from vllm:cache_config_info.
func cacheInfo(labels []*dto.LabelPair) (blocks, blockSize float64, ok bool) {
	var okB, okS bool
	for _, l := range labels {
		switch l.GetName() {
		case "num_gpu_blocks":
			blocks, okB = parseCount(l.GetValue())
		case "block_size":
			blockSize, okS = parseCount(l.GetValue())
		}
	}
	return blocks, blockSize, okB && okS
}

func parseCount(s string) (float64, bool) {
	n, err := strconv.ParseUint(s, 10, 53)
	if err != nil || n == 0 {
		return 0, false // "None" before the engine profiled its memory
	}
	return float64(n), true
}

// load picks the engine whose required families the page has and sums its
// ranks.
func (a *aggregator) load() (Load, error) {
	kind := -1
	for i := range a.kinds {
		if a.kinds[i].present[roleRunning] && a.kinds[i].present[roleWaiting] {
			kind = i
			break
		}
	}
	if kind < 0 {
		return Load{}, a.missing()
	}
	k := &a.kinds[kind]
	keys := make([]string, 0, len(k.ranks))
	for key := range k.ranks {
		keys = append(keys, key)
	}
	slices.Sort(keys)

	l := Load{Engine: kindNames[kind], Model: k.model}
	var sums [numRoles]float64
	for _, key := range keys {
		ra := k.ranks[key]
		for rl := range numRoles {
			if ra.has[rl] && rl.additive() {
				sums[rl] += ra.v[rl]
			}
		}
		if ra.has[roleRunning] || ra.has[roleWaiting] {
			l.Ranks++
		}
	}
	l.Running = int(sums[roleRunning])
	l.Waiting = int(sums[roleWaiting])
	l.PrefixQueries = int64(sums[roleQueries])
	l.PrefixHits = int64(sums[roleHits])
	l.Preemptions = int64(sums[rolePreempt])

	// Capacity per rank: its own series, or one unlabelled series that
	// speaks for every rank.
	capRole := roleCapTokens
	if kind == kindVLLM {
		capRole = roleCacheInfo
	}
	shared := k.ranks[""]
	capOf := func(ra *rankAcc) (float64, float64, bool) {
		if ra != nil && ra.has[capRole] {
			return ra.v[capRole], ra.blockSize, true
		}
		if shared != nil && shared.has[capRole] {
			return shared.v[capRole], shared.blockSize, true
		}
		return 0, 0, false
	}
	var blocks, blockSize float64
	allCap := true
	for _, key := range keys {
		ra := k.ranks[key]
		if !ra.has[roleRunning] && !ra.has[roleWaiting] {
			continue
		}
		c, bs, ok := capOf(ra)
		if !ok {
			allCap = false
			continue
		}
		blocks += c
		blockSize = max(blockSize, bs)
	}
	if allCap && l.Ranks > 0 {
		if kind == kindVLLM {
			l.NumGPUBlocks, l.BlockSize = int(blocks), int(blockSize)
			l.KVTokens = int64(blocks * blockSize)
		} else {
			l.KVTokens = int64(blocks)
		}
	}

	kvRole := roleKV
	if !k.present[roleKV] {
		kvRole = roleKVOld
	}
	var wsum, wkv, sum float64
	n := 0
	weighted := true
	for _, key := range keys {
		ra := k.ranks[key]
		if !ra.has[kvRole] {
			continue
		}
		v := min(ra.v[kvRole], 1)
		sum += v
		n++
		c, _, ok := capOf(ra)
		if !ok || c == 0 {
			weighted = false
		}
		wsum += c
		wkv += c * v
	}
	switch {
	case n == 0:
	case weighted && wsum > 0:
		l.KVUsage = min(wkv/wsum, 1)
	default:
		l.KVUsage = min(sum/float64(n), 1)
	}

	n, sum = 0, 0
	for _, key := range keys {
		if ra := k.ranks[key]; ra.has[roleHitRate] {
			sum += min(ra.v[roleHitRate], 1)
			n++
		}
	}
	if n > 0 {
		l.CacheHitRate = sum / float64(n)
	}
	return l, nil
}

// missing explains which required families the page lacks.
func (a *aggregator) missing() error {
	for i := range a.kinds {
		k := &a.kinds[i]
		if !k.present[roleRunning] && !k.present[roleWaiting] {
			continue
		}
		var lack, has string
		if k.present[roleRunning] {
			lack, has = requiredNames[i][1], requiredNames[i][0]
		} else {
			lack, has = requiredNames[i][0], requiredNames[i][1]
		}
		return fmt.Errorf("metrics page has %s but lacks %s: %w", has, lack, ErrUnreadable)
	}
	return fmt.Errorf("metrics page lacks %s and %s (vLLM) or %s and %s (SGLang); point the target at the engine's own /metrics (SGLang needs --enable-metrics): %w",
		requiredNames[kindVLLM][0], requiredNames[kindVLLM][1], requiredNames[kindSGLang][0], requiredNames[kindSGLang][1], ErrUnreadable)
}
