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

	"github.com/inferrail/inferrail/calibrate"
	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/live"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/tokenize"
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
caps each replica's concurrency and queue, scrapes every engine's /metrics,
and serves its own metrics on the admin address. The configuration is YAML
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
			opts, closeLog, err := liveOptions(cfg)
			if err != nil {
				return usageError{err}
			}
			defer closeLog()
			if check {
				fmt.Fprintf(stdout, "%s: ok\n%s", path, cfg.Summary())
				return nil
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runLive(ctx, cfg, opts, stderr)
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "YAML configuration (required)")
	cmd.Flags().BoolVar(&check, "check", false, "validate the configuration, load its tokenizers and profiles, print a summary and exit")
	return cmd
}

// liveOptions turns the configuration into the proxy's options, loading
// tokenizers, profiles and the decision log file.
func liveOptions(c *config.Config) (live.Options, func(), error) {
	o := live.DefaultOptions()
	o.RequestTimeout = c.RequestTimeout
	o.MaxBodyBytes = int64(c.MaxBodyBytes)
	o.Attempts, o.Backoff, o.MaxBackoff = c.Retry.Attempts, c.Retry.Backoff, c.Retry.MaxBackoff
	h := c.Health
	o.Health = live.HealthOptions{Interval: h.Interval, Timeout: h.Timeout, Path: h.Path, EjectAfter: h.EjectAfter,
		EjectTime: h.EjectTime, MaxEjectTime: h.MaxEjectTime, MaxEjectedShare: h.MaxEjectedShare}
	o.Scrape = live.ScrapeOptions{Interval: c.Scrape.Interval, Timeout: c.Scrape.Timeout, MaxBytes: int64(c.Scrape.MaxBytes), MaxAge: c.Scrape.MaxAge}
	o.Tokenize = live.TokenizeOptions{Workers: c.Tokenize.Workers, Queue: c.Tokenize.Queue, Timeout: c.Tokenize.Timeout}
	o.DNSRefresh = c.DNSRefresh
	o.Seed = c.Seed
	closeLog := func() {}
	if c.DecisionLog.Path != "" {
		f, err := os.OpenFile(c.DecisionLog.Path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return o, closeLog, fmt.Errorf("decision_log.path: %w", err)
		}
		o.DecisionLog, o.DecisionLogSample, o.DecisionLogBuffer = f, c.DecisionLog.Sample, c.DecisionLog.Buffer
		closeLog = func() { f.Close() }
	}
	for i := range c.Models {
		m := &c.Models[i]
		tok, err := tokenize.LoadModel(m.Tokenizer, tokenize.Options{})
		if err != nil {
			closeLog()
			return o, func() {}, fmt.Errorf("models[%d].tokenizer: %w", i, err)
		}
		ec := engine.DefaultConfig()
		if m.Profile != "" {
			if ec, err = calibrate.ResolveProfile(m.Profile); err != nil {
				closeLog()
				return o, func() {}, fmt.Errorf("models[%d].profile: %w", i, err)
			}
		}
		ec.BlockSize = m.BlockSize
		mo := live.ModelOptions{
			Name: m.Name, Aliases: m.Aliases, Policy: m.Policy, Encoder: tok, Index: router.IndexMode(m.Index),
			Engine: ec, SessionAffinity: m.SessionAffinity, MaxConcurrency: m.MaxConcurrency, MaxPending: m.MaxPending,
		}
		for j := range m.Replicas {
			r := &m.Replicas[j]
			mc, mp := m.Limits(r)
			mo.Replicas = append(mo.Replicas, live.ReplicaOptions{Name: r.Name, URL: r.URL, MaxConcurrency: mc, MaxPending: mp,
				KVEvents: r.KVEvents, KVEventsReplay: r.KVEventsReplay, KVEventsTopic: r.KVEventsTopic})
		}
		for _, g := range m.DNS {
			mo.DNS = append(mo.DNS, live.DNSGroup{Name: g.Name, Host: g.Host, Scheme: g.Scheme, Port: g.Port,
				KVEventsPort: g.KVEventsPort, KVEventsReplayPort: g.KVEventsReplayPort, KVEventsTopic: g.KVEventsTopic})
		}
		o.Models = append(o.Models, mo)
	}
	return o, closeLog, nil
}

func runLive(ctx context.Context, cfg *config.Config, opts live.Options, stderr io.Writer) error {
	// A proxy's heap is small and its tail latency suffers from collections:
	// collect four times less often than Go's default unless GOGC says.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	s, err := live.New(opts)
	if err != nil {
		return usageError{err}
	}
	defer s.Close()
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
