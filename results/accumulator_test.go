package results

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// randomLatency is a duration spread over many decades: zero a tenth of the
// time, else log-uniform in [1ns, 2^scale ns).
func randomLatency(rng *rand.Rand, scale int) time.Duration {
	if rng.IntN(10) == 0 {
		return 0
	}
	e := rng.IntN(scale)
	return time.Duration(1<<e + rng.Int64N(1<<e))
}

// drawRun draws a run: n records of every outcome, with priorities,
// tenants, replicas in and out of the fleet, latencies from nanoseconds to
// minutes, and summary options with a warmup, an SLO and 0-4 replicas.
func drawRun(t *rapid.T, minN, maxN int) ([]Record, SummaryOptions) {
	n := rapid.IntRange(minN, maxN).Draw(t, "n")
	rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))
	scale := rapid.IntRange(1, 37).Draw(t, "scale") // latencies up to 2^37 ns, about 137s
	gap := time.Duration(rapid.Int64Range(0, int64(2*time.Second)).Draw(t, "gap"))
	tenants := rapid.IntRange(0, 4).Draw(t, "tenants")
	classes := rapid.IntRange(1, 3).Draw(t, "classes")
	replicas := rapid.IntRange(0, 4).Draw(t, "replicas")
	recs := make([]Record, n)
	var at time.Duration
	for i := range recs {
		if gap > 0 {
			at += time.Duration(rng.Int64N(int64(gap)))
		}
		queue := randomLatency(rng, scale)
		ttft := queue + randomLatency(rng, scale)
		out := 1 + rng.IntN(300)
		prompt := rng.IntN(5000)
		r := Record{
			ID: uint64(i), Replica: rng.IntN(replicas+2) - 1, Arrival: at, Dispatch: at + queue,
			FirstToken: at + ttft, HasFirstToken: rng.IntN(20) != 0,
			End:          at + ttft + randomLatency(rng, scale),
			PromptTokens: prompt, CachedTokens: rng.IntN(prompt + 1), PredictedCachedTokens: rng.IntN(prompt + 1),
			OutputTokens: out, Preemptions: rng.IntN(3), Outcome: OutcomeOK,
			Priority: rng.IntN(classes),
		}
		if tenants > 0 {
			r.Tenant = fmt.Sprintf("t%d", rng.IntN(tenants))
		}
		switch rng.IntN(12) {
		case 0:
			r.Outcome, r.Fail = OutcomeFailed, []string{"", RejectTooLong, FailTooLarge}[rng.IntN(3)]
		case 1:
			r.Outcome = OutcomeAborted
		case 2:
			r.Outcome = OutcomeRejected
			r.Reject = []string{"", RejectQueueFull, RejectRateLimited}[rng.IntN(3)]
		}
		recs[i] = r
	}
	opts := SummaryOptions{
		Warmup:       time.Duration(rapid.Int64Range(0, int64(at/4)+1).Draw(t, "warmup")),
		SLO:          SLO{TTFTP99: time.Duration(1 << rapid.IntRange(10, 37).Draw(t, "slo ttft")), TPOTP99: time.Duration(1 << rapid.IntRange(10, 30).Draw(t, "slo tpot"))},
		SimulatedEnd: at + time.Minute,
		OfferedRate:  rapid.Float64Range(0, 50).Draw(t, "offered"),
	}
	for i := range replicas {
		opts.Replicas = append(opts.Replicas, ReplicaInfo{Name: fmt.Sprint("r", i), Busy: time.Duration(i) * time.Second, CapacityBlocks: 100, PeakReservedBlocks: 10 * i})
	}
	return recs, opts
}

// accumulate feeds recs to an accumulator in the order perm gives (nil:
// in order) and returns its summary.
func accumulate(recs []Record, opts SummaryOptions, perm []int) Summary {
	a := NewAccumulator(opts)
	for i := range recs {
		if perm != nil {
			a.Add(&recs[perm[i]])
		} else {
			a.Add(&recs[i])
		}
	}
	return a.Summary(opts)
}

func encodeSummary(t interface{ Fatal(...any) }, s Summary) []byte {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, s); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Under its exact limit the streaming summary is the one computed over the
// records held in memory (refSummarize, the code it replaced), bit for bit,
// in whatever order the records come.
func TestStreamingSummaryEqualsExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		recs, opts := drawRun(t, 0, 3000)
		opts.ExactLimit = rapid.SampledFrom([]int{0, len(recs), len(recs) + 1, 1 << 30}).Draw(t, "limit")
		want := refSummarize(recs, opts)
		perm := rand.New(rand.NewPCG(uint64(len(recs)), 2)).Perm(len(recs))
		got := accumulate(recs, opts, perm)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("streaming summary differs from the exact one:\n got %+v\nwant %+v", got, want)
		}
		if g, w := encodeSummary(t, got), encodeSummary(t, Summarize(recs, opts)); !bytes.Equal(g, w) || !bytes.Equal(g, encodeSummary(t, want)) {
			t.Fatalf("JSON differs:\n%s\n%s", g, w)
		}
		if got.PercentileError != 0 {
			t.Fatalf("percentile_error %v under the exact limit", got.PercentileError)
		}
	})
}

// withinBound reports whether got is within PercentileError of want,
// relative (both rounded to 6 significant digits as summaries are).
func withinBound(got, want float64) bool {
	return math.Abs(got-want) <= PercentileError*math.Abs(want)+1e-9
}

// Past its exact limit the streaming summary keeps every count, sum and
// rate exact, every mean to its rounding, and every percentile within
// PercentileError of the exact one, and says so.
func TestStreamingSummaryWithinBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		recs, opts := drawRun(t, 2, 3000)
		opts.ExactLimit = rapid.IntRange(1, len(recs)-1).Draw(t, "limit")
		exact := refSummarize(recs, opts)
		got := Summarize(recs, opts)
		if got.PercentileError != PercentileError {
			t.Fatalf("percentile_error %v past the exact limit, want %v", got.PercentileError, PercentileError)
		}
		lat := func(name string, g, w Latency) {
			if math.Abs(g.Mean-w.Mean) > 1e-5*math.Abs(w.Mean)+1e-9 {
				t.Fatalf("%s mean %v, exact %v", name, g.Mean, w.Mean)
			}
			for _, p := range [][2]float64{{g.P50, w.P50}, {g.P90, w.P90}, {g.P99, w.P99}} {
				if !withinBound(p[0], p[1]) {
					t.Fatalf("%s %+v, exact %+v: off by more than %v", name, g, w, PercentileError)
				}
			}
		}
		lat("ttft", got.TTFT, exact.TTFT)
		lat("tpot", got.TPOT, exact.TPOT)
		lat("e2e", got.E2E, exact.E2E)
		lat("queue", got.QueueMs, exact.QueueMs)
		if len(got.ByPriority) != len(exact.ByPriority) || len(got.PerTenant) != len(exact.PerTenant) {
			t.Fatalf("classes %d/%d, tenants %d/%d", len(got.ByPriority), len(exact.ByPriority), len(got.PerTenant), len(exact.PerTenant))
		}
		for i, c := range got.ByPriority {
			e := exact.ByPriority[i]
			if !withinBound(c.TTFTP99Ms, e.TTFTP99Ms) || !withinBound(c.QueueP99Ms, e.QueueP99Ms) {
				t.Fatalf("class %+v, exact %+v", c, e)
			}
			got.ByPriority[i].TTFTP99Ms, got.ByPriority[i].QueueP99Ms = e.TTFTP99Ms, e.QueueP99Ms
		}
		for i, c := range got.PerTenant {
			e := exact.PerTenant[i]
			if !withinBound(c.TTFTP50Ms, e.TTFTP50Ms) || !withinBound(c.TTFTP99Ms, e.TTFTP99Ms) || !withinBound(c.E2EP99Ms, e.E2EP99Ms) {
				t.Fatalf("tenant %+v, exact %+v", c, e)
			}
			got.PerTenant[i].TTFTP50Ms, got.PerTenant[i].TTFTP99Ms, got.PerTenant[i].E2EP99Ms = e.TTFTP50Ms, e.TTFTP99Ms, e.E2EP99Ms
		}
		slo := opts.SLO
		if met := got.Completed > 0 && got.TTFT.P99 <= durMs(slo.TTFTP99) && got.TPOT.P99 <= durMs(slo.TPOTP99); got.SLOMet != met {
			t.Fatalf("slo_met %v against its own p99s %v and %v", got.SLOMet, got.TTFT.P99, got.TPOT.P99)
		}
		if got.Steady.Checked && got.Steady.BinS <= 0 {
			t.Fatalf("binned steady-state check without its bin width: %+v", got.Steady)
		}
		// Everything else is exact. (The steady-state check cuts its halves
		// at a bin edge: TestSteadyBinsNearExact.)
		got.TTFT, got.TPOT, got.E2E, got.QueueMs = exact.TTFT, exact.TPOT, exact.E2E, exact.QueueMs
		got.PercentileError, got.SLOMet, got.Steady = 0, exact.SLOMet, exact.Steady
		if !reflect.DeepEqual(got, exact) {
			t.Fatalf("past the exact limit:\n got %+v\nwant %+v", got, exact)
		}
	})
}

// Past the exact limit too, the summary does not depend on the order the
// records come in.
func TestStreamingSummaryOrderFree(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		recs, opts := drawRun(t, 2, 2000)
		opts.ExactLimit = rapid.IntRange(1, len(recs)-1).Draw(t, "limit")
		want := encodeSummary(t, accumulate(recs, opts, nil))
		perm := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "perm"), 3)).Perm(len(recs))
		if got := encodeSummary(t, accumulate(recs, opts, perm)); !bytes.Equal(got, want) {
			t.Fatalf("shuffled records gave another summary:\n%s\n%s", got, want)
		}
	})
}

// The sketch's order statistics are within 1/256 of the exact ones (exact
// below 256 ns, and for the smallest and the largest), and its count,
// extremes and mean are exact.
func TestSketchRanks(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 4))
		scale := rapid.IntRange(1, 62).Draw(t, "scale")
		n := rapid.IntRange(1, 3000).Draw(t, "n")
		ds := make([]time.Duration, n)
		var sk, a, b sketch
		for i := range ds {
			ds[i] = randomLatency(rng, scale)
			sk.add(ds[i])
			if i%2 == 0 {
				a.add(ds[i])
			} else {
				b.add(ds[i])
			}
		}
		a.merge(&b)
		if !reflect.DeepEqual(a.counts[slices.IndexFunc(a.counts, func(c int64) bool { return c > 0 }):], sk.counts[slices.IndexFunc(sk.counts, func(c int64) bool { return c > 0 }):]) ||
			a.n != sk.n || a.min != sk.min || a.max != sk.max || a.sumLo != sk.sumLo || a.sumHi != sk.sumHi {
			t.Fatal("merging two halves differs from adding all")
		}
		sorted := slices.Clone(ds)
		slices.Sort(sorted)
		for k, want := range sorted {
			got := sk.valueAt(int64(k))
			if want < 2*sketchSub || k == 0 || k == n-1 {
				if got != int64(want) {
					t.Fatalf("rank %d: %d, want exactly %d", k, got, want)
				}
				continue
			}
			if math.Abs(float64(got)-float64(want)) > float64(want)/256 {
				t.Fatalf("rank %d: %d, want %d within 1/256", k, got, want)
			}
		}
		if sk.n != int64(n) || sk.min != int64(sorted[0]) || sk.max != int64(sorted[n-1]) {
			t.Fatalf("count %d min %d max %d, want %d %d %d", sk.n, sk.min, sk.max, n, sorted[0], sorted[n-1])
		}
		var sum float64
		for _, d := range ds {
			sum += float64(d)
		}
		if want := sum / float64(n) / 1e6; math.Abs(sk.meanMs()-want) > 1e-9*want+1e-12 {
			t.Fatalf("mean %v ms, want %v", sk.meanMs(), want)
		}
	})
}

// Every bucket's value is inside the bucket, the buckets are in order, and
// the value stands within 1/256 of any duration in its bucket.
func TestSketchBuckets(t *testing.T) {
	prev := -1
	for _, v := range []uint64{0, 1, 255, 256, 257, 511, 512, 1000, 1 << 20, 1<<40 + 12345, math.MaxInt64} {
		i := sketchIndex(v)
		if i < prev {
			t.Fatalf("bucket of %d is %d, below the previous %d", v, i, prev)
		}
		prev = i
		mid := sketchMid(i)
		if sketchIndex(uint64(mid)) != i {
			t.Errorf("the value %d of bucket %d (of %d) is in bucket %d", mid, i, v, sketchIndex(uint64(mid)))
		}
		if math.Abs(float64(mid)-float64(v)) > float64(v)/256 {
			t.Errorf("bucket %d stands for %d, more than 1/256 from %d", i, mid, v)
		}
	}
}

// Past the exact limit the steady-state check, from its time bins, gives
// about the halves of the exact check and the same verdict.
func TestSteadyBinsNearExact(t *testing.T) {
	const n = 20000
	gap := 10 * time.Millisecond // 100 req/s
	for name, recs := range map[string][]Record{
		"steady":   stream(n, gap, func(i int) time.Duration { return 200*ms + time.Duration(i%97)*ms }, constant(3*s)),
		"climbing": stream(n, gap, func(i int) time.Duration { return 100*ms + time.Duration(i)*ms/10 }, func(i int) time.Duration { return 2*s + time.Duration(i)*ms }),
		"backlog":  stream(n, gap, constant(300*ms), func(i int) time.Duration { return 2*s + time.Duration(i)*2*ms }),
	} {
		t.Run(name, func(t *testing.T) {
			opts := steadyOpts(100)
			opts.Warmup = 7 * s
			exact := Summarize(recs, opts).Steady
			opts.ExactLimit = 1000
			got := Summarize(recs, opts).Steady
			if !exact.Checked || !got.Checked {
				t.Fatalf("not checked: exact %+v, binned %+v", exact, got)
			}
			if got.BinS <= 0 || exact.BinS != 0 {
				t.Fatalf("bin_s %v binned, %v exact", got.BinS, exact.BinS)
			}
			for _, f := range [][2]float64{
				{got.FirstTTFTP99Ms, exact.FirstTTFTP99Ms}, {got.SecondTTFTP99Ms, exact.SecondTTFTP99Ms},
				{got.FirstInFlight, exact.FirstInFlight}, {got.SecondInFlight, exact.SecondInFlight},
			} {
				if math.Abs(f[0]-f[1]) > 0.01*f[1] {
					t.Errorf("binned %+v\nexact  %+v: %v is more than 1%% from %v", got, exact, f[0], f[1])
				}
			}
			if got.ArrivalRPS != exact.ArrivalRPS || (got.Warning == "") != (exact.Warning == "") {
				t.Errorf("binned %+v\nexact  %+v", got, exact)
			}
		})
	}
}

// BenchmarkAccumulatorAdd is the per-request cost of the streaming
// summary, under its exact limit and past it.
func BenchmarkAccumulatorAdd(b *testing.B) {
	recs := syntheticRecords(1<<14, 8)
	opts := syntheticOptions(8)
	for _, c := range []struct {
		name  string
		limit int
	}{{"exact", 1 << 30}, {"sketch", 1}} {
		b.Run(c.name, func(b *testing.B) {
			opts.ExactLimit = c.limit
			a := NewAccumulator(opts)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				a.Add(&recs[i&(len(recs)-1)])
				i++
			}
		})
	}
}
