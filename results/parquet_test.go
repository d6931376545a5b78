package results

import (
	"bytes"
	"os"
	"reflect"
	"testing"
)

func TestParquetRoundTrip(t *testing.T) {
	var rows []Row
	rows = append(rows, RowsFromRecords(handRecords(), "chat", "round-robin", 1)...)
	rows = append(rows, RowsFromRecords(syntheticRecords(3000, 4), "agentic", "prefix-aware", 1<<63+5)...)

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
}
