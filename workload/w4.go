package workload

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// w4 generates retrieval-augmented requests: [system prompt, documents,
// question]. The documents are distinct, drawn by Zipf popularity without
// replacement, and placed most popular first (order "rank") or shuffled
// (order "random").
type w4 struct {
	openLoop
	model     string
	maxTokens int

	ids    idGen
	sys    kvblock.Segment   // Len 0: no system prompt
	docs   []kvblock.Segment // the corpus, by popularity rank
	cdf    []float64         // popularity CDF over docs
	k      int               // documents per prompt
	random bool              // order "random"
	pick   *rand.Rand
	orderR *rand.Rand
	qr     *rand.Rand
	qmin   int
	qmax   int
	out    outputs

	chosen []int     // scratch: the current request's documents, ascending
	mass   []float64 // scratch: mass[j] = popularity of chosen[:j]
}

func newW4(c *Config) *w4 {
	p := c.W4
	s := &w4{
		model:     c.Model,
		maxTokens: c.Output.MaxTokens,
		openLoop:  openLoop{limit: c.Requests, arr: newArrivals(c, "w4/arrivals", c.Rate), mix: newMixer(c)},
		ids:       newIDGen(c.Seed, "w4/segment-ids"),
		cdf:       zipfCDF(p.Documents, p.PopularityZipf),
		k:         p.DocsPerPrompt,
		random:    p.Order == OrderRandom,
		pick:      newRand(c.Seed, "w4/popularity"),
		orderR:    newRand(c.Seed, "w4/order"),
		qr:        newRand(c.Seed, "w4/questions"),
		qmin:      p.QuestionMinTokens,
		qmax:      p.QuestionMaxTokens,
		out:       newOutputs(c, "w4/outputs"),
		chosen:    make([]int, 0, p.DocsPerPrompt),
		mass:      make([]float64, 1, p.DocsPerPrompt+1),
	}
	if p.SystemTokens > 0 {
		s.sys = s.ids.segment(p.SystemTokens)
	}
	lr := newRand(c.Seed, "w4/doc-lengths")
	s.docs = make([]kvblock.Segment, p.Documents)
	for i := range s.docs {
		s.docs[i] = s.ids.segment(uniform(lr, p.DocMinTokens, p.DocMaxTokens))
	}
	return s
}

// prob returns document i's popularity.
func (s *w4) prob(i int) float64 {
	if i == 0 {
		return s.cdf[0]
	}
	return s.cdf[i] - s.cdf[i-1]
}

// draw fills s.chosen with s.k distinct documents, ascending: successive
// draws by popularity, each among the documents not yet chosen (sampling
// without replacement). Each draw takes one number from s.pick and inverts
// the CDF of the remaining documents by binary search, so there is no
// rejection however skewed the popularity.
func (s *w4) draw() {
	s.chosen = s.chosen[:0]
	s.mass = s.mass[:1]
	last := len(s.cdf) - 1
	for range s.k {
		removed := s.mass[len(s.mass)-1]
		u := s.pick.Float64() * (1 - removed)
		// First i whose remaining CDF, cdf[i] minus the chosen mass up to
		// i, exceeds u.
		lo, hi := 0, last
		for lo < hi {
			m := int(uint(lo+hi) >> 1)
			j, _ := slices.BinarySearch(s.chosen, m+1) // chosen documents <= m
			if s.cdf[m]-s.mass[j] > u {
				hi = m
			} else {
				lo = m + 1
			}
		}
		j, taken := slices.BinarySearch(s.chosen, lo)
		if taken { // only by rounding: take the nearest free neighbour
			j, lo = s.free(j, lo)
		}
		s.chosen = slices.Insert(s.chosen, j, lo)
		s.mass = append(s.mass, 0)
		for t := j; t < len(s.chosen); t++ {
			s.mass[t+1] = s.mass[t] + s.prob(s.chosen[t])
		}
	}
}

// free returns the first document after i that is not chosen, or failing
// that the last before it, with its insertion index in s.chosen; chosen[j]
// == i.
func (s *w4) free(j, i int) (int, int) {
	for t, d := j, i; d < len(s.cdf); t, d = t+1, d+1 {
		if t >= len(s.chosen) || s.chosen[t] != d {
			return t, d
		}
	}
	for t, d := j, i; ; t, d = t-1, d-1 {
		if t < 0 || s.chosen[t] != d {
			return t + 1, d
		}
	}
}

func (s *w4) Next() (*Request, bool) {
	at, ok := s.nextArrival()
	if !ok {
		return nil, false
	}
	s.draw()
	nsys := 0
	if s.sys.Len > 0 {
		nsys = 1
	}
	prompt := make([]kvblock.Segment, nsys+s.k+1)
	if nsys > 0 {
		prompt[0] = s.sys
	}
	docs := prompt[nsys : nsys+s.k]
	for i, d := range s.chosen {
		docs[i] = s.docs[d]
	}
	if s.random {
		for i := len(docs) - 1; i > 0; i-- {
			j := s.orderR.IntN(i + 1)
			docs[i], docs[j] = docs[j], docs[i]
		}
	}
	prompt[len(prompt)-1] = s.ids.segment(uniform(s.qr, s.qmin, s.qmax))
	o := s.out.sample(&s.ids)
	r := &Request{
		ID:           s.n,
		Arrival:      at,
		Model:        s.model,
		Prompt:       prompt,
		MaxTokens:    s.maxTokens,
		OutputTokens: o.Len,
		Output:       o,
	}
	s.mix.apply(r)
	return r, true
}

// Done never causes a follow-up: w4 is open loop.
func (s *w4) Done(*Request, time.Duration, bool) (*Request, bool) { return nil, false }

// TakesAhead is true: Next does not depend on Done (workload.TakesAhead).
func (s *w4) TakesAhead() bool { return true }
