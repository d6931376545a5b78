package compare

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router"
)

// Spec describes a comparison: one workload and fleet under several
// policies, seeds and offered loads.
type Spec struct {
	// Base is the run every point starts from (workload, fleet, engine, SLO,
	// warmup, index); its Policy, Seed and workload rate are replaced.
	Base fleet.Config
	// Policies to compare, in report order.
	Policies []string
	// Seeds of the repetitions; each seed gives every policy the same
	// request stream.
	Seeds []uint64
	// Rates are the offered loads in requests per second; the first is the
	// main comparison. Empty means Base.Workload.Rate alone.
	Rates []float64
	// Parallel is the number of simulations run at once (0: GOMAXPROCS).
	Parallel int
	// KeepRecords keeps every request's record (for CDFs and parquet).
	KeepRecords bool
	// Progress, when set, is called after each finished simulation.
	Progress func(done, total int)
}

// Point is one simulation of a comparison.
type Point struct {
	Policy   string
	Seed     uint64
	Rate     float64
	Replicas int
	Summary  results.Summary
	Records  []results.Record // nil unless Spec.KeepRecords
}

// IsCacheBlind reports whether a policy ignores cache state: the baselines
// round_robin, random, least_request and p2c.
func IsCacheBlind(policy string) bool {
	return slices.Contains([]string{"round_robin", "random", "least_request", "p2c"}, policy)
}

// Validate checks the spec before any simulation starts; every problem is
// reported at once.
func (s *Spec) Validate() error {
	var errs []error
	if len(s.Policies) == 0 {
		errs = append(errs, errors.New("policies: give at least one"))
	}
	seen := map[string]bool{}
	for _, p := range s.Policies {
		if _, err := router.New(p, router.Options{}); err != nil {
			errs = append(errs, fmt.Errorf("policies: %w", err))
		}
		if seen[p] {
			errs = append(errs, fmt.Errorf("policies: %q listed twice", p))
		}
		seen[p] = true
	}
	if len(s.Seeds) == 0 {
		errs = append(errs, errors.New("seeds: give at least one"))
	}
	if s.Base.Source != nil && len(s.Rates) > 1 {
		errs = append(errs, errors.New("rates: a trace replay keeps its own arrival times (use --speedup)"))
	}
	for _, r := range s.Rates {
		if !(r > 0) {
			errs = append(errs, fmt.Errorf("rates: each must be a positive number of requests per second, got %v", r))
		}
	}
	if s.Parallel < 0 {
		errs = append(errs, fmt.Errorf("parallel: must be zero (all cores) or positive, got %d", s.Parallel))
	}
	base := s.Base
	if len(s.Policies) > 0 {
		base.Policy = s.Policies[0]
	}
	if len(s.Rates) > 0 && s.Rates[0] > 0 {
		base.Workload.Rate = s.Rates[0]
	}
	if err := base.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (s *Spec) rates() []float64 {
	if len(s.Rates) == 0 {
		return []float64{s.Base.Workload.Rate}
	}
	return s.Rates
}

// job is one simulation to run.
type job struct {
	policy   string
	seed     uint64
	rate     float64
	replicas int
}

// Run simulates every policy x rate x seed and returns the points ordered by
// policy (in Spec order), then rate, then seed, whatever the parallelism.
func Run(ctx context.Context, s Spec) ([]Point, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	var jobs []job
	for _, p := range s.Policies {
		for _, r := range s.rates() {
			for _, seed := range s.Seeds {
				jobs = append(jobs, job{policy: p, seed: seed, rate: r, replicas: s.Base.Replicas})
			}
		}
	}
	return runJobs(ctx, s.Base, jobs, s.Parallel, s.KeepRecords, s.Progress)
}

// runJobs runs jobs on a worker pool; out[i] belongs to jobs[i].
func runJobs(ctx context.Context, base fleet.Config, jobs []job, parallel int, keep bool, progress func(done, total int)) ([]Point, error) {
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	out := make([]Point, len(jobs))
	errs := make([]error, len(jobs))
	next := make(chan int)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done int
	)
	for range min(parallel, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				j := jobs[i]
				c := base
				c.Policy = j.policy
				c.Seed = j.seed
				c.Workload.Rate = j.rate
				c.Replicas = j.replicas
				c.Progress = nil
				o, err := fleet.Simulate(c)
				if err != nil {
					errs[i] = fmt.Errorf("%s, seed %d, %.3g req/s, %d replicas: %w", j.policy, j.seed, j.rate, j.replicas, err)
				} else {
					// Wall time is the one field that measures the host, not the
					// simulation; comparisons keep their outputs reproducible.
					o.Summary.SimWallS = 0
					out[i] = Point{Policy: j.policy, Seed: j.seed, Rate: j.rate, Replicas: j.replicas, Summary: o.Summary}
					if c.Source != nil {
						out[i].Rate = o.Summary.RateRPS // a replay offers what its trace offers
					}
					if keep {
						out[i].Records = o.Records
					}
				}
				if progress != nil {
					mu.Lock()
					done++
					progress(done, len(jobs))
					mu.Unlock()
				}
			}
		}()
	}
feed:
	for i := range jobs {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("comparison stopped: %w", err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// PolicyList parses a comma-separated list of policies; "all" expands to
// every policy: the cache-blind baselines, ours, then the peers'.
func PolicyList(s string) []string {
	if strings.TrimSpace(s) == "all" {
		order := []string{"round_robin", "random", "least_request", "p2c", "prefix_hash", "kv_aware", "cost_model", "llmd", "dynamo", "sglang", "aibrix", "preble"}
		var all []string
		for _, p := range order {
			if slices.Contains(router.Names(), p) {
				all = append(all, p)
			}
		}
		for _, p := range router.Names() {
			if !slices.Contains(all, p) {
				all = append(all, p)
			}
		}
		return all
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func ms(d interface{ Seconds() float64 }) float64 { return d.Seconds() * 1000 }

// Summaries returns the points' summaries, in order: results.json.
func Summaries(pts []Point) []results.Summary {
	out := make([]results.Summary, len(pts))
	for i, p := range pts {
		out[i] = p.Summary
	}
	return out
}
