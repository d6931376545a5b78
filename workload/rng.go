package workload

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/seed"
)

// newRand returns the random stream of one purpose, e.g. "w1/lengths"
// (see package seed).
func newRand(s uint64, purpose string) *rand.Rand { return seed.Rand(s, purpose) }

// idGen hands out segment IDs that never repeat within a source: a counter
// passed through a bijection keyed by the seed (and never 0).
type idGen struct {
	key, n uint64
}

func newIDGen(s uint64, purpose string) idGen {
	return idGen{key: kvblock.Mix64(seed.Derive(s, purpose) + 0x9E3779B97F4A7C15)}
}

func (g *idGen) next() uint64 {
	for {
		g.n++
		if id := kvblock.Mix64(g.key + g.n); id != 0 {
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

// arrivals is an open-loop arrival process: renewal gaps with mean 1/rate,
// exponential (Poisson) or gamma-distributed. The first arrival is at the
// first gap.
type arrivals struct {
	r     *rand.Rand
	rate  float64       // arrivals per second
	shape float64       // gamma shape k = 1/cv²; 0 = exponential gaps
	limit time.Duration // no arrival after this; 0 = none
	t     float64       // last arrival, seconds
	done  bool
}

// newArrivals returns the arrival process of Config.Arrival at rate per
// second, drawing from the purpose's stream. Poisson gaps are
// r.ExpFloat64()/rate, one draw each, so the Poisson streams do not depend
// on the gamma code.
func newArrivals(c *Config, purpose string, rate float64) arrivals {
	a := arrivals{r: newRand(c.Seed, purpose), rate: rate, limit: c.Duration}
	if c.Arrival.Process == ArrivalGamma {
		a.shape = 1 / (c.Arrival.CV * c.Arrival.CV)
	}
	return a
}

// gap returns the next inter-arrival time in seconds.
func (p *arrivals) gap() float64 {
	if p.shape == 0 {
		return p.r.ExpFloat64() / p.rate
	}
	// Gamma(k, scale) with scale = mean/k: mean 1/rate, cv 1/sqrt(k).
	return gammaRand(p.r, p.shape) / (p.shape * p.rate)
}

// next returns the next arrival time, or false once past the limit.
func (p *arrivals) next() (time.Duration, bool) {
	if p.done {
		return 0, false
	}
	p.t += p.gap()
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

// gammaRand returns a Gamma(k, 1) variate, k > 0, by Marsaglia and Tsang's
// method ("A simple method for generating gamma variables", 2000); for
// k < 1 it boosts: Gamma(k) = Gamma(k+1) · U^(1/k).
func gammaRand(r *rand.Rand, k float64) float64 {
	boost := 1.0
	if k < 1 {
		// 1 - Float64() is in (0, 1], so the log is finite.
		boost = math.Exp(math.Log(1-r.Float64()) / k)
		k++
	}
	d := k - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := r.NormFloat64()
		cx := c * x
		if cx <= -1 {
			continue
		}
		// v = (1+cx)³, with v-1 and log v computed without cancellation
		// so that huge k (tiny cv) stays accurate.
		vm1 := cx * (3 + cx*(3+cx))
		v := 1 + vm1
		x2 := x * x
		u := r.Float64()
		if u < 1-0.0331*x2*x2 {
			return d * v * boost
		}
		if math.Log(u) < 0.5*x2+d*(3*math.Log1p(cx)-vm1) {
			return d * v * boost
		}
	}
}

// outputs draws each request's output: length and a fresh segment.
type outputs struct {
	r    *rand.Rand
	dist lengthDist
}

func newOutputs(c *Config, purpose string) outputs {
	return newShortOutputs(c, purpose, c.Output.Median, c.Output.Sigma)
}

// newShortOutputs is newOutputs with a workload's own median and sigma,
// still clamped to [output.min, output.max_tokens].
func newShortOutputs(c *Config, purpose string, median, sigma float64) outputs {
	o := c.Output
	return outputs{r: newRand(c.Seed, purpose), dist: newLengthDist(median, sigma, o.Min, o.MaxTokens)}
}

func (o *outputs) sample(ids *idGen) kvblock.Segment { return ids.segment(o.dist.sample(o.r)) }

// openLoop numbers the arrivals of an open-loop workload and stops it at its
// request limit or at the end of its arrival process; once stopped it stays
// stopped.
type openLoop struct {
	arr      arrivals
	mix      mixer  // Config.Mix, drawn per request
	limit    int    // Config.Requests; 0 = none
	n        uint64 // requests created
	finished bool
}

// nextArrival returns the next request's arrival and counts it in n.
func (o *openLoop) nextArrival() (time.Duration, bool) {
	if o.finished || (o.limit > 0 && o.n >= uint64(o.limit)) {
		o.finished = true
		return 0, false
	}
	at, ok := o.arr.next()
	if !ok {
		o.finished = true
		return 0, false
	}
	o.n++
	return at, true
}
