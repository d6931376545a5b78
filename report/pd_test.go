package report

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/results"
)

// pdInput compares an aggregated fleet with two P/D splits under
// cost_model, on engines with a CPU tier, two seeds each.
func pdInput() Input {
	in := Input{Setup: Setup{Title: "P/D on w4", Workload: "w4", Replicas: 8, Seeds: []uint64{1, 2}, Requests: 400}}
	shapes := []struct {
		pool            string
		prefill, decode int
		p99             float64
	}{{"aggregated", 0, 0, 2400}, {"P2D6", 2, 6, 1300}, {"P4D4", 4, 4, 1700}}
	for _, sh := range shapes {
		for _, seed := range []uint64{1, 2} {
			r := synthRun(policyShape{name: "cost_model+" + sh.pool, p50: 300, p99: sh.p99, tpot99: 40, hit: 0.6, pred: 0.6, exact: 1, attainment: 0.95, seedSpread: 0.02},
				seed, 10, 8, 400, false)
			r.Pool = sh.pool
			s := &r.Summary
			f := float64(seed)
			s.Tiers = &results.TierSummary{GPUHitRate: 0.5 + 0.01*f, CPUHitRate: 0.1, DiskHitRate: 0, LoadS: 2.5 * f}
			if sh.prefill > 0 {
				s.PD = &results.PDSummary{
					PrefillReplicas: sh.prefill, DecodeReplicas: sh.decode,
					Remote: 300 + int64(seed), Local: 100, Fallbacks: int64(seed - 1),
					TransferMs:    results.Latency{P50: 1.2 * f, P99: 8.5 * f},
					TransferredGB: 3.25 * f,
					PrefillBusy:   0.8, DecodeBusy: 0.45,
				}
			}
			in.Runs = append(in.Runs, r)
		}
	}
	return in
}

// The P/D and KV tiers tables are golden (testdata/pd.md; regenerate with
// go test ./report -run TestPDGolden -update), and name each variant's
// pools and figures.
func TestPDGolden(t *testing.T) {
	got := []byte(markdown(t, pdInput()))
	text := string(got)
	for _, want := range []string{
		"## Disaggregated prefill/decode",
		"| Policy+pool | Pools P / D / both |",
		"| cost_model+aggregated | — | 20.0 / 40.0 | — |",
		"| cost_model+P2D6 | 2 / 6 / 0 | 20.0 / 40.0 | 75.1% | 0.5 | 1.80 | 12.8 | 4.88 | 80.0% | 45.0% | — |",
		"## KV tiers",
		"| cost_model+P4D4 | 51.5% | 10.0% | 0.0% | 61.5% | 3.75 |",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	path := filepath.Join("testdata", "pd.md")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./report -run TestPDGolden -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("report.md differs from %s (run go test ./report -run TestPDGolden -update after checking the change):\n%s", path, got)
	}
}

// Without P/D or tiers in the runs, neither table appears; with tiers
// alone, only the tiers table.
func TestPDTablesOnlyWhenPresent(t *testing.T) {
	plain := markdown(t, synthetic(clearShapes()))
	for _, no := range []string{"## Disaggregated prefill/decode", "## KV tiers", "+pool"} {
		if strings.Contains(plain, no) {
			t.Errorf("a report without P/D or tiers has %q", no)
		}
	}
	in := pdInput()
	for i := range in.Runs {
		in.Runs[i].Summary.PD = nil
	}
	tiers := markdown(t, in)
	if strings.Contains(tiers, "## Disaggregated prefill/decode") || !strings.Contains(tiers, "## KV tiers") {
		t.Error("with tiers and no P/D, the report should have the tiers table alone")
	}
}

func TestFleetText(t *testing.T) {
	for _, c := range []struct {
		n, p, d  int
		searched bool
		want     string
	}{
		{6, 0, 0, false, "6"},
		{6, 0, 0, true, "6 (aggregated)"},
		{6, 2, 4, true, "6 (2 prefill + 4 decode)"},
		{8, 2, 2, false, "8 (2 prefill + 2 decode + 4 both)"},
		{8, 0, 3, false, "8 (3 decode + 5 both)"},
	} {
		if got := FleetText(c.n, c.p, c.d, c.searched); got != c.want {
			t.Errorf("FleetText(%d, %d, %d, %v) = %q, want %q", c.n, c.p, c.d, c.searched, got, c.want)
		}
	}
	if PoolName(0, 0) != "aggregated" || PoolName(2, 6) != "P2D6" {
		t.Errorf("PoolName: %q, %q", PoolName(0, 0), PoolName(2, 6))
	}
}

// A capacity search over splits shows the best split at the answer and at
// every size.
func TestCapacitySplitReport(t *testing.T) {
	in := Input{Setup: Setup{Title: "cap", Workload: "w4", Seeds: []uint64{1}}, Capacity: &Capacity{
		Workload: "w4", RateRPS: 8, MaxReplicas: 8, Split: true,
		Rows: []CapacityRow{
			{Policy: "round_robin", Replicas: 8, Points: []CapacityPoint{{Replicas: 4, TTFTP99Ms: 5000}, {Replicas: 6, TTFTP99Ms: 2500}, {Replicas: 7, TTFTP99Ms: 2100, Prefill: 2, Decode: 5}, {Replicas: 8, TTFTP99Ms: 1900, Met: true}}},
			{Policy: "cost_model", Replicas: 6, Prefill: 2, Decode: 4, Points: []CapacityPoint{{Replicas: 4, TTFTP99Ms: 2600, Prefill: 1, Decode: 3}, {Replicas: 6, TTFTP99Ms: 900, Met: true, Prefill: 2, Decode: 4}, {Replicas: 8, TTFTP99Ms: 500, Met: true, Prefill: 2, Decode: 6}}},
		}}}
	text := markdown(t, in)
	for _, want := range []string{
		"| cost_model | 6 (2 prefill + 4 decode) | 2 | 1.00 |",
		"| round_robin (baseline) | 8 (aggregated) |",
		"900 / 0 ✓ P2D4",
		"1,900 / 0 ✓ aggregated",
		"under every prefill/decode split",
		"`cost_model` needs the fewest replicas to meet the SLO: 6 (2 prefill + 4 decode).",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	in.Capacity.Split = false
	if text := markdown(t, in); strings.Contains(text, "P2D4") || strings.Contains(text, "prefill/decode split") {
		t.Error("a search without splits names splits")
	}
}
