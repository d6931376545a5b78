package main

import (
	"fmt"
	"io"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/inferrail/inferrail/compare"
	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
)

// compareFlags are the flags of compare and capacity on top of the shared ones.
type compareFlags struct {
	simFlags
	policies    string
	seeds       int
	firstSeed   uint64
	rates       string
	parallel    int
	title       string
	maxReplicas int
	admissions  string
	ledgers     string
	isolate     string
	pools       string
	pdSplit     bool
}

// Bounds of compare and capacity: each seed and each rate is a simulation
// of every variant, and each parallel simulation holds its requests in memory.
const (
	maxSeeds    = 1000
	maxParallel = 1024
)

// registerCompare adds the flags of compare and capacity; out describes
// what --out receives.
func (f *compareFlags) registerCompare(cmd *cobra.Command, out string) {
	fl := cmd.Flags()
	fl.StringVar(&f.policies, "policies", "all", "comma-separated policies, or all: "+strings.Join(router.Names(), ", "))
	fl.IntVar(&f.seeds, "seeds", 3, "repetitions, each with its own request stream shared by every policy")
	fl.Uint64Var(&f.firstSeed, "first-seed", 1, "seed of the first repetition; the others follow it")
	fl.IntVar(&f.parallel, "parallel", 0, "simulations run at once (default: all cores); results do not depend on it")
	fl.StringVar(&f.out, "out", "", "directory for "+out)
	fl.StringVar(&f.title, "title", "", "report title (default: the workload's name)")
	fl.StringVar(&f.admissions, "admissions", "", "admission rules to compare under every policy, comma-separated, or all: "+strings.Join(gateway.Admissions(), ", ")+" (replaces --admission)")
	fl.StringVar(&f.ledgers, "ledgers", "", "with several --gateways: ledgers to compare, comma-separated: shared, independent (replaces --ledger)")
}

// registerPools adds --pools (compare and compare plan).
func (f *compareFlags) registerPools(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.pools, "pools", "", "prefill/decode splits of --replicas to compare under every policy, comma-separated, e.g. 0/0,2/6,4/4 (0/0: aggregated; replaces --prefill-replicas and --decode-replicas)")
}

// spec builds and checks a comparison before anything runs.
func (f *compareFlags) spec(cmd *cobra.Command) (compare.Spec, error) {
	cfg, err := f.config(cmd)
	if err != nil {
		return compare.Spec{}, err
	}
	fl := cmd.Flags()
	if !fl.Changed("requests") && !fl.Changed("duration") && f.workloadFile == "" {
		cfg.Workload.Requests = compare.DefaultRequests
	}
	if !fl.Changed("warmup") && f.trace == "" {
		cfg.Warmup = compare.DefaultWarmup(cfg.Workload.Requests, cfg.Workload.Duration, cfg.Workload.Rate)
	}
	if f.seeds < 1 || f.seeds > maxSeeds {
		return compare.Spec{}, usagef("--seeds: must be between 1 and %d, got %d (each seed is one simulation of every policy at every rate)", maxSeeds, f.seeds)
	}
	if f.firstSeed > math.MaxUint64-uint64(f.seeds-1) {
		return compare.Spec{}, usagef("--first-seed: %d + --seeds %d overflows a 64-bit seed; lower --first-seed", f.firstSeed, f.seeds)
	}
	if f.parallel < 0 || f.parallel > maxParallel {
		return compare.Spec{}, usagef("--parallel: must be between 0 (all cores) and %d, got %d (each running simulation holds its requests in memory)", maxParallel, f.parallel)
	}
	s := compare.Spec{Base: cfg, Policies: compare.PolicyList(f.policies), Parallel: f.parallel, KeepRecords: true, Isolate: f.isolate}
	if f.gw.limitsList {
		lims, err := f.gw.limitSwitches()
		if err != nil {
			return compare.Spec{}, err
		}
		if len(lims) > 1 {
			s.Limits = lims
		}
	}
	if fl.Changed("isolate") && f.isolate == "" {
		return compare.Spec{}, usagef("--isolate: name a tenant of the workload's mix")
	}
	if fl.Changed("admissions") {
		if fl.Changed("admission") {
			return compare.Spec{}, usagef("--admissions replaces --admission: give one of them")
		}
		if s.Admissions = compare.AdmissionList(f.admissions); len(s.Admissions) == 0 {
			return compare.Spec{}, usagef("--admissions: give at least one admission rule (%s) or all", strings.Join(gateway.Admissions(), ", "))
		}
	}
	if fl.Changed("ledgers") {
		if fl.Changed("ledger") {
			return compare.Spec{}, usagef("--ledgers replaces --ledger: give one of them")
		}
		if s.Ledgers = compare.LedgerList(f.ledgers); len(s.Ledgers) == 0 {
			return compare.Spec{}, usagef("--ledgers: give at least one of %s, %s", fleet.LedgerShared, fleet.LedgerIndependent)
		}
	}
	if fl.Lookup("pools") != nil && fl.Changed("pools") {
		if fl.Changed("prefill-replicas") || fl.Changed("decode-replicas") {
			return compare.Spec{}, usagef("--pools replaces --prefill-replicas and --decode-replicas: give --pools, or those two for one pool")
		}
		pools, err := compare.ParsePools(f.pools)
		if err != nil {
			return compare.Spec{}, usagef("--%w", err)
		}
		s.Pools = pools
	}
	for i := range f.seeds {
		s.Seeds = append(s.Seeds, f.firstSeed+uint64(i))
	}
	if f.rates != "" {
		for _, r := range strings.Split(f.rates, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(r), 64)
			if err != nil {
				return compare.Spec{}, usagef("--rates: want requests per second separated by commas, got %q", r)
			}
			s.Rates = append(s.Rates, v)
		}
	}
	if err := s.Validate(); err != nil {
		return compare.Spec{}, flagErrors(err)
	}
	return s, nil
}

func newCompareCmd(stdout, stderr io.Writer) *cobra.Command {
	var f compareFlags
	cmd := &cobra.Command{
		Use:   "compare",
		Short: "Run several routing policies on the same requests and seeds, and write a report",
		Long: `compare gives every policy the same request stream and arrival times (one per
seed), each on a cold fleet, runs the simulations in parallel, and writes to --out:
results.json (one summary per policy x rate x seed), requests.parquet (every
request, with policy, seed, rate and fleet-size columns), report.md and PNG charts.
--rates sweeps offered load. Runs default to 5,000 requests with the first tenth
(at most 2 minutes) left out. The printed table and the report have a failed
column (requests that did not complete), with the reasons given once below it,
and name the runs that look too short for their answer (see sim --help).

--admissions compares gateway admission rules under every policy (all: every
rule) and, with several --gateways, --ledgers compares a shared reservation
ledger with independent ones. Each policy x admission x ledger is then a variant
labelled policy+admission (+ledger with several ledgers), e.g. cost_model+kv or
cost_model+kv+independent, in the report, the printed table and the parquet
policy column (results.json gives each summary's admission and ledger); the
report adds an "Admission and queueing" section (rejections by reason,
preemptions, peak KV reservations, queue waits, goodput).

With a tenant mix the report has a per-tenant table. --limits on,off runs every
variant with the workload's tenant limits and without them (+limits-on,
+limits-off); --isolate TENANT also runs every variant without that tenant
(+without-TENANT, the other tenants' requests unchanged) and adds an isolation
table: each other tenant's TTFT p99 with it against without it, seed by seed
(goal: within 10% with limits on).

--pools compares disaggregated prefill/decode splits of --replicas under every
policy: 0/0,2/6,4/4 runs the aggregated fleet, 2 prefill + 6 decode replicas and
4 + 4 (a split leaving replicas over has them serve both), labelled
policy+aggregated, policy+P2D6, policy+P4D4. --prefill-replicas and
--decode-replicas set one split instead. When a run has prefill replicas the
report adds a P/D table (remote prefill share, fallbacks, KV transfer times and
volume, each pool's busy share), and when the engines have lower KV tiers
(--kv-cpu-blocks, --kv-disk-blocks) a KV tiers table (hit rate per tier, load
time).`,
		Example: `  inferrail compare --workload w1 --policies round_robin,least_request,cost_model --seeds 3 --out runs/w1
  inferrail compare --workload w6 --policies all --rates 6,8,10,12 --out runs/w6-sweep
  inferrail compare --workload w7 --policies cost_model --admissions all --seeds 3 --out runs/w7-overload
  inferrail compare --workload w7 --policies cost_model --admission kv --gateways 3 --ledgers shared,independent --out runs/w7-gateways
  inferrail compare --workload-file examples/tenants-noisy.yaml --policies round_robin,cost_model --isolate noisy --limits on,off --seeds 5 --out runs/isolation
  inferrail compare --workload w4 --policies cost_model --replicas 8 --pools 0/0,2/6,4/4 --seeds 3 --out runs/w4-pd`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := f.spec(cmd)
			if err != nil {
				return err
			}
			if f.out == "" {
				return usagef("--out: give a directory for the results")
			}
			if err := compare.CheckWritable(f.out); err != nil {
				return usagef("--out: %w", err)
			}
			bar := newCountBar(stderr, "simulating")
			s.Progress = bar.update
			start := time.Now()
			pts, err := compare.Run(cmd.Context(), s)
			bar.finish()
			if err != nil {
				if bad := f.badTrace(err); bad != nil {
					return bad
				}
				return err
			}
			title := f.title
			if title == "" {
				title = "Routing policies on " + s.Base.Workload.Workload
			}
			files, err := compare.Write(f.out, s, pts, nil, compare.Meta{Title: title, Version: version(), Command: commandLine(cmd)})
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "%d simulations in %s\n", len(pts), time.Since(start).Round(100*time.Millisecond))
			return printComparison(stdout, f.out, s, pts, files)
		},
	}
	f.requestsHelp = strconv.Itoa(compare.DefaultRequests)
	f.register(cmd, "every summary")
	f.gw.limitsList = true
	f.gw.register(cmd)
	f.registerCompare(cmd, "results.json, requests.parquet, report.md and the charts")
	cmd.Flags().StringVar(&f.rates, "rates", "", "offered loads to sweep, in requests per second, comma-separated (the first is the main comparison)")
	cmd.Flags().StringVar(&f.isolate, "isolate", "", "a tenant of the workload's mix: also run every variant without it, and report the other tenants' TTFT p99 with it against without it")
	f.registerPools(cmd)
	addSweepCommands(cmd, stdout, stderr)
	return cmd
}

func printComparison(w io.Writer, dir string, s compare.Spec, pts []compare.Point, files []string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\trate\tseed\tttft p50 ms\tttft p99 ms\thit\tslo\tgoodput/s\tfailed")
	for _, p := range pts {
		m := p.Summary
		fmt.Fprintf(tw, "%s\t%.2f\t%d\t%.0f\t%.0f\t%.3f\t%.3f\t%.2f\t%d\n", p.Label, p.Rate, p.Seed, m.TTFT.P50, m.TTFT.P99, m.HitRate, m.SLOAttainment, m.GoodputRPS, m.Failed)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	sums := compare.Summaries(pts)
	if notes := results.FailureNotes(sums); len(notes) > 0 {
		fmt.Fprintln(w, "failed requests by reason:")
		for _, n := range notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
	for _, warn := range compare.SteadyWarnings(pts) {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	if rows := compare.Isolation(s, pts); len(rows) > 0 {
		fmt.Fprintf(w, "other tenants' TTFT p99 with %s against without it (medians over seeds; goal: within %.0f%% with limits on):\n", s.Isolate, 100*compare.IsolationGoal)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "variant\ttenant\tp99 with ms\tp99 without ms\tchange\tmin..max")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%+.1f%%\t%+.1f%%..%+.1f%%\n", r.Label, r.Tenant, r.With, r.Without, 100*r.Change, 100*r.ChangeMin, 100*r.ChangeMax)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "wrote %s in %s\n", strings.Join(files, ", "), dir)
	return nil
}

func newCapacityCmd(stdout, stderr io.Writer) *cobra.Command {
	var f compareFlags
	cmd := &cobra.Command{
		Use:   "capacity",
		Short: "Find how many replicas each policy needs to serve a load within the SLO",
		Long: `capacity searches, for each policy, the fewest replicas (1 to --max-replicas)
whose TTFT p99 and TPOT p99 (medians over the seeds) meet the SLO at --rate, with
every request completed, and reports the GPUs each policy saves against the best
cache-blind baseline (round_robin, random, least_request, p2c). Without --rate the
load is the workload's default rate for 8 replicas of --profile (as sim's for
--replicas 8: about 70% of what round robin sustains on them). Runs default to
5,000 requests with the first tenth (at most 2 minutes) left out.

A requirement that can never be met (requests longer than max_model_len) is
named with its count; an answer whose runs look too short (the TTFT p99 of the
second half of the measured window well above the first half's, a growing
backlog, or a closed loop such as w2's chats arriving well below --rate) comes
with a warning: rerun with more --requests.

--admissions and --ledgers search every policy x admission x ledger, labelled
policy+admission (+ledger), as in compare; a rejected request counts as not
completed, so a rule that rejects never meets the SLO.

--pd-split searches the disaggregated prefill/decode split too: every fleet size
n is tried aggregated and as p prefill + n-p decode replicas for p from 1 to n-1
(--pd-decider and the other --pd flags apply); n meets the SLO when any split
does, and the answer names the best split, e.g. 6 (2 prefill + 4 decode): of the
splits meeting the SLO the lowest TTFT p99, ties to fewer prefill replicas.`,
		Example: `  inferrail capacity --workload w1 --policies round_robin,least_request,cost_model --slo ttft_p99=2s,tpot_p99=100ms
  inferrail capacity --workload w2 --rate 14 --max-replicas 16 --out runs/w2-capacity
  inferrail capacity --workload w1 --policies round_robin,cost_model --admissions none,kv --out runs/w1-capacity-kv
  inferrail capacity --workload w4 --policies cost_model --pd-split --max-replicas 12 --out runs/w4-pd-capacity`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The base's rate is --rate, else the default rate of
			// compare.CapacityRateReplicas replicas (fleet.Config.DefaultRate).
			s, err := f.spec(cmd)
			if err != nil {
				return err
			}
			cs := compare.CapacitySpec{Base: s.Base, Policies: s.Policies, Admissions: s.Admissions, Ledgers: s.Ledgers,
				Seeds: s.Seeds, Rate: s.Base.Workload.Rate, MaxReplicas: f.maxReplicas, Split: f.pdSplit, Parallel: f.parallel}
			if err := cs.Validate(); err != nil {
				return flagErrors(err)
			}
			if f.out != "" {
				if err := compare.CheckWritable(f.out); err != nil {
					return usagef("--out: %w", err)
				}
			}
			bar := newCountBar(stderr, "searching")
			cs.Progress = bar.update
			res, err := compare.Capacity(cmd.Context(), cs)
			bar.finish()
			if err != nil {
				if bad := f.badTrace(err); bad != nil {
					return bad
				}
				return err
			}
			rep := &compare.CapacityReport{Spec: cs, Results: res}
			if f.out != "" {
				title := f.title
				if title == "" {
					title = "Capacity on " + cs.Base.Workload.Workload
				}
				if _, err := compare.Write(f.out, compare.Spec{Base: cs.Base, Seeds: cs.Seeds}, nil, rep, compare.Meta{Title: title, Version: version(), Command: commandLine(cmd)}); err != nil {
					return err
				}
			}
			return printCapacity(stdout, rep)
		},
	}
	f.fixedReplicas = compare.CapacityRateReplicas
	f.requestsHelp = strconv.Itoa(compare.DefaultRequests)
	f.rateHelp = fmt.Sprintf("the workload's default rate for %d engines of --profile, as sim's with --replicas %d", compare.CapacityRateReplicas, compare.CapacityRateReplicas)
	f.register(cmd, "every summary")
	f.gw.register(cmd)
	f.registerCompare(cmd, "capacity.json, report.md and the charts")
	cmd.Flags().IntVar(&f.maxReplicas, "max-replicas", 16, "largest fleet to try")
	cmd.Flags().BoolVar(&f.pdSplit, "pd-split", false, "search the prefill/decode split too: try every fleet size aggregated and as p prefill + n-p decode replicas (p from 1 to n-1), and report the best split")
	return cmd
}

func printCapacity(w io.Writer, rep *compare.CapacityReport) error {
	base := rep.Baseline()
	slo := rep.Spec.Base.SLO
	what := fmt.Sprintf("%s at %.2f req/s", rep.Spec.Base.Workload.Workload, rep.OfferedRate())
	if rep.Spec.Base.Source != nil {
		what = fmt.Sprintf("%s at its own arrival times (%.2f req/s)", rep.Spec.Base.SourceName, rep.OfferedRate())
	}
	fmt.Fprintf(w, "%s, SLO TTFT p99 <= %v and TPOT p99 <= %v, seeds %d-%d:\n",
		what, slo.TTFTP99, slo.TPOTP99, rep.Spec.Seeds[0], rep.Spec.Seeds[len(rep.Spec.Seeds)-1])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\treplicas\tsaved vs "+orNone(base)+"\tper four GPUs")
	for _, r := range rep.Results {
		need := r.Fleet()
		saved, per4 := "-", "-"
		if r.Replicas == 0 {
			need = fmt.Sprintf("> %d", rep.Spec.MaxReplicas)
		} else if n, p4, ok := rep.Savings(r.Label); ok {
			saved, per4 = strconv.Itoa(n), strconv.FormatFloat(p4, 'f', 2, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Label, need, saved, per4)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if notes := rep.FailureNotes(); len(notes) > 0 {
		fmt.Fprintln(w, "failed requests by reason (the SLO needs every request completed):")
		for _, n := range notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
	for _, warn := range rep.Warnings() {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "(no baseline)"
	}
	return s
}

// buildVersion is stamped by `make build` (-ldflags -X main.buildVersion=...).
var buildVersion string

// version names the build: the stamped version, else the VCS revision when
// the binary carries one, else the module version (go install ...@v1.2.3),
// else "dev".
func version() string {
	if buildVersion != "" {
		return buildVersion
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			return v
		}
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "+dirty"
	}
	return rev
}

// commandLine rebuilds the command as typed, from the flags that were set.
func commandLine(cmd *cobra.Command) string {
	parts := []string{cmd.CommandPath()}
	cmd.Flags().Visit(func(fl *pflag.Flag) {
		if fl.Name == "parallel" {
			return // does not change the results
		}
		if sv, ok := fl.Value.(pflag.SliceValue); ok {
			for _, v := range sv.GetSlice() {
				parts = append(parts, "--"+fl.Name+"="+v)
			}
			return
		}
		parts = append(parts, "--"+fl.Name+"="+fl.Value.String())
	})
	return strings.Join(parts, " ")
}
