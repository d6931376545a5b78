package compare

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router/gateway"
)

// CapacitySpec asks, per variant (a policy under an admission rule and a
// ledger), for the fewest replicas that meet the SLO at one offered load.
type CapacitySpec struct {
	// Base is the run every point starts from; its Policy, Admission,
	// Ledger, Seed, Replicas and workload rate are replaced. Base.SLO is the
	// objective.
	Base     fleet.Config
	Policies []string
	// Admissions and Ledgers are compared as in Spec: empty means
	// Base.Admission or Base.Ledger alone.
	Admissions []gateway.Admission
	Ledgers    []string
	Seeds      []uint64
	// Rate is the offered load in requests per second.
	Rate float64
	// MaxReplicas bounds the search.
	MaxReplicas int
	// Split, when set, searches the P/D split too: every fleet size n
	// probed runs the aggregated fleet and every split of n into p
	// prefill and n-p decode replicas (p from 1 to n-1); n meets the SLO
	// when any of them does, and the size's point is its best split
	// (SizePoint.Pool). Base's own pools must then be unset.
	Split    bool
	Parallel int
	Progress func(done, total int)
}

// SizePoint is one fleet size evaluated for a policy: medians over seeds.
// In a search over splits (CapacitySpec.Split) it is the size's best
// split: of those meeting the SLO the one with the lowest TTFT p99, else
// the lowest TTFT p99 of all, ties going to fewer prefill replicas (the
// aggregated fleet counting as none).
type SizePoint struct {
	Replicas int
	// Pool is the split the point ran: Base's pools, or in a search over
	// splits the best one (the zero Pool: aggregated).
	Pool      Pool
	TTFTP99Ms float64
	TPOTP99Ms float64
	// Met: every request completed and the medians over seeds of TTFT p99
	// and TPOT p99 are within the SLO.
	Met bool
	// Failed is the most measured requests one seed's run left incomplete
	// (Met needs none); CapacityReport.FailureNotes says why.
	Failed int
	// Unsteady counts the seeds whose run looks too short for its answer
	// (results.SteadyState), and Warning is the first one's warning.
	Unsteady int
	Warning  string
	// RateRPS is the median over seeds of the offered rate: the searched
	// rate, or for a trace replay what its arrivals offer.
	RateRPS float64
}

// CapacityResult is one variant's answer.
type CapacityResult struct {
	Policy    string
	Admission gateway.Admission
	Ledger    string
	Label     string // Variant.Label
	// Replicas is the fewest replicas meeting the SLO, 0 if none up to MaxReplicas.
	Replicas int
	// Split says the search tried every P/D split (CapacitySpec.Split);
	// Pool is then the best split at Replicas (SizePoint.Pool; the zero
	// Pool: aggregated, and always when Replicas is 0).
	Split bool
	Pool  Pool
	// Points are the fleet sizes evaluated, ascending.
	Points []SizePoint
	// Warning, when set, says the answer may be too low: a seed's run at
	// Replicas looks too short for it (SizePoint.Unsteady), so a longer run
	// may need more replicas.
	Warning string
	// failures holds each probe's failure counts and reasons (the
	// FailedBy and FailureReasons of its summaries), for FailureNotes.
	failures []results.Summary
}

// Validate checks the spec before any simulation starts.
func (s *CapacitySpec) Validate() error {
	var errs []error
	if !(s.Rate > 0) {
		errs = append(errs, fmt.Errorf("rate: must be a positive number of requests per second, got %v", s.Rate))
	}
	if s.MaxReplicas < 1 || s.MaxReplicas > fleet.MaxReplicas {
		errs = append(errs, fmt.Errorf("max-replicas: must be between 1 and %d, got %d", fleet.MaxReplicas, s.MaxReplicas))
	}
	sp := s.spec()
	if s.Split {
		if !poolOf(s.Base).Aggregated() {
			errs = append(errs, fmt.Errorf("pd-split: searches the prefill/decode split itself: leave prefill_replicas and decode_replicas unset, got %d and %d",
				s.Base.PrefillReplicas, s.Base.DecodeReplicas))
		}
		// The splits must be valid too: the base is checked aggregated and
		// with a prefill and a decode replica.
		sp.Base.PrefillReplicas, sp.Base.DecodeReplicas = 0, 0
		sp.Base.Replicas = max(sp.Base.Replicas, 2)
		sp.Pools = []Pool{{}, {Prefill: 1, Decode: 1}}
	}
	if s.Rate > 0 {
		if err := sp.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// spec is the comparison the search probes.
func (s *CapacitySpec) spec() Spec {
	return Spec{Base: s.Base, Policies: s.Policies, Admissions: s.Admissions, Ledgers: s.Ledgers, Seeds: s.Seeds, Rates: []float64{s.Rate}, Parallel: s.Parallel}
}

// Variants lists the variants searched, in result order (see Spec.Variants).
func (s *CapacitySpec) Variants() []Variant {
	sp := s.spec()
	return sp.Variants()
}

// Capacity finds, for every variant, the fewest replicas in
// [1, MaxReplicas] that meet the SLO at Rate, by binary search (latency
// falls as replicas are added). Every probe runs all seeds, and with Split
// every split of the size; probes of different variants run in parallel.
// Results follow Variants order.
func Capacity(ctx context.Context, s CapacitySpec) ([]CapacityResult, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	run := func(ctx context.Context, jobs []job, progress func(int, int)) ([]Point, error) {
		return runJobs(ctx, s.Base, jobs, s.Parallel, false, progress)
	}
	return capacity(ctx, s, run)
}

// runner runs a batch of simulations; capacity's tests replace it.
type runner func(ctx context.Context, jobs []job, progress func(int, int)) ([]Point, error)

func capacity(ctx context.Context, s CapacitySpec, run runner) ([]CapacityResult, error) {
	type state struct {
		lo, hi int // the answer is in [lo, hi]; hi meets the SLO once known
		known  bool
		done   bool
		points map[int]SizePoint
	}
	vs := s.Variants()
	fails := make([][]results.Summary, len(vs))
	st := make([]*state, len(vs))
	for i := range st {
		st[i] = &state{lo: 1, hi: s.MaxReplicas, points: map[int]SizePoint{}}
	}
	done, total := 0, 0
	progress := func(int, int) {
		done++
		if s.Progress != nil {
			s.Progress(done, total)
		}
	}
	for {
		// Each unresolved policy probes one fleet size this round: first the
		// largest, to see whether the SLO can be met at all, then midpoints.
		// A probe is one variant at one size: a group of seeds per split.
		type probe struct {
			variant int
			pools   []Pool
		}
		var jobs []job
		var probes []probe
		for i, x := range st {
			if x.done {
				continue
			}
			n := x.hi
			if x.known {
				n = (x.lo + x.hi) / 2
			}
			pools := s.splits(vs[i].Pool, n)
			probes = append(probes, probe{i, pools})
			for _, pool := range pools {
				v := vs[i]
				v.Pool = pool
				for _, seed := range s.Seeds {
					jobs = append(jobs, job{Variant: v, seed: seed, rate: s.Rate, replicas: n})
				}
			}
		}
		if len(jobs) == 0 {
			break
		}
		total = done + len(jobs)
		pts, err := run(ctx, jobs, progress)
		if err != nil {
			return nil, err
		}
		at := 0
		for _, pr := range probes {
			i := pr.variant
			var cands []SizePoint
			for _, pool := range pr.pools {
				group := pts[at : at+len(s.Seeds)]
				at += len(s.Seeds)
				c := evaluate(group, s.Base.SLO)
				c.Pool = pool
				cands = append(cands, c)
				for _, pt := range group {
					fails[i] = append(fails[i], results.Summary{Failed: pt.Summary.Failed, FailedBy: pt.Summary.FailedBy, FailureReasons: pt.Summary.FailureReasons})
				}
			}
			p := bestSplit(cands)
			x := st[i]
			x.points[p.Replicas] = p
			switch {
			case !x.known && !p.Met:
				x.done, x.hi = true, 0 // not even MaxReplicas meets it
			case !x.known:
				x.known = true
			case p.Met:
				x.hi = p.Replicas
			default:
				x.lo = p.Replicas + 1
			}
			if x.known && x.lo >= x.hi {
				x.done = true
			}
		}
	}
	out := make([]CapacityResult, len(vs))
	for i, x := range st {
		v := vs[i]
		r := CapacityResult{Policy: v.Policy, Admission: v.Admission, Ledger: v.Ledger, Label: v.Label, Replicas: x.hi, Split: s.Split, failures: fails[i]}
		for _, p := range x.points {
			r.Points = append(r.Points, p)
		}
		slices.SortFunc(r.Points, func(a, b SizePoint) int { return a.Replicas - b.Replicas })
		if p, ok := x.points[r.Replicas]; ok && r.Replicas > 0 {
			if s.Split {
				r.Pool = p.Pool
			}
			if p.Unsteady > 0 {
				r.Warning = fmt.Sprintf("%s: %d replicas may be too few: %d of %d seeds' runs at %d replicas are %s",
					v.Label, r.Replicas, p.Unsteady, len(s.Seeds), r.Replicas, p.Warning)
			}
		}
		out[i] = r
	}
	return out, nil
}

// splits lists the pools a probe of n replicas runs: the variant's own
// pool, or in a search over splits the aggregated fleet and then p prefill
// and n-p decode replicas for p from 1 to n-1.
func (s *CapacitySpec) splits(own Pool, n int) []Pool {
	if !s.Split {
		return []Pool{own}
	}
	out := []Pool{{}}
	for p := 1; p < n; p++ {
		out = append(out, Pool{Prefill: p, Decode: n - p})
	}
	return out
}

// bestSplit is the best of one size's splits (in splits order: fewer
// prefill replicas first): of those meeting the SLO the lowest TTFT p99,
// else the lowest TTFT p99 of all; ties go to the earlier.
func bestSplit(cands []SizePoint) SizePoint {
	best := 0
	for i, c := range cands[1:] {
		b := cands[best]
		if (c.Met && !b.Met) || (c.Met == b.Met && c.TTFTP99Ms < b.TTFTP99Ms) {
			best = i + 1
		}
	}
	return cands[best]
}

// evaluate reduces one fleet size's seeds (of one split) to a point.
func evaluate(group []Point, slo results.SLO) SizePoint {
	ttft := make([]float64, len(group))
	tpot := make([]float64, len(group))
	rate := make([]float64, len(group))
	complete := true
	sp := SizePoint{Replicas: group[0].Replicas}
	for i, p := range group {
		ttft[i] = p.Summary.TTFT.P99
		tpot[i] = p.Summary.TPOT.P99
		rate[i] = p.Rate
		complete = complete && p.Summary.Completed == p.Summary.Requests
		sp.Failed = max(sp.Failed, p.Summary.Requests-p.Summary.Completed)
		if w := p.Summary.Steady.Warning; w != "" {
			if sp.Unsteady == 0 {
				sp.Warning = w
			}
			sp.Unsteady++
		}
	}
	sp.TTFTP99Ms, sp.TPOTP99Ms, sp.RateRPS = median(ttft), median(tpot), median(rate)
	def := results.DefaultSLO()
	if slo.TTFTP99 == 0 {
		slo.TTFTP99 = def.TTFTP99
	}
	if slo.TPOTP99 == 0 {
		slo.TPOTP99 = def.TPOTP99
	}
	sp.Met = complete && sp.TTFTP99Ms <= ms(slo.TTFTP99) && sp.TPOTP99Ms <= ms(slo.TPOTP99)
	return sp
}

// median of xs (upper median for even counts); xs is reordered.
func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}
