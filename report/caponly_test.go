package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A capacity search alone (inferrail capacity --out) makes a report too.
func TestCapacityOnlyReport(t *testing.T) {
	in := Input{Setup: Setup{Title: "cap", Workload: "w1", Seeds: []uint64{1, 2}}, Capacity: &Capacity{
		Workload: "w1", RateRPS: 6.4, MaxReplicas: 8,
		Rows: []CapacityRow{
			{Policy: "round_robin", Replicas: 6, Points: []CapacityPoint{{Replicas: 5, TTFTP99Ms: 3000}, {Replicas: 6, TTFTP99Ms: 1500, Met: true}, {Replicas: 8, TTFTP99Ms: 900, Met: true}}},
			{Policy: "cost_model", Replicas: 4, Points: []CapacityPoint{{Replicas: 4, TTFTP99Ms: 800, Met: true}, {Replicas: 8, TTFTP99Ms: 300, Met: true}}},
		}}}
	dir := t.TempDir()
	files, err := Write(dir, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[0] != "capacity.png" {
		t.Fatalf("charts %v, want only capacity.png", files)
	}
	md, _ := os.ReadFile(filepath.Join(dir, ReportFile))
	text := string(md)
	for _, want := range []string{"Capacity search", "1 to 8 replicas (searched)", "| cost_model | 4 | 2 | 1.33 |", "`cost_model` needs the fewest replicas"} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(text, "## Results") {
		t.Error("a capacity-only report has no results table to show")
	}
	if _, err := Write(dir, Input{}); err == nil {
		t.Error("an input with neither runs nor capacity gave no error")
	}
}
