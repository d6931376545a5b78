package fidelity

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/inferrail/inferrail/results"
)

// The files Write creates.
const (
	ReportFile = "fidelity.md"
	JSONFile   = "fidelity.json"
)

// Write writes fidelity.md, fidelity.json and the charts into dir,
// creating it. It returns the files written, in that order. The same result
// gives the same bytes.
func (res *Result) Write(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("write the fidelity report: %w", err)
	}
	charts, err := res.charts()
	if err != nil {
		return nil, err
	}
	var md, js bytes.Buffer
	if err := res.markdown(&md, charts); err != nil {
		return nil, err
	}
	if err := res.WriteJSON(&js); err != nil {
		return nil, err
	}
	files := []struct {
		name string
		data []byte
	}{{ReportFile, md.Bytes()}, {JSONFile, js.Bytes()}}
	for _, c := range charts {
		files = append(files, struct {
			name string
			data []byte
		}{c.name, c.png})
	}
	var names []string
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		if err := os.WriteFile(path, f.data, 0o644); err != nil {
			return nil, fmt.Errorf("write the fidelity report: %w", err)
		}
		names = append(names, path)
	}
	return names, nil
}

// WriteJSON writes the result as fidelity.json holds it.
func (res *Result) WriteJSON(w io.Writer) error { return results.WriteJSON(w, res) }

// Markdown writes fidelity.md's text alone, without charts.
func (res *Result) Markdown(w io.Writer) error { return res.markdown(w, nil) }

func fmtValue(k int, v float64) string {
	if k == mHit {
		return fmt.Sprintf("%.3f", v)
	}
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func fmtRel(p *float64) string {
	if p == nil {
		return "n/a"
	}
	return fmt.Sprintf("%+.1f%%", 100**p)
}

// fmtErr is a statistic's error: relative for times, the difference for
// hit rates (whose bound is absolute).
func fmtErr(k int, rel *float64, abs float64) string {
	if k == mHit {
		return fmt.Sprintf("%+.3f", abs)
	}
	return fmtRel(rel)
}

func fmtOpt(p *float64, f string) string {
	if p == nil {
		return "n/a"
	}
	if f == "%" {
		return fmt.Sprintf("%.1f%%", 100**p)
	}
	return fmt.Sprintf(f, *p)
}

var fromText = map[string]string{
	"records":  "from the recorded requests",
	"metadata": "from the recording's fleet description",
	"option":   "given on the command line",
}

func (res *Result) markdown(w io.Writer, charts []chart) error {
	var b strings.Builder
	trace := res.Trace
	if trace == "" {
		trace = "the recording"
	} else {
		trace = "`" + trace + "`"
	}
	fmt.Fprintf(&b, "# Simulator fidelity on %s\n\n", trace)
	b.WriteString("The recording was replayed through the simulator (the same gateway core and router as live, against virtual engines) " +
		"with its own arrivals, lengths, sessions and block hashes, and each request's predicted queue time, TTFT, TPOT, E2E and " +
		"hit rate compared with what live measured, request by request (matched by record id) and percentile by percentile.\n\n")
	b.WriteString("| setting | value |\n|---|---|\n")
	model := res.Model
	if model == "" {
		model = "(unnamed)"
	}
	fmt.Fprintf(&b, "| model | `%s`, %d records |\n", model, res.Counts.Records)
	fmt.Fprintf(&b, "| policy | `%s` (%s) |\n", res.Policy, fromText[res.PolicyFrom])
	fleetFrom := fromText[res.ReplicasFrom]
	if res.ReplicasFrom == "records" {
		fleetFrom = "the distinct replicas that served recorded requests"
	}
	fmt.Fprintf(&b, "| fleet | %d replicas (%s) |\n", res.Replicas, fleetFrom)
	fmt.Fprintf(&b, "| engine profile | `%s` |\n", res.Profile)
	fmt.Fprintf(&b, "| gateway | %s |\n", res.Gateway)
	fmt.Fprintf(&b, "| seed | %d |\n\n", res.Seed)
	o := &res.Overall
	fmt.Fprintf(&b, "**TTFT p50 %s, p99 %s; token hit rate %.3f measured, %.3f predicted (%+.3f); over %d requests that completed on both sides.**\n\n",
		fmtRel(o.TTFT.RelError.P50), fmtRel(o.TTFT.RelError.P99), o.TokenHitRate.Measured, o.TokenHitRate.Predicted, o.TokenHitRate.Diff, res.Counts.Matched)

	res.writeCounts(&b)
	b.WriteString("## Overall\n\n")
	b.WriteString("Errors are (predicted - measured) / measured; for hit rates, predicted - measured. Times in milliseconds.\n\n")
	writeStats(&b, o)
	b.WriteString("\nRequest by request:\n\n")
	b.WriteString("| metric | requests | mean absolute error | MAPE | median predicted / measured |\n|---|---|---|---|---|\n")
	for k := range nMetrics {
		m := o.metric(k)
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", metricTitles[k], m.PairedRequests, fmtValue(k, m.MeanAbsError), fmtOpt(m.MAPE, "%"), fmtOpt(m.MedianRatio, "%.3f"))
	}
	b.WriteString("\nMAPE and the median ratio are over the requests with a positive measured value.\n\n")
	res.writeReplicas(&b)
	if len(charts) > 0 {
		b.WriteString("## Charts\n\n")
		for _, c := range charts {
			fmt.Fprintf(&b, "![%s](%s)\n\n%s\n\n", c.alt, c.name, c.caption)
		}
	}
	b.WriteString("## Reading\n\n")
	for _, s := range res.reading() {
		b.WriteString("- " + s + "\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write %s: %w", ReportFile, err)
	}
	return nil
}

func writeStats(b *strings.Builder, c *Comparison) {
	b.WriteString("| metric | statistic | measured | predicted | error |\n|---|---|---|---|---|\n")
	for k := range nMetrics {
		m := c.metric(k)
		stats := []struct {
			name       string
			meas, pred float64
			rel        *float64
			abs        float64
		}{
			{"mean", m.Measured.Mean, m.Predicted.Mean, m.RelError.Mean, m.AbsError.Mean},
			{"p50", m.Measured.P50, m.Predicted.P50, m.RelError.P50, m.AbsError.P50},
			{"p90", m.Measured.P90, m.Predicted.P90, m.RelError.P90, m.AbsError.P90},
			{"p99", m.Measured.P99, m.Predicted.P99, m.RelError.P99, m.AbsError.P99},
		}
		for i, s := range stats {
			name := ""
			if i == 0 {
				name = fmt.Sprintf("%s (%d)", metricTitles[k], m.Requests)
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", name, s.name, fmtValue(k, s.meas), fmtValue(k, s.pred), fmtErr(k, s.rel, s.abs))
		}
	}
	fmt.Fprintf(b, "| token hit rate | cached / prompt tokens | %.3f | %.3f | %+.3f |\n", c.TokenHitRate.Measured, c.TokenHitRate.Predicted, c.TokenHitRate.Diff)
}

func (res *Result) writeCounts(b *strings.Builder) {
	c := &res.Counts
	b.WriteString("## Requests compared\n\n| requests | count |\n|---|---|\n")
	fmt.Fprintf(b, "| recorded | %d |\n", c.Records)
	if c.OtherModels > 0 {
		fmt.Fprintf(b, "| of other models (left out) | %d |\n", c.OtherModels)
	}
	for _, k := range sortedKeys(c.NotReplayed) {
		fmt.Fprintf(b, "| not replayed: %s (answered before the gateway core) | %d |\n", k, c.NotReplayed[k])
	}
	if c.RecorderDropped > 0 {
		fmt.Fprintf(b, "| dropped by the recorder (not in the file, not replayed) | %d |\n", c.RecorderDropped)
	}
	fmt.Fprintf(b, "| replayed | %d |\n", c.Replayed)
	fmt.Fprintf(b, "| completed on both sides: compared | %d |\n", c.Matched)
	fmt.Fprintf(b, "| failed in the recording only | %d |\n", c.OnlyInRecordingFailed)
	fmt.Fprintf(b, "| failed in the simulation only | %d |\n", c.OnlyInSimulationFailed)
	fmt.Fprintf(b, "| failed on both sides | %d |\n", c.BothFailed)
	if c.NoCachedTokens > 0 {
		fmt.Fprintf(b, "| compared, without reported cached tokens (left out of hit rates) | %d |\n", c.NoCachedTokens)
	}
	b.WriteString("\n")
	if len(c.RecordedFailed)+len(c.SimulatedFailed) > 0 {
		keys := sortedKeys(c.RecordedFailed)
		for _, k := range sortedKeys(c.SimulatedFailed) {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		b.WriteString("| outcome | meaning | recorded | simulated |\n|---|---|---|---|\n")
		for _, k := range keys {
			fmt.Fprintf(b, "| %s | %s | %d | %d |\n", k, results.ReasonMeaning(k), c.RecordedFailed[k], c.SimulatedFailed[k])
		}
		b.WriteString("\n")
	}
	b.WriteString("Requests that failed or were rejected on either side are counted here by outcome and left out of every latency and hit-rate comparison below.")
	if c.RecorderReordered > 0 {
		fmt.Fprintf(b, " The recorder moved the arrival of %d requests up to the previous row's (they outlived its reorder buffer): they replay late.", c.RecorderReordered)
	}
	if c.Reordered > 0 {
		fmt.Fprintf(b, " %d records were written after a later arrival (the recorder writes a request when it ends); the replay takes them in arrival order.", c.Reordered)
	}
	b.WriteString("\n\n")
}

func sortedKeys(m map[string]int) []string {
	keys := slices.Collect(maps.Keys(m))
	slices.Sort(keys)
	return keys
}

func (res *Result) writeReplicas(b *strings.Builder) {
	mp := &res.Mapping
	b.WriteString("## Per replica\n\n")
	order := "the configuration's order, from the recording's fleet description"
	if mp.Order == "records" {
		order = "the natural order of the names the records carry (digits as numbers)"
	}
	if mp.Meaningful {
		fmt.Fprintf(b, "Each simulated replica is paired with the recorded replica that served the most of the same requests "+
			"(greedily, largest overlap first; ties broken by recorded order, %s, then by simulated index). "+
			"%.1f%% of the %d requests dispatched on both sides went to paired replicas (meaningful from %.1f%%: halfway from chance to all). "+
			"Measured statistics are over the requests the recorded replica served, predicted ones over those its simulated twin served.\n\n",
			order, 100*mp.Agreement, mp.Dispatched, 100*mp.Threshold)
		b.WriteString("| recorded | simulated | requests measured / predicted | TTFT p50 measured / predicted | error | TTFT p99 measured / predicted | error | E2E p50 error | token hit rate measured / predicted | diff |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range res.PerReplica {
			t := &r.TTFT
			fmt.Fprintf(b, "| %s | %d | %d / %d | %s / %s | %s | %s / %s | %s | %s | %.3f / %.3f | %+.3f |\n", r.Recorded, r.Simulated,
				r.Measured, r.Predicted, fmtValue(mTTFT, t.Measured.P50), fmtValue(mTTFT, t.Predicted.P50), fmtRel(t.RelError.P50),
				fmtValue(mTTFT, t.Measured.P99), fmtValue(mTTFT, t.Predicted.P99), fmtRel(t.RelError.P99), fmtRel(r.E2E.RelError.P50),
				r.TokenHitRate.Measured, r.TokenHitRate.Predicted, r.TokenHitRate.Diff)
		}
		b.WriteString("\nfidelity.json has every metric and percentile per replica.\n\n")
		return
	}
	fmt.Fprintf(b, "The simulated replicas are not paired with recorded ones: %s. Each side is described alone, "+
		"the measured one by recorded name, the predicted one by simulated index.\n\n", mp.Why)
	for _, s := range []struct {
		title string
		rows  []ReplicaSide
	}{{"Measured", res.MeasuredReplicas}, {"Predicted", res.PredictedReplicas}} {
		fmt.Fprintf(b, "%s:\n\n| replica | requests | queue p99 | TTFT p50 | TTFT p99 | TPOT p50 | E2E p50 | token hit rate |\n|---|---|---|---|---|---|---|---|\n", s.title)
		for _, r := range s.rows {
			fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %.3f |\n", r.Replica, r.Requests, fmtValue(mQueue, r.Queue.P99),
				fmtValue(mTTFT, r.TTFT.P50), fmtValue(mTTFT, r.TTFT.P99), fmtValue(mTPOT, r.TPOT.P50), fmtValue(mE2E, r.E2E.P50), r.HitRate)
		}
		b.WriteString("\n")
	}
}

// reading states what the numbers show.
func (res *Result) reading() []string {
	var out []string
	o := &res.Overall
	c := &res.Counts
	if res.PolicyFrom == "option" && res.RecordedPolicy != "" && res.RecordedPolicy != res.Policy {
		out = append(out, fmt.Sprintf("The replay routed with %s, the recording with %s: the errors below measure what the other policy would change, not the simulator's fidelity.", res.Policy, res.RecordedPolicy))
	}
	if res.ReplicasFrom == "option" && res.RecordedReplicas > 0 && res.RecordedReplicas != res.Replicas {
		out = append(out, fmt.Sprintf("The replay ran %d replicas, the recording %d: the errors below measure what the other fleet size would change, not the simulator's fidelity.", res.Replicas, res.RecordedReplicas))
	}
	if c.Matched == 0 {
		return append(out, "No request completed on both sides: there is nothing to compare.")
	}
	type worst struct {
		k    int
		stat string
		rel  float64
	}
	var ws []worst
	for _, k := range []int{mTTFT, mTPOT, mE2E} {
		m := o.metric(k)
		for _, s := range []struct {
			name string
			rel  *float64
		}{{"p50", m.RelError.P50}, {"p90", m.RelError.P90}, {"p99", m.RelError.P99}, {"mean", m.RelError.Mean}} {
			if s.rel != nil {
				ws = append(ws, worst{k, s.name, *s.rel})
			}
		}
	}
	if len(ws) > 0 {
		w := slices.MaxFunc(ws, func(a, b worst) int { return cmp.Compare(math.Abs(a.rel), math.Abs(b.rel)) })
		if math.Abs(w.rel) <= 0.10 {
			out = append(out, fmt.Sprintf("Every TTFT, TPOT and E2E statistic is within 10%% of the measured one (the largest error: %s %s, %s).", metricTitles[w.k], w.stat, fmtRel(&w.rel)))
		} else {
			way := "slower"
			if w.rel < 0 {
				way = "faster"
			}
			var off []string
			for _, x := range ws {
				if math.Abs(x.rel) > 0.10 {
					off = append(off, fmt.Sprintf("%s %s %s", metricTitles[x.k], x.stat, fmtRel(&x.rel)))
				}
			}
			out = append(out, fmt.Sprintf("The largest error is %s %s: the simulator predicts it %s than measured (%s). Off by more than 10%%: %s.",
				metricTitles[w.k], w.stat, way, fmtRel(&w.rel), strings.Join(off, ", ")))
		}
	}
	if d := o.TokenHitRate.Diff; math.Abs(d) <= 0.02 {
		out = append(out, fmt.Sprintf("The token hit rate is within 0.02 of the measured one (%+.3f): the simulated caches hold what the real ones held.", d))
	} else {
		way := "more"
		if d < 0 {
			way = "less"
		}
		out = append(out, fmt.Sprintf("The simulated caches find %s of the prompts cached than the real ones did (%+.3f): the routing, the cache size (the profile's KV blocks) or the block hashes differ from what the engines saw.", way, d))
	}
	if o.Queue.Measured.P99 == 0 {
		out = append(out, "No compared request waited in the recorded gateway's queue (queue p99 0), so queue errors say nothing.")
	} else if o.Queue.Predicted.P99 == 0 {
		out = append(out, "Recorded requests waited in the gateway's queue but none did in the simulation: the simulated fleet has more capacity than the recorded one (a faster profile, more KV blocks), or the gateway's settings differ.")
	}
	if n := c.OnlyInRecordingFailed + c.OnlyInSimulationFailed; n > 0 {
		out = append(out, fmt.Sprintf("%d requests failed on one side only (%d in the recording, %d in the simulation): see the outcome table.", n, c.OnlyInRecordingFailed, c.OnlyInSimulationFailed))
	}
	if c.RecorderDropped > 0 {
		out = append(out, fmt.Sprintf("The recorder dropped %d requests (its buffer was full): their load is missing from the replay, so the simulated fleet was offered less than the real one.", c.RecorderDropped))
	}
	if res.ReplicasFrom == "records" {
		out = append(out, "The fleet size is the number of replicas that served recorded requests; a replica that served none does not appear in the records.")
	}
	if !res.Mapping.Meaningful {
		out = append(out, "Per-replica errors are not given: "+res.Mapping.Why+".")
	}
	return out
}
