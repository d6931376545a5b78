package traces

import (
	"strings"
	"testing"
	"time"
)

func TestBurstGPT(t *testing.T) {
	got := mustReadAll(t, NewBurstGPT(openTestdata(t, "burstgpt.csv"), "burstgpt.csv", Options{Model: "x"}))
	s1 := hashString("s1")
	checkRecords(t, got, []Record{
		{ID: 2, Session: s1, Model: "ChatGPT", InputTokens: 472, OutputTokens: 18},
		// A failed response (Response tokens 0) is kept.
		{ID: 3, Arrival: 500 * time.Millisecond, Session: s1, Model: "ChatGPT", InputTokens: 600, OutputTokens: 0},
		{ID: 4, Arrival: 2250 * time.Millisecond, Model: "GPT-4", InputTokens: 1000, OutputTokens: 200},
	})
	// FNV-1a, 64 bits, of "s1": stable across runs and machines.
	if s1 != 0x08d8ff07b578d149 {
		t.Errorf("session hash %#x, want 0x08d8ff07b578d149", s1)
	}
}

func TestBurstGPTFirstSchema(t *testing.T) {
	r := NewBurstGPT(openTestdata(t, "burstgpt_v1.csv"), "burstgpt_v1.csv", Options{Model: "default", SkipBad: true})
	got := mustReadAll(t, r)
	checkRecords(t, got, []Record{
		{ID: 2, Model: "ChatGPT", InputTokens: 472, OutputTokens: 18},
		{ID: 4, Arrival: 2 * time.Second, Model: "default", InputTokens: 100, OutputTokens: 5},
	})
	// Request tokens 0 is the one bad row.
	if n := r.(Counter).Skipped(); n != 1 {
		t.Errorf("Skipped() = %d, want 1", n)
	}
}

func TestBurstGPTBadRows(t *testing.T) {
	for _, tc := range []struct{ row, want string }{
		{"x,ChatGPT,1,1,2,API log", "Timestamp \"x\""},
		{"Inf,ChatGPT,1,1,2,API log", "is +Inf"},
		{"1,ChatGPT,1.5,1,2,API log", "not a whole number"},
		{"1,ChatGPT,,1,2,API log", "not a number"},
		{"1,ChatGPT,1,-1,2,API log", "out of range"},
		{"1,ChatGPT,1,1,2", "5 fields"},
		{"-1,ChatGPT,1,1,2,API log", "before the trace's start"},
	} {
		in := "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,ChatGPT,5,1,6,API log\n" + tc.row + "\n"
		_, err := readAll(NewBurstGPT(strings.NewReader(in), "b.csv", Options{}))
		wantLineError(t, err, "b.csv", 3, true, tc.want)
	}
	_, err := readAll(NewBurstGPT(strings.NewReader("Timestamp,Model,Response tokens\n1,a,2\n"), "b.csv", Options{}))
	wantLineError(t, err, "b.csv", 1, false, "lacks column requesttokens")
}

func FuzzBurstGPT(f *testing.F) {
	f.Add([]byte("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,s1,1.2,ChatGPT,472,18,490,Conversation log\n5.5,s1,0.8,ChatGPT,600,0,600,Conversation log\n"))
	f.Add([]byte("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,ChatGPT,472,18,490,Conversation log\n1,GPT-4,0,10,10,API log\n1e300,,1,1,2,x\n"))
	f.Add([]byte("timestamp,request_tokens,response_tokens\n0x1p3,1,1\n\"1\",\"2\"\"\",3\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSkipping(t, data, NewBurstGPT)
	})
}
