package traces

import (
	"errors"
	"io"
	"strings"
	"testing"
)

func TestShareGPT(t *testing.T) {
	got := mustReadAll(t, NewShareGPT(openTestdata(t, "sharegpt.json"), "sharegpt.json", Options{Model: "m"}))
	checkRecords(t, got, []Record{
		// Conversation 1: the second turn resends the first.
		{ID: 1, Session: 1, Turn: 0, Model: "m", InputTokens: 2, OutputTokens: 1},
		{ID: 2, Session: 1, Turn: 1, Parent: 1, Model: "m", InputTokens: 2 + 1 + 1, OutputTokens: 3},
		// Conversation 2: the system message is history; the last question has no answer.
		{ID: 3, Session: 2, Model: "m", InputTokens: 1 + 1, OutputTokens: 0},
		// Conversation 3 is empty; in 4 the leading answer and the unanswered question are history.
		{ID: 4, Session: 4, Model: "m", InputTokens: 2 + 1 + 1, OutputTokens: 2},
	})
}

func TestShareGPTTokenize(t *testing.T) {
	in := `[{"conversations": [{"from": "user", "value": "a b c"}, {"from": "assistant", "value": "d e"}, {"from": "human", "value": "f"}, {"from": "gpt", "value": "g h i j"}]}]`
	words := func(s string) int { return len(strings.Fields(s)) }
	got := mustReadAll(t, NewShareGPTWith(strings.NewReader(in), "s.json", ShareGPTOptions{Tokenize: words}))
	checkRecords(t, got, []Record{
		{ID: 1, Session: 1, InputTokens: 3, OutputTokens: 2},
		{ID: 2, Session: 1, Turn: 1, Parent: 1, InputTokens: 6, OutputTokens: 4},
	})
}

func TestEstimateTokens(t *testing.T) {
	for s, want := range map[string]int{"": 0, "a": 1, "abcd": 1, "abcde": 2, "héllo": 2, "日本語": 3} {
		if got := EstimateTokens(s); got != want {
			t.Errorf("EstimateTokens(%q) = %d, want %d", s, got, want)
		}
	}
}

func TestShareGPTJSONLines(t *testing.T) {
	in := "{\"id\": \"a\", \"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}, {\"from\": \"gpt\", \"value\": \"hello\"}]}\n" +
		"{\"id\": \"b\", \"conversations\": [{\"from\": \"human\", \"value\": \"hey\"}, {\"from\": \"gpt\", \"value\": \"yo\"}]}\n"
	got := mustReadAll(t, NewShareGPT(strings.NewReader(in), "s.jsonl", Options{}))
	checkRecords(t, got, []Record{
		{ID: 1, Session: 1, InputTokens: 1, OutputTokens: 2},
		{ID: 2, Session: 2, InputTokens: 1, OutputTokens: 1},
	})
}

func TestShareGPTBadConversations(t *testing.T) {
	in := "\ufeff[\n" +
		`{"conversations": [{"from": "human", "value": "ok"}, {"from": "gpt", "value": "fine"}]},` + "\n" +
		`5,` + "\n" +
		`{"id": "no conversations"},` + "\n" +
		`{"conversations": [{"from": "human", "value": 7}]},` + "\n" +
		`{"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "empty prompt"}, {"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]}` + "\n" +
		"]\n"
	r := NewShareGPT(strings.NewReader(in), "s.json", Options{})
	if rec, err := r.Next(); err != nil || rec.ID != 1 {
		t.Fatalf("first: %+v, %v", rec, err)
	}
	for _, tc := range []struct {
		line int
		want string
	}{{3, "invalid JSON"}, {4, "missing conversations"}, {5, "invalid JSON"}, {6, "turn 0: bad record: input length 0"}} {
		_, err := r.Next()
		wantLineError(t, err, "s.json", tc.line, true, tc.want)
	}
	// The empty prompt's answer is history for the next turn.
	rec, err := r.Next()
	if err != nil || rec.ID != 3 || rec.Session != 5 || rec.Turn != 1 || rec.Parent != 2 || rec.InputTokens != 0+3+1 {
		t.Errorf("after bad records: %+v, %v", rec, err)
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("end: %v", err)
	}

	r = NewShareGPT(strings.NewReader(in), "s.json", Options{SkipBad: true})
	if recs := mustReadAll(t, r); len(recs) != 2 || r.(Counter).Skipped() != 4 {
		t.Errorf("SkipBad: %d records, %d skipped; want 2, 4", len(recs), r.(Counter).Skipped())
	}
}

func TestShareGPTFatal(t *testing.T) {
	ok := `{"conversations": [{"from": "human", "value": "ok"}, {"from": "gpt", "value": "fine"}]}`
	for _, tc := range []struct {
		in      string
		n, line int
		want    string
	}{
		{"[\n" + ok + ",\n{\"conversations\": [}\n]", 1, 3, "invalid JSON"},
		{"[\n" + ok + ",\n" + ok, 2, 3, "unexpected EOF"},
		{"[\n" + ok + "\n]\n]", 1, 4, "data after the array"},
		{"[\n" + ok + "\n" + ok + "]", 1, 3, "invalid JSON"},
		{"\n\n5", 0, 3, "not a ShareGPT file"},
		{ok + "\n{\"conversations\": ", 1, 2, "unexpected EOF"},
	} {
		r := NewShareGPT(strings.NewReader(tc.in), "s.json", Options{SkipBad: true})
		recs, err := readAll(r)
		if len(recs) != tc.n {
			t.Errorf("%q: %d records before the error, want %d", tc.in, len(recs), tc.n)
		}
		wantLineError(t, err, "s.json", tc.line, false, tc.want)
		if _, err2 := r.Next(); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("%q: final error not repeated: %v", tc.in, err2)
		}
	}
	for _, in := range []string{"", "  \n", "[]", "[\n]\n"} {
		if recs, err := readAll(NewShareGPT(strings.NewReader(in), "s.json", Options{})); err != nil || len(recs) != 0 {
			t.Errorf("%q: %d records, %v", in, len(recs), err)
		}
	}
}

func FuzzShareGPT(f *testing.F) {
	f.Add([]byte(`[{"id": "a", "conversations": [{"from": "human", "value": "12345678"}, {"from": "gpt", "value": "1234"}, {"from": "human", "value": "123"}, {"from": "gpt", "value": "123456789"}]}, {"id": "c", "conversations": []}]`))
	f.Add([]byte("{\"conversations\": [{\"from\": \"human\", \"value\": \"\"}, {\"from\": \"gpt\", \"value\": \"x\"}]}\n5\n{\"id\": 1}\n"))
	f.Add([]byte("[5, null, {\"conversations\": null}, {\"conversations\": [{\"from\": 1}]}]"))
	f.Add([]byte("\ufeff[\n{\"conversations\": [{\"from\": \"system\", \"value\": \"s\"}, {\"from\": \"user\", \"value\": \"q\"}, {\"from\": \"model\", \"value\": \"a\"}]}\n] x"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSkipping(t, data, NewShareGPT)
	})
}
