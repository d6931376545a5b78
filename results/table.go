package results

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// tableWidth is the terminal width FormatTable's per-replica lines wrap at.
const tableWidth = 100

// FormatTable writes sums as an aligned text table, one row per summary:
// policy, completed/requests, TTFT and TPOT p50/p99, E2E p99, prefix
// cache hit rate (measured and predicted), exact predictions, SLO
// attainment, goodput and preemptions. A legend and, for each summary, a
// per-replica breakdown (requests, hit rate, busy fraction, token-budget
// use) follow, then for each summary with failures the failures by reason
// (Summary.FailureText), its steady-state warning, if any, and, past the
// exact limit, the error bound of its percentiles. With policy
// names of up to a dozen characters every line fits in 100 columns; the
// per-replica and failure lines wrap at 100.
func FormatTable(w io.Writer, sums []Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\tok/req\tttft p50/99\ttpot p50/99\te2e p99\thit/pred\texact\tslo\tgood/s\tpre")
	for i := range sums {
		s := &sums[i]
		fmt.Fprintf(tw, "%s\t%d/%d\t%s/%s\t%s/%s\t%s\t%s/%s\t%s\t%s\t%s\t%d\n",
			s.Policy, s.Completed, s.Requests,
			fmtMs(s.TTFT.P50), fmtMs(s.TTFT.P99),
			fmtMs(s.TPOT.P50), fmtMs(s.TPOT.P99),
			fmtMs(s.E2E.P99),
			fmtPct0(s.HitRate), fmtPct(s.PredictedHitRate), fmtPct(s.Prediction.Exact), fmtPct(s.SLOAttainment),
			strconv.FormatFloat(s.GoodputRPS, 'f', 2, 64),
			s.Preemptions)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("format table: %w", err)
	}

	var b strings.Builder
	b.WriteString("latencies in ms; hit/pred: % of prompt tokens the engines found cached / the router predicted;\n" +
		"exact: requests predicted exactly; slo: requests meeting the SLO; good/s: goodput in req/s\n" +
		"pre: preemptions; per replica: name, requests, prefix-cache hit rate, busy, budget\n" +
		"busy: share of the run the engine was running a step (any step: one request keeps it busy);\n" +
		"budget: share of its step token budget (max_num_batched_tokens) filled over the run\n")
	for i := range sums {
		s := &sums[i]
		fmt.Fprintf(&b, "%s on %s, seed %d:\n", s.Policy, s.Workload, s.Seed)
		line := " "
		for _, r := range s.PerReplica {
			item := fmt.Sprintf(" %s %d %s %s %s", r.Replica, r.Requests, fmtPct(r.HitRate), fmtPct(r.BusyFraction), fmtPct(r.TokenBudgetUse))
			if len(line) > 1 && len(line)+len(item)+1 > tableWidth {
				b.WriteString(line + "\n")
				line = " "
			}
			if len(line) > 1 {
				line += " |"
			}
			line += item
		}
		if len(s.PerReplica) == 0 {
			line += " (no replicas)"
		}
		b.WriteString(line + "\n")
	}
	for i := range sums {
		s := &sums[i]
		if s.Admission == "" || s.Admission == "none" && s.RejectedTotal == 0 {
			continue
		}
		// The gateway's admission: what it queued and refused.
		fmt.Fprintf(&b, "%s admission %s: queue p50/p99 %s/%s ms, rejected %d", s.Policy, s.Admission, fmtMs(s.QueueMs.P50), fmtMs(s.QueueMs.P99), s.RejectedTotal)
		if len(s.Rejected) > 0 {
			b.WriteString(" (" + reasons(s.Rejected) + ")")
		}
		fmt.Fprintf(&b, ", peak reserved %s of capacity\n", fmtPct(s.PeakReservedOverCapacity))
	}
	for i := range sums {
		s := &sums[i]
		if t := s.FailureText(); t != "" {
			wrap(&b, s.Policy+": "+t)
		}
		if w := s.Steady.Warning; w != "" {
			wrap(&b, s.Policy+": warning: "+w)
		}
		if e := s.PercentileError; e > 0 {
			wrap(&b, fmt.Sprintf("%s: percentiles within %s%% of the exact ones (sketched: the run has more requests than its exact limit)",
				s.Policy, strconv.FormatFloat(100*e, 'f', -1, 64)))
		}
	}
	for i := range sums {
		if err := formatTenants(&b, &sums[i]); err != nil {
			return err
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("format table: %w", err)
	}
	return nil
}

// wrap writes text as lines of at most tableWidth columns, broken between
// words, the lines after the first indented by two spaces.
func wrap(b *strings.Builder, text string) {
	line := ""
	for _, w := range strings.Fields(text) {
		if line != "" && len(line)+1+len(w) > tableWidth {
			b.WriteString(line + "\n")
			line = " "
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		b.WriteString(line + "\n")
	}
}

// fmtMs formats milliseconds with about three significant digits.
func fmtMs(ms float64) string {
	switch {
	case ms >= 100:
		return strconv.FormatFloat(ms, 'f', 0, 64)
	case ms >= 10:
		return strconv.FormatFloat(ms, 'f', 1, 64)
	default:
		return strconv.FormatFloat(ms, 'f', 2, 64)
	}
}

// fmtPct0 formats a fraction as a percentage with one decimal and no sign.
func fmtPct0(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) }

// fmtPct formats a fraction as a percentage with one decimal.
func fmtPct(f float64) string {
	return strconv.FormatFloat(100*f, 'f', 1, 64) + "%"
}

// reasons formats counts by reason as "a 1, b 2", by reason.
func reasons(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for j, k := range keys {
		parts[j] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// formatTenants writes a summary's per-tenant lines, if it has tenants.
func formatTenants(b *strings.Builder, s *Summary) error {
	if len(s.PerTenant) == 0 {
		return nil
	}
	fmt.Fprintf(b, "%s per tenant", s.Policy)
	if s.TenantLimits != "" {
		fmt.Fprintf(b, " (tenant limits %s)", s.TenantLimits)
	}
	if len(s.WithoutTenants) > 0 {
		fmt.Fprintf(b, " without %s", strings.Join(s.WithoutTenants, ", "))
	}
	b.WriteString(":\n")
	return WriteTenantTable(b, s)
}

// WriteTenantTable writes the per-tenant table of s (indented, one line a
// tenant: requests, TTFT p50/p99, E2E p99, failures by reason); sim's and
// bench's tables share it.
func WriteTenantTable(b *strings.Builder, s *Summary) error {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  tenant\tok/req\tttft p50/99\te2e p99\tfailed")
	for _, t := range s.PerTenant {
		name := t.Tenant
		if name == "" {
			name = "(none)"
		}
		failed := strconv.Itoa(t.Failed)
		if len(t.FailedBy) > 0 {
			failed += " (" + reasons(t.FailedBy) + ")"
		}
		fmt.Fprintf(tw, "  %s\t%d/%d\t%s/%s\t%s\t%s\n", name, t.Completed, t.Requests, fmtMs(t.TTFTP50Ms), fmtMs(t.TTFTP99Ms), fmtMs(t.E2EP99Ms), failed)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("format table: %w", err)
	}
	return nil
}
