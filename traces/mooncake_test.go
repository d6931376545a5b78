package traces

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestMooncake(t *testing.T) {
	got := mustReadAll(t, NewMooncake(openTestdata(t, "mooncake.jsonl"), "mooncake.jsonl", Options{Model: "m"}))
	checkRecords(t, got, []Record{
		{ID: 1, Arrival: 0, Model: "m", InputTokens: 1000, OutputTokens: 10, BlockSize: 512, HashIDs: []uint64{0, 1}},
		{ID: 2, Arrival: 500 * time.Millisecond, Model: "m", InputTokens: 512, OutputTokens: 0, BlockSize: 512, HashIDs: []uint64{0}},
		{ID: 77, Arrival: time.Second, Model: "m", InputTokens: 1025, OutputTokens: 7, BlockSize: 512, HashIDs: []uint64{0, 1, 2}},
	})
}

func TestMooncakeOptionalFields(t *testing.T) {
	in := `{"timestamp": 5, "input_length": 3, "output_length": 1}
{"timestamp": 7.5, "input_length": 3.0, "output_length": 1, "id": "req-9"}
{"timestamp": 9, "input_length": 3, "output_length": 1, "id": "12"}
`
	got := mustReadAll(t, NewMooncake(strings.NewReader(in), "x", Options{}))
	checkRecords(t, got, []Record{
		{ID: 1, InputTokens: 3, OutputTokens: 1},
		{ID: hashString("req-9"), Arrival: 2500 * time.Microsecond, InputTokens: 3, OutputTokens: 1},
		{ID: 12, Arrival: 4 * time.Millisecond, InputTokens: 3, OutputTokens: 1},
	})
}

func TestMooncakeBadLines(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`{"timestamp": 0, "input_length": 10, "output_length": 1`, "invalid JSON"},
		{`[1, 2]`, "invalid JSON"},
		{`{"input_length": 10, "output_length": 1, "hash_ids": [1]}`, "missing timestamp"},
		{`{"timestamp": 0, "output_length": 1, "hash_ids": [1]}`, "missing input_length"},
		{`{"timestamp": 0, "input_length": 10, "hash_ids": [1]}`, "missing output_length"},
		{`{"timestamp": 0, "input_length": "10", "output_length": 1}`, "invalid JSON"},
		{`{"timestamp": 0, "input_length": -10, "output_length": 1}`, "negative"},
		{`{"timestamp": 0, "input_length": 10.5, "output_length": 1}`, "not a whole number"},
		{`{"timestamp": 0, "input_length": 2e9, "output_length": 1}`, "exceeds"},
		{`{"timestamp": 0, "input_length": 0, "output_length": 1}`, "input length 0"},
		{`{"timestamp": 1e400, "input_length": 10, "output_length": 1}`, "invalid JSON"},
		{`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}`, "2 hash ids"},
		{`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": []}`, "0 hash ids"},
		{`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-1]}`, "invalid JSON"},
		{`{"timestamp": 0, "input_length": 10, "output_length": 1, "id": -3}`, "not a non-negative integer"},
	} {
		in := `{"timestamp": 1000, "input_length": 10, "output_length": 1, "hash_ids": [4]}` + "\n\n" + tc.line + "\n" +
			`{"timestamp": 2000, "input_length": 10, "output_length": 1, "hash_ids": [5]}` + "\n"
		r := NewMooncake(strings.NewReader(in), "t.jsonl", Options{})
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
		_, err := r.Next()
		wantLineError(t, err, "t.jsonl", 3, true, tc.want)
		// The reader goes on after a bad record.
		if rec, err := r.Next(); err != nil || rec.ID != 4 || rec.Arrival != time.Second {
			t.Errorf("%s: after the bad line: %+v, %v", tc.line, rec, err)
		}

		r = NewMooncake(strings.NewReader(in), "t.jsonl", Options{SkipBad: true})
		if recs := mustReadAll(t, r); len(recs) != 2 {
			t.Errorf("%s: SkipBad read %d records, want 2", tc.line, len(recs))
		}
		if n := r.(Counter).Skipped(); n != 1 {
			t.Errorf("%s: Skipped() = %d, want 1", tc.line, n)
		}
	}
}

func TestMooncakeBeforeFirst(t *testing.T) {
	// A record earlier than the first is bad; the base stays the first good one.
	in := `{"timestamp": 100, "input_length": 0, "output_length": 1}
{"timestamp": 1000, "input_length": 1, "output_length": 1}
{"timestamp": 500, "input_length": 1, "output_length": 1}
{"timestamp": 1250, "input_length": 1, "output_length": 1}
`
	r := NewMooncake(strings.NewReader(in), "t", Options{SkipBad: true})
	got := mustReadAll(t, r)
	checkRecords(t, got, []Record{
		{ID: 2, InputTokens: 1, OutputTokens: 1},
		{ID: 4, Arrival: 250 * time.Millisecond, InputTokens: 1, OutputTokens: 1},
	})
	if r.(Counter).Skipped() != 2 {
		t.Errorf("Skipped() = %d, want 2", r.(Counter).Skipped())
	}
}

func TestMooncakeLongLine(t *testing.T) {
	// A prompt of 2 million tokens: a line of several MB.
	var b strings.Builder
	b.WriteString(`{"timestamp": 0, "input_length": 2048000, "output_length": 1, "hash_ids": [`)
	for i := range 4000 {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("1234567890123")
	}
	b.WriteString("]}\n")
	recs := mustReadAll(t, NewMooncake(strings.NewReader(b.String()), "t", Options{}))
	if len(recs) != 1 || len(recs[0].HashIDs) != 4000 {
		t.Fatalf("long line: %d records", len(recs))
	}
}

func TestMooncakeRealTrace(t *testing.T) {
	p := sharedPath(t, "mooncake/conversation_trace.jsonl")
	r, c, err := Open(p, "mooncake", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := 0
	var last Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		if want := (rec.InputTokens + 511) / 512; len(rec.HashIDs) != want || rec.BlockSize != 512 {
			t.Fatalf("record %d: %d hash ids for %d tokens", rec.ID, len(rec.HashIDs), rec.InputTokens)
		}
		if rec.ID != uint64(n) || rec.Arrival < last.Arrival {
			t.Fatalf("record %d: id %d, arrival %v after %v", n, rec.ID, rec.Arrival, last.Arrival)
		}
		last = rec
	}
	if n != 12031 {
		t.Errorf("%d records, want 12,031", n)
	}
	if last.Arrival != 3536999*time.Millisecond {
		t.Errorf("last arrival %v, want 3536.999s", last.Arrival)
	}
}

func FuzzMooncake(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}` + "\n" +
		`{"timestamp": 5, "input_length": 513, "output_length": 1, "hash_ids": [0, 14]}`))
	f.Add([]byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}` + "\n" + `{"timestamp": -5, "input_length": 1, "output_length": 0}`))
	f.Add([]byte("\ufeff{\"timestamp\": 1e308, \"input_length\": 1, \"output_length\": 0, \"id\": \"x\"}\n{\"timestamp\": -1e308, \"input_length\": 1, \"output_length\": 0}\n\n"))
	f.Add([]byte(`{"timestamp": 0, "input_length": 1e9, "output_length": 1e9}` + "\n[]\nnull\n{}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSkipping(t, data, NewMooncake)
	})
}
