package compare

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/workload"
)

// Defaults of comparisons and capacity searches (the compare and capacity
// commands).
const (
	// DefaultRequests is the length of every run when neither a request
	// count nor a duration is given.
	DefaultRequests = 5000
	// DefaultMaxWarmup bounds DefaultWarmup.
	DefaultMaxWarmup = 2 * time.Minute
	// CapacityRateReplicas is the fleet whose default rate
	// (fleet.Config.DefaultRate) a capacity search offers when no rate is
	// given.
	CapacityRateReplicas = 8
)

// MaxRates bounds Spec.Rates: each rate is one simulation of every variant
// and seed.
const MaxRates = 100

// DefaultWarmup is the warmup of a run of requests (0: unbounded) at rate
// over at most duration (0: unbounded) when none is given: the first tenth
// of the run, at most DefaultMaxWarmup, rounded to the second.
func DefaultWarmup(requests int, duration time.Duration, rate float64) time.Duration {
	length := duration
	if requests > 0 && rate > 0 {
		if d := time.Duration(float64(requests) / rate * float64(time.Second)); length == 0 || d < length {
			length = d
		}
	}
	return min(DefaultMaxWarmup, length/10).Round(time.Second)
}

// Spec describes a comparison: one workload and fleet under several
// policies, admission rules, ledgers, seeds and offered loads.
type Spec struct {
	// Base is the run every point starts from (workload, fleet, engine, SLO,
	// warmup, index, gateways); its Policy, Admission, Ledger, Seed and
	// workload rate are replaced.
	Base fleet.Config
	// Policies to compare, in report order.
	Policies []string
	// Admissions are the gateway admission rules to compare under every
	// policy, in report order. Empty means Base.Admission alone.
	Admissions []gateway.Admission
	// Ledgers are the reservation ledgers of several gateways to compare
	// (fleet.LedgerShared, fleet.LedgerIndependent), in report order; more
	// than one needs Base.Gateways > 1. Empty means Base.Ledger alone.
	Ledgers []string
	// Limits are the tenant rate limit switches to compare under every
	// policy (fleet.LimitsOn, fleet.LimitsOff: the workload's tenants:
	// limits applied or not), in report order; more than one needs a
	// workload whose tenants have limits. Empty means Base's alone
	// (Base.NoLimits).
	Limits []string
	// Pools are the prefill/decode splits of Base.Replicas to compare under
	// every policy (disaggregated P/D: fleet.Config.PrefillReplicas and
	// DecodeReplicas; the zero Pool is the aggregated fleet), in report
	// order. Empty means Base's pools alone.
	Pools []Pool
	// Isolate, when set, names a tenant of the workload's mix: every
	// variant also runs without it (workload.Config.WithoutTenants), on the
	// same seeds, so that the other tenants' requests are the same in both
	// runs, and the report's isolation section sets each other tenant's
	// TTFT p99 with it against without it (see Isolation).
	Isolate string
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
	Policy    string
	Admission gateway.Admission
	Ledger    string
	// Limits and Without are the variant's (Variant.Limits, Variant.Without).
	Limits  string
	Without string
	// Pool is the variant's P/D split (Variant.Pool).
	Pool Pool
	// Label names the point's variant (Variant.Label): what the report
	// calls it.
	Label    string
	Seed     uint64
	Rate     float64
	Replicas int
	Summary  results.Summary
	Records  []results.Record // nil unless Spec.KeepRecords
}

// Variant is one compared configuration: a policy under one admission rule,
// one ledger, one tenant limits switch and one P/D pool, with the whole
// workload or without the isolated tenant.
type Variant struct {
	Policy    string
	Admission gateway.Admission
	Ledger    string
	// Limits is fleet.LimitsOn or fleet.LimitsOff: whether the workload's
	// tenant limits apply.
	Limits string
	// Pool is the fleet's prefill/decode split (the zero Pool: aggregated).
	Pool Pool
	// Without is the tenant left out of the run (Spec.Isolate), "" for the
	// whole workload.
	Without string
	// Label names the variant in reports and outputs: the policy alone when
	// the comparison has one admission rule and one ledger (as comparisons
	// of policies always had), else policy+admission, e.g. cost_model+kv,
	// and +ledger when it compares several ledgers, e.g.
	// cost_model+kv+independent; then +limits-on or +limits-off when it
	// compares tenant limits, the pool (Pool.String) when it compares
	// several pools, e.g. cost_model+P2D6 or cost_model+aggregated, and
	// +without-TENANT for the run without the isolated tenant, e.g.
	// cost_model+limits-off+without-noisy.
	Label string
}

// variants lists policy x admission x ledger x limits x pool x (with,
// without the isolated tenant), in that nesting order.
func variants(policies []string, admissions []gateway.Admission, ledgers []string, limits []string, pools []Pool, isolate string) []Variant {
	withouts := []string{""}
	if isolate != "" {
		withouts = append(withouts, isolate)
	}
	var out []Variant
	for _, p := range policies {
		for _, a := range admissions {
			for _, l := range ledgers {
				for _, lim := range limits {
					for _, pool := range pools {
						for _, wo := range withouts {
							label := p
							if len(admissions) > 1 || len(ledgers) > 1 {
								label += "+" + string(a)
							}
							if len(ledgers) > 1 {
								label += "+" + l
							}
							if len(limits) > 1 {
								label += "+limits-" + lim
							}
							if len(pools) > 1 {
								label += "+" + pool.String()
							}
							if wo != "" {
								label += "+without-" + wo
							}
							out = append(out, Variant{Policy: p, Admission: a, Ledger: l, Limits: lim, Pool: pool, Without: wo, Label: label})
						}
					}
				}
			}
		}
	}
	return out
}

// Variants lists the compared configurations in report order: by policy,
// then admission rule, ledger, tenant limits and pool, each with the whole
// workload first and then without the isolated tenant.
func (s *Spec) Variants() []Variant {
	return variants(s.Policies, s.admissions(), s.ledgers(), s.limits(), s.pools(), s.Isolate)
}

func (s *Spec) limits() []string {
	if len(s.Limits) == 0 {
		return []string{limitsOf(s.Base)}
	}
	return s.Limits
}

// limitsOf is a config's tenant limits switch.
func limitsOf(c fleet.Config) string {
	if c.NoLimits {
		return fleet.LimitsOff
	}
	return fleet.LimitsOn
}

// configure sets a variant on a copy of the base config.
func (v *Variant) configure(c *fleet.Config) {
	c.Policy = v.Policy
	c.Admission = v.Admission
	c.Ledger = v.Ledger
	c.NoLimits = v.Limits == fleet.LimitsOff
	c.PrefillReplicas, c.DecodeReplicas = v.Pool.Prefill, v.Pool.Decode
	if v.Without != "" {
		c.Workload.WithoutTenants = append(slices.Clone(c.Workload.WithoutTenants), v.Without)
	}
}

func (s *Spec) admissions() []gateway.Admission {
	if len(s.Admissions) == 0 {
		return []gateway.Admission{s.Base.Admission}
	}
	return s.Admissions
}

func (s *Spec) ledgers() []string {
	if len(s.Ledgers) == 0 {
		return []string{s.Base.Ledger}
	}
	return s.Ledgers
}

// IsCacheBlind reports whether a policy ignores cache state: the baselines
// round_robin, random, least_request and p2c. A variant's label is judged by
// its policy, the part before the first "+".
func IsCacheBlind(policy string) bool { return router.CacheBlind(policy) }

// Validate checks the spec before any simulation starts; every problem is
// reported at once.
func (s *Spec) Validate() error {
	var errs []error
	if len(s.Policies) == 0 {
		errs = append(errs, errors.New("policies: give at least one"))
	}
	seen := map[string]bool{}
	for _, p := range s.Policies {
		if _, err := router.NewPolicy(p, router.Options{}); err != nil {
			errs = append(errs, fmt.Errorf("policies: %w", err))
		}
		if seen[p] {
			errs = append(errs, fmt.Errorf("policies: %q listed twice", p))
		}
		seen[p] = true
	}
	seenA := map[gateway.Admission]bool{}
	for _, a := range s.Admissions {
		if _, err := gateway.ParseAdmission(string(a)); err != nil {
			errs = append(errs, fmt.Errorf("admissions: %w", err))
		} else if seenA[a] {
			errs = append(errs, fmt.Errorf("admissions: %q listed twice", a))
		}
		seenA[a] = true
	}
	seenL := map[string]bool{}
	for _, l := range s.Ledgers {
		if l != fleet.LedgerShared && l != fleet.LedgerIndependent {
			errs = append(errs, fmt.Errorf("ledgers: each must be %s or %s, got %q", fleet.LedgerShared, fleet.LedgerIndependent, l))
		} else if seenL[l] {
			errs = append(errs, fmt.Errorf("ledgers: %q listed twice", l))
		}
		seenL[l] = true
	}
	if len(s.Ledgers) > 1 && s.Base.Gateways < 2 {
		errs = append(errs, fmt.Errorf("ledgers: comparing ledgers needs several gateways (--gateways), got %d", s.Base.Gateways))
	}
	seenLim := map[string]bool{}
	for _, l := range s.Limits {
		if l != fleet.LimitsOn && l != fleet.LimitsOff {
			errs = append(errs, fmt.Errorf("limits: each must be %s or %s, got %q", fleet.LimitsOn, fleet.LimitsOff, l))
		} else if seenLim[l] {
			errs = append(errs, fmt.Errorf("limits: %q listed twice", l))
		}
		seenLim[l] = true
	}
	validPools, poolErrs := s.validatePools()
	errs = append(errs, poolErrs...)
	switch {
	case len(s.Pools) == 0:
		validPools = s.pools() // Base's, which Base.Validate checks
	case len(validPools) == 0:
		validPools = []Pool{{}} // the rest of the base is checked all the same
	}
	limited := s.Base.Source == nil && s.Base.Workload.Tenants.Limited()
	if len(s.Limits) > 1 && !limited {
		errs = append(errs, errors.New("limits: comparing tenant limits needs a synthetic workload whose tenants have limits (the workload's tenants:)"))
	}
	isolate := s.Isolate != ""
	if isolate {
		isolate = false
		switch {
		case s.Base.Source != nil:
			errs = append(errs, errors.New("isolate: needs a synthetic workload with a tenant mix, not a trace replay"))
		case !slices.ContainsFunc(s.Base.Workload.Mix, func(m workload.MixClass) bool { return m.Tenant == s.Isolate }):
			errs = append(errs, fmt.Errorf("isolate: no class of the workload's mix has tenant %q", s.Isolate))
		case slices.Contains(s.Base.Workload.WithoutTenants, s.Isolate):
			errs = append(errs, fmt.Errorf("isolate: tenant %q is already left out (without_tenants)", s.Isolate))
		default:
			isolate = true
		}
	}
	if len(s.Seeds) == 0 {
		errs = append(errs, errors.New("seeds: give at least one"))
	}
	if s.Base.Source != nil && len(s.Rates) > 1 {
		errs = append(errs, errors.New("rates: a trace replay keeps its own arrival times (use --speedup)"))
	}
	if len(s.Rates) > MaxRates {
		errs = append(errs, fmt.Errorf("rates: at most %d rates, got %d (each is one simulation of every policy and seed)", MaxRates, len(s.Rates)))
	}
	for _, r := range s.Rates {
		if !(r > 0 && r <= workload.MaxRate) {
			errs = append(errs, fmt.Errorf("rates: each must be a positive number of requests per second, at most %d, got %v", workload.MaxRate, r))
		} else if s.Base.Source == nil {
			if err := workload.CheckLength(s.Base.Workload.Requests, s.Base.Workload.Duration, r); err != nil {
				errs = append(errs, fmt.Errorf("rates: %g req/s: %w", r, err))
			}
		}
	}
	if s.Parallel < 0 {
		errs = append(errs, fmt.Errorf("parallel: must be zero (all cores) or positive, got %d", s.Parallel))
	}
	base := s.Base
	// The base is checked under a policy of the list that exists: an
	// unknown one is reported above, once.
	for _, p := range s.Policies {
		if _, err := router.NewPolicy(p, router.Options{}); err == nil {
			base.Policy = p
			break
		}
	}
	if _, err := router.NewPolicy(base.Policy, router.Options{}); err != nil && len(s.Policies) > 0 {
		base.Policy = fleet.DefaultConfig().Policy
	}
	if len(s.Rates) > 0 && s.Rates[0] > 0 {
		base.Workload.Rate = s.Rates[0]
	}
	// The base under every admission rule, ledger and pool compared (those
	// known and valid: the others are reported above), each problem once.
	seenErr := map[string]bool{}
	for _, a := range s.admissions() {
		if _, err := gateway.ParseAdmission(string(a)); err != nil && len(s.Admissions) > 0 {
			continue
		}
		for _, l := range s.ledgers() {
			if len(s.Ledgers) > 0 && l != fleet.LedgerShared && l != fleet.LedgerIndependent {
				continue
			}
			for _, pool := range validPools {
				v := Variant{Policy: base.Policy, Admission: a, Ledger: l, Limits: limitsOf(base), Pool: pool}
				c := base
				v.configure(&c)
				cs := []fleet.Config{c}
				if isolate {
					// The run without the isolated tenant must be valid too
					// (it must leave a class of the mix).
					v.Without = s.Isolate
					cw := base
					v.configure(&cw)
					cs = append(cs, cw)
				}
				for _, c := range cs {
					err := c.Validate()
					if err == nil {
						continue
					}
					for _, e := range unjoin(err) {
						if !seenErr[e.Error()] {
							seenErr[e.Error()] = true
							errs = append(errs, e)
						}
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// unjoin splits an errors.Join into its errors.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func (s *Spec) rates() []float64 {
	if len(s.Rates) == 0 {
		return []float64{s.Base.Workload.Rate}
	}
	return s.Rates
}

// job is one simulation to run.
type job struct {
	Variant
	seed     uint64
	rate     float64
	replicas int
}

// Run simulates every variant (policy x admission x ledger x limits x pool
// x isolation) x rate x seed and returns
// the points ordered by variant (Variants), then rate, then seed, whatever
// the parallelism.
func Run(ctx context.Context, s Spec) ([]Point, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return runJobs(ctx, s.Base, s.jobs(), s.Parallel, s.KeepRecords, s.Progress)
}

// jobs lists the simulations of a comparison in Run's order: by variant,
// then rate, then seed.
func (s *Spec) jobs() []job {
	var jobs []job
	for _, v := range s.Variants() {
		for _, r := range s.rates() {
			for _, seed := range s.Seeds {
				jobs = append(jobs, job{Variant: v, seed: seed, rate: r, replicas: s.Base.Replicas})
			}
		}
	}
	return jobs
}

// runJobs runs jobs on a worker pool; out[i] belongs to jobs[i].
func runJobs(ctx context.Context, base fleet.Config, jobs []job, parallel int, keep bool, progress func(done, total int)) ([]Point, error) {
	out := make([]Point, len(jobs))
	err := eachJob(ctx, len(jobs), parallel, progress, func(i int) error {
		p, err := jobs[i].simulate(jobs[i].config(base), keep)
		out[i] = p
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// config is the fleet configuration a job simulates: base under the job's
// variant, seed, rate and fleet size, without a progress hook.
func (j *job) config(base fleet.Config) fleet.Config {
	c := base
	j.configure(&c)
	c.Seed = j.seed
	c.Workload.Rate = j.rate
	c.Replicas = j.replicas
	c.Progress = nil
	return c
}

// fleet names the job's fleet in messages: "6 replicas", and its pools
// when it has some, "6 replicas (2 prefill + 4 decode)".
func (j *job) fleet() string {
	s := fmt.Sprintf("%d replicas", j.replicas)
	if !j.Pool.Aggregated() {
		_, pools, _ := strings.Cut(j.Pool.Fleet(j.replicas, false), " ")
		s += " " + pools
	}
	return s
}

// simulate runs the job's configuration c (j.config) and returns its point,
// with every request's record when keep is set.
func (j *job) simulate(c fleet.Config, keep bool) (Point, error) {
	c.KeepRecords = keep // a point holds its records only when asked to
	o, err := fleet.Simulate(c)
	if err != nil {
		return Point{}, fmt.Errorf("%s, seed %d, %.3g req/s, %s: %w", j.Label, j.seed, j.rate, j.fleet(), err)
	}
	// Wall time is the one field that measures the host, not the
	// simulation; comparisons keep their outputs reproducible.
	o.Summary.SimWallS = 0
	p := Point{Policy: j.Policy, Admission: j.Admission, Ledger: j.Ledger, Limits: j.Limits, Without: j.Without, Pool: j.Pool, Label: j.Label,
		Seed: j.seed, Rate: j.rate, Replicas: j.replicas, Summary: o.Summary}
	if c.Source != nil {
		p.Rate = o.Summary.RateRPS // a replay offers what its trace offers
	}
	if keep {
		p.Records = o.Records
	}
	return p, nil
}

// eachJob calls do(i) for every i in [0, n) on parallel workers (0:
// GOMAXPROCS), and progress after each call. Once ctx is done it hands out
// no more jobs, lets the running ones finish and returns ctx's error. Else
// the first failure in job order says what went wrong; the others (often
// the same error on every seed and variant) are only counted.
func eachJob(ctx context.Context, n, parallel int, progress func(done, total int), do func(i int) error) error {
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	errs := make([]error, n)
	next := make(chan int)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done int
	)
	for range min(parallel, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				errs[i] = do(i)
				if progress != nil {
					mu.Lock()
					done++
					progress(done, n)
					mu.Unlock()
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("comparison stopped: %w", err)
	}
	var first error
	failed := 0
	for _, err := range errs {
		if err != nil {
			if first == nil {
				first = err
			}
			failed++
		}
	}
	switch {
	case failed > 1:
		return fmt.Errorf("%w (and %d more of %d simulations failed)", first, failed-1, n)
	case failed == 1:
		return first
	}
	return nil
}

// SteadyWarnings lists the runs that look too short for their answer
// (results.SteadyState), one line per variant, rate and fleet size with any:
// how many of its seeds warned, and the first one's warning; nil when every
// run looks steady.
func SteadyWarnings(pts []Point) []string {
	type key struct {
		label    string
		rate     float64
		replicas int
	}
	var order []key
	seeds := map[key]int{}
	unsteady := map[key][]Point{}
	for _, p := range pts {
		k := key{p.name(), p.Rate, p.Replicas}
		if _, ok := seeds[k]; !ok {
			order = append(order, k)
		}
		seeds[k]++
		if p.Summary.Steady.Warning != "" {
			unsteady[k] = append(unsteady[k], p)
		}
	}
	var out []string
	for _, k := range order {
		u := unsteady[k]
		if len(u) == 0 {
			continue
		}
		out = append(out, fmt.Sprintf("%s at %.3g req/s on %d replicas, %d of %d seeds (seed %d): %s",
			k.label, k.rate, k.replicas, len(u), seeds[k], u[0].Seed, u[0].Summary.Steady.Warning))
	}
	return out
}

// PolicyList parses a comma-separated list of policies; "all" expands to
// every policy: the cache-blind baselines, ours, then the peers'.
func PolicyList(s string) []string {
	if strings.TrimSpace(s) == "all" {
		return router.Ordered()
	}
	return splitList(s)
}

// AdmissionList parses a comma-separated list of admission rules; "all"
// expands to every rule of gateway.Admissions. Unknown names are kept for
// Spec.Validate to report.
func AdmissionList(s string) []gateway.Admission {
	names := splitList(s)
	if len(names) == 1 && names[0] == "all" {
		names = gateway.Admissions()
	}
	out := make([]gateway.Admission, len(names))
	for i, n := range names {
		out[i] = gateway.Admission(n)
	}
	return out
}

// LedgerList parses a comma-separated list of ledgers; "all" expands to
// shared and independent.
func LedgerList(s string) []string {
	names := splitList(s)
	if len(names) == 1 && names[0] == "all" {
		return []string{fleet.LedgerShared, fleet.LedgerIndependent}
	}
	return names
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(s string) []string {
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
