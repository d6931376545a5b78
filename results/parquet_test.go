package results

import (
	"bytes"
	"io"
	"os"
	"reflect"
	"testing"

	"github.com/parquet-go/parquet-go"
)

func TestParquetRoundTrip(t *testing.T) {
	var rows []Row
	rows = append(rows, RowsFromRecords(handRecords(), "chat", "round-robin", 1)...)
	rows = append(rows, RowsFromRecords(syntheticRecords(3000, 4), "agentic", "prefix-aware", 1<<63+5)...)
	rows = append(rows, RowsFromRecords(handRejected(), "chat", "round-robin", 2)...)
	rows = append(rows, RowsFromRecords(classRecords(), "classes", "round-robin", 3)...)
	// The new columns are really exercised: rejections with their reasons,
	// non-zero priorities (negative too) and tenants.
	rows[0].Priority, rows[0].Tenant = -2, "batch"
	var rejects, prios, tenants int
	for _, r := range rows {
		if r.Reject != "" {
			rejects++
		}
		if r.Priority != 0 {
			prios++
		}
		if r.Tenant != "" {
			tenants++
		}
	}
	if rejects < 10 || prios < 10 || tenants < 10 {
		t.Fatalf("too few rows with a reject (%d), a priority (%d) or a tenant (%d)", rejects, prios, tenants)
	}

	var buf bytes.Buffer
	if err := WriteParquet(&buf, rows); err != nil {
		t.Fatal(err)
	}
	got, err := ReadParquet(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rows) {
		t.Fatalf("round trip differs: got %d rows, want %d", len(got), len(rows))
	}

	var again bytes.Buffer
	if err := WriteParquet(&again, rows); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("writing the same rows twice gave different bytes")
	}

	// Through a file, and an empty table.
	path := t.TempDir() + "/rows.parquet"
	if err := WriteParquetFile(path, rows[:0]); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	empty, err := ReadParquet(bytes.NewReader(data), int64(len(data)))
	if err != nil || len(empty) != 0 {
		t.Fatalf("empty round trip: %d rows, %v", len(empty), err)
	}

	if _, err := ReadParquet(bytes.NewReader([]byte("not parquet")), 11); err == nil {
		t.Error("want an error reading garbage")
	}
}

func TestRowsFromRecords(t *testing.T) {
	rows := RowsFromRecords(handRecords(), "chat", "rr", 9)
	r1 := rows[1]
	want := Row{
		Workload: "chat", Policy: "rr", Seed: 9, ID: 1, Replica: 0,
		ArrivalUs: 1e6, DispatchUs: 1.1e6, FirstTokenUs: 1.5e6, EndUs: 3.5e6, HasFirstToken: true,
		TTFTMs: 500, TPOTMs: 100, E2EMs: 2500, QueueMs: 100,
		PromptTokens: 100, CachedTokens: 50, PredictedCachedTokens: 40, OutputTokens: 21, Preemptions: 1,
		Outcome: "ok",
	}
	if r1 != want {
		t.Errorf("row 1 = %+v\nwant    %+v", r1, want)
	}
	// Failed, never dispatched: derived latencies are zero.
	if r5 := rows[5]; r5.Replica != -1 || r5.TTFTMs != 0 || r5.E2EMs != 0 || r5.TPOTMs != 0 || r5.QueueMs != 0 || r5.Outcome != "failed" {
		t.Errorf("row 5 = %+v", r5)
	}
	// Aborted with a first token: TTFT only.
	if r6 := rows[6]; r6.TTFTMs != 1000 || r6.E2EMs != 0 || r6.TPOTMs != 0 {
		t.Errorf("row 6 = %+v", r6)
	}
	for _, r := range rows {
		if r.Reject != "" || r.Priority != 0 || r.Tenant != "" {
			t.Errorf("row %d has a reject, priority or tenant: %+v", r.ID, r)
		}
	}

	// Rejected: the reason is kept, and the queue is 0 even with a replica
	// and a dispatch time, as in Summarize.
	rej := RowsFromRecords(handRejected(), "chat", "rr", 9)
	if r := rej[0]; r.Outcome != "rejected" || r.Reject != "queue_timeout" || r.Replica != 0 || r.DispatchUs != 60e6 || r.QueueMs != 0 {
		t.Errorf("rejected row 0 = %+v", r)
	}
	if r := rej[3]; r.Outcome != "rejected" || r.Reject != "" {
		t.Errorf("rejected row 3 = %+v, want no reason", r)
	}
	cls := RowsFromRecords(classRecords(), "c", "rr", 9)
	if r := cls[0]; r.Priority != 5 || r.Tenant != "gold" || r.QueueMs != 100 {
		t.Errorf("class row 0 = %+v", r)
	}
}

// testdata/requests_v0.parquet was written by WriteParquet before Row had
// the reject, priority and tenant columns, from handRecords.
func TestReadParquetWithoutNewColumns(t *testing.T) {
	data, err := os.ReadFile("testdata/requests_v0.parquet")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parquet.OpenFile(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	for _, col := range []string{"reject", "priority", "tenant", "fail_reason"} {
		if _, ok := f.Schema().Lookup(col); ok {
			t.Fatalf("the old file has a %s column", col)
		}
	}
	if _, ok := f.Schema().Lookup("outcome"); !ok {
		t.Fatal("the old file has no outcome column")
	}

	got, err := ReadParquet(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	want := RowsFromRecords(handRecords(), "chat", "round-robin", 1)
	for i := range want {
		want[i].Reject, want[i].Priority, want[i].Tenant, want[i].FailReason = "", 0, "", ""
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("old file:\n got %+v\nwant %+v", got, want)
	}
}

// testdata/requests_v1.parquet was written by WriteParquet before Row had
// the fail_reason column, from handRecords, handRejected and tenantRecords
// (workloads chat, chat and tenants, seeds 1, 2 and 3).
func TestReadParquetWithoutFailReason(t *testing.T) {
	data, err := os.ReadFile("testdata/requests_v1.parquet")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parquet.OpenFile(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Schema().Lookup("fail_reason"); ok {
		t.Fatal("the old file has a fail_reason column")
	}
	if _, ok := f.Schema().Lookup("retry_after_ms"); !ok {
		t.Fatal("the old file has no retry_after_ms column")
	}
	got, err := ReadParquet(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	var want []Row
	want = append(want, RowsFromRecords(handRecords(), "chat", "round-robin", 1)...)
	want = append(want, RowsFromRecords(handRejected(), "chat", "round-robin", 2)...)
	want = append(want, RowsFromRecords(tenantRecords(), "tenants", "round-robin", 3)...)
	failed := 0
	for i := range want {
		if want[i].FailReason != "" {
			failed++
		}
		want[i].FailReason = ""
	}
	if failed < 5 {
		t.Fatalf("only %d failed rows: the file does not exercise the column", failed)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("old file:\n got %+v\nwant %+v", got, want)
	}
}

// Every failed row says why, with the key the summary counts it under, so
// that grouping a file by fail_reason gives the summary's failed_by.
func TestRowsFailReason(t *testing.T) {
	recs := append(append(handRecords(), handRejected()...), tenantRecords()...)
	recs = append(recs,
		Record{ID: 20, Replica: -1, Arrival: 9 * s, Outcome: OutcomeFailed, Fail: RejectTooLong},
		Record{ID: 21, Replica: -1, Arrival: 9 * s, Outcome: OutcomeFailed, Fail: FailTooLarge},
	)
	rows := RowsFromRecords(recs, "w", "p", 1)
	want := map[uint64]string{
		1: "", 5: "failed", 6: "aborted", 7: RejectQueueTimeout, 8: RejectQueueFull, 10: RejectUnknown,
		20: RejectTooLong, 21: FailTooLarge,
	}
	for _, r := range rows[:len(handRecords())+len(handRejected())] {
		if w, ok := want[r.ID]; ok && r.FailReason != w {
			t.Errorf("row %d (%s, reject %q): fail_reason %q, want %q", r.ID, r.Outcome, r.Reject, r.FailReason, w)
		}
	}
	for _, r := range rows[len(rows)-2:] {
		if r.FailReason != want[r.ID] {
			t.Errorf("row %d: fail_reason %q, want %q", r.ID, r.FailReason, want[r.ID])
		}
	}

	var buf bytes.Buffer
	if err := WriteParquet(&buf, rows); err != nil {
		t.Fatal(err)
	}
	back, err := ReadParquet(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	// Grouping the measured rows (arrival at or after the 1s warmup) by
	// fail_reason gives failed_by.
	got := map[string]int{}
	for _, r := range back {
		if r.FailReason != "" && r.ArrivalUs >= 1e6 {
			got[r.FailReason]++
		}
	}
	sum := Summarize(recs, SummaryOptions{Warmup: s})
	if !reflect.DeepEqual(got, sum.FailedBy) {
		t.Errorf("rows by fail_reason %v, summary failed_by %v", got, sum.FailedBy)
	}
}

// A ParquetWriter gives the bytes of WriteParquet whatever the batches it
// is handed, over several row groups, and reads back row for row.
func TestParquetWriterStreams(t *testing.T) {
	rows := RowsFromRecords(syntheticRecords(2*ParquetRowGroup+123, 4), "w", "p", 7)
	var whole bytes.Buffer
	if err := WriteParquet(&whole, rows); err != nil {
		t.Fatal(err)
	}
	var streamed bytes.Buffer
	w := NewParquetWriter(&streamed)
	for i := 0; i < len(rows); {
		n := min(1+i%1000, len(rows)-i)
		if err := w.Write(rows[i : i+n]...); err != nil {
			t.Fatal(err)
		}
		i += n
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(whole.Bytes(), streamed.Bytes()) {
		t.Fatalf("streamed file (%d bytes) differs from the whole one (%d bytes)", streamed.Len(), whole.Len())
	}
	f, err := parquet.OpenFile(bytes.NewReader(streamed.Bytes()), int64(streamed.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if g := len(f.RowGroups()); g != 3 {
		t.Errorf("%d row groups, want 3", g)
	}
	back, err := ReadParquet(bytes.NewReader(streamed.Bytes()), int64(streamed.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, rows) {
		t.Errorf("read back %d rows, want %d equal ones", len(back), len(rows))
	}
	if err := w.Write(rows[0]); err == nil {
		t.Error("Write after Close succeeded")
	}
}

// BenchmarkParquetWriter is the per-request cost of sim --out's streamed
// table: a record to a row, and the row into the file.
func BenchmarkParquetWriter(b *testing.B) {
	recs := syntheticRecords(1<<12, 8)
	w := NewParquetWriter(io.Discard)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := w.Write(RowFromRecord(&recs[i&(len(recs)-1)], "w6", "round_robin", 1)); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
}
