package traces

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"
	"pgregory.net/rapid"
)

// pqSliceReader replays records (test helper for the parquet and stats tests).
type pqSliceReader struct {
	recs []Record
	i    int
}

func (r *pqSliceReader) Next() (Record, error) {
	if r.i >= len(r.recs) {
		return Record{}, io.EOF
	}
	r.i++
	return r.recs[r.i-1], nil
}

// pqReadAll drains r.
func pqReadAll(t testing.TB, r Reader) []Record {
	t.Helper()
	var out []Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("next after %d records: %v", len(out), err)
		}
		out = append(out, rec)
	}
}

// pqWriteBytes writes recs through a ParquetWriter into memory.
func pqWriteBytes(t testing.TB, recs []Record) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewParquetWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// pqOpen opens the parquet trace at path, closing it when the test ends.
func pqOpen(t testing.TB, path string, opts Options) *ParquetReader {
	t.Helper()
	r, err := NewParquet(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	pr := r.(*ParquetReader)
	t.Cleanup(func() {
		if err := pr.Close(); err != nil {
			t.Error(err)
		}
	})
	return pr
}

// pqGenRandomRecord draws a valid record; Arrival is a whole number of microseconds.
func pqGenRandomRecord(t *rapid.T, label string) Record {
	r := Record{
		ID:           rapid.Uint64().Draw(t, label+".id"),
		Arrival:      time.Duration(rapid.Int64Range(0, 1<<50).Draw(t, label+".arrival_us")) * time.Microsecond,
		Session:      rapid.Uint64().Draw(t, label+".session"),
		Parent:       rapid.Uint64().Draw(t, label+".parent"),
		Turn:         rapid.Int().Draw(t, label+".turn"),
		Model:        rapid.SampledFrom([]string{"", "llama-3-8b", "qwen", "ü-model"}).Draw(t, label+".model"),
		Priority:     rapid.Int().Draw(t, label+".priority"),
		InputTokens:  rapid.IntRange(1, 3000).Draw(t, label+".in"),
		OutputTokens: rapid.IntRange(0, 1<<40).Draw(t, label+".out"),
	}
	switch rapid.IntRange(0, 3).Draw(t, label+".ids") {
	case 0: // no block identity
	case 1: // empty, non-nil: reads back as nil
		r.HashIDs = []uint64{}
		r.BlockSize = rapid.IntRange(0, 512).Draw(t, label+".bs")
	case 2: // ids without a block size: Validate allows it, so it must round-trip
		r.HashIDs = rapid.SliceOfN(rapid.Uint64(), 1, 20).Draw(t, label+".hash")
	default:
		r.BlockSize = rapid.IntRange(1, 512).Draw(t, label+".bs")
		n := (r.InputTokens + r.BlockSize - 1) / r.BlockSize
		r.HashIDs = rapid.SliceOfN(rapid.Uint64(), n, n).Draw(t, label+".hash")
	}
	if rapid.Bool().Draw(t, label+".measured") {
		r.Measured = pqGenMeasured(t, label)
	}
	return r
}

// pqGenMeasured draws valid measurements; durations are whole microseconds.
func pqGenMeasured(t *rapid.T, label string) *Measured {
	us := func(name string) time.Duration {
		return time.Duration(rapid.Int64Range(0, maxArrivalUs).Draw(t, label+"."+name)) * time.Microsecond
	}
	return &Measured{
		Tenant: rapid.Uint64().Draw(t, label+".tenant"),
		Queue:  us("queue"), TTFT: us("ttft"), TPOT: us("tpot"), E2E: us("e2e"),
		Replica:               rapid.SampledFrom([]string{"", "a", "replica-7", "ü"}).Draw(t, label+".replica"),
		Outcome:               rapid.SampledFrom([]string{"ok", "queue_full", "upstream_503", "client_gone"}).Draw(t, label+".outcome"),
		CachedTokens:          rapid.IntRange(-1, 1<<40).Draw(t, label+".cached"),
		PredictedCachedTokens: rapid.IntRange(0, 1<<40).Draw(t, label+".predicted"),
		Policy:                rapid.SampledFrom([]string{"", "cost_model", "round_robin"}).Draw(t, label+".policy"),
	}
}

func TestParquetRoundTrip(t *testing.T) {
	dir := t.TempDir()
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 60).Draw(t, "n")
		recs := make([]Record, n)
		for i := range recs {
			recs[i] = pqGenRandomRecord(t, "rec")
		}
		path := filepath.Join(dir, "rt.parquet")
		got, err := WriteParquetFile(path, &pqSliceReader{recs: recs})
		if err != nil {
			t.Fatal(err)
		}
		if got != n {
			t.Fatalf("wrote %d records, want %d", got, n)
		}
		r, err := NewParquet(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.(*ParquetReader).Close()
		var back []Record
		for {
			rec, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			back = append(back, rec)
		}
		want := make([]Record, 0, n)
		for _, rec := range recs {
			if len(rec.HashIDs) == 0 {
				rec.HashIDs = nil
			}
			want = append(want, rec)
		}
		if len(back) == 0 {
			back = []Record{}
		}
		if !reflect.DeepEqual(back, want) {
			t.Fatalf("round trip differs:\n got %+v\nwant %+v", back, want)
		}
		if s := r.(*ParquetReader).Skipped(); s != 0 {
			t.Fatalf("skipped %d", s)
		}
	})
}

// TestParquetRoundTripBatches crosses the reader's and writer's internal
// batches, so reused buffers would show as corrupted hash ids.
func TestParquetRoundTripBatches(t *testing.T) {
	recs := make([]Record, 3*parquetBatch+17)
	for i := range recs {
		n := 1 + i%7
		ids := make([]uint64, n)
		for j := range ids {
			ids[j] = uint64(i*100 + j)
		}
		recs[i] = Record{ID: uint64(i), Arrival: time.Duration(i) * time.Millisecond, InputTokens: 16*n - i%16, OutputTokens: i, BlockSize: 16, HashIDs: ids}
	}
	path := filepath.Join(t.TempDir(), "b.parquet")
	if err := os.WriteFile(path, pqWriteBytes(t, recs), 0o644); err != nil {
		t.Fatal(err)
	}
	got := pqReadAll(t, pqOpen(t, path, Options{}))
	if !reflect.DeepEqual(got, recs) {
		t.Fatal("records differ after round trip")
	}
}

func TestParquetByteIdentical(t *testing.T) {
	recs := []Record{
		{ID: 1, Arrival: 1500 * time.Microsecond, Session: 3, Model: "m", InputTokens: 20, OutputTokens: 5, BlockSize: 16, HashIDs: []uint64{7, 8}},
		{ID: 2, Arrival: 2 * time.Second, Session: 3, Parent: 1, Turn: 1, Model: "m", Priority: 2, InputTokens: 40, OutputTokens: 9, BlockSize: 16, HashIDs: []uint64{7, 8, 9}},
		{ID: 3, Arrival: 3 * time.Second, InputTokens: 1, OutputTokens: 0},
	}
	a := pqWriteBytes(t, recs)
	b := pqWriteBytes(t, recs)
	if !bytes.Equal(a, b) {
		t.Fatal("the same records gave different bytes")
	}
	path := filepath.Join(t.TempDir(), "f.parquet")
	if _, err := WriteParquetFile(path, &pqSliceReader{recs: recs}); err != nil {
		t.Fatal(err)
	}
	c, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, c) {
		t.Fatal("WriteParquetFile and ParquetWriter gave different bytes")
	}
}

// writeRawParquet writes rows with parquet-go directly, with the given
// key-value metadata, to make files this package would not write.
func writeRawParquet[T any](t *testing.T, rows []T, kv map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	opts := []parquet.WriterOption{&parquet.WriterConfig{CreatedBy: parquetCreatedBy}}
	for k, v := range kv {
		opts = append(opts, parquet.KeyValueMetadata(k, v))
	}
	w := parquet.NewGenericWriter[T](&buf, opts...)
	if _, err := w.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "raw.parquet")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestParquetVersionCheck(t *testing.T) {
	rows := []parquetLoadRow{{ID: 1, InputTokens: 5, OutputTokens: 1}}

	path := writeRawParquet(t, rows, map[string]string{ParquetVersionKey: ParquetVersion})
	if got := pqReadAll(t, pqOpen(t, path, Options{})); len(got) != 1 || got[0].ID != 1 {
		t.Fatalf("version %s file: got %+v", ParquetVersion, got)
	}

	path = writeRawParquet(t, rows, map[string]string{ParquetVersionKey: "2"})
	_, err := NewParquet(path, Options{})
	if err == nil || !strings.Contains(err.Error(), `unsupported trace version "2"`) {
		t.Fatalf("version 2 file: want an unsupported version error, got %v", err)
	}

	path = writeRawParquet(t, rows, nil)
	_, err = NewParquet(path, Options{})
	if err == nil || !strings.Contains(err.Error(), "not an inferrail trace") {
		t.Fatalf("file without a version: want an error, got %v", err)
	}

	type partial struct {
		ID uint64 `parquet:"id"`
	}
	path = writeRawParquet(t, []partial{{ID: 1}}, map[string]string{ParquetVersionKey: ParquetVersion})
	_, err = NewParquet(path, Options{})
	if err == nil || !strings.Contains(err.Error(), "lacks column") {
		t.Fatalf("file missing columns: want an error, got %v", err)
	}

	if _, err := NewParquet(filepath.Join(t.TempDir(), "absent.parquet"), Options{}); err == nil {
		t.Fatal("absent file: want an error")
	}
}

func TestParquetBadRecords(t *testing.T) {
	rows := []parquetLoadRow{
		{ID: 1, InputTokens: 5},
		{ID: 2, InputTokens: 0}, // invalid: no prompt
		{ID: 3, InputTokens: 9, Model: "named"},
		{ID: 4, InputTokens: 40, BlockSize: 16, HashIDs: []uint64{1}}, // invalid: 1 id for 3 blocks
		{ID: 5, InputTokens: 1, ArrivalUs: maxArrivalUs + 1},          // invalid: overflows a Duration
	}
	path := writeRawParquet(t, rows, map[string]string{ParquetVersionKey: ParquetVersion})

	r := pqOpen(t, path, Options{})
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	_, err := r.Next()
	var le *LineError
	if !errors.As(err, &le) || le.Line != 2 || le.File != path || !errors.Is(err, ErrBadRecord) {
		t.Fatalf("want a LineError at row 2 wrapping ErrBadRecord, got %v", err)
	}

	r = pqOpen(t, path, Options{SkipBad: true, Model: "default"})
	got := pqReadAll(t, r)
	if len(got) != 2 || got[0].ID != 1 || got[1].ID != 3 {
		t.Fatalf("SkipBad: got %+v", got)
	}
	if got[0].Model != "default" || got[1].Model != "named" {
		t.Fatalf("Options.Model: got models %q and %q", got[0].Model, got[1].Model)
	}
	if r.Skipped() != 3 {
		t.Fatalf("Skipped = %d, want 3", r.Skipped())
	}
}

func TestParquetWriterRefuses(t *testing.T) {
	w, err := NewParquetWriter(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Record{ID: 1}); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("invalid record: want ErrBadRecord, got %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Record{ID: 2, InputTokens: 1}); err == nil {
		t.Fatal("write after close: want an error")
	}
	if _, err := NewParquetWriter(nil); err == nil {
		t.Fatal("nil writer: want an error")
	}
}

const pqGenIDs = 32

func pqGenRecord(i int) Record {
	ids := make([]uint64, pqGenIDs)
	for j := range ids {
		ids[j] = uint64(i)*1_000_003 + uint64(j)*7919
	}
	return Record{
		ID: uint64(i), Arrival: time.Duration(i) * time.Millisecond, Session: uint64(i / 4), Turn: i % 4,
		Model: "m", InputTokens: 16*pqGenIDs - i%16, OutputTokens: i % 1000, BlockSize: 16, HashIDs: ids,
	}
}

func pqLiveHeap() uint64 {
	// Twice: what parquet-go's sync.Pools hold survives one collection
	// (their victim caches), and is not live.
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestParquetBoundedMemory writes and reads 200k records, checking that the
// live heap stays far below the records' total size on both sides.
func TestParquetBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("200k-record parquet write/read skipped in -short mode")
	}
	const n = 200_000
	perRecord := uint64(reflect.TypeFor[Record]().Size()) + 8*pqGenIDs + 16 // + slice header slack
	total := n * perRecord                                                  // about 85 MB
	path := filepath.Join(t.TempDir(), "big.parquet")
	base := pqLiveHeap()

	// Writing: sample the live heap while the writer is mid row group.
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewParquetWriter(f)
	if err != nil {
		t.Fatal(err)
	}
	var peakW uint64
	for i := range n {
		if err := w.Write(pqGenRecord(i)); err != nil {
			t.Fatal(err)
		}
		if i%20_000 == 19_999 {
			peakW = max(peakW, pqLiveHeap())
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	r := pqOpen(t, path, Options{})
	if g, want := len(r.groups), (n+ParquetRowGroupSize-1)/ParquetRowGroupSize; g != want {
		t.Fatalf("file has %d row groups, want %d", g, want)
	}
	var peakR uint64
	i := 0
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if i%997 == 0 && !reflect.DeepEqual(rec, pqGenRecord(i)) {
			t.Fatalf("record %d differs: %+v", i, rec)
		}
		if i%20_000 == 19_999 {
			peakR = max(peakR, pqLiveHeap())
		}
		i++
	}
	if i != n {
		t.Fatalf("read %d records, want %d", i, n)
	}
	st, _ := os.Stat(path)
	over := func(p uint64) uint64 { return p - min(p, base) }
	t.Logf("records %d MB, file %d MB, live heap above baseline: writing %.1f MB, reading %.1f MB",
		total>>20, st.Size()>>20, float64(over(peakW))/(1<<20), float64(over(peakR))/(1<<20))
	if over(peakR) > total/8 {
		t.Errorf("reading held %d bytes live, want well under the records' %d", over(peakR), total)
	}
	// One row group and the compressor's buffers: 16.7 MB with
	// klauspost/compress 1.17, 18-19 MB with 1.20 (its zstd encoder keeps
	// larger windows), both far under the records' 73 MB.
	if over(peakW) > total/3 {
		t.Errorf("writing held %d bytes live, want well under the records' %d", over(peakW), total)
	}
}
