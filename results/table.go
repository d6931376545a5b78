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
// cache hit rate (measured and predicted), exact predictions, SLO attainment, goodput and preemptions. A legend and, for
// each summary, a per-replica breakdown (requests, hit rate, busy fraction)
// follow. With policy names of up to a dozen characters every line fits in
// 100 columns; the per-replica lines wrap at 100.
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
		"pre: preemptions; per replica: name, requests, prefix-cache hit rate, busy fraction\n")
	for i := range sums {
		s := &sums[i]
		fmt.Fprintf(&b, "%s on %s, seed %d:\n", s.Policy, s.Workload, s.Seed)
		line := " "
		for _, r := range s.PerReplica {
			item := fmt.Sprintf(" %s %d %s %s", r.Replica, r.Requests, fmtPct(r.HitRate), fmtPct(r.BusyFraction))
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
			keys := make([]string, 0, len(s.Rejected))
			for k := range s.Rejected {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			parts := make([]string, len(keys))
			for j, k := range keys {
				parts[j] = fmt.Sprintf("%s %d", k, s.Rejected[k])
			}
			b.WriteString(" (" + strings.Join(parts, ", ") + ")")
		}
		fmt.Fprintf(&b, ", peak reserved %s of capacity\n", fmtPct(s.PeakReservedOverCapacity))
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("format table: %w", err)
	}
	return nil
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
