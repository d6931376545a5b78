package traces

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/parquet-go/parquet-go"
)

// The project's own trace format is a snappy-compressed parquet file with one
// row per request, in arrival order (the order the records were written). Its
// schema, version 1, has these columns (all required; integers are signed
// 64-bit unless said otherwise):
//
//	id             uint64          Record.ID
//	arrival_us     int64           Record.Arrival in whole microseconds since
//	                               the trace's start (truncated toward zero)
//	session        uint64          Record.Session (0 = unknown)
//	parent         uint64          Record.Parent (0 = none)
//	turn           int64           Record.Turn (0-based)
//	model          string, dict    Record.Model ("" = unnamed)
//	priority       int64           Record.Priority
//	input_tokens   int64           Record.InputTokens (tokens)
//	output_tokens  int64           Record.OutputTokens (tokens)
//	block_size     int64           Record.BlockSize (tokens per hash id;
//	                               0 = no block identity)
//	hash_ids       list<uint64>    Record.HashIDs, in prompt order
//
// The file's key-value metadata holds ParquetVersionKey = ParquetVersion.
//
// Compatibility rule: a reader reads exactly the versions it knows and refuses
// any other (and files without the key), rather than guess. Adding a column
// that older readers may ignore keeps the version; renaming, removing or
// retyping a column, or changing a column's meaning or unit, bumps it.
//
// HashIDs round-trip as nil when empty: a record written with an empty,
// non-nil HashIDs reads back with nil HashIDs. Every other field
// round-trips exactly, Arrival to the microsecond.
const (
	// ParquetVersionKey is the key-value metadata entry naming the schema
	// version of a parquet trace.
	ParquetVersionKey = "inferrail.trace.version"
	// ParquetVersion is the schema version this package writes and reads.
	ParquetVersion = "1"
)

// ParquetRowGroupSize is how many records a ParquetWriter buffers per row
// group; memory for writing and reading is bounded by one row group.
const ParquetRowGroupSize = 64 * 1024

// parquetCreatedBy pins the file's created_by metadata, which parquet-go
// otherwise derives from the binary's build information, so that output is
// byte-identical across builds.
const parquetCreatedBy = "github.com/inferrail/inferrail/traces"

// parquetBatch is how many rows move between the record API and parquet-go
// at a time.
const parquetBatch = 1024

// maxArrivalUs is the largest arrival_us a time.Duration holds.
const maxArrivalUs = math.MaxInt64 / int64(time.Microsecond)

// parquetRow is one record as a parquet row: the schema of version 1.
type parquetRow struct {
	ID           uint64   `parquet:"id,delta"`
	ArrivalUs    int64    `parquet:"arrival_us,delta"`
	Session      uint64   `parquet:"session,delta"`
	Parent       uint64   `parquet:"parent,delta"`
	Turn         int64    `parquet:"turn,delta"`
	Model        string   `parquet:"model,dict"`
	Priority     int64    `parquet:"priority,delta"`
	InputTokens  int64    `parquet:"input_tokens,delta"`
	OutputTokens int64    `parquet:"output_tokens,delta"`
	BlockSize    int64    `parquet:"block_size,delta"`
	HashIDs      []uint64 `parquet:"hash_ids,list"`
}

func rowOf(r *Record) parquetRow {
	row := parquetRow{
		ID:           r.ID,
		ArrivalUs:    r.Arrival.Microseconds(),
		Session:      r.Session,
		Parent:       r.Parent,
		Turn:         int64(r.Turn),
		Model:        r.Model,
		Priority:     int64(r.Priority),
		InputTokens:  int64(r.InputTokens),
		OutputTokens: int64(r.OutputTokens),
		BlockSize:    int64(r.BlockSize),
	}
	if len(r.HashIDs) > 0 {
		row.HashIDs = r.HashIDs
	}
	return row
}

func (row *parquetRow) record() Record {
	r := Record{
		ID:           row.ID,
		Arrival:      time.Duration(row.ArrivalUs) * time.Microsecond,
		Session:      row.Session,
		Parent:       row.Parent,
		Turn:         int(row.Turn),
		Model:        row.Model,
		Priority:     int(row.Priority),
		InputTokens:  int(row.InputTokens),
		OutputTokens: int(row.OutputTokens),
		BlockSize:    int(row.BlockSize),
	}
	if len(row.HashIDs) > 0 {
		r.HashIDs = row.HashIDs
	}
	return r
}

// ParquetWriter writes records as a parquet trace (see ParquetVersion for the
// schema). It buffers at most one row group (ParquetRowGroupSize records) in
// memory. Close must be called to complete the file. The same records always
// produce the same bytes.
type ParquetWriter struct {
	pw     *parquet.GenericWriter[parquetRow]
	batch  []parquetRow
	closed bool
}

// NewParquetWriter starts a parquet trace on w. It does not close w.
func NewParquetWriter(w io.Writer) (*ParquetWriter, error) {
	if w == nil {
		return nil, errors.New("new parquet writer: nil io.Writer")
	}
	pw := parquet.NewGenericWriter[parquetRow](w,
		&parquet.WriterConfig{CreatedBy: parquetCreatedBy},
		parquet.Compression(&parquet.Snappy),
		parquet.MaxRowsPerRowGroup(ParquetRowGroupSize),
		parquet.KeyValueMetadata(ParquetVersionKey, ParquetVersion),
	)
	return &ParquetWriter{pw: pw, batch: make([]parquetRow, 0, parquetBatch)}, nil
}

// Write appends a record. It refuses a record that fails Validate (the error
// wraps ErrBadRecord), so that files hold valid records only. Arrival is
// truncated to the microsecond.
func (w *ParquetWriter) Write(r Record) error {
	if w.closed {
		return errors.New("write parquet trace: writer closed")
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("write parquet trace: record %d: %w", r.ID, err)
	}
	w.batch = append(w.batch, rowOf(&r))
	if len(w.batch) == cap(w.batch) {
		return w.flushBatch()
	}
	return nil
}

func (w *ParquetWriter) flushBatch() error {
	if len(w.batch) == 0 {
		return nil
	}
	_, err := w.pw.Write(w.batch)
	clear(w.batch) // drop references to the records' hash ids
	w.batch = w.batch[:0]
	if err != nil {
		return fmt.Errorf("write parquet trace: %w", err)
	}
	return nil
}

// Close writes the buffered records and the file's footer. It does not close
// the underlying io.Writer. Calling Close again returns nil.
func (w *ParquetWriter) Close() error {
	if w.closed {
		return nil
	}
	w.closed = true
	if err := w.flushBatch(); err != nil {
		return err
	}
	if err := w.pw.Close(); err != nil {
		return fmt.Errorf("close parquet trace: %w", err)
	}
	return nil
}

// WriteParquetFile copies every record of r to a new parquet trace at path
// (created or truncated) and returns how many it wrote. On error the file
// may be incomplete.
func WriteParquetFile(path string, r Reader) (n int, err error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, fmt.Errorf("write parquet trace file: %w", err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("write parquet trace file %s: %w", path, cerr)
		}
	}()
	w, err := NewParquetWriter(f)
	if err != nil {
		return 0, fmt.Errorf("write parquet trace file %s: %w", path, err)
	}
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, fmt.Errorf("write parquet trace file %s: read record %d: %w", path, n+1, err)
		}
		if err := w.Write(rec); err != nil {
			return n, fmt.Errorf("write parquet trace file %s: %w", path, err)
		}
		n++
	}
	if err := w.Close(); err != nil {
		return n, fmt.Errorf("write parquet trace file %s: %w", path, err)
	}
	return n, nil
}

// ParquetReader reads a parquet trace (see ParquetVersion) row group by row
// group, so memory is bounded by one row group whatever the file's length.
// Records come in file order. Create one with NewParquet.
type ParquetReader struct {
	path    string
	opts    Options
	f       *os.File
	groups  []parquet.RowGroup
	group   int // index of the next row group to open
	rg      *parquet.GenericReader[parquetRow]
	buf     []parquetRow
	pos     int // next row of buf
	row     int // 1-based number of the last row returned or skipped
	skipped int
	err     error // sticky error (io.EOF at the end)
}

// NewParquet opens the parquet trace at path. It refuses a file whose
// ParquetVersionKey metadata is missing or other than ParquetVersion, or
// which lacks a column of the schema. Records that fail Validate are errors
// (a *LineError whose Line is the 1-based row number, wrapping ErrBadRecord)
// or, with opts.SkipBad, counted by Skipped. opts.Model fills the model of
// records that name none. Close releases the file.
func NewParquet(path string, opts Options) (Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open parquet trace: %w", err)
	}
	r, err := newParquetReader(f, path, opts)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return r, nil
}

func newParquetReader(f *os.File, path string, opts Options) (*ParquetReader, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("open parquet trace %s: %w", path, err)
	}
	pf, err := parquet.OpenFile(f, st.Size(), parquet.SkipBloomFilters(true))
	if err != nil {
		return nil, fmt.Errorf("open parquet trace %s: %w", path, err)
	}
	v, ok := pf.Lookup(ParquetVersionKey)
	if !ok {
		return nil, fmt.Errorf("open parquet trace %s: no %q metadata: not an inferrail trace", path, ParquetVersionKey)
	}
	if v != ParquetVersion {
		return nil, fmt.Errorf("open parquet trace %s: unsupported trace version %q (this build reads version %q)", path, v, ParquetVersion)
	}
	want := parquet.SchemaOf(parquetRow{})
	for _, col := range want.Columns() {
		if _, ok := pf.Schema().Lookup(col...); !ok {
			return nil, fmt.Errorf("open parquet trace %s: version %s file lacks column %q", path, v, col)
		}
	}
	return &ParquetReader{
		path:   path,
		opts:   opts,
		f:      f,
		groups: pf.RowGroups(),
		buf:    make([]parquetRow, parquetBatch),
	}, nil
}

// Next returns the next record, or io.EOF after the last one.
func (r *ParquetReader) Next() (Record, error) {
	for {
		if r.err != nil {
			return Record{}, r.err
		}
		if r.pos >= len(r.buf) || r.rg == nil {
			if err := r.fill(); err != nil {
				r.err = err
				return Record{}, err
			}
			continue
		}
		row := &r.buf[r.pos]
		r.pos++
		r.row++
		rec := row.record()
		row.HashIDs = nil // the record owns them now
		if rec.Model == "" {
			rec.Model = r.opts.Model
		}
		err := rec.Validate()
		if err == nil && row.ArrivalUs > maxArrivalUs {
			err = fmt.Errorf("%w: arrival %d us overflows a time.Duration", ErrBadRecord, row.ArrivalUs)
		}
		if err != nil {
			if r.opts.SkipBad {
				r.skipped++
				continue
			}
			return Record{}, &LineError{File: r.path, Line: r.row, Err: err}
		}
		return rec, nil
	}
}

// fill loads the next batch of rows into buf, moving on to the next row group
// when the current one is done; io.EOF after the last row group.
func (r *ParquetReader) fill() error {
	for {
		if r.rg == nil {
			if r.group >= len(r.groups) {
				return io.EOF
			}
			r.rg = parquet.NewGenericRowGroupReader[parquetRow](r.groups[r.group])
			r.group++
		}
		buf := r.buf[:cap(r.buf)]
		clear(buf)
		n, err := r.rg.Read(buf)
		if n > 0 {
			r.buf, r.pos = buf[:n], 0
			return nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read parquet trace %s: row group %d: %w", r.path, r.group-1, err)
		}
		// The row group is done: release it and open the next one.
		if cerr := r.rg.Close(); cerr != nil {
			return fmt.Errorf("read parquet trace %s: row group %d: %w", r.path, r.group-1, cerr)
		}
		r.rg = nil
		r.buf = buf[:0]
	}
}

// Skipped returns how many invalid records were skipped (only with
// Options.SkipBad).
func (r *ParquetReader) Skipped() int { return r.skipped }

// Close releases the file. Next returns an error afterwards.
func (r *ParquetReader) Close() error {
	if r.f == nil {
		return nil
	}
	var err error
	if r.rg != nil {
		err = r.rg.Close()
		r.rg = nil
	}
	if cerr := r.f.Close(); cerr != nil && err == nil {
		err = cerr
	}
	r.f = nil
	if r.err == nil {
		r.err = errors.New("read parquet trace: reader closed")
	}
	if err != nil {
		return fmt.Errorf("close parquet trace %s: %w", r.path, err)
	}
	return nil
}
