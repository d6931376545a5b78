package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/calibrate"
)

type calibrateFlags struct {
	url         string
	model       string
	apiKey      string
	budget      time.Duration
	batched     int
	blockSize   int
	maxPrompt   int
	maxBatch    int
	repeats     int
	fromLog     []string
	validate    []string
	gpu         string
	gpuBlocks   int
	fidelity    string
	holdout     float64
	maxEvals    int
	preset      string
	listPresets bool
	out         string
	report      string
}

func newCalibrateCmd(stdout, stderr io.Writer) *cobra.Command {
	var f calibrateFlags
	cmd := &cobra.Command{
		Use:   "calibrate",
		Short: "Fit the engine latency model to a live engine or its logs, or derive it for a model x GPU",
		Long: `calibrate writes an engine profile (YAML that sim --profile reads) in one of
three ways:

  --url       probe a running OpenAI-compatible server (vLLM, inferrail engine):
              cold prompts of several lengths, cached-prefix prompts and
              concurrent decode batches, timed from the stream; the five
              latency coefficients are fitted by least squares. The
              measurements go beside the profile (PROFILE.measurements.json).
  --from-log  replay a vLLM request log directory (requests.jsonl, meta.json,
              timeseries.csv) through the engine model and fit the profile to
              the logged TTFT and end-to-end latencies; --holdout keeps the
              last share of requests out of the fit to score the profile on
              them. Repeat --from-log to fit one profile to several whole
              runs, and add --validate DIR (repeatable) to predict other
              whole runs with it. The GPU, KV cache size, block size and
              parallelism come from the log itself; --gpu, --num-gpu-blocks
              and --block-size fill in only what it lacks, and a KV size that
              cannot be determined is refused, never assumed. --fidelity FILE
              fits each log on its own and writes the markdown report
              (docs/fidelity.md).
  --preset    derive a profile by roofline for a known MODEL@GPU (or
              MODEL@NxGPU); --list-presets shows them.`,
		Example: `  # probe a vLLM server (pass its --max-num-batched-tokens; block size and KV blocks come from /metrics)
  inferrail calibrate --url http://127.0.0.1:8000 --model meta-llama/Llama-3.1-8B --max-num-batched-tokens 2048 --out my-gpu.yaml --budget 2m
  # check the prober against the mock engine, whose profile is known
  inferrail engine --port 8001 --profile my-gpu.yaml --enable-prompt-tokens-details &
  inferrail calibrate --url http://127.0.0.1:8001 --out check.yaml   # compare with my-gpu.yaml
  inferrail calibrate --from-log ../shared/traces/vllm-logs/RTX4090-Llama-3.1-8B --holdout 0.5 --out rtx4090.yaml --report fit.json
  # one profile from two runs, checked on a third
  inferrail calibrate --from-log run1/ --from-log run2/ --validate run3/ --out fitted.yaml
  inferrail calibrate --from-log ../shared/traces/vllm-logs/RTXPRO6000-Qwen3-32B --gpu RTXPRO6000 --holdout 0.5 --out qwen.yaml
  inferrail calibrate --preset Llama-3.1-70B@4xH100 --out 70b-h100.yaml
  inferrail calibrate --list-presets`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCalibrate(cmd, f, stdout, stderr)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.url, "url", "", "probe the OpenAI-compatible server at this root URL")
	fl.StringVar(&f.model, "model", "", "model to probe (default: the first the server lists)")
	fl.StringVar(&f.apiKey, "api-key", "", "bearer token for the server")
	fl.DurationVar(&f.budget, "budget", 2*time.Minute, "stop probing after this long")
	fl.IntVar(&f.batched, "max-num-batched-tokens", 0, "the server's --max-num-batched-tokens (prefill chunk size); default 2048")
	fl.IntVar(&f.blockSize, "block-size", 0, "the server's KV block size (default: from /metrics, else 16); with --from-log, for logs that do not state it")
	fl.IntVar(&f.maxPrompt, "max-prompt-tokens", 0, "longest probe prompt (default 8192, or less if the server's max_model_len is smaller)")
	fl.IntVar(&f.maxBatch, "max-batch", 0, "largest concurrent decode batch to probe (default 32)")
	fl.IntVar(&f.repeats, "repeats", 0, "run the probe design this many times (default 3); the budget still stops the run")
	fl.StringArrayVar(&f.fromLog, "from-log", nil, "fit to this vLLM request log directory (requests.jsonl, meta.json, timeseries.csv); repeat for several runs")
	fl.StringArrayVar(&f.validate, "validate", nil, "with --from-log: predict this whole run (a log directory) with the fitted profile; repeatable")
	fl.StringVar(&f.gpu, "gpu", "", "with --from-log: the GPU (a preset GPU name) for logs whose meta.json names none")
	fl.IntVar(&f.gpuBlocks, "num-gpu-blocks", 0, "with --from-log: KV cache blocks per engine rank, for logs that do not state it")
	fl.StringVar(&f.fidelity, "fidelity", "", "with --from-log: fit each log on its own (--holdout, default 0.5) and write the fidelity report (markdown) here")
	fl.Float64Var(&f.holdout, "holdout", 0, "with --from-log: fraction of requests, the last by arrival, scored but not fitted (0 to <1)")
	fl.IntVar(&f.maxEvals, "max-evals", 0, "with --from-log: most log replays in the search (default 400)")
	fl.StringVar(&f.preset, "preset", "", "derive the profile by roofline for MODEL@GPU or MODEL@NxGPU (see --list-presets)")
	fl.BoolVar(&f.listPresets, "list-presets", false, "list the known MODEL@GPU presets and exit")
	fl.StringVar(&f.out, "out", "", "write the profile YAML here")
	fl.StringVar(&f.report, "report", "", "write the fit report (JSON) here")
	return cmd
}

func runCalibrate(cmd *cobra.Command, f calibrateFlags, stdout, stderr io.Writer) error {
	fl := cmd.Flags()
	modes := 0
	for _, on := range []bool{f.url != "", len(f.fromLog) > 0, f.preset != "", f.listPresets} {
		if on {
			modes++
		}
	}
	if modes != 1 {
		return usagef("calibrate: give exactly one of --url (probe a server), --from-log DIR (fit a vLLM log), --preset MODEL@GPU or --list-presets")
	}
	only := func(mode string, names ...string) error {
		for _, n := range names {
			if fl.Changed(n) {
				return usagef("--%s: applies only to %s", n, mode)
			}
		}
		return nil
	}
	probeFlags := []string{"model", "api-key", "budget", "max-num-batched-tokens", "max-prompt-tokens", "max-batch", "repeats"}
	logFlags := []string{"holdout", "max-evals", "validate", "gpu", "num-gpu-blocks", "fidelity"}
	if f.listPresets {
		if err := only("--url or --from-log", append(append(probeFlags, logFlags...), "block-size", "out", "report")...); err != nil {
			return err
		}
		for _, name := range calibrate.PresetNames() {
			c, _ := calibrate.Preset(name)
			fmt.Fprintf(stdout, "%-34s %-34s %7d blocks  step %.3g ms  prefill %.3g us/token\n", name, c.Name, c.NumGPUBlocks, c.Latency.StepFixedMs, c.Latency.PrefillTokenUs)
		}
		return nil
	}
	if f.out == "" && f.fidelity == "" {
		return usagef("--out: name the profile YAML to write, for example --out my-gpu.yaml")
	}
	switch {
	case f.preset != "":
		if err := only("--url or --from-log", append(append(probeFlags, logFlags...), "block-size", "report")...); err != nil {
			return err
		}
		cfg, err := calibrate.Preset(f.preset)
		if err != nil {
			return usagef("--preset: %w", err)
		}
		info, _ := calibrate.PresetInfo(f.preset)
		fmt.Fprint(stderr, info)
		if err := calibrate.SaveProfile(f.out, cfg); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "calibrate: wrote %s\n", f.out)
		return nil
	case len(f.fromLog) > 0:
		if err := only("--url", probeFlags...); err != nil {
			return err
		}
		return runCalibrateLog(cmd, f, stderr)
	default:
		if err := only("--from-log", logFlags...); err != nil {
			return err
		}
		if f.budget <= 0 {
			return usagef("--budget: must be positive, got %v", f.budget)
		}
		for _, v := range []struct {
			name string
			v    int
		}{{"max-num-batched-tokens", f.batched}, {"block-size", f.blockSize}, {"max-prompt-tokens", f.maxPrompt}, {"max-batch", f.maxBatch}, {"repeats", f.repeats}} {
			if v.v < 0 {
				return usagef("--%s: must be 0 (the default) or positive, got %d", v.name, v.v)
			}
		}
		if !strings.HasPrefix(f.url, "http://") && !strings.HasPrefix(f.url, "https://") {
			return usagef("--url: want the server's root such as http://127.0.0.1:8000, got %q", f.url)
		}
		ctx := cmd.Context()
		if ctx == nil {
			ctx = context.Background()
		}
		res, err := calibrate.Probe(ctx, calibrate.ProbeConfig{
			BaseURL: f.url, Model: f.model, APIKey: f.apiKey, Budget: f.budget, Progress: stderr,
			MaxNumBatchedTokens: f.batched, BlockSize: f.blockSize, MaxPromptTokens: f.maxPrompt, MaxBatch: f.maxBatch,
			Repeats: f.repeats,
		})
		if res != nil {
			// The measurements are kept even when the fit fails.
			if werr := calibrate.SaveJSON(calibrate.MeasurementsPath(f.out), res); werr != nil {
				return werr
			}
			for _, n := range res.Notes {
				fmt.Fprintln(stderr, "calibrate: note: "+n)
			}
		}
		if err != nil {
			return err
		}
		for _, c := range res.Fit.Coefficients {
			fmt.Fprintf(stderr, "calibrate: %-20s %10.4g ± %.2g\n", c.Name, c.Value, c.StdErr)
		}
		fmt.Fprintf(stderr, "calibrate: relative RMS error %.2f%% over %d measurements", 100*res.Fit.RelRMS, res.Fit.Rows-len(res.Fit.Outliers))
		if k := len(res.Fit.Outliers); k > 0 {
			fmt.Fprintf(stderr, " (%d more left out as delayed: rows %v of %s)", k, res.Fit.Outliers, calibrate.MeasurementsPath(f.out))
		}
		fmt.Fprintln(stderr)
		if err := calibrate.SaveFittedProfile(f.out, res.Config, res.Fit); err != nil {
			return err
		}
		if f.report != "" {
			if err := calibrate.SaveJSON(f.report, res.Fit); err != nil {
				return err
			}
		}
		fmt.Fprintf(stderr, "calibrate: wrote %s and %s\n", f.out, calibrate.MeasurementsPath(f.out))
		return nil
	}
}

// runCalibrateLog is calibrate --from-log.
func runCalibrateLog(cmd *cobra.Command, f calibrateFlags, stderr io.Writer) error {
	if math.IsNaN(f.holdout) || f.holdout < 0 || f.holdout >= 1 {
		return usagef("--holdout: must be at least 0 and below 1 (a fraction of the requests), got %v", f.holdout)
	}
	if f.maxEvals < 0 {
		return usagef("--max-evals: must be 0 (default) or positive, got %d", f.maxEvals)
	}
	read := calibrate.ReadOptions{GPU: f.gpu, NumGPUBlocks: f.gpuBlocks, BlockSize: f.blockSize}
	if f.fidelity != "" {
		if f.out != "" || len(f.validate) > 0 {
			return usagef("--fidelity: fits each --from-log on its own; drop --out and --validate")
		}
		holdout := f.holdout
		if !cmd.Flags().Changed("holdout") {
			holdout = 0.5
		}
		runs, err := calibrate.Fidelity(f.fromLog, calibrate.FidelityOptions{Holdout: holdout, MaxEvaluations: f.maxEvals, Read: read, Progress: stderr})
		if err != nil {
			return usagef("--from-log: %w", err)
		}
		var b strings.Builder
		if err := calibrate.WriteFidelityMarkdown(&b, runs, "make fidelity"); err != nil {
			return err
		}
		if err := os.WriteFile(f.fidelity, []byte(b.String()), 0o644); err != nil {
			return fmt.Errorf("--fidelity: %w", err)
		}
		if f.report != "" {
			if err := calibrate.SaveJSON(f.report, runs); err != nil {
				return err
			}
		}
		fmt.Fprintf(stderr, "calibrate: wrote %s\n", f.fidelity)
		return nil
	}
	read1 := func(dirs []string, flag string) ([]*calibrate.Log, error) {
		var logs []*calibrate.Log
		for _, d := range dirs {
			l, err := calibrate.ReadLog(d, read)
			if err != nil {
				return nil, usagef("--%s: %w", flag, err)
			}
			for _, n := range l.Notes {
				fmt.Fprintf(stderr, "calibrate: note: %s: %s\n", l.Name, n)
			}
			logs = append(logs, l)
		}
		return logs, nil
	}
	logs, err := read1(f.fromLog, "from-log")
	if err != nil {
		return err
	}
	val, err := read1(f.validate, "validate")
	if err != nil {
		return err
	}
	total := 0
	for _, l := range logs {
		total += len(l.Requests)
	}
	fmt.Fprintf(stderr, "calibrate: fitting %d requests of %d log(s) (holdout %.2g)\n", total, len(logs), f.holdout)
	fit, err := calibrate.FitLogs(logs, calibrate.LogOptions{Holdout: f.holdout, MaxEvaluations: f.maxEvals, Validate: val, Progress: stderr})
	if err != nil {
		return err
	}
	for _, c := range fit.Coefficients {
		if c.Identified {
			fmt.Fprintf(stderr, "calibrate: %-20s %10.4g  (95%%: %.4g to %.4g)\n", c.Name, c.Value, c.Lo, c.Hi)
		} else {
			fmt.Fprintf(stderr, "calibrate: %-20s not identified: the logs fit alike over %s\n", c.Name, c.Interval())
		}
	}
	line := func(label string, r *calibrate.ErrorReport) {
		fmt.Fprintf(stderr, "calibrate: %-16s TTFT %5.1f%%  E2E %5.1f%%", label, r.TTFTMAPE, r.E2EMAPE)
		if r.Phases {
			fmt.Fprintf(stderr, "  queue %5.1f%%  scheduled-to-first-token %5.1f%% (median x%.2f)", r.QueueMAPE, r.SchedToFirstMAPE, r.SchedToFirstRatio)
		}
		fmt.Fprintf(stderr, "  TPOT %5.1f%%  (%d requests, MAPE)\n", r.TPOTMAPE, r.Requests)
	}
	line("fit", &fit.Fit)
	if fit.Holdout != nil {
		line("holdout", fit.Holdout)
	}
	for i, v := range fit.Validation {
		line("validate "+strconv.Itoa(i+1), &v.Report)
	}
	for _, b := range fit.Baselines {
		r := &b.Fit
		label := b.Name + " (fit)"
		if b.Holdout != nil {
			r, label = b.Holdout, b.Name+" (holdout)"
		}
		line(label, r)
	}
	if err := calibrate.SaveLogProfile(f.out, fit); err != nil {
		return err
	}
	if f.report != "" {
		if err := calibrate.SaveJSON(f.report, fit); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "calibrate: wrote %s\n", f.out)
	return nil
}
