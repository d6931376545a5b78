package traces

import (
	"strings"
	"testing"
	"time"
)

func TestBailian(t *testing.T) {
	got := mustReadAll(t, NewBailian(openTestdata(t, "bailian.jsonl"), "bailian.jsonl", Options{}))
	checkRecords(t, got, []Record{
		{ID: 1, Session: 1, InputTokens: 40, OutputTokens: 5, BlockSize: 16, HashIDs: []uint64{1, 2, 3}},
		{ID: 2, Arrival: 500 * time.Millisecond, Session: 2, InputTokens: 16, OutputTokens: 3, BlockSize: 16, HashIDs: []uint64{9}},
		{ID: 3, Arrival: 1750 * time.Millisecond, Session: 1, Parent: 1, Turn: 1, InputTokens: 60, OutputTokens: 8, BlockSize: 16, HashIDs: []uint64{1, 2, 3, 4}},
		{ID: 4, Arrival: 2500 * time.Millisecond, Session: 1, Parent: 3, Turn: 2, InputTokens: 70, OutputTokens: 8, BlockSize: 16, HashIDs: []uint64{1, 2, 3, 4, 5}},
		// Chat 7's parent 5 is not in the trace: 5 stands for the root.
		{ID: 8, Arrival: 3500 * time.Millisecond, Session: 6, Parent: 6, Turn: 3, InputTokens: 17, OutputTokens: 1, BlockSize: 16, HashIDs: []uint64{6, 7}},
		// No parent, turn or hash_ids.
		{ID: 9, Arrival: 4500 * time.Millisecond, Session: 9, InputTokens: 5, OutputTokens: 2},
	})
}

func TestBailianTurnFromChain(t *testing.T) {
	in := `{"chat_id": 10, "parent_chat_id": null, "timestamp": 1, "input_length": 5, "output_length": 2}
{"chat_id": 11, "parent_chat_id": 10, "timestamp": 2, "input_length": 5, "output_length": 2}
{"chat_id": 12, "parent_chat_id": 11, "timestamp": 3, "input_length": 5, "output_length": 2}
`
	got := mustReadAll(t, NewBailian(strings.NewReader(in), "t", Options{Model: "qwen"}))
	for i, rec := range got {
		if rec.Turn != i || rec.Session != 11 || rec.Model != "qwen" {
			t.Errorf("record %d: %+v, want turn %d of session 11", i, rec, i)
		}
	}
}

func TestBailianBadLines(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`{"parent_chat_id": -1, "timestamp": 1, "input_length": 5, "output_length": 2}`, "missing chat_id"},
		{`{"chat_id": "a", "timestamp": 1, "input_length": 5, "output_length": 2}`, "not a non-negative integer"},
		{`{"chat_id": -4, "timestamp": 1, "input_length": 5, "output_length": 2}`, "not a non-negative integer"},
		{`{"chat_id": 18446744073709551615, "timestamp": 1, "input_length": 5, "output_length": 2}`, "too large"},
		{`{"chat_id": 4, "parent_chat_id": -2, "timestamp": 1, "input_length": 5, "output_length": 2}`, "parent_chat_id -2"},
		{`{"chat_id": 4, "timestamp": 1, "input_length": 5, "output_length": 2, "turn": 0}`, "turn 0"},
		{`{"chat_id": 4, "timestamp": 1, "input_length": 5, "output_length": 2, "turn": 1.5}`, "turn 1.5"},
		{`{"chat_id": 4, "timestamp": "x", "input_length": 5, "output_length": 2}`, "invalid JSON"},
		{`{"chat_id": 4, "input_length": 5, "output_length": 2}`, "missing timestamp"},
		{`{"chat_id": 4, "timestamp": 1, "input_length": 40, "output_length": 2, "hash_ids": [1, 2]}`, "2 hash ids"},
		{`{"chat_id": 4, "timestamp": 0.5, "input_length": 5, "output_length": 2}`, "before the trace's start"},
	} {
		in := `{"chat_id": 0, "parent_chat_id": -1, "timestamp": 1, "input_length": 5, "output_length": 2}` + "\n" + tc.line + "\n"
		r := NewBailian(strings.NewReader(in), "b.jsonl", Options{})
		_, err := readAll(r)
		wantLineError(t, err, "b.jsonl", 2, true, tc.want)
		r = NewBailian(strings.NewReader(in), "b.jsonl", Options{SkipBad: true})
		if recs := mustReadAll(t, r); len(recs) != 1 || r.(Counter).Skipped() != 1 {
			t.Errorf("%s: SkipBad: %d records, %d skipped", tc.line, len(recs), r.(Counter).Skipped())
		}
	}
}

func FuzzBailian(f *testing.F) {
	f.Add([]byte(`{"chat_id": 0, "parent_chat_id": -1, "timestamp": 10.5, "input_length": 40, "output_length": 5, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}
{"chat_id": 2, "parent_chat_id": 0, "timestamp": 12.25, "input_length": 60, "output_length": 8, "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4]}
{"chat_id": 7, "parent_chat_id": 5, "timestamp": 14.0, "input_length": 17, "output_length": 1}`))
	f.Add([]byte(`{"chat_id": 1.0, "parent_chat_id": 1, "timestamp": -1e300, "input_length": 1, "output_length": 0, "turn": 1e10}` + "\n{}\n"))
	f.Add([]byte(`{"chat_id": 3, "parent_chat_id": 3, "timestamp": 0, "input_length": 16, "output_length": 0, "hash_ids": [0]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSkipping(t, data, NewBailian)
	})
}
