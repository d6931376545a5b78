package compare

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// p99Column reads a policy's TTFT p99 from report.md's results table.
func p99Column(t *testing.T, md, policy string) float64 {
	t.Helper()
	for _, line := range strings.Split(md, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.TrimSpace(cells[1]) != policy {
			continue
		}
		f := strings.Fields(strings.ReplaceAll(cells[3], ",", ""))
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			t.Fatalf("cannot read p99 of %s from %q", policy, line)
		}
		return v
	}
	t.Fatalf("no row for %s in report.md", policy)
	return 0
}

// A constructed case where one policy is clearly worse: on shared system
// prompts, random placement throws the cache away and queues unevenly, while
// cost_model keeps each prompt where it is cached. The report's table must
// show it.
func TestReportShowsTheWorsePolicyWorse(t *testing.T) {
	s := Spec{Base: baseConfig(t, "w1", 600), Policies: []string{"random", "cost_model"}, Seeds: []uint64{1, 2}, KeepRecords: true}
	pts, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files, err := Write(dir, s, pts, nil, Meta{Title: "constructed", Version: "test", Command: "go test"})
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	worse, better := p99Column(t, string(md), "random"), p99Column(t, string(md), "cost_model")
	if worse < 2*better {
		t.Fatalf("report shows random p99 %.0f ms against cost_model %.0f ms", worse, better)
	}
	if !strings.Contains(string(md), "`cost_model`") || len(files) < 5 {
		t.Fatalf("report or files incomplete: %v", files)
	}
}
