package synth

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/inferrail/inferrail/internal/seed"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
)

// Config holds the generator's parameters; see the package doc for the
// model. Zero fields take Default's values only through Default itself:
// Validate refuses a Config with fields left out.
type Config struct {
	Requests  int     `json:"requests"`
	Seed      uint64  `json:"seed"`
	Rate      float64 `json:"rate"`       // mean arrivals per second
	ArrivalCV float64 `json:"arrival_cv"` // coefficient of variation of the gaps: 1 is Poisson, above 1 burstier

	NewSession     float64 `json:"new_session"`     // probability a request opens a session
	ActiveSessions int     `json:"active_sessions"` // how many recent sessions a request may continue

	Prefixes     int     `json:"prefixes"`      // shared system prompts
	PrefixTokens int     `json:"prefix_tokens"` // length of each
	PrefixZipf   float64 `json:"prefix_zipf"`   // Zipf exponent of their popularity (> 1)

	InputMedian int     `json:"input_median"` // a session's first message, tokens (after the prefix)
	InputSigma  float64 `json:"input_sigma"`  // its lognormal sigma
	TurnMedian  int     `json:"turn_median"`  // each later message, tokens
	TurnSigma   float64 `json:"turn_sigma"`
	InputMax    int     `json:"input_max"` // longest prompt: a session that would pass it ends

	OutputMedian int     `json:"output_median"`
	OutputSigma  float64 `json:"output_sigma"`
	OutputMax    int     `json:"output_max"`

	BlockTokens int `json:"block_tokens"` // tokens per hash id (Mooncake: 512)
}

// Default is a trace of the Mooncake kind: prompts of about 11k tokens at
// the median and 60k+ at p99, most of each prompt shared with an earlier
// one (multi-turn sessions over shared system prompts).
func Default() Config {
	return Config{
		Requests: 4000, Seed: 1, Rate: 2, ArrivalCV: 1,
		NewSession: 0.3, ActiveSessions: 400,
		Prefixes: 40, PrefixTokens: 3072, PrefixZipf: 1.3,
		InputMedian: 3500, InputSigma: 1.1,
		TurnMedian: 1200, TurnSigma: 1.2,
		InputMax:     120000,
		OutputMedian: 350, OutputSigma: 0.6, OutputMax: 2000,
		BlockTokens: 512,
	}
}

// Validate checks c once; every error names the parameter (as its flag
// spells it) and what would be consistent.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Requests <= 0 || c.Requests > 100_000_000 {
		bad("requests: must be 1 to 100000000, got %d", c.Requests)
	}
	if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
		bad("rate: must be a positive number of requests per second, got %v", c.Rate)
	}
	if !(c.ArrivalCV > 0) || c.ArrivalCV > 10 {
		bad("arrival-cv: must be above 0 and at most 10 (1 is Poisson), got %v", c.ArrivalCV)
	}
	if !(c.NewSession > 0) || c.NewSession > 1 {
		bad("new-session: must be a probability above 0 and at most 1, got %v", c.NewSession)
	}
	if c.ActiveSessions < 1 {
		bad("active-sessions: must be at least 1, got %d", c.ActiveSessions)
	}
	if c.Prefixes < 0 {
		bad("prefixes: must be 0 (none) or more, got %d", c.Prefixes)
	}
	if c.Prefixes > 0 && c.PrefixTokens <= 0 {
		bad("prefix-tokens: must be positive with %d prefixes, got %d", c.Prefixes, c.PrefixTokens)
	}
	if c.Prefixes > 1 && !(c.PrefixZipf > 1) {
		bad("prefix-zipf: must be above 1 with several prefixes, got %v", c.PrefixZipf)
	}
	for _, m := range []struct {
		name string
		v    int
		s    float64
	}{{"input", c.InputMedian, c.InputSigma}, {"turn", c.TurnMedian, c.TurnSigma}, {"output", c.OutputMedian, c.OutputSigma}} {
		if m.v <= 0 {
			bad("%s-median: must be a positive token count, got %d", m.name, m.v)
		}
		if m.s < 0 || m.s > 4 || math.IsNaN(m.s) {
			bad("%s-sigma: must be 0 to 4, got %v", m.name, m.s)
		}
	}
	prefix := 0
	if c.Prefixes > 0 {
		prefix = c.PrefixTokens
	}
	if c.InputMax < prefix+c.InputMedian {
		bad("input-max %d: must be at least prefix-tokens + input-median = %d", c.InputMax, prefix+c.InputMedian)
	}
	if c.OutputMax < c.OutputMedian {
		bad("output-max %d: must be at least output-median %d", c.OutputMax, c.OutputMedian)
	}
	if c.BlockTokens <= 0 || c.BlockTokens > 1<<16 {
		bad("block-tokens: must be 1 to 65536, got %d", c.BlockTokens)
	}
	return errors.Join(errs...)
}

// session is one conversation: its prefix and its token count so far.
type session struct {
	id     uint64
	prefix int // index of its system prompt, -1 for none
	tokens int // prompt + answer of its last turn
}

// Generate writes c's trace to w in the Mooncake JSON-lines format.
func Generate(w io.Writer, c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	rng := seed.Rand(c.Seed, "traces/synth")
	var zipf *rand.Zipf
	if c.Prefixes > 1 {
		zipf = rand.NewZipf(rng, c.PrefixZipf, 1, uint64(c.Prefixes-1))
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	active := make([]*session, 0, c.ActiveSessions)
	var nextSession, nextFresh uint64
	var at float64 // seconds
	shape := 1 / (c.ArrivalCV * c.ArrivalCV)
	var line []byte
	for i := 0; i < c.Requests; i++ {
		if i > 0 {
			at += gamma(rng, shape) / shape / c.Rate
		}
		var s *session
		msg := 0
		if len(active) > 0 && rng.Float64() >= c.NewSession {
			s = active[rng.IntN(len(active))]
			msg = lognormal(rng, c.TurnMedian, c.TurnSigma)
			if s.tokens+msg > c.InputMax {
				s = nil // this session is done; the request opens a new one
			}
		}
		if s == nil {
			nextSession++
			s = &session{id: nextSession, prefix: -1}
			if c.Prefixes > 0 {
				s.prefix = 0
				if zipf != nil {
					s.prefix = int(zipf.Uint64())
				}
				s.tokens = c.PrefixTokens
			}
			msg = min(lognormal(rng, c.InputMedian, c.InputSigma), c.InputMax-s.tokens)
			if len(active) < c.ActiveSessions {
				active = append(active, s)
			} else {
				active[rng.IntN(len(active))] = s // replaces a random older one
			}
		}
		input := s.tokens + msg
		output := min(lognormal(rng, c.OutputMedian, c.OutputSigma), c.OutputMax)
		line = line[:0]
		line = append(line, `{"timestamp": `...)
		line = strconv.AppendInt(line, int64(math.Round(at*1000)), 10)
		line = append(line, `, "input_length": `...)
		line = strconv.AppendInt(line, int64(input), 10)
		line = append(line, `, "output_length": `...)
		line = strconv.AppendInt(line, int64(output), 10)
		line = append(line, `, "hash_ids": [`...)
		nb := (input + c.BlockTokens - 1) / c.BlockTokens
		for k := range nb {
			if k > 0 {
				line = append(line, ", "...)
			}
			var id uint64
			switch end := (k + 1) * c.BlockTokens; {
			case end > input:
				nextFresh++ // a partial last block: its content is this request's own
				id = 3<<62 | nextFresh
			case s.prefix >= 0 && end <= c.PrefixTokens:
				id = 1<<62 | uint64(s.prefix)<<24 | uint64(k)
			default:
				id = 2<<62 | s.id<<24 | uint64(k)
			}
			line = strconv.AppendUint(line, id, 10)
		}
		line = append(line, "]}\n"...)
		if _, err := bw.Write(line); err != nil {
			return fmt.Errorf("write trace: %w", err)
		}
		s.tokens = input + output
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write trace: %w", err)
	}
	return nil
}

// lognormal draws a positive integer with median m and log-sigma s.
func lognormal(rng *rand.Rand, m int, s float64) int {
	return max(1, int(math.Round(float64(m)*math.Exp(s*rng.NormFloat64()))))
}

// gamma draws from Gamma(k, 1) (Marsaglia and Tsang; boosted for k < 1).
func gamma(rng *rand.Rand, k float64) float64 {
	if k == 1 {
		return rng.ExpFloat64()
	}
	if k < 1 {
		return gamma(rng, k+1) * math.Pow(rng.Float64(), 1/k)
	}
	d := k - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if math.Log(u) < 0.5*x*x+d-d*v+d*math.Log(v) {
			return d * v
		}
	}
}
