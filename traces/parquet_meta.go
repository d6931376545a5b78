package traces

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"strconv"
	"time"
)

// Keys a recording of live traffic (inferrail live's record section)
// writes into its parquet files' key-value metadata, beside
// ParquetVersionKey. RecordingMeta reads and writes them.
const (
	// MetaRecordStart is the wall-clock time arrival 0 stands for: RFC
	// 3339 in UTC with nanoseconds.
	MetaRecordStart = "inferrail.record.start"
	// MetaRecordSaltFingerprint identifies the salt the file's hashes
	// (hash_ids, tenant, session) were keyed with, 16 hex digits, without
	// revealing it: two recordings' ids compare only when it is equal.
	MetaRecordSaltFingerprint = "inferrail.record.salt_fingerprint"
	// MetaRecordSample is the share of requests recorded, in (0, 1].
	MetaRecordSample = "inferrail.record.sample"
	// MetaRecordFleet is a JSON object naming each model's replicas as the
	// gateway knew them when the file was started: {"model": ["a", "b"]}.
	MetaRecordFleet = "inferrail.record.fleet"
	// MetaRecordPolicy is a JSON object naming each model's routing
	// policy: {"model": "cost_model"}.
	MetaRecordPolicy = "inferrail.record.policy"
	// MetaRecordBlockSize is a JSON object of each model's KV block size
	// in tokens (the block_size of its rows' hash_ids): {"model": 16}.
	MetaRecordBlockSize = "inferrail.record.block_size"
	// MetaRecordSequence is the file's number in its recording (1 for the
	// first file a gateway wrote since it started).
	MetaRecordSequence = "inferrail.record.sequence"
	// MetaRecordGateway is the version of the gateway that recorded.
	MetaRecordGateway = "inferrail.record.gateway"
	// MetaRecordDropped counts the sampled requests dropped (not written)
	// since the previous file was completed (or the recording started):
	// those missing between this file's rows and the previous file's. Only
	// in a complete file's footer.
	MetaRecordDropped = "inferrail.record.dropped"
	// MetaRecordReordered counts the rows written after a row that arrived
	// later (their request outlived the reorder buffer), whose arrival was
	// moved up to the previous row's; only in a complete file's footer.
	MetaRecordReordered = "inferrail.record.reordered"
)

// RecordingMeta is what a recording says about itself (the MetaRecord*
// keys).
type RecordingMeta struct {
	Start           time.Time
	SaltFingerprint string
	Sample          float64
	Fleet           map[string][]string
	Policy          map[string]string
	BlockSize       map[string]int
	Sequence        int
	Gateway         string
	// Dropped and Reordered are -1 when the file does not say (it was cut
	// short before its footer).
	Dropped, Reordered int64
}

// Metadata encodes m as key-value metadata (Dropped and Reordered only when
// not negative).
func (m *RecordingMeta) Metadata() map[string]string {
	js := func(v any) string {
		b, _ := json.Marshal(v) // maps of strings and ints always encode
		return string(b)
	}
	kv := map[string]string{
		MetaRecordStart:           m.Start.UTC().Format(time.RFC3339Nano),
		MetaRecordSaltFingerprint: m.SaltFingerprint,
		MetaRecordSample:          strconv.FormatFloat(m.Sample, 'g', -1, 64),
		MetaRecordFleet:           js(m.Fleet),
		MetaRecordPolicy:          js(m.Policy),
		MetaRecordBlockSize:       js(m.BlockSize),
		MetaRecordSequence:        strconv.Itoa(m.Sequence),
		MetaRecordGateway:         m.Gateway,
	}
	if m.Dropped >= 0 {
		kv[MetaRecordDropped] = strconv.FormatInt(m.Dropped, 10)
	}
	if m.Reordered >= 0 {
		kv[MetaRecordReordered] = strconv.FormatInt(m.Reordered, 10)
	}
	return kv
}

// ErrNotRecording marks a parquet trace without a recording's metadata (a
// converted public trace, say).
var ErrNotRecording = errors.New("not a recording of live traffic")

// ParseRecordingMeta reads a recording's metadata from a parquet trace's
// key-value metadata. A file without MetaRecordStart is ErrNotRecording; a
// malformed value is an error naming its key.
func ParseRecordingMeta(kv map[string]string) (RecordingMeta, error) {
	m := RecordingMeta{Dropped: -1, Reordered: -1}
	start, ok := kv[MetaRecordStart]
	if !ok {
		return m, fmt.Errorf("%w: no %s metadata", ErrNotRecording, MetaRecordStart)
	}
	var errs []error
	bad := func(key string, err error) { errs = append(errs, fmt.Errorf("recording metadata %s: %w", key, err)) }
	var err error
	if m.Start, err = time.Parse(time.RFC3339Nano, start); err != nil {
		bad(MetaRecordStart, err)
	}
	m.SaltFingerprint, m.Gateway = kv[MetaRecordSaltFingerprint], kv[MetaRecordGateway]
	if len(m.SaltFingerprint) != 16 {
		bad(MetaRecordSaltFingerprint, fmt.Errorf("want 16 hex digits, got %q", m.SaltFingerprint))
	}
	if m.Sample, err = strconv.ParseFloat(kv[MetaRecordSample], 64); err != nil || !(m.Sample > 0 && m.Sample <= 1) {
		bad(MetaRecordSample, fmt.Errorf("want a share in (0, 1], got %q", kv[MetaRecordSample]))
	}
	for key, v := range map[string]any{MetaRecordFleet: &m.Fleet, MetaRecordPolicy: &m.Policy, MetaRecordBlockSize: &m.BlockSize} {
		if err := json.Unmarshal([]byte(kv[key]), v); err != nil {
			bad(key, err)
		}
	}
	if m.Sequence, err = strconv.Atoi(kv[MetaRecordSequence]); err != nil || m.Sequence < 1 {
		bad(MetaRecordSequence, fmt.Errorf("want a file number from 1, got %q", kv[MetaRecordSequence]))
	}
	for key, v := range map[string]*int64{MetaRecordDropped: &m.Dropped, MetaRecordReordered: &m.Reordered} {
		if s, ok := kv[key]; ok {
			if *v, err = strconv.ParseInt(s, 10, 64); err != nil || *v < 0 {
				bad(key, fmt.Errorf("want a count, got %q", s))
			}
		}
	}
	return m, errors.Join(errs...)
}

// ReadParquetMeta returns the key-value metadata of the parquet trace at
// path (ParquetVersionKey and, for a recording, the MetaRecord* keys),
// after the same version and schema checks as NewParquet. A truncated file
// gives the metadata of its last complete row group (which lacks
// MetaRecordDropped and MetaRecordReordered).
func ReadParquetMeta(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read parquet trace metadata: %w", err)
	}
	defer f.Close()
	r, err := newParquetReader(f, path, Options{})
	if err != nil {
		return nil, fmt.Errorf("read parquet trace metadata: %w", err)
	}
	return maps.Clone(r.meta), nil
}

// ReadRecordingMeta is ReadParquetMeta then ParseRecordingMeta.
func ReadRecordingMeta(path string) (RecordingMeta, error) {
	kv, err := ReadParquetMeta(path)
	if err != nil {
		return RecordingMeta{Dropped: -1, Reordered: -1}, err
	}
	m, err := ParseRecordingMeta(kv)
	if err != nil {
		return m, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}
