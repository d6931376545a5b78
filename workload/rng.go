package workload

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// mix64 is the SplitMix64 finalizer: a bijection on uint64 with mix64(0) == 0.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}

// subSeed derives the seed of one purpose, e.g. "w1/lengths", from the run
// seed, so that drawing more or fewer numbers for one purpose leaves the
// others' streams unchanged.
func subSeed(seed uint64, purpose string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(purpose))
	return seed ^ h.Sum64()
}

// newRand returns the random stream of one purpose.
func newRand(seed uint64, purpose string) *rand.Rand {
	s := subSeed(seed, purpose)
	return rand.New(rand.NewPCG(mix64(s+0x9E3779B97F4A7C15), mix64(s+0x3C6EF372FE94F82A)))
}

// idGen hands out segment IDs that never repeat within a source: a counter
// passed through a bijection keyed by the seed (and never 0).
type idGen struct {
	key, n uint64
}

func newIDGen(seed uint64, purpose string) idGen {
	return idGen{key: mix64(subSeed(seed, purpose) + 0x9E3779B97F4A7C15)}
}

func (g *idGen) next() uint64 {
	for {
		g.n++
		if id := mix64(g.key + g.n); id != 0 {
			return id
		}
	}
}

// segment returns a fresh segment of n tokens.
func (g *idGen) segment(n int) kvblock.Segment { return kvblock.Segment{ID: g.next(), Len: n} }

// lengthDist is a log-normal token count, rounded and clamped to [min, max].
type lengthDist struct {
	mu, sigma float64
	min, max  int
}

func newLengthDist(median, sigma float64, lo, hi int) lengthDist {
	return lengthDist{mu: math.Log(median), sigma: sigma, min: lo, max: hi}
}

func (d lengthDist) sample(r *rand.Rand) int {
	v := math.Exp(d.mu + d.sigma*r.NormFloat64())
	if !(v < float64(d.max)) { // also +Inf and NaN
		return d.max
	}
	n := int(math.Round(v))
	return min(max(n, d.min), d.max)
}

// uniform returns an int uniform in [lo, hi].
func uniform(r *rand.Rand, lo, hi int) int { return lo + r.IntN(hi-lo+1) }

// maxArrivalSeconds keeps arrival times well inside time.Duration.
const maxArrivalSeconds = 9e9

// poisson is an open-loop Poisson arrival process; the first arrival is at the
// first exponential gap.
type poisson struct {
	r     *rand.Rand
	rate  float64       // arrivals per second
	limit time.Duration // no arrival after this; 0 = none
	t     float64       // last arrival, seconds
	done  bool
}

// next returns the next arrival time, or false once past the limit.
func (p *poisson) next() (time.Duration, bool) {
	if p.done {
		return 0, false
	}
	p.t += p.r.ExpFloat64() / p.rate
	if !(p.t < maxArrivalSeconds) {
		p.done = true
		return 0, false
	}
	d := time.Duration(p.t * 1e9)
	if p.limit > 0 && d > p.limit {
		p.done = true
		return 0, false
	}
	return d, true
}

// outputs draws each request's output: length and a fresh segment.
type outputs struct {
	r    *rand.Rand
	dist lengthDist
}

func newOutputs(c *Config, purpose string) outputs {
	o := c.Output
	return outputs{r: newRand(c.Seed, purpose), dist: newLengthDist(o.Median, o.Sigma, o.Min, o.MaxTokens)}
}

func (o *outputs) sample(ids *idGen) kvblock.Segment { return ids.segment(o.dist.sample(o.r)) }
