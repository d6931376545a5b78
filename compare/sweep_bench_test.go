package compare

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
)

// BenchmarkLoadPlan reads a plan of 1,000 jobs: what every shard and the
// merge do first.
func BenchmarkLoadPlan(b *testing.B) {
	seeds := make([]uint64, 250)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	s := Spec{Base: fleet.DefaultConfig(), Policies: []string{"round_robin", "cost_model"}, Seeds: seeds, Rates: []float64{2, 3}, KeepRecords: true}
	p, err := NewPlan(s, sweepMeta(), nil)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	if err := WritePlan(dir, p); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(p.data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := LoadPlan(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJobFile writes and reads one job's result of 5,000 records:
// what a shard stores per job and the merge reads back.
func BenchmarkJobFile(b *testing.B) {
	recs := make([]results.Record, 5000)
	for i := range recs {
		recs[i] = results.Record{ID: uint64(i), Replica: i % 4, Arrival: time.Duration(i) * time.Millisecond, FirstToken: time.Duration(i+80) * time.Millisecond,
			End: time.Duration(i+900) * time.Millisecond, HasFirstToken: true, PromptTokens: 4000 + i, CachedTokens: 2048, OutputTokens: 200, Outcome: results.OutcomeOK}
	}
	pt := Point{Policy: "cost_model", Label: "cost_model", Seed: 1, Rate: 2, Replicas: 4, Records: recs,
		Summary: results.Summary{Rejected: map[string]int{}, FailedBy: map[string]int{}}}
	p := &Plan{file: planFile{Version: testVersion}, hash: "h"}
	dir := b.TempDir()
	if err := os.Mkdir(filepath.Join(dir, JobsDir), 0o755); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := writeJobFile(dir, p, 0, Shard{0, 1}, pt); err != nil {
			b.Fatal(err)
		}
		jf, err := readJobFile(dir, p, 0)
		if err != nil {
			b.Fatal(err)
		}
		if got, err := jf.point(); err != nil || len(got.Records) != len(recs) {
			b.Fatalf("%d records, %v", len(got.Records), err)
		}
	}
}
