package workload

import (
	"github.com/inferrail/inferrail/engine/kvblock"
)

// w2 generates closed-loop multi-turn chat: each session picks one of the
// shared system prompts, then alternates user messages and the model's
// answers; the next turn arrives a think time after the previous completes.
type w2 struct{ closedLoop }

func newW2(c *Config) *w2 {
	p := c.W2
	meanTurns := float64(p.TurnsMin+p.TurnsMax) / 2
	userR := newRand(c.Seed, "w2/user-lengths")
	user := newLengthDist(p.UserMedianTokens, p.UserSigma, p.UserMinTokens, p.UserMaxTokens)
	s := &w2{closedLoop{
		model:       c.Model,
		maxTokens:   c.Output.MaxTokens,
		maxModelLen: c.MaxModelLen,
		limit:       c.Requests,
		duration:    c.Duration,
		sessions:    make(map[uint64]*session),
		mix:         newMixer(c),
		arr:         newArrivals(c, "w2/arrivals", c.Rate/meanTurns),
		ids:         newIDGen(c.Seed, "w2/segment-ids"),
		turnsR:      newRand(c.Seed, "w2/turns"),
		turns:       span{p.TurnsMin, p.TurnsMax},
		sysR:        newRand(c.Seed, "w2/system-choice"),
		delayR:      newRand(c.Seed, "w2/think"),
		delayMin:    p.ThinkMin,
		delayMax:    p.ThinkMax,
		firstR:      userR, // first and later user messages share one stream
		first:       user,
		followR:     userR,
		follow:      user,
		out:         newOutputs(c, "w2/outputs"),
	}}
	lr := newRand(c.Seed, "w2/system-lengths")
	s.sys = make([]kvblock.Segment, p.SystemPrompts)
	for i := range s.sys {
		s.sys[i] = s.ids.segment(uniform(lr, p.SystemMinTokens, p.SystemMaxTokens))
	}
	return s
}
