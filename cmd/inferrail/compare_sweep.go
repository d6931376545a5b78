package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/compare"
	"github.com/inferrail/inferrail/traces"
)

// addSweepCommands gives compare the subcommands that run a comparison
// past one machine: plan, run (one shard) and merge.
func addSweepCommands(cmd *cobra.Command, stdout, stderr io.Writer) {
	cmd.AddCommand(newComparePlanCmd(stdout), newCompareRunCmd(stdout, stderr), newCompareMergeCmd(stdout))
}

func newComparePlanCmd(stdout io.Writer) *cobra.Command {
	var f compareFlags
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Write a comparison's simulations to DIR/plan.json, to run as shards on any machines",
		Long: `plan takes compare's flags and, instead of running the comparison, writes
--out/plan.json: every simulation (policy variant x rate x seed) as a job with its
whole fleet and workload configuration, what merge needs to write the report, the
plan format and the inferrail version. Then run every shard, on any machines that
see the directory (a shared volume), with "compare run DIR --shard i/N" for i from
0 to N-1, and "compare merge DIR" writes what "compare --out DIR" would have
written, byte for byte. Planning the same comparison again into the same
directory changes nothing; another plan is refused while results of the first
are there. A trace replay (--trace) is read by every shard at the path given here
(relative to the shard's working directory); its SHA-256 is checked.`,
		Example: `  inferrail compare plan --workload w1 --policies all --seeds 10 --rates 4,6,8,10 --out runs/w1-sweep
  seq 0 3 | xargs -P 4 -I{} inferrail compare run runs/w1-sweep --shard {}/4
  inferrail compare merge runs/w1-sweep`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := f.spec(cmd)
			if err != nil {
				return err
			}
			if f.out == "" {
				return usagef("--out: give a directory for plan.json (the shards' results and the merged report go there too)")
			}
			if err := compare.CheckWritable(f.out); err != nil {
				return usagef("--out: %w", err)
			}
			var replay *compare.Replay
			if f.trace != "" {
				if replay, err = f.replay(s); err != nil {
					return err
				}
			}
			title := f.title
			if title == "" {
				title = "Routing policies on " + s.Base.Workload.Workload
			}
			// The report's command is the compare that gives the same outputs.
			command := cmd.Parent().CommandPath() + strings.TrimPrefix(commandLine(cmd), cmd.CommandPath())
			p, err := compare.NewPlan(s, compare.Meta{Title: title, Version: version(), Command: command}, replay)
			if err != nil {
				return err
			}
			if err := compare.WritePlan(f.out, p); err != nil {
				return err
			}
			_, err = fmt.Fprintf(stdout, "planned %d simulations in %s (plan %.12s, inferrail %s)\n"+
				"run every shard i of N, on any machines that see %s: inferrail compare run %s --shard i/N (i from 0 to N-1)\n"+
				"then: inferrail compare merge %s\n",
				p.Len(), filepath.Join(f.out, compare.PlanFile), p.Hash(), p.Version(), f.out, f.out, f.out)
			return err
		},
	}
	f.requestsHelp = strconv.Itoa(compare.DefaultRequests)
	f.register(cmd, "every summary")
	f.gw.limitsList = true
	f.gw.register(cmd)
	f.registerCompare(cmd, "plan.json; the shards add jobs/, merge the outputs of compare (results.json, requests.parquet, report.md and the charts)")
	cmd.Flags().StringVar(&f.rates, "rates", "", "offered loads to sweep, in requests per second, comma-separated (the first is the main comparison)")
	cmd.Flags().StringVar(&f.isolate, "isolate", "", "a tenant of the workload's mix: also run every variant without it, and report the other tenants' TTFT p99 with it against without it")
	f.registerPools(cmd)
	// Taken, as compare takes it, so that compare's command line plans as
	// it is; the shards choose their own (compare run --parallel).
	_ = cmd.Flags().MarkHidden("parallel")
	return cmd
}

// replay describes --trace for a plan, as traceSource opens it.
func (f *compareFlags) replay(s compare.Spec) (*compare.Replay, error) {
	format := f.traceFormat
	if format == "" {
		d, err := traces.Detect(f.trace)
		if err != nil {
			return nil, usagef("--trace: %w (name it with --trace-format)", err)
		}
		format = d
	}
	opts := traces.ReplayOptions{Speedup: f.speedup, RateScale: f.rateScale, Start: f.start, End: f.end, Limit: f.limit, Model: s.Base.Workload.Model}
	r, err := compare.NewReplay(f.trace, format, f.skipBad, opts)
	if err != nil {
		return nil, usagef("--trace: %w", err)
	}
	return r, nil
}

// sweepDir reads the one argument of run and merge: the plan's directory.
func sweepDir(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usagef("%s takes one argument, the directory compare plan wrote (its --out), got %d", cmd.CommandPath(), len(args))
	}
	return nil
}

// planError makes a directory without a plan (or a missing trace) bad input.
func planError(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return usageError{err}
	}
	return err
}

func newCompareRunCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		shard    string
		parallel int
	)
	cmd := &cobra.Command{
		Use:   "run DIR",
		Short: "Run one shard of a planned comparison: the jobs j of DIR/plan.json with j % N == i",
		Long: `run runs shard i of N of the plan in DIR (compare plan --out DIR): the jobs
whose index j has j % N == i, i counting from 0 (--shard 0/4 to 3/4 for four
shards), and stores each job's result in DIR/jobs as soon as it is simulated,
through a temporary file and a rename, so a result is whole or absent. Jobs whose
result is already there, from this plan and this build, are skipped: a shard that
was killed, run again, finishes what it had not stored; a result of another plan
or build is run again. The shards share nothing but the directory: run them with
xargs -P, a Slurm array or a Kubernetes Indexed Job, then compare merge DIR. Every
shard must run the build that planned.`,
		Example: `  inferrail compare run runs/w1-sweep --shard 2/4
  seq 0 7 | xargs -P 2 -I{} inferrail compare run runs/w1-sweep --shard {}/8
  inferrail compare run /data/w1-sweep --shard $SLURM_ARRAY_TASK_ID/16 --parallel 4`,
		Args: sweepDir,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := compare.ParseShard(shard)
			if err != nil {
				return usagef("--%w", err)
			}
			if parallel < 0 || parallel > maxParallel {
				return usagef("--parallel: must be between 0 (all cores) and %d, got %d (each running simulation holds its requests in memory)", maxParallel, parallel)
			}
			bar := newCountBar(stderr, "shard "+s.String())
			start := time.Now()
			rep, err := compare.RunShard(cmd.Context(), args[0], compare.ShardOptions{Shard: s, Parallel: parallel, Version: version(), Progress: bar.update})
			bar.finish()
			for _, r := range rep.Replaced {
				fmt.Fprintf(stderr, "ran again: %s\n", r)
			}
			if err != nil {
				return planError(err)
			}
			_, err = fmt.Fprintf(stdout, "shard %s: %d of the plan's %d jobs; ran %d in %s, skipped %d already stored in %s\n",
				s, rep.Jobs, rep.Planned, len(rep.Ran), time.Since(start).Round(100*time.Millisecond), len(rep.Skipped), filepath.Join(args[0], compare.JobsDir))
			return err
		},
	}
	cmd.Flags().StringVar(&shard, "shard", "0/1", "i/N: run the jobs j with j % N == i, i counting from 0 (0/1: every job)")
	cmd.Flags().IntVar(&parallel, "parallel", 0, "simulations run at once (default: all cores); results do not depend on it")
	return cmd
}

func newCompareMergeCmd(stdout io.Writer) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "merge DIR",
		Short: "Check a planned comparison's shards are all done, and write its results and report",
		Long: `merge checks that DIR/jobs holds one result of every job of DIR/plan.json, each
from this plan (its SHA-256) and the build that planned, and no job the plan does
not have; it names every missing job and the shards to run again, and every file
that does not belong. Then it writes what compare --out would have written for
the same flags, byte for byte: results.json, requests.parquet, report.md and the
charts, into DIR (or --out), and prints compare's table.`,
		Example: `  inferrail compare merge runs/w1-sweep
  inferrail compare merge /data/w1-sweep --out reports/w1`,
		Args: sweepDir,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out != "" {
				if err := compare.CheckWritable(out); err != nil {
					return usagef("--out: %w", err)
				}
			}
			m, err := compare.Merge(args[0], compare.MergeOptions{Out: out, Version: version()})
			if err != nil {
				return planError(err)
			}
			return printComparison(stdout, m.Out, m.Spec, m.Points, m.Files)
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory for results.json, requests.parquet, report.md and the charts (default: DIR)")
	return cmd
}
