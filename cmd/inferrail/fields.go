package main

import (
	"errors"
	"strings"
)

// flagFor is the one table from the settings that the library's Validate
// methods name (fleet.Config, its workload, gateway core and SLO, and
// compare.Spec) to the flags of sim, compare and capacity that set them; ""
// for a setting no flag sets (a workload file's field: --set sets those).
func flagFor(field string) string {
	switch field {
	case "replicas", "scrape-interval", "index", "kv-event-delay", "speculation-ttl", "warmup",
		"policy", "gateways", "ledger", "profile", "admission", "overcommit", "mix", "limits":
		return "--" + field
	case "workload: rate":
		return "--rate"
	case "workload: requests":
		return "--requests"
	case "workload: duration":
		return "--duration"
	case "workload: workload":
		return "--workload"
	case "output_quantile":
		return "--output-quantile"
	case "queue.timeout":
		return "--queue-timeout"
	case "queue.max_requests":
		return "--queue-max"
	case "queue.max_priority":
		return "--max-priority"
	case "rate", "rates", "seeds", "parallel", "max-replicas", "policies", "isolate", "pools":
		return "--" + field
	case "slo":
		return "--slo-ttft, --slo-tpot or --slo"
	case "prefill_replicas", "decode_replicas":
		return "--" + strings.ReplaceAll(field, "_", "-")
	case "pd.decider":
		return "--pd-decider"
	case "pd.non_cached_tokens":
		return "--pd-non-cached-tokens"
	case "pd.prefill_policy":
		return "--pd-prefill-policy"
	}
	return ""
}

// flagErrors rewrites a library validation error in the flags' terms: each
// of its (joined) errors that starts with a setting flagFor knows starts
// with the flag instead, e.g. "workload: rate: must be ..." becomes
// "--rate: must be ...", and a workload field no flag sets points at --set.
// The result is a usage error (exit code 2).
func flagErrors(err error) error {
	if err == nil {
		return nil
	}
	var lines []string
	for _, m := range leaves(err, "") {
		lines = append(lines, inFlags(m))
	}
	return usageError{errors.New(strings.Join(lines, "\n"))}
}

// inFlags rewrites one message "field: text" by flagFor, trying the longest
// field first ("workload: rate" before "workload").
func inFlags(m string) string {
	parts := strings.SplitN(m, ": ", 3)
	for n := min(len(parts)-1, 2); n >= 1; n-- {
		field := strings.Join(parts[:n], ": ")
		if f := flagFor(field); f != "" {
			rest := strings.Join(parts[n:], ": ")
			if strings.Contains(rest, "cap the requests") { // workload.CheckLength's way out
				rest += " (flags: --duration, --rate, --requests)"
			}
			return f + ": " + rest
		}
	}
	if len(parts) == 3 && parts[0] == "workload" {
		return "--set " + parts[1] + ": " + parts[2] // a workload file's field
	}
	return m
}

// leaves lists the messages of err's joined errors, each with the prefixes
// of the errors that wrap it ("workload: " + each of a joined list).
func leaves(err error, prefix string) []string {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []string
		for _, e := range j.Unwrap() {
			out = append(out, leaves(e, prefix)...)
		}
		return out
	}
	msg := err.Error()
	if inner := errors.Unwrap(err); inner != nil {
		if _, joined := inner.(interface{ Unwrap() []error }); joined && strings.HasSuffix(msg, inner.Error()) {
			return leaves(inner, prefix+strings.TrimSuffix(msg, inner.Error()))
		}
	}
	return []string{prefix + msg}
}
