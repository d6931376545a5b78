package results

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	ms = time.Millisecond
	s  = time.Second
)

// handRecords is a small run whose statistics are worked out by hand in
// TestSummarize. Warmup is 1s.
func handRecords() []Record {
	return []Record{
		// Warmup: excluded from everything.
		{ID: 0, Replica: 0, Arrival: 500 * ms, Dispatch: 500 * ms, FirstToken: 600 * ms, End: 10 * s, HasFirstToken: true,
			PromptTokens: 9000, CachedTokens: 9000, OutputTokens: 900, Preemptions: 5, Outcome: OutcomeOK},
		// TTFT 500ms, TPOT 2s/20 = 100ms, E2E 2.5s, queue 100ms: meets the SLO.
		{ID: 1, Replica: 0, Arrival: 1 * s, Dispatch: 1100 * ms, FirstToken: 1500 * ms, End: 3500 * ms, HasFirstToken: true,
			PromptTokens: 100, CachedTokens: 50, PredictedCachedTokens: 40, OutputTokens: 21, Preemptions: 1, Outcome: OutcomeOK},
		// TTFT 3s (misses), TPOT 1s/10 = 100ms, E2E 4s, queue 0.
		{ID: 2, Replica: 1, Arrival: 2 * s, Dispatch: 2 * s, FirstToken: 5 * s, End: 6 * s, HasFirstToken: true,
			PromptTokens: 200, CachedTokens: 0, PredictedCachedTokens: 100, OutputTokens: 11, Outcome: OutcomeOK},
		// TTFT 1s, TPOT 1s/4 = 250ms (misses), E2E 2s, queue 500ms.
		{ID: 3, Replica: 0, Arrival: 3 * s, Dispatch: 3500 * ms, FirstToken: 4 * s, End: 5 * s, HasFirstToken: true,
			PromptTokens: 100, CachedTokens: 100, PredictedCachedTokens: 100, OutputTokens: 5, Outcome: OutcomeOK},
		// TTFT 200ms, one output token so TPOT undefined, E2E 300ms, queue 200ms: meets the SLO.
		{ID: 4, Replica: 1, Arrival: 4 * s, Dispatch: 4200 * ms, FirstToken: 4200 * ms, End: 4300 * ms, HasFirstToken: true,
			PromptTokens: 100, CachedTokens: 50, PredictedCachedTokens: 0, OutputTokens: 1, Outcome: OutcomeOK},
		// Never dispatched, failed.
		{ID: 5, Replica: -1, Arrival: 5 * s, PromptTokens: 50, Outcome: OutcomeFailed},
		// Aborted after its first token: TTFT 1s and queue 500ms count; tokens do not.
		{ID: 6, Replica: 1, Arrival: 7 * s, Dispatch: 7500 * ms, FirstToken: 8 * s, HasFirstToken: true,
			PromptTokens: 1000, CachedTokens: 1000, OutputTokens: 3, Preemptions: 2, Outcome: OutcomeAborted},
	}
}

func handOptions() SummaryOptions {
	itl := NewHistogram()
	for range 3 {
		itl.Add(10 * ms)
	}
	return SummaryOptions{
		Warmup:       1 * s,
		SLO:          DefaultSLO(),
		Replicas:     []ReplicaInfo{{Name: "r0", Busy: 10 * s}, {Name: "r1", Busy: 5 * s}},
		ITL:          itl,
		SimulatedEnd: 20 * s,
	}
}

func TestSummarize(t *testing.T) {
	got := Summarize(handRecords(), handOptions())
	want := Summary{
		Replicas:  2,
		Requests:  6,
		Completed: 4,
		Failed:    2,
		// Window: first arrival 1s to the last arrival 7s (later than the last end, 6s).
		DurationS:        6,
		ThroughputRPS:    0.666667, // 4/6
		OutputTokensPerS: 6.33333,  // 38/6
		// TTFT over [200 500 1000 1000 3000].
		TTFT: Latency{Mean: 1140, P50: 1000, P90: 2200, P99: 2920},
		// TPOT over [100 100 250].
		TPOT: Latency{Mean: 150, P50: 100, P90: 220, P99: 247},
		ITL:  Latency{Mean: 10, P50: 10, P90: 10, P99: 10},
		// E2E over [300 2000 2500 4000].
		E2E: Latency{Mean: 2200, P50: 2250, P90: 3550, P99: 3955},
		// Queue over [0 100 200 500 500].
		QueueMs:          Latency{Mean: 260, P50: 200, P90: 500, P99: 500},
		HitRate:          0.4,  // 200/500
		PredictedHitRate: 0.48, // 240/500
		// Predicted - cached over the completed: -10, +100, 0, -50.
		Prediction:    Prediction{Exact: 0.25, Over: 0.25, Under: 0.5, MeanErrorTokens: 10, MeanAbsErrorTokens: 40},
		SLOTTFTP99Ms:  2000,
		SLOTPOTP99Ms:  100,
		SLOAttainment: 0.3333, // requests 1 and 4 of 6
		SLOMet:        false,  // TTFT p99 2920ms > 2s
		GoodputRPS:    0.333333,
		Preemptions:   3,
		PerReplica: []ReplicaSummary{
			{Replica: "r0", Requests: 2, PromptTokens: 200, CachedTokens: 150, HitRate: 0.75, BusyFraction: 0.5},
			{Replica: "r1", Requests: 3, PromptTokens: 300, CachedTokens: 50, HitRate: 0.1667, BusyFraction: 0.25},
		},
		SimulatedS: 20,
	}
	assertSummary(t, got, want)

	// A looser SLO: every completed request meets it, and so do the p99s.
	opts := handOptions()
	opts.SLO = SLO{TTFTP99: 5 * s, TPOTP99: 300 * ms}
	got = Summarize(handRecords(), opts)
	want.SLOTTFTP99Ms, want.SLOTPOTP99Ms = 5000, 300
	want.SLOAttainment, want.GoodputRPS, want.SLOMet = 0.6667, 0.666667, true
	assertSummary(t, got, want)
}

func assertSummary(t *testing.T, got, want Summary) {
	t.Helper()
	g, err := json.MarshalIndent(got, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	w, err := json.MarshalIndent(want, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g, w) {
		gl, wl := strings.Split(string(g), "\n"), strings.Split(string(w), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Errorf("line %d: got %s, want %s", i+1, gl[i], wl[i])
			}
		}
		if len(gl) != len(wl) {
			t.Errorf("got %d lines, want %d", len(gl), len(wl))
		}
	}
}

func TestSummarizeWarmupExcludesAll(t *testing.T) {
	opts := handOptions()
	opts.Warmup = time.Hour
	got := Summarize(handRecords(), opts)
	if got.Requests != 0 || got.Completed != 0 || got.Failed != 0 || got.Preemptions != 0 ||
		got.DurationS != 0 || got.TTFT != (Latency{}) || got.HitRate != 0 || got.SLOMet {
		t.Errorf("all records in warmup, got %+v", got)
	}
	for _, r := range got.PerReplica {
		if r.Requests != 0 || r.PromptTokens != 0 {
			t.Errorf("replica %s counts warmup records: %+v", r.Replica, r)
		}
	}
	// Busy fractions do not depend on warmup.
	if got.PerReplica[0].BusyFraction != 0.5 {
		t.Errorf("busy fraction = %v, want 0.5", got.PerReplica[0].BusyFraction)
	}
}

func TestSummarizeDefaultsAndOutOfRangeReplica(t *testing.T) {
	recs := []Record{{Replica: 7, Arrival: 0, Dispatch: s, FirstToken: 2 * s, End: 3 * s, HasFirstToken: true,
		PromptTokens: 10, OutputTokens: 1, Outcome: OutcomeOK}}
	got := Summarize(recs, SummaryOptions{Replicas: []ReplicaInfo{{Name: "a"}}})
	if got.SLOTTFTP99Ms != 2000 || got.SLOTPOTP99Ms != 100 {
		t.Errorf("zero SLO should default to 2s/100ms, got %v/%v", got.SLOTTFTP99Ms, got.SLOTPOTP99Ms)
	}
	if got.Completed != 1 || got.PerReplica[0].Requests != 0 || got.PerReplica[0].BusyFraction != 0 {
		t.Errorf("got %+v", got)
	}
	if got.ITL != (Latency{}) {
		t.Errorf("nil ITL should give zeros, got %+v", got.ITL)
	}
}

var summaryKeys = []string{
	"workload", "policy", "replicas", "seed", "rate_rps", "requests", "completed", "failed",
	"duration_s", "throughput_rps", "output_tokens_per_s", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms",
	"queue_ms", "hit_rate", "predicted_hit_rate", "prediction", "slo_ttft_p99_ms", "slo_tpot_p99_ms",
	"slo_attainment", "slo_met", "goodput_rps", "preemptions", "per_replica", "simulated_s",
	"sim_wall_s", "sim_events",
}

func TestSummaryJSON(t *testing.T) {
	for name, sum := range map[string]Summary{
		"hand":  Summarize(handRecords(), handOptions()),
		"empty": Summarize(nil, SummaryOptions{}),
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteJSON(&buf, sum); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			if !strings.HasSuffix(out, "}\n") || !strings.HasPrefix(out, "{\n  \"workload\"") {
				t.Errorf("want two-space indent and trailing newline:\n%s", out)
			}
			if strings.Contains(out, "NaN") || strings.Contains(out, "Inf") || strings.Contains(out, "null") {
				t.Errorf("JSON has NaN, Inf or null:\n%s", out)
			}
			var m map[string]any
			if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
				t.Fatal(err)
			}
			if len(m) != len(summaryKeys) {
				t.Errorf("got %d keys, want %d", len(m), len(summaryKeys))
			}
			for _, k := range summaryKeys {
				if _, ok := m[k]; !ok {
					t.Errorf("missing key %q", k)
				}
			}
			for _, k := range []string{"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"} {
				lat, _ := m[k].(map[string]any)
				for _, lk := range []string{"mean", "p50", "p90", "p99"} {
					if _, ok := lat[lk]; !ok {
						t.Errorf("missing key %s.%s", k, lk)
					}
				}
			}
			for _, r := range m["per_replica"].([]any) {
				for _, rk := range []string{"replica", "requests", "prompt_tokens", "cached_tokens", "hit_rate", "busy_fraction"} {
					if _, ok := r.(map[string]any)[rk]; !ok {
						t.Errorf("missing key per_replica.%s", rk)
					}
				}
			}
		})
	}
}

func TestSummarizeDeterministic(t *testing.T) {
	recs := syntheticRecords(5000, 8)
	opts := syntheticOptions(8)
	encode := func(recs []Record) []byte {
		var buf bytes.Buffer
		if err := WriteJSON(&buf, Summarize(recs, opts)); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	first := encode(recs)
	if second := encode(recs); !bytes.Equal(first, second) {
		t.Fatal("Summarize twice gave different JSON")
	}
	// Record order does not matter either.
	shuffled := slices.Clone(recs)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) {
		shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
	})
	if third := encode(shuffled); !bytes.Equal(first, third) {
		t.Fatal("Summarize of shuffled records gave different JSON")
	}
}

func TestWriteSummaryFile(t *testing.T) {
	path := t.TempDir() + "/summary.json"
	sum := Summarize(handRecords(), handOptions())
	if err := WriteSummaryFile(path, sum); err != nil {
		t.Fatal(err)
	}
	if err := WriteSummaryFile(t.TempDir()+"/missing/dir/summary.json", sum); err == nil {
		t.Error("want an error writing into a missing directory")
	}
}

func TestSLOValidate(t *testing.T) {
	if err := DefaultSLO().Validate(); err != nil {
		t.Errorf("default SLO: %v", err)
	}
	if err := (SLO{TTFTP99: 0, TPOTP99: ms}).Validate(); err == nil {
		t.Error("zero TTFT bound accepted")
	}
	if err := (SLO{TTFTP99: s, TPOTP99: -ms}).Validate(); err == nil {
		t.Error("negative TPOT bound accepted")
	}
}

// syntheticRecords makes n plausible records over the given number of
// replicas, deterministically.
func syntheticRecords(n, replicas int) []Record {
	rng := rand.New(rand.NewPCG(42, 7))
	recs := make([]Record, n)
	for i := range recs {
		arrival := time.Duration(i) * 5 * ms
		queue := time.Duration(rng.IntN(50)) * ms
		ttft := queue + time.Duration(50+rng.IntN(2000))*ms
		out := 1 + rng.IntN(500)
		prompt := 100 + rng.IntN(4000)
		r := Record{
			ID: uint64(i), Session: uint64(i / 4), Turn: i % 4,
			Replica: rng.IntN(replicas), Arrival: arrival, Dispatch: arrival + queue,
			FirstToken: arrival + ttft, HasFirstToken: true,
			End:          arrival + ttft + time.Duration(out-1)*time.Duration(10+rng.IntN(40))*ms,
			PromptTokens: prompt, CachedTokens: rng.IntN(prompt), PredictedCachedTokens: rng.IntN(prompt),
			OutputTokens: out, Preemptions: rng.IntN(2), Outcome: OutcomeOK,
		}
		switch rng.IntN(50) {
		case 0:
			r.Outcome, r.Replica, r.HasFirstToken = OutcomeFailed, -1, false
		case 1:
			r.Outcome = OutcomeAborted
		}
		recs[i] = r
	}
	return recs
}

func syntheticOptions(replicas int) SummaryOptions {
	opts := SummaryOptions{Warmup: 10 * s, SLO: DefaultSLO(), ITL: NewHistogram(), SimulatedEnd: 120 * s}
	for i := range replicas {
		opts.Replicas = append(opts.Replicas, ReplicaInfo{Name: "replica-" + string(rune('a'+i)), Busy: time.Duration(60+i) * s})
		opts.ITL.Add(time.Duration(10+i) * ms)
	}
	return opts
}

func BenchmarkSummarize20k(b *testing.B) {
	recs := syntheticRecords(20000, 8)
	opts := syntheticOptions(8)
	b.ReportAllocs()
	for b.Loop() {
		Summarize(recs, opts)
	}
}

func TestPredictionAccuracy(t *testing.T) {
	recs := []Record{
		{Replica: 0, HasFirstToken: true, Outcome: OutcomeOK, PromptTokens: 100, CachedTokens: 64, PredictedCachedTokens: 64},
		{Replica: 0, HasFirstToken: true, Outcome: OutcomeOK, PromptTokens: 100, CachedTokens: 32, PredictedCachedTokens: 64},
		{Replica: 0, HasFirstToken: true, Outcome: OutcomeOK, PromptTokens: 100, CachedTokens: 96, PredictedCachedTokens: 0},
		{Replica: 0, HasFirstToken: true, Outcome: OutcomeOK, PromptTokens: 100, CachedTokens: 16, PredictedCachedTokens: 16},
		{Replica: 0, Outcome: OutcomeFailed, PromptTokens: 100, PredictedCachedTokens: 99}, // not completed: left out
	}
	got := Summarize(recs, SummaryOptions{Replicas: []ReplicaInfo{{Name: "r"}}}).Prediction
	want := Prediction{Exact: 0.5, Over: 0.25, Under: 0.25, MeanErrorTokens: (0 + 32 - 96 + 0) / 4.0, MeanAbsErrorTokens: (32 + 96) / 4.0}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
