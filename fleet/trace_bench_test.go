package fleet

import (
	"os"
	"testing"

	"github.com/inferrail/inferrail/traces"
	"github.com/inferrail/inferrail/workload"
)

// mooncake is the public Mooncake conversation trace (see ../shared/traces/SOURCES.md).
const mooncake = "../../shared/traces/mooncake/conversation_trace.jsonl"

// replayConfig replays path (its first limit requests; 0: all) on replicas
// default engines under policy.
func replayConfig(tb testing.TB, path, policy string, replicas, limit int) Config {
	if _, err := os.Stat(path); err != nil {
		tb.Skipf("%s is absent: the public traces live in ../shared/traces beside the project", path)
	}
	c := DefaultConfig()
	c.Replicas = replicas
	c.Policy = policy
	c.SourceName = "mooncake"
	c.Source = func(seed uint64) (workload.Source, error) {
		r, cl, err := traces.Open(path, "mooncake", traces.Options{})
		if err != nil {
			return nil, err
		}
		s, err := traces.NewSource(r, traces.ReplayOptions{Seed: seed, Model: c.Workload.Model, Limit: limit})
		if err != nil {
			cl.Close()
			return nil, err
		}
		s.CloseAtEnd(cl)
		return s, nil
	}
	return c
}

// BenchmarkMooncakeReplay16 replays the whole Mooncake conversation trace
// (12,031 requests, 59 minutes) through 16 default replicas, as sim does
// (on two cores; the OneCore benchmark on one).
func BenchmarkMooncakeReplay16(b *testing.B) { benchMooncake(b, true) }

func BenchmarkMooncakeReplay16OneCore(b *testing.B) { benchMooncake(b, false) }

func benchMooncake(b *testing.B, two bool) {
	c := replayConfig(b, mooncake, "cost_model", 16, 0)
	c.TwoCores = two
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Simulate(c); err != nil {
			b.Fatal(err)
		}
	}
}

func TestMooncakeReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("replays a 12,000-request trace")
	}
	c := replayConfig(t, mooncake, "cost_model", 16, 0)
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	s := out.Summary
	// Every request is either served or refused for exceeding max_model_len.
	if s.Requests != 12031 || s.Completed+s.Failed != 12031 || s.Completed < 11000 {
		t.Fatalf("requests %d, completed %d, failed %d", s.Requests, s.Completed, s.Failed)
	}
	// The trace's ideal with 16 x 64k tokens of cache is well under its 13.8%
	// at 3M tokens; a cache-aware fleet finds a few percent.
	if s.HitRate <= 0.02 || s.HitRate >= 0.3 {
		t.Fatalf("hit rate %.3f", s.HitRate)
	}
}
