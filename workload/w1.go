package workload

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// w1 generates shared-system-prompt requests: [system, question].
type w1 struct {
	openLoop
	model     string
	maxTokens int

	ids  idGen
	sys  []kvblock.Segment
	cdf  []float64 // popularity CDF; nil = uniform
	pick *rand.Rand
	qr   *rand.Rand
	qmin int
	qmax int
	out  outputs
}

func newW1(c *Config) *w1 {
	p := c.W1
	s := &w1{
		model:     c.Model,
		maxTokens: c.Output.MaxTokens,
		openLoop:  openLoop{limit: c.Requests, arr: newArrivals(c, "w1/arrivals", c.Rate), mix: newMixer(c)},
		ids:       newIDGen(c.Seed, "w1/segment-ids"),
		pick:      newRand(c.Seed, "w1/popularity"),
		qr:        newRand(c.Seed, "w1/questions"),
		qmin:      p.QuestionMinTokens,
		qmax:      p.QuestionMaxTokens,
		out:       newOutputs(c, "w1/outputs"),
	}
	lr := newRand(c.Seed, "w1/prompt-lengths")
	s.sys = make([]kvblock.Segment, p.Prompts)
	for i := range s.sys {
		s.sys[i] = s.ids.segment(uniform(lr, p.PromptMinTokens, p.PromptMaxTokens))
	}
	if p.PopularityZipf > 0 {
		s.cdf = zipfCDF(p.Prompts, p.PopularityZipf)
	}
	return s
}

// zipfCDF returns the normalised CDF of weights 1/(i+1)^s, i in [0, n).
func zipfCDF(n int, s float64) []float64 {
	cdf := make([]float64, n)
	sum := 0.0
	for i := range cdf {
		sum += math.Pow(float64(i+1), -s)
		cdf[i] = sum
	}
	for i := range cdf {
		cdf[i] /= sum
	}
	cdf[n-1] = 1
	return cdf
}

// choose returns the index of the next request's system prompt.
func (s *w1) choose() int {
	if s.cdf == nil {
		return s.pick.IntN(len(s.sys))
	}
	u := s.pick.Float64()
	lo, hi := 0, len(s.cdf)-1
	for lo < hi { // first i with cdf[i] > u
		m := int(uint(lo+hi) >> 1)
		if s.cdf[m] > u {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// w1Alloc holds a request and its prompt in one allocation.
type w1Alloc struct {
	req  Request
	segs [2]kvblock.Segment
}

func (s *w1) Next() (*Request, bool) {
	at, ok := s.nextArrival()
	if !ok {
		return nil, false
	}
	a := &w1Alloc{}
	a.segs[0] = s.sys[s.choose()]
	a.segs[1] = s.ids.segment(uniform(s.qr, s.qmin, s.qmax))
	o := s.out.sample(&s.ids)
	a.req = Request{
		ID:           s.n,
		Arrival:      at,
		Model:        s.model,
		Prompt:       a.segs[:],
		MaxTokens:    s.maxTokens,
		OutputTokens: o.Len,
		Output:       o,
	}
	s.mix.apply(&a.req)
	return &a.req, true
}

// Done never causes a follow-up: w1 is open loop.
func (s *w1) Done(*Request, time.Duration, bool) (*Request, bool) { return nil, false }

// TakesAhead is true: Next does not depend on Done (workload.TakesAhead).
func (s *w1) TakesAhead() bool { return true }
