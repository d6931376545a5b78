package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/live"
	"github.com/inferrail/inferrail/live/config"
)

func newLiveCmd(stdout, stderr io.Writer) *cobra.Command {
	var path string
	var check bool
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
tokenizer and profile, prints what it would run and exits.`,
		Example: `  inferrail live --config examples/live.yaml --check
  inferrail live --config examples/live.yaml
  curl -s 127.0.0.1:8080/v1/completions -d '{"prompt": "hello there ", "max_tokens": 8}'
  curl -s 127.0.0.1:9090/metrics | grep inferrail_requests_total`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if path == "" {
				return usagef("--config is required (see examples/live.yaml)")
			}
			cfg, err := config.Load(path)
			if err != nil {
				return usageError{err}
			}
			s, err := live.New(cfg, live.Deps{Notes: stderr})
			if err != nil {
				return usageError{err}
			}
			defer s.Close()
			if check {
				fmt.Fprintf(stdout, "%s: ok\n%s", path, cfg.Summary())
				return nil
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runLive(ctx, cfg, s, stderr)
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "YAML configuration (required)")
	cmd.Flags().BoolVar(&check, "check", false, "validate the configuration, load its tokenizers and profiles, print a summary and exit")
	return cmd
}

// runLive serves s on the configured addresses until ctx ends, then drains.
func runLive(ctx context.Context, cfg *config.Config, s *live.Server, stderr io.Writer) error {
	// A proxy's heap is small and its tail latency suffers from collections:
	// collect four times less often than Go's default unless GOGC says.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (change listen in the configuration)", cfg.Listen, err)
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // h2c
	hs := &http.Server{Handler: s.Handler(), Protocols: &protocols, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	errs := make(chan error, 3)
	go func() { errs <- hs.Serve(ln) }()
	var admin *http.Server
	if cfg.AdminListen != "" {
		aln, err := net.Listen("tcp", cfg.AdminListen)
		if err != nil {
			hs.Close()
			return fmt.Errorf("listen on %s: %w (change admin_listen in the configuration)", cfg.AdminListen, err)
		}
		admin = &http.Server{Handler: s.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { errs <- admin.Serve(aln) }()
	}
	bgCtx, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	bgDone := make(chan error, 1)
	go func() { bgDone <- s.Run(bgCtx) }()
	fmt.Fprintf(stderr, "inferrail live: serving on http://%s (admin http://%s)\n", ln.Addr(), cfg.AdminListen)
	select {
	case err := <-errs:
		stopBG()
		<-bgDone
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	fmt.Fprintf(stderr, "inferrail live: draining (up to %s)\n", cfg.DrainTimeout)
	dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	if err := hs.Shutdown(dctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintf(stderr, "inferrail live: shutdown: %v\n", err)
	}
	hs.Close()
	if admin != nil {
		admin.Close()
	}
	stopBG()
	return <-bgDone
}
