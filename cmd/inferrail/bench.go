package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/bench"
	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/workload"
)

type benchFlags struct {
	simFlags
	baseURL  string
	model    string
	keyFile  string
	endpoint string
	timeout  time.Duration
}

func newBenchCmd(stdout, stderr io.Writer) *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Send a workload or trace to an OpenAI-compatible server, open loop, and measure it",
		Long: `bench sends the requests of a workload (or a replayed trace) to a server on
their own schedule, whatever the server answers, and measures time to first
token, time per output token, inter-token latency and end-to-end latency from
each request's scheduled time, so queueing in a slow server is counted, not
hidden. Prompts are real text made from the workload's segments (the
builtin:sim words that inferrail engine tokenizes one per word); every
request streams, with ignore_eos and max_tokens set to its output length.
Later turns of a session quote what the server really answered.

The summary is the simulator's, so a bench run and a sim run of the same
workload compare side by side (--json, --out DIR as for sim). Without --rate
the rate is the workload's default per-replica rate times --replicas
(default 1: one engine).`,
		Example: `  inferrail engine --port 8000 &
  inferrail bench --base-url http://127.0.0.1:8000 --workload w1 --requests 500
  inferrail bench --base-url http://127.0.0.1:8080 --workload w2 --replicas 3 --json --out runs/live-w2
  inferrail bench --base-url http://127.0.0.1:8000 --trace conversation_trace.jsonl --limit 1000 --speedup 4`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config(cmd)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runBench(ctx, f, cfg, stdout, stderr)
		},
	}
	f.register(cmd, "the summary")
	fl := cmd.Flags()
	fl.Lookup("replicas").DefValue = "1"
	f.replicas = 1
	fl.Lookup("replicas").Usage = "replicas behind --base-url, to scale the default rate"
	fl.StringVar(&f.baseURL, "base-url", "", "server to load, e.g. http://127.0.0.1:8000 (required); several, comma-separated, are taken in turn")
	fl.StringVar(&f.model, "model", "", "model field of every request (default: left out, so the server uses its own model)")
	fl.StringVar(&f.keyFile, "api-key-file", "", "file holding the API key sent as Authorization: Bearer (default: $INFERRAIL_API_KEY, else none)")
	fl.StringVar(&f.endpoint, "endpoint", "completions", "API: completions (prompt text) or chat (one user message)")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Minute, "give up on a request after this long")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the workload; the same seed sends the same requests at the same times")
	fl.BoolVar(&f.json, "json", false, "print the summary as one JSON object on stdout (progress stays on stderr)")
	fl.StringVar(&f.out, "out", "", "directory to write summary.json and requests.parquet into")
	for _, name := range []string{"scrape-interval", "index", "kv-event-delay", "speculation-ttl", "profile"} {
		fl.MarkHidden(name)
	}
	return cmd
}

func (f *benchFlags) config(cmd *cobra.Command) (fleet.Config, error) {
	if f.baseURL == "" {
		return fleet.Config{}, usagef("--base-url is required, e.g. --base-url http://127.0.0.1:8000")
	}
	if f.endpoint != string(bench.Completions) && f.endpoint != string(bench.ChatCompletions) {
		return fleet.Config{}, usagef("--endpoint: must be completions or chat, got %q", f.endpoint)
	}
	if f.timeout <= 0 {
		return fleet.Config{}, usagef("--timeout: must be positive, got %v", f.timeout)
	}
	cfg, err := f.simFlags.config(cmd)
	if err != nil {
		return cfg, err
	}
	return cfg, nil
}

func runBench(ctx context.Context, f benchFlags, cfg fleet.Config, stdout, stderr io.Writer) error {
	var src workload.Source
	var err error
	if cfg.Source != nil {
		src, err = cfg.Source(cfg.Seed)
	} else {
		w := cfg.Workload
		w.Seed = cfg.Seed
		src, err = workload.New(w)
	}
	if err != nil {
		return usagef("workload: %w", err)
	}
	// Garbage collection pauses are the main source of late sends; a load
	// generator can spend memory to collect four times less often.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	bar := newProgressBar(stderr)
	bar.live = true
	target := cfg.Workload.Requests
	if cfg.Source != nil {
		target = 0
	}
	finished := 0
	key := os.Getenv("INFERRAIL_API_KEY")
	if f.keyFile != "" {
		b, err := os.ReadFile(f.keyFile)
		if err != nil {
			return usagef("--api-key-file: %w", err)
		}
		key = strings.TrimSpace(string(b))
		if key == "" || strings.ContainsAny(key, " \t\r\n") {
			return usagef("--api-key-file %s: must hold one key on one line", f.keyFile)
		}
	}
	out, err := bench.Run(ctx, bench.Config{
		BaseURL:  f.baseURL,
		APIKey:   key,
		Model:    f.model,
		Endpoint: bench.Endpoint(f.endpoint),
		Source:   src,
		Warmup:   cfg.Warmup,
		SLO:      cfg.SLO,
		Timeout:  f.timeout,
		Progress: func(done int) {
			finished = done
			bar.update(fleet.Progress{Finished: done, Created: done, Target: target})
		},
	})
	bar.update(fleet.Progress{Finished: finished, Target: target, Done: true})
	if err != nil {
		return err
	}
	// A replay stops at a record it cannot read; the run is then short.
	if e, ok := src.(interface{ Err() error }); ok && e.Err() != nil {
		if bad := f.badTrace(e.Err()); bad != nil {
			return bad
		}
		return fmt.Errorf("%s: %w", cfg.SourceName, e.Err())
	}
	s := &out.Summary
	s.Workload = cfg.Workload.Workload
	if cfg.SourceName != "" {
		s.Workload = cfg.SourceName
	}
	s.Policy = "bench"
	s.Seed = cfg.Seed
	s.RateRPS = cfg.Workload.Rate
	if f.out != "" {
		if err := os.MkdirAll(f.out, 0o755); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
		if err := results.WriteSummaryFile(filepath.Join(f.out, "summary.json"), *s); err != nil {
			return fmt.Errorf("write summary: %w", err)
		}
		rows := results.RowsFromRecords(out.Records, s.Workload, s.Policy, s.Seed)
		if err := results.WriteParquetFile(filepath.Join(f.out, "requests.parquet"), rows); err != nil {
			return fmt.Errorf("write requests: %w", err)
		}
	}
	if f.json {
		return results.WriteJSON(stdout, out.Report())
	}
	if err := results.FormatTable(stdout, []results.Summary{*s}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "send lag: p50 %.3f ms, p99 %.3f ms; wall %.1f s\n", out.SendLag.P50, out.SendLag.P99, out.WallS)
	if len(out.Errors) > 0 {
		reasons := make([]string, 0, len(out.Errors))
		for r := range out.Errors {
			reasons = append(reasons, r)
		}
		sort.Strings(reasons)
		fmt.Fprint(stdout, "errors:")
		for _, r := range reasons {
			fmt.Fprintf(stdout, " %s %d;", r, out.Errors[r])
		}
		fmt.Fprintln(stdout)
	}
	if f.out != "" {
		fmt.Fprintf(stdout, "wrote %s and %s\n", filepath.Join(f.out, "summary.json"), filepath.Join(f.out, "requests.parquet"))
	}
	return nil
}
