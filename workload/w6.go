package workload

import (
	"math/rand/v2"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// w6 generates requests that share nothing: each prompt is one fresh segment.
type w6 struct {
	openLoop
	model     string
	maxTokens int

	ids   idGen
	lr    *rand.Rand
	input lengthDist
	out   outputs
}

func newW6(c *Config) *w6 {
	p := c.W6
	return &w6{
		model:     c.Model,
		maxTokens: c.Output.MaxTokens,
		openLoop:  openLoop{limit: c.Requests, arr: newArrivals(c, "w6/arrivals", c.Rate), mix: newMixer(c)},
		ids:       newIDGen(c.Seed, "w6/segment-ids"),
		lr:        newRand(c.Seed, "w6/input-lengths"),
		input:     newLengthDist(p.InputMedianTokens, p.InputSigma, p.InputMinTokens, p.InputMaxTokens),
		out:       newOutputs(c, "w6/outputs"),
	}
}

// w6Alloc holds a request and its prompt in one allocation.
type w6Alloc struct {
	req  Request
	segs [1]kvblock.Segment
}

func (s *w6) Next() (*Request, bool) {
	at, ok := s.nextArrival()
	if !ok {
		return nil, false
	}
	a := &w6Alloc{}
	a.segs[0] = s.ids.segment(s.input.sample(s.lr))
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

// Done never causes a follow-up: w6 is open loop.
func (s *w6) Done(*Request, time.Duration, bool) (*Request, bool) { return nil, false }

// TakesAhead is true: Next does not depend on Done (workload.TakesAhead).
func (s *w6) TakesAhead() bool { return true }
