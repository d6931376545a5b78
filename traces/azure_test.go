package traces

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestAzure(t *testing.T) {
	got := mustReadAll(t, NewAzure(openTestdata(t, "azure.csv"), "azure.csv", Options{Model: "gpt"}))
	checkRecords(t, got, []Record{
		{ID: 2, Model: "gpt", InputTokens: 374, OutputTokens: 44},
		{ID: 3, Arrival: 4314579 * time.Microsecond, Model: "gpt", InputTokens: 396, OutputTokens: 109},
		{ID: 4, Arrival: 4419410 * time.Microsecond, Model: "gpt", InputTokens: 2, OutputTokens: 0},
		{ID: 5, Arrival: time.Minute, Model: "gpt", InputTokens: 1000, OutputTokens: 7},
	})
}

func TestAzureHeader(t *testing.T) {
	// Columns are found by name, in any order and case, around extra columns.
	in := "\ufeffGeneratedTokens, contexttokens ,Extra,Timestamp\r\n7,30,x,2024-05-10 00:00:00.0099300+00:00\r\n8,40,y,2024-05-10T00:00:01Z\r\n"
	got := mustReadAll(t, NewAzure(strings.NewReader(in), "a.csv", Options{}))
	checkRecords(t, got, []Record{
		{ID: 2, InputTokens: 30, OutputTokens: 7},
		{ID: 3, Arrival: 990070 * time.Microsecond, InputTokens: 40, OutputTokens: 8},
	})

	for _, in := range []string{"TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", "a,b,c\n"} {
		r := NewAzure(strings.NewReader(in), "a.csv", Options{SkipBad: true})
		_, err := r.Next()
		wantLineError(t, err, "a.csv", 1, false, "lacks column")
		if _, err2 := r.Next(); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("header error not repeated: %v", err2)
		}
	}
	if _, err := NewAzure(strings.NewReader(""), "a.csv", Options{}).Next(); !errors.Is(err, io.EOF) {
		t.Errorf("empty file: %v, want io.EOF", err)
	}
}

func TestAzureBadRows(t *testing.T) {
	for _, tc := range []struct{ row, want string }{
		{"2023-11-16 18:15:47,10", "2 fields"},
		{"2023-11-16 18:15:47,10,1,2", "4 fields"},
		{"yesterday,10,1", "not a date"},
		{"2023-11-16 18:15:47,ten,1", "not a number"},
		{"2023-11-16 18:15:47,10,-1", "out of range"},
		{"2023-11-16 18:15:47,NaN,1", "is NaN"},
		{"2023-11-16 18:15:47,10,1e12", "exceeds"},
		{"2023-11-16 18:15:47,0,1", "input length 0"},
		{"2023-11-16 18:15:45,10,1", "before the trace's start"},
		{"9999-11-16 18:15:47,10,1", "absurdly far"},
		{`2023-11-16 18:15:47,"10,1`, "extraneous or missing"},
	} {
		in := "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n" + tc.row + "\n2023-11-16 18:15:48,5,1\n"
		r := NewAzure(strings.NewReader(in), "a.csv", Options{})
		_, err := readAll(r)
		wantLineError(t, err, "a.csv", 3, true, tc.want)
		r = NewAzure(strings.NewReader(in), "a.csv", Options{SkipBad: true})
		recs := mustReadAll(t, r)
		if r.(Counter).Skipped() != 1 {
			t.Errorf("%s: Skipped() = %d, want 1", tc.row, r.(Counter).Skipped())
		}
		if len(recs) != 2 && !strings.Contains(tc.row, `"`) {
			t.Errorf("%s: %d records, want 2", tc.row, len(recs))
		}
	}
}

func TestParseAzureTime(t *testing.T) {
	base := time.Date(2023, 11, 16, 18, 17, 3, 0, time.UTC)
	for s, want := range map[string]time.Time{
		"2023-11-16 18:17:03.9799600":      base.Add(979960 * time.Microsecond),
		"2023-11-16 18:17:03.97996001234":  base.Add(979960012 * time.Nanosecond),
		"2023-11-16 18:17:03.9":            base.Add(900 * time.Millisecond),
		"2023-11-16 18:17:03":              base,
		" 2023-11-16T18:17:03Z ":           base,
		"2023-11-16 20:17:03.5+02:00":      base.Add(500 * time.Millisecond),
		"2023-11-16 18:17:03.000001 +0000": base.Add(time.Microsecond),
	} {
		got, err := parseAzureTime(s)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseAzureTime(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
}

func TestAzureRealTrace(t *testing.T) {
	p := sharedPath(t, "azure2023/AzureLLMInferenceTrace_conv.csv")
	r, c, err := Open(p, "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	recs := mustReadAll(t, r)
	if len(recs) != 19366 {
		t.Errorf("%d rows, want 19,366", len(recs))
	}
	last := recs[len(recs)-1]
	// 18:15:46.6805900 to 19:14:08.4025270: about an hour.
	if want := 3501721937 * time.Microsecond; last.Arrival != want {
		t.Errorf("last arrival %v, want %v", last.Arrival, want)
	}
	for i, rec := range recs {
		if rec.ID != uint64(i+2) || (i > 0 && rec.Arrival < recs[i-1].Arrival) {
			t.Fatalf("row %d: %+v", i, rec)
		}
	}
}

func FuzzAzure(f *testing.F) {
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"))
	f.Add([]byte("timestamp,contexttokens,generatedtokens\r\n2023-11-16 18:15:46,0,1\r\n\"2023-11-16 18:15:47\",\"5\",\"1.0\"\r\nx,y\n"))
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,1\n0001-01-01 00:00:00,3,1\n\"unterminated,3,1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSkipping(t, data, NewAzure)
	})
}
