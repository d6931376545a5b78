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
	Parallel    int
	Progress    func(done, total int)
}

// SizePoint is one fleet size evaluated for a policy: medians over seeds.
type SizePoint struct {
	Replicas  int
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
// falls as replicas are added). Every probe runs all seeds; probes of
// different variants run in parallel. Results follow Variants order.
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
		var jobs []job
		var probes []int // variant index per job group
		for i, x := range st {
			if x.done {
				continue
			}
			n := x.hi
			if x.known {
				n = (x.lo + x.hi) / 2
			}
			probes = append(probes, i)
			for _, seed := range s.Seeds {
				jobs = append(jobs, job{Variant: vs[i], seed: seed, rate: s.Rate, replicas: n})
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
		for g, i := range probes {
			group := pts[g*len(s.Seeds) : (g+1)*len(s.Seeds)]
			p := evaluate(group, s.Base.SLO)
			for _, pt := range group {
				fails[i] = append(fails[i], results.Summary{Failed: pt.Summary.Failed, FailedBy: pt.Summary.FailedBy, FailureReasons: pt.Summary.FailureReasons})
			}
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
		r := CapacityResult{Policy: v.Policy, Admission: v.Admission, Ledger: v.Ledger, Label: v.Label, Replicas: x.hi, failures: fails[i]}
		for _, p := range x.points {
			r.Points = append(r.Points, p)
		}
		slices.SortFunc(r.Points, func(a, b SizePoint) int { return a.Replicas - b.Replicas })
		if p, ok := x.points[r.Replicas]; ok && r.Replicas > 0 && p.Unsteady > 0 {
			r.Warning = fmt.Sprintf("%s: %d replicas may be too few: %d of %d seeds' runs at %d replicas are %s",
				v.Label, r.Replicas, p.Unsteady, len(s.Seeds), r.Replicas, p.Warning)
		}
		out[i] = r
	}
	return out, nil
}

// evaluate reduces one fleet size's seeds to a point.
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
