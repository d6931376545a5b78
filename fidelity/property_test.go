package fidelity

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/traces"
)

// synthPair builds n replayed records and simulated twins without running
// the simulator: random outcomes (okShare ok on each side), replicas and
// latencies.
func synthPair(rng *rand.Rand, n, replicas int, okShare float64) (*prepared, []results.Record) {
	p := &prepared{model: "m", skipped: map[string]int{}, policy: "cost_model", replicas: replicas}
	for i := range replicas {
		p.names = append(p.names, fmt.Sprintf("r%d", i))
	}
	sim := make([]results.Record, n)
	dur := func(lo, hi float64) time.Duration {
		return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(time.Millisecond))
	}
	for k := range n {
		at := time.Duration(k) * 10 * time.Millisecond
		in := 16 + rng.IntN(4000)
		out := 1 + rng.IntN(300)
		m := &traces.Measured{Outcome: "ok", Replica: p.names[rng.IntN(replicas)], Policy: "cost_model",
			Queue: dur(0, 5) * time.Duration(rng.IntN(2)), TTFT: dur(5, 900), CachedTokens: rng.IntN(in + 1)}
		m.E2E = m.TTFT + time.Duration(out-1)*dur(5, 40)
		if out > 1 {
			m.TPOT = (m.E2E - m.TTFT) / time.Duration(out-1)
		}
		if rng.Float64() >= okShare {
			m.Outcome = []string{results.RejectQueueFull, results.FailEngine, "aborted"}[rng.IntN(3)]
		}
		if rng.IntN(20) == 0 {
			m.CachedTokens = -1
		}
		rec := &traces.Record{ID: uint64(7 + 3*k), Arrival: at, Model: "m", InputTokens: in, OutputTokens: out, Measured: m}
		p.all, p.replay = append(p.all, rec), append(p.replay, rec)
		s := results.Record{ID: uint64(k + 1), Arrival: at, Replica: rng.IntN(replicas), PromptTokens: in, CachedTokens: rng.IntN(in + 1), OutputTokens: out, Outcome: results.OutcomeOK}
		s.Dispatch = at + dur(0, 5)
		s.FirstToken, s.HasFirstToken = s.Dispatch+dur(5, 900), true
		s.End = s.FirstToken + time.Duration(out-1)*dur(5, 40)
		if rng.Float64() >= okShare {
			s.Outcome, s.Reject, s.Replica = results.OutcomeRejected, results.RejectQueueTimeout, -1
		}
		sim[k] = s
	}
	return p, sim
}

// Whatever the outcomes: the counts partition the replayed requests, each
// side's failures add up, the pairing is a permutation, and scaling every
// measured TTFT by f moves every TTFT statistic's 1+error by 1/f.
func TestCompareInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 300).Draw(t, "n")
		replicas := rapid.IntRange(1, 6).Draw(t, "replicas")
		ok := rapid.Float64Range(0, 1).Draw(t, "ok")
		f := rapid.Float64Range(0.25, 4).Draw(t, "f")
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))
		p, sim := synthPair(rng, n, replicas, ok)
		o := Options{}.withDefaults()
		res := p.compare(sim, o)
		c := res.Counts
		if c.Matched+c.OnlyInRecordingFailed+c.OnlyInSimulationFailed+c.BothFailed != c.Replayed || c.Replayed != n {
			t.Fatalf("counts do not partition %d requests: %+v", n, c)
		}
		if sum(c.RecordedFailed) != c.OnlyInRecordingFailed+c.BothFailed || sum(c.SimulatedFailed) != c.OnlyInSimulationFailed+c.BothFailed {
			t.Fatalf("failures by outcome do not add up: %+v", c)
		}
		if res.Overall.TTFT.Requests != c.Matched || res.Overall.HitRate.Requests != c.Matched-c.NoCachedTokens {
			t.Fatalf("TTFT over %d, hit rate over %d, of %d matched (%d without cached tokens)", res.Overall.TTFT.Requests, res.Overall.HitRate.Requests, c.Matched, c.NoCachedTokens)
		}
		mp := res.Mapping
		if len(mp.Pairs) != replicas || mp.Agreement < 0 || mp.Agreement > 1 {
			t.Fatalf("mapping %+v", mp)
		}
		sims, recs := map[int]bool{}, map[string]bool{}
		for _, pr := range mp.Pairs {
			sims[pr.Simulated], recs[pr.Recorded] = true, true
		}
		if len(sims) != replicas || len(recs) != replicas {
			t.Fatalf("pairs are not a permutation: %+v", mp.Pairs)
		}
		if mp.Meaningful != (len(res.PerReplica) == replicas) || mp.Meaningful == (len(res.MeasuredReplicas) == replicas) {
			t.Fatalf("meaningful %v with %d per-replica comparisons and %d measured sides", mp.Meaningful, len(res.PerReplica), len(res.MeasuredReplicas))
		}
		before := res.Overall.TTFT.RelError
		for _, r := range p.replay {
			r.Measured.TTFT = time.Duration(float64(r.Measured.TTFT) * f)
		}
		after := p.compare(sim, o).Overall.TTFT.RelError
		for i, pair := range [][2]*float64{{before.Mean, after.Mean}, {before.P50, after.P50}, {before.P90, after.P90}, {before.P99, after.P99}} {
			if (pair[0] == nil) != (pair[1] == nil) {
				t.Fatalf("statistic %d defined before or after scaling only", i)
			}
			if pair[0] != nil && !approx(1+*pair[1], (1+*pair[0])/f, 1e-5*(1+*pair[0])/f) {
				t.Fatalf("statistic %d: 1+error %v before, %v after scaling by %v; want %v", i, 1+*pair[0], 1+*pair[1], f, (1+*pair[0])/f)
			}
		}
	})
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// naturalCompare is a total order: antisymmetric, 0 only for equal names,
// and transitive.
func FuzzNaturalCompare(f *testing.F) {
	for _, s := range [][3]string{{"replica-2", "replica-10", "replica-1"}, {"a01", "a1", "a001"}, {"", "0", "x"}, {"gpu-b", "gpu-a", "gpu-a9"}} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, a, b, c string) {
		ab, ba := naturalCompare(a, b), naturalCompare(b, a)
		if ab != -ba || (ab == 0) != (a == b) {
			t.Fatalf("%q vs %q: %d and %d", a, b, ab, ba)
		}
		if ab < 0 && naturalCompare(b, c) < 0 && naturalCompare(a, c) >= 0 {
			t.Fatalf("%q < %q < %q but not %q < %q", a, b, c, a, c)
		}
	})
}

func TestNaturalOrder(t *testing.T) {
	got := []string{"replica-10", "replica-2", "replica-1", "replica-02", "gpu"}
	want := []string{"gpu", "replica-1", "replica-02", "replica-2", "replica-10"}
	slices.SortFunc(got, naturalCompare)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("natural order %q, want %q", got, want)
		}
	}
}

// The comparison of 100,000 requests on 8 replicas (the replay itself is
// the simulator's cost, benchmarked in fleet).
func BenchmarkCompare(b *testing.B) {
	p, sim := synthPair(rand.New(rand.NewPCG(1, 2)), 100_000, 8, 0.98)
	o := Options{}.withDefaults()
	b.ReportAllocs()
	for b.Loop() {
		p.compare(sim, o)
	}
}
