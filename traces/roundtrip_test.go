package traces

import (
	"io"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/inferrail/inferrail/workload"
)

// replayAll returns every request a replay of r produces.
func replayAll(t *testing.T, r Reader) []workload.Request {
	t.Helper()
	src, err := NewSource(r, ReplayOptions{Seed: 7, Model: "m", Speedup: 2})
	if err != nil {
		t.Fatal(err)
	}
	var out []workload.Request
	for {
		req, ok := src.Next()
		if !ok {
			break
		}
		out = append(out, *req)
	}
	if err := src.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestParquetRoundTripReplaysIdentically converts every sample trace to the
// project's parquet format and checks that the copy replays exactly like the
// original: same requests, arrivals, sessions and segment chains.
func TestParquetRoundTripReplaysIdentically(t *testing.T) {
	samples := []string{"mooncake.jsonl", "bailian.jsonl", "azure.csv", "burstgpt.csv", "burstgpt_v1.csv", "sharegpt.json", "vllm-log"}
	for _, name := range samples {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", name)
			open := func() (Reader, io.Closer) {
				r, c, err := Open(path, "", Options{SkipBad: true})
				if err != nil {
					t.Fatal(err)
				}
				return r, c
			}
			r, c := open()
			want := replayAll(t, r)
			c.Close()
			if len(want) == 0 {
				t.Fatal("sample replays nothing")
			}
			r, c = open()
			pq := filepath.Join(t.TempDir(), "trace.parquet")
			n, err := WriteParquetFile(pq, r)
			c.Close()
			if err != nil || n != len(want) {
				t.Fatalf("wrote %d records (%v), want %d", n, err, len(want))
			}
			pr, err := NewParquet(pq, Options{})
			if err != nil {
				t.Fatal(err)
			}
			got := replayAll(t, pr)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("parquet copy replays differently:\n got %+v\nwant %+v", got[0], want[0])
			}
		})
	}
}

func TestReplayWindowLimitAndThinning(t *testing.T) {
	recs := make([]Record, 100)
	for i := range recs {
		recs[i] = Record{ID: uint64(i + 1), Arrival: time.Duration(i) * time.Second, InputTokens: 64, OutputTokens: 4, BlockSize: 16, HashIDs: []uint64{1, 2, 3, uint64(100 + i)}}
	}
	run := func(o ReplayOptions) []workload.Request {
		src, err := NewSource(&sliceReader{recs: recs}, o)
		if err != nil {
			t.Fatal(err)
		}
		var out []workload.Request
		for {
			r, ok := src.Next()
			if !ok {
				return out
			}
			out = append(out, *r)
		}
	}
	w := run(ReplayOptions{Start: 10 * time.Second, End: 20 * time.Second, Speedup: 2})
	if len(w) != 10 || w[0].Arrival != 0 || w[9].Arrival != 4500*time.Millisecond {
		t.Fatalf("window: %d requests, first at %v, last at %v", len(w), w[0].Arrival, w[len(w)-1].Arrival)
	}
	// Equal hash ids share segments; the last block differs.
	if w[0].Prompt[0] != w[1].Prompt[0] || w[0].Prompt[2] != w[1].Prompt[2] || w[0].Prompt[3] == w[1].Prompt[3] {
		t.Fatal("hash ids did not map onto shared segments")
	}
	if l := run(ReplayOptions{Limit: 7}); len(l) != 7 || l[6].ID != 7 {
		t.Fatalf("limit: %d requests", len(l))
	}
	half := run(ReplayOptions{RateScale: 0.5, Seed: 3})
	if len(half) < 35 || len(half) > 65 {
		t.Fatalf("rate-scale 0.5 kept %d of 100", len(half))
	}
	if again := run(ReplayOptions{RateScale: 0.5, Seed: 3}); !reflect.DeepEqual(again, half) {
		t.Fatal("thinning is not deterministic for a seed")
	}
	for _, bad := range []ReplayOptions{{RateScale: 2}, {Speedup: -1}, {Start: 5 * time.Second, End: time.Second}, {Limit: -1}} {
		if _, err := NewSource(&sliceReader{}, bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

type sliceReader struct {
	recs []Record
	i    int
}

func (s *sliceReader) Next() (Record, error) {
	if s.i >= len(s.recs) {
		return Record{}, io.EOF
	}
	s.i++
	return s.recs[s.i-1], nil
}

// A recording's rate-limited requests were refused before the gateway core,
// so a replay leaves them out and counts them; every other outcome, and
// every record of a load-only trace, is replayed.
func TestReplaySkipsRateLimitedRecordings(t *testing.T) {
	recs := []Record{
		{ID: 1, InputTokens: 10, OutputTokens: 2},
		{ID: 2, Arrival: time.Second, InputTokens: 10, OutputTokens: 2, Measured: &Measured{Outcome: OutcomeRateLimited}},
		{ID: 3, Arrival: 2 * time.Second, InputTokens: 10, OutputTokens: 2, Measured: &Measured{Outcome: "queue_timeout"}},
		{ID: 4, Arrival: 3 * time.Second, InputTokens: 10, OutputTokens: 2, Measured: &Measured{Outcome: "ok"}},
	}
	src, err := NewSource(&sliceReader{recs: recs}, ReplayOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var at []time.Duration
	for {
		r, ok := src.Next()
		if !ok {
			break
		}
		at = append(at, r.Arrival)
	}
	if want := []time.Duration{0, 2 * time.Second, 3 * time.Second}; !slices.Equal(at, want) || src.RateLimited() != 1 {
		t.Errorf("replayed arrivals %v (want %v), rate limited %d (want 1)", at, want, src.RateLimited())
	}
}
