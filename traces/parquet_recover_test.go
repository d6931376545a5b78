package traces

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"
	"pgregory.net/rapid"
)

// pqRecording is a multi-row-group file and where each of its checkpoints
// ends (a prefix up to one is readable up to that row group).
type pqRecording struct {
	data []byte
	recs []Record
	ends []int64 // ends[k]: the end of row group k's checkpoint
	rows int     // records per row group
}

func pqMeasuredRecord(i int) Record {
	r := pqGenRecord(i)
	r.Measured = &Measured{
		Tenant: uint64(i % 3), Queue: time.Duration(i) * time.Microsecond, TTFT: time.Duration(i) * time.Millisecond,
		TPOT: 20 * time.Millisecond, E2E: time.Second, Replica: []string{"a", "b"}[i%2], Outcome: "ok",
		CachedTokens: i % 7, PredictedCachedTokens: i % 5, Policy: "cost_model",
	}
	return r
}

func pqWriteRecording(t testing.TB, groups, rows int, meta map[string]string) pqRecording {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewParquetWriterOptions(&buf, ParquetWriterOptions{Metadata: meta, RowGroupRows: rows})
	if err != nil {
		t.Fatal(err)
	}
	rec := pqRecording{rows: rows}
	for g := range groups {
		for i := range rows {
			r := pqMeasuredRecord(g*rows + i)
			if err := w.Write(r); err != nil {
				t.Fatal(err)
			}
			rec.recs = append(rec.recs, r)
		}
		// The writer ended the full row group itself; Flush adds nothing.
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if n, _ := w.Buffered(); n != 0 {
			t.Fatalf("%d records buffered after a full row group", n)
		}
		rec.ends = append(rec.ends, w.Size())
	}
	if err := w.SetMetadata(MetaRecordDropped, "3"); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rec.data = buf.Bytes()
	return rec
}

func pqWriteFile(t testing.TB, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rec.parquet")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// pqDrain reads r to its end, returning the records and the error that
// ended it (nil for io.EOF).
func pqDrain(t interface {
	Helper()
	Fatalf(string, ...any)
}, r Reader) ([]Record, error) {
	t.Helper()
	var out []Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			if _, again := r.Next(); !errors.Is(again, io.EOF) {
				t.Fatalf("after %v, Next gave %v, want io.EOF", err, again)
			}
			return out, err
		}
		out = append(out, rec)
	}
}

func pqEncode(recs []Record) ([]byte, error) {
	var buf bytes.Buffer
	w, err := NewParquetWriter(&buf)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// A recording cut anywhere yields exactly the row groups whose checkpoint
// is whole, then reports what it could not read; a whole one reads as a
// parquet file does.
func TestParquetTruncated(t *testing.T) {
	rec := pqWriteRecording(t, 5, 40, nil)
	size := int64(len(rec.data))
	var cuts []int64
	start := int64(0)
	for _, end := range rec.ends {
		part := end - checkpointLen // the part ends where its checkpoint starts
		cuts = append(cuts,
			start+1, start+(part-start)/2, // inside the row group's pages
			part-20, part-5, part-1, // inside its footer, its length, its magic
			part, part+10, end-1, // inside the checkpoint
			end) // exactly after it
		start = end
	}
	cuts = append(cuts, size-12, size-5, size-1) // inside the file's footer
	for _, cut := range cuts {
		want := 0
		for _, e := range rec.ends {
			if e <= cut {
				want++
			}
		}
		path := pqWriteFile(t, rec.data[:cut])
		r, err := NewParquet(path, Options{})
		if want == 0 {
			var te *TruncatedError
			if !errors.As(err, &te) || !errors.Is(err, ErrTruncated) || te.RowGroups != 0 || te.Size != cut {
				t.Fatalf("cut at %d: want a TruncatedError with nothing read, got %v", cut, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("cut at %d of %d: %v", cut, size, err)
		}
		got, err := pqDrain(t, r)
		r.(*ParquetReader).Close()
		if !reflect.DeepEqual(got, rec.recs[:want*rec.rows]) {
			t.Fatalf("cut at %d: read %d records, want the first %d", cut, len(got), want*rec.rows)
		}
		var te *TruncatedError
		if !errors.As(err, &te) || !errors.Is(err, ErrTruncated) {
			t.Fatalf("cut at %d: want a TruncatedError at the end, got %v", cut, err)
		}
		wantTE := TruncatedError{File: path, Size: cut, Readable: rec.ends[want-1], RowGroups: want, Rows: int64(want * rec.rows)}
		if *te != wantTE {
			t.Fatalf("cut at %d: got %+v, want %+v", cut, *te, wantTE)
		}
		if msg := te.Error(); !strings.Contains(msg, "the last ") || !strings.Contains(msg, "complete row groups") {
			t.Fatalf("cut at %d: message %q does not say what was lost", cut, msg)
		}
		// With SkipBad the loss is only reported by Truncated.
		r2 := pqOpen(t, path, Options{SkipBad: true})
		got, err = pqDrain(t, r2)
		if err != nil || len(got) != want*rec.rows || r2.Truncated() == nil || *r2.Truncated() != wantTE {
			t.Fatalf("cut at %d with SkipBad: %d records, %v, %+v", cut, len(got), err, r2.Truncated())
		}
	}
	// Whole: every record, io.EOF, the final footer's metadata.
	path := pqWriteFile(t, rec.data)
	r := pqOpen(t, path, Options{})
	got, err := pqDrain(t, r)
	if err != nil || !reflect.DeepEqual(got, rec.recs) || r.Truncated() != nil {
		t.Fatalf("whole file: %d records, %v, truncated %v", len(got), err, r.Truncated())
	}
	if r.Metadata()[MetaRecordDropped] != "3" {
		t.Fatalf("whole file: metadata %v lacks what SetMetadata set before Close", r.Metadata())
	}
	// Cut: the parts' metadata, without what only the final footer says.
	r = pqOpen(t, pqWriteFile(t, rec.data[:rec.ends[2]]), Options{SkipBad: true})
	if _, ok := r.Metadata()[MetaRecordDropped]; ok || r.Metadata()[ParquetVersionKey] != ParquetVersion {
		t.Fatalf("truncated file: metadata %v", r.Metadata())
	}
}

// A whole file is an ordinary parquet file to parquet-go: one row group per
// part, at the right offsets, and no page index.
func TestParquetLayoutForOtherReaders(t *testing.T) {
	rec := pqWriteRecording(t, 3, 25, map[string]string{"k": "v"})
	pf, err := parquet.OpenFile(bytes.NewReader(rec.data), int64(len(rec.data)))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(pf.RowGroups()); n != 3 || pf.NumRows() != 75 {
		t.Fatalf("%d row groups, %d rows; want 3 and 75", n, pf.NumRows())
	}
	if v, _ := pf.Lookup("k"); v != "v" {
		t.Fatalf("metadata k = %q", v)
	}
	ci, oi, err := pf.ReadPageIndex()
	if err != nil || len(ci) != 0 || len(oi) != 0 {
		t.Fatalf("page index: %d, %d, %v; want none", len(ci), len(oi), err)
	}
	rows := make([]parquetRow, 100)
	n, err := parquet.NewGenericReader[parquetRow](pf).Read(rows)
	if n != 75 || (err != nil && !errors.Is(err, io.EOF)) {
		t.Fatalf("read %d rows: %v", n, err)
	}
	for i := range n {
		if got := rows[i].record(); !reflect.DeepEqual(got, rec.recs[i]) {
			t.Fatalf("row %d: %+v, want %+v", i, got, rec.recs[i])
		}
	}
	// An empty file is a valid parquet file too.
	empty := pqWriteBytes(t, nil)
	if pf, err := parquet.OpenFile(bytes.NewReader(empty), int64(len(empty))); err != nil || pf.NumRows() != 0 {
		t.Fatalf("empty file: %v", err)
	}
	if got := pqReadAll(t, pqOpen(t, pqWriteFile(t, empty), Options{})); len(got) != 0 {
		t.Fatalf("empty file: %d records", len(got))
	}
}

// Older readers (version 1 before the measured columns) read a recording's
// load and ignore its measurements; this reader reads their files (no
// measured columns) with Measured nil, and refuses a file with only some
// of the measured columns.
func TestParquetMeasuredColumnsOptional(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 30).Draw(t, "n")
		recs := make([]Record, n)
		for i := range recs {
			recs[i] = pqGenRandomRecord(t, "rec")
			if len(recs[i].HashIDs) == 0 {
				recs[i].HashIDs = nil
			}
		}
		data, err := pqEncode(recs)
		if err != nil {
			t.Fatal(err)
		}
		// An older reader: its row type has the load columns only.
		pf, err := parquet.OpenFile(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		rows := make([]parquetLoadRow, n+1)
		m, err := parquet.NewGenericReader[parquetLoadRow](pf).Read(rows)
		if m != n || (err != nil && !errors.Is(err, io.EOF)) {
			t.Fatalf("older reader read %d of %d: %v", m, n, err)
		}
		var raw bytes.Buffer
		for i := range n {
			got := (&parquetRow{parquetLoadRow: rows[i]}).record()
			want := recs[i]
			want.Measured = nil
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("older reader, record %d: %+v, want %+v", i, got, want)
			}
		}
		// A file an older writer wrote: read with Measured nil.
		w := parquet.NewGenericWriter[parquetLoadRow](&raw, &parquet.WriterConfig{CreatedBy: parquetCreatedBy}, parquet.KeyValueMetadata(ParquetVersionKey, ParquetVersion))
		if _, err := w.Write(rows[:n]); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(os.TempDir(), "inferrail-old-"+time.Now().Format("150405.000000000")+".parquet")
		defer os.Remove(path)
		if err := os.WriteFile(path, raw.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := NewParquet(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer r.(*ParquetReader).Close()
		back, err := pqDrain(t, r)
		if err != nil || len(back) != n {
			t.Fatalf("old file: %d records, %v", len(back), err)
		}
		for i := range back {
			want := recs[i]
			want.Measured = nil
			if !reflect.DeepEqual(back[i], want) {
				t.Fatalf("old file, record %d: %+v, want %+v", i, back[i], want)
			}
		}
	})

	type partial struct {
		parquetLoadRow
		Measured bool   `parquet:"measured"`
		TTFTUs   int64  `parquet:"ttft_us"`
		Outcome  string `parquet:"outcome"`
	}
	path := writeRawParquet(t, []partial{{parquetLoadRow: parquetLoadRow{ID: 1, InputTokens: 1}, Measured: true, Outcome: "ok"}}, map[string]string{ParquetVersionKey: ParquetVersion})
	if _, err := NewParquet(path, Options{}); err == nil || !strings.Contains(err.Error(), "some of the measured columns") {
		t.Fatalf("a file with some measured columns: want an error, got %v", err)
	}
}

func TestParquetMeasuredRefused(t *testing.T) {
	w, err := NewParquetWriter(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []Measured{
		{TTFT: -time.Millisecond, Outcome: "ok"},
		{Outcome: ""},
		{CachedTokens: -2, Outcome: "ok"},
		{PredictedCachedTokens: -1, Outcome: "ok"},
	} {
		if err := w.Write(Record{ID: 1, InputTokens: 1, Measured: &m}); !errors.Is(err, ErrBadRecord) {
			t.Errorf("measured %+v: want ErrBadRecord, got %v", m, err)
		}
	}
	if _, err := NewParquetWriterOptions(io.Discard, ParquetWriterOptions{Metadata: map[string]string{ParquetVersionKey: "2"}}); err == nil {
		t.Error("metadata setting the version: want an error")
	}
	if err := w.SetMetadata(ParquetVersionKey, "2"); err == nil {
		t.Error("SetMetadata of the version: want an error")
	}
	// Rows no writer of this package writes: read as bad records.
	rows := []parquetRow{
		{parquetLoadRow: parquetLoadRow{ID: 1, InputTokens: 1}, Tenant: 5},                                               // measured columns on an unmeasured row
		{parquetLoadRow: parquetLoadRow{ID: 2, InputTokens: 1}, Measured: true, Outcome: "ok", TTFTUs: maxArrivalUs + 1}, // overflows
		{parquetLoadRow: parquetLoadRow{ID: 3, InputTokens: 1}, Measured: true, Outcome: "ok", QueueUs: -1},              // negative
		{parquetLoadRow: parquetLoadRow{ID: 4, InputTokens: 1}, Measured: true, Outcome: "ok", CachedTokens: -1},
	}
	path := writeRawParquet(t, rows, map[string]string{ParquetVersionKey: ParquetVersion})
	r := pqOpen(t, path, Options{SkipBad: true})
	got := pqReadAll(t, r)
	if len(got) != 1 || got[0].ID != 4 || got[0].Measured == nil || got[0].Measured.CachedTokens != -1 || r.Skipped() != 3 {
		t.Fatalf("got %+v, skipped %d; want only record 4", got, r.Skipped())
	}
}

func TestRecordingMeta(t *testing.T) {
	m := RecordingMeta{
		Start: time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC), SaltFingerprint: "0123456789abcdef", Sample: 0.25,
		Fleet: map[string][]string{"m": {"a", "b"}}, Policy: map[string]string{"m": "cost_model"}, BlockSize: map[string]int{"m": 16},
		Sequence: 2, Gateway: "dev", Dropped: -1, Reordered: -1,
	}
	rec := pqWriteRecording(t, 1, 3, m.Metadata())
	path := pqWriteFile(t, rec.data)
	kv, err := ReadParquetMeta(path)
	if err != nil {
		t.Fatal(err)
	}
	if kv[ParquetVersionKey] != ParquetVersion {
		t.Fatalf("metadata %v", kv)
	}
	got, err := ReadRecordingMeta(path)
	if err != nil {
		t.Fatal(err)
	}
	want := m
	want.Dropped = 3 // set before Close by pqWriteRecording
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	// Cut short: the parts' metadata, without the counts.
	got, err = ReadRecordingMeta(pqWriteFile(t, rec.data[:rec.ends[0]]))
	if err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("truncated: %+v, %v", got, err)
	}
	// Not a recording; malformed values name their key.
	if _, err := ParseRecordingMeta(map[string]string{ParquetVersionKey: "1"}); !errors.Is(err, ErrNotRecording) {
		t.Fatalf("no recording keys: %v", err)
	}
	bad := m.Metadata()
	bad[MetaRecordSample], bad[MetaRecordFleet] = "2", "{"
	_, err = ParseRecordingMeta(bad)
	if err == nil || !strings.Contains(err.Error(), MetaRecordSample) || !strings.Contains(err.Error(), MetaRecordFleet) {
		t.Fatalf("malformed: %v", err)
	}
	// A newer version is refused, naming it.
	if _, err := ReadParquetMeta(writeRawParquet(t, []parquetRow{{parquetLoadRow: parquetLoadRow{ID: 1, InputTokens: 1}}}, map[string]string{ParquetVersionKey: "7"})); err == nil || !strings.Contains(err.Error(), `version "7"`) {
		t.Fatalf("version 7: %v", err)
	}
}

// FuzzParquetTruncated: a recording cut anywhere and followed by any bytes
// never makes the reader fail in a way other than an error, and what it
// reads is the recording's first records, in order. (Tails that end in
// parquet's magic are left out: their footer is parquet-go's to decode.)
func FuzzParquetTruncated(f *testing.F) {
	rec := pqWriteRecording(f, 4, 16, nil)
	f.Add(uint32(len(rec.data)), []byte{})
	f.Add(uint32(rec.ends[1]), []byte("IRCK"))
	f.Add(uint32(rec.ends[2]-3), []byte("PAR1IRCK\x00\x00"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, cut uint32, tail []byte) {
		if len(tail) > 256 || bytes.HasSuffix(tail, []byte("PAR1")) {
			return
		}
		data := append(append([]byte(nil), rec.data[:int(cut)%(len(rec.data)+1)]...), tail...)
		path := filepath.Join(dir, "f.parquet")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := NewParquet(path, Options{})
		if err != nil {
			return
		}
		defer r.(*ParquetReader).Close()
		got, _ := pqDrain(t, r)
		if len(got) > len(rec.recs) || !reflect.DeepEqual(got, rec.recs[:len(got)]) {
			t.Fatalf("read %d records that are not the recording's first", len(got))
		}
	})
}
