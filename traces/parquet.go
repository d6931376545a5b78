package traces

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// The project's own trace format is a snappy-compressed parquet file with one
// row per request, in arrival order (the order the records were written). Its
// schema, version 1, has these columns (all required; integers are signed
// 64-bit unless said otherwise). The load columns, in every version 1 file:
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
// The measured columns, added to version 1 for recordings of live traffic
// (Record.Measured); a file has all of them or none. Durations are whole
// microseconds (truncated toward zero):
//
//	measured                 bool          Record.Measured != nil; when false
//	                                       every other measured column is 0/""
//	tenant                   uint64        Measured.Tenant (salted hash; 0 = none)
//	queue_us                 int64         Measured.Queue
//	ttft_us                  int64         Measured.TTFT
//	tpot_us                  int64         Measured.TPOT
//	e2e_us                   int64         Measured.E2E
//	replica                  string, dict  Measured.Replica
//	outcome                  string, dict  Measured.Outcome
//	cached_tokens            int64         Measured.CachedTokens (-1 = unknown)
//	predicted_cached_tokens  int64         Measured.PredictedCachedTokens
//	policy                   string, dict  Measured.Policy
//
// The file's key-value metadata holds ParquetVersionKey = ParquetVersion,
// and whatever ParquetWriterOptions.Metadata adds (a recording's keys:
// RecordingMeta).
//
// Compatibility rule: a reader reads exactly the versions it knows and refuses
// any other (and files without the key), rather than guess. Adding a column
// that older readers may ignore keeps the version; renaming, removing or
// retyping a column, or changing a column's meaning or unit, bumps it. The
// measured columns are such an addition: a reader that predates them reads a
// recording's load and ignores the measurements, and this reader reads a
// version 1 file without them as records with Measured nil. A file with only
// some of them is refused.
//
// Layout (checkpoints): the file is written as a sequence of parts, each a
// complete parquet file of one row group (its own magic, pages, page index
// and footer, whose metadata holds the same keys and "inferrail.trace.part",
// the part's number from 0), each followed by a
// 28-byte checkpoint record, and ends with the footer of the whole file,
// which references every part's row group at its offset in the file (and no
// page index). Parquet readers read the whole file through that last footer
// and skip the bytes no footer references. A file cut short (a full disk, an
// interrupted copy) has no last footer; NewParquet then finds the last
// complete checkpoint and reads every row group before it, reporting the
// rest as a *TruncatedError. A checkpoint is, little-endian:
//
//	"IRCK" | part number uint32 | part start int64 | part end int64 |
//	CRC-32C of the preceding 24 bytes
//
// where the part spans [start, end) and the checkpoint starts at end; part
// 0 starts at offset 0 and each next part where the previous checkpoint
// ends.
//
// HashIDs round-trip as nil when empty: a record written with an empty,
// non-nil HashIDs reads back with nil HashIDs. Every other field
// round-trips exactly, Arrival and the measured durations to the
// microsecond.
const (
	// ParquetVersionKey is the key-value metadata entry naming the schema
	// version of a parquet trace.
	ParquetVersionKey = "inferrail.trace.version"
	// ParquetVersion is the schema version this package writes and reads.
	ParquetVersion = "1"
)

// ParquetRowGroupSize is how many records a ParquetWriter buffers per row
// group by default; memory for writing and reading is bounded by one row
// group.
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

// parquetLoadRow is one record's load columns: the schema of version 1
// before the measured columns were added.
type parquetLoadRow struct {
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

// parquetRow is one record as a parquet row: the whole schema of version 1.
type parquetRow struct {
	parquetLoadRow
	Measured              bool   `parquet:"measured"`
	Tenant                uint64 `parquet:"tenant,dict"`
	QueueUs               int64  `parquet:"queue_us,delta"`
	TTFTUs                int64  `parquet:"ttft_us,delta"`
	TPOTUs                int64  `parquet:"tpot_us,delta"`
	E2EUs                 int64  `parquet:"e2e_us,delta"`
	Replica               string `parquet:"replica,dict"`
	Outcome               string `parquet:"outcome,dict"`
	CachedTokens          int64  `parquet:"cached_tokens,delta"`
	PredictedCachedTokens int64  `parquet:"predicted_cached_tokens,delta"`
	Policy                string `parquet:"policy,dict"`
}

func rowOf(r *Record) parquetRow {
	row := parquetRow{parquetLoadRow: parquetLoadRow{
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
	}}
	if len(r.HashIDs) > 0 {
		row.HashIDs = r.HashIDs
	}
	if m := r.Measured; m != nil {
		row.Measured = true
		row.Tenant = m.Tenant
		row.QueueUs = m.Queue.Microseconds()
		row.TTFTUs = m.TTFT.Microseconds()
		row.TPOTUs = m.TPOT.Microseconds()
		row.E2EUs = m.E2E.Microseconds()
		row.Replica = m.Replica
		row.Outcome = m.Outcome
		row.CachedTokens = int64(m.CachedTokens)
		row.PredictedCachedTokens = int64(m.PredictedCachedTokens)
		row.Policy = m.Policy
	}
	return row
}

func usToDuration(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

func (row *parquetRow) record() Record {
	r := Record{
		ID:           row.ID,
		Arrival:      usToDuration(row.ArrivalUs),
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
	if row.Measured {
		r.Measured = &Measured{
			Tenant:                row.Tenant,
			Queue:                 usToDuration(row.QueueUs),
			TTFT:                  usToDuration(row.TTFTUs),
			TPOT:                  usToDuration(row.TPOTUs),
			E2E:                   usToDuration(row.E2EUs),
			Replica:               row.Replica,
			Outcome:               row.Outcome,
			CachedTokens:          int(row.CachedTokens),
			PredictedCachedTokens: int(row.PredictedCachedTokens),
			Policy:                row.Policy,
		}
	}
	return r
}

// rowError is what is wrong with a row read back beyond Record.Validate:
// microsecond values too large for a time.Duration, measured columns on a
// row that says it has none.
func (row *parquetRow) rowError() error {
	for _, v := range []struct {
		name string
		us   int64
	}{{"arrival", row.ArrivalUs}, {"queue", row.QueueUs}, {"ttft", row.TTFTUs}, {"tpot", row.TPOTUs}, {"e2e", row.E2EUs}} {
		if v.us > maxArrivalUs || v.us < -maxArrivalUs {
			return fmt.Errorf("%w: %s %d us overflows a time.Duration", ErrBadRecord, v.name, v.us)
		}
	}
	if !row.Measured && (row.Tenant != 0 || row.QueueUs != 0 || row.TTFTUs != 0 || row.TPOTUs != 0 || row.E2EUs != 0 ||
		row.Replica != "" || row.Outcome != "" || row.CachedTokens != 0 || row.PredictedCachedTokens != 0 || row.Policy != "") {
		return fmt.Errorf("%w: measured columns set on a row whose measured column is false", ErrBadRecord)
	}
	return nil
}

// Validate checks a recorded request's measurements: durations not
// negative, cached tokens -1 (unknown) or more, predicted cached tokens not
// negative, and an outcome. Writers of parquet traces refuse, and readers
// report, a record whose Measured fails it.
func (m *Measured) Validate() error {
	switch {
	case m.Queue < 0 || m.TTFT < 0 || m.TPOT < 0 || m.E2E < 0:
		return fmt.Errorf("%w: negative measured duration (queue %v, ttft %v, tpot %v, e2e %v)", ErrBadRecord, m.Queue, m.TTFT, m.TPOT, m.E2E)
	case m.CachedTokens < -1:
		return fmt.Errorf("%w: cached tokens %d (want -1 for unknown, or more)", ErrBadRecord, m.CachedTokens)
	case m.PredictedCachedTokens < 0:
		return fmt.Errorf("%w: predicted cached tokens %d must not be negative", ErrBadRecord, m.PredictedCachedTokens)
	case m.Outcome == "":
		return fmt.Errorf("%w: a measured request needs an outcome (\"ok\" or a failure reason)", ErrBadRecord)
	}
	return nil
}

// validRecord is Record.Validate plus Measured.Validate.
func validRecord(r *Record) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if r.Measured != nil {
		return r.Measured.Validate()
	}
	return nil
}

// ParquetWriterOptions configure a ParquetWriter.
type ParquetWriterOptions struct {
	// Metadata is added to the file's key-value metadata (every part's and
	// the whole file's footer). It may not set ParquetVersionKey, which the
	// writer sets.
	Metadata map[string]string
	// RowGroupRows is the most records per row group; 0 means
	// ParquetRowGroupSize. Flush ends a row group sooner.
	RowGroupRows int
}

// parquetPartKey is the metadata entry of each part's own footer (the
// part's number), which the whole file's footer does not have: a file cut
// exactly after a part reads as that part alone, and this says it is one.
const parquetPartKey = "inferrail.trace.part"

// maxPartFooter bounds one part's footer (its schema, one row group's
// metadata and the key-value metadata), so that a reader of a truncated
// file never decodes a large footer.
const maxPartFooter = 1 << 20

// checkpointLen is the length of a checkpoint record.
const checkpointLen = 28

var checkpointMagic = [4]byte{'I', 'R', 'C', 'K'}

// ParquetWriter writes records as a parquet trace (see ParquetVersion for the
// schema and the layout). It buffers at most one row group in memory; every
// row group written (by Flush, or when it is full) is readable from the
// bytes written so far, even if the file is never closed. Close must be
// called to complete the file. The same records (and options) always
// produce the same bytes.
type ParquetWriter struct {
	out      countingWriter
	meta     map[string]string
	rgRows   int
	part     *parquet.GenericWriter[parquetRow] // the row group being written; nil between
	start    int64                              // where part began
	inGroup  int                                // records in part
	batch    []parquetRow
	parts    int
	groups   []format.RowGroup
	schema   []format.SchemaElement
	orders   []format.ColumnOrder
	rows     int64
	closed   bool
	err      error // sticky: the output failed
	buffered int64 // estimated bytes of the records in part
}

// countingWriter counts the bytes written through it and keeps the last 8.
type countingWriter struct {
	w    io.Writer
	n    int64
	tail [8]byte
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if n > 0 {
		if n >= 8 {
			copy(c.tail[:], p[n-8:n])
		} else {
			copy(c.tail[:], c.tail[n:])
			copy(c.tail[8-n:], p[:n])
		}
	}
	c.n += int64(n)
	return n, err
}

// NewParquetWriter starts a parquet trace on w with the default options. It
// does not close w.
func NewParquetWriter(w io.Writer) (*ParquetWriter, error) {
	return NewParquetWriterOptions(w, ParquetWriterOptions{})
}

// NewParquetWriterOptions starts a parquet trace on w with o. It does not
// close w.
func NewParquetWriterOptions(w io.Writer, o ParquetWriterOptions) (*ParquetWriter, error) {
	if w == nil {
		return nil, errors.New("new parquet writer: nil io.Writer")
	}
	for _, k := range []string{ParquetVersionKey, parquetPartKey} {
		if _, ok := o.Metadata[k]; ok {
			return nil, fmt.Errorf("new parquet writer: metadata may not set %s (the writer sets it)", k)
		}
	}
	if o.RowGroupRows < 0 || o.RowGroupRows > math.MaxInt32 {
		return nil, fmt.Errorf("new parquet writer: row group rows %d out of range", o.RowGroupRows)
	}
	rg := o.RowGroupRows
	if rg == 0 {
		rg = ParquetRowGroupSize
	}
	meta := make(map[string]string, len(o.Metadata)+1)
	for k, v := range o.Metadata {
		meta[k] = v
	}
	meta[ParquetVersionKey] = ParquetVersion
	return &ParquetWriter{out: countingWriter{w: w}, meta: meta, rgRows: rg, batch: make([]parquetRow, 0, min(parquetBatch, rg))}, nil
}

// Write appends a record. It refuses a record that fails Validate (or whose
// Measured fails Measured.Validate; the error wraps ErrBadRecord), so that
// files hold valid records only. Arrival and the measured durations are
// truncated to the microsecond.
func (w *ParquetWriter) Write(r Record) error {
	if w.closed {
		return errors.New("write parquet trace: writer closed")
	}
	if w.err != nil {
		return w.err
	}
	if err := validRecord(&r); err != nil {
		return fmt.Errorf("write parquet trace: record %d: %w", r.ID, err)
	}
	if w.part == nil {
		if w.parts >= parquet.MaxRowGroups {
			return fmt.Errorf("write parquet trace: a file holds at most %d row groups", parquet.MaxRowGroups)
		}
		w.startPart()
	}
	w.batch = append(w.batch, rowOf(&r))
	w.inGroup++
	w.buffered += recordBytes(&r)
	if len(w.batch) == cap(w.batch) {
		if err := w.flushBatch(); err != nil {
			return err
		}
	}
	if w.inGroup >= w.rgRows {
		return w.endPart()
	}
	return nil
}

// recordBytes estimates a record's bytes in a file (before compression).
func recordBytes(r *Record) int64 {
	n := 16*8 + len(r.Model) + 8*len(r.HashIDs)
	if m := r.Measured; m != nil {
		n += 10*8 + len(m.Replica) + len(m.Outcome) + len(m.Policy)
	}
	return int64(n)
}

// sortedMeta is w's key-value metadata as parquet-go writer options, in key
// order.
func (w *ParquetWriter) metaOptions() []parquet.WriterOption {
	keys := make([]string, 0, len(w.meta))
	for k := range w.meta {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	opts := make([]parquet.WriterOption, 0, len(keys)+4)
	opts = append(opts, &parquet.WriterConfig{CreatedBy: parquetCreatedBy}, parquet.Compression(&parquet.Snappy), parquet.MaxRowsPerRowGroup(int64(w.rgRows)))
	for _, k := range keys {
		opts = append(opts, parquet.KeyValueMetadata(k, w.meta[k]))
	}
	return opts
}

func (w *ParquetWriter) startPart() {
	w.start = w.out.n
	opts := append(w.metaOptions(), parquet.KeyValueMetadata(parquetPartKey, strconv.Itoa(w.parts)))
	w.part = parquet.NewGenericWriter[parquetRow](&w.out, opts...)
	w.inGroup, w.buffered = 0, 0
}

func (w *ParquetWriter) flushBatch() error {
	if len(w.batch) == 0 {
		return nil
	}
	_, err := w.part.Write(w.batch)
	clear(w.batch) // drop references to the records' hash ids
	w.batch = w.batch[:0]
	if err != nil {
		return w.fail(err)
	}
	return nil
}

func (w *ParquetWriter) fail(err error) error {
	w.err = fmt.Errorf("write parquet trace: %w", err)
	return w.err
}

// endPart completes the part being written (its row group, page index and
// footer) and its checkpoint, and keeps its row group's metadata, moved to
// the part's offset, for the file's footer.
func (w *ParquetWriter) endPart() error {
	if w.part == nil {
		return nil
	}
	if err := w.flushBatch(); err != nil {
		return err
	}
	pw := w.part
	w.part = nil
	if err := pw.Close(); err != nil {
		return w.fail(err)
	}
	if n := int64(binary.LittleEndian.Uint32(w.out.tail[:4])); n > maxPartFooter {
		return w.fail(fmt.Errorf("a row group's footer of %d bytes exceeds %d (too much key-value metadata)", n, maxPartFooter))
	}
	md := pw.File().Metadata()
	w.keepSchema(md)
	for _, rg := range md.RowGroups {
		shiftRowGroup(&rg, w.start, len(w.groups))
		w.groups = append(w.groups, rg)
		w.rows += rg.NumRows
	}
	var ck [checkpointLen]byte
	copy(ck[:4], checkpointMagic[:])
	binary.LittleEndian.PutUint32(ck[4:], uint32(w.parts))
	binary.LittleEndian.PutUint64(ck[8:], uint64(w.start))
	binary.LittleEndian.PutUint64(ck[16:], uint64(w.out.n))
	binary.LittleEndian.PutUint32(ck[24:], crc32c(ck[:24]))
	if _, err := w.out.Write(ck[:]); err != nil {
		return w.fail(err)
	}
	w.parts++
	w.inGroup, w.buffered = 0, 0
	return nil
}

func (w *ParquetWriter) keepSchema(md *format.FileMetaData) {
	if w.schema == nil {
		w.schema = slices.Clone(md.Schema)
		w.orders = slices.Clone(md.ColumnOrders)
	}
}

// shiftRowGroup moves a row group's offsets by `by` bytes (a part's offset
// in the file) and drops its page index, which the whole file's footer
// does not reference.
func shiftRowGroup(rg *format.RowGroup, by int64, ordinal int) {
	rg.FileOffset += by
	rg.Ordinal = int16(ordinal)
	cols := make([]format.ColumnChunk, len(rg.Columns))
	copy(cols, rg.Columns)
	for i := range cols {
		c := &cols[i]
		if c.FileOffset != 0 {
			c.FileOffset += by
		}
		m := &c.MetaData
		m.DataPageOffset += by
		for _, off := range []*int64{&m.IndexPageOffset, &m.DictionaryPageOffset, &m.BloomFilterOffset} {
			if *off != 0 {
				*off += by
			}
		}
		c.OffsetIndexOffset, c.OffsetIndexLength, c.ColumnIndexOffset, c.ColumnIndexLength = 0, 0, 0, 0
	}
	rg.Columns = cols
}

// Flush ends the current row group: every record written so far becomes
// readable from the bytes written so far (a checkpoint). It does nothing
// when no record is buffered.
func (w *ParquetWriter) Flush() error {
	if w.closed {
		return errors.New("flush parquet trace: writer closed")
	}
	if w.err != nil {
		return w.err
	}
	return w.endPart()
}

// Size is the number of bytes written to the output so far.
func (w *ParquetWriter) Size() int64 { return w.out.n }

// Buffered is the number of records in the current row group (not yet
// written out), and an estimate of their bytes in the file before
// compression.
func (w *ParquetWriter) Buffered() (records int, bytes int64) { return w.inGroup, w.buffered }

// Rows is the number of records in the row groups written out so far.
func (w *ParquetWriter) Rows() int64 { return w.rows }

// SetMetadata sets a key-value metadata entry of the row groups started
// from now on and of the whole file's footer (the recorder adds counts
// known only at the end). It may not set ParquetVersionKey.
func (w *ParquetWriter) SetMetadata(key, value string) error {
	if key == ParquetVersionKey || key == parquetPartKey {
		return fmt.Errorf("set parquet trace metadata: %s is the writer's", key)
	}
	w.meta[key] = value
	return nil
}

// Close writes the buffered records and the file's footer. It does not close
// the underlying io.Writer. Calling Close again returns nil (or the first
// Close's error).
func (w *ParquetWriter) Close() error {
	if w.closed {
		return w.err
	}
	w.closed = true
	if w.err != nil {
		return w.err
	}
	if err := w.endPart(); err != nil {
		return err
	}
	if w.parts == 0 {
		// No row group: the file is its magic and its footer, with the
		// schema an empty parquet-go file of the same type has.
		empty := parquet.NewGenericWriter[parquetRow](io.Discard, w.metaOptions()...)
		if err := empty.Close(); err != nil {
			return w.fail(err)
		}
		w.keepSchema(empty.File().Metadata())
		if _, err := w.out.Write([]byte("PAR1")); err != nil {
			return w.fail(err)
		}
	}
	keys := make([]string, 0, len(w.meta))
	for k := range w.meta {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	kv := make([]format.KeyValue, len(keys))
	for i, k := range keys {
		kv[i] = format.KeyValue{Key: k, Value: w.meta[k]}
	}
	fmd := format.FileMetaData{
		Version: 2, Schema: w.schema, NumRows: w.rows, RowGroups: w.groups,
		KeyValueMetadata: kv, CreatedBy: parquetCreatedBy, ColumnOrders: w.orders,
	}
	b, err := thrift.Marshal(new(thrift.CompactProtocol), &fmd)
	if err != nil {
		return w.fail(fmt.Errorf("encode footer: %w", err))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(b)))
	b = append(b, "PAR1"...)
	if _, err := w.out.Write(b); err != nil {
		return w.fail(err)
	}
	w.groups = nil
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
	path     string
	opts     Options
	f        *os.File
	groups   []parquet.RowGroup
	measured bool // the file has the measured columns
	// loadOnly marks the row groups whose every row's measured column is
	// false (by its statistics): they are read by their load columns only.
	loadOnly []bool
	meta     map[string]string
	trunc    *TruncatedError
	group    int // index of the next row group to open
	rg       *parquet.GenericReader[parquetRow]
	rgLoad   *parquet.GenericReader[parquetLoadRow] // a file without the measured columns
	buf      []parquetRow
	loadBuf  []parquetLoadRow
	pos      int // next row of buf
	row      int // 1-based number of the last row returned or skipped
	skipped  int
	err      error // sticky error (io.EOF at the end)
}

// NewParquet opens the parquet trace at path. It refuses a file whose
// ParquetVersionKey metadata is missing or other than ParquetVersion, or
// which lacks a load column or some of the measured columns (a version 1
// file without any of them reads with Measured nil). Records that fail
// Validate (or Measured.Validate) are errors (a *LineError whose Line is the
// 1-based row number, wrapping ErrBadRecord) or, with opts.SkipBad, counted
// by Skipped. opts.Model fills the model of records that name none. Close
// releases the file.
//
// A file cut short (no footer at its end) is read up to its last complete
// row group (see the layout): Next returns those records, then a
// *TruncatedError (wrapping ErrTruncated) saying what could not be read,
// where a whole file returns io.EOF; with opts.SkipBad it returns io.EOF and
// the loss is reported by Truncated only.
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

// parquetFileOptions are how this package opens parquet files: it uses
// neither bloom filters nor the page index.
var parquetFileOptions = []parquet.FileOption{parquet.SkipBloomFilters(true), parquet.SkipPageIndex(true)}

func newParquetReader(f *os.File, path string, opts Options) (*ParquetReader, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("open parquet trace %s: %w", path, err)
	}
	files, trunc, err := openParts(f, st.Size(), path)
	if err != nil {
		return nil, err
	}
	r := &ParquetReader{path: path, opts: opts, f: f, trunc: trunc}
	for i, pf := range files {
		measured, err := checkSchema(pf, path)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			r.measured = measured
		} else if measured != r.measured {
			return nil, fmt.Errorf("open parquet trace %s: its row groups disagree on the measured columns", path)
		}
		for _, g := range pf.RowGroups() {
			r.groups = append(r.groups, g)
			r.loadOnly = append(r.loadOnly, !measured || noneMeasured(g))
		}
	}
	r.meta = fileMeta(files[len(files)-1])
	r.buf = make([]parquetRow, 0, parquetBatch)
	if slices.Contains(r.loadOnly, true) {
		r.loadBuf = make([]parquetLoadRow, parquetBatch)
	}
	if trunc != nil {
		trunc.RowGroups = len(r.groups)
		for _, g := range r.groups {
			trunc.Rows += g.NumRows()
		}
	}
	return r, nil
}

// checkSchema checks a file's version and columns, and reports whether it
// has the measured columns.
func checkSchema(pf *parquet.File, path string) (measured bool, err error) {
	v, ok := pf.Lookup(ParquetVersionKey)
	if !ok {
		return false, fmt.Errorf("open parquet trace %s: no %q metadata: not an inferrail trace", path, ParquetVersionKey)
	}
	if v != ParquetVersion {
		return false, fmt.Errorf("open parquet trace %s: unsupported trace version %q (this build reads version %q)", path, v, ParquetVersion)
	}
	load := parquet.SchemaOf(parquetLoadRow{})
	for _, col := range load.Columns() {
		if _, ok := pf.Schema().Lookup(col...); !ok {
			return false, fmt.Errorf("open parquet trace %s: version %s file lacks column %q", path, v, col)
		}
	}
	var have, lack []string
	for _, col := range parquet.SchemaOf(parquetRow{}).Columns() {
		if _, ok := load.Lookup(col...); ok {
			continue
		}
		if _, ok := pf.Schema().Lookup(col...); ok {
			have = append(have, col[0])
		} else {
			lack = append(lack, col[0])
		}
	}
	if len(have) > 0 && len(lack) > 0 {
		return false, fmt.Errorf("open parquet trace %s: version %s file has some of the measured columns but lacks %q", path, v, lack)
	}
	return len(have) > 0, nil
}

// noneMeasured reports whether a row group's statistics say that none of its
// rows has measurements (its measured column's maximum is false).
func noneMeasured(g parquet.RowGroup) bool {
	col, ok := g.Schema().Lookup("measured")
	if !ok {
		return true
	}
	b, ok := g.ColumnChunks()[col.ColumnIndex].(interface {
		Bounds() (min, max parquet.Value, ok bool)
	})
	if !ok {
		return false
	}
	_, hi, ok := b.Bounds()
	return ok && !hi.Boolean()
}

func fileMeta(pf *parquet.File) map[string]string {
	kv := pf.Metadata().KeyValueMetadata
	m := make(map[string]string, len(kv))
	for _, e := range kv {
		if e.Key != parquetPartKey {
			m[e.Key] = e.Value
		}
	}
	return m
}

// Metadata returns the file's key-value metadata (of its last complete
// row group when it is truncated). The caller must not modify it.
func (r *ParquetReader) Metadata() map[string]string { return r.meta }

// Truncated reports what a truncated file lost; nil for a whole file.
func (r *ParquetReader) Truncated() *TruncatedError { return r.trunc }

// Next returns the next record, or io.EOF after the last one (a
// *TruncatedError after the last one of a truncated file, without
// Options.SkipBad).
func (r *ParquetReader) Next() (Record, error) {
	for {
		if r.err != nil {
			return Record{}, r.err
		}
		if r.pos >= len(r.buf) || (r.rg == nil && r.rgLoad == nil) {
			if err := r.fill(); err != nil {
				if errors.Is(err, io.EOF) && r.trunc != nil && !r.opts.SkipBad {
					r.err = io.EOF // after the report
					return Record{}, r.trunc
				}
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
		err := validRecord(&rec)
		if err == nil {
			err = row.rowError()
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
		if r.rg == nil && r.rgLoad == nil {
			if r.group >= len(r.groups) {
				return io.EOF
			}
			if r.loadOnly[r.group] {
				r.rgLoad = parquet.NewGenericRowGroupReader[parquetLoadRow](r.groups[r.group])
			} else {
				r.rg = parquet.NewGenericRowGroupReader[parquetRow](r.groups[r.group])
			}
			r.group++
		}
		n, err := r.read()
		if n > 0 {
			r.pos = 0
			return nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read parquet trace %s: row group %d: %w", r.path, r.group-1, err)
		}
		// The row group is done: release it and open the next one.
		if cerr := r.closeGroup(); cerr != nil {
			return fmt.Errorf("read parquet trace %s: row group %d: %w", r.path, r.group-1, cerr)
		}
	}
}

// read reads the next rows of the open row group into buf.
func (r *ParquetReader) read() (int, error) {
	if r.rg != nil {
		buf := r.buf[:cap(r.buf)]
		clear(buf)
		n, err := r.rg.Read(buf)
		r.buf = buf[:n]
		return n, err
	}
	lb := r.loadBuf[:cap(r.loadBuf)]
	clear(lb)
	n, err := r.rgLoad.Read(lb)
	r.buf = r.buf[:n]
	for i := range n {
		r.buf[i] = parquetRow{parquetLoadRow: lb[i]}
	}
	clear(lb[:n]) // buf owns the hash ids now
	return n, err
}

func (r *ParquetReader) closeGroup() error {
	var err error
	if r.rg != nil {
		err = r.rg.Close()
	}
	if r.rgLoad != nil {
		err = r.rgLoad.Close()
	}
	r.rg, r.rgLoad = nil, nil
	r.buf = r.buf[:0]
	return err
}

// Skipped returns how many invalid records were skipped (only with
// Options.SkipBad).
func (r *ParquetReader) Skipped() int { return r.skipped }

// Close releases the file. Next returns an error afterwards.
func (r *ParquetReader) Close() error {
	if r.f == nil {
		return nil
	}
	err := r.closeGroup()
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
