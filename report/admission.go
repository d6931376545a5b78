package report

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/inferrail/inferrail/results"
)

// The "Admission and queueing" section and its Reading statements: what the
// gateways in front of the fleet admitted, rejected and queued, per variant.

// admissionNone is the admission rule that dispatches every request at once.
const admissionNone = "none"

// showAdmission reports whether the report has an admission section: some
// run of the main comparison had an admission rule other than none or a
// rejection, or the runs compare several admission rules or ledgers.
func showAdmission(in Input) bool {
	var adms, ledgers []string
	for _, r := range in.Runs {
		a := runAdmission(r)
		if (a != "" && a != admissionNone) || r.Summary.RejectedTotal > 0 {
			return true
		}
		if !slices.Contains(adms, a) {
			adms = append(adms, a)
		}
		if l := runLedger(r); !slices.Contains(ledgers, l) {
			ledgers = append(ledgers, l)
		}
	}
	return len(adms) > 1 || len(ledgers) > 1
}

// words is what the report calls the things it compares: routing policies,
// or variants (policy+admission[+ledger]) when a label has a "+".
type words struct {
	one, many string
	header    string // the first column's header
}

// short is "policy" or "variant".
func (w words) short() string { return strings.TrimPrefix(w.one, "routing ") }

// axis labels the axis of the compared things: "routing policy" or, e.g.,
// "policy+admission".
func (w words) axis() string {
	if w.one == "variant" {
		return strings.ToLower(w.header)
	}
	return w.one
}

func wordsOf(in Input) words {
	plus := 0
	for _, p := range allPolicies(in) {
		plus = max(plus, strings.Count(p, "+"))
	}
	if hasPools(in) {
		// The pool is the last "+" of a label (Run.Pool).
		w := words{"variant", "variants", "Policy"}
		switch plus {
		case 0, 1:
		case 2:
			w.header = "Policy+admission"
		default:
			w.header = "Policy+admission+ledger"
		}
		w.header += "+pool"
		return w
	}
	switch plus {
	case 0:
		return words{"routing policy", "routing policies", "Policy"}
	case 1:
		return words{"variant", "variants", "Policy+admission"}
	}
	return words{"variant", "variants", "Policy+admission+ledger"}
}

// reasonCount is one rejection reason's median count over seeds.
type reasonCount struct {
	Reason string
	Med    float64
}

// admissionAgg is one variant's admission figures over seeds.
type admissionAgg struct {
	*policyAgg
	Completed, EngineFailed spread
	Rejected                []reasonCount // by descending median, then name
	QueueP50, QueueP99      spread
	// Peak is the per-seed peak reserved / capacity (the largest over the
	// replicas); PeakKnown is false when no replica's capacity is known.
	Peak      spread
	PeakKnown bool
	// PreemptedSeeds counts the seeds with a preemption.
	PreemptedSeeds int
}

// peakRatio is a run's largest PeakReservedBlocks / CapacityBlocks over its
// replicas, and whether any capacity is known.
func peakRatio(s *results.Summary) (float64, bool) {
	v, known := s.PeakReservedOverCapacity, s.PeakReservedOverCapacity > 0
	for _, r := range s.PerReplica {
		if r.CapacityBlocks > 0 {
			known = true
			v = max(v, float64(r.PeakReservedBlocks)/float64(r.CapacityBlocks))
		}
	}
	return v, known
}

func aggregateAdmission(aggs []policyAgg) []admissionAgg {
	out := make([]admissionAgg, len(aggs))
	for i := range aggs {
		a := &aggs[i]
		x := admissionAgg{policyAgg: a}
		n := len(a.Runs)
		completed, failed := make([]float64, n), make([]float64, n)
		q50, q99, peak := make([]float64, n), make([]float64, n), make([]float64, n)
		var reasons []string
		for j := range a.Runs {
			s := &a.Runs[j].Summary
			completed[j], failed[j] = float64(s.Completed), float64(s.EngineFailed)
			q50[j], q99[j] = s.QueueMs.P50, s.QueueMs.P99
			var known bool
			peak[j], known = peakRatio(s)
			x.PeakKnown = x.PeakKnown || known
			if s.Preemptions > 0 {
				x.PreemptedSeeds++
			}
			for reason, c := range s.Rejected {
				if c > 0 && !slices.Contains(reasons, reason) {
					reasons = append(reasons, reason)
				}
			}
		}
		slices.Sort(reasons)
		for _, reason := range reasons {
			counts := make([]float64, n)
			for j := range a.Runs {
				counts[j] = float64(a.Runs[j].Summary.Rejected[reason])
			}
			x.Rejected = append(x.Rejected, reasonCount{reason, spreadOf(counts).Med})
		}
		slices.SortStableFunc(x.Rejected, func(p, q reasonCount) int {
			switch {
			case p.Med > q.Med:
				return -1
			case p.Med < q.Med:
				return 1
			}
			return 0
		})
		x.Completed, x.EngineFailed = spreadOf(completed), spreadOf(failed)
		x.QueueP50, x.QueueP99, x.Peak = spreadOf(q50), spreadOf(q99), spreadOf(peak)
		out[i] = x
	}
	return out
}

// fmtShare formats a share of capacity as a percentage, without decimals
// from 1,000%.
func fmtShare(f float64) string {
	if 100*f >= 1000 {
		return group(strconv.FormatFloat(100*f, 'f', 0, 64)) + "%"
	}
	return fmtPct(f)
}

// rejectedText is a variant's rejections by reason, e.g. "queue_timeout 589".
func rejectedText(rs []reasonCount) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, r.Reason+" "+fmtCount(r.Med))
	}
	if len(parts) == 0 {
		return "0"
	}
	return strings.Join(parts, ", ")
}

// rejectMeaning explains the gateway's rejection reasons.
var rejectMeaning = map[string]string{
	results.RejectQueueFull:    "the queue was full",
	results.RejectQueueTimeout: "the request waited in the queue past its timeout",
	results.RejectNoReplica:    "no replica could take the request",
	results.RejectTooLong:      "the request is longer than any replica serves",
	results.RejectSLOShed:      "shed because its expected wait exceeded its deadline",
	results.RejectUnknown:      "no reason recorded",
}

func writeAdmission(b *strings.Builder, in Input, aggs []policyAgg) {
	w := wordsOf(in)
	xs := aggregateAdmission(aggs)
	b.WriteString("## Admission and queueing\n\n")
	fmt.Fprintf(b, "One row per %s, medians over seeds; TTFT p99 shows the min–max over seeds in brackets. "+
		"Completed and rejected count measured requests; rejected splits the requests the gateway refused by reason, "+
		"and engine failures are requests dispatched to an engine that did not complete. "+
		"Peak reserved / capacity is the most KV blocks dispatched to one replica at once, each request counted as the gateway reserves it "+
		"(its prompt less what the router expects cached, plus its output: max_tokens, or with kv admission a quantile of the answer lengths seen so far, at most max_tokens), as a share of the replica's KV capacity, the largest over replicas and seeds: "+
		"above 100%% a replica was sent more than its cache holds, whatever the admission rule. "+
		"Queue wait is the time from arrival to dispatch of the dispatched requests. "+
		"TTFT counts only requests that got a first token, so a %s that rejects more can show a lower TTFT p99; "+
		"goodput, requests meeting the SLO per second with rejections counting as misses, compares them fairly.\n\n", w.one, w.one)
	var reasons []string
	for _, x := range xs {
		for _, r := range x.Rejected {
			if !slices.Contains(reasons, r.Reason) {
				reasons = append(reasons, r.Reason)
			}
		}
	}
	slices.Sort(reasons)
	var meanings []string
	for _, r := range reasons {
		if m, ok := rejectMeaning[r]; ok {
			meanings = append(meanings, code(r)+": "+m)
		} else {
			meanings = append(meanings, code(r))
		}
	}
	if len(meanings) > 0 {
		b.WriteString("Rejection reasons: " + strings.Join(meanings, "; ") + ".\n\n")
	}
	fmt.Fprintf(b, "| %s | Completed | Rejected | Engine failures | Preemptions | Peak reserved / capacity | Queue wait p50 (ms) | Queue wait p99 (ms) | TTFT p99 (ms) | Goodput (req/s) |\n", w.header)
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, x := range xs {
		peak := "—"
		if x.PeakKnown {
			peak = fmtShare(x.Peak.Max)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			cell(x.Policy),
			fmtCount(x.Completed.Med),
			cell(rejectedText(x.Rejected)),
			fmtCount(x.EngineFailed.Med),
			fmtCount(x.Preemptions.Med),
			peak,
			fmtMs(x.QueueP50.Med),
			fmtMs(x.QueueP99.Med),
			withRange(x.TTFTP99, fmtMs),
			fmtRate(x.Goodput.Med))
	}
	b.WriteString("\n")
}

// gatewaySetupRows are the Setup rows describing the gateways, shown with the
// admission section.
func gatewaySetupRows(in Input, row func(k, v string)) {
	s := in.Setup
	var adms, ledgers []string
	for _, r := range in.Runs {
		if a := runAdmission(r); a != "" && !slices.Contains(adms, a) {
			adms = append(adms, a)
		}
		if l := runLedger(r); l != "" && !slices.Contains(ledgers, l) {
			ledgers = append(ledgers, l)
		}
	}
	quote := func(xs []string) []string {
		out := make([]string, len(xs))
		for i, x := range xs {
			out[i] = code(x)
		}
		return out
	}
	adm := orDash(strings.Join(quote(adms), ", "))
	if len(adms) > 1 {
		adm += " (compared)"
	}
	row("Admission", adm)
	if slices.Contains(adms, "kv") && s.Overcommit > 0 {
		row("Overcommit (kv admission)", strconv.FormatFloat(s.Overcommit, 'g', -1, 64)+" × each replica's KV capacity")
	}
	if s.QueueTimeout > 0 {
		if s.QueueMax == 0 {
			row("Queue", "none: a request no replica admits is rejected at once")
		} else {
			row("Queue", "up to "+plural(s.QueueMax, "request", "requests")+" per gateway, "+fmtDuration(s.QueueTimeout)+" timeout")
		}
	}
	gws := s.Gateways
	if gws == 0 {
		for _, r := range in.Runs {
			gws = max(gws, r.Summary.Gateways)
		}
	}
	switch {
	case gws > 1 && len(ledgers) > 1:
		row("Gateways", fmtInt(gws)+", ledgers "+joinAnd(quote(ledgers))+" (compared)")
	case gws > 1 && len(ledgers) == 1:
		row("Gateways", fmtInt(gws)+", "+code(ledgers[0])+" ledger")
	case gws > 0:
		row("Gateways", fmtInt(gws))
	}
}

// readAdmission generates the Reading statements on admission: the most
// goodput, preemptions, reservations beyond capacity and, with several
// ledgers, the over-admission of independent ones.
func readAdmission(in Input, aggs []policyAgg) []string {
	if len(aggs) == 0 || !showAdmission(in) {
		return nil
	}
	w := wordsOf(in)
	xs := aggregateAdmission(aggs)
	var out []string
	out = append(out, readGoodput(aggs, w))

	var pre []string
	for _, x := range xs {
		switch {
		case x.PreemptedSeeds == 0:
		case x.Preemptions.Med > 0:
			pre = append(pre, fmt.Sprintf("%s (on %d of %d seeds, median %s)", code(x.Policy), x.PreemptedSeeds, len(x.Runs), fmtCount(x.Preemptions.Med)))
		default:
			pre = append(pre, fmt.Sprintf("%s (on %d of %d seeds, at most %s)", code(x.Policy), x.PreemptedSeeds, len(x.Runs), fmtCount(x.Preemptions.Max)))
		}
	}
	switch {
	case len(pre) > 0:
		out = append(out, "Requests are preempted under "+joinAnd(pre)+".")
	case len(xs) == 1:
		out = append(out, "No request is preempted.")
	default:
		out = append(out, fmt.Sprintf("No %s preempts a request.", w.one))
	}

	var over []string
	known, most := false, 0.0
	for _, x := range xs {
		if !x.PeakKnown {
			continue
		}
		known, most = true, max(most, x.Peak.Max)
		if x.Peak.Max > 1 {
			over = append(over, fmt.Sprintf("%s (peak %s of capacity)", code(x.Policy), fmtShare(x.Peak.Max)))
		}
	}
	switch {
	case len(over) > 0:
		out = append(out, "Replicas are sent more KV blocks than their cache holds under "+joinAnd(over)+".")
	case known:
		out = append(out, fmt.Sprintf("No replica is sent more KV blocks than its cache holds (peak %s of capacity).", fmtShare(most)))
	}
	return append(out, readLedgers(xs)...)
}

// readGoodput names the variant with the most goodput, against the none
// variant of the same policy and ledger when there is one, else against the
// runner-up.
func readGoodput(aggs []policyAgg, w words) string {
	good := func(a *policyAgg) float64 { return a.Goodput.Med }
	bi := argBest(aggs, good, true, nil)
	best := &aggs[bi]
	if len(aggs) == 1 {
		return fmt.Sprintf("%s has a goodput of %s req/s.", code(best.Policy), fmtRate(best.Goodput.Med))
	}
	s := fmt.Sprintf("%s gives the most goodput, %s req/s", code(best.Policy), fmtRate(best.Goodput.Med))
	ni := argBest(aggs, good, true, func(a *policyAgg) bool {
		return a.Admission == admissionNone && basePolicy(a.Policy) == basePolicy(best.Policy) && a.Ledger == best.Ledger
	})
	what := ""
	other := ni
	if ni >= 0 && ni != bi {
		what = code(aggs[ni].Policy) + " (no admission)"
	} else {
		other = argBest(aggs, good, true, func(a *policyAgg) bool { return a != best })
		what = "the runner-up " + code(aggs[other].Policy)
	}
	if g := aggs[other].Goodput.Med; g > 0 {
		s += fmt.Sprintf(", %s that of %s, %s req/s.", fmtFactor(best.Goodput.Med/g), what, fmtRate(g))
	} else {
		s += fmt.Sprintf(", where %s has none.", what)
	}
	return s
}

// readLedgers compares, for every policy and admission rule run with both,
// the peak reservations of independent ledgers with a shared one.
func readLedgers(xs []admissionAgg) []string {
	var out []string
	for i := range xs {
		ind := &xs[i]
		if ind.Ledger != "independent" || !ind.PeakKnown {
			continue
		}
		j := slices.IndexFunc(xs, func(x admissionAgg) bool {
			return x.Ledger == "shared" && x.PeakKnown && x.Admission == ind.Admission && basePolicy(x.Policy) == basePolicy(ind.Policy)
		})
		if j < 0 {
			continue
		}
		sh := &xs[j]
		iv, sv := ind.Peak.Med, sh.Peak.Med
		s := fmt.Sprintf("With independent ledgers, %s peaks at %s of a replica's KV capacity (median over seeds), against %s for %s with a shared ledger",
			code(ind.Policy), fmtShare(iv), fmtShare(sv), code(sh.Policy))
		switch {
		case iv > sv && iv > 1:
			s += fmt.Sprintf(": each gateway counting only its own reservations, together they over-admit by %s of capacity", fmtShare(iv-max(sv, 1)))
			if sv > 1 {
				s += " beyond the shared ledger's"
			}
			s += "."
		case iv > sv:
			s += ", still within capacity."
		default:
			s += ": no more than sharing the ledger."
		}
		out = append(out, s)
	}
	return out
}
