package report

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/results"
)

// admissionShape is how a synthetic variant admits: what it rejects, fails,
// queues and reserves, per seed (seeds 1 and 2 differ by spread).
type admissionShape struct {
	policyShape
	admission, ledger  string
	timeouts, full     int     // rejections by queue_timeout and queue_full
	failed             int     // engine failures
	queueP50, queueP99 float64 // ms
	peak               float64 // peak reserved / capacity of the fullest replica
	goodput            float64
}

// admissionRun is synthRun with the admission figures of sh.
func admissionRun(sh admissionShape, seed uint64) Run {
	r := synthRun(sh.policyShape, seed, 10, 4, 400, true)
	mult := 1.0
	if seed%2 == 0 {
		mult = 1.1
	}
	s := &r.Summary
	s.Admission, s.Ledger = sh.admission, sh.ledger
	s.Gateways = 1
	if sh.ledger != "" {
		s.Gateways = 3
	}
	s.Rejected = map[string]int{}
	if sh.timeouts > 0 {
		s.Rejected[results.RejectQueueTimeout] = int(float64(sh.timeouts) * mult)
	}
	if sh.full > 0 && seed%2 == 0 {
		s.Rejected[results.RejectQueueFull] = sh.full
	}
	for _, n := range s.Rejected {
		s.RejectedTotal += n
	}
	s.EngineFailed = sh.failed
	s.Failed = s.RejectedTotal + s.EngineFailed
	s.Completed = s.Requests - s.Failed
	s.QueueMs = results.Latency{P50: sh.queueP50 * mult, P99: sh.queueP99 * mult}
	s.GoodputRPS = round6(sh.goodput * mult)
	const capacity = 4096
	for i := range s.PerReplica {
		rep := &s.PerReplica[i]
		rep.CapacityBlocks = capacity
		rep.PeakReservedBlocks = int(sh.peak * mult * capacity * (1 - 0.05*float64(i)))
		rep.PeakRunning = 20 + i
	}
	s.PeakReservedOverCapacity = round6(float64(s.PerReplica[0].PeakReservedBlocks) / capacity)
	r.Admission, r.Ledger = sh.admission, sh.ledger
	return r
}

// admissionInput is a comparison of variants under admission rules (and
// ledgers when the shapes name them).
func admissionInput(shapes []admissionShape) Input {
	in := synthetic(nil)
	in.Setup.Title = "W7: overload bursts"
	in.Setup.Workload = "w7"
	in.Setup.WorkloadYAML = "name: w7\nburst_every: 60s\n"
	in.Setup.Command = "inferrail compare --workload w7 --policies cost_model --admissions none,kv,dynamo --seeds 2 --out report/"
	in.Setup.Gateways = 1
	in.Setup.Overcommit = 1
	in.Setup.QueueTimeout = 30 * time.Second
	in.Setup.QueueMax = 1024
	in.Sweep, in.Capacity = nil, nil
	for _, sh := range shapes {
		for _, seed := range in.Setup.Seeds {
			in.Runs = append(in.Runs, admissionRun(sh, seed))
		}
	}
	return in
}

// admissionShapes: without admission everything is dispatched, preempted
// and late; kv queues and times out but meets more of the SLO; dynamo
// reserves past capacity and preempts.
func admissionShapes() []admissionShape {
	return []admissionShape{
		{policyShape: policyShape{name: "cost_model+none", p50: 9000, p99: 60000, tpot99: 80, hit: 0.04, pred: 0.04, exact: 1, seedSpread: 0.03, attainment: 0.01, preemptions: 2400},
			admission: "none", peak: 25.3, goodput: 0.03},
		{policyShape: policyShape{name: "cost_model+kv", p50: 900, p99: 3000, tpot99: 85, hit: 0.04, pred: 0.04, exact: 1, seedSpread: 0.01, attainment: 0.2},
			admission: "kv", timeouts: 120, full: 3, queueP50: 8300, queueP99: 29900, peak: 0.99, goodput: 1.06},
		{policyShape: policyShape{name: "cost_model+dynamo", p50: 1000, p99: 3200, tpot99: 95, hit: 0.04, pred: 0.04, exact: 1, seedSpread: 0.01, attainment: 0.19, preemptions: 900},
			admission: "dynamo", timeouts: 110, failed: 2, queueP50: 7900, queueP99: 29800, peak: 1.47, goodput: 1.01},
	}
}

// admissionCharts are the charts Write draws for admissionInput.
var admissionCharts = []string{chartTTFTCDF, chartTTFTBars, chartHitRate, chartReplicaRequests, chartReplicaBusy}

func TestAdmissionGolden(t *testing.T) {
	var b strings.Builder
	if err := Markdown(&b, admissionInput(admissionShapes()), admissionCharts); err != nil {
		t.Fatal(err)
	}
	got := []byte(b.String())
	path := filepath.Join("testdata", "admission.md")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./report -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("report.md differs from %s (run go test ./report -update after checking the change):\n%s", path, got)
	}
	if *outDir != "" {
		d := filepath.Join(*outDir, "admission")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := Write(d, admissionInput(admissionShapes())); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAdmissionSection(t *testing.T) {
	md := markdown(t, admissionInput(admissionShapes()))
	sec := section(md, "Admission and queueing")
	if sec == "" {
		t.Fatalf("no admission section:\n%s", md)
	}
	if i, j := strings.Index(md, "## Results"), strings.Index(md, "## Admission and queueing"); i < 0 || j < i || j > strings.Index(md, "## Charts") {
		t.Error("the admission section should follow the results table, before the charts")
	}
	for _, want := range []string{
		"| cost_model+kv | 272.5 | queue_timeout 126, queue_full 1.5 | 0 | 0 | 108.9% | 8,715 | 31,395 | 2,934 (2,904–2,963) | 1.11 |",
		"| cost_model+none | 400 | 0 | 0 | 2,400 | 2,783% |",
		"| Policy+admission | Completed |",
	} {
		if !strings.Contains(sec, want) {
			t.Errorf("admission section lacks %q:\n%s", want, sec)
		}
	}
	read := section(md, "Reading")
	for _, want := range []string{
		"`cost_model+kv` gives the most goodput, 1.11 req/s, 35× that of `cost_model+none` (no admission), 0.03 req/s.",
		"preempted under `cost_model+none` (on 2 of 2 seeds, median 2,400) and `cost_model+dynamo`",
		"more KV blocks than their cache holds under `cost_model+none` (peak 2,783% of capacity), `cost_model+kv` (peak 108.9% of capacity) and `cost_model+dynamo`",
	} {
		if !strings.Contains(read, want) {
			t.Errorf("reading lacks %q:\n%s", want, read)
		}
	}
	setup := section(md, "Setup")
	for _, want := range []string{"| Admission | `none`, `kv`, `dynamo` (compared) |", "| Queue | up to 1,024 requests per gateway, 30 s timeout |",
		"| Variants (policy+admission) | `cost_model+none`, "} {
		if !strings.Contains(setup, want) {
			t.Errorf("setup lacks %q:\n%s", want, setup)
		}
	}
}

func TestAdmissionLedgers(t *testing.T) {
	base := admissionShapes()[1].policyShape
	shared, ind := base, base
	shared.name, ind.name = "cost_model+kv+shared", "cost_model+kv+independent"
	ind.preemptions = 1500
	in := admissionInput([]admissionShape{
		{policyShape: shared, admission: "kv", ledger: "shared", timeouts: 1350, queueP50: 8400, queueP99: 29900, peak: 0.998, goodput: 1.07},
		{policyShape: ind, admission: "kv", ledger: "independent", timeouts: 600, queueP99: 29500, peak: 2.98, goodput: 0.49},
	})
	in.Setup.Gateways = 3
	md := markdown(t, in)
	read := section(md, "Reading")
	for _, want := range []string{
		"With independent ledgers, `cost_model+kv+independent` peaks at 312.9% of a replica's KV capacity (median over seeds), against 104.8% for `cost_model+kv+shared` with a shared ledger: each gateway counting only its own reservations, together they over-admit by 208.1% of capacity beyond the shared ledger's.",
		"`cost_model+kv+shared` gives the most goodput, 1.12 req/s, 2.2× that of the runner-up `cost_model+kv+independent`, 0.51 req/s.",
	} {
		if !strings.Contains(read, want) {
			t.Errorf("reading lacks %q:\n%s", want, read)
		}
	}
	for _, want := range []string{"| Policy+admission+ledger | Completed |", "| Gateways | 3, ledgers `shared` and `independent` (compared) |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// Reports of policies alone, with or without the admission field the
// summaries now carry, have no admission section and no gateway rows.
func TestNoAdmissionSectionForPolicyComparisons(t *testing.T) {
	inputs := map[string]Input{
		"clear":  synthetic(clearShapes()),
		"noisy":  synthetic(noisyShapes()),
		"twelve": synthetic(twelveShapes()),
	}
	none := synthetic(clearShapes())
	for i := range none.Runs {
		none.Runs[i].Summary.Admission = "none"
		none.Runs[i].Summary.Rejected = map[string]int{}
	}
	inputs["admission none"] = none
	for name, in := range inputs {
		md := markdown(t, in)
		for _, s := range []string{"## Admission and queueing", "| Admission |", "| Gateways |", "Policy+admission"} {
			if strings.Contains(md, s) {
				t.Errorf("%s: report has %q", name, s)
			}
		}
	}
	// A rejection is worth a section even without admission (e.g. too_long).
	rej := synthetic(clearShapes())
	rej.Runs[0].Summary.RejectedTotal = 1
	rej.Runs[0].Summary.Rejected = map[string]int{results.RejectTooLong: 1}
	if !strings.Contains(markdown(t, rej), "## Admission and queueing") {
		t.Error("a run with rejections gives no admission section")
	}
}

func TestVariantLabelsJudgedByPolicy(t *testing.T) {
	for _, p := range []string{"round_robin", "round_robin+kv", "p2c+none+independent"} {
		if !isCacheBlind(p) {
			t.Errorf("isCacheBlind(%q) = false", p)
		}
	}
	for _, p := range []string{"cost_model+kv", "kv_aware", "llmd+round_robin"} {
		if isCacheBlind(p) {
			t.Errorf("isCacheBlind(%q) = true", p)
		}
	}
	c := &Capacity{Rows: []CapacityRow{{Policy: "cost_model+kv", Replicas: 3}, {Policy: "round_robin+kv", Replicas: 5}, {Policy: "round_robin+none", Replicas: 4}}}
	if got := c.BaselinePolicy(); got != "round_robin+none" {
		t.Errorf("baseline = %q, want round_robin+none", got)
	}
}

func TestAdmissionChartsAndDeterminism(t *testing.T) {
	in := admissionInput(admissionShapes())
	d1, d2 := t.TempDir(), t.TempDir()
	c1, err := Write(d1, in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Write(d2, in); err != nil {
		t.Fatal(err)
	}
	for _, name := range append([]string{ReportFile}, c1...) {
		a, _ := os.ReadFile(filepath.Join(d1, name))
		b, _ := os.ReadFile(filepath.Join(d2, name))
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Errorf("%s differs between two runs or is empty", name)
		}
	}
	if !slices.Equal(c1, admissionCharts) {
		t.Errorf("charts %v, want %v", c1, admissionCharts)
	}
}
