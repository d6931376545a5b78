package workload

import (
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// w7Run is a w7 run split into its streams.
type w7Run struct {
	heavy, light []*Request
	bursts       map[int][]*Request // heavy requests by burst index
}

// w7Distinct reports whether c's heavy and light requests can be told apart
// from outside: by the shared system prompt, by max_tokens or by disjoint
// prompt lengths.
func w7Distinct(c *Config) bool {
	p := &c.W7
	return p.HeavySharedTokens > 0 || p.HeavyMaxTokens != c.Output.MaxTokens || p.LightPromptMaxTokens < p.HeavyPromptMinTokens
}

// isHeavy tells a heavy request from a light one (w7Distinct): heavy
// prompts start with the run's shared system prompt sys, or have heavy
// max_tokens, or heavy lengths.
func isHeavy(c *Config, sys kvblock.Segment, r *Request) bool {
	p := &c.W7
	switch {
	case p.HeavySharedTokens > 0:
		return len(r.Prompt) == 2 && r.Prompt[0] == sys
	case p.HeavyMaxTokens != c.Output.MaxTokens:
		return r.MaxTokens == p.HeavyMaxTokens
	default:
		return r.PromptTokens() >= p.HeavyPromptMinTokens
	}
}

// checkW7 checks a w7 run: IDs 1..n in arrival order, no arrival after the
// duration, request structure and lengths, fresh segments, each heavy
// request inside its burst's window and at most burst_requests per burst.
// Without w7Distinct only the common invariants are checked and the result
// is empty.
func checkW7(t tb, c *Config, reqs []*Request) w7Run {
	t.Helper()
	p := &c.W7
	run := w7Run{bursts: map[int][]*Request{}}
	var sys kvblock.Segment
	if p.HeavySharedTokens > 0 {
		for _, r := range reqs {
			if len(r.Prompt) == 2 {
				sys = r.Prompt[0]
				break
			}
		}
	}
	fresh := map[uint64]bool{}
	for i, r := range reqs {
		if r.ID != uint64(i+1) || r.Session != 0 || r.Turn != 0 || r.Model != c.Model {
			t.Fatalf("request %d at %d: session %d turn %d model %q", r.ID, i, r.Session, r.Turn, r.Model)
		}
		if i > 0 && r.Arrival < reqs[i-1].Arrival {
			t.Fatalf("request %d arrives at %v, before %v", r.ID, r.Arrival, reqs[i-1].Arrival)
		}
		if c.Duration > 0 && r.Arrival > c.Duration {
			t.Fatalf("request %d arrives at %v, after %v", r.ID, r.Arrival, c.Duration)
		}
		if r.Output.Len != r.OutputTokens || r.OutputTokens < c.Output.Min || r.OutputTokens > r.MaxTokens {
			t.Fatalf("request %d: output %d tokens (%d), max_tokens %d", r.ID, r.OutputTokens, r.Output.Len, r.MaxTokens)
		}
		if r.PromptTokens()+r.MaxTokens > c.MaxModelLen {
			t.Fatalf("request %d: %d + %d over max_model_len", r.ID, r.PromptTokens(), r.MaxTokens)
		}
		if len(r.Prompt) < 1 || len(r.Prompt) > 2 {
			t.Fatalf("request %d: %d segments", r.ID, len(r.Prompt))
		}
		last := r.Prompt[len(r.Prompt)-1]
		for _, s := range []kvblock.Segment{last, r.Output} {
			if s.ID == 0 || s.Len < 1 || fresh[s.ID] || s.ID == sys.ID {
				t.Fatalf("request %d: segment %+v reused or bad", r.ID, s)
			}
			fresh[s.ID] = true
		}
		if !w7Distinct(c) {
			continue
		}
		if !isHeavy(c, sys, r) {
			if len(r.Prompt) != 1 || r.MaxTokens != c.Output.MaxTokens {
				t.Fatalf("light request %d: %d segments, max_tokens %d", r.ID, len(r.Prompt), r.MaxTokens)
			}
			if n := r.Prompt[0].Len; n < p.LightPromptMinTokens || n > p.LightPromptMaxTokens {
				t.Fatalf("light request %d: prompt of %d tokens", r.ID, n)
			}
			run.light = append(run.light, r)
			continue
		}
		if r.MaxTokens != p.HeavyMaxTokens {
			t.Fatalf("heavy request %d: max_tokens %d", r.ID, r.MaxTokens)
		}
		if n := r.PromptTokens(); n < p.HeavyPromptMinTokens || n > p.HeavyPromptMaxTokens {
			t.Fatalf("heavy request %d: prompt of %d tokens", r.ID, n)
		}
		if (p.HeavySharedTokens > 0) != (len(r.Prompt) == 2) || (len(r.Prompt) == 2 && r.Prompt[0].Len != p.HeavySharedTokens) {
			t.Fatalf("heavy request %d: prompt %v, shared %d", r.ID, r.Prompt, p.HeavySharedTokens)
		}
		run.heavy = append(run.heavy, r)
	}
	// Place heavy requests in their bursts.
	for _, r := range run.heavy {
		off := r.Arrival - p.FirstBurst
		if off < 0 {
			t.Fatalf("heavy request %d at %v, before the first burst %v", r.ID, r.Arrival, p.FirstBurst)
		}
		k := int(off / p.BurstEvery)
		if off%p.BurstEvery > p.BurstWindow {
			t.Fatalf("heavy request %d at %v: %v into burst %d, window %v", r.ID, r.Arrival, off%p.BurstEvery, k, p.BurstWindow)
		}
		if p.BurstWindow == p.BurstEvery && k > 0 && off%p.BurstEvery == 0 {
			// A window equal to burst_every ends a burst on the next
			// one's start: count an arrival there in the earlier burst
			// while that is not full (bursts are handed out in order).
			if len(run.bursts[k-1]) < p.BurstRequests && len(run.bursts[k]) == 0 {
				k--
			}
		}
		run.bursts[k] = append(run.bursts[k], r)
		if len(run.bursts[k]) > p.BurstRequests {
			t.Fatalf("burst %d has more than %d requests", k, p.BurstRequests)
		}
	}
	return run
}

// TestW7Shape checks the default run: two full bursts of 200 heavy requests
// within 1s windows at 10s and 70s, and the rest light background.
func TestW7Shape(t *testing.T) {
	c := mustConfig(t, "w7")
	reqs := drainOpen(mustNew(t, c))
	if len(reqs) != c.Requests {
		t.Fatalf("%d requests, want %d", len(reqs), c.Requests)
	}
	run := checkW7(t, &c, reqs)
	if len(run.bursts) != 2 || len(run.bursts[0]) != 200 || len(run.bursts[1]) != 200 {
		t.Fatalf("bursts: %d, sizes %d %d", len(run.bursts), len(run.bursts[0]), len(run.bursts[1]))
	}
	for k, b := range run.bursts {
		start := c.W7.FirstBurst + time.Duration(k)*c.W7.BurstEvery
		lo, hi := b[0].Arrival, b[len(b)-1].Arrival
		if lo < start || hi > start+c.W7.BurstWindow || hi-lo < c.W7.BurstWindow*9/10 {
			t.Fatalf("burst %d spans [%v, %v], want within [%v, +%v] and most of it", k, lo, hi, start, c.W7.BurstWindow)
		}
		// Uniform in the window: about half in each half.
		half := 0
		for _, r := range b {
			if r.Arrival < start+c.W7.BurstWindow/2 {
				half++
			}
		}
		if half < 70 || half > 130 {
			t.Fatalf("burst %d: %d of 200 in the window's first half", k, half)
		}
	}
	if n := len(run.light); n != 200 {
		t.Fatalf("%d light requests, want 200", n)
	}
	// The background runs before, between and after the bursts: Poisson at
	// 2/s, so ~20 before 10s and the 200th near 100s.
	before := 0
	for _, r := range run.light {
		if r.Arrival < c.W7.FirstBurst {
			before++
		}
	}
	end := run.light[len(run.light)-1].Arrival
	if before < 8 || before > 35 || end < 75*time.Second || end > 125*time.Second {
		t.Fatalf("%d light requests before the first burst, last at %v", before, end)
	}
	// Heavy prompts: mostly unique text after the shared system prompt,
	// lengths uniform in [6500, 8200], mean ≈ 7350; light ones short.
	var heavyTokens, lightTokens, heavyOut int
	for _, r := range run.heavy {
		heavyTokens += r.PromptTokens()
		heavyOut += r.OutputTokens
	}
	for _, r := range run.light {
		lightTokens += r.PromptTokens()
	}
	if m := heavyTokens / len(run.heavy); m < 7200 || m > 7500 {
		t.Fatalf("mean heavy prompt %d tokens", m)
	}
	if m := lightTokens / len(run.light); m < 220 || m > 280 {
		t.Fatalf("mean light prompt %d tokens", m)
	}
	if m := heavyOut / len(run.heavy); m < 200 || m > 290 {
		t.Fatalf("mean heavy output %d tokens, want ≈ 243", m)
	}
}

// TestW7Capacity checks the arithmetic of the W7Params documentation: one
// default burst asks for about 6× the KV blocks of 4 default replicas
// (engine.DefaultConfig: 4096 blocks of 16 tokens each).
func TestW7Capacity(t *testing.T) {
	const blockSize, blocks, replicas = 16, 4096, 4
	c := mustConfig(t, "w7")
	c.Requests = 0
	c.Duration = c.W7.FirstBurst + c.W7.BurstEvery - 1 // the first burst only
	run := checkW7(t, &c, drainOpen(mustNew(t, c)))
	if len(run.heavy) != c.W7.BurstRequests {
		t.Fatalf("%d heavy requests", len(run.heavy))
	}
	need := 0
	for _, r := range run.heavy {
		// As engine.Add sizes a request.
		need += (r.PromptTokens() + r.MaxTokens - 1 + blockSize - 1) / blockSize
	}
	ratio := float64(need) / (replicas * blocks)
	t.Logf("one burst: %d blocks = %.2f × %d replicas × %d blocks", need, ratio, replicas, blocks)
	if ratio < 5.8 || ratio > 6.2 {
		t.Fatalf("one burst needs %.2f× the fleet's KV capacity, want ≈ 6", ratio)
	}
}

// TestW7Determinism: the same seed gives the same run bit for bit, and the
// background stream (arrivals, lengths) does not depend on the bursts.
func TestW7Determinism(t *testing.T) {
	c := mustConfig(t, "w7")
	c.Requests = 3000
	a := drainOpen(mustNew(t, c))
	b := drainOpen(mustNew(t, c))
	if len(a) != c.Requests || !reflect.DeepEqual(a, b) {
		t.Fatal("same seed gave different runs")
	}
	light := func(c Config) [][3]int64 {
		var out [][3]int64
		for _, r := range checkW7(t, &c, drainOpen(mustNew(t, c))).light {
			out = append(out, [3]int64{int64(r.Arrival), int64(r.PromptTokens()), int64(r.OutputTokens)})
		}
		return out
	}
	c.Requests, c.Duration = 0, 10*time.Minute
	base := light(c)
	c.W7.BurstRequests, c.W7.BurstEvery, c.W7.HeavyPromptMaxTokens = 37, 17*time.Second, 7000
	other := light(c)
	if len(base) < 1000 || len(base) != len(other) {
		t.Fatalf("%d vs %d light requests", len(base), len(other))
	}
	for i := range base {
		if base[i] != other[i] {
			t.Fatalf("light request %d: %v with default bursts, %v with others", i, base[i], other[i])
		}
	}
}

// TestW7Edges: a zero window puts a burst at one instant, no shared prompt
// gives one-segment heavy prompts, the duration cuts a burst short, and a
// burst near the end of time is the last.
func TestW7Edges(t *testing.T) {
	c := mustConfig(t, "w7")
	c.W7.BurstWindow = 0
	c.W7.HeavySharedTokens = 0
	c.W7.FirstBurst = 0
	c.Requests = 0
	c.Duration = 125 * time.Second
	reqs := drainOpen(mustNew(t, c))
	run := checkW7(t, &c, reqs)
	if len(run.bursts) != 3 {
		t.Fatalf("%d bursts in 125s, want 3 (0s, 60s, 120s)", len(run.bursts))
	}
	for k, b := range run.bursts {
		for _, r := range b {
			if r.Arrival != time.Duration(k)*time.Minute || len(r.Prompt) != 1 {
				t.Fatalf("burst %d: request %d at %v with %d segments", k, r.ID, r.Arrival, len(r.Prompt))
			}
		}
	}
	// The duration falls inside a burst's window.
	c = mustConfig(t, "w7")
	c.Requests = 0
	c.Duration = c.W7.FirstBurst + c.W7.BurstEvery + c.W7.BurstWindow/2
	run = checkW7(t, &c, drainOpen(mustNew(t, c)))
	if n := len(run.bursts[1]); len(run.bursts) != 2 || n < 60 || n > 140 {
		t.Fatalf("%d bursts, the cut one with %d requests", len(run.bursts), n)
	}
	// Bursts as long as their period: back to back.
	c = mustConfig(t, "w7")
	c.W7.BurstWindow = c.W7.BurstEvery
	c.Requests = 2000
	checkW7(t, &c, drainOpen(mustNew(t, c)))
	// The last burst before maxArrival.
	c = mustConfig(t, "w7")
	c.Requests = 0
	c.Duration = time.Duration(1<<63 - 1)
	s := newW7(&c)
	s.start, s.bgMore = maxArrival-c.W7.BurstEvery/2, false
	reqs = drainOpen(s)
	if len(reqs) != c.W7.BurstRequests || reqs[len(reqs)-1].Arrival > maxArrival {
		t.Fatalf("%d requests at the end of time, last at %v", len(reqs), reqs[len(reqs)-1].Arrival)
	}
}

// genW7 draws a valid w7 config.
func genW7(t *rapid.T) Config {
	c, _ := DefaultConfig("w7")
	c.Seed = rapid.Uint64().Draw(t, "seed")
	c.Rate = rapid.Float64Range(0.01, 100).Draw(t, "rate")
	c.Requests = rapid.IntRange(1, 400).Draw(t, "requests")
	if rapid.Bool().Draw(t, "duration") {
		c.Duration = time.Duration(rapid.Int64Range(1, int64(10*time.Minute)).Draw(t, "duration_ns"))
	}
	genArrival(t, &c)
	genOutput(t, &c)
	p := &c.W7
	p.BurstRequests = rapid.IntRange(1, 100).Draw(t, "burst_requests")
	p.BurstEvery = time.Duration(rapid.Int64Range(1, int64(2*time.Minute)).Draw(t, "burst_every"))
	p.BurstWindow = time.Duration(rapid.Int64Range(0, int64(p.BurstEvery)).Draw(t, "burst_window"))
	p.FirstBurst = time.Duration(rapid.Int64Range(0, int64(time.Minute)).Draw(t, "first_burst"))
	p.HeavyPromptMinTokens = rapid.IntRange(1, 9000).Draw(t, "heavy_min")
	p.HeavyPromptMaxTokens = rapid.IntRange(p.HeavyPromptMinTokens, 9000).Draw(t, "heavy_max")
	p.HeavySharedTokens = rapid.IntRange(0, p.HeavyPromptMinTokens-1).Draw(t, "heavy_shared")
	p.HeavyMaxTokens = rapid.IntRange(c.Output.Min, 3000).Draw(t, "heavy_max_tokens")
	p.LightPromptMinTokens = rapid.IntRange(1, 2000).Draw(t, "light_min")
	p.LightPromptMaxTokens = rapid.IntRange(p.LightPromptMinTokens, 2000).Draw(t, "light_max")
	c.MaxModelLen = max(p.HeavyPromptMaxTokens+p.HeavyMaxTokens, p.LightPromptMaxTokens+c.Output.MaxTokens) +
		rapid.IntRange(0, 100).Draw(t, "slack")
	return c
}

// TestW7Property: any valid w7 config gives ordered, well-formed requests,
// heavy ones inside their burst windows, and exactly Requests of them
// without a duration.
func TestW7Property(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := genW7(t)
		src, err := New(c)
		if err != nil {
			t.Fatalf("valid config rejected: %v", err)
		}
		reqs := drainOpen(src)
		if c.Duration == 0 && len(reqs) != c.Requests {
			t.Fatalf("%d requests, want %d", len(reqs), c.Requests)
		}
		if len(reqs) > c.Requests {
			t.Fatalf("%d requests, limit %d", len(reqs), c.Requests)
		}
		checkW7(t, &c, reqs)
		if r, ok := src.Next(); ok {
			t.Fatalf("Next after the end: %+v", r)
		}
	})
}

func BenchmarkW7Next(b *testing.B) { benchOpen(b, "w7") }
