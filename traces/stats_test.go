package traces

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// statsMooncakePath is the shared Mooncake conversation trace (see
// ../../shared/traces/SOURCES.md).
const statsMooncakePath = "../../shared/traces/mooncake/conversation_trace.jsonl"

// readMooncakeForTest is a minimal, test-only Mooncake jsonl decoder
// (timestamp in ms, 512-token hash_ids), so these tests do not depend on the
// package's own Mooncake reader. IDs are 1-based line numbers.
func readMooncakeForTest(tb testing.TB) []Record {
	tb.Helper()
	f, err := os.Open(statsMooncakePath)
	if os.IsNotExist(err) {
		tb.Skipf("Mooncake trace absent at %s (see shared/traces/SOURCES.md); skipping", statsMooncakePath)
	}
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var recs []Record
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for line := 1; sc.Scan(); line++ {
		var row struct {
			Timestamp    int64    `json:"timestamp"`
			InputLength  int      `json:"input_length"`
			OutputLength int      `json:"output_length"`
			HashIDs      []uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			tb.Fatalf("%s:%d: %v", statsMooncakePath, line, err)
		}
		recs = append(recs, Record{
			ID:           uint64(line),
			Arrival:      time.Duration(row.Timestamp) * time.Millisecond,
			InputTokens:  row.InputLength,
			OutputTokens: row.OutputLength,
			BlockSize:    512,
			HashIDs:      row.HashIDs,
		})
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return recs
}

// TestStatsHandComputed checks a tiny trace worked by hand. Block size 4.
//
//	req  arrival  session  in  out  hash ids  blocks' tokens
//	R0   0s       0        100 1    -         (no block identity: left out of reuse)
//	R1   0.5s     1        8   2    1 2       4 4
//	R2   1.2s     1        10  3    1 2 3     4 4 2
//	R3   1.4s     2        6   4    1 4       4 2
//	R4   1.49s    2        7   0    1 4       4 3
//
// Reuse denominator: 8+10+6+7 = 31 tokens (R0 excluded).
//
// Cache of 8 tokens = 2 blocks (LRU order listed most recent first):
//
//	R1: lookup 1 miss → 0.           touch 1,2 → [2 1]
//	R2: 1 hit, 2 hit, 3 miss → 8.    touch 1 → [1 2], 2 → [2 1], 3 → [3 2] (evicts 1)
//	R3: 1 miss → 0.                  touch 1 → [1 3] (evicts 2), 4 → [4 1] (evicts 3)
//	R4: 1 hit, 4 hit → 4+3 = 7.      touch → [4 1]
//	ratio 15/31. (Touching last block to first would give 19/31.)
//
// Cache of 4 tokens = 1 block: R1 0, [2]; R2 1 miss, [3]; R3 miss, [4];
// R4 1 miss → 0/31. Cache of 2 tokens holds no block: 0/31.
//
// Unlimited: R1 0; R2 8; R3 1 hit, 4 miss → 4; R4 7 → 19/31.
//
// Load: arrivals span 1.49 s; the window [0.5s, 1.5s) holds 4 requests.
// Inputs sorted 6 7 8 10 100: mean 26.2, nearest-rank P50 8, P90 = P99 =
// max 100. Outputs 0 1 2 3 4: mean 2, P50 2, P90 = P99 = max 4.
func TestStatsHandComputed(t *testing.T) {
	ms := time.Millisecond
	recs := []Record{
		{ID: 0, Arrival: 0, InputTokens: 100, OutputTokens: 1},
		{ID: 1, Arrival: 500 * ms, Session: 1, InputTokens: 8, OutputTokens: 2, BlockSize: 4, HashIDs: []uint64{1, 2}},
		{ID: 2, Arrival: 1200 * ms, Session: 1, InputTokens: 10, OutputTokens: 3, BlockSize: 4, HashIDs: []uint64{1, 2, 3}},
		{ID: 3, Arrival: 1400 * ms, Session: 2, InputTokens: 6, OutputTokens: 4, BlockSize: 4, HashIDs: []uint64{1, 4}},
		{ID: 4, Arrival: 1490 * ms, Session: 2, InputTokens: 7, OutputTokens: 0, BlockSize: 4, HashIDs: []uint64{1, 4}},
	}
	st, err := ComputeStats(&pqSliceReader{recs: recs}, []int64{8, 4, 2})
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{
		Requests:  5,
		DurationS: 1.49,
		RateRPS:   5 / 1.49,
		PeakRPS1s: 4,
		Input:     Dist{Mean: 26.2, P50: 8, P90: 100, P99: 100, Max: 100},
		Output:    Dist{Mean: 2, P50: 2, P90: 4, P99: 4, Max: 4},
		Sessions:  2,
		TokensIn:  131,
		TokensOut: 10,
		BlockSize: 4,
		Reuse: []Reuse{
			{CacheTokens: 8, HitRatio: 15.0 / 31},
			{CacheTokens: 4, HitRatio: 0},
			{CacheTokens: 2, HitRatio: 0},
			{CacheTokens: 0, HitRatio: 19.0 / 31},
		},
	}
	if !statsClose(st, want) {
		t.Fatalf("got  %+v\nwant %+v", st, want)
	}
}

// statsClose compares stats, floats to within 1e-12 relative.
func statsClose(a, b Stats) bool {
	near := func(x, y float64) bool { return math.Abs(x-y) <= 1e-12*math.Max(1, math.Abs(y)) }
	dnear := func(x, y Dist) bool {
		return near(x.Mean, y.Mean) && near(x.P50, y.P50) && near(x.P90, y.P90) && near(x.P99, y.P99) && near(x.Max, y.Max)
	}
	if a.Requests != b.Requests || !near(a.DurationS, b.DurationS) || !near(a.RateRPS, b.RateRPS) ||
		!near(a.PeakRPS1s, b.PeakRPS1s) || !dnear(a.Input, b.Input) || !dnear(a.Output, b.Output) ||
		a.Sessions != b.Sessions || a.TokensIn != b.TokensIn || a.TokensOut != b.TokensOut ||
		a.BlockSize != b.BlockSize || len(a.Reuse) != len(b.Reuse) {
		return false
	}
	for i := range a.Reuse {
		if a.Reuse[i].CacheTokens != b.Reuse[i].CacheTokens || !near(a.Reuse[i].HitRatio, b.Reuse[i].HitRatio) {
			return false
		}
	}
	return true
}

func TestStatsEmptyAndNoIdentity(t *testing.T) {
	st, err := ComputeStats(&pqSliceReader{}, []int64{100})
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{Reuse: []Reuse{{CacheTokens: 100}, {}}}
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("empty trace: got %+v", st)
	}

	recs := []Record{
		{Arrival: time.Second, InputTokens: 10, OutputTokens: 1},
		{Arrival: time.Second, InputTokens: 20, OutputTokens: 1, BlockSize: 16}, // a block size but no ids
	}
	st, err = ComputeStats(&pqSliceReader{recs: recs}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.BlockSize != 0 || len(st.Reuse) != 1 || st.Reuse[0].HitRatio != 0 {
		t.Fatalf("no block identity: got %+v", st)
	}
	if st.DurationS != 0 || st.RateRPS != 0 || st.PeakRPS1s != 2 {
		t.Fatalf("two requests at one instant: got duration %v, rate %v, peak %v", st.DurationS, st.RateRPS, st.PeakRPS1s)
	}
}

func TestStatsErrors(t *testing.T) {
	if _, err := ComputeStats(&pqSliceReader{}, []int64{-1}); err == nil {
		t.Fatal("negative cache size: want an error")
	}
	mixed := []Record{
		{InputTokens: 4, BlockSize: 4, HashIDs: []uint64{1}},
		{InputTokens: 4, BlockSize: 2, HashIDs: []uint64{1, 2}},
	}
	if _, err := ComputeStats(&pqSliceReader{recs: mixed}, nil); err == nil || !strings.Contains(err.Error(), "block size") {
		t.Fatalf("mixed block sizes: want an error, got %v", err)
	}
	bad := []Record{{InputTokens: 0}}
	if _, err := ComputeStats(&pqSliceReader{recs: bad}, nil); err == nil {
		t.Fatal("invalid record: want an error")
	}
}

// refReuse is a plain reference of the reuse definition: a slice LRU (most
// recent last) per capacity in blocks, -1 meaning unlimited.
func refReuse(recs []Record, capacities []int) []float64 {
	hits := make([]int, len(capacities))
	denom := 0
	for ci, capacity := range capacities {
		var lru []uint64
		for _, r := range recs {
			if r.BlockSize == 0 || len(r.HashIDs) == 0 {
				continue
			}
			if ci == 0 {
				denom += r.InputTokens
			}
			for i, id := range r.HashIDs {
				if !slices.Contains(lru, id) {
					break
				}
				hits[ci] += min(r.BlockSize, r.InputTokens-i*r.BlockSize)
			}
			for _, id := range r.HashIDs {
				if k := slices.Index(lru, id); k >= 0 {
					lru = slices.Delete(lru, k, k+1)
				}
				lru = append(lru, id)
				if capacity >= 0 && len(lru) > capacity {
					lru = lru[len(lru)-capacity:]
				}
			}
		}
	}
	out := make([]float64, len(capacities))
	for i := range out {
		if denom > 0 {
			out[i] = float64(hits[i]) / float64(denom)
		}
	}
	return out
}

// TestStatsReuseProperties checks the LRU against the reference on random
// small traces, and that reuse never falls as the cache grows (LRU's
// inclusion property: the request stream touches the same blocks whatever
// the size).
func TestStatsReuseProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.IntRange(1, 8).Draw(t, "bs")
		n := rapid.IntRange(0, 40).Draw(t, "n")
		recs := make([]Record, n)
		for i := range recs {
			in := rapid.IntRange(1, 6*bs).Draw(t, "in")
			r := Record{ID: uint64(i), Arrival: time.Duration(i) * time.Second, InputTokens: in}
			if rapid.IntRange(0, 4).Draw(t, "identity") > 0 {
				r.BlockSize = bs
				k := (in + bs - 1) / bs
				r.HashIDs = rapid.SliceOfN(rapid.Uint64Range(0, 12), k, k).Draw(t, "ids")
			}
			recs[i] = r
		}
		caps := []int{0, 1, 2, 3, 5, 8, 13, -1}
		tokens := make([]int64, 0, len(caps)-1)
		for _, c := range caps[:len(caps)-1] {
			tokens = append(tokens, int64(c*bs+rapid.IntRange(0, bs-1).Draw(t, "slack")))
		}
		st, err := ComputeStats(&pqSliceReader{recs: recs}, tokens)
		if err != nil {
			t.Fatal(err)
		}
		ref := refReuse(recs, caps)
		for i, ru := range st.Reuse {
			// A cache of 0 tokens asked is unlimited, not empty.
			want := ref[i]
			if i < len(tokens) && tokens[i] == 0 {
				want = ref[len(ref)-1]
			}
			if math.Abs(ru.HitRatio-want) > 1e-12 {
				t.Fatalf("cache %d tokens: ratio %v, reference %v", ru.CacheTokens, ru.HitRatio, want)
			}
			if i > 0 && tokens[0] != 0 && ru.HitRatio < st.Reuse[i-1].HitRatio-1e-12 {
				t.Fatalf("reuse fell from %v to %v as the cache grew", st.Reuse[i-1].HitRatio, ru.HitRatio)
			}
			if ru.HitRatio < 0 || ru.HitRatio > 1 {
				t.Fatalf("ratio %v out of [0, 1]", ru.HitRatio)
			}
		}
	})
}

// statsMooncakeCaches are the cache sizes of the published Mooncake reuse facts.
var statsMooncakeCaches = []int64{3_000_000, 10_000_000, 50_000_000}

// TestStatsMooncake reproduces the reuse facts in shared/traces/SOURCES.md.
func TestStatsMooncake(t *testing.T) {
	recs := readMooncakeForTest(t)
	start := time.Now()
	st, err := ComputeStats(&pqSliceReader{recs: recs}, statsMooncakeCaches)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	t.Logf("%d requests over %.1f s (%.2f req/s, peak %v in 1 s), input %+v, output %+v, %d in / %d out tokens, computed in %v",
		st.Requests, st.DurationS, st.RateRPS, st.PeakRPS1s, st.Input, st.Output, st.TokensIn, st.TokensOut, elapsed)
	want := []string{"13.8%", "29.1%", "37.1%", "37.4%"}
	for i, ru := range st.Reuse {
		t.Logf("cache %d tokens: %.4f%%", ru.CacheTokens, 100*ru.HitRatio)
		if got := fmt.Sprintf("%.1f%%", 100*ru.HitRatio); got != want[i] {
			t.Errorf("cache %d tokens: reuse %s, want %s", ru.CacheTokens, got, want[i])
		}
	}
	if st.Requests != 12031 || st.BlockSize != 512 || st.Sessions != 0 || math.Abs(st.DurationS-3537) > 1 {
		t.Errorf("got %d requests, block size %d, %d sessions, %v s; want 12031, 512, 0, about 3537", st.Requests, st.BlockSize, st.Sessions, st.DurationS)
	}
	if elapsed > 5*time.Second { // generous: the benchmark measures; this catches a quadratic slip
		t.Errorf("took %v, want well under a second (5 s allowed for slow or -race runs)", elapsed)
	}

	// The same stats through the parquet format.
	path := filepath.Join(t.TempDir(), "mooncake.parquet")
	if _, err := WriteParquetFile(path, &pqSliceReader{recs: recs}); err != nil {
		t.Fatal(err)
	}
	st2, err := ComputeStats(pqOpen(t, path, Options{}), statsMooncakeCaches)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st, st2) {
		t.Errorf("stats differ through parquet:\n%+v\n%+v", st, st2)
	}
}

func BenchmarkStatsMooncake(b *testing.B) {
	recs := readMooncakeForTest(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ComputeStats(&pqSliceReader{recs: recs}, statsMooncakeCaches); err != nil {
			b.Fatal(err)
		}
	}
}
