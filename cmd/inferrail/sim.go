package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/inferrail/inferrail/calibrate"
	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/traces"
	"github.com/inferrail/inferrail/workload"
)

// Bounds of the flags that size a run, far above any real study: they stop a
// typo (1e12 for 1e2, 1ns for 1s) from running for days or exhausting memory.
const (
	// maxRequests is the workload's bound of a run.
	maxRequests = workload.MaxRequests
	// minSpeedup and maxSpeedup bound a trace replay's speedup: below, a
	// day of trace lasts years of virtual time; above, a day of arrivals
	// falls within a tenth of a second.
	minSpeedup, maxSpeedup = 1e-3, 1e6
)

type simFlags struct {
	workload       string
	workloadFile   string
	policy         string
	replicas       int
	rate           float64
	requests       int
	duration       time.Duration
	warmup         time.Duration
	seed           uint64
	profile        string
	scrapeInterval time.Duration
	slo            string
	trace          string
	traceFormat    string
	speedup        float64
	rateScale      float64
	start, end     time.Duration
	limit          int
	skipBad        bool
	sloTTFT        time.Duration
	sloTPOT        time.Duration
	index          string
	kvEventDelay   time.Duration
	speculationTTL time.Duration
	affinity       bool
	sets           []string
	json           bool
	out            string
	explainSample  float64
	explainOut     string
	gw             gatewayFlags
	pd             pdFlags
	// fixedReplicas, when set, is the fleet size and --replicas is not
	// registered (capacity searches the fleet size; its default rate is that
	// of this many replicas).
	fixedReplicas int
	// requestsHelp and rateHelp describe the defaults of --requests and
	// --rate for the command ("" for sim's).
	requestsHelp, rateHelp string
}

// gatewayFlags are the gateway's admission, queue and scale-out, for sim,
// compare and capacity.
type gatewayFlags struct {
	registered   bool
	admission    string
	overcommit   float64
	outQuantile  float64
	queueTimeout time.Duration
	queueMax     int
	maxPriority  int
	mix          string
	gateways     int
	ledger       string
	limits       string
	// limitsList lets --limits list several switches (compare).
	limitsList bool
}

func (g *gatewayFlags) register(cmd *cobra.Command) {
	d := fleet.DefaultConfig()
	fl := cmd.Flags()
	g.registered = true
	fl.StringVar(&g.admission, "admission", string(d.Admission), "admission before routing: "+strings.Join(gateway.Admissions(), ", "))
	fl.Float64Var(&g.overcommit, "overcommit", d.Overcommit, "kv admission: share of each replica's KV capacity that reservations may fill, in (0, 4]")
	fl.Float64Var(&g.outQuantile, "output-quantile", d.OutputQuantile, "kv admission: reserve this quantile of the answer lengths seen so far for each request's output, at most its max_tokens (0: always max_tokens)")
	fl.DurationVar(&g.queueTimeout, "queue-timeout", d.QueueTimeout, "longest wait in the gateway's queue before a 429")
	fl.IntVar(&g.queueMax, "queue-max", d.QueueMaxRequests, "requests the gateway's queue holds (0: reject what no replica admits at once)")
	fl.IntVar(&g.maxPriority, "max-priority", d.MaxPriority, "highest priority class (requests' priorities are capped at it)")
	fl.StringVar(&g.mix, "mix", "", "tenants and priorities of the requests, as tenant:priority:share,... e.g. batch:0:0.7,chat:5:0.3")
	fl.IntVar(&g.gateways, "gateways", d.Gateways, "gateway cores in front of the fleet, each with its own view and scrape phase")
	fl.StringVar(&g.ledger, "ledger", d.Ledger, "with several gateways: shared (one reservation ledger) or independent (one each)")
	help := "the workload's per-tenant rate limits (its tenants: section): on or off"
	if g.limitsList {
		help += ", or on,off to compare both"
	}
	fl.StringVar(&g.limits, "limits", fleet.LimitsOn, help)
}

// limitSwitches parses --limits: on, off, or (compare) a list of them.
func (g *gatewayFlags) limitSwitches() ([]string, error) {
	var out []string
	for _, v := range strings.Split(g.limits, ",") {
		v = strings.TrimSpace(v)
		if v != fleet.LimitsOn && v != fleet.LimitsOff {
			return nil, usagef("--limits: want %s or %s, got %q", fleet.LimitsOn, fleet.LimitsOff, v)
		}
		if slices.Contains(out, v) {
			return nil, usagef("--limits: %q listed twice", v)
		}
		out = append(out, v)
	}
	if len(out) > 1 && !g.limitsList {
		return nil, usagef("--limits: want %s or %s, got %q (only compare runs both)", fleet.LimitsOn, fleet.LimitsOff, g.limits)
	}
	return out, nil
}

// apply checks the gateway flags and sets them on cfg.
func (g *gatewayFlags) apply(cfg *fleet.Config, wl *workload.Config) error {
	if !g.registered {
		return nil
	}
	a, err := gateway.ParseAdmission(g.admission)
	if err != nil {
		return usagef("--admission: %w", err)
	}
	cfg.Admission = a
	if !(g.overcommit > 0 && g.overcommit <= 4) {
		return usagef("--overcommit: must be in (0, 4], got %v", g.overcommit)
	}
	cfg.Overcommit = g.overcommit
	if !(g.outQuantile >= 0 && g.outQuantile <= 1) {
		return usagef("--output-quantile: must be in [0, 1], got %v", g.outQuantile)
	}
	cfg.OutputQuantile = g.outQuantile
	if g.queueTimeout <= 0 {
		return usagef("--queue-timeout: must be positive, got %v", g.queueTimeout)
	}
	cfg.QueueTimeout = g.queueTimeout
	if g.queueMax < 0 || g.queueMax > gateway.MaxQueueRequests {
		return usagef("--queue-max: must be between 0 and %d, got %d", gateway.MaxQueueRequests, g.queueMax)
	}
	cfg.QueueMaxRequests = g.queueMax
	if g.maxPriority < 0 || g.maxPriority > gateway.MaxPriorityLimit {
		return usagef("--max-priority: must be between 0 and %d, got %d", gateway.MaxPriorityLimit, g.maxPriority)
	}
	cfg.MaxPriority = g.maxPriority
	if g.mix != "" {
		mix, err := workload.ParseMix(g.mix)
		if err != nil {
			return usagef("--mix: %w", err)
		}
		wl.Mix = mix
	}
	if g.gateways < 1 || g.gateways > fleet.MaxGateways {
		return usagef("--gateways: must be between 1 and %d, got %d", fleet.MaxGateways, g.gateways)
	}
	cfg.Gateways = g.gateways
	if g.ledger != fleet.LedgerShared && g.ledger != fleet.LedgerIndependent {
		return usagef("--ledger: must be %s or %s, got %q", fleet.LedgerShared, fleet.LedgerIndependent, g.ledger)
	}
	cfg.Ledger = g.ledger
	lims, err := g.limitSwitches()
	if err != nil {
		return err
	}
	cfg.NoLimits = lims[0] == fleet.LimitsOff
	return nil
}

// checkLimits refuses --limits where no tenant has limits.
func (g *gatewayFlags) checkLimits(cmd *cobra.Command, cfg *fleet.Config) error {
	if !g.registered || !cmd.Flags().Changed("limits") {
		return nil
	}
	if cfg.Source != nil {
		return usagef("--limits: does not apply to --trace (tenant limits come with a synthetic workload's tenants:)")
	}
	if cfg.Workload.Tenants.Limited() {
		return nil
	}
	return usagef("--limits: the workload gives no tenant a limit (add a tenants: section to the workload file, or --set tenants.TENANT.rpm=N)")
}

func newSimCmd(stdout, stderr io.Writer) *cobra.Command {
	var f simFlags
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate a fleet of vLLM engines behind the router on virtual time",
		Long: `sim runs the real router (policy, load view) against a virtual fleet of vLLM
engines fed by a synthetic workload, and prints a summary of latencies, prefix
cache hit rate and SLO attainment.

Workloads: w1 (shared system prompts), w2 (multi-turn chat, closed loop),
w6 (prompts that share nothing). Every workload parameter can be set in a YAML
file (--workload-file) or one by one with --set (for example
--set w1.prompts=64 --set output.median=300). Without --rate, the rate is the
workload's default for the fleet: its per-replica rate on the default engine
profile (about 70% of what round robin sustains there) times --replicas,
scaled by how much more an engine of --profile serves (README "Default rates").

The summary counts the requests that did not complete and says why (e.g. a
prompt + max_tokens over the profile's max_model_len), and warns when the run
looks too short for its answer: when the TTFT p99 of the second half of the
measured window is well above the first half's, the backlog grows, or a closed
loop (w2, w3) arrives well below its rate (README "The summary" states the rule).

A workload file may give tenants of its mix rate limits (tenants:, see
examples/tenants-noisy.yaml): a request over its tenant's rpm, tpm or
max_concurrency is refused at once (rejected, reason rate_limited) and the
summary has a per-tenant breakdown. --limits off runs the same traffic without
the limits; --set 'without_tenants=[noisy]' leaves a tenant out.

A run uses two cores where it may (the router's KV index updates on the second
while the engines step, which also takes their prefix-cache insertions and the
trace's hashing when it has time; the results are the same bytes): with several sims side
by side on a small machine, GOMAXPROCS=1 keeps each to one.`,
		Example: `  inferrail sim --workload w1 --policy round_robin
  inferrail sim --workload w2 --replicas 8 --requests 20000 --json
  inferrail sim --workload w6 --rate 12 --duration 10m --out runs/w6
  inferrail sim --workload-file my-workload.yaml --profile my-gpu.yaml
  inferrail sim --workload-file examples/tenants-noisy.yaml --policy cost_model --limits off`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if policies := strings.Split(f.policy, ","); len(policies) > 1 {
				return runSims(cmd, f, policies, stdout, stderr)
			}
			cfg, err := f.config(cmd)
			if err != nil {
				return err
			}
			return runSim(cfg, f, stdout, stderr)
		},
	}
	fl := cmd.Flags()
	f.register(cmd, "the run")
	f.gw.register(cmd)
	fl.StringVar(&f.policy, "policy", "round_robin", "routing policy, or several comma-separated (each run on the same requests, one table): "+strings.Join(router.Names(), ", "))
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the workload and the router; the same seed gives the same result")
	fl.BoolVar(&f.affinity, "session-affinity", false, "cost_model keeps a session on its previous replica unless that is 25% slower")
	fl.BoolVar(&f.json, "json", false, "print the summary as one JSON object on stdout (progress stays on stderr)")
	fl.StringVar(&f.out, "out", "", "directory to write summary.json and requests.parquet into")
	fl.Float64Var(&f.explainSample, "explain-sample", 0, "share of requests (sampled by id) whose routing decision is explained into --explain-out, in (0, 1]")
	fl.StringVar(&f.explainOut, "explain-out", "", "file to write the sampled decisions' explanations into, one JSON object a line (the schema of live's POST /admin/explain)")
	return cmd
}

// register adds the flags that describe the traffic, the fleet and the SLO,
// shared by sim, compare and capacity.
func (f *simFlags) register(cmd *cobra.Command, what string) {
	fl := cmd.Flags()
	fl.StringVar(&f.workload, "workload", "w1", "workload: "+strings.Join(workload.Names(), ", "))
	fl.StringVar(&f.workloadFile, "workload-file", "", "YAML file with workload parameters (its workload key selects the workload)")
	fl.StringArrayVar(&f.sets, "set", nil, "override one workload parameter, as yaml.path=value (repeatable)")
	if f.fixedReplicas > 0 {
		f.replicas = f.fixedReplicas
	} else {
		fl.IntVar(&f.replicas, "replicas", fleet.DefaultConfig().Replicas, "number of engines in the fleet")
	}
	f.pd.register(cmd, f.fixedReplicas == 0)
	rateHelp := f.rateHelp
	if rateHelp == "" {
		rateHelp = "the workload's default rate for --replicas engines of --profile: about 70% of what round robin sustains, see README \"Default rates\""
	}
	fl.Float64Var(&f.rate, "rate", 0, "offered load in requests per second (default: "+rateHelp+")")
	requestsHelp := f.requestsHelp
	if requestsHelp == "" {
		requestsHelp = fmt.Sprintf("%d, %d for w7", fleet.DefaultRequests("w1"), fleet.DefaultRequests("w7"))
	}
	fl.IntVar(&f.requests, "requests", 0, "requests per simulation (default "+requestsHelp+", or unlimited with --duration)")
	fl.DurationVar(&f.duration, "duration", 0, "stop arrivals after this much virtual time, e.g. 10m")
	fl.DurationVar(&f.warmup, "warmup", 0, "leave requests arriving before this virtual time out of "+what)
	fl.StringVar(&f.profile, "profile", "", "engine profile: a YAML file (scheduler limits, KV blocks, latency model) or a preset MODEL@GPU (inferrail calibrate --list-presets); default: an 8B model on one 24 GB GPU")
	fl.DurationVar(&f.scrapeInterval, "scrape-interval", 100*time.Millisecond, "how often the router reads each engine's metrics")
	fl.StringVar(&f.index, "index", "approximate", "KV index: approximate (learns from routing decisions) or events (fed by the engines' KV events)")
	fl.DurationVar(&f.kvEventDelay, "kv-event-delay", 50*time.Millisecond, "how late KV events reach the router (--index events)")
	fl.DurationVar(&f.speculationTTL, "speculation-ttl", 2*time.Second, "how long a routing decision stands in for the KV events it predicts (--index events)")
	fl.DurationVar(&f.sloTTFT, "slo-ttft", 2*time.Second, "SLO: time to first token at p99")
	fl.DurationVar(&f.sloTPOT, "slo-tpot", 100*time.Millisecond, "SLO: time per output token at p99")
	fl.StringVar(&f.slo, "slo", "", "SLO as ttft_p99=DURATION,tpot_p99=DURATION (overrides --slo-ttft and --slo-tpot)")
	fl.StringVar(&f.trace, "trace", "", "replay this trace file (or vLLM log directory) open-loop instead of a synthetic workload")
	fl.StringVar(&f.traceFormat, "trace-format", "", "trace format: "+strings.Join(traces.Formats(), ", ")+" (default: detected)")
	fl.Float64Var(&f.speedup, "speedup", 1, "play the trace this many times faster")
	fl.Float64Var(&f.rateScale, "rate-scale", 1, "keep this share (0-1] of the trace's requests, chosen at random with the seed")
	fl.DurationVar(&f.start, "start", 0, "replay the trace from this point of its own clock")
	fl.DurationVar(&f.end, "end", 0, "replay the trace up to this point of its own clock (default: its end)")
	fl.IntVar(&f.limit, "limit", 0, "replay at most this many requests of the trace")
	fl.BoolVar(&f.skipBad, "skip-bad", false, "skip and count malformed trace records instead of stopping at the first")
}

// traceSource checks the trace flags and the file, and returns the factory
// that opens a fresh replay for each run.
func (f *simFlags) traceSource(cmd *cobra.Command, model string) (func(uint64) (workload.Source, error), string, error) {
	fl := cmd.Flags()
	for _, name := range []string{"workload", "workload-file", "set", "rate", "rates", "requests", "duration"} {
		if fl.Changed(name) {
			return nil, "", usagef("--%s: does not apply to --trace (the trace gives the requests and their times; see --speedup, --rate-scale, --start, --end, --limit)", name)
		}
	}
	if !(f.speedup >= minSpeedup && f.speedup <= maxSpeedup) {
		return nil, "", usagef("--speedup: must be between %g and %g, got %v (it divides the trace's arrival times: below %g a day of trace lasts years of virtual time)", minSpeedup, maxSpeedup, f.speedup, minSpeedup)
	}
	if !(f.rateScale > 0 && f.rateScale <= 1) {
		return nil, "", usagef("--rate-scale: must be in (0, 1], got %v (it keeps that share of the trace's requests; use --speedup to raise the rate)", f.rateScale)
	}
	if f.limit < 0 || f.limit > maxRequests {
		return nil, "", usagef("--limit: must be between 0 (the whole trace) and %d, got %d", maxRequests, f.limit)
	}
	format := f.traceFormat
	if format == "" {
		d, err := traces.Detect(f.trace)
		if err != nil {
			return nil, "", usagef("--trace: %w (name it with --trace-format)", err)
		}
		format = d
	}
	opts := traces.ReplayOptions{Speedup: f.speedup, RateScale: f.rateScale, Start: f.start, End: f.end, Limit: f.limit, Model: model}
	if err := opts.Validate(); err != nil {
		return nil, "", usageError{err}
	}
	r, c, err := traces.Open(f.trace, format, traces.Options{SkipBad: f.skipBad})
	if err != nil {
		return nil, "", usagef("--trace: %w", err)
	}
	if _, err := r.Next(); err != nil {
		c.Close()
		if bad := f.badTrace(err); bad != nil {
			return nil, "", bad
		}
		if errors.Is(err, io.EOF) {
			hint := "a header and no records"
			if f.skipBad {
				hint = "no records, or only malformed ones that --skip-bad skipped"
			}
			return nil, "", usagef("--trace: %s holds no requests (%s): give a trace with at least one record", f.trace, hint)
		}
		return nil, "", usagef("--trace: %w", err)
	}
	c.Close()
	path, skip := f.trace, f.skipBad
	open := func(seed uint64) (workload.Source, error) {
		r, c, err := traces.Open(path, format, traces.Options{SkipBad: skip})
		if err != nil {
			return nil, err
		}
		o := opts
		o.Seed = seed
		src, err := traces.NewSource(r, o)
		if err != nil {
			c.Close()
			return nil, err
		}
		src.CloseAtEnd(c)
		return src, nil
	}
	return open, "trace:" + filepath.Base(strings.TrimRight(path, "/")), nil
}

// badTrace makes a malformed record of --trace bad input, nil for other errors.
func (f *simFlags) badTrace(err error) error {
	return badTrace(err, "--trace", f.trace, "--trace-format", f.skipBad)
}

// traceOnly are the flags that shape a trace replay.
var traceOnly = []string{"trace-format", "speedup", "rate-scale", "start", "end", "limit", "skip-bad"}

// config turns flags into a validated fleet configuration; every error is a usage error.
func (f *simFlags) config(cmd *cobra.Command) (fleet.Config, error) {
	cfg := fleet.DefaultConfig()
	var (
		wl  workload.Config
		err error
	)
	rateSet := false
	if f.workloadFile != "" {
		if cmd.Flags().Changed("workload") {
			return cfg, usagef("--workload and --workload-file: give one (the file's `workload:` key selects it)")
		}
		wl, err = workload.LoadConfig(f.workloadFile)
		if err != nil {
			return cfg, usagef("--workload-file: %w", err)
		}
		rateSet = yamlHasKey(f.workloadFile, "rate")
	} else {
		wl, err = workload.DefaultConfig(f.workload)
		if err != nil {
			return cfg, usagef("--workload: %w", err)
		}
		wl.Requests = fleet.DefaultRequests(wl.Workload)
	}
	for _, s := range f.sets {
		if err := applySet(&wl, s); err != nil {
			return cfg, usagef("--set %s: %w", s, err)
		}
		if strings.HasPrefix(s, "rate=") {
			rateSet = true
		}
	}
	fl := cmd.Flags()
	if f.trace == "" {
		for _, name := range traceOnly {
			if fl.Changed(name) {
				return cfg, usagef("--%s: applies only with --trace (it shapes a trace replay)", name)
			}
		}
	}
	if fl.Changed("seed") || f.workloadFile == "" {
		cfg.Seed = f.seed
	} else {
		cfg.Seed = wl.Seed
	}
	if f.profile != "" {
		ec, err := calibrate.ResolveProfile(f.profile)
		if err != nil {
			return cfg, usagef("--profile: %w", err)
		}
		cfg.Engine = ec
	}
	switch {
	case fl.Changed("rate"):
		wl.Rate = f.rate
	case !rateSet:
		// The default rate follows the fleet's engines (fleet.Config.DefaultRate).
		c := cfg
		c.Workload, c.Replicas = wl, f.replicas
		wl.Rate = c.DefaultRate()
	}
	if fl.Changed("requests") {
		wl.Requests = f.requests
	}
	if fl.Changed("duration") {
		wl.Duration = f.duration
		if !fl.Changed("requests") && f.workloadFile == "" {
			wl.Requests = 0
		}
	}
	if f.slo != "" {
		slo, err := results.ParseSLO(f.slo)
		if err != nil {
			return cfg, usagef("--slo: %w", err)
		}
		f.sloTTFT, f.sloTPOT = slo.TTFTP99, slo.TPOTP99
	}
	cfg.Index = fleet.IndexMode(f.index)
	cfg.KVEventDelay = f.kvEventDelay
	cfg.SpeculationTTL = f.speculationTTL
	cfg.SessionAffinity = f.affinity
	if f.trace != "" {
		src, name, err := f.traceSource(cmd, wl.Model)
		if err != nil {
			return cfg, err
		}
		cfg.Source, cfg.SourceName = src, name
	}
	if err := f.gw.apply(&cfg, &wl); err != nil {
		return cfg, err
	}
	cfg.Workload = wl
	if f.policy != "" {
		cfg.Policy = f.policy
	}
	cfg.Replicas = f.replicas
	f.pd.apply(cmd, &cfg)
	cfg.Warmup = f.warmup
	cfg.ScrapeInterval = f.scrapeInterval
	cfg.SLO = results.SLO{TTFTP99: f.sloTTFT, TPOTP99: f.sloTPOT}
	if err := f.gw.checkLimits(cmd, &cfg); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, flagErrors(err)
	}
	return cfg, nil
}

// applySet overlays one yaml.path=value onto the workload configuration,
// strictly: unknown keys are errors.
func applySet(wl *workload.Config, kv string) error {
	path, value, ok := strings.Cut(kv, "=")
	if !ok || path == "" {
		return fmt.Errorf("want yaml.path=value, e.g. w1.prompts=64")
	}
	keys := strings.Split(path, ".")
	var doc strings.Builder
	for i, k := range keys {
		fmt.Fprintf(&doc, "%s%s:", strings.Repeat("  ", i), k)
		if i < len(keys)-1 {
			doc.WriteString("\n")
		}
	}
	doc.WriteString(" " + value + "\n")
	return workload.Overlay(wl, []byte(doc.String()))
}

// yamlHasKey reports whether a YAML file sets a top-level key.
func yamlHasKey(path, key string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	var m map[string]any
	if yaml.NewDecoder(bytes.NewReader(data)).Decode(&m) != nil {
		return false
	}
	_, ok := m[key]
	return ok
}

// runSims runs the same requests under several policies and prints one
// table and what it shows (make demo); compare is the tool for more.
func runSims(cmd *cobra.Command, f simFlags, policies []string, stdout, stderr io.Writer) error {
	if f.out != "" || f.json || f.explainOut != "" {
		return usagef("--policy: several policies print one table; for --out, --json or --explain-out use compare --policies %s or one policy", f.policy)
	}
	var sums []results.Summary
	for _, p := range policies {
		g := f
		g.policy = strings.TrimSpace(p)
		cfg, err := g.config(cmd)
		if err != nil {
			return err
		}
		cfg.KeepRecords = false // the table needs the summaries only
		out, err := simulate(cfg, f, stderr)
		if err != nil {
			return err
		}
		sums = append(sums, out.Summary)
	}
	if err := results.FormatTable(stdout, sums); err != nil {
		return err
	}
	if line := results.Conclusion(sums, "cost_model"); line != "" {
		fmt.Fprintln(stdout, line)
	}
	return nil
}

// simulate runs one simulation with a progress bar on stderr; a malformed
// trace record is bad input.
func simulate(cfg fleet.Config, f simFlags, stderr io.Writer) (*fleet.Output, error) {
	bar := newProgressBar(stderr)
	if cfg.Source != nil && !bar.off {
		// A replay's length is known only at its end: count it up front
		// (one more read of the trace) so the bar shows a true share.
		bar.expected = countSource(cfg.Source, cfg.Seed)
	}
	cfg.Progress = bar.update
	cfg.TwoCores = true // one simulation at a time
	out, err := fleet.Simulate(cfg)
	if err != nil {
		if bad := f.badTrace(err); bad != nil {
			return nil, bad
		}
		return nil, fmt.Errorf("simulate %s: %w", cfg.Policy, err)
	}
	return out, nil
}

func runSim(cfg fleet.Config, f simFlags, stdout, stderr io.Writer) error {
	// The run's records stream into its summary and, with --out, into
	// requests.parquet as requests end: none is held, so the run's memory
	// does not grow with its length (docs/sim-memory.md).
	cfg.KeepRecords = false
	var rf *requestsFile
	if f.out != "" {
		var err error
		if rf, err = createRequestsFile(f.out, cfg); err != nil {
			return err
		}
		defer rf.abort()
		cfg.Record = rf.add
	}
	cfg.ExplainSample = f.explainSample
	var ef *explainFile
	if f.explainOut != "" {
		var err error
		if ef, err = createExplainFile(f.explainOut); err != nil {
			return err
		}
		defer ef.abort()
		cfg.Explain = fleet.ExplainLines(ef)
	}
	if err := cfg.Validate(); err != nil { // the explain settings, with the rest
		return flagErrors(err)
	}
	out, err := simulate(cfg, f, stderr)
	if err != nil {
		return err
	}
	if ef != nil {
		if err := ef.close(); err != nil {
			return err
		}
	}
	if f.out != "" {
		if err := rf.close(); err != nil {
			return err
		}
		if err := results.WriteSummaryFile(filepath.Join(f.out, "summary.json"), out.Summary); err != nil {
			return fmt.Errorf("write summary: %w", err)
		}
	}
	if f.json {
		return results.WriteJSON(stdout, out.Summary)
	}
	if err := results.FormatTable(stdout, []results.Summary{out.Summary}); err != nil {
		return err
	}
	if f.out != "" {
		fmt.Fprintf(stdout, "wrote %s and %s\n", filepath.Join(f.out, "summary.json"), filepath.Join(f.out, "requests.parquet"))
	}
	return nil
}
