// Package report turns simulation results into a benchmark report: a
// markdown document, report.md, with PNG charts beside it.
//
// Start at Input (report.go): the Setup of the experiment, the main
// comparison (Runs: one results.Summary per policy and seed, all at one
// offered rate and fleet size), and the optional load sweep (Sweep) and
// capacity search (Capacity). Write renders everything into a directory;
// Markdown writes report.md's text alone; Capacity.GPUsSaved is the
// arithmetic behind the capacity table.
//
// The report has a Setup section (fleet, engine profile and workload YAML,
// seeds, SLO, version and the command to reproduce), a Results table with
// the median over seeds of every policy (with a failed column, the failure
// reasons once below it, and the runs that look too short for their
// answer), an "Admission and queueing"
// section (admission.go) when a run has an admission rule other than none or
// a rejection, or the runs compare several admission rules or ledgers, a
// "Disaggregated prefill/decode" table when a run has prefill replicas
// (results.Summary.PD) and a "KV tiers" table when its engines have lower
// tiers (results.Summary.Tiers; pd.go, golden in testdata/pd.md), the
// charts, a Load sweep and a Capacity section when the input has them, and a
// Reading section of statements generated from the numbers: the lowest TTFT
// p99 and its factor against round_robin and the best cache-blind policy,
// whether the gap between the top two policies is within seed noise, hit
// rates, SLO misses, the most goodput, preemptions, reservations past
// capacity, the over-admission of independent ledgers, and capacity savings.
//
// A run's Policy may be a variant's label, policy+admission[+ledger] (e.g.
// cost_model+kv); the report then speaks of variants, and judges a label by
// its policy, the part before the first "+". Runs that compare P/D pools
// set Run.Pool (PoolName: P2D6, aggregated), and the label's column is then
// headed policy+...+pool. A capacity search over splits (Capacity.Split)
// names the best split of every answer and size (FleetText).
//
// Charts (charts.go) are drawn with gonum.org/v1/plot at 8x5 inches:
// ttft_cdf.png, ttft_bars.png, hit_rate.png, replica_requests.png,
// replica_busy.png, sweep_ttft_p99.png, sweep_goodput.png and capacity.png.
// Each policy keeps one color (and line dash) in every chart, and legends
// sit outside the plotting area so they never cover data.
//
// Policies appear everywhere in the caller's order: the order of first
// appearance in Input.Runs, then any further policy of Input.Sweep.
// Aggregates over seeds are medians (interpolated for an even count) with
// min and max for spreads.
//
// The tests build synthetic inputs (3 and 12 policies, and variants under
// admission rules); report.md of the 3-policy one is golden in
// testdata/report.md and that of the admission one in testdata/admission.md
// (regenerate with go test ./report -update), and go test ./report -args
// -out DIR writes the synthetic reports and charts under DIR for a look.
//
// Output is deterministic: the same Input gives byte-identical report.md and
// PNG files. Nothing depends on map iteration order, the clock or the
// environment.
package report
