package workload

import (
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// w5Batch is one batch of a w5 run with fresh prefixes (benchmarks 0),
// identified by its prefix.
type w5Batch struct {
	reqs     []*Request
	min, max time.Duration
}

// checkW5 checks a w5 run: request structure, IDs 1..n in arrival order,
// non-decreasing arrivals and, with benchmarks 0, batches of at most
// batch_size requests sharing a prefix and arriving within burst_window. It
// returns the batches by prefix ID, in order of first arrival.
func checkW5(t tb, c *Config, reqs []*Request) []*w5Batch {
	t.Helper()
	p := &c.W5
	fresh := map[uint64]bool{}
	byPrefix := map[uint64]*w5Batch{}
	var batches []*w5Batch
	for i, r := range reqs {
		checkRequest(t, c, r)
		if r.ID != uint64(i+1) || r.Session != 0 || r.Turn != 0 {
			t.Fatalf("request %d at %d: session %d turn %d", r.ID, i, r.Session, r.Turn)
		}
		if i > 0 && r.Arrival < reqs[i-1].Arrival {
			t.Fatalf("request %d arrives at %v, before %v", r.ID, r.Arrival, reqs[i-1].Arrival)
		}
		if c.Duration > 0 && r.Arrival > c.Duration {
			t.Fatalf("request %d arrives at %v, after %v", r.ID, r.Arrival, c.Duration)
		}
		if len(r.Prompt) != 2 {
			t.Fatalf("request %d: %d segments", r.ID, len(r.Prompt))
		}
		pre, q := r.Prompt[0], r.Prompt[1]
		if pre.Len < p.PrefixMinTokens || pre.Len > p.PrefixMaxTokens {
			t.Fatalf("request %d: prefix of %d tokens", r.ID, pre.Len)
		}
		if q.Len < p.QuestionMinTokens || q.Len > p.QuestionMaxTokens {
			t.Fatalf("request %d: question of %d tokens", r.ID, q.Len)
		}
		for _, id := range []uint64{q.ID, r.Output.ID} {
			if fresh[id] {
				t.Fatalf("segment %x reused", id)
			}
			fresh[id] = true
		}
		b := byPrefix[pre.ID]
		if b == nil {
			b = &w5Batch{min: r.Arrival}
			byPrefix[pre.ID] = b
			batches = append(batches, b)
		}
		b.reqs = append(b.reqs, r)
		b.max = r.Arrival
	}
	if p.Benchmarks > 0 {
		if len(batches) > p.Benchmarks {
			t.Fatalf("%d prefixes, want at most %d", len(batches), p.Benchmarks)
		}
		return nil
	}
	last := reqs[len(reqs)-1].Arrival
	for _, b := range batches {
		if len(b.reqs) > p.BatchSize {
			t.Fatalf("batch of %d requests, want %d", len(b.reqs), p.BatchSize)
		}
		if b.max-b.min > p.BurstWindow {
			t.Fatalf("batch spread over %v, window %v", b.max-b.min, p.BurstWindow)
		}
		// A batch whose every request arrives before the last one handed
		// out is complete.
		if c.Duration == 0 && b.min+p.BurstWindow < last && len(b.reqs) != p.BatchSize {
			t.Fatalf("batch starting at %v has %d requests, want %d", b.min, len(b.reqs), p.BatchSize)
		}
	}
	return batches
}

func TestW5Batches(t *testing.T) {
	c := mustConfig(t, "w5")
	c.W5.Benchmarks = 0
	c.Requests = 64 * 1000
	c.Rate = 64 * 5 // a batch every 200ms on average: batches overlap
	reqs := drainOpen(mustNew(t, c))
	if len(reqs) != c.Requests {
		t.Fatalf("%d requests, want %d", len(reqs), c.Requests)
	}
	batches := checkW5(t, &c, reqs)
	if n := len(batches); n < 1000 || n > 1005 {
		t.Fatalf("%d batches for %d requests", n, c.Requests)
	}
	// 64 offsets uniform in [0, 1s] span 63/65 s on average.
	var spread time.Duration
	var overlaps, below int
	for i, b := range batches {
		spread += b.max - b.min
		if i > 0 && b.min < batches[i-1].max {
			overlaps++
		}
		for _, r := range b.reqs {
			if r.OutputTokens < 20 {
				below++
			}
		}
	}
	if m := spread.Seconds() / float64(len(batches)); m < 0.95 || m > 0.99 {
		t.Fatalf("mean batch spread %.3fs, want about 0.969s", m)
	}
	if overlaps < len(batches)/2 {
		t.Fatalf("only %d of %d batches overlap their predecessor", overlaps, len(batches))
	}
	// Batch starts are Poisson at rate / batch_size: 5/s.
	mean := (batches[len(batches)-1].min - batches[0].min).Seconds() / float64(len(batches)-1)
	if mean < 0.19 || mean > 0.21 {
		t.Fatalf("mean gap between batches %.4fs, want 0.2s", mean)
	}
	// Short answers: median 20.
	if f := float64(below) / float64(len(reqs)); f < 0.45 || f > 0.55 {
		t.Fatalf("%.3f of answers below the median 20", f)
	}
	t.Logf("%d batches, %d overlap the previous one, mean spread %.3fs", len(batches), overlaps, spread.Seconds()/float64(len(batches)))
}

func TestW5Benchmarks(t *testing.T) {
	c := mustConfig(t, "w5")
	c.Requests = 64 * 400
	reqs := drainOpen(mustNew(t, c))
	if len(reqs) != c.Requests {
		t.Fatalf("%d requests, want %d", len(reqs), c.Requests)
	}
	checkW5(t, &c, reqs)
	// Each of the 8 prefixes serves about 400/8 batches.
	counts := map[uint64]int{}
	for _, r := range reqs {
		counts[r.Prompt[0].ID]++
	}
	if len(counts) != c.W5.Benchmarks {
		t.Fatalf("%d prefixes in use, want %d", len(counts), c.W5.Benchmarks)
	}
	for id, n := range counts {
		if n < 64*25 || n > 64*75 {
			t.Fatalf("prefix %x used by %d requests, want about %d", id, n, 64*50)
		}
	}
}

func TestW5ZeroWindow(t *testing.T) {
	c := mustConfig(t, "w5")
	c.W5.Benchmarks = 0
	c.W5.BurstWindow = 0
	c.W5.BatchSize = 10
	c.Requests = 1000
	batches := checkW5(t, &c, drainOpen(mustNew(t, c)))
	for _, b := range batches {
		if b.min != b.max || len(b.reqs) != 10 {
			t.Fatalf("batch of %d spread over %v", len(b.reqs), b.max-b.min)
		}
	}
}

func TestW5Property(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c, _ := DefaultConfig("w5")
		c.Seed = rapid.Uint64().Draw(t, "seed")
		c.Rate = rapid.Float64Range(0.01, 1e4).Draw(t, "rate")
		if rapid.Bool().Draw(t, "by_duration") {
			c.Requests = 0
			c.Duration = time.Duration(rapid.Int64Range(1, int64(time.Minute)).Draw(t, "duration"))
			c.Rate = rapid.Float64Range(0.01, 100).Draw(t, "rate_d")
		} else {
			c.Requests = rapid.IntRange(1, 400).Draw(t, "requests")
		}
		genOutput(t, &c)
		genArrival(t, &c)
		p := &c.W5
		p.BatchSize = rapid.IntRange(1, 80).Draw(t, "batch_size")
		p.BurstWindow = time.Duration(rapid.Int64Range(0, int64(10*time.Second)).Draw(t, "window"))
		p.Benchmarks = rapid.IntRange(0, 5).Draw(t, "benchmarks")
		p.PrefixMinTokens = rapid.IntRange(1, 7000).Draw(t, "prefix_min")
		p.PrefixMaxTokens = rapid.IntRange(p.PrefixMinTokens, 7000).Draw(t, "prefix_max")
		p.QuestionMinTokens = rapid.IntRange(1, 400).Draw(t, "question_min")
		p.QuestionMaxTokens = rapid.IntRange(p.QuestionMinTokens, 400).Draw(t, "question_max")
		p.OutputMedianTokens = rapid.Float64Range(1, 200).Draw(t, "out_median")
		p.OutputSigma = rapid.Float64Range(0, 2).Draw(t, "out_sigma")
		c.MaxModelLen = p.PrefixMaxTokens + p.QuestionMaxTokens + c.Output.MaxTokens + rapid.IntRange(0, 100).Draw(t, "slack")
		reqs := drainOpen(mustNew(t, c))
		if c.Requests > 0 && len(reqs) != c.Requests {
			t.Fatalf("%d requests, want %d", len(reqs), c.Requests)
		}
		if len(reqs) > 0 {
			checkW5(t, &c, reqs)
		}
	})
}

// TestW5Streams checks that a shorter run is a prefix of a longer one: the
// merge does not depend on where the run stops.
func TestW5Streams(t *testing.T) {
	c := mustConfig(t, "w5")
	c.Rate = 64 * 5
	c.Requests = 5000
	long := drainOpen(mustNew(t, c))
	c.Requests = 1234
	short := drainOpen(mustNew(t, c))
	if !reflect.DeepEqual(short, long[:len(short)]) {
		t.Fatal("a shorter run is not a prefix of a longer one")
	}
}
