package report

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/inferrail/inferrail/results"
)

// The P/D and KV tiers sections: what disaggregated prefill/decode
// (results.Summary.PD) and the engines' lower KV tiers
// (results.Summary.Tiers) did, per variant. Each appears only when some run
// of the main comparison has the summary, so reports of aggregated fleets
// without tiers are unchanged.

// PoolName names a prefill/decode split in variant labels: P2D6 (2
// prefill, 6 decode replicas), or aggregated for 0 and 0.
func PoolName(prefill, decode int) string {
	if prefill == 0 && decode == 0 {
		return "aggregated"
	}
	return "P" + strconv.Itoa(prefill) + "D" + strconv.Itoa(decode)
}

// FleetText describes n replicas of which prefill are prefill-only and
// decode decode-only: "6 (2 prefill + 4 decode)", "8 (2 prefill + 2 decode
// + 4 both)"; with neither, "6 (aggregated)" when searched is set (a search
// over splits chose the aggregated fleet), else "6".
func FleetText(n, prefill, decode int, searched bool) string {
	s := strconv.Itoa(n)
	if prefill == 0 && decode == 0 {
		if searched {
			s += " (aggregated)"
		}
		return s
	}
	var parts []string
	if prefill > 0 {
		parts = append(parts, strconv.Itoa(prefill)+" prefill")
	}
	if decode > 0 {
		parts = append(parts, strconv.Itoa(decode)+" decode")
	}
	if both := n - prefill - decode; both > 0 {
		parts = append(parts, strconv.Itoa(both)+" both")
	}
	return s + " (" + strings.Join(parts, " + ") + ")"
}

// hasPools reports whether the runs compare several pools (Run.Pool).
func hasPools(in Input) bool {
	for _, rs := range [][]Run{in.Runs, in.Sweep} {
		for _, r := range rs {
			if r.Pool != "" {
				return true
			}
		}
	}
	return false
}

// showPD reports whether some run of the main comparison has a P/D summary.
func showPD(in Input) bool {
	for _, r := range in.Runs {
		if r.Summary.PD != nil {
			return true
		}
	}
	return false
}

// showTiers reports whether some run of the main comparison has a KV tiers
// summary.
func showTiers(in Input) bool {
	for _, r := range in.Runs {
		if r.Summary.Tiers != nil {
			return true
		}
	}
	return false
}

// pdSpread is the spread over a variant's runs with a P/D summary of one of
// its values; ok is false when none has one.
func pdSpread(a *policyAgg, f func(p *results.PDSummary) float64) (spread, bool) {
	var vals []float64
	for i := range a.Runs {
		if p := a.Runs[i].Summary.PD; p != nil {
			vals = append(vals, f(p))
		}
	}
	return spreadOf(vals), len(vals) > 0
}

// tierSpread is pdSpread for the KV tiers summary.
func tierSpread(a *policyAgg, f func(t *results.TierSummary) float64) (spread, bool) {
	var vals []float64
	for i := range a.Runs {
		if t := a.Runs[i].Summary.Tiers; t != nil {
			vals = append(vals, f(t))
		}
	}
	return spreadOf(vals), len(vals) > 0
}

// remoteShare is the share of a run's P/D decisions that prefilled
// remotely.
func remoteShare(p *results.PDSummary) float64 {
	if n := p.Remote + p.Local; n > 0 {
		return float64(p.Remote) / float64(n)
	}
	return 0
}

func writePD(b *strings.Builder, in Input, aggs []policyAgg) {
	w := wordsOf(in)
	b.WriteString("## Disaggregated prefill/decode\n\n")
	b.WriteString("One row per " + w.short() + ", medians over seeds. Pools are the prefill / decode / both replica counts. " +
		"Remote is the share of requests that prefilled on a prefill replica, the rest prefilling on their decode replica; " +
		"fallbacks count the remote prefills that failed and ran locally (every request of the run counted, warmup included). " +
		"Transfer is the time a measured request's KV took from the end of its prefill to its decode replica; KV moved is the total over the run. " +
		"Busy is each pool's mean busy fraction. TPOT p50 / p99 repeat the results' latencies (every " + w.short() + ") to set what P/D does to decoding against what it costs. " +
		"— marks a " + w.short() + " without prefill replicas, or an empty pool.\n\n")
	b.WriteString("| " + w.header + " | Pools P / D / both | TPOT p50 / p99 (ms) | Remote | Fallbacks | Transfer p50 (ms) | Transfer p99 (ms) | KV moved (GB) | Prefill busy | Decode busy | Both busy |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for i := range aggs {
		a := &aggs[i]
		var first *results.PDSummary
		for j := range a.Runs {
			if p := a.Runs[j].Summary.PD; p != nil {
				first = p
				break
			}
		}
		var p50, p99 []float64
		for j := range a.Runs {
			p50 = append(p50, a.Runs[j].Summary.TPOT.P50)
			p99 = append(p99, a.Runs[j].Summary.TPOT.P99)
		}
		tpot := fmtMs(spreadOf(p50).Med) + " / " + fmtMs(spreadOf(p99).Med)
		if first == nil {
			fmt.Fprintf(b, "| %s | — | %s | — | — | — | — | — | — | — | — |\n", cell(a.Policy), tpot)
			continue
		}
		med := func(f func(p *results.PDSummary) float64, format func(float64) string) string {
			s, _ := pdSpread(a, f)
			return format(s.Med)
		}
		busy := func(n int, f func(p *results.PDSummary) float64) string {
			if n == 0 {
				return "—"
			}
			return med(f, fmtPct)
		}
		fmt.Fprintf(b, "| %s | %d / %d / %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			cell(a.Policy),
			first.PrefillReplicas, first.DecodeReplicas, first.BothReplicas, tpot,
			med(remoteShare, fmtPct),
			med(func(p *results.PDSummary) float64 { return float64(p.Fallbacks) }, fmtCount),
			med(func(p *results.PDSummary) float64 { return p.TransferMs.P50 }, fmtMs),
			med(func(p *results.PDSummary) float64 { return p.TransferMs.P99 }, fmtMs),
			med(func(p *results.PDSummary) float64 { return p.TransferredGB }, fmtMs),
			busy(first.PrefillReplicas, func(p *results.PDSummary) float64 { return p.PrefillBusy }),
			busy(first.DecodeReplicas, func(p *results.PDSummary) float64 { return p.DecodeBusy }),
			busy(first.BothReplicas, func(p *results.PDSummary) float64 { return p.BothBusy }))
	}
	b.WriteString("\n")
}

func writeTiers(b *strings.Builder, in Input, aggs []policyAgg) {
	w := wordsOf(in)
	b.WriteString("## KV tiers\n\n")
	b.WriteString("One row per " + w.short() + ", medians over seeds: the share of the prompt tokens the engines saw (the whole run, engine counters) " +
		"served from the GPU prefix cache and from blocks loaded back from the CPU and disk tiers, and the time requests waited for those loads, summed over the run's requests. " +
		"— marks a " + w.short() + " whose engines have no lower tier.\n\n")
	b.WriteString("| " + w.header + " | GPU hit | CPU hit | Disk hit | All tiers | Load wait (s) |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|\n")
	for i := range aggs {
		a := &aggs[i]
		if _, ok := tierSpread(a, func(t *results.TierSummary) float64 { return 0 }); !ok {
			fmt.Fprintf(b, "| %s | — | — | — | — | — |\n", cell(a.Policy))
			continue
		}
		med := func(f func(t *results.TierSummary) float64, format func(float64) string) string {
			s, _ := tierSpread(a, f)
			return format(s.Med)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s |\n",
			cell(a.Policy),
			med(func(t *results.TierSummary) float64 { return t.GPUHitRate }, fmtPct),
			med(func(t *results.TierSummary) float64 { return t.CPUHitRate }, fmtPct),
			med(func(t *results.TierSummary) float64 { return t.DiskHitRate }, fmtPct),
			med(func(t *results.TierSummary) float64 { return t.GPUHitRate + t.CPUHitRate + t.DiskHitRate }, fmtPct),
			med(func(t *results.TierSummary) float64 { return t.LoadS }, fmtMs))
	}
	b.WriteString("\n")
}
