package fidelity

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/traces"
	"github.com/inferrail/inferrail/workload"
)

// synthRecords is a load-only trace of n requests at rate per second:
// each prompt one of eight shared system prompts (40 blocks of 16 tokens)
// and a fresh question, with block identity, in 37 sessions.
func synthRecords(n int, rate float64, seed uint64) []traces.Record {
	rng := rand.New(rand.NewPCG(seed, 0xF1DE))
	const bs = 16
	recs := make([]traces.Record, 0, n)
	var at time.Duration
	fresh := uint64(1 << 40)
	for i := range n {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		sp := uint64(rng.IntN(8))
		var ids []uint64
		for b := range uint64(40) {
			ids = append(ids, sp*1000+b+1)
		}
		q := 2 + rng.IntN(12)
		for range q {
			fresh++
			ids = append(ids, fresh)
		}
		in := len(ids)*bs - rng.IntN(bs)
		recs = append(recs, traces.Record{
			// ids not in arrival order (7919 is prime: a permutation)
			ID: uint64(1000 + (i*7919)%n), Arrival: at, Model: "m", InputTokens: in, OutputTokens: 16 + rng.IntN(200),
			BlockSize: bs, HashIDs: ids, Session: uint64(1 + i%37),
		})
	}
	return recs
}

// recordOf fills in what the simulator measured for each of base (in
// arrival order) when it replays them with policy on replicas engines,
// live's default gateway and the default engine: a recording the
// simulator itself produced. name names replica i.
func recordOf(t testing.TB, base []traces.Record, policy string, replicas int, name func(i int) string) []traces.Record {
	t.Helper()
	g := DefaultGateway()
	fc := fleet.DefaultConfig()
	fc.Seed, fc.Policy, fc.Replicas = 1, policy, replicas
	fc.Admission, fc.Overcommit, fc.OutputQuantile = g.Admission, g.Overcommit, g.OutputQuantile
	fc.Index, fc.ScrapeInterval = g.Index, g.ScrapeInterval
	fc.QueueMaxRequests, fc.QueueTimeout, fc.MaxPriority = g.QueueMax, g.QueueTimeout, g.MaxPriority
	model := fc.Workload.Model
	ptrs := make([]*traces.Record, len(base))
	for i := range base {
		ptrs[i] = &base[i]
	}
	fc.Source = func(seed uint64) (workload.Source, error) {
		return traces.NewSource(&sliceReader{recs: ptrs}, traces.ReplayOptions{Seed: seed, Model: model})
	}
	out, err := fleet.Simulate(fc)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Records) != len(base) {
		t.Fatalf("%d records simulated, %d replayed", len(out.Records), len(base))
	}
	recs := make([]traces.Record, len(base))
	for _, s := range out.Records {
		k := int(s.ID) - 1
		r := base[k]
		r.HashIDs = append([]uint64(nil), r.HashIDs...)
		m := &traces.Measured{Outcome: simOutcome(&s), Policy: policy, CachedTokens: s.CachedTokens, PredictedCachedTokens: s.PredictedCachedTokens}
		if s.Replica >= 0 && s.Outcome != results.OutcomeRejected {
			m.Replica = name(s.Replica)
			m.Queue = s.Queue()
		}
		if s.HasFirstToken {
			m.TTFT = s.TTFT()
		}
		if s.Outcome == results.OutcomeOK {
			m.E2E = s.E2E()
			if tpot, ok := s.TPOT(); ok {
				m.TPOT = tpot
			}
		}
		r.Measured = m
		recs[k] = r
	}
	return recs
}

func replicaName(i int) string { return fmt.Sprintf("replica-%d", i) }

// completionOrder returns recs in the order their requests ended, as the
// recorder writes them.
func completionOrder(recs []traces.Record) []traces.Record {
	out := append([]traces.Record(nil), recs...)
	end := func(r *traces.Record) time.Duration { return r.Arrival + r.Measured.E2E }
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && end(&out[j]) < end(&out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func approx(a, b, tol float64) bool {
	d := a - b
	return d <= tol && -d <= tol
}
