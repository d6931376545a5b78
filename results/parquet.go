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
// Reject, Priority and Tenant, then RateLimit and RetryAfterMs, were added
// after the first files were written: ReadParquet reads files without those
// columns, with zero values in them.
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
}

// RowsFromRecords converts records to rows tagged with the run's workload,
// policy and seed, in the same order.
func RowsFromRecords(recs []Record, workload, policy string, seed uint64) []Row {
	rows := make([]Row, len(recs))
	for i := range recs {
		r := &recs[i]
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
		rows[i] = row
	}
	return rows
}

// parquetCreatedBy pins the file's created_by metadata, which parquet-go
// otherwise derives from the binary's build information, so that output is
// byte-identical across builds.
const parquetCreatedBy = "github.com/inferrail/inferrail/results"

// WriteParquet writes rows to w as a snappy-compressed parquet file.
func WriteParquet(w io.Writer, rows []Row) error {
	pw := parquet.NewGenericWriter[Row](w,
		&parquet.WriterConfig{CreatedBy: parquetCreatedBy},
		parquet.Compression(&parquet.Snappy),
	)
	if _, err := pw.Write(rows); err != nil {
		return fmt.Errorf("write parquet rows: %w", err)
	}
	if err := pw.Close(); err != nil {
		return fmt.Errorf("write parquet: %w", err)
	}
	return nil
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
