package main

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

// scenario is one hostile client and the goal the proxy should meet.
type scenario struct {
	name string
	goal string
	run  func(h *harness) (result, error)
}

// result is one row of the table plus its details.
type result struct {
	name, goal string
	Figures    string   // the table cell
	Met        string   // "met", "missed" or "n/a"
	Details    []string // lines under the table
	took       time.Duration
}

func scenarios() []scenario {
	return []scenario{
		{"big-body", "peak RSS under 256 MiB, no growth in the 5 s after", runBigBody},
		{"slow-reader", "all 50 legitimate requests served", runSlowReader},
		{"stalled-bodies", "fds bounded (peak under 90% of the proxy's fd limit), every readiness probe answered within 1 s", func(h *harness) (result, error) { return runStalledBodies(h, 1) }},
		{"stalled-bodies-wide", "the same from 64 addresses: fds bounded, every readiness probe answered within 1 s", func(h *harness) (result, error) { return runStalledBodies(h, wideAddrs) }},
		{"engines-die", "readiness 503 at 3 s", runEnginesDie},
		{"stream-cut", "the OpenAI Node SDK raises", runStreamCut},
		{"sigstop", "requests routed to the stopped engine retried elsewhere within first_byte_timeout (2 s, +1 s of service), all 30 succeed", runSigstop},
		{"cache-oracle", "no x-inferrail-predicted-cached-tokens for client B (not enabled)", runCacheOracle},
		{"request-id", "id not echoed in stream chunks, decision log bounded (under 1 MiB)", runRequestID},
		{"background-flood", "at most max_background_responses (256) in flight at once, the rest 429, the engines' requests bounded by it, all 30 legitimate requests served", runBackgroundFlood},
	}
}

func scenarioNames() []string {
	var out []string
	for _, s := range scenarios() {
		out = append(out, s.name)
	}
	return out
}

func metWord(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// cell makes s safe inside a markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ")
}

func renderReport(h *harness, rs []result, command string) string {
	var b strings.Builder
	b.WriteString("# inferrail live against hostile clients\n\n")
	fmt.Fprintf(&b, "Command: `%s` (binary %s), %s, %d cores, %s.\n\n", command, h.bin, time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), runtime.Version())
	b.WriteString("| # | scenario | figures | goal | goal met |\n|---|---|---|---|---|\n")
	for i, r := range rs {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s |\n", i+1, r.name, cell(r.Figures), cell(r.goal), r.Met)
	}
	b.WriteString("\n## Details\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "\n### %s (%.1f s)\n\n", r.name, r.took.Seconds())
		for _, d := range r.Details {
			fmt.Fprintf(&b, "- %s\n", d)
		}
	}
	b.WriteString("\n## Setup\n\n")
	b.WriteString("- Each scenario gets a fresh stack: three `inferrail engine` (default profile) as replicas a, b, c and `inferrail live` with a generated configuration (defaults but for what the scenario says), all on 127.0.0.1, all stopped after the scenario.\n")
	fmt.Fprintf(&b, "- New configuration keys live accepts (`--check`): %s; refuses: %s.%s\n", list(h.keys.accepted), list(h.keys.refused), noteOf(h.keys.note))
	b.WriteString("- Two set one of them: sigstop (`first_byte_timeout: 2s`) and the stalled-bodies scenarios (`flood_connections_per_client: 256`, off by default: it is for clients that connect directly, not through a load balancer); the others run on live's defaults. Beyond defaults: a decision log at sample 1 in sigstop (to see every try) and at 0.01 in request-id.\n")
	fmt.Fprintf(&b, "- Attacking connections (slow-reader, stalled-bodies) come from %s; legitimate clients and probes from 127.0.0.1; everything listens on 127.0.0.1.\n", attackerIP)
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		fmt.Fprintf(&b, "- RLIMIT_NOFILE of the harness: soft %d, hard %d (children inherit it; Go raises the soft limit to the hard one at startup).\n", lim.Cur, lim.Max)
	}
	return b.String()
}

func list(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(slices.Clone(xs), ", ")
}

func noteOf(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// refusedNote says which of a scenario's optional keys live refused.
func refusedNote(st *stack) string {
	if len(st.refused) == 0 {
		return ""
	}
	return "live refused " + strings.Join(st.refused, ", ") + ": run without"
}

// percentile of sorted durations (nearest rank).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
