package traces

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"
)

// The files of a vLLM request log directory.
const (
	vllmRequestsFile = "requests.jsonl"
	vllmMetaFile     = "meta.json"
)

// VLLMTiming is what a vLLM engine measured of one request, in seconds on the
// engine's monotonic clock (not comparable with arrival times); 0 where the
// log has no value.
type VLLMTiming struct {
	Queued, Scheduled, FirstToken, LastToken float64
}

// TTFT is the time to first token, FirstToken - Queued.
func (t VLLMTiming) TTFT() time.Duration { return seconds(t.FirstToken - t.Queued) }

// E2E is the end-to-end latency, LastToken - Queued.
func (t VLLMTiming) E2E() time.Duration { return seconds(t.LastToken - t.Queued) }

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// check refuses timestamps of one request that run backwards: a request is
// queued, then scheduled, then gives its first and its last token (0 = not
// logged, not checked).
func (t VLLMTiming) check() error {
	ts := []struct {
		name string
		v    float64
	}{{"queued_ts", t.Queued}, {"scheduled_ts", t.Scheduled}, {"first_token_ts", t.FirstToken}, {"last_token_ts", t.LastToken}}
	prev := -1
	for i, x := range ts {
		if x.v == 0 {
			continue
		}
		if math.IsNaN(x.v) || math.IsInf(x.v, 0) || x.v < 0 {
			return badf("%s %v: must be a finite, non-negative time in seconds", x.name, x.v)
		}
		if prev >= 0 && x.v < ts[prev].v {
			return badf("timestamps out of order: %s %.6f is before %s %.6f (a request is queued, scheduled, then gives its first and last token)", x.name, x.v, ts[prev].name, ts[prev].v)
		}
		prev = i
	}
	return nil
}

// VLLMEntry is one request of a vLLM request log: the record the simulator
// replays and what the engine measured of it.
type VLLMEntry struct {
	Record Record
	// RequestID is the log's request_id ("bench-0").
	RequestID string
	// ArrivalTime is the wall clock arrival_time as logged, in seconds.
	ArrivalTime float64
	Timing      VLLMTiming
}

// VLLMMetaSchema is the meta.json schema_version ReadVLLMMeta reads.
const VLLMMetaSchema = 1

// VLLMMeta is a vLLM log's meta.json: the engine's configuration. Fields the
// file leaves out or sets to null stay zero (nil for KVCache and Hardware);
// keys it has beyond these are kept, as raw JSON, in Extra.
type VLLMMeta struct {
	SchemaVersion int              `json:"schema_version"`
	Model         string           `json:"model"`
	VLLMVersion   string           `json:"vllm_version"`
	EngineKwargs  VLLMEngineKwargs `json:"engine_kwargs"`
	DatasetPath   string           `json:"dataset_path"`
	DatasetHash   string           `json:"dataset_hash"`
	NumRequests   int              `json:"num_requests"`
	StartedAt     time.Time        `json:"started_at"`
	FinishedAt    time.Time        `json:"finished_at"`
	TickSeconds   float64          `json:"tick_seconds"`
	KVCache       *VLLMKVCache     `json:"kv_cache"`
	Hardware      *VLLMHardware    `json:"hardware"`
	// Extra holds the other top-level keys, resolved_config (vLLM's whole
	// resolved configuration) among them.
	Extra map[string]json.RawMessage `json:"-"`
}

// VLLMEngineKwargs are the arguments the engine was built with.
type VLLMEngineKwargs struct {
	Model                string                     `json:"model"`
	TensorParallelSize   int                        `json:"tensor_parallel_size"`
	DataParallelSize     int                        `json:"data_parallel_size"`
	EnableExpertParallel bool                       `json:"enable_expert_parallel"`
	MaxNumSeqs           int                        `json:"max_num_seqs"`
	MaxNumBatchedTokens  int                        `json:"max_num_batched_tokens"`
	MaxModelLen          int                        `json:"max_model_len"`
	Dtype                string                     `json:"dtype"`
	KVCacheDtype         string                     `json:"kv_cache_dtype"`
	Seed                 int                        `json:"seed"`
	Extra                map[string]json.RawMessage `json:"-"`
}

// VLLMKVCache describes the engine's KV cache.
type VLLMKVCache struct {
	NumGPUBlocks         int                        `json:"num_gpu_blocks"`
	NumCPUBlocks         int                        `json:"num_cpu_blocks"`
	BlockSize            int                        `json:"block_size"`
	GPUMemoryUtilization float64                    `json:"gpu_memory_utilization"`
	EnablePrefixCaching  bool                       `json:"enable_prefix_caching"`
	KVCacheMemoryBytes   int64                      `json:"kv_cache_memory_bytes"`
	NumKVTokens          int                        `json:"num_kv_tokens"`
	Extra                map[string]json.RawMessage `json:"-"`
}

// VLLMHardware describes the machine the engine ran on.
type VLLMHardware struct {
	TorchVersion           string                     `json:"torch_version"`
	CUDAVersion            string                     `json:"cuda_version"`
	DeviceCount            int                        `json:"device_count"`
	DeviceName             string                     `json:"device_name"`
	DeviceTotalMemoryBytes int64                      `json:"device_total_memory_bytes"`
	DeviceCapability       string                     `json:"device_capability"`
	Extra                  map[string]json.RawMessage `json:"-"`
}

// UnmarshalJSON implements json.Unmarshaler, filling Extra.
func (m *VLLMMeta) UnmarshalJSON(b []byte) error {
	type plain VLLMMeta
	return unmarshalExtra(b, (*plain)(m), &m.Extra)
}

// UnmarshalJSON implements json.Unmarshaler, filling Extra.
func (k *VLLMEngineKwargs) UnmarshalJSON(b []byte) error {
	type plain VLLMEngineKwargs
	return unmarshalExtra(b, (*plain)(k), &k.Extra)
}

// UnmarshalJSON implements json.Unmarshaler, filling Extra.
func (k *VLLMKVCache) UnmarshalJSON(b []byte) error {
	type plain VLLMKVCache
	return unmarshalExtra(b, (*plain)(k), &k.Extra)
}

// UnmarshalJSON implements json.Unmarshaler, filling Extra.
func (h *VLLMHardware) UnmarshalJSON(b []byte) error {
	type plain VLLMHardware
	return unmarshalExtra(b, (*plain)(h), &h.Extra)
}

// unmarshalExtra decodes b into v, a pointer to a struct, and the keys its
// fields' json tags do not name into extra.
func unmarshalExtra(b []byte, v any, extra *map[string]json.RawMessage) error {
	if string(b) == "null" {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	t := reflect.TypeOf(v).Elem()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		delete(all, name)
	}
	if len(all) > 0 {
		*extra = all
	}
	return nil
}

// ReadVLLMMeta reads a vLLM log's meta.json.
func ReadVLLMMeta(path string) (*VLLMMeta, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read vllm meta: %w", err)
	}
	var m VLLMMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("read vllm meta %s: %w", path, err)
	}
	// A meta.json without schema_version is read as version 1, the only
	// one there is; a version this code does not know is refused.
	if m.SchemaVersion != 0 && m.SchemaVersion != VLLMMetaSchema {
		return nil, fmt.Errorf("read vllm meta %s: schema_version %d is not one this version of inferrail reads (it reads %d); convert the log or upgrade inferrail", path, m.SchemaVersion, VLLMMetaSchema)
	}
	return &m, nil
}

// VLLMReader streams a vLLM requests.jsonl. It implements Reader and Counter;
// NextEntry also gives what the engine measured.
type VLLMReader struct {
	lines  *lineReader
	closer io.Closer
	last   VLLMEntry
}

// vllmLine is one line of requests.jsonl.
type vllmLine struct {
	RequestID    json.RawMessage `json:"request_id"`
	InputToks    *float64        `json:"input_toks"`
	OutputToks   *float64        `json:"output_toks"`
	ArrivalTime  *float64        `json:"arrival_time"`
	QueuedTS     *float64        `json:"queued_ts"`
	ScheduledTS  *float64        `json:"scheduled_ts"`
	FirstTokenTS *float64        `json:"first_token_ts"`
	LastTokenTS  *float64        `json:"last_token_ts"`
}

// NewVLLMRequests reads a vLLM request log's requests.jsonl: JSON lines of
// request_id, input_toks, output_toks, arrival_time (wall clock seconds) and
// the engine's queued_ts, scheduled_ts, first_token_ts and last_token_ts.
// Arrival is arrival_time relative to the first record's; ID is the line
// number; Model is opts.Model. The traces carry no prefix information
// (BlockSize 0).
func NewVLLMRequests(r io.Reader, name string, opts Options) *VLLMReader {
	v := &VLLMReader{}
	c := &clock{unit: time.Second}
	v.lines = newLineReader(r, name, opts, func(b []byte, n int) (Record, error) {
		var l vllmLine
		if err := json.Unmarshal(b, &l); err != nil {
			return Record{}, jsonBad(err)
		}
		e := VLLMEntry{Record: Record{ID: uint64(n), Model: opts.Model}}
		if len(l.RequestID) > 0 && string(l.RequestID) != "null" {
			if err := json.Unmarshal(l.RequestID, &e.RequestID); err != nil {
				e.RequestID = string(l.RequestID) // a number
			}
		}
		var err error
		if e.Record.InputTokens, err = tokenCount("input_toks", l.InputToks); err != nil {
			return Record{}, err
		}
		if e.Record.OutputTokens, err = tokenCount("output_toks", l.OutputToks); err != nil {
			return Record{}, err
		}
		if e.Record.Arrival, err = c.arrival("arrival_time", l.ArrivalTime); err != nil {
			return Record{}, err
		}
		e.ArrivalTime = *l.ArrivalTime
		for _, f := range []struct {
			v   *float64
			dst *float64
		}{{l.QueuedTS, &e.Timing.Queued}, {l.ScheduledTS, &e.Timing.Scheduled}, {l.FirstTokenTS, &e.Timing.FirstToken}, {l.LastTokenTS, &e.Timing.LastToken}} {
			if f.v != nil {
				*f.dst = *f.v
			}
		}
		if err := e.Timing.check(); err != nil {
			return Record{}, err
		}
		if err := e.Record.Validate(); err != nil {
			return Record{}, err
		}
		c.accept(*l.ArrivalTime)
		v.last = e
		return e.Record, nil
	})
	return v
}

// Next implements Reader.
func (v *VLLMReader) Next() (Record, error) {
	e, err := v.NextEntry()
	return e.Record, err
}

// NextEntry returns the next request with its measured timing; it fails and
// skips as Next does.
func (v *VLLMReader) NextEntry() (VLLMEntry, error) {
	if _, err := v.lines.Next(); err != nil {
		return VLLMEntry{}, err
	}
	return v.last, nil
}

// Skipped implements Counter.
func (v *VLLMReader) Skipped() int { return v.lines.Skipped() }

// Close closes the file NewVLLMLog opened; it does nothing for a reader from
// NewVLLMRequests.
func (v *VLLMReader) Close() error {
	if v.closer == nil {
		return nil
	}
	return v.closer.Close()
}

// NewVLLMLog opens a vLLM request log directory: requests.jsonl (see
// NewVLLMRequests) and meta.json, the engine's configuration (nil when the
// directory has none). Records take their Model from meta.json, or
// opts.Model when it names none. The Reader is a *VLLMReader: call its
// NextEntry for the measured timings, and Close it when done.
func NewVLLMLog(dir string, opts Options) (Reader, *VLLMMeta, error) {
	return openVLLM(filepath.Join(dir, vllmRequestsFile), filepath.Join(dir, vllmMetaFile), opts)
}

// openVLLM opens a vLLM log's requests file and reads its meta file (nil
// when absent).
func openVLLM(requests, metaPath string, opts Options) (*VLLMReader, *VLLMMeta, error) {
	meta, err := ReadVLLMMeta(metaPath)
	if errors.Is(err, fs.ErrNotExist) {
		meta, err = nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	if meta != nil && meta.Model != "" {
		opts.Model = meta.Model
	}
	f, err := os.Open(requests)
	if err != nil {
		return nil, nil, fmt.Errorf("open vllm log: %w", err)
	}
	v := NewVLLMRequests(f, requests, opts)
	v.closer = f
	return v, meta, nil
}

// ReadVLLMLog reads a whole vLLM request log directory, for calibration: every
// request with its measured timing, and meta.json (nil when absent). Any
// malformed line fails the read.
func ReadVLLMLog(dir string) ([]VLLMEntry, *VLLMMeta, error) {
	v, meta, err := openVLLM(filepath.Join(dir, vllmRequestsFile), filepath.Join(dir, vllmMetaFile), Options{})
	if err != nil {
		return nil, nil, err
	}
	defer v.Close()
	var out []VLLMEntry
	for {
		e, err := v.NextEntry()
		if errors.Is(err, io.EOF) {
			return out, meta, nil
		}
		if err != nil {
			return nil, nil, err
		}
		out = append(out, e)
	}
}
