package report

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/inferrail/inferrail/results"
)

// Markdown writes report.md's text. charts are the chart file names to
// embed, referenced by relative name, in the given order (usually what Write
// returns); a name the package does not know gets a generic caption.
func Markdown(w io.Writer, in Input, charts []string) error {
	if err := validate(in); err != nil {
		return err
	}
	order := policyOrder(in.Runs)
	aggs := aggregate(in.Runs, order)
	sweep := aggregateSweep(in.Sweep, policyOrder(in.Runs, in.Sweep))

	var b strings.Builder
	writeHeader(&b, in, aggs)
	writeSetup(&b, in, order)
	if len(in.Runs) > 0 {
		writeResults(&b, in, aggs)
		if showAdmission(in) {
			writeAdmission(&b, in, aggs)
		}
		if showPD(in) {
			writePD(&b, in, aggs)
		}
		if showTiers(in) {
			writeTiers(&b, in, aggs)
		}
	}
	writeCharts(&b, in, aggs, charts)
	if len(in.Sweep) > 0 {
		writeSweep(&b, sweep)
	}
	if in.Capacity != nil {
		writeCapacity(&b, in)
	}
	writeReading(&b, in, aggs, sweep)

	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("report: write markdown: %w", err)
	}
	return nil
}

// title is the report's title.
func title(in Input) string {
	if in.Setup.Title != "" {
		return in.Setup.Title
	}
	if in.Setup.Workload != "" {
		return "Routing benchmark: " + in.Setup.Workload
	}
	return "Routing benchmark"
}

// fleetSize is the fleet of the main comparison.
func fleetSize(in Input) []int {
	if in.Setup.Replicas > 0 {
		return []int{in.Setup.Replicas}
	}
	var sizes []int
	for _, r := range in.Runs {
		sizes = append(sizes, runReplicas(r))
	}
	slices.Sort(sizes)
	return slices.Compact(sizes)
}

// mainRates lists the distinct offered rates of the main comparison.
func mainRates(in Input) []float64 {
	var rates []float64
	for _, r := range in.Runs {
		rates = append(rates, runRate(r))
	}
	slices.Sort(rates)
	return slices.Compact(rates)
}

// seedsOf lists the seeds of the setup, else of the runs, ascending.
func seedsOf(in Input) []uint64 {
	seeds := slices.Clone(in.Setup.Seeds)
	if len(seeds) == 0 {
		for _, r := range in.Runs {
			seeds = append(seeds, r.Seed)
		}
	}
	slices.Sort(seeds)
	return slices.Compact(seeds)
}

func joinInts(ns []int, suffix string) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmtInt(n)
	}
	return strings.Join(s, ", ") + suffix
}

func joinRates(rs []float64) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmtRate(r)
	}
	return strings.Join(s, ", ") + " req/s"
}

func joinSeeds(seeds []uint64) string {
	s := make([]string, len(seeds))
	for i, v := range seeds {
		s[i] = strconv.FormatUint(v, 10)
	}
	return strings.Join(s, ", ")
}

func pluralWord(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmtInt(n) + " " + many
}

func writeHeader(b *strings.Builder, in Input, aggs []policyAgg) {
	w := wordsOf(in)
	fmt.Fprintf(b, "# %s\n\n", title(in))
	if len(in.Runs) == 0 && in.Capacity != nil {
		c := in.Capacity
		fmt.Fprintf(b, "Capacity search: the fewest replicas each of %s needs to meet the SLO at %s offered on workload %s, searching fleets of 1 to %s replicas over %s. Latencies are in milliseconds.\n\n",
			plural(len(c.Rows), w.one, w.many), joinRates([]float64{c.RateRPS}), code(orDash(c.Workload)),
			fmtInt(c.MaxReplicas), plural(len(seedsOf(in)), "seed", "seeds"))
		return
	}
	minSeeds, maxSeeds := 0, 0
	for i, a := range aggs {
		if i == 0 || len(a.Runs) < minSeeds {
			minSeeds = len(a.Runs)
		}
		maxSeeds = max(maxSeeds, len(a.Runs))
	}
	seeds := plural(maxSeeds, "seed", "seeds")
	if minSeeds != maxSeeds {
		seeds = strconv.Itoa(minSeeds) + "–" + seeds
	}
	var parts []string
	parts = append(parts, plural(len(aggs), w.one, w.many))
	if in.Setup.Workload != "" {
		parts[0] += " on workload " + code(in.Setup.Workload)
	}
	parts = append(parts, joinInts(fleetSize(in), " replicas"), joinRates(mainRates(in))+" offered")
	fmt.Fprintf(b, "%s, %s per %s. Figures are medians over seeds unless stated otherwise; latencies are in milliseconds.\n\n",
		strings.Join(parts, ", "), seeds, strings.TrimPrefix(w.one, "routing "))
}

// profileName is Setup.Profile, or the top-level name: of the profile YAML.
func profileName(s Setup) string {
	if s.Profile != "" {
		return s.Profile
	}
	for _, line := range strings.Split(s.ProfileYAML, "\n") {
		if v, ok := strings.CutPrefix(line, "name:"); ok {
			return strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	return ""
}

// sloText describes the SLO.
func sloText(s results.SLO) string {
	return "TTFT p99 ≤ " + fmtMs(durationMs(s.TTFTP99)) + " ms and TPOT p99 ≤ " + fmtMs(durationMs(s.TPOTP99)) + " ms"
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func writeSetup(b *strings.Builder, in Input, order []string) {
	s := in.Setup
	b.WriteString("## Setup\n\n| Item | Value |\n|---|---|\n")
	row := func(k, v string) { fmt.Fprintf(b, "| %s | %s |\n", k, cell(v)) }
	if s.Workload != "" {
		row("Workload", code(s.Workload))
	} else {
		row("Workload", "—")
	}
	if len(in.Runs) == 0 && in.Capacity != nil {
		searched := " replicas (searched)"
		if in.Capacity.Split {
			searched = " replicas (searched, each aggregated and under every prefill/decode split)"
		}
		row("Fleet", "1 to "+fmtInt(in.Capacity.MaxReplicas)+searched)
		row("Offered load", joinRates([]float64{in.Capacity.RateRPS}))
		order = nil
		for _, r := range in.Capacity.Rows {
			order = append(order, r.Policy)
		}
	} else {
		row("Fleet", joinInts(fleetSize(in), " replicas"))
		row("Offered load", joinRates(mainRates(in)))
	}
	prof := profileName(s)
	if prof != "" {
		prof = code(prof)
	}
	row("Engine profile", orDash(prof))
	quoted := make([]string, len(order))
	for i, p := range order {
		quoted[i] = code(p)
	}
	if w := wordsOf(in); w.one == "variant" {
		row("Variants ("+strings.ToLower(w.header)+")", strings.Join(quoted, ", "))
	} else {
		row("Policies", strings.Join(quoted, ", "))
	}
	row("Seeds", orDash(joinSeeds(seedsOf(in))))
	if s.Requests > 0 {
		row("Requests per run", fmtInt(s.Requests))
	} else {
		row("Requests per run", "—")
	}
	row("Warmup", fmtDuration(s.Warmup)+" (requests arriving earlier are not measured)")
	if s.ScrapeInterval > 0 {
		row("Scrape interval", fmtDuration(s.ScrapeInterval))
	} else {
		row("Scrape interval", "—")
	}
	row("Index mode", orDash(s.Index))
	if len(in.Runs) > 0 && showAdmission(in) {
		gatewaySetupRows(in, row)
	}
	row("SLO", sloText(sloOf(s.SLO)))
	row("Version", orDash(s.Version))
	b.WriteString("\n")

	if s.Command != "" {
		f := fence(s.Command)
		fmt.Fprintf(b, "Reproduce with:\n\n%ssh\n%s\n%s\n\n", f, strings.TrimRight(s.Command, "\n"), f)
	}
	yamlBlock := func(summary, text string) {
		text = strings.TrimRight(text, "\n")
		if text == "" {
			return
		}
		f := fence(text)
		fmt.Fprintf(b, "<details>\n<summary>%s</summary>\n\n%syaml\n%s\n%s\n\n</details>\n\n", summary, f, text, f)
	}
	profSummary := "Engine profile (YAML)"
	if p := profileName(s); p != "" {
		profSummary = "Engine profile <code>" + htmlEscape(p) + "</code> (YAML)"
	}
	yamlBlock(profSummary, s.ProfileYAML)
	wlSummary := "Workload configuration (YAML)"
	if s.Workload != "" {
		wlSummary = "Workload <code>" + htmlEscape(s.Workload) + "</code> configuration (YAML)"
	}
	yamlBlock(wlSummary, s.WorkloadYAML)
}

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// withRange formats a median with its min–max over seeds when they differ.
func withRange(s spread, f func(float64) string) string {
	if s.Min == s.Max {
		return f(s.Med)
	}
	return f(s.Med) + " (" + f(s.Min) + "–" + f(s.Max) + ")"
}

func writeResults(b *strings.Builder, in Input, aggs []policyAgg) {
	w := wordsOf(in)
	b.WriteString("## Results\n\n")
	b.WriteString("One row per " + strings.TrimPrefix(w.one, "routing ") + ", medians over seeds. TTFT p99 shows the min–max over seeds in brackets. " +
		"Hit rate is the share of prompt tokens served from the prefix cache, measured by the engines / predicted by the router; " +
		"exact is the share of requests whose predicted cached tokens equalled the engine's. " +
		"SLO attainment is the share of requests meeting both SLO bounds, failed requests counting as misses; SLO met counts the seeds whose TTFT and TPOT p99 are within the SLO. " +
		"Goodput is requests meeting the SLO per second of the measured window (from the first to the last measured arrival, the drain after it left out). " +
		"Failed counts the measured requests that did not complete (rejected by the gateway or failed by an engine); the reasons follow the table.\n\n")
	b.WriteString("| " + w.header + " | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p99 (ms) | Hit rate meas. / pred. | Exact | SLO attainment | SLO met | Goodput (req/s) | Failed | Preemptions |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, a := range aggs {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s / %s | %s | %s | %d/%d | %s | %s | %s |\n",
			cell(a.Policy),
			fmtMs(a.TTFTP50.Med),
			withRange(a.TTFTP99, fmtMs),
			fmtMs(a.TPOTP99.Med),
			fmtPct(a.HitRate.Med), fmtPct(a.Predicted.Med),
			fmtPct(a.Exact.Med),
			fmtPct(a.Attainment.Med),
			a.SLOMet, len(a.Runs),
			fmtRate(a.Goodput.Med),
			withRange(a.Failed, fmtCount),
			fmtCount(a.Preemptions.Med))
	}
	b.WriteString("\n")
	writeRunNotes(b, in.Runs)
}

// writeRunNotes says once why requests failed in the runs, and which runs
// look too short for their answer.
func writeRunNotes(b *strings.Builder, runs []Run) {
	sums := make([]results.Summary, len(runs))
	for i, r := range runs {
		sums[i] = r.Summary
	}
	if notes := results.FailureNotes(sums); len(notes) > 0 {
		b.WriteString("Failed requests by reason, over every run above:\n\n")
		for _, n := range notes {
			b.WriteString("- " + cell(n.String()) + "\n")
		}
		b.WriteString("\n")
	}
	// One line per policy: its unsteady seeds and the first one's warning.
	var warns []string
	for _, p := range policyOrder(runs) {
		var seeds []uint64
		first := ""
		for _, r := range runs {
			if runPolicy(r) == p && r.Summary.Steady.Warning != "" {
				if first == "" {
					first = r.Summary.Steady.Warning
				}
				seeds = append(seeds, r.Seed)
			}
		}
		if len(seeds) > 0 {
			slices.Sort(seeds)
			warns = append(warns, fmt.Sprintf("%s, %s %s (the first: %s)", code(p), pluralWord(len(seeds), "seed", "seeds"), joinSeeds(seeds), first))
		}
	}
	if len(warns) > 0 {
		b.WriteString("Steady state: these runs look too short for their answer (the second half of the measured window has a TTFT p99 more than " +
			strconv.FormatFloat(results.SteadyRise, 'g', -1, 64) + "× the first half's, or " +
			strconv.FormatFloat(results.SteadyBacklogRise, 'g', -1, 64) + "× as many requests in flight, or the requests arrived at less than " +
			strconv.FormatFloat(100*results.SteadyRate, 'g', -1, 64) + "% of the configured rate):\n\n")
		for _, w := range warns {
			b.WriteString("- " + w + "\n")
		}
		b.WriteString("\n")
	}
}

// chartCaption returns the alt text and caption of a chart.
func chartCaption(name string, in Input, aggs []policyAgg) (alt, caption string) {
	slo := sloOf(in.Setup.SLO)
	per := wordsOf(in).short()
	switch name {
	case chartTTFTCDF:
		return "TTFT CDF per " + per,
			"Distribution of TTFT per " + per + ", all seeds pooled: the share of requests (y) whose TTFT is at most x ms (log scale). The dash-dotted vertical line is the TTFT SLO (" + fmtMs(durationMs(slo.TTFTP99)) + " ms)."
	case chartTTFTBars:
		scale := ""
		if ttftBarsLog(aggs) {
			scale = " (log scale)"
		}
		return "TTFT p50 and p99 per " + per,
			"TTFT p50 (light bars) and p99 (dark bars) per " + per + " in ms" + scale + ", median over seeds; whiskers span min–max over seeds."
	case chartHitRate:
		return "Prefix-cache hit rate per " + per,
			"Share of prompt tokens served from the prefix cache, median over seeds: measured by the engines (dark bars) and predicted by the router (light bars)."
	case chartReplicaRequests, chartReplicaBusy:
		_, seed, common := replicaRun(in, aggs)
		which := "each " + per + "'s first seed"
		if common {
			which = "seed " + strconv.FormatUint(seed, 10) + ", the same request trace for every " + per
		}
		if name == chartReplicaRequests {
			even := "the dash-dotted line is an even split"
			if runs, _, _ := replicaRun(in, aggs); dispatchedDiffer(runs) {
				even = "the dash-dotted line is an even split of the " + wordsOf(in).many + "' mean total (they dispatched different totals)"
			}
			return "Requests per replica",
				"Measured requests dispatched to each replica (" + which + "); " + even + ". Bars of equal height mean balanced load."
		}
		return "Busy fraction per replica",
			"Share of the simulated time each replica's engine was running a step, any step (" + which + "): one request in flight keeps an engine busy, so busy nears 100% at any load that rarely empties a replica; it says the replica had work, not how much of its capacity the work used."
	case chartSweepTTFT:
		return "TTFT p99 against offered load",
			"TTFT p99 in ms (log scale, median over seeds) against offered load in req/s; the dash-dotted line is the TTFT SLO."
	case chartSweepGoodput:
		return "Goodput against offered load",
			"Goodput (requests meeting the SLO per second, median over seeds) against offered load; the dash-dotted line is goodput = offered load, which a policy meeting the SLO for every request would follow."
	case chartCapacity:
		c := in.Capacity
		if c == nil {
			break
		}
		caption := "Fewest replicas meeting the SLO at " + fmtRate(c.RateRPS) + " req/s, searching fleets of up to " +
			plural(c.MaxReplicas, "replica", "replicas") + "."
		if slices.ContainsFunc(c.Rows, func(r CapacityRow) bool { return r.Replicas <= 0 }) {
			caption += " Hatched bars drawn at " + strconv.Itoa(c.MaxReplicas+1) + " mark policies that never met it."
		}
		if base := c.row(c.BaselinePolicy()); base != nil && base.Replicas > 0 {
			caption += " The dash-dotted line is the cache-blind baseline, " + base.Policy + "."
		}
		return "Replicas needed to meet the SLO", caption
	}
	return name, name
}

// dispatchedDiffer reports whether the runs dispatched different numbers of
// measured requests to their replicas (as rejections make them).
func dispatchedDiffer(runs []Run) bool {
	total := func(r Run) int {
		n := 0
		for _, rs := range r.Summary.PerReplica {
			n += rs.Requests
		}
		return n
	}
	for _, r := range runs {
		if total(r) != total(runs[0]) {
			return true
		}
	}
	return false
}

func writeCharts(b *strings.Builder, in Input, aggs []policyAgg, charts []string) {
	if len(charts) == 0 {
		return
	}
	b.WriteString("## Charts\n\n")
	for _, name := range charts {
		alt, caption := chartCaption(name, in, aggs)
		fmt.Fprintf(b, "![%s](%s)\n\n*%s*\n\n", alt, name, caption)
	}
}

func writeSweep(b *strings.Builder, t sweepTable) {
	b.WriteString("## Load sweep\n\n")
	b.WriteString("Medians over seeds at each offered load; — where a policy was not run at that load.\n\n")
	header := func(metric string) {
		fmt.Fprintf(b, "| %s |", metric)
		for _, r := range t.Rates {
			fmt.Fprintf(b, " %s req/s |", fmtRate(r))
		}
		b.WriteString("\n|---|")
		for range t.Rates {
			b.WriteString("--:|")
		}
		b.WriteString("\n")
	}
	table := func(metric string, f func(c *sweepCell) string) {
		header(metric)
		for i, p := range t.Policies {
			fmt.Fprintf(b, "| %s |", cell(p))
			for _, c := range t.Cells[i] {
				if c == nil {
					b.WriteString(" — |")
					continue
				}
				fmt.Fprintf(b, " %s |", f(c))
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	table("TTFT p99 (ms)", func(c *sweepCell) string { return fmtMs(c.TTFTP99.Med) })
	table("Goodput (req/s)", func(c *sweepCell) string { return fmtRate(c.Goodput.Med) })
}

// replicasText formats a capacity result.
func replicasText(n, maxReplicas int) string {
	if n <= 0 {
		return "not met ≤ " + strconv.Itoa(maxReplicas)
	}
	return strconv.Itoa(n)
}

func writeCapacity(b *strings.Builder, in Input) {
	c := in.Capacity
	base := c.BaselinePolicy()
	b.WriteString("## Capacity\n\n")
	wl := ""
	if c.Workload != "" {
		wl = " on workload " + code(c.Workload)
	}
	fmt.Fprintf(b, "Fewest replicas whose median TTFT p99 and TPOT p99 over seeds meet the SLO at %s req/s%s, searching fleets of up to %s. ",
		fmtRate(c.RateRPS), wl, plural(c.MaxReplicas, "replica", "replicas"))
	if c.Split {
		b.WriteString("Every fleet size n was tried aggregated and under every prefill/decode split (p prefill and n − p decode replicas, p from 1 to n − 1); " +
			"n meets the SLO when any of them does, and the split shown is the best: of those meeting the SLO the lowest TTFT p99, ties to fewer prefill replicas. ")
	}
	baseRow := c.row(base)
	switch {
	case base == "" || baseRow == nil:
		b.WriteString("No cache-blind baseline was evaluated, so no savings are shown.\n\n")
	default:
		fmt.Fprintf(b, "Savings are against %s, the best cache-blind policy; per four is the saving scaled to a four-GPU baseline fleet.\n\n", code(base))
	}
	b.WriteString("| " + wordsOf(in).header + " | Replicas needed | GPUs saved vs baseline | Saved per 4 GPUs |\n|---|--:|--:|--:|\n")
	for _, r := range c.Rows {
		saved, perFour, ok := c.GPUsSaved(r.Policy)
		savedText, perFourText := "—", "—"
		switch {
		case ok:
			savedText = strconv.Itoa(saved)
			perFourText = strconv.FormatFloat(perFour, 'f', 2, 64)
		case baseRow != nil && baseRow.Replicas <= 0 && r.Replicas > 0:
			// The baseline never met the SLO: the saving is a lower bound.
			savedText = "≥ " + strconv.Itoa(c.MaxReplicas+1-r.Replicas)
		}
		name := cell(r.Policy)
		if r.Policy == base {
			name += " (baseline)"
		}
		need := replicasText(r.Replicas, c.MaxReplicas)
		if c.Split && r.Replicas > 0 {
			need = FleetText(r.Replicas, r.Prefill, r.Decode, true)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", name, need, savedText, perFourText)
	}
	b.WriteString("\n")
	var never []string
	for _, r := range c.Rows {
		if r.Replicas <= 0 {
			never = append(never, code(r.Policy))
		}
	}
	if len(never) > 0 {
		them := "them as hatched bars"
		if len(never) == 1 {
			them = "it as a hatched bar"
		}
		fmt.Fprintf(b, "%s did not meet the SLO with any fleet of up to %s; the chart draws %s at %d.\n\n",
			joinAnd(never), plural(c.MaxReplicas, "replica", "replicas"), them, c.MaxReplicas+1)
	}

	var sizes []int
	for _, r := range c.Rows {
		for _, p := range r.Points {
			sizes = append(sizes, p.Replicas)
		}
	}
	slices.Sort(sizes)
	sizes = slices.Compact(sizes)
	if len(sizes) == 0 {
		writeCapacityNotes(b, c)
		return
	}
	legend := "TTFT p99 / TPOT p99 in ms (medians over seeds) at each fleet size evaluated; ✓ meets the SLO, ✗ does not"
	if slices.ContainsFunc(c.Rows, func(r CapacityRow) bool {
		return slices.ContainsFunc(r.Points, func(p CapacityPoint) bool { return p.Failed > 0 })
	}) {
		legend += "; (N failed): the most requests a seed's run did not complete (the SLO needs every request completed)"
	}
	if slices.ContainsFunc(c.Rows, func(r CapacityRow) bool {
		return slices.ContainsFunc(r.Points, func(p CapacityPoint) bool { return p.Unsteady > 0 })
	}) {
		legend += "; ⚠ some seed's run looks too short for its answer (not steady)"
	}
	if c.Split {
		legend += "; each size shows its best split, e.g. P2D4 (2 prefill and 4 decode replicas) or aggregated"
	}
	b.WriteString(legend + ".\n\n| " + wordsOf(in).header + " |")
	for _, n := range sizes {
		fmt.Fprintf(b, " %s |", plural(n, "replica", "replicas"))
	}
	b.WriteString("\n|---|")
	for range sizes {
		b.WriteString("--:|")
	}
	b.WriteString("\n")
	for _, r := range c.Rows {
		fmt.Fprintf(b, "| %s |", cell(r.Policy))
		for _, n := range sizes {
			i := slices.IndexFunc(r.Points, func(p CapacityPoint) bool { return p.Replicas == n })
			if i < 0 {
				b.WriteString(" — |")
				continue
			}
			p := r.Points[i]
			mark := "✗"
			if p.Met {
				mark = "✓"
			}
			if p.Failed > 0 {
				mark += " (" + fmtInt(p.Failed) + " failed)"
			}
			if p.Unsteady > 0 {
				mark += " ⚠"
			}
			if c.Split {
				mark += " " + PoolName(p.Prefill, p.Decode)
			}
			fmt.Fprintf(b, " %s / %s %s |", fmtMs(p.TTFTP99Ms), fmtMs(p.TPOTP99Ms), mark)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	writeCapacityNotes(b, c)
}

// writeCapacityNotes says once why requests failed in the search, and which
// answers may be too low.
func writeCapacityNotes(b *strings.Builder, c *Capacity) {
	if len(c.Failures) > 0 {
		b.WriteString("Failed requests by reason, over every run of the search:\n\n")
		for _, f := range c.Failures {
			b.WriteString("- " + cell(f) + "\n")
		}
		b.WriteString("\n")
	}
	if len(c.Warnings) > 0 {
		b.WriteString("Steady state:\n\n")
		for _, w := range c.Warnings {
			b.WriteString("- " + cell(w) + "\n")
		}
		b.WriteString("\n")
	}
}

func writeReading(b *strings.Builder, in Input, aggs []policyAgg, sweep sweepTable) {
	lines := reading(in, aggs, sweep)
	if len(lines) == 0 {
		return
	}
	b.WriteString("## Reading\n\n")
	for _, l := range lines {
		b.WriteString("- " + l + "\n")
	}
}
