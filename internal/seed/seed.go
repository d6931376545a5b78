// Package seed derives the random streams of a run from its one seed: every
// subsystem that draws random numbers (workload generators, the router's tie
// breaks, trace sampling, the mock engine, calibration probes, trace
// synthesis) asks for the stream of its own purpose, so that drawing more or
// fewer numbers for one purpose never reshuffles another, and the same seed
// gives the same numbers bit for bit.
//
// Start at Rand; Derive gives the purpose's 64-bit seed for code that needs
// a number rather than a stream (e.g. an id bijection's key).
package seed

import (
	"hash/fnv"
	"math/rand/v2"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// Derive returns the seed of one purpose, e.g. "w1/lengths" or
// "router/cost_model", from the run seed: the run seed xor the purpose's
// FNV-1a hash. Distinct purposes give distinct seeds for every run seed.
func Derive(seed uint64, purpose string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(purpose))
	return seed ^ h.Sum64()
}

// Rand returns the random stream of one purpose: a PCG whose two words are
// the purpose's seed passed through a 64-bit finaliser at two offsets, so
// that nearby run seeds give unrelated streams.
func Rand(seed uint64, purpose string) *rand.Rand {
	s := Derive(seed, purpose)
	return rand.New(rand.NewPCG(kvblock.Mix64(s+0x9E3779B97F4A7C15), kvblock.Mix64(s+0x3C6EF372FE94F82A)))
}
