package router

import (
	"math/rand/v2"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/seed"
)

// policyRNG is a policy's seeded random source. It keeps the PCG behind its
// Rand so that Explain can draw from a copy (peek) and report the choice
// Pick would make now without advancing the stream Pick draws from.
type policyRNG struct {
	src *rand.PCG
	*rand.Rand
}

// subRNG derives a policy's random source from the run seed, so adding a
// random draw in one place never reshuffles another. Its stream is
// seed.Rand(s, "router/"+name), bit for bit (TestPolicyRNGIsSeedRand): the
// PCG is built here, with seed.Rand's two words, only so that it can be
// copied.
func subRNG(s uint64, name string) policyRNG {
	d := seed.Derive(s, "router/"+name)
	src := rand.NewPCG(kvblock.Mix64(d+0x9E3779B97F4A7C15), kvblock.Mix64(d+0x3C6EF372FE94F82A))
	return policyRNG{src: src, Rand: rand.New(src)}
}

// clone returns a source that draws what this one would draw next, from a
// copy of its state: drawing from the clone leaves this one as it was.
func (r policyRNG) clone() policyRNG {
	cp := *r.src
	return policyRNG{src: &cp, Rand: rand.New(&cp)}
}

// peek is clone's Rand.
func (r policyRNG) peek() *rand.Rand { return r.clone().Rand }
