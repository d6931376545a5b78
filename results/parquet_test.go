package results

import (
	"bytes"
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
	for _, col := range []string{"reject", "priority", "tenant"} {
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
		want[i].Reject, want[i].Priority, want[i].Tenant = "", 0, ""
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("old file:\n got %+v\nwant %+v", got, want)
	}
}
