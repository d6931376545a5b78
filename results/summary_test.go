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
		Warmup: 1 * s,
		SLO:    DefaultSLO(),
		Replicas: []ReplicaInfo{
			{Name: "r0", Busy: 10 * s, PeakReservedBlocks: 300, PeakRunning: 12, CapacityBlocks: 1000},
			{Name: "r1", Busy: 5 * s, PeakReservedBlocks: 450, PeakRunning: 7, CapacityBlocks: 700},
		},
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
		// Request 5 failed, request 6 was aborted: both engine failures.
		Failed:       2,
		EngineFailed: 2,
		Rejected:     map[string]int{},
		FailedBy:     map[string]int{"failed": 1, "aborted": 1},
		FailureReasons: map[string]string{"failed": "failed, no reason recorded",
			"aborted": "still in flight when the run stopped, or cancelled"},
		// Window: first arrival 1s to the last arrival 7s; the span is the
		// same (the last arrival is later than the last end, 6s).
		WindowS:          6,
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
		// Per replica, preemptions of measured requests: request 1 on r0,
		// request 6 on r1 (request 0, in warmup, is left out).
		PerReplica: []ReplicaSummary{
			{Replica: "r0", Requests: 2, PromptTokens: 200, CachedTokens: 150, HitRate: 0.75, BusyFraction: 0.5,
				PeakReservedBlocks: 300, PeakRunning: 12, CapacityBlocks: 1000, Preemptions: 1},
			{Replica: "r1", Requests: 3, PromptTokens: 300, CachedTokens: 50, HitRate: 0.1667, BusyFraction: 0.25,
				PeakReservedBlocks: 450, PeakRunning: 7, CapacityBlocks: 700, Preemptions: 2},
		},
		PeakReservedOverCapacity: 0.6429, // max(300/1000, 450/700)
		SimulatedS:               20,
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
	recs := append(handRecords(), handRejected()...)
	recs = append(recs, Record{Replica: 0, Arrival: 2 * s, Priority: 3, Outcome: OutcomeOK})
	got := Summarize(recs, opts)
	if got.Requests != 0 || got.Completed != 0 || got.Failed != 0 || got.EngineFailed != 0 ||
		got.RejectedTotal != 0 || got.Rejected == nil || len(got.Rejected) != 0 || got.ByPriority != nil ||
		got.Preemptions != 0 || got.DurationS != 0 || got.TTFT != (Latency{}) || got.QueueMs != (Latency{}) ||
		got.HitRate != 0 || got.SLOMet {
		t.Errorf("all records in warmup, got %+v", got)
	}
	for _, r := range got.PerReplica {
		if r.Requests != 0 || r.PromptTokens != 0 || r.Preemptions != 0 {
			t.Errorf("replica %s counts warmup records: %+v", r.Replica, r)
		}
	}
	// Busy fractions and peaks do not depend on warmup.
	if r := got.PerReplica[1]; r.BusyFraction != 0.25 || r.PeakReservedBlocks != 450 || r.PeakRunning != 7 ||
		r.CapacityBlocks != 700 || got.PeakReservedOverCapacity != 0.6429 {
		t.Errorf("replica r1 = %+v, peak/capacity %v; want busy 0.25, peaks 450 and 7, capacity 700, 0.6429",
			r, got.PeakReservedOverCapacity)
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

func TestPeakReservedOverCapacity(t *testing.T) {
	for _, c := range []struct {
		name  string
		infos []ReplicaInfo
		want  float64
	}{
		{"no replicas", nil, 0},
		{"capacity unknown", []ReplicaInfo{{PeakReservedBlocks: 500}}, 0},
		// The unknown capacity does not hide the known one, and the max wins.
		{"max over replicas", []ReplicaInfo{{PeakReservedBlocks: 500}, {PeakReservedBlocks: 1, CapacityBlocks: 3},
			{PeakReservedBlocks: 2, CapacityBlocks: 8}}, 0.3333},
		{"full", []ReplicaInfo{{PeakReservedBlocks: 64, CapacityBlocks: 64}}, 1},
	} {
		got := Summarize(nil, SummaryOptions{Replicas: c.infos})
		if got.PeakReservedOverCapacity != c.want {
			t.Errorf("%s: peak reserved over capacity = %v, want %v", c.name, got.PeakReservedOverCapacity, c.want)
		}
		for i, r := range got.PerReplica {
			if r.PeakReservedBlocks != c.infos[i].PeakReservedBlocks || r.CapacityBlocks != c.infos[i].CapacityBlocks {
				t.Errorf("%s: replica %d = %+v, not copied from %+v", c.name, i, r, c.infos[i])
			}
		}
	}
}

// handRejected are gateway rejections to add to handRecords. Some carry a
// Replica, a Dispatch and even a first token, which Summarize must ignore:
// taken for dispatched requests, they would change queue_ms, ttft_ms,
// engine_failed and the per-replica counts.
func handRejected() []Record {
	return []Record{
		// Queue 58s if it counted.
		{ID: 7, Replica: 0, Arrival: 2 * s, Dispatch: 60 * s, FirstToken: 61 * s, HasFirstToken: true,
			PromptTokens: 10, Outcome: OutcomeRejected, Reject: RejectQueueTimeout},
		{ID: 8, Replica: -1, Arrival: 3 * s, PromptTokens: 10, Outcome: OutcomeRejected, Reject: RejectQueueFull},
		{ID: 9, Replica: -1, Arrival: 4 * s, PromptTokens: 10, Outcome: OutcomeRejected, Reject: RejectQueueFull},
		// No reason given: counted as unknown. Queue 0 if it counted.
		{ID: 10, Replica: 1, Arrival: 5 * s, Dispatch: 5 * s, Outcome: OutcomeRejected},
		// In warmup: counted nowhere.
		{ID: 11, Replica: -1, Arrival: 100 * ms, Outcome: OutcomeRejected, Reject: RejectTooLong},
	}
}

func TestSummarizeRejected(t *testing.T) {
	base := Summarize(handRecords(), handOptions())
	got := Summarize(append(handRecords(), handRejected()...), handOptions())

	// Rejections add to the request and failure counts and lower SLO
	// attainment; nothing else changes (their arrivals are inside the
	// window, so throughput and goodput keep their denominator).
	want := base
	want.Requests += 4
	want.Failed += 4
	want.RejectedTotal = 4
	want.Rejected = map[string]int{RejectQueueFull: 2, RejectQueueTimeout: 1, RejectUnknown: 1}
	want.FailedBy = map[string]int{"failed": 1, "aborted": 1, RejectQueueFull: 2, RejectQueueTimeout: 1, RejectUnknown: 1}
	want.FailureReasons = map[string]string{"failed": ReasonMeaning("failed"), "aborted": ReasonMeaning("aborted"),
		RejectQueueFull: ReasonMeaning(RejectQueueFull), RejectQueueTimeout: ReasonMeaning(RejectQueueTimeout), RejectUnknown: ReasonMeaning(RejectUnknown)}
	want.SLOAttainment = 0.2 // requests 1 and 4 of 10
	assertSummary(t, got, want)

	if got.QueueMs != base.QueueMs {
		t.Errorf("rejected requests counted in queue_ms: %+v, want %+v", got.QueueMs, base.QueueMs)
	}
	if got.EngineFailed != base.EngineFailed {
		t.Errorf("rejected requests counted as engine failures: %d, want %d", got.EngineFailed, base.EngineFailed)
	}
	if got.Failed != got.EngineFailed+got.RejectedTotal {
		t.Errorf("failed %d != engine_failed %d + rejected_total %d", got.Failed, got.EngineFailed, got.RejectedTotal)
	}

	// Only rejections: every request failed, none on an engine.
	only := Summarize(handRejected(), handOptions())
	if only.Requests != 4 || only.Failed != 4 || only.EngineFailed != 0 || only.RejectedTotal != 4 ||
		only.QueueMs != (Latency{}) || only.TTFT != (Latency{}) || only.PerReplica[0].Requests != 0 ||
		only.PerReplica[1].Requests != 0 || only.SLOAttainment != 0 {
		t.Errorf("only rejections: %+v", only)
	}
}

// classRecords have three priority classes; classOptions' warmup leaves out
// a fourth.
func classRecords() []Record {
	return []Record{
		// Priority 5: TTFT [300 1000], queue [100 500]; one rejection, whose
		// bogus dispatch (queue 9s) must not count.
		{Priority: 5, Tenant: "gold", Replica: 0, Arrival: 1 * s, Dispatch: 1100 * ms, FirstToken: 1300 * ms, End: 1400 * ms,
			HasFirstToken: true, OutputTokens: 2, Outcome: OutcomeOK},
		{Priority: 5, Tenant: "gold", Replica: 1, Arrival: 2 * s, Dispatch: 2500 * ms, FirstToken: 3 * s, End: 3100 * ms,
			HasFirstToken: true, OutputTokens: 2, Outcome: OutcomeOK},
		{Priority: 5, Tenant: "gold", Replica: 0, Arrival: 3 * s, Dispatch: 12 * s, Outcome: OutcomeRejected, Reject: RejectSLOShed},
		// Priority 1: aborted after its first token, TTFT 700, queue 50.
		{Priority: 1, Tenant: "silver", Replica: 1, Arrival: 4 * s, Dispatch: 4050 * ms, FirstToken: 4700 * ms,
			HasFirstToken: true, OutputTokens: 5, Outcome: OutcomeAborted},
		// Priority 0: one completed (TTFT 200, queue 0), one failed undispatched.
		{Replica: 0, Arrival: 5 * s, Dispatch: 5 * s, FirstToken: 5200 * ms, End: 5300 * ms,
			HasFirstToken: true, OutputTokens: 1, Outcome: OutcomeOK},
		{Replica: -1, Arrival: 6 * s, Outcome: OutcomeFailed},
		// Warmup: its class must not appear.
		{Priority: 9, Replica: 0, Arrival: 500 * ms, Dispatch: 500 * ms, FirstToken: 600 * ms, End: 700 * ms,
			HasFirstToken: true, OutputTokens: 1, Outcome: OutcomeOK},
	}
}

func classOptions() SummaryOptions {
	return SummaryOptions{Warmup: 1 * s, Replicas: []ReplicaInfo{{Name: "a"}, {Name: "b"}}, SimulatedEnd: 10 * s}
}

func TestSummarizeByPriority(t *testing.T) {
	got := Summarize(classRecords(), classOptions())
	want := []ClassSummary{
		{Priority: 5, Requests: 3, Completed: 2, Rejected: 1, TTFTP99Ms: 993, QueueP99Ms: 496}, // 300+0.99*700, 100+0.99*400
		{Priority: 1, Requests: 1, Completed: 0, Rejected: 0, TTFTP99Ms: 700, QueueP99Ms: 50},
		{Priority: 0, Requests: 2, Completed: 1, Rejected: 0, TTFTP99Ms: 200, QueueP99Ms: 0},
	}
	if !slices.Equal(got.ByPriority, want) {
		t.Errorf("by priority:\n got %+v\nwant %+v", got.ByPriority, want)
	}
	if got.Requests != 6 || got.RejectedTotal != 1 || got.Rejected[RejectSLOShed] != 1 || got.EngineFailed != 2 {
		t.Errorf("totals: %+v", got)
	}

	// Record order does not matter.
	recs := classRecords()
	slices.Reverse(recs)
	if again := Summarize(recs, classOptions()); !slices.Equal(again.ByPriority, want) {
		t.Errorf("reversed records: by priority %+v", again.ByPriority)
	}

	// All priorities 0 among measured requests (the only other one is in
	// warmup): no breakdown, and no by_priority key.
	recs = classRecords()
	for i := range recs[:6] {
		recs[i].Priority = 0
	}
	if none := Summarize(recs, classOptions()); none.ByPriority != nil {
		t.Errorf("all priorities 0: by priority %+v, want nil", none.ByPriority)
	}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, Summarize(handRecords(), handOptions())); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "by_priority") {
		t.Error("by_priority in the JSON of a run without priorities")
	}
}

var summaryKeys = []string{
	"workload", "policy", "replicas", "seed", "rate_rps", "requests", "completed", "failed",
	"engine_failed", "rejected_total", "rejected", "failed_by", "window_s", "duration_s", "throughput_rps", "output_tokens_per_s", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms",
	"queue_ms", "hit_rate", "predicted_hit_rate", "prediction", "slo_ttft_p99_ms", "slo_tpot_p99_ms",
	"slo_attainment", "slo_met", "goodput_rps", "steady_state", "preemptions", "per_replica",
	"peak_reserved_over_capacity", "simulated_s", "sim_wall_s", "sim_events",
}

func TestSummaryJSON(t *testing.T) {
	for name, sum := range map[string]Summary{
		"hand":     Summarize(handRecords(), handOptions()),
		"empty":    Summarize(nil, SummaryOptions{}),
		"rejected": Summarize(append(handRecords(), handRejected()...), handOptions()),
		"classes":  Summarize(classRecords(), classOptions()),
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
			keys := summaryKeys
			if sum.Failed > 0 {
				keys = append(slices.Clone(keys), "failure_reasons")
			}
			if name == "classes" {
				keys = append(slices.Clone(keys), "by_priority", "per_tenant") // its records have tenants
			}
			if len(m) != len(keys) {
				t.Errorf("got %d keys, want %d", len(m), len(keys))
			}
			for _, k := range keys {
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
				for _, rk := range []string{"replica", "requests", "prompt_tokens", "cached_tokens", "hit_rate", "busy_fraction", "token_budget_use",
					"peak_reserved_blocks", "peak_running", "capacity_blocks", "preemptions"} {
					if _, ok := r.(map[string]any)[rk]; !ok {
						t.Errorf("missing key per_replica.%s", rk)
					}
				}
			}
			rej, ok := m["rejected"].(map[string]any)
			if !ok {
				t.Errorf("rejected is %T, want an object", m["rejected"])
			}
			n := 0
			for _, v := range rej {
				n += int(v.(float64))
			}
			if total := m["rejected_total"].(float64); int(total) != n || n != sum.RejectedTotal {
				t.Errorf("rejected_total %v, rejected %v, want both %d", total, rej, sum.RejectedTotal)
			}
			classes, _ := m["by_priority"].([]any)
			if (name == "classes") != (len(classes) > 0) {
				t.Errorf("by_priority = %v", m["by_priority"])
			}
			for _, c := range classes {
				for _, ck := range []string{"priority", "requests", "completed", "rejected", "ttft_p99_ms", "queue_p99_ms"} {
					if _, ok := c.(map[string]any)[ck]; !ok {
						t.Errorf("missing key by_priority.%s", ck)
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
			Priority: i % 3, Tenant: "tenant-" + string(rune('a'+i%5)),
		}
		switch rng.IntN(50) {
		case 0:
			r.Outcome, r.Replica, r.HasFirstToken = OutcomeFailed, -1, false
		case 1:
			r.Outcome = OutcomeAborted
		case 2, 3:
			reasons := []string{RejectQueueFull, RejectQueueTimeout, RejectNoReplica, RejectTooLong, RejectSLOShed}
			r.Outcome, r.Reject, r.Replica, r.HasFirstToken = OutcomeRejected, reasons[i%len(reasons)], -1, false
			r.Preemptions = 0
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
