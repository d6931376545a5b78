package results

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/parquet-go/parquet-go"
)

// Row is one request as a flat table row, the schema of the per-request
// parquet files. Times are integer microseconds since the start of the run
// (truncated); the derived latencies are float milliseconds computed at full
// precision, and 0 where undefined. Workload, Policy and Seed identify the
// run, so that several runs can share one file.
//
// Reject, Priority and Tenant, then RateLimit and RetryAfterMs, then
// FailReason were added after the first files were written: ReadParquet
// reads files without those columns, with zero values in them (a file
// without fail_reason reads "" there even for a failed request). New
// columns go at the end, and a column is never removed or given another
// meaning.
//
// A file holds row groups of at most ParquetRowGroup rows, so that a
// writer holds one group at a time (ParquetWriter).
type Row struct {
	Workload string `parquet:"workload,dict"`
	Policy   string `parquet:"policy,dict"`
	// Seed is the run's seed; seeds of 2^63 and above keep their bits and
	// read as negative.
	Seed int64 `parquet:"seed"`
	// RateRPS and FleetSize are the run's offered load and replica count
	// (set by comparisons, whose runs differ in them; 0 otherwise).
	RateRPS   float64 `parquet:"rate_rps"`
	FleetSize int32   `parquet:"fleet_size"`

	ID      uint64 `parquet:"id"`
	Session uint64 `parquet:"session"`
	Turn    int32  `parquet:"turn"`
	Replica int32  `parquet:"replica"` // -1 if never dispatched

	ArrivalUs     int64 `parquet:"arrival_us"`
	DispatchUs    int64 `parquet:"dispatch_us"`
	FirstTokenUs  int64 `parquet:"first_token_us"`
	EndUs         int64 `parquet:"end_us"`
	HasFirstToken bool  `parquet:"has_first_token"`

	TTFTMs  float64 `parquet:"ttft_ms"`  // 0 without a first token
	TPOTMs  float64 `parquet:"tpot_ms"`  // 0 where TPOT is undefined
	E2EMs   float64 `parquet:"e2e_ms"`   // 0 unless the outcome is ok
	QueueMs float64 `parquet:"queue_ms"` // 0 if never dispatched (or rejected)

	PromptTokens          int64 `parquet:"prompt_tokens"`
	CachedTokens          int64 `parquet:"cached_tokens"`
	PredictedCachedTokens int64 `parquet:"predicted_cached_tokens"`
	OutputTokens          int64 `parquet:"output_tokens"`
	Preemptions           int32 `parquet:"preemptions"`

	Outcome string `parquet:"outcome,dict"`
	Reject  string `parquet:"reject,dict"` // Record.Reject: "" unless the outcome is rejected

	Priority int32  `parquet:"priority"`
	Tenant   string `parquet:"tenant,dict"`

	// RateLimit and RetryAfterMs are Record.RateLimit and Record.RetryAfter
	// (float ms, 0 when there was none).
	RateLimit    string  `parquet:"rate_limit,dict"`
	RetryAfterMs float64 `parquet:"retry_after_ms"`

	// FailReason is why the request did not complete, the key
	// Summary.FailedBy counts it under: a rejection's Record.Reject
	// (queue_full, rate_limited, ...; "unknown" when empty), an engine
	// failure's Record.Fail (too_long, too_large, ...), else its outcome
	// (failed, aborted); "" for a completed request. Grouping a file's
	// rows by it gives failed_by.
	FailReason string `parquet:"fail_reason,dict"`
}

// RowsFromRecords converts records to rows tagged with the run's workload,
// policy and seed, in the same order.
func RowsFromRecords(recs []Record, workload, policy string, seed uint64) []Row {
	rows := make([]Row, len(recs))
	for i := range recs {
		rows[i] = RowFromRecord(&recs[i], workload, policy, seed)
	}
	return rows
}

// RowFromRecord converts one record to a row tagged with the run's
// workload, policy and seed.
func RowFromRecord(r *Record, workload, policy string, seed uint64) Row {
	row := Row{
		Workload:              workload,
		Policy:                policy,
		Seed:                  int64(seed),
		ID:                    r.ID,
		Session:               r.Session,
		Turn:                  int32(r.Turn),
		Replica:               int32(r.Replica),
		ArrivalUs:             r.Arrival.Microseconds(),
		DispatchUs:            r.Dispatch.Microseconds(),
		FirstTokenUs:          r.FirstToken.Microseconds(),
		EndUs:                 r.End.Microseconds(),
		HasFirstToken:         r.HasFirstToken,
		PromptTokens:          int64(r.PromptTokens),
		CachedTokens:          int64(r.CachedTokens),
		PredictedCachedTokens: int64(r.PredictedCachedTokens),
		OutputTokens:          int64(r.OutputTokens),
		Preemptions:           int32(r.Preemptions),
		Outcome:               string(r.Outcome),
		Reject:                r.Reject,
		Priority:              int32(r.Priority),
		Tenant:                r.Tenant,
		RateLimit:             r.RateLimit,
		RetryAfterMs:          durMs(r.RetryAfter),
		FailReason:            r.failReason(),
	}
	if r.HasFirstToken {
		row.TTFTMs = durMs(r.TTFT())
	}
	if tp, ok := r.TPOT(); ok {
		row.TPOTMs = durMs(tp)
	}
	if r.Outcome == OutcomeOK {
		row.E2EMs = durMs(r.E2E())
	}
	if r.dispatched() {
		row.QueueMs = durMs(r.Queue())
	}
	return row
}

// parquetCreatedBy pins the file's created_by metadata, which parquet-go
// otherwise derives from the binary's build information, so that output is
// byte-identical across builds.
const parquetCreatedBy = "github.com/inferrail/inferrail/results"

// ParquetRowGroup is the most rows a row group of a per-request file holds.
const ParquetRowGroup = 1 << 16

// ParquetWriter writes rows to a parquet file as they come, one row group
// of ParquetRowGroup rows at a time, so that a run of millions of requests
// streams its table instead of holding it. The same rows give the same
// bytes however they are handed to Write, and the same as WriteParquet.
type ParquetWriter struct {
	pw  *parquet.GenericWriter[Row]
	buf []Row
	err error
}

// NewParquetWriter returns a writer of a snappy-compressed parquet file
// to w; Close finishes the file.
func NewParquetWriter(w io.Writer) *ParquetWriter {
	return &ParquetWriter{pw: parquet.NewGenericWriter[Row](w,
		&parquet.WriterConfig{CreatedBy: parquetCreatedBy},
		parquet.Compression(&parquet.Snappy),
	)}
}

// Write adds rows to the file, writing a row group whenever
// ParquetRowGroup rows are waiting. After an error every call returns it.
func (w *ParquetWriter) Write(rows ...Row) error {
	for len(rows) > 0 && w.err == nil {
		n := min(len(rows), ParquetRowGroup-len(w.buf))
		w.buf = append(w.buf, rows[:n]...)
		rows = rows[n:]
		if len(w.buf) == ParquetRowGroup {
			w.err = w.flush()
		}
	}
	return w.err
}

// flush writes the waiting rows as one row group.
func (w *ParquetWriter) flush() error {
	if _, err := w.pw.Write(w.buf); err != nil {
		return fmt.Errorf("write parquet rows: %w", err)
	}
	if err := w.pw.Flush(); err != nil {
		return fmt.Errorf("write parquet row group: %w", err)
	}
	w.buf = w.buf[:0]
	return nil
}

// Close writes the rows still waiting and the file's footer. It does not
// close the underlying writer.
func (w *ParquetWriter) Close() error {
	if w.err != nil {
		return w.err
	}
	if len(w.buf) > 0 {
		if _, err := w.pw.Write(w.buf); err != nil {
			w.err = fmt.Errorf("write parquet rows: %w", err)
			return w.err
		}
	}
	if err := w.pw.Close(); err != nil {
		w.err = fmt.Errorf("write parquet: %w", err)
		return w.err
	}
	w.err = errors.New("write parquet: writer closed")
	return nil
}

// WriteParquet writes rows to w as a snappy-compressed parquet file, as a
// ParquetWriter does.
func WriteParquet(w io.Writer, rows []Row) error {
	pw := NewParquetWriter(w)
	if err := pw.Write(rows...); err != nil {
		return err
	}
	return pw.Close()
}

// WriteParquetFile writes rows (see WriteParquet) to the file at path,
// creating or truncating it.
func WriteParquetFile(path string, rows []Row) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write parquet file: %w", err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("write parquet file: %w", cerr)
		}
	}()
	if err := WriteParquet(f, rows); err != nil {
		return fmt.Errorf("write parquet file %s: %w", path, err)
	}
	return nil
}

// ReadParquet reads every row of the parquet file of the given size in r.
func ReadParquet(r io.ReaderAt, size int64) ([]Row, error) {
	f, err := parquet.OpenFile(r, size)
	if err != nil {
		return nil, fmt.Errorf("read parquet: %w", err)
	}
	rows := make([]Row, f.NumRows())
	pr := parquet.NewGenericReader[Row](f)
	defer pr.Close()
	n := 0
	for n < len(rows) {
		k, err := pr.Read(rows[n:])
		n += k
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read parquet rows: %w", err)
		}
		if k == 0 {
			break
		}
	}
	if n != len(rows) {
		return nil, fmt.Errorf("read parquet: got %d rows, file has %d", n, len(rows))
	}
	return rows, nil
}
