package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/internal/procs"
	"github.com/inferrail/inferrail/live"
	"github.com/inferrail/inferrail/live/config"
)

func newLiveCmd(stdout, stderr io.Writer, keepAwake func() error) *cobra.Command {
	var path string
	var check, watch bool
	cmd := &cobra.Command{
		Use:   "live",
		Short: "Run the OpenAI-compatible proxy that routes with the simulator's router",
		Long: `live is the production proxy: it forwards /v1/completions and
/v1/chat/completions byte for byte to the replica its policy picks (the same
router code the simulator runs: every policy, the approximate or the event-fed
KV index), streams responses back frame by frame, retries failures before the
first response byte on untried replicas, ejects replicas that keep failing,
caps each replica's concurrency, admits each request where its KV demand
fits or queues it (by priority, fairly across tenants) until it does,
scrapes every engine's /metrics, and serves its own metrics on the admin
address. Admission, the queue and the replicas' health are the simulator's
gateway core (router/gateway). The configuration is YAML
(examples/live.yaml shows every field); --check validates it, loads every
tokenizer and profile, prints what it would run and exits. SIGHUP, a change
of the file (--watch) and POST /admin/reload reload it without dropping a
request: replicas that stay keep their state and the KV index; settings
that need a restart are reported (docs/hot-reload.md).`,
		Example: `  inferrail live --config examples/live.yaml --check
  inferrail live --config examples/live.yaml
  kill -HUP "$(pgrep -f 'inferrail live')"    # reload the configuration
  curl -s 127.0.0.1:8080/v1/completions -d '{"prompt": "hello there ", "max_tokens": 8}'
  curl -s 127.0.0.1:9090/metrics | grep inferrail_requests_total`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, s, err := newLiveServer(path, stderr, serving(check, keepAwake))
			if err != nil {
				return err
			}
			defer s.Close()
			if check {
				fmt.Fprintf(stdout, "%s: ok\n%s", path, cfg.Summary())
				return nil
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			if watch {
				if _, err := s.WatchConfig(ctx); err != nil {
					return err
				}
			}
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			go s.ReloadOn(ctx, hup)
			return serveUntilSignal(ctx, cfg, s.Logger(), s.Serve)
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "YAML configuration (required)")
	cmd.Flags().BoolVar(&check, "check", false, "validate the configuration, load its tokenizers and profiles, print a summary and exit")
	cmd.Flags().BoolVar(&watch, "watch", true, "reload the configuration when its file changes (SIGHUP and POST /admin/reload reload it in any case)")
	return cmd
}

// newLiveServer loads the configuration at path and builds the server that
// live and epp run (every error is bad input: exit code 2). With sysmon:
// awake and a keepAwake, it first has the program executed again with Go's
// runtime monitor kept awake (internal/procs), before the server opens
// anything; keepAwake returns only when it did not (nothing was needed,
// or it could not: then the proxy runs on, as Go runs it, and says so).
func newLiveServer(path string, stderr io.Writer, keepAwake func() error) (*config.Config, *live.Server, error) {
	if path == "" {
		return nil, nil, usagef("--config is required (see examples/live.yaml)")
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, nil, usageError{err}
	}
	logger, err := live.NewLogger(cfg.Log, stderr)
	if err != nil {
		return nil, nil, usageError{err}
	}
	if keepAwake != nil && cfg.Sysmon == "awake" {
		if err := keepAwake(); err != nil {
			logger.Warn("sysmon: awake not applied: the runtime monitor runs as Go runs it", "error", err.Error())
		}
	}
	s, err := live.New(cfg, live.Deps{Notes: stderr, Logger: logger, Version: version(), ConfigPath: path})
	if err != nil {
		return nil, nil, usageError{err}
	}
	return cfg, s, nil
}

// serving is keepAwake for a command that serves, nil for --check.
func serving(check bool, keepAwake func() error) func() error {
	if check {
		return nil
	}
	return keepAwake
}

// adaptProcs runs internal/procs's controller, so the process uses as
// few processors as its load needs, until the function it returns is
// called, when on is set, the environment sets no GOMAXPROCS and the
// runtime gives more than one processor; onChange (if not nil) hears of
// each change, warn of the controller's end on an error.
func adaptProcs(on bool, onChange func(procs.Change), warn func(error)) (stop func()) {
	if !on || os.Getenv("GOMAXPROCS") != "" || runtime.GOMAXPROCS(0) <= 1 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- procs.Run(ctx, procs.Config{Max: runtime.GOMAXPROCS(0)}, onChange) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			warn(err)
		}
	}
}

// serveUntilSignal runs serve (live's Serve or ServeEPP) until the first
// SIGINT or SIGTERM, which drains; a second one cuts the drain delay short.
// A proxy's heap is small and its tail latency suffers from collections:
// it collects four times less often than Go's default unless GOGC says.
// With procs: adaptive (and no GOMAXPROCS in the environment) it runs on as
// few processors as its load needs (internal/procs).
func serveUntilSignal(parent context.Context, cfg *config.Config, log *slog.Logger, serve func(ctx context.Context, hurry <-chan struct{}) error) error {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	defer adaptProcs(cfg.Procs == "adaptive", func(c procs.Change) {
		log.Debug("processors", "from", c.From, "to", c.To, "max", c.Max, "cpu_cores", c.Sample.CPU, "wait_p99_ms", float64(c.Sample.WaitP99)/1e6)
	}, func(err error) { log.Warn("adaptive processors", "error", err.Error()) })()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	hurry := make(chan struct{})
	go func() {
		select {
		case <-sigs:
		case <-ctx.Done():
			return
		}
		cancel()
		select {
		case <-sigs:
			close(hurry)
		case <-time.After(cfg.DrainDelay + cfg.DrainTimeout + time.Second):
		}
	}()
	return serve(ctx, hurry)
}
