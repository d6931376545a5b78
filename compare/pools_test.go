package compare

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router/gateway"
)

func TestParsePools(t *testing.T) {
	got, err := ParsePools(" 0/0, 2/6,4/4 ,")
	if want := []Pool{{}, {2, 6}, {4, 4}}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParsePools: %v, %v; want %v", got, err, want)
	}
	for _, p := range got {
		if again, err := ParsePools(p.Flag()); err != nil || again[0] != p {
			t.Errorf("%+v: its flag form %q reads back as %v, %v", p, p.Flag(), again, err)
		}
	}
	for _, bad := range []string{"", " , ", "2", "a/b", "2/", "/6", "-1/2", "2/-6", "2/6/1", "1.5/2"} {
		if _, err := ParsePools(bad); err == nil || !strings.HasPrefix(err.Error(), "pools: ") {
			t.Errorf("%q: error %v, want one starting pools:", bad, err)
		}
	}
}

// One pool, or none, keeps the labels as they were; several add the pool,
// after the admission, ledger and limits parts and before +without-.
func TestPoolLabelsAndJobs(t *testing.T) {
	base := fleet.DefaultConfig()
	base.Replicas = 8
	s := Spec{Base: base, Policies: []string{"round_robin", "cost_model"}, Seeds: []uint64{1, 2}}
	s.Pools = []Pool{{2, 6}}
	if got := labels(s.Variants()); !reflect.DeepEqual(got, []string{"round_robin", "cost_model"}) {
		t.Errorf("one pool: %v", got)
	}
	s.Pools = []Pool{{}, {2, 6}, {4, 4}}
	vs := s.Variants()
	want := []string{"round_robin+aggregated", "round_robin+P2D6", "round_robin+P4D4", "cost_model+aggregated", "cost_model+P2D6", "cost_model+P4D4"}
	if got := labels(vs); !reflect.DeepEqual(got, want) {
		t.Errorf("three pools: %v, want %v", got, want)
	}
	if v := vs[4]; v.Policy != "cost_model" || v.Pool != (Pool{2, 6}) {
		t.Errorf("variant %+v", v)
	}
	s.Admissions = []gateway.Admission{gateway.AdmitNone, gateway.AdmitKV}
	s.Isolate = "noisy"
	if got := labels(s.Variants())[:4]; !reflect.DeepEqual(got, []string{"round_robin+none+aggregated", "round_robin+none+aggregated+without-noisy", "round_robin+none+P2D6", "round_robin+none+P2D6+without-noisy"}) {
		t.Errorf("pools with admissions and an isolated tenant: %v", got)
	}
	s.Admissions, s.Isolate = nil, ""
	jobs := s.jobs()
	if len(jobs) != 2*3*2 {
		t.Fatalf("%d jobs, want 2 policies x 3 pools x 2 seeds", len(jobs))
	}
	for _, j := range jobs {
		c := j.config(s.Base)
		if c.PrefillReplicas != j.Pool.Prefill || c.DecodeReplicas != j.Pool.Decode || c.Replicas != 8 {
			t.Errorf("job %s seed %d runs %d prefill + %d decode of %d", j.Label, j.seed, c.PrefillReplicas, c.DecodeReplicas, c.Replicas)
		}
	}
	// Without Pools, the base's own pool runs, unlabelled.
	s.Pools = nil
	s.Base.PrefillReplicas, s.Base.DecodeReplicas = 1, 3
	if vs := s.Variants(); vs[0].Label != "round_robin" || vs[0].Pool != (Pool{1, 3}) {
		t.Errorf("the base's pool: %+v", vs[0])
	}
}

func TestBadPools(t *testing.T) {
	base := baseConfig(t, "w1", 100)
	base.Replicas = 4
	cases := []struct {
		pools []Pool
		want  []string
	}{
		{[]Pool{{}, {1, 3}, {1, 3}}, []string{"pools: 1/3 listed twice"}},
		{[]Pool{{}, {3, 3}}, []string{"pools: 3/3:", "more than the fleet's 4 replicas"}},
		{[]Pool{{4, 0}, {1, 1}}, []string{"pools: 4/0:", "leave no replica to decode on"}},
		{[]Pool{{-1, 2}}, []string{"pools: -1/2:", "zero or positive"}},
	}
	for _, c := range cases {
		s := Spec{Base: base, Policies: []string{"cost_model"}, Seeds: []uint64{1}, Pools: c.pools}
		started := false
		s.Progress = func(int, int) { started = true }
		_, err := Run(context.Background(), s)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %v should mention %q", c.pools, err, w)
			}
		}
		if err != nil && strings.Count(err.Error(), "\n") > 0 {
			t.Errorf("%v: one problem, reported more than once: %v", c.pools, err)
		}
		if started {
			t.Error("a simulation ran before validation failed")
		}
	}
	ok := Spec{Base: base, Policies: []string{"cost_model"}, Seeds: []uint64{1}, Pools: []Pool{{}, {1, 3}, {2, 2}, {1, 0}}}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid pools: %v", err)
	}
}

// Comparing pools on a real fleet: each variant runs its split (the
// summaries' P/D pools and replica roles say so), and the report has the
// P/D table.
func TestRunPools(t *testing.T) {
	s := Spec{Base: baseConfig(t, "w1", 150), Policies: []string{"cost_model"}, Seeds: []uint64{1}, Pools: []Pool{{}, {1, 3}}}
	s.Base.Replicas = 4
	pts, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 2 || pts[0].Label != "cost_model+aggregated" || pts[1].Label != "cost_model+P1D3" || pts[1].Pool != (Pool{1, 3}) {
		t.Fatalf("points %v %v", pts[0].Label, pts[1].Label)
	}
	if pts[0].Summary.PD != nil {
		t.Errorf("the aggregated fleet has a P/D summary: %+v", pts[0].Summary.PD)
	}
	pd := pts[1].Summary.PD
	if pd == nil || pd.PrefillReplicas != 1 || pd.DecodeReplicas != 3 {
		t.Fatalf("P1D3's P/D summary: %+v", pd)
	}
	if r := pts[1].Summary.PerReplica; len(r) != 4 || r[0].Role != "prefill" || r[1].Role != "decode" {
		t.Errorf("P1D3's replica roles: %+v", r)
	}
	dir := t.TempDir()
	if _, err := Write(dir, s, pts, nil, Meta{Title: "pools", Version: "test", Command: "go test"}); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Disaggregated prefill/decode", "| cost_model+P1D3 | 1 / 3 / 0 |", "| cost_model+aggregated | — |", "| Policy+pool |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	if strings.Contains(string(md), "## KV tiers") {
		t.Error("report.md has a KV tiers table for engines without lower tiers")
	}
}

// splitRun answers as a fleet whose TTFT p99 falls with its size and is
// lowest with a quarter of it prefilling: 10 s / n aggregated, times
// 0.6 + 2 |p/n - 1/4| with p prefill replicas. A 2 s SLO is then met from
// 5 replicas aggregated and from 4 as 1 prefill + 3 decode.
func splitRun(probed map[int][]Pool) runner {
	return func(_ context.Context, jobs []job, progress func(int, int)) ([]Point, error) {
		out := make([]Point, len(jobs))
		for i, j := range jobs {
			n := float64(j.replicas)
			ttft := 10000 / n
			if !j.Pool.Aggregated() {
				if j.Pool.Prefill+j.Pool.Decode != j.replicas {
					panic("a split that does not cover the fleet")
				}
				d := float64(j.Pool.Prefill)/n - 0.25
				ttft *= 0.6 + 2*max(d, -d)
			}
			if j.Policy == "round_robin" {
				ttft = 1000 // meets it everywhere, whatever the split
			}
			out[i] = Point{Policy: j.Policy, Label: j.Label, Pool: j.Pool, Seed: j.seed, Replicas: j.replicas, Summary: results.Summary{
				Requests: 10, Completed: 10, TTFT: results.Latency{P99: ttft}, TPOT: results.Latency{P99: 20},
			}}
			if j.seed == 1 && j.Policy == "cost_model" {
				probed[j.replicas] = append(probed[j.replicas], j.Pool)
			}
			progress(i+1, len(jobs))
		}
		return out, nil
	}
}

func TestCapacitySearchesTheSplit(t *testing.T) {
	s := CapacitySpec{Base: baseConfig(t, "w1", 10), Policies: []string{"cost_model", "round_robin"}, Seeds: []uint64{1, 2}, Rate: 5, MaxReplicas: 8, Split: true}
	s.Base.SLO = results.SLO{TTFTP99: 2e9, TPOTP99: 1e8}
	probed := map[int][]Pool{}
	res, err := capacity(context.Background(), s, splitRun(probed))
	if err != nil {
		t.Fatal(err)
	}
	cm, rr := res[0], res[1]
	if cm.Replicas != 4 || cm.Pool != (Pool{1, 3}) || !cm.Split || cm.Fleet() != "4 (1 prefill + 3 decode)" {
		t.Errorf("cost_model: %s, pool %+v, want 4 (1 prefill + 3 decode); points %+v", cm.Fleet(), cm.Pool, cm.Points)
	}
	// Every size probed ran the aggregated fleet and every split of it.
	for n, pools := range probed {
		want := []Pool{{}}
		for p := 1; p < n; p++ {
			want = append(want, Pool{p, n - p})
		}
		if !slices.Equal(pools, want) {
			t.Errorf("%d replicas probed %v, want %v", n, pools, want)
		}
	}
	if len(probed) > 4 {
		t.Errorf("probed %d sizes, binary search over 8 needs at most 4", len(probed))
	}
	for _, p := range cm.Points {
		switch {
		case p.Replicas == 3 && p.Met:
			t.Errorf("3 replicas meet it: %+v", p)
		case p.Replicas == 8 && (!p.Met || p.Pool != Pool{2, 6}):
			t.Errorf("8 replicas: %+v, want P2D6 met (the lowest TTFT p99)", p)
		}
	}
	// Met everywhere alike: the tie goes to fewer prefill replicas, the
	// aggregated fleet.
	if rr.Replicas != 1 || rr.Pool != (Pool{}) || rr.Fleet() != "1 (aggregated)" {
		t.Errorf("round_robin: %s, pool %+v", rr.Fleet(), rr.Pool)
	}
	for _, p := range rr.Points {
		if p.Pool != (Pool{}) {
			t.Errorf("round_robin at %d: %+v, want the aggregated fleet on a tie", p.Replicas, p.Pool)
		}
	}
	// The report and capacity.json name the split.
	rep := &CapacityReport{Spec: s, Results: res}
	j := rep.summary()
	if !j.PDSplit || j.Policies[0].Split == nil || *j.Policies[0].Split != (capacitySplit{1, 3}) || j.Policies[0].Fleet != "4 (1 prefill + 3 decode)" {
		t.Errorf("capacity.json: %+v", j.Policies[0])
	}
	if r := rep.toReport(); !r.Split || r.Rows[0].Prefill != 1 || r.Rows[0].Decode != 3 {
		t.Errorf("report rows: %+v", r.Rows[0])
	}
	// Without the split, capacity.json is as it was.
	s.Split = false
	res, err = capacity(context.Background(), s, splitRun(map[int][]Pool{}))
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Replicas != 5 || res[0].Fleet() != "5" {
		t.Errorf("cost_model aggregated: %s", res[0].Fleet())
	}
	if j := (&CapacityReport{Spec: s, Results: res}).summary(); j.PDSplit || j.Policies[0].Split != nil || j.Policies[0].Points[0].Split != nil {
		t.Errorf("capacity.json without the split names one: %+v", j.Policies[0])
	}
}

func TestCapacitySplitRefusesBasePools(t *testing.T) {
	s := CapacitySpec{Base: baseConfig(t, "w1", 10), Policies: []string{"cost_model"}, Seeds: []uint64{1}, Rate: 5, MaxReplicas: 8, Split: true}
	if err := s.Validate(); err != nil {
		t.Fatalf("split search: %v", err)
	}
	s.Base.PrefillReplicas, s.Base.DecodeReplicas = 1, 2
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "pd-split") {
		t.Errorf("a split search of a base with pools: %v", err)
	}
}

// Engines with a CPU tier give every summary a tiers split, and the report
// a KV tiers table, without a P/D one on an aggregated fleet.
func TestRunTiers(t *testing.T) {
	s := Spec{Base: baseConfig(t, "w1", 150), Policies: []string{"round_robin", "cost_model"}, Seeds: []uint64{1}}
	s.Base.Engine.KVTiers.CPUBlocks, s.Base.Engine.KVTiers.CPULink = 2*s.Base.Engine.NumGPUBlocks, "pcie-gen4"
	pts, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pts {
		if p.Summary.Tiers == nil || p.Summary.PD != nil {
			t.Fatalf("%s: tiers %+v, P/D %+v", p.Label, p.Summary.Tiers, p.Summary.PD)
		}
	}
	dir := t.TempDir()
	if _, err := Write(dir, s, pts, nil, Meta{Title: "tiers", Version: "test", Command: "go test"}); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "## KV tiers") || !strings.Contains(string(md), "| cost_model | ") {
		t.Error("report.md has no KV tiers table")
	}
	if strings.Contains(string(md), "## Disaggregated prefill/decode") || strings.Contains(string(md), "+pool") {
		t.Error("report.md of an aggregated fleet has a P/D table")
	}
}

// Bad pools do not hide the base's other problems.
func TestBadPoolsAndBadBase(t *testing.T) {
	s := Spec{Base: baseConfig(t, "w1", 100), Policies: []string{"cost_model"}, Seeds: []uint64{1}, Pools: []Pool{{9, 9}}}
	s.Base.Warmup = -1
	err := s.Validate()
	if err == nil || !strings.Contains(err.Error(), "pools: 9/9") || !strings.Contains(err.Error(), "warmup") {
		t.Errorf("error %v should name the pool and the warmup", err)
	}
}
