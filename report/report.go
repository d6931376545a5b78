package report

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/inferrail/inferrail/router"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/inferrail/inferrail/results"
)

// Run is one simulation in a comparison.
type Run struct {
	// Policy names what the run compares: a routing policy, or a variant's
	// label, policy+admission[+ledger] (e.g. cost_model+kv), when a
	// comparison has several admission rules or ledgers. The report judges a
	// label by its policy, the part before the first "+".
	Policy string
	// Admission is the gateway's admission rule (gateway.Admissions) and
	// Ledger the several gateways' ledger (shared or independent); either
	// falls back on the summary's.
	Admission string
	Ledger    string
	// Pool names the run's prefill/decode split when the comparison
	// compares several (PoolName: P2D6, aggregated), "" otherwise; the
	// report then calls the label policy+...+pool.
	Pool     string
	Seed     uint64
	RateRPS  float64
	Replicas int
	Summary  results.Summary
	// TTFTms is the TTFT in ms of every measured request, for CDFs; it may
	// be nil (e.g. for sweep points).
	TTFTms []float64
}

// Setup describes the experiment that produced the runs.
type Setup struct {
	Title        string // e.g. "W1: shared system prompts"
	Workload     string // e.g. "w1"
	WorkloadYAML string // the full workload configuration as YAML
	// Profile names the engine profile; when empty, the report takes the
	// value of a top-level "name:" key of ProfileYAML, if any.
	Profile        string
	ProfileYAML    string // the engine profile as YAML
	Replicas       int    // fleet size of the main comparison; 0 takes it from the runs
	Seeds          []uint64
	Requests       int // requests per run
	Warmup         time.Duration
	ScrapeInterval time.Duration
	Index          string // "approximate" or "events"
	// Gateways, Overcommit, QueueTimeout and QueueMax describe the
	// gateways in front of the fleet (their number, kv admission's
	// overcommit, the queue's timeout and bound, 0 meaning no queue); the
	// report shows them with the admission section, a zero Gateways or
	// QueueTimeout meaning unknown.
	Gateways     int
	Overcommit   float64
	QueueTimeout time.Duration
	QueueMax     int
	Version      string // e.g. a git describe or "dev"
	Command      string // the command line that produced the report
	// SLO is the objective the runs were scored against; a zero field takes
	// its value from results.DefaultSLO, as results.Summarize does.
	SLO results.SLO
}

// CapacityPoint is one fleet size of a capacity search: medians over seeds.
type CapacityPoint struct {
	Replicas int
	// Prefill and Decode are the split the point ran, in a search over
	// prefill/decode splits (Capacity.Split) its best one; 0 and 0: the
	// aggregated fleet.
	Prefill, Decode int
	TTFTP99Ms       float64
	TPOTP99Ms       float64
	Met             bool
	// Failed is the most requests one seed's run did not complete (the SLO
	// is met only with none); Unsteady counts the seeds whose run looked too
	// short for its answer.
	Failed   int
	Unsteady int
}

// CapacityRow is one policy's capacity search.
type CapacityRow struct {
	Policy   string
	Replicas int             // fewest replicas meeting the SLO; 0 if none up to Capacity.MaxReplicas
	Points   []CapacityPoint // every fleet size evaluated, ascending
	// Prefill and Decode are the best split at Replicas in a search over
	// splits (Capacity.Split); 0 and 0: the aggregated fleet.
	Prefill, Decode int
}

// Capacity is the fewest replicas each policy needs to meet the SLO at one
// offered rate.
type Capacity struct {
	Workload    string
	RateRPS     float64
	MaxReplicas int
	// Split says every fleet size was tried aggregated and under every
	// prefill/decode split (p prefill and n-p decode replicas); the rows
	// and points then name the best split.
	Split bool
	// Baseline is the best cache-blind policy: the fewest replicas among
	// round_robin, random, least_request and p2c present. When empty,
	// BaselinePolicy computes it from Rows.
	Baseline string
	Rows     []CapacityRow // in the caller's policy order
	// Failures says, once for the whole search, why requests did not
	// complete (e.g. results.FailureNote's text); Warnings lists the
	// answers that may be too low because their runs look too short.
	Failures []string
	Warnings []string
}

// Input is everything a report is made from.
type Input struct {
	Setup Setup
	// Runs is the main comparison: one run per policy and seed, all at the
	// same rate and fleet size.
	Runs []Run
	// Sweep is optional: runs per policy, seed and rate, for load sweeps.
	Sweep []Run
	// Capacity is optional.
	Capacity *Capacity
}

// ReportFile is the name of the markdown file Write creates.
const ReportFile = "report.md"

// Write renders report.md and the PNG charts into dir, which must exist. It
// returns the chart file names it wrote, in the order report.md shows them.
func Write(dir string, in Input) ([]string, error) {
	if err := validate(in); err != nil {
		return nil, err
	}
	charts, err := renderCharts(in)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(charts))
	for _, c := range charts {
		if err := os.WriteFile(filepath.Join(dir, c.name), c.png, 0o644); err != nil {
			return nil, fmt.Errorf("report: write chart: %w", err)
		}
		names = append(names, c.name)
	}
	var md bytes.Buffer
	if err := Markdown(&md, in, names); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ReportFile), md.Bytes(), 0o644); err != nil {
		return nil, fmt.Errorf("report: write %s: %w", ReportFile, err)
	}
	return names, nil
}

// validate rejects inputs no report can be made from.
func validate(in Input) error {
	if len(in.Runs) == 0 && in.Capacity == nil {
		return errors.New("report: no runs")
	}
	for i, r := range in.Runs {
		if runPolicy(r) == "" {
			return fmt.Errorf("report: run %d has no policy", i)
		}
	}
	for i, r := range in.Sweep {
		if runPolicy(r) == "" {
			return fmt.Errorf("report: sweep run %d has no policy", i)
		}
	}
	if c := in.Capacity; c != nil {
		for i, row := range c.Rows {
			if row.Policy == "" {
				return fmt.Errorf("report: capacity row %d has no policy", i)
			}
		}
	}
	return nil
}

// runPolicy is the run's policy, falling back on its summary's.
func runPolicy(r Run) string {
	if r.Policy != "" {
		return r.Policy
	}
	return r.Summary.Policy
}

// runAdmission is the run's admission rule, falling back on its summary's.
func runAdmission(r Run) string {
	if r.Admission != "" {
		return r.Admission
	}
	return r.Summary.Admission
}

// runLedger is the run's ledger, falling back on its summary's.
func runLedger(r Run) string {
	if r.Ledger != "" {
		return r.Ledger
	}
	return r.Summary.Ledger
}

// runRate is the run's offered rate, falling back on its summary's.
func runRate(r Run) float64 {
	if r.RateRPS != 0 {
		return r.RateRPS
	}
	return r.Summary.RateRPS
}

// runReplicas is the run's fleet size, falling back on its summary's.
func runReplicas(r Run) int {
	if r.Replicas != 0 {
		return r.Replicas
	}
	return r.Summary.Replicas
}

// policyOrder lists the policies of runs in order of first appearance.
func policyOrder(runs ...[]Run) []string {
	var order []string
	seen := make(map[string]bool)
	for _, rs := range runs {
		for _, r := range rs {
			p := runPolicy(r)
			if !seen[p] {
				seen[p] = true
				order = append(order, p)
			}
		}
	}
	return order
}

// allPolicies lists every policy of the input in report order: Runs, then
// Sweep, then Capacity rows. Chart colors index this list.
func allPolicies(in Input) []string {
	order := policyOrder(in.Runs, in.Sweep)
	if in.Capacity != nil {
		for _, row := range in.Capacity.Rows {
			if !slices.Contains(order, row.Policy) {
				order = append(order, row.Policy)
			}
		}
	}
	return order
}

// basePolicy is the policy of a variant's label, the part before the first
// "+" (the whole name for a plain policy).
func basePolicy(label string) string {
	p, _, _ := strings.Cut(label, "+")
	return p
}

// isCacheBlind reports whether a policy (or a variant's label, by its
// policy) routes without looking at caches.
func isCacheBlind(policy string) bool { return router.CacheBlind(policy) }

// spread is the median, minimum and maximum of a value over seeds.
type spread struct {
	Med, Min, Max float64
}

// spreadOf summarises vals; it does not modify them.
func spreadOf(vals []float64) spread {
	if len(vals) == 0 {
		return spread{}
	}
	s := slices.Clone(vals)
	slices.Sort(s)
	return spread{Med: results.Quantile(s, 0.5), Min: s[0], Max: s[len(s)-1]}
}

// Range is Max-Min.
func (s spread) Range() float64 { return s.Max - s.Min }

// policyAgg is one policy's (or variant's) runs aggregated over seeds.
type policyAgg struct {
	Policy string
	Runs   []Run // sorted by seed
	// Admission and Ledger are those of the first run.
	Admission, Ledger string

	TTFTP50, TTFTP99, TPOTP99 spread
	HitRate, Predicted, Exact spread
	Attainment, Goodput       spread
	Throughput, Preemptions   spread
	Failed                    spread // measured requests that did not complete
	SLOMet                    int    // runs meeting the SLO
}

// aggregate groups runs by policy, in order, and aggregates each over seeds.
func aggregate(runs []Run, order []string) []policyAgg {
	aggs := make([]policyAgg, 0, len(order))
	for _, p := range order {
		var rs []Run
		for _, r := range runs {
			if runPolicy(r) == p {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		aggs = append(aggs, aggregateRuns(p, rs))
	}
	return aggs
}

// aggregateRuns aggregates one policy's runs.
func aggregateRuns(policy string, rs []Run) policyAgg {
	rs = slices.Clone(rs)
	slices.SortStableFunc(rs, func(a, b Run) int { return cmpUint(a.Seed, b.Seed) })
	a := policyAgg{Policy: policy, Runs: rs, Admission: runAdmission(rs[0]), Ledger: runLedger(rs[0])}
	field := func(f func(s *results.Summary) float64) spread {
		vals := make([]float64, len(rs))
		for i := range rs {
			vals[i] = f(&rs[i].Summary)
		}
		return spreadOf(vals)
	}
	a.TTFTP50 = field(func(s *results.Summary) float64 { return s.TTFT.P50 })
	a.TTFTP99 = field(func(s *results.Summary) float64 { return s.TTFT.P99 })
	a.TPOTP99 = field(func(s *results.Summary) float64 { return s.TPOT.P99 })
	a.HitRate = field(func(s *results.Summary) float64 { return s.HitRate })
	a.Predicted = field(func(s *results.Summary) float64 { return s.PredictedHitRate })
	a.Exact = field(func(s *results.Summary) float64 { return s.Prediction.Exact })
	a.Attainment = field(func(s *results.Summary) float64 { return s.SLOAttainment })
	a.Goodput = field(func(s *results.Summary) float64 { return s.GoodputRPS })
	a.Throughput = field(func(s *results.Summary) float64 { return s.ThroughputRPS })
	a.Preemptions = field(func(s *results.Summary) float64 { return float64(s.Preemptions) })
	a.Failed = field(func(s *results.Summary) float64 { return float64(s.Failed) })
	for i := range rs {
		if rs[i].Summary.SLOMet {
			a.SLOMet++
		}
	}
	return a
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sweepCell is one policy at one rate of a sweep, over seeds.
type sweepCell struct {
	N       int
	TTFTP99 spread
	Goodput spread
}

// sweepTable is a sweep aggregated over seeds.
type sweepTable struct {
	Policies []string
	Rates    []float64      // ascending
	Cells    [][]*sweepCell // [policy][rate]; nil where the sweep has no run
}

// aggregateSweep aggregates runs per policy and rate.
func aggregateSweep(runs []Run, policies []string) sweepTable {
	var rates []float64
	for _, r := range runs {
		rates = append(rates, runRate(r))
	}
	slices.Sort(rates)
	rates = slices.Compact(rates)

	var t sweepTable
	t.Rates = rates
	for _, p := range policies {
		row := make([]*sweepCell, len(rates))
		found := false
		for j, rate := range rates {
			var ttft, good []float64
			for _, r := range runs {
				if runPolicy(r) == p && runRate(r) == rate {
					ttft = append(ttft, r.Summary.TTFT.P99)
					good = append(good, r.Summary.GoodputRPS)
				}
			}
			if len(ttft) == 0 {
				continue
			}
			found = true
			row[j] = &sweepCell{N: len(ttft), TTFTP99: spreadOf(ttft), Goodput: spreadOf(good)}
		}
		if found {
			t.Policies = append(t.Policies, p)
			t.Cells = append(t.Cells, row)
		}
	}
	return t
}

// sloOf fills the zero fields of s from results.DefaultSLO.
func sloOf(s results.SLO) results.SLO {
	def := results.DefaultSLO()
	if s.TTFTP99 <= 0 {
		s.TTFTP99 = def.TTFTP99
	}
	if s.TPOTP99 <= 0 {
		s.TPOTP99 = def.TPOTP99
	}
	return s
}

// durationMs converts a duration to float milliseconds.
func durationMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// replicaRun picks the run of each policy shown per replica: the first seed
// of Setup.Seeds (else the smallest seed of the runs) that every policy ran,
// so every policy is shown on the same request trace; a policy without it
// falls back on its smallest seed. It returns the runs, in aggs' order, and
// the common seed (ok false when no seed is common to all).
func replicaRun(in Input, aggs []policyAgg) ([]Run, uint64, bool) {
	has := func(a policyAgg, seed uint64) bool {
		for _, r := range a.Runs {
			if r.Seed == seed {
				return true
			}
		}
		return false
	}
	candidates := slices.Clone(in.Setup.Seeds)
	var seeds []uint64
	for _, a := range aggs {
		for _, r := range a.Runs {
			seeds = append(seeds, r.Seed)
		}
	}
	slices.Sort(seeds)
	candidates = append(candidates, slices.Compact(seeds)...)
	var seed uint64
	common := false
	for _, s := range candidates {
		all := true
		for _, a := range aggs {
			if !has(a, s) {
				all = false
				break
			}
		}
		if all {
			seed, common = s, true
			break
		}
	}
	out := make([]Run, len(aggs))
	for i, a := range aggs {
		out[i] = a.Runs[0]
		if common {
			for _, r := range a.Runs {
				if r.Seed == seed {
					out[i] = r
					break
				}
			}
		}
	}
	return out, seed, common
}
