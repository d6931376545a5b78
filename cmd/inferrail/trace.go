package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/traces"
)

func newTraceCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Inspect and convert request traces",
		Long: `trace reads the public traces (Mooncake, Qwen-Bailian, Azure, BurstGPT,
ShareGPT), vLLM request logs and the project's own parquet format.`,
		Example: `  inferrail trace stats ../shared/traces/mooncake/conversation_trace.jsonl
  inferrail trace convert trace.jsonl trace.parquet`,
		Args: noArgs,
	}
	cmd.AddCommand(newTraceStatsCmd(stdout), newTraceConvertCmd(stdout, stderr), newTraceSynthCmd(stdout))
	return cmd
}

type traceFileFlags struct {
	format  string
	skipBad bool
}

func (f *traceFileFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.format, "format", "", "trace format: "+strings.Join(traces.Formats(), ", ")+" (default: detected)")
	cmd.Flags().BoolVar(&f.skipBad, "skip-bad", false, "skip and count malformed records instead of stopping at the first")
}

func (f *traceFileFlags) open(path string) (traces.Reader, io.Closer, error) {
	format := f.format
	if format == "" {
		d, err := traces.Detect(path)
		if err != nil {
			return nil, nil, usagef("%s: %w (name it with --format)", path, err)
		}
		format = d
	}
	r, c, err := traces.Open(path, format, traces.Options{SkipBad: f.skipBad})
	if err != nil {
		return nil, nil, usagef("%w", err)
	}
	return r, c, nil
}

// badTrace makes a malformed trace record bad input (exit 2), wherever the
// read met it: before a run or during one. The message is flag (when given),
// then the file and line or record of the traces.LineError, then what to do.
// file names the trace for the errors that carry no position. It returns nil
// for any other error.
func badTrace(err error, flag, file, formatFlag string, skipBad bool) error {
	var le *traces.LineError
	isLine := errors.As(err, &le)
	if !isLine && !errors.Is(err, traces.ErrBadRecord) {
		return nil
	}
	hint := "fix or remove that record, or pass --skip-bad to skip and count malformed records"
	switch {
	case !errors.Is(err, traces.ErrBadRecord):
		hint = "fix the file, or name its format with " + formatFlag
	case skipBad:
		hint = "fix or remove that record"
	}
	prefix := ""
	if flag != "" {
		prefix = flag + ": "
	}
	if isLine {
		return usageError{fmt.Errorf("%s%w (%s)", prefix, le, hint)}
	}
	return usageError{fmt.Errorf("%s%s: %w (%s)", prefix, file, err, hint)}
}

// skipped reports how many records a reader skipped, when it counts them.
func skipped(r traces.Reader) int {
	if c, ok := r.(interface{ Skipped() int }); ok {
		return c.Skipped()
	}
	return 0
}

func exactlyOneArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usagef("%s takes one trace file, got %d arguments", cmd.CommandPath(), len(args))
	}
	return nil
}

func newTraceStatsCmd(stdout io.Writer) *cobra.Command {
	var (
		f      traceFileFlags
		sizes  string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "stats FILE",
		Short: "Requests, rates, lengths, sessions and the prefix reuse a trace offers",
		Long: `stats summarises a trace and the reuse it offers before any routing: the
token-weighted prefix hit ratio of one global LRU of KV blocks shared by all
requests, at each --cache-tokens size and unlimited (traces with block identity
only: Mooncake, Qwen-Bailian, the project's parquet).`,
		Example: `  inferrail trace stats ../shared/traces/mooncake/conversation_trace.jsonl --cache-tokens 3000000,10000000,50000000
  inferrail trace stats trace.parquet --json`,
		Args: exactlyOneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			var caches []int64
			if sizes != "" {
				for _, s := range strings.Split(sizes, ",") {
					v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
					if err != nil || v <= 0 {
						return usagef("--cache-tokens: want positive token counts separated by commas, got %q", s)
					}
					caches = append(caches, v)
				}
			}
			r, c, err := f.open(args[0])
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := traces.ComputeStats(r, caches)
			if err != nil {
				if bad := badTrace(err, "", args[0], "--format", f.skipBad); bad != nil {
					return bad
				}
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if asJSON {
				return results.WriteJSON(stdout, st)
			}
			return printStats(stdout, args[0], st, skipped(r))
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&sizes, "cache-tokens", "", "cache sizes in tokens for the reuse analysis, comma-separated (unlimited is always added)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the statistics as one JSON object")
	return cmd
}

func printStats(w io.Writer, name string, st traces.Stats, skippedN int) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "trace\t%s\n", name)
	fmt.Fprintf(tw, "requests\t%d (%d skipped)\n", st.Requests, skippedN)
	fmt.Fprintf(tw, "duration\t%.1f s, %.2f req/s on average, %.0f req/s peak (1 s)\n", st.DurationS, st.RateRPS, st.PeakRPS1s)
	fmt.Fprintf(tw, "input tokens\tmean %.0f, p50 %.0f, p90 %.0f, p99 %.0f, max %.0f\n", st.Input.Mean, st.Input.P50, st.Input.P90, st.Input.P99, st.Input.Max)
	fmt.Fprintf(tw, "output tokens\tmean %.0f, p50 %.0f, p90 %.0f, p99 %.0f, max %.0f\n", st.Output.Mean, st.Output.P50, st.Output.P90, st.Output.P99, st.Output.Max)
	fmt.Fprintf(tw, "sessions\t%d\n", st.Sessions)
	if st.BlockSize == 0 {
		fmt.Fprintf(tw, "prefix reuse\tunknown: the trace carries no block identity\n")
	} else {
		for _, r := range st.Reuse {
			size := "unlimited"
			if r.CacheTokens > 0 {
				size = strconv.FormatInt(r.CacheTokens, 10) + " tokens"
			}
			fmt.Fprintf(tw, "prefix reuse, %s cache\t%.1f%% of prompt tokens\n", size, 100*r.HitRatio)
		}
	}
	return tw.Flush()
}

func newTraceConvertCmd(stdout, stderr io.Writer) *cobra.Command {
	var f traceFileFlags
	cmd := &cobra.Command{
		Use:   "convert IN OUT.parquet",
		Short: "Convert a trace to the project's parquet trace format",
		Long: `convert reads any supported trace and writes the project's own versioned
parquet trace format (arrival, session, model, priority, lengths, block identity),
which replays exactly like the original.`,
		Example: `  inferrail trace convert ../shared/traces/mooncake/conversation_trace.jsonl mooncake.parquet`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usagef("%s takes an input trace and an output .parquet file, got %d arguments", cmd.CommandPath(), len(args))
			}
			if !strings.HasSuffix(args[1], ".parquet") {
				return usagef("%s: the output must be a .parquet file", args[1])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			r, c, err := f.open(args[0])
			if err != nil {
				return err
			}
			defer c.Close()
			n, err := traces.WriteParquetFile(args[1], r)
			if err != nil {
				os.Remove(args[1])
				if bad := badTrace(err, "", args[0], "--format", f.skipBad); bad != nil {
					return bad
				}
				return fmt.Errorf("convert %s: %w", args[0], err)
			}
			fmt.Fprintf(stdout, "wrote %d records to %s (%d skipped)\n", n, args[1], skipped(r))
			return nil
		},
	}
	f.register(cmd)
	return cmd
}
