package router

import (
	"fmt"
	"math/rand/v2"
)

// Compile-time checks that the baselines implement Policy and Explainer.
var (
	_ Policy    = (*RoundRobin)(nil)
	_ Policy    = (*Random)(nil)
	_ Policy    = (*LeastRequest)(nil)
	_ Policy    = (*P2C)(nil)
	_ Explainer = (*RoundRobin)(nil)
	_ Explainer = (*Random)(nil)
	_ Explainer = (*LeastRequest)(nil)
	_ Explainer = (*P2C)(nil)
)

// RoundRobin takes the candidates in turn.
type RoundRobin struct{ next uint64 }

func (*RoundRobin) Name() string { return "round_robin" }

// at is the candidate the cursor points at among n.
func (p *RoundRobin) at(n int) int { return int(p.next % uint64(n)) }

func (p *RoundRobin) Pick(_ *Request, cands []Candidate) int {
	i := p.at(len(cands))
	p.next++
	return i
}

// Explain reports the candidate the cursor points at now; the cursor does
// not move.
func (p *RoundRobin) Explain(_ *Request, cands []Candidate) Explanation {
	ex := newExplanation(p.Name(), "rule", cands)
	ex.Winner = p.at(len(cands))
	ex.term("cursor", float64(p.next))
	ex.term("candidates", float64(len(cands)))
	ex.Why = fmt.Sprintf("its turn: cursor %d mod %d candidates = %d", p.next, len(cands), ex.Winner)
	return ex
}

// Random picks a candidate uniformly at random.
type Random struct{ rng policyRNG }

func (*Random) Name() string { return "random" }

func (p *Random) Pick(_ *Request, cands []Candidate) int { return p.rng.IntN(len(cands)) }

// Explain reports the draw Pick would make now, from a copy of the source.
func (p *Random) Explain(_ *Request, cands []Candidate) Explanation {
	ex := newExplanation(p.Name(), "rule", cands)
	ex.Winner = p.rng.peek().IntN(len(cands))
	ex.term("draw", float64(ex.Winner))
	ex.term("candidates", float64(len(cands)))
	ex.Why = fmt.Sprintf("drawn uniformly at random: %d of %d candidates", ex.Winner, len(cands))
	return ex
}

// LeastRequest picks the candidate with the fewest requests in flight (the
// gateway's own exact count), ties broken uniformly at random.
type LeastRequest struct{ rng policyRNG }

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

// Explain scores each candidate by its requests in flight; the winner is
// what Pick returns on a copy of the policy whose source is a copy of this
// one's.
func (p *LeastRequest) Explain(req *Request, cands []Candidate) Explanation {
	ex := newExplanation(p.Name(), "min in_flight", cands)
	low := cands[0].Load.InFlight
	for i := range cands {
		ex.cterm(i, "in_flight", float64(cands[i].Load.InFlight))
		ex.Candidates[i].Score = Num(cands[i].Load.InFlight)
		low = min(low, cands[i].Load.InFlight)
	}
	ties := 0
	for i := range cands {
		if cands[i].Load.InFlight == low {
			ties++
		}
	}
	cp := LeastRequest{rng: p.rng.clone()}
	ex.Winner = cp.Pick(req, cands)
	ex.term("ties", float64(ties))
	ex.Why = ex.compared("in flight", "", true, ties)
	return ex
}

// P2C draws two distinct candidates at random and keeps the one with fewer
// requests in flight (the first drawn on a tie).
type P2C struct{ rng policyRNG }

func (*P2C) Name() string { return "p2c" }

// choose is Pick's rule with rng as the source: the pick and the two draws
// (-1 with one candidate).
func (p *P2C) choose(cands []Candidate, rng *rand.Rand) (pick, a, b int) {
	n := len(cands)
	if n == 1 {
		return 0, -1, -1
	}
	a = rng.IntN(n)
	b = rng.IntN(n - 1)
	if b >= a {
		b++
	}
	if cands[b].Load.InFlight < cands[a].Load.InFlight {
		return b, a, b
	}
	return a, a, b
}

func (p *P2C) Pick(_ *Request, cands []Candidate) int {
	pick, _, _ := p.choose(cands, p.rng.Rand)
	return pick
}

// Explain reports the two draws Pick would make now, from a copy of the
// source; only the drawn candidates have a score (their requests in flight).
func (p *P2C) Explain(_ *Request, cands []Candidate) Explanation {
	ex := newExplanation(p.Name(), "min in_flight of two drawn", cands)
	pick, a, b := p.choose(cands, p.rng.peek())
	ex.Winner = pick
	ex.term("draw_a", float64(a))
	ex.term("draw_b", float64(b))
	for i := range cands {
		ex.cterm(i, "in_flight", float64(cands[i].Load.InFlight))
		if i == a || i == b {
			ex.Candidates[i].Score = Num(cands[i].Load.InFlight)
		}
	}
	switch {
	case a < 0:
		ex.Why = "the only candidate"
	case cands[a].Load.InFlight == cands[b].Load.InFlight:
		ex.Why = fmt.Sprintf("drew %s and %s, both %d in flight: the first drawn wins", ex.label(a), ex.label(b), cands[a].Load.InFlight)
	default:
		lose := a + b - pick
		ex.Why = fmt.Sprintf("drew %s and %s: %s has fewer in flight (%d against %d)", ex.label(a), ex.label(b), ex.label(pick), cands[pick].Load.InFlight, cands[lose].Load.InFlight)
	}
	return ex
}
