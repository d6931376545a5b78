package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/calibrate"
	"github.com/inferrail/inferrail/fidelity"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/traces"
)

func newFidelityCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		trace, format, profile, policy, model, out, liveConfig string
		replicas                                               int
		seed                                                   uint64
		asJSON, skipBad                                        bool
	)
	cmd := &cobra.Command{
		Use:   "fidelity --trace FILE",
		Short: "Replay a recording of live traffic through the simulator and compare with what was measured",
		Long: `fidelity replays a recording made by live's record: section through the
simulator, with the recorded fleet size and policy, arrivals, lengths, sessions
and block hashes, and compares the prediction with the measurement, request by
request and by percentile (p50, p90, p99, mean) of queue time, TTFT, TPOT, E2E
and hit rate, overall and per replica. Failed and rejected requests are counted
by outcome and left out of the comparisons. --out writes fidelity.md (tables
and charts) and fidelity.json (the errors); --json prints the errors alone.`,
		Example: `  inferrail fidelity --trace recorded.parquet --out runs/fidelity
  inferrail fidelity --trace recorded.parquet --profile rtx4090.yaml --config live.yaml --json
  inferrail fidelity --trace recorded.parquet --policy prefix_hash --replicas 4`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if trace == "" {
				return usagef("--trace: required: the recording to check (live's record: section writes one)")
			}
			o := fidelity.Options{Policy: policy, Replicas: replicas, Model: model, Seed: seed}
			if profile != "" {
				ec, err := calibrate.ResolveProfile(profile)
				if err != nil {
					return usagef("--profile: %w", err)
				}
				o.Engine, o.Profile = ec, profile
			}
			if format == "" {
				d, err := traces.Detect(trace)
				if err != nil {
					return usagef("--trace: %w (name it with --trace-format)", err)
				}
				format = d
			}
			if format == "parquet" {
				// A recording names its fleet and policy, its sample and
				// its drops in its metadata; a converted trace does not.
				meta, err := traces.ReadRecordingMeta(trace)
				switch {
				case err == nil:
					o.UseRecording(meta)
				case !errors.Is(err, traces.ErrNotRecording):
					return usagef("--trace: %w", err)
				}
			}
			if liveConfig != "" {
				c, err := config.Load(liveConfig)
				if err != nil {
					return usagef("--config: %w", err)
				}
				fl, gw, err := fidelity.FromLiveConfig(c, model)
				if err != nil {
					return usagef("--config: %w", err)
				}
				o.Gateway = gw
				if o.Fleet == nil {
					o.Fleet = fl // the recording's own description comes first
				}
			}
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			r, c, err := traces.Open(trace, format, traces.Options{SkipBad: skipBad})
			if err != nil {
				return usagef("--trace: %w", err)
			}
			defer c.Close()
			bar := newProgressBar(stderr)
			o.Progress = bar.update
			res, err := fidelity.CheckReader(r, o)
			if err != nil {
				if bad := badTrace(err, "--trace", trace, "--trace-format", skipBad); bad != nil {
					return bad
				}
				var ie *fidelity.InputError
				if errors.As(err, &ie) {
					return usagef("--trace %s: %w", trace, err)
				}
				return err
			}
			res.Trace = filepath.Base(trace)
			if out != "" {
				if _, err := res.Write(out); err != nil {
					return fmt.Errorf("--out: %w", err)
				}
			}
			if asJSON {
				return res.WriteJSON(stdout)
			}
			if err := printFidelity(stdout, res); err != nil {
				return err
			}
			if out != "" {
				fmt.Fprintf(stdout, "wrote %s and %s\n", filepath.Join(out, fidelity.ReportFile), filepath.Join(out, fidelity.JSONFile))
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&trace, "trace", "", "the recording (live's record: section writes it)")
	fl.StringVar(&format, "trace-format", "", "trace format: "+strings.Join(traces.Formats(), ", ")+" (default: detected)")
	fl.BoolVar(&skipBad, "skip-bad", false, "skip and count malformed records instead of stopping at the first")
	fl.StringVar(&profile, "profile", "", "engine profile: a YAML file or a preset name (default: the built-in default-8b-24gb, as inferrail engine runs)")
	fl.StringVar(&policy, "policy", "", "replay with this routing policy (default: the recorded one)")
	fl.IntVar(&replicas, "replicas", 0, "replay on this many replicas (default: the recorded fleet)")
	fl.StringVar(&model, "model", "", "the model to check when the recording holds several")
	fl.StringVar(&liveConfig, "config", "", "the live configuration the recording was made with: its admission, queue, index and scrape interval (default: live's defaults), and its replicas and policy when the recording does not name them")
	fl.Uint64Var(&seed, "seed", 1, "simulation seed")
	fl.StringVar(&out, "out", "", "write fidelity.md, fidelity.json and the charts into this directory")
	fl.BoolVar(&asJSON, "json", false, "print fidelity.json on stdout instead of the table")
	return cmd
}

// printFidelity prints the overall errors and the counts.
func printFidelity(w io.Writer, res *fidelity.Result) error {
	c := res.Counts
	fmt.Fprintf(w, "%s: %s on %d replicas, %d of %d replayed requests completed on both sides (failed: %d in the recording only, %d in the simulation only, %d on both)\n",
		res.Trace, res.Policy, res.Replicas, c.Matched, c.Replayed, c.OnlyInRecordingFailed, c.OnlyInSimulationFailed, c.BothFailed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "metric\tmeasured p50\tpredicted p50\terror\tmeasured p99\tpredicted p99\terror\tMAPE\t")
	o := &res.Overall
	for _, m := range []struct {
		name string
		m    *fidelity.Metric
	}{{"queue ms", &o.Queue}, {"TTFT ms", &o.TTFT}, {"TPOT ms", &o.TPOT}, {"E2E ms", &o.E2E}} {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%s\t%.1f\t%.1f\t%s\t%s\t\n", m.name, m.m.Measured.P50, m.m.Predicted.P50, fidelityRel(m.m.RelError.P50),
			m.m.Measured.P99, m.m.Predicted.P99, fidelityRel(m.m.RelError.P99), fidelityPct(m.m.MAPE))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	h := o.TokenHitRate
	_, err := fmt.Fprintf(w, "token hit rate: measured %.3f, predicted %.3f (%+.3f); per-replica pairing: %s\n", h.Measured, h.Predicted, h.Diff, fidelityPairing(res.Mapping))
	return err
}

func fidelityRel(p *float64) string {
	if p == nil {
		return "n/a"
	}
	return fmt.Sprintf("%+.1f%%", 100**p)
}

func fidelityPct(p *float64) string {
	if p == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100**p)
}

func fidelityPairing(m fidelity.Mapping) string {
	if m.Meaningful {
		return fmt.Sprintf("%.0f%% of the requests on paired replicas", 100*m.Agreement)
	}
	return "none (" + m.Why + ")"
}
