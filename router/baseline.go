package router

import "math/rand/v2"

// Compile-time checks that the baselines implement Policy.
var (
	_ Policy = (*RoundRobin)(nil)
	_ Policy = (*Random)(nil)
	_ Policy = (*LeastRequest)(nil)
	_ Policy = (*P2C)(nil)
)

// RoundRobin takes the candidates in turn.
type RoundRobin struct{ next uint64 }

func (*RoundRobin) Name() string { return "round_robin" }

func (p *RoundRobin) Pick(_ *Request, cands []Candidate) int {
	i := int(p.next % uint64(len(cands)))
	p.next++
	return i
}

// Random picks a candidate uniformly at random.
type Random struct{ rng *rand.Rand }

func (*Random) Name() string { return "random" }

func (p *Random) Pick(_ *Request, cands []Candidate) int { return p.rng.IntN(len(cands)) }

// LeastRequest picks the candidate with the fewest requests in flight (the
// gateway's own exact count), ties broken uniformly at random.
type LeastRequest struct{ rng *rand.Rand }

func (*LeastRequest) Name() string { return "least_request" }

func (p *LeastRequest) Pick(_ *Request, cands []Candidate) int {
	best, ties := 0, 1
	for i := 1; i < len(cands); i++ {
		switch d := cands[i].Load.InFlight - cands[best].Load.InFlight; {
		case d < 0:
			best, ties = i, 1
		case d == 0:
			ties++
			if p.rng.IntN(ties) == 0 { // reservoir sampling over the ties
				best = i
			}
		}
	}
	return best
}

// P2C draws two distinct candidates at random and keeps the one with fewer
// requests in flight (the first drawn on a tie).
type P2C struct{ rng *rand.Rand }

func (*P2C) Name() string { return "p2c" }

func (p *P2C) Pick(_ *Request, cands []Candidate) int {
	n := len(cands)
	if n == 1 {
		return 0
	}
	a := p.rng.IntN(n)
	b := p.rng.IntN(n - 1)
	if b >= a {
		b++
	}
	if cands[b].Load.InFlight < cands[a].Load.InFlight {
		return b
	}
	return a
}
