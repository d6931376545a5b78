package compare

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/inferrail/inferrail/report"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/workload"
)

// Meta describes a comparison for its report.
type Meta struct {
	Title   string
	Version string
	Command string
}

// CheckWritable makes dir and proves a file can be written there, so that
// an unwritable --out fails before any simulation runs.
func CheckWritable(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".inferrail-write-check-*")
	if err != nil {
		return fmt.Errorf("%s is not writable: %w", dir, err)
	}
	name := f.Name()
	return errors.Join(f.Close(), os.Remove(name))
}

// Write stores a comparison in dir: results.json (one summary per variant x
// rate x seed), requests.parquet (every request, with policy, seed, rate
// and fleet size columns, when the points kept their records; the policy
// column holds the variant's label, e.g. cost_model+kv, so that variants
// stay apart), capacity.json (when caps is not nil), report.md and its
// charts.
func Write(dir string, s Spec, pts []Point, caps *CapacityReport, meta Meta) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	var files []string
	if len(pts) > 0 {
		if err := writeJSON(filepath.Join(dir, "results.json"), Summaries(pts)); err != nil {
			return nil, err
		}
		files = append(files, "results.json")
	}
	if caps != nil {
		if err := writeJSON(filepath.Join(dir, "capacity.json"), caps.summary()); err != nil {
			return nil, err
		}
		files = append(files, "capacity.json")
	}
	var rows []results.Row
	for _, p := range pts {
		if p.Records == nil {
			continue
		}
		rs := results.RowsFromRecords(p.Records, s.Base.Workload.Workload, p.name(), p.Seed)
		for i := range rs {
			rs[i].RateRPS = p.Rate
			rs[i].FleetSize = int32(p.Replicas)
		}
		rows = append(rows, rs...)
	}
	if rows != nil {
		if err := results.WriteParquetFile(filepath.Join(dir, "requests.parquet"), rows); err != nil {
			return nil, fmt.Errorf("write requests.parquet: %w", err)
		}
		files = append(files, "requests.parquet")
	}
	in, err := reportInput(s, pts, caps, meta)
	if err != nil {
		return nil, err
	}
	charts, err := report.Write(dir, in)
	if err != nil {
		return nil, fmt.Errorf("write report: %w", err)
	}
	if err := addTenantSections(dir, s, pts); err != nil {
		return nil, err
	}
	files = append(files, "report.md")
	return append(files, charts...), nil
}

func writeJSON(path string, v any) error {
	var b bytes.Buffer
	if err := results.WriteJSON(&b, v); err != nil {
		return err
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// CapacityReport is a capacity search with its question.
type CapacityReport struct {
	Spec    CapacitySpec
	Results []CapacityResult
}

// name is the point's label, else its policy.
func (p Point) name() string {
	if p.Label != "" {
		return p.Label
	}
	return p.Policy
}

// Fleet describes the answer, e.g. "6", or in a search over splits "6 (2
// prefill + 4 decode)" or "6 (aggregated)" (Pool.Fleet).
func (r CapacityResult) Fleet() string { return r.Pool.Fleet(r.Replicas, r.Split) }

// name is the result's label, else its policy.
func (r CapacityResult) name() string {
	if r.Label != "" {
		return r.Label
	}
	return r.Policy
}

// Baseline returns the label of the cache-blind variant needing the fewest
// replicas (ties: the first in spec order), or "" when none was searched or
// none met the SLO.
func (c *CapacityReport) Baseline() string {
	best, n := "", 0
	for _, r := range c.Results {
		if IsCacheBlind(r.Policy) && r.Replicas > 0 && (n == 0 || r.Replicas < n) {
			best, n = r.name(), r.Replicas
		}
	}
	return best
}

// OfferedRate is the load the search ran at: the searched rate, or for a
// trace replay (which runs at its own arrival times) the rate its arrivals
// offer, as measured in the search's runs.
func (c *CapacityReport) OfferedRate() float64 {
	if c.Spec.Base.Source == nil {
		return c.Spec.Rate
	}
	for _, r := range c.Results {
		for _, p := range r.Points {
			if p.RateRPS > 0 {
				return p.RateRPS
			}
		}
	}
	return 0
}

// Savings is the replicas the variant labelled label saves against the
// baseline (Baseline) and that saving per four GPUs: report.Capacity's
// GPUsSaved, the one rule for it. ok is false when either does not meet the
// SLO up to MaxReplicas.
func (c *CapacityReport) Savings(label string) (saved int, perFour float64, ok bool) {
	return c.toReport().GPUsSaved(label)
}

// FailureNotes says once, over every run of the search, why requests did
// not complete (results.FailureNotes); nil when none failed.
func (c *CapacityReport) FailureNotes() []results.FailureNote {
	var sums []results.Summary
	for _, r := range c.Results {
		sums = append(sums, r.failures...)
	}
	return results.FailureNotes(sums)
}

// Warnings lists the results whose answer may be too low because the runs
// behind it look too short (CapacityResult.Warning).
func (c *CapacityReport) Warnings() []string {
	var out []string
	for _, r := range c.Results {
		if r.Warning != "" {
			out = append(out, r.Warning)
		}
	}
	return out
}

func (c *CapacityReport) toReport() *report.Capacity {
	out := &report.Capacity{
		Workload:    c.Spec.Base.Workload.Workload,
		RateRPS:     c.OfferedRate(),
		MaxReplicas: c.Spec.MaxReplicas,
		Split:       c.Spec.Split,
		Baseline:    c.Baseline(),
		Warnings:    c.Warnings(),
	}
	for _, n := range c.FailureNotes() {
		out.Failures = append(out.Failures, n.String())
	}
	for _, r := range c.Results {
		row := report.CapacityRow{Policy: r.name(), Replicas: r.Replicas, Prefill: r.Pool.Prefill, Decode: r.Pool.Decode}
		for _, p := range r.Points {
			row.Points = append(row.Points, report.CapacityPoint{Replicas: p.Replicas, Prefill: p.Pool.Prefill, Decode: p.Pool.Decode,
				TTFTP99Ms: p.TTFTP99Ms, TPOTP99Ms: p.TPOTP99Ms, Met: p.Met, Failed: p.Failed, Unsteady: p.Unsteady})
		}
		out.Rows = append(out.Rows, row)
	}
	return out
}

func yamlOf(v any) (string, error) {
	b, err := yaml.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("render yaml: %w", err)
	}
	return string(b), nil
}

func reportInput(s Spec, pts []Point, caps *CapacityReport, meta Meta) (report.Input, error) {
	base := s.Base
	// The workload YAML shows the rate the runs ran at: the main rate of a
	// comparison, the searched rate of a capacity search.
	base.Workload.Rate = s.rates()[0]
	if caps != nil && len(pts) == 0 {
		base = caps.Spec.Base
		base.Workload.Rate = caps.Spec.Rate
	}
	wy, err := workloadYAML(base.Workload)
	if err != nil {
		return report.Input{}, err
	}
	py, err := yamlOf(base.Engine)
	if err != nil {
		return report.Input{}, err
	}
	seeds := s.Seeds
	if caps != nil && len(pts) == 0 {
		seeds = caps.Spec.Seeds
	}
	in := report.Input{Setup: report.Setup{
		Title:          meta.Title,
		Workload:       base.Workload.Workload,
		WorkloadYAML:   wy,
		ProfileYAML:    py,
		Replicas:       base.Replicas,
		Seeds:          slices.Clone(seeds),
		Requests:       base.Workload.Requests,
		Warmup:         base.Warmup,
		ScrapeInterval: base.ScrapeInterval,
		Index:          string(base.Index),
		Gateways:       base.Gateways,
		Overcommit:     base.Overcommit,
		QueueTimeout:   base.QueueTimeout,
		QueueMax:       base.QueueMaxRequests,
		Version:        meta.Version,
		Command:        meta.Command,
		SLO:            base.SLO,
	}}
	main := s.rates()[0]
	for _, p := range pts {
		r := report.Run{Policy: p.name(), Admission: string(p.Admission), Ledger: p.Ledger,
			Seed: p.Seed, RateRPS: p.Rate, Replicas: p.Replicas, Summary: p.Summary}
		if len(s.Pools) > 1 {
			r.Pool = p.Pool.String()
		}
		if p.Rate == main || base.Source != nil {
			r.TTFTms = ttfts(p.Records, base.Warmup)
			in.Runs = append(in.Runs, r)
		}
		if len(s.rates()) > 1 {
			r.TTFTms = nil
			in.Sweep = append(in.Sweep, r)
		}
	}
	if base.Source != nil {
		// A trace replay: the trace, not a workload configuration, gives the requests.
		in.Setup.Workload = base.SourceName
		in.Setup.WorkloadYAML = ""
		in.Setup.Requests = 0
	}
	if caps != nil {
		in.Capacity = caps.toReport()
	}
	return in, nil
}

// ttfts returns the TTFTs in ms of the measured requests that got a first token.
func ttfts(recs []results.Record, warmup interface{ Nanoseconds() int64 }) []float64 {
	var out []float64
	for i := range recs {
		r := &recs[i]
		if r.HasFirstToken && r.Arrival.Nanoseconds() >= warmup.Nanoseconds() {
			out = append(out, float64(r.TTFT().Nanoseconds())/1e6)
		}
	}
	return out
}

// workloadYAML renders a workload configuration with only the parameter
// section of the selected workload, and without its seed (the report lists
// the seeds of the runs).
func workloadYAML(w workload.Config) (string, error) {
	var doc yaml.Node
	if err := doc.Encode(w); err != nil {
		return "", fmt.Errorf("render workload: %w", err)
	}
	if doc.Kind == yaml.MappingNode {
		kept := doc.Content[:0]
		for i := 0; i+1 < len(doc.Content); i += 2 {
			k := doc.Content[i].Value
			if (slices.Contains(workload.Names(), k) && k != w.Workload) || k == "seed" {
				continue
			}
			kept = append(kept, doc.Content[i], doc.Content[i+1])
		}
		doc.Content = kept
	}
	return yamlOf(&doc)
}

// capacityJSON is capacity.json: the question and, per policy, the answer and
// every fleet size evaluated.
type capacityJSON struct {
	Workload string `json:"workload"`
	// Trace names the replayed trace of a trace search; RateRPS is then
	// what its arrivals offered (CapacityReport.OfferedRate).
	Trace        string   `json:"trace,omitempty"`
	RateRPS      float64  `json:"rate_rps"`
	MaxReplicas  int      `json:"max_replicas"`
	Seeds        []uint64 `json:"seeds"`
	SLOTTFTP99Ms float64  `json:"slo_ttft_p99_ms"`
	SLOTPOTP99Ms float64  `json:"slo_tpot_p99_ms"`
	// PDSplit says every fleet size was tried under every prefill/decode
	// split (CapacitySpec.Split); each answer and point then names its
	// split.
	PDSplit bool `json:"pd_split,omitempty"`
	// Requests, DurationS and WarmupS are each run's length: the requests
	// it stops after (0: none), the virtual time after which arrivals stop
	// (0: none), and the warm-up left out of the summary; what the
	// steady-state check (Warnings) judges.
	Requests  int              `json:"requests,omitempty"`
	DurationS float64          `json:"duration_s,omitempty"`
	WarmupS   float64          `json:"warmup_s"`
	Baseline  string           `json:"baseline"`
	Policies  []capacityPolicy `json:"policies"`
	// Failures says once why requests did not complete in the search's
	// runs (CapacityReport.FailureNotes), Warnings which answers may be too
	// low because their runs look too short (CapacityReport.Warnings).
	Failures []string `json:"failures,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

type capacityPolicy struct {
	// Policy is the variant's label: the policy alone unless several
	// admission rules or ledgers were searched, which Admission and Ledger
	// then name.
	Policy    string `json:"policy"`
	Admission string `json:"admission,omitempty"`
	Ledger    string `json:"ledger,omitempty"`
	Replicas  int    `json:"replicas"` // 0: the SLO is not met up to max_replicas
	// Saved is the baseline's replicas minus this policy's (when both met the SLO).
	Saved *int `json:"gpus_saved,omitempty"`
	// Split is the best split at Replicas and Fleet describes it, e.g. "6
	// (2 prefill + 4 decode)", in a search over splits that met the SLO.
	Split  *capacitySplit  `json:"split,omitempty"`
	Fleet  string          `json:"fleet,omitempty"`
	Points []capacityPoint `json:"points"`
	// Warning is CapacityResult.Warning.
	Warning string `json:"warning,omitempty"`
}

// capacitySplit is a prefill/decode split of a fleet; 0 and 0: the
// aggregated fleet.
type capacitySplit struct {
	Prefill int `json:"prefill_replicas"`
	Decode  int `json:"decode_replicas"`
}

type capacityPoint struct {
	Replicas  int     `json:"replicas"`
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
	TPOTP99Ms float64 `json:"tpot_p99_ms"`
	Met       bool    `json:"met"`
	// Failed and Unsteady are SizePoint's.
	Failed   int `json:"failed"`
	Unsteady int `json:"unsteady_seeds"`
	// Split is the size's best split in a search over splits.
	Split *capacitySplit `json:"split,omitempty"`
}

func (c *CapacityReport) summary() capacityJSON {
	slo := c.Spec.Base.SLO
	out := capacityJSON{
		Workload: c.Spec.Base.Workload.Workload, RateRPS: c.OfferedRate(), MaxReplicas: c.Spec.MaxReplicas,
		Seeds: c.Spec.Seeds, SLOTTFTP99Ms: ms(slo.TTFTP99), SLOTPOTP99Ms: ms(slo.TPOTP99), PDSplit: c.Spec.Split, Baseline: c.Baseline(),
		Requests: c.Spec.Base.Workload.Requests, DurationS: c.Spec.Base.Workload.Duration.Seconds(), WarmupS: c.Spec.Base.Warmup.Seconds(),
		Warnings: c.Warnings(),
	}
	for _, n := range c.FailureNotes() {
		out.Failures = append(out.Failures, n.String())
	}
	if c.Spec.Base.Source != nil {
		out.Trace = c.Spec.Base.SourceName
	}
	for _, r := range c.Results {
		p := capacityPolicy{Policy: r.name(), Replicas: r.Replicas, Warning: r.Warning}
		if r.name() != r.Policy {
			p.Admission, p.Ledger = string(r.Admission), r.Ledger
		}
		if saved, _, ok := c.Savings(r.name()); ok {
			p.Saved = &saved
		}
		if r.Split && r.Replicas > 0 {
			p.Split = &capacitySplit{r.Pool.Prefill, r.Pool.Decode}
			p.Fleet = r.Fleet()
		}
		for _, pt := range r.Points {
			cp := capacityPoint{Replicas: pt.Replicas, TTFTP99Ms: pt.TTFTP99Ms, TPOTP99Ms: pt.TPOTP99Ms, Met: pt.Met, Failed: pt.Failed, Unsteady: pt.Unsteady}
			if r.Split {
				cp.Split = &capacitySplit{pt.Pool.Prefill, pt.Pool.Decode}
			}
			p.Points = append(p.Points, cp)
		}
		out.Policies = append(out.Policies, p)
	}
	return out
}
