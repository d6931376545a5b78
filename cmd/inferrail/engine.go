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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/calibrate"
	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
)

type engineFlags struct {
	host, profile        string
	port                 int
	models               []string
	blockSize, gpuBlocks int
	maxSeqs, maxBatched  int
	maxModelLen          int
	dataParallel         int
	expertParallel       bool
	noPrefixCaching      bool
	promptTokensDetails  bool
	kvEventsConfig       string
	kvTransferConfig     string
	outputTokens         int
	responsesStore       int
	apiKeyFile           string
	seed                 uint64
	faults               server.Faults
	drain                time.Duration
	procs, sysmon        string
}

func newEngineCmd(stdout, stderr io.Writer, keepAwake func() error) *cobra.Command {
	var f engineFlags
	cmd := &cobra.Command{
		Use:   "engine",
		Short: "Run a mock vLLM server: the simulator's engine model on real time",
		Long: `engine serves vLLM's OpenAI-compatible API (/v1/completions,
/v1/chat/completions, /v1/responses, /v1/models, /health, /version, /metrics,
/reset_prefix_cache) from the same engine model the simulator runs, on
wall-clock time: continuous batching, chunked prefill, a prefix cache, step
times from the profile. Prompts are tokenized with the builtin:sim tokenizer
(one token per space-terminated word); the mock model writes deterministic
words, exactly max_tokens of them with ignore_eos (or min(max_tokens,
--output-tokens) without). Flags named as vLLM names them override the
profile. A client that goes away has its request aborted at once.

Like inferrail live, it runs on as few processors as its load needs
(--procs adaptive) with Go's runtime monitor kept awake (--sysmon awake):
on a machine it shares with a load generator and a gateway, a mock engine
that spends less CPU on waking threads disturbs their measurements less.`,
		Example: `  inferrail engine --port 8000
  inferrail engine --port 8001 --profile my-gpu.yaml --served-model-name llama --max-num-seqs 64
  inferrail engine --port 8003 --data-parallel-size 2 --enable-expert-parallel
  inferrail engine --port 8004 --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'
  inferrail engine --port 8002 --enable-prompt-tokens-details \
      --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:5557"}'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config(cmd)
			if err != nil {
				return err
			}
			// Before anything is opened: the program may be executed again.
			if keepAwake != nil && f.sysmon == "awake" {
				if err := keepAwake(); err != nil {
					fmt.Fprintf(stderr, "inferrail engine: --sysmon awake not applied (%v): the runtime monitor runs as Go runs it\n", err)
				}
			}
			defer adaptProcs(f.procs == "adaptive", nil, func(err error) {
				fmt.Fprintf(stderr, "inferrail engine: adaptive processors: %v\n", err)
			})()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runEngine(ctx, f, cfg, stderr)
		},
	}
	f.addFlags(cmd)
	return cmd
}

// addFlags registers the engine command's flags on cmd.
func (f *engineFlags) addFlags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.host, "host", "127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
	fl.IntVar(&f.port, "port", 8000, "port to listen on")
	fl.StringVar(&f.profile, "profile", "", "engine profile: a YAML file (scheduler limits, KV blocks, latency model) or a preset MODEL@GPU (inferrail calibrate --list-presets); default: an 8B model on one 24 GB GPU")
	fl.StringSliceVar(&f.models, "served-model-name", nil, "model names served (the first is reported in responses); default "+server.DefaultModelName)
	fl.IntVar(&f.blockSize, "block-size", 0, "tokens per KV block (overrides the profile)")
	fl.IntVar(&f.gpuBlocks, "num-gpu-blocks-override", 0, "KV blocks (overrides the profile)")
	fl.IntVar(&f.maxSeqs, "max-num-seqs", 0, "running sequences per step (overrides the profile)")
	fl.IntVar(&f.maxBatched, "max-num-batched-tokens", 0, "token budget per step (overrides the profile)")
	fl.IntVar(&f.maxModelLen, "max-model-len", 0, "longest prompt + max_tokens (overrides the profile)")
	fl.IntVar(&f.dataParallel, "data-parallel-size", 0, "engine ranks behind the one address, balanced as vLLM's internal load balancer does; the limits above are per rank (overrides the profile)")
	fl.BoolVar(&f.expertParallel, "enable-expert-parallel", false, "with --data-parallel-size > 1, the ranks step in lockstep as an expert-parallel MoE model does")
	fl.BoolVar(&f.noPrefixCaching, "no-enable-prefix-caching", false, "turn the prefix cache off")
	fl.BoolVar(&f.promptTokensDetails, "enable-prompt-tokens-details", false, "report usage.prompt_tokens_details.cached_tokens")
	fl.StringVar(&f.kvEventsConfig, "kv-events-config", "", `KV cache events, as vLLM's JSON: {"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv"}`)
	fl.StringVar(&f.kvTransferConfig, "kv-transfer-config", "", `disaggregated prefill/decode, as vLLM's JSON: {"kv_connector":"NixlConnector","kv_role":"kv_producer"} (kv_consumer, kv_both; see docs/pd-live.md)`)
	fl.IntVar(&f.outputTokens, "output-tokens", 256, "where the mock model stops without ignore_eos (0: it never stops before max_tokens)")
	fl.StringVar(&f.apiKeyFile, "api-key-file", "", "file holding the API key requests under /v1 must carry as Authorization: Bearer, as vLLM's --api-key (default: $VLLM_API_KEY, else none)")
	fl.IntVar(&f.responsesStore, "responses-store", 0, "Responses API responses kept for GET /v1/responses/{id} and previous_response_id, the oldest dropped first (vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1), a background stream's events with it (one per output token, for GET ?stream=true); 0 keeps none and ignores store: true, as vLLM does by default")
	fl.Uint64Var(&f.seed, "seed", 0, "seed for generated text and injected faults")
	fl.Float64Var(&f.faults.ErrorRate, "fault-error-rate", 0, "share of generation requests answered with --fault-error-status")
	fl.IntVar(&f.faults.ErrorStatus, "fault-error-status", 500, "status code of injected errors")
	fl.Float64Var(&f.faults.CloseRate, "fault-close-rate", 0, "share of generation requests whose connection is closed before an answer")
	fl.Float64Var(&f.faults.HangRate, "fault-hang-rate", 0, "share of generation requests never answered")
	fl.Float64Var(&f.faults.StallRate, "fault-stall-rate", 0, "share of streams that stop after half their tokens and stay open")
	fl.BoolVar(&f.faults.GarbageMetrics, "fault-garbage-metrics", false, "serve an unparsable /metrics page")
	fl.DurationVar(&f.drain, "drain-timeout", 30*time.Second, "on SIGTERM, how long running requests may take to finish")
	fl.StringVar(&f.procs, "procs", "adaptive", "processors Go code runs on: adaptive (as few as the load needs, up to GOMAXPROCS's default) or fixed (Go's default); GOMAXPROCS in the environment overrides both")
	fl.StringVar(&f.sysmon, "sysmon", "awake", "Go's runtime monitor: awake (kept from its deep sleep, fewer thread wake-ups at light load; the program executes itself once at start with GODEBUG=schedtrace set) or go (as Go runs it)")
}

func (f *engineFlags) config(cmd *cobra.Command) (server.Config, error) {
	ec := engine.DefaultConfig()
	if f.profile != "" {
		c, err := calibrate.ResolveProfile(f.profile)
		if err != nil {
			return server.Config{}, usagef("--profile: %w", err)
		}
		ec = c
	}
	set := func(name string, v int, dst *int) {
		if cmd.Flags().Changed(name) {
			*dst = v
		}
	}
	set("block-size", f.blockSize, &ec.BlockSize)
	set("num-gpu-blocks-override", f.gpuBlocks, &ec.NumGPUBlocks)
	set("max-num-seqs", f.maxSeqs, &ec.MaxNumSeqs)
	set("max-num-batched-tokens", f.maxBatched, &ec.MaxNumBatchedTokens)
	set("max-model-len", f.maxModelLen, &ec.MaxModelLen)
	set("data-parallel-size", f.dataParallel, &ec.DataParallelSize)
	if f.noPrefixCaching {
		ec.DisablePrefixCaching = true
	}
	if f.expertParallel {
		ec.ExpertParallel = true
	}
	if f.port < 0 || f.port > 65535 {
		return server.Config{}, usagef("--port %d: must be within 0..65535", f.port)
	}
	if f.drain < 0 {
		return server.Config{}, usagef("--drain-timeout: must be zero (close at once) or positive, got %v", f.drain)
	}
	if f.responsesStore < 0 {
		return server.Config{}, usagef("--responses-store %d: must be 0 (keep no responses, vLLM's default) or the number of responses to keep", f.responsesStore)
	}
	if f.procs != "adaptive" && f.procs != "fixed" {
		return server.Config{}, usagef("--procs: must be adaptive or fixed, got %q", f.procs)
	}
	apiKey := strings.TrimSpace(os.Getenv("VLLM_API_KEY"))
	if f.apiKeyFile != "" {
		b, err := os.ReadFile(f.apiKeyFile)
		if err != nil {
			return server.Config{}, usagef("--api-key-file: %w", err)
		}
		if apiKey = strings.TrimSpace(string(b)); apiKey == "" || strings.ContainsAny(apiKey, " \t\r\n") {
			return server.Config{}, usagef("--api-key-file %s: must hold one key on one line", f.apiKeyFile)
		}
	}
	if f.sysmon != "awake" && f.sysmon != "go" {
		return server.Config{}, usagef("--sysmon: must be awake or go, got %q", f.sysmon)
	}
	kvt, err := server.ParseKVTransferConfig(f.kvTransferConfig)
	if err != nil {
		return server.Config{}, usagef("--kv-transfer-config: %w", err)
	}
	cfg := server.Config{
		KVTransfer:                kvt,
		Engine:                    ec,
		ServedModelNames:          f.models,
		EnablePromptTokensDetails: f.promptTokensDetails,
		OutputTokens:              f.outputTokens,
		ResponsesStore:            f.responsesStore,
		APIKey:                    apiKey,
		Seed:                      f.seed,
		Version:                   buildVersion,
		Faults:                    f.faults,
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{err}
	}
	return cfg, nil
}

func runEngine(ctx context.Context, f engineFlags, cfg server.Config, stderr io.Writer) error {
	closeEvents, err := attachKVEvents(ctx, f.kvEventsConfig, &cfg)
	if err != nil {
		return err
	}
	defer closeEvents()
	srv, err := server.New(cfg)
	if err != nil {
		return usageError{err}
	}
	addr := net.JoinHostPort(f.host, strconv.Itoa(f.port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (choose another --port or --host)", addr, err)
	}
	engCtx, stopEngine := context.WithCancel(context.WithoutCancel(ctx))
	defer stopEngine()
	engineErr := make(chan error, 1)
	go func() { engineErr <- srv.Run(engCtx) }()
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	names := cfg.ServedModelNames
	if len(names) == 0 {
		names = []string{server.DefaultModelName}
	}
	ranks := ""
	if n := cfg.Engine.Ranks(); n > 1 {
		ranks = fmt.Sprintf("%d data-parallel ranks of ", n)
		if cfg.Engine.ExpertParallel {
			ranks = fmt.Sprintf("%d expert-parallel ranks in lockstep, each of ", n)
		}
	}
	fmt.Fprintf(stderr, "inferrail engine: serving %s on http://%s (%s%d KV blocks of %d tokens, max_num_seqs %d)\n",
		strings.Join(names, ", "), ln.Addr(), ranks, cfg.Engine.NumGPUBlocks, cfg.Engine.BlockSize, cfg.Engine.MaxNumSeqs)
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case err := <-engineErr:
		hs.Close()
		return fmt.Errorf("engine: %w", err)
	case <-ctx.Done():
	}
	fmt.Fprintf(stderr, "inferrail engine: draining (up to %s)\n", f.drain)
	sctx, cancel := context.WithTimeout(context.Background(), f.drain)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	hs.Close()
	stopEngine()
	return <-engineErr
}
