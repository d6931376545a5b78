package workload

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

// stream returns a whole run of the named workload's default config with the
// given seed, driven through simulate.
func stream(t *testing.T, name string, seed uint64, requests int) []*Request {
	c := mustConfig(t, name)
	c.Seed = seed
	c.Requests = requests
	return simulate(t, mustNew(t, c), serviceTime, nil).reqs
}

func TestDeterminism(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			a := stream(t, name, 42, 2000)
			b := stream(t, name, 42, 2000)
			if len(a) != 2000 {
				t.Fatalf("got %d requests, want 2000", len(a))
			}
			if !reflect.DeepEqual(a, b) {
				t.Fatal("same seed gave different streams")
			}
			c := stream(t, name, 43, 2000)
			if reflect.DeepEqual(a, c) {
				t.Fatal("different seeds gave identical streams")
			}
		})
	}
}

func TestPoissonArrivals(t *testing.T) {
	for _, name := range []string{"w1", "w6"} {
		t.Run(name, func(t *testing.T) {
			c := mustConfig(t, name)
			c.Rate = 50
			c.Requests = 20000
			reqs := drainOpen(mustNew(t, c))
			if len(reqs) != c.Requests {
				t.Fatalf("got %d requests, want %d", len(reqs), c.Requests)
			}
			checkPoisson(t, reqs, c.Rate)
			for i, r := range reqs {
				if r.ID != uint64(i+1) {
					t.Fatalf("request %d has ID %d", i, r.ID)
				}
				if r.Session != 0 || r.Turn != 0 || r.Model != "sim-8b" {
					t.Fatalf("request %d: session %d turn %d model %q", r.ID, r.Session, r.Turn, r.Model)
				}
			}
		})
	}
	t.Run("w2 sessions", func(t *testing.T) {
		c := mustConfig(t, "w2")
		c.Rate = 60
		c.Requests = 0
		c.Duration = 20000 * 6 * time.Second / 60 // about 20k sessions
		var firsts []*Request
		src := mustNew(t, c)
		for {
			r, ok := src.Next()
			if !ok {
				break
			}
			firsts = append(firsts, r)
		}
		if len(firsts) < 19000 {
			t.Fatalf("only %d sessions", len(firsts))
		}
		meanTurns := float64(c.W2.TurnsMin+c.W2.TurnsMax) / 2
		checkPoisson(t, firsts, c.Rate/meanTurns)
	})
}

func checkPoisson(t *testing.T, reqs []*Request, rate float64) {
	t.Helper()
	var prev time.Duration
	for _, r := range reqs {
		if r.Arrival < prev {
			t.Fatalf("request %d arrives at %v before %v", r.ID, r.Arrival, prev)
		}
		prev = r.Arrival
	}
	if reqs[0].Arrival <= 0 {
		t.Fatalf("first arrival at %v, want the first gap", reqs[0].Arrival)
	}
	mean := prev.Seconds() / float64(len(reqs))
	if want := 1 / rate; mean < 0.97*want || mean > 1.03*want {
		t.Fatalf("mean inter-arrival %.5fs, want %.5fs ±3%%", mean, want)
	}
	// An exponential gap has stddev == mean.
	var sum2 float64
	prev = 0
	for _, r := range reqs {
		g := (r.Arrival - prev).Seconds() - mean
		sum2 += g * g
		prev = r.Arrival
	}
	if sd := math.Sqrt(sum2 / float64(len(reqs))); sd < 0.9*mean || sd > 1.1*mean {
		t.Fatalf("inter-arrival stddev %.5f, want about the mean %.5f", sd, mean)
	}
}

func TestW1Prompts(t *testing.T) {
	c := mustConfig(t, "w1")
	c.Requests = 20000
	reqs := drainOpen(mustNew(t, c))
	p := c.W1
	systems := map[kvblock.Segment]int{}
	fresh := map[uint64]bool{}
	for _, r := range reqs {
		if len(r.Prompt) != 2 {
			t.Fatalf("request %d: %d segments, want 2", r.ID, len(r.Prompt))
		}
		s, q := r.Prompt[0], r.Prompt[1]
		if s.Len < p.PromptMinTokens || s.Len > p.PromptMaxTokens {
			t.Fatalf("system prompt of %d tokens", s.Len)
		}
		systems[s]++
		if q.Len < p.QuestionMinTokens || q.Len > p.QuestionMaxTokens {
			t.Fatalf("question of %d tokens", q.Len)
		}
		for _, id := range []uint64{q.ID, r.Output.ID} {
			if fresh[id] {
				t.Fatalf("segment ID %x reused", id)
			}
			fresh[id] = true
		}
		checkRequest(t, &c, r)
	}
	if len(systems) != p.Prompts {
		t.Fatalf("%d distinct system prompts, want %d", len(systems), p.Prompts)
	}
	ids := map[uint64]bool{}
	for s, n := range systems {
		if ids[s.ID] || fresh[s.ID] {
			t.Fatalf("system prompt ID %x collides", s.ID)
		}
		ids[s.ID] = true
		// Uniform popularity: 20000/32 = 625 each.
		if n < 450 || n > 800 {
			t.Fatalf("system prompt %x chosen %d times, want about 625", s.ID, n)
		}
	}
}

func TestW1Zipf(t *testing.T) {
	c := mustConfig(t, "w1")
	c.Requests = 20000
	c.W1.PopularityZipf = 1.2
	reqs := drainOpen(mustNew(t, c))
	counts := map[uint64]int{}
	for _, r := range reqs {
		counts[r.Prompt[0].ID]++
	}
	lo, hi := len(reqs), 0
	for _, n := range counts {
		lo, hi = min(lo, n), max(hi, n)
	}
	// Rank 1 vs rank 32 of Zipf(1.2): a ratio of 32^1.2 ≈ 64.
	if hi < 20*lo {
		t.Fatalf("zipf 1.2: most popular %d, least %d", hi, lo)
	}
	// Sum of 1/k^1.2, k=1..32 ≈ 3.35, so rank 1 takes ≈ 30%.
	if f := float64(hi) / float64(len(reqs)); f < 0.27 || f > 0.33 {
		t.Fatalf("most popular prompt share %.3f, want about 0.30", f)
	}
}

// checkRequest checks the invariants every request satisfies.
func checkRequest(t tb, c *Config, r *Request) {
	t.Helper()
	if r.MaxTokens != c.Output.MaxTokens {
		t.Fatalf("request %d: max_tokens %d, want %d", r.ID, r.MaxTokens, c.Output.MaxTokens)
	}
	if r.OutputTokens < 1 || r.OutputTokens > r.MaxTokens || r.OutputTokens < c.Output.Min {
		t.Fatalf("request %d: output %d tokens, max %d", r.ID, r.OutputTokens, r.MaxTokens)
	}
	if r.Output.Len != r.OutputTokens {
		t.Fatalf("request %d: Output.Len %d != OutputTokens %d", r.ID, r.Output.Len, r.OutputTokens)
	}
	if n := r.PromptTokens(); n < 1 || n+r.MaxTokens > c.MaxModelLen {
		t.Fatalf("request %d: prompt %d + max_tokens %d exceeds max_model_len %d", r.ID, n, r.MaxTokens, c.MaxModelLen)
	}
	for _, s := range r.Prompt {
		if s.Len < 1 || s.ID == 0 {
			t.Fatalf("request %d: bad segment %+v", r.ID, s)
		}
	}
}

func TestOutputLengths(t *testing.T) {
	c := mustConfig(t, "w6")
	c.Requests = 20000
	reqs := drainOpen(mustNew(t, c))
	var below, clampMin, clampMax int
	for _, r := range reqs {
		checkRequest(t, &c, r)
		if r.OutputTokens < 200 {
			below++
		}
		if r.OutputTokens == c.Output.Min {
			clampMin++
		}
		if r.OutputTokens == c.Output.MaxTokens {
			clampMax++
		}
	}
	if f := float64(below) / float64(len(reqs)); f < 0.48 || f > 0.52 {
		t.Fatalf("%.3f of outputs below the median 200", f)
	}
	// P(lognormal(ln 200, 0.9) > 1024) ≈ 3.5%.
	if clampMax < 400 || clampMax > 1000 || clampMin > 20 {
		t.Fatalf("clamped to max %d times, to min %d times", clampMax, clampMin)
	}
}

func TestW6NoSharing(t *testing.T) {
	c := mustConfig(t, "w6")
	c.Requests = 20000
	reqs := drainOpen(mustNew(t, c))
	seen := map[uint64]bool{}
	var below int
	for _, r := range reqs {
		checkRequest(t, &c, r)
		if len(r.Prompt) != 1 {
			t.Fatalf("request %d: %d segments", r.ID, len(r.Prompt))
		}
		n := r.Prompt[0].Len
		if n < c.W6.InputMinTokens || n > c.W6.InputMaxTokens {
			t.Fatalf("request %d: prompt of %d tokens", r.ID, n)
		}
		if n < 800 {
			below++
		}
		for _, id := range []uint64{r.Prompt[0].ID, r.Output.ID} {
			if seen[id] {
				t.Fatalf("segment ID %x shared", id)
			}
			seen[id] = true
		}
	}
	if f := float64(below) / float64(len(reqs)); f < 0.48 || f > 0.52 {
		t.Fatalf("%.3f of prompts below the median 800", f)
	}
}

func TestDurationLimit(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			c := mustConfig(t, name)
			c.Requests = 0
			c.Duration = 200 * time.Second
			res := simulate(t, mustNew(t, c), serviceTime, nil)
			if len(res.reqs) < 1000 {
				t.Fatalf("only %d requests in %v at rate %v", len(res.reqs), c.Duration, c.Rate)
			}
			for _, r := range res.reqs {
				if r.Arrival > c.Duration {
					t.Fatalf("request %d arrives at %v, after %v", r.ID, r.Arrival, c.Duration)
				}
			}
		})
	}
}

func TestNextStaysDone(t *testing.T) {
	for _, name := range Names() {
		c := mustConfig(t, name)
		c.Requests = 3
		src := mustNew(t, c)
		drainOpen(src)
		for range 3 {
			if r, ok := src.Next(); ok || r != nil {
				t.Fatalf("%s: Next after the end returned %v", name, r)
			}
		}
	}
}

// genW1 draws a valid w1 config.
func genW1(t *rapid.T) Config {
	c, _ := DefaultConfig("w1")
	c.Seed = rapid.Uint64().Draw(t, "seed")
	c.Rate = rapid.Float64Range(0.01, 1e4).Draw(t, "rate")
	c.Requests = rapid.IntRange(1, 300).Draw(t, "requests")
	genOutput(t, &c)
	p := &c.W1
	p.Prompts = rapid.IntRange(1, 64).Draw(t, "prompts")
	p.PromptMinTokens = rapid.IntRange(1, 9000).Draw(t, "prompt_min")
	p.PromptMaxTokens = rapid.IntRange(p.PromptMinTokens, 9000).Draw(t, "prompt_max")
	p.PopularityZipf = rapid.Float64Range(0, 3).Draw(t, "zipf")
	p.QuestionMinTokens = rapid.IntRange(1, 600).Draw(t, "question_min")
	p.QuestionMaxTokens = rapid.IntRange(p.QuestionMinTokens, 600).Draw(t, "question_max")
	c.MaxModelLen = p.PromptMaxTokens + p.QuestionMaxTokens + c.Output.MaxTokens + rapid.IntRange(0, 100).Draw(t, "slack")
	return c
}

func genOutput(t *rapid.T, c *Config) {
	o := &c.Output
	o.Median = rapid.Float64Range(1, 3000).Draw(t, "out_median")
	o.Sigma = rapid.Float64Range(0, 3).Draw(t, "out_sigma")
	o.Min = rapid.IntRange(1, 100).Draw(t, "out_min")
	o.MaxTokens = rapid.IntRange(o.Min, 2000).Draw(t, "out_max")
}

func TestW1Property(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := genW1(t)
		src, err := New(c)
		if err != nil {
			t.Fatalf("valid config rejected: %v", err)
		}
		reqs := drainOpen(src)
		if len(reqs) != c.Requests {
			t.Fatalf("%d requests, want %d", len(reqs), c.Requests)
		}
		sys := map[kvblock.Segment]bool{}
		for _, r := range reqs {
			checkRequest(t, &c, r)
			s, q := r.Prompt[0], r.Prompt[1]
			if s.Len < c.W1.PromptMinTokens || s.Len > c.W1.PromptMaxTokens ||
				q.Len < c.W1.QuestionMinTokens || q.Len > c.W1.QuestionMaxTokens {
				t.Fatalf("request %d: system %d, question %d tokens", r.ID, s.Len, q.Len)
			}
			sys[s] = true
		}
		if len(sys) > c.W1.Prompts {
			t.Fatalf("%d system prompts, want at most %d", len(sys), c.W1.Prompts)
		}
	})
}

func TestW6Property(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c, _ := DefaultConfig("w6")
		c.Seed = rapid.Uint64().Draw(t, "seed")
		c.Requests = rapid.IntRange(1, 300).Draw(t, "requests")
		genOutput(t, &c)
		p := &c.W6
		p.InputMedianTokens = rapid.Float64Range(1, 10000).Draw(t, "in_median")
		p.InputSigma = rapid.Float64Range(0, 3).Draw(t, "in_sigma")
		p.InputMinTokens = rapid.IntRange(1, 9000).Draw(t, "in_min")
		p.InputMaxTokens = rapid.IntRange(p.InputMinTokens, 9000).Draw(t, "in_max")
		c.MaxModelLen = p.InputMaxTokens + c.Output.MaxTokens
		for _, r := range drainOpen(mustNew(t, c)) {
			checkRequest(t, &c, r)
			if n := r.PromptTokens(); n < p.InputMinTokens || n > p.InputMaxTokens {
				t.Fatalf("request %d: prompt %d tokens", r.ID, n)
			}
		}
	})
}
