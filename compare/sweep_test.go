package compare

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/traces"
)

const testVersion = "test-build"

// sweepSpec is a small comparison: 2 policies x 2 rates x 2 seeds, every
// request's record kept (8 jobs).
func sweepSpec(t *testing.T) Spec {
	return Spec{Base: baseConfig(t, "w1", 150), Policies: []string{"round_robin", "cost_model"}, Seeds: []uint64{1, 2}, Rates: []float64{2, 3},
		KeepRecords: true}
}

func sweepMeta() Meta {
	return Meta{Title: "Sweep test", Version: testVersion, Command: "inferrail compare --workload w1 --out run"}
}

// unsharded runs s in one process and writes it to a new directory: what
// compare --out gives.
func unsharded(t *testing.T, s Spec, meta Meta) (string, []string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "unsharded")
	pts, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	files, err := Write(dir, s, pts, nil, meta)
	if err != nil {
		t.Fatal(err)
	}
	return dir, files
}

// planned writes s's plan to a new directory.
func planned(t *testing.T, s Spec, meta Meta, replay *Replay) (string, *Plan) {
	t.Helper()
	p, err := NewPlan(s, meta, replay)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "sweep")
	if err := WritePlan(dir, p); err != nil {
		t.Fatal(err)
	}
	return dir, p
}

func runShards(t *testing.T, dir string, n int) {
	t.Helper()
	for i := range n {
		rep, err := RunShard(context.Background(), dir, ShardOptions{Shard: Shard{i, n}, Parallel: 1 + i%2, Version: testVersion})
		if err != nil {
			t.Fatalf("shard %d/%d: %v", i, n, err)
		}
		if len(rep.Ran) != rep.Jobs || len(rep.Skipped) != 0 {
			t.Fatalf("shard %d/%d: %+v", i, n, rep)
		}
	}
}

// sameFiles fails unless every file is byte-identical in both directories.
func sameFiles(t *testing.T, a, b string, files []string) {
	t.Helper()
	for _, f := range files {
		x, err := os.ReadFile(filepath.Join(a, f))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(b, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between the unsharded run and the merged shards (%d and %d bytes)", f, len(x), len(y))
		}
	}
}

// writeTrace writes a Mooncake trace of n requests sharing prefixes.
func writeTrace(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		blocks := 1 + i%4
		ids := make([]string, blocks)
		for k := range ids {
			ids[k] = fmt.Sprint((i%3)*10 + k)
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`+"\n",
			i*250, blocks*512, 20+i%50, strings.Join(ids, ", "))
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// replaySpec replays a small trace under two policies and two seeds.
func replaySpec(t *testing.T) (Spec, *Replay) {
	t.Helper()
	r, err := NewReplay(writeTrace(t, 120), "mooncake", false, traces.ReplayOptions{Speedup: 2, Model: "sim-8b"})
	if err != nil {
		t.Fatal(err)
	}
	c := fleet.DefaultConfig()
	c.Source, c.SourceName = r.Source(), "trace:trace.jsonl"
	c.Warmup = time.Second
	return Spec{Base: c, Policies: []string{"round_robin", "cost_model"}, Seeds: []uint64{1, 2}, KeepRecords: true}, r
}

// poolsSpec compares the aggregated fleet with two P/D splits of 4
// replicas under two policies and two seeds (12 jobs): the report has the
// P/D table.
func poolsSpec(t *testing.T) Spec {
	s := Spec{Base: baseConfig(t, "w1", 150), Policies: []string{"round_robin", "cost_model"}, Seeds: []uint64{1, 2},
		Pools: []Pool{{}, {1, 3}, {2, 2}}, KeepRecords: true}
	s.Base.Replicas = 4
	return s
}

// Four shards merged write the same results.json, report.md,
// requests.parquet and charts as one unsharded run, byte for byte: a
// synthetic sweep over rates, an isolation experiment with tenant limits
// on and off, P/D pools, and a trace replay.
func TestShardsMergeLikeOneRun(t *testing.T) {
	cases := []struct {
		name   string
		spec   func(t *testing.T) (Spec, *Replay)
		shards int
	}{
		{"rates", func(t *testing.T) (Spec, *Replay) { return sweepSpec(t), nil }, 4},
		{"isolation", func(t *testing.T) (Spec, *Replay) { return isolationSpec(t, 40*time.Second, 1), nil }, 4},
		{"pools", func(t *testing.T) (Spec, *Replay) { return poolsSpec(t), nil }, 5},
		{"replay", replaySpec, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, replay := c.spec(t)
			want, files := unsharded(t, s, sweepMeta())
			for _, f := range []string{"results.json", "report.md", "requests.parquet"} {
				if !slices.Contains(files, f) {
					t.Fatalf("the unsharded run wrote no %s: %v", f, files)
				}
			}
			dir, p := planned(t, s, sweepMeta(), replay)
			if p.Len() != len(s.jobs()) {
				t.Fatalf("plan of %d jobs, the comparison has %d", p.Len(), len(s.jobs()))
			}
			runShards(t, dir, c.shards)
			m, err := Merge(dir, MergeOptions{Version: testVersion})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(m.Files, files) {
				t.Fatalf("merge wrote %v, the unsharded run %v", m.Files, files)
			}
			sameFiles(t, want, dir, files)
			if len(s.Pools) > 0 {
				md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
				for _, want := range []string{"## Disaggregated prefill/decode", "| cost_model+P1D3 | 1 / 3 / 0 |", "| Policy+pool |"} {
					if !strings.Contains(string(md), want) {
						t.Errorf("the merged report.md lacks %q", want)
					}
				}
				for i, pj := range p.file.Jobs {
					if j := s.jobs()[i]; pj.Pool != j.Pool || pj.Config.PrefillReplicas != j.Pool.Prefill || pj.Config.DecodeReplicas != j.Pool.Decode {
						t.Errorf("%s: planned with pool %+v and %d/%d replicas, want %+v", pj.String(), pj.Pool, pj.Config.PrefillReplicas, pj.Config.DecodeReplicas, j.Pool)
					}
				}
			}
		})
	}
}

// A shard stopped after k jobs and started again runs exactly the jobs it
// had not stored, and leaves the stored ones untouched; a deleted result is
// run again, and only it.
func TestStoppedShardResumes(t *testing.T) {
	s := sweepSpec(t)
	dir, p := planned(t, s, sweepMeta(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const k = 3
	first, err := RunShard(ctx, dir, ShardOptions{Shard: Shard{0, 1}, Parallel: 1, Version: testVersion, Progress: func(done, _ int) {
		if done == k {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped shard: %v, want context.Canceled", err)
	}
	if len(first.Ran) != k {
		t.Fatalf("stopped after %d jobs, ran %v", k, first.Ran)
	}
	// Stored results get an old time: a rewrite would change it.
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, j := range first.Ran {
		if err := os.Chtimes(filepath.Join(dir, JobsDir, JobFileName(j)), old, old); err != nil {
			t.Fatal(err)
		}
	}
	second, err := RunShard(context.Background(), dir, ShardOptions{Shard: Shard{0, 1}, Parallel: 2, Version: testVersion})
	if err != nil {
		t.Fatal(err)
	}
	var rest []int
	for j := range p.Len() {
		if !slices.Contains(first.Ran, j) {
			rest = append(rest, j)
		}
	}
	if !slices.Equal(second.Skipped, first.Ran) || !slices.Equal(second.Ran, rest) {
		t.Fatalf("resumed shard ran %v and skipped %v; want %v run and %v skipped", second.Ran, second.Skipped, rest, first.Ran)
	}
	for _, j := range first.Ran {
		st, err := os.Stat(filepath.Join(dir, JobsDir, JobFileName(j)))
		if err != nil || !st.ModTime().Equal(old) {
			t.Fatalf("job %d's result was rewritten: %v %v", j, st.ModTime(), err)
		}
	}
	// Results lost on the way (a full disk, a cleaned bucket) run again.
	for _, j := range []int{1, 6} {
		if err := os.Remove(filepath.Join(dir, JobsDir, JobFileName(j))); err != nil {
			t.Fatal(err)
		}
	}
	third, err := RunShard(context.Background(), dir, ShardOptions{Shard: Shard{0, 1}, Version: testVersion})
	if err != nil || !slices.Equal(third.Ran, []int{1, 6}) || len(third.Skipped) != p.Len()-2 {
		t.Fatalf("after deleting jobs 1 and 6: %+v, %v", third, err)
	}
	want, files := unsharded(t, s, sweepMeta())
	if _, err := Merge(dir, MergeOptions{Version: testVersion}); err != nil {
		t.Fatal(err)
	}
	sameFiles(t, want, dir, files)
}

func TestParseShard(t *testing.T) {
	for _, v := range []string{"0/1", "3/4", "0/4", "99/100"} {
		s, err := ParseShard(v)
		if err != nil || s.String() != v {
			t.Errorf("%q: %+v, %v", v, s, err)
		}
	}
	bad := []struct{ in, mention string }{
		{"5/4", "from 0 to 3"},
		{"4/4", "from 0 to 3"},
		{"-1/4", "index i must be a whole number"},
		{"a/b", "index i must be a whole number"},
		{"1/b", "count N must be a whole number"},
		{"0/0", "count must be from 1"},
		{"1", "no /"},
		{"", "no /"},
		{"1/", "count N"},
		{"/4", "index i"},
		{" 1/4", "index i"},
		{"+1/4", "index i"},
		{"1/4/2", "count N"},
		{"0/99999999", "count N"},
		{"0/2000000", "count must be from 1 to"},
	}
	for _, c := range bad {
		_, err := ParseShard(c.in)
		if err == nil || !strings.Contains(err.Error(), c.mention) || !strings.Contains(err.Error(), fmt.Sprintf("%q", c.in)) {
			t.Errorf("%q: error %v, want one naming the input and %q", c.in, err, c.mention)
		}
	}
}

func FuzzParseShard(f *testing.F) {
	for _, s := range []string{"0/4", "5/4", "-1/4", "a/b", "0/0", "3/1048576"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		s, err := ParseShard(v)
		if err != nil {
			return
		}
		// Leading zeros are read (03/16 is 3/16); the canonical form reads back.
		if again, err := ParseShard(s.String()); s.Validate() != nil || err != nil || again != s {
			t.Fatalf("%q read as %+v, whose form %s reads as %+v, %v", v, s, s, again, err)
		}
	})
}

// The shards of any count split the jobs: every job is in exactly one.
func TestShardsPartitionTheJobs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		jobs := rapid.IntRange(1, 500).Draw(t, "jobs")
		n := rapid.IntRange(1, 64).Draw(t, "shards")
		seen := make([]int, jobs)
		for i := range n {
			s := Shard{i, n}
			for j := range jobs {
				if s.Has(j) {
					seen[j]++
				}
			}
		}
		for j, c := range seen {
			if c != 1 {
				t.Fatalf("job %d is in %d of %d shards", j, c, n)
			}
		}
	})
}

// A plan reads back as the comparison it was made from, with its jobs in
// Run's order, whatever the spec.
func TestPlanReadsBackAsTheSpec(t *testing.T) {
	base := baseConfig(t, "w1", 100)
	tmp, n := t.TempDir(), 0
	rapid.Check(t, func(t *rapid.T) {
		s := Spec{Base: base, KeepRecords: rapid.Bool().Draw(t, "keep")}
		s.Policies = rapid.SliceOfNDistinct(rapid.SampledFrom([]string{"round_robin", "p2c", "cost_model", "least_request"}), 1, 3, rapid.ID).Draw(t, "policies")
		s.Seeds = rapid.SliceOfNDistinct(rapid.Uint64(), 1, 3, rapid.ID).Draw(t, "seeds")
		if rapid.Bool().Draw(t, "rates") {
			s.Rates = rapid.SliceOfN(rapid.Float64Range(0.1, 50), 1, 3).Draw(t, "rates")
		}
		if rapid.Bool().Draw(t, "admissions") {
			s.Admissions = []gateway.Admission{gateway.AdmitNone, gateway.AdmitKV}
		}
		s.Base.Replicas = rapid.IntRange(1, 16).Draw(t, "replicas")
		if s.Base.Replicas > 1 && rapid.Bool().Draw(t, "pools") {
			s.Pools = []Pool{{}, {Prefill: 1, Decode: rapid.IntRange(0, s.Base.Replicas-1).Draw(t, "decode")}}
		}
		s.Base.Warmup = time.Duration(rapid.Int64Range(0, int64(time.Minute)).Draw(t, "warmup"))
		s.Base.Engine.Latency.PrefillPairNs = rapid.Float64Range(0, 10).Draw(t, "pair")
		p, err := NewPlan(s, sweepMeta(), nil)
		if err != nil {
			t.Fatal(err)
		}
		n++
		dir := filepath.Join(tmp, fmt.Sprint(n))
		if err := WritePlan(dir, p); err != nil {
			t.Fatal(err)
		}
		q, err := LoadPlan(dir)
		if err != nil {
			t.Fatal(err)
		}
		if q.Hash() != p.Hash() || q.Len() != len(s.jobs()) {
			t.Fatalf("plan %s of %d jobs read back as %s of %d", p.Hash(), len(s.jobs()), q.Hash(), q.Len())
		}
		got := q.Spec()
		want := s
		want.Parallel, want.Progress = 0, nil
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("spec read back as\n%+v\nwant\n%+v", got, want)
		}
		for i, j := range s.jobs() {
			pj := q.file.Jobs[i]
			if pj.job() != j || !reflect.DeepEqual(fleet.Config(pj.Config), j.config(s.Base)) {
				t.Fatalf("job %d reads back as %+v, want %+v", i, pj.job(), j)
			}
		}
	})
}

// Bad input to the sweep is refused with an error that names it.
func TestSweepRefusals(t *testing.T) {
	s := sweepSpec(t)
	s.Seeds = []uint64{1}
	s.Rates = []float64{2}
	dir, p := planned(t, s, sweepMeta(), nil)
	ctx := context.Background()

	if _, err := RunShard(ctx, dir, ShardOptions{Shard: Shard{4, 4}, Version: testVersion}); err == nil || !strings.Contains(err.Error(), "from 0 to 3") {
		t.Errorf("shard 4/4: %v", err)
	}
	if _, err := RunShard(ctx, dir, ShardOptions{Shard: Shard{0, 1}, Version: "other-build"}); err == nil ||
		!strings.Contains(err.Error(), "other-build") || !strings.Contains(err.Error(), testVersion) {
		t.Errorf("another build: %v", err)
	}
	if _, err := RunShard(ctx, t.TempDir(), ShardOptions{Shard: Shard{0, 1}, Version: testVersion}); err == nil || !strings.Contains(err.Error(), "plan.json") {
		t.Errorf("no plan: %v", err)
	}
	other := filepath.Join(t.TempDir(), "format2")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, PlanFile), bytes.Replace(p.data, []byte(`"format": 1`), []byte(`"format": 2`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPlan(other); err == nil || !strings.Contains(err.Error(), "format 2, this build reads format 1") {
		t.Errorf("a plan of another format: %v", err)
	}
	if _, err := NewPlan(s, Meta{Title: "x"}, nil); err == nil || !strings.Contains(err.Error(), "Version") {
		t.Errorf("a plan without a version: %v", err)
	}
	bad := s
	bad.Policies = []string{"fastest"}
	if _, err := NewPlan(bad, sweepMeta(), nil); err == nil || !strings.Contains(err.Error(), "fastest") {
		t.Errorf("a bad spec: %v", err)
	}
	hooked := s
	hooked.Base.Trace = func(int, gateway.TraceEvent) {}
	if _, err := NewPlan(hooked, sweepMeta(), nil); err == nil || !strings.Contains(err.Error(), "Base.Trace") {
		t.Errorf("a base with a hook: %v", err)
	}
	rs, r := replaySpec(t)
	rs.Base.Source = nil
	if _, err := NewPlan(rs, sweepMeta(), r); err == nil || !strings.Contains(err.Error(), "Replay") {
		t.Errorf("a replay without a source: %v", err)
	}

	// Another plan into the same directory, once it holds results.
	runShards(t, dir, 1)
	if err := WritePlan(dir, p); err != nil {
		t.Errorf("writing the same plan again: %v", err)
	}
	seven := s
	seven.Seeds = []uint64{7}
	q, err := NewPlan(seven, sweepMeta(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := WritePlan(dir, q); err == nil || !strings.Contains(err.Error(), "another plan") {
		t.Errorf("another plan over results: %v", err)
	}
	if _, err := Merge(dir, MergeOptions{Version: "other-build"}); err == nil || !strings.Contains(err.Error(), "other-build") {
		t.Errorf("merge by another build: %v", err)
	}

	// A changed trace is refused before any job runs.
	rs, r = replaySpec(t)
	rdir, _ := planned(t, rs, sweepMeta(), r)
	if err := os.WriteFile(r.Path, []byte(`{"timestamp": 0, "input_length": 16, "output_length": 2, "hash_ids": [0]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := RunShard(ctx, rdir, ShardOptions{Shard: Shard{0, 1}, Version: testVersion})
	if err == nil || !strings.Contains(err.Error(), "changed") || len(rep.Ran) != 0 {
		t.Errorf("a changed trace: %+v, %v", rep, err)
	}
}

// Merge names the missing jobs and the shards that hold them.
func TestMergeNamesMissingJobs(t *testing.T) {
	dir, _ := planned(t, sweepSpec(t), sweepMeta(), nil)
	if _, err := Merge(dir, MergeOptions{Version: testVersion}); err == nil || !strings.Contains(err.Error(), "8 of 8") || !strings.Contains(err.Error(), "no job has run yet") {
		t.Errorf("nothing run: %v", err)
	}
	for _, i := range []int{0, 1, 3} {
		if _, err := RunShard(context.Background(), dir, ShardOptions{Shard: Shard{i, 4}, Version: testVersion}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Merge(dir, MergeOptions{Version: testVersion})
	if err == nil {
		t.Fatal("merged with shard 2/4 missing")
	}
	for _, m := range []string{"2 of 8 job results are missing", "job 2 (round_robin, seed 1, 3 req/s", "job 6 (cost_model, seed 1, 3 req/s", "shard 2/4 again", "--shard 2/4"} {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("error %q does not say %q", err, m)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "results.json")); err == nil {
		t.Error("an incomplete merge wrote results.json")
	}
}

// Merge names every result file that is not this plan's: another plan's,
// another build's, a job the plan does not have; RunShard runs such jobs
// again.
func TestMergeNamesForeignResults(t *testing.T) {
	s := sweepSpec(t)
	dir, _ := planned(t, s, sweepMeta(), nil)
	runShards(t, dir, 2)
	other := s
	other.Seeds = []uint64{1, 3}
	odir, _ := planned(t, other, sweepMeta(), nil)
	if _, err := RunShard(context.Background(), odir, ShardOptions{Shard: Shard{1, 8}, Version: testVersion}); err != nil {
		t.Fatal(err)
	}
	jobs := filepath.Join(dir, JobsDir)
	copyFile(t, filepath.Join(odir, JobsDir, JobFileName(1)), filepath.Join(jobs, JobFileName(1)))
	// Job 3 as another build would have written it.
	path := filepath.Join(jobs, JobFileName(3))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	jf, err := decodeJobFile(data)
	if err != nil {
		t.Fatal(err)
	}
	jf.Version = "other-build"
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(&jf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(jobs, JobFileName(0)), filepath.Join(jobs, JobFileName(99)))
	if err := os.WriteFile(filepath.Join(jobs, JobFileName(5)), []byte("half a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A temporary file of a shard still writing (or killed) is not a result.
	if err := os.WriteFile(filepath.Join(jobs, "."+JobFileName(7)+".tmp-123"), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Merge(dir, MergeOptions{Version: testVersion})
	if err == nil {
		t.Fatal("merged foreign results")
	}
	for _, m := range []string{
		"jobs/job-000001.gob: a result of another plan",
		"jobs/job-000003.gob: made by inferrail other-build",
		"jobs/job-000005.gob: not a job result",
		"jobs/job-000099.gob: job 99 is not in this plan of 8 jobs",
	} {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("error %q does not say %q", err, m)
		}
	}
	if strings.Contains(err.Error(), "missing") || strings.Contains(err.Error(), ".tmp-") {
		t.Errorf("error %q counts the temporary file or a present job as missing", err)
	}
	rep, err := RunShard(context.Background(), dir, ShardOptions{Shard: Shard{1, 2}, Version: testVersion})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.Ran, []int{1, 3, 5}) || len(rep.Replaced) != 3 || !strings.Contains(rep.Replaced[0], "job-000001.gob") {
		t.Errorf("shard 1/2 over foreign results: %+v", rep)
	}
	os.Remove(filepath.Join(jobs, JobFileName(99)))
	if _, err := Merge(dir, MergeOptions{Version: testVersion}); err != nil {
		t.Errorf("merge once the foreign results are replaced: %v", err)
	}
}

// The same job of the same plan gives the same result file, byte for byte,
// whatever the shard's parallelism.
func TestJobFilesAreDeterministic(t *testing.T) {
	s := sweepSpec(t)
	a, _ := planned(t, s, sweepMeta(), nil)
	b, _ := planned(t, s, sweepMeta(), nil)
	for dir, par := range map[string]int{a: 1, b: 3} {
		if _, err := RunShard(context.Background(), dir, ShardOptions{Shard: Shard{0, 1}, Parallel: par, Version: testVersion}); err != nil {
			t.Fatal(err)
		}
	}
	names, err := jobFileNames(a)
	if err != nil || len(names) != 8 {
		t.Fatalf("%v %v", names, err)
	}
	sameFiles(t, filepath.Join(a, JobsDir), filepath.Join(b, JobsDir), names)
}

func FuzzDecodeJobFile(f *testing.F) {
	var buf bytes.Buffer
	gob.NewEncoder(&buf).Encode(&jobFile{Format: PlanFormat, Version: "v", PlanHash: "h", Point: []byte(`{"Policy":"p"}`)})
	f.Add(buf.Bytes())
	f.Add([]byte("half a file"))
	f.Fuzz(func(t *testing.T, data []byte) {
		jf, err := decodeJobFile(data)
		if err != nil {
			return
		}
		if jf.Format != PlanFormat || jf.Index < 0 {
			t.Fatalf("accepted %+v", jf)
		}
	})
}

func FuzzParsePlan(f *testing.F) {
	p, err := NewPlan(Spec{Base: fleet.DefaultConfig(), Policies: []string{"round_robin"}, Seeds: []uint64{1}}, sweepMeta(), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(p.data)
	f.Add([]byte(`{"format": 1}`))
	f.Add([]byte(`{"format": 2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		q, err := parsePlan(data)
		if err != nil {
			return
		}
		if q.Len() == 0 || q.Version() == "" {
			t.Fatalf("accepted a plan of %d jobs, version %q", q.Len(), q.Version())
		}
	})
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
