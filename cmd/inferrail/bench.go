package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
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
	baseURL     string
	model       string
	apiKey      string
	keyFile     string
	headers     []string
	endpoint    string
	timeout     time.Duration
	closeAtDone bool

	// Resolved by config: the key to send and the extra headers.
	key    string
	header http.Header
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
workload compare side by side (--json, --out DIR as for sim), with the send
lag, failures by reason and warnings added, and what the server did not say
null rather than 0: the hit rate when no answer's usage carried
prompt_tokens_details.cached_tokens (vLLM sends it with
--enable-prompt-tokens-details; a warning says so), the predictions when no
answer carried x-inferrail-predicted-cached-tokens (inferrail live sends it
with predicted_cached_header or to a request with its own cache_salt).
Without --rate the rate is the workload's default per-replica rate times
--replicas (default 1: one engine).

The API key sent as Authorization: Bearer is --api-key or --api-key-file
(giving both is refused), else an Authorization --header, else
$INFERRAIL_API_KEY, else none.`,
		Example: `  inferrail engine --port 8000 &
  inferrail bench --base-url http://127.0.0.1:8000 --workload w1 --requests 500
  inferrail bench --base-url http://127.0.0.1:8080 --workload w2 --replicas 3 --json --out runs/live-w2
  inferrail bench --base-url http://127.0.0.1:8000 --trace conversation_trace.jsonl --limit 1000 --speedup 4
  inferrail bench --base-url https://llm.example.com --api-key-file key.txt --header 'X-Team: search' --workload w1`,
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
	fl.StringVar(&f.apiKey, "api-key", "", "API key sent as Authorization: Bearer (visible in ps: prefer --api-key-file or $INFERRAIL_API_KEY); not with --api-key-file")
	fl.StringVar(&f.keyFile, "api-key-file", "", "file holding the API key sent as Authorization: Bearer; not with --api-key (default: $INFERRAIL_API_KEY, else none)")
	fl.StringArrayVar(&f.headers, "header", nil, "extra header sent with every request, as 'Name: value' (repeatable; not Content-Type, Content-Length, Host or Transfer-Encoding; an Authorization header replaces $INFERRAIL_API_KEY and is refused beside --api-key or --api-key-file)")
	fl.StringVar(&f.endpoint, "endpoint", "completions", "API: completions (prompt text) or chat (one user message)")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Minute, "give up on a request after this long")
	fl.BoolVar(&f.closeAtDone, "close-at-done", false, "close each stream's response as soon as data: [DONE] arrives, as the OpenAI SDKs do, so that a server ending the response in a later write (vLLM's) loses the connection (default: read on to the response's end, 64 KiB and 50 ms at most, keeping the connection)")
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
	if err := f.resolveAuth(); err != nil {
		return fleet.Config{}, err
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
	out, err := bench.Run(ctx, bench.Config{
		BaseURL:     f.baseURL,
		APIKey:      f.key,
		Header:      f.header,
		Model:       f.model,
		Endpoint:    bench.Endpoint(f.endpoint),
		Source:      src,
		Warmup:      cfg.Warmup,
		SLO:         cfg.SLO,
		Timeout:     f.timeout,
		CloseAtDone: f.closeAtDone,
		Progress: func(done int) {
			finished = done
			bar.update(fleet.Progress{Finished: done, Created: done, Target: target})
		},
	})
	bar.update(fleet.Progress{Finished: finished, Target: target, Done: true})
	if errors.Is(err, bench.ErrConfig) {
		return usageError{err}
	}
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
	for _, w := range out.Warnings() {
		fmt.Fprintln(stderr, "warning: "+w)
	}
	if f.out != "" {
		if err := os.MkdirAll(f.out, 0o755); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
		var buf bytes.Buffer
		if err := results.WriteJSON(&buf, out.Report()); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(f.out, "summary.json"), buf.Bytes(), 0o644); err != nil {
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
	if err := out.WriteText(stdout); err != nil {
		return err
	}
	if f.out != "" {
		fmt.Fprintf(stdout, "wrote %s and %s\n", filepath.Join(f.out, "summary.json"), filepath.Join(f.out, "requests.parquet"))
	}
	return nil
}

// resolveAuth settles the key and headers to send. Flags beat the
// environment: the key is --api-key or --api-key-file (not both), else an
// Authorization given with --header, else $INFERRAIL_API_KEY, else none.
func (f *benchFlags) resolveAuth() error {
	f.header = nil
	for _, h := range f.headers {
		name, value, err := bench.ParseHeader(h)
		if err != nil {
			return usagef("--header %w", err)
		}
		if f.header == nil {
			f.header = http.Header{}
		}
		f.header[name] = append(f.header[name], value)
	}
	_, auth := f.header["Authorization"]
	switch {
	case f.apiKey != "" && f.keyFile != "":
		return usagef("--api-key and --api-key-file: give one of them")
	case auth && (f.apiKey != "" || f.keyFile != ""):
		return usagef("--header Authorization and --api-key or --api-key-file: give one of them")
	case f.apiKey != "":
		f.key = f.apiKey
		if strings.ContainsAny(f.key, " \t\r\n") {
			return usagef("--api-key: must be one key, without spaces")
		}
	case f.keyFile != "":
		b, err := os.ReadFile(f.keyFile)
		if err != nil {
			return usagef("--api-key-file: %w", err)
		}
		f.key = strings.TrimSpace(string(b))
		if f.key == "" || strings.ContainsAny(f.key, " \t\r\n") {
			return usagef("--api-key-file %s: must hold one key on one line", f.keyFile)
		}
	case !auth:
		f.key = os.Getenv("INFERRAIL_API_KEY")
	}
	return nil
}
