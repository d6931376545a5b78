package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// compare plan takes exactly compare's flags, with the same defaults and
// help (but --out's), so that a plan is what compare would run.
func TestComparePlanTakesCompareFlags(t *testing.T) {
	root := newRootCmd(io.Discard, io.Discard)
	cmp, _, err := root.Find([]string{"compare"})
	if err != nil {
		t.Fatal(err)
	}
	plan, _, err := root.Find([]string{"compare", "plan"})
	if err != nil || plan == cmp {
		t.Fatalf("no compare plan: %v", err)
	}
	flags := func(c *cobra.Command) map[string]*pflag.Flag {
		m := map[string]*pflag.Flag{}
		c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) { m[f.Name] = f })
		return m
	}
	want, got := flags(cmp), flags(plan)
	for name, f := range want {
		g := got[name]
		switch {
		case g == nil:
			t.Errorf("compare plan has no --%s", name)
		case g.Value.Type() != f.Value.Type() || g.DefValue != f.DefValue || (name != "out" && g.Usage != f.Usage):
			t.Errorf("--%s: compare plan's %s %q %q, compare's %s %q %q", name, g.Value.Type(), g.DefValue, g.Usage, f.Value.Type(), f.DefValue, f.Usage)
		}
	}
	for name := range got {
		if want[name] == nil {
			t.Errorf("compare plan has --%s, compare does not", name)
		}
	}
}

// plan, run and merge through the CLI write compare's results.json,
// requests.parquet and report.md (its command aside, which quotes --out).
func TestCompareSweepWritesWhatCompareWrites(t *testing.T) {
	tmp := t.TempDir()
	one, sweep := filepath.Join(tmp, "one"), filepath.Join(tmp, "sweep")
	flags := []string{"--workload", "w1", "--policies", "round_robin,cost_model", "--seeds", "2", "--requests", "150"}
	code, want, errOut := runCLI(append([]string{"compare", "--out", one}, flags...)...)
	if code != 0 {
		t.Fatalf("compare: exit %d: %s", code, errOut)
	}
	if code, out, errOut := runCLI(append([]string{"compare", "plan", "--out", sweep}, flags...)...); code != 0 || !strings.Contains(out, "planned 4 simulations") {
		t.Fatalf("plan: exit %d: %s %s", code, out, errOut)
	}
	if code, _, errOut := runCLI("compare", "run", sweep, "--shard", "1/2"); code != 0 {
		t.Fatalf("shard 1/2: exit %d: %s", code, errOut)
	}
	code, _, errOut = runCLI("compare", "merge", sweep)
	if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 ||
		!strings.Contains(errOut, "2 of 4 job results are missing: job 0 (round_robin, seed 1") || !strings.Contains(errOut, "--shard 0/2") {
		t.Fatalf("merge with shard 0/2 missing: exit %d, %q", code, errOut)
	}
	if code, out, errOut := runCLI("compare", "run", sweep, "--shard", "0/2", "--parallel", "1"); code != 0 || !strings.Contains(out, "shard 0/2: 2 of the plan's 4 jobs; ran 2") {
		t.Fatalf("shard 0/2: exit %d: %s %s", code, out, errOut)
	}
	if code, out, _ := runCLI("compare", "run", sweep); code != 0 || !strings.Contains(out, "ran 0") || !strings.Contains(out, "skipped 4") {
		t.Fatalf("every shard again: exit %d: %s", code, out)
	}
	code, got, errOut := runCLI("compare", "merge", sweep)
	if code != 0 {
		t.Fatalf("merge: exit %d: %s", code, errOut)
	}
	if strings.ReplaceAll(got, sweep, one) != want {
		t.Errorf("merge printed\n%s\ncompare printed\n%s", got, want)
	}
	for _, f := range []string{"results.json", "requests.parquet", "report.md", "ttft_cdf.png"} {
		a, err := os.ReadFile(filepath.Join(one, f))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(sweep, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "report.md" {
			b = bytes.ReplaceAll(b, []byte(sweep), []byte(one))
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from compare's", f)
		}
	}
}

// Bad input to plan, run and merge exits 2 with one line naming it.
func TestCompareSweepBadInputExitsTwo(t *testing.T) {
	tmp := t.TempDir()
	sweep := filepath.Join(tmp, "sweep")
	if code, _, errOut := runCLI("compare", "plan", "--out", sweep, "--policies", "round_robin", "--seeds", "1", "--requests", "50"); code != 0 {
		t.Fatalf("plan: exit %d: %s", code, errOut)
	}
	cases := []struct {
		args     []string
		mentions []string
	}{
		{[]string{"compare", "run", sweep, "--shard", "5/4"}, []string{"--shard", `"5/4"`, "from 0 to 3"}},
		{[]string{"compare", "run", sweep, "--shard", "-1/4"}, []string{"--shard", `"-1/4"`, "index"}},
		{[]string{"compare", "run", sweep, "--shard", "a/b"}, []string{"--shard", `"a/b"`, "i/N"}},
		{[]string{"compare", "run", sweep, "--shard", "0/0"}, []string{"--shard", `"0/0"`, "count"}},
		{[]string{"compare", "run", sweep, "--parallel", "-1"}, []string{"--parallel"}},
		{[]string{"compare", "run"}, []string{"compare run", "one argument"}},
		{[]string{"compare", "run", sweep, sweep}, []string{"one argument"}},
		{[]string{"compare", "run", filepath.Join(tmp, "nosuch")}, []string{"plan.json", "compare plan --out"}},
		{[]string{"compare", "merge", filepath.Join(tmp, "nosuch")}, []string{"plan.json"}},
		{[]string{"compare", "plan", "--policies", "round_robin"}, []string{"--out"}},
		{[]string{"compare", "plan", "--policies", "fastest", "--out", sweep}, []string{"fastest"}},
	}
	for _, c := range cases {
		code, out, errOut := runCLI(c.args...)
		wantUsage(t, c.args, code, out, errOut, c.mentions...)
	}
	if _, err := os.Stat(filepath.Join(sweep, "jobs")); err == nil {
		t.Error("a refused shard created jobs/")
	}
}

// compare plan --pools plans every pool as its own job, the pool in the
// job and in its fleet configuration.
func TestComparePlanCarriesPools(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sweep")
	code, out, errOut := runCLI("compare", "plan", "--workload", "w1", "--policies", "cost_model", "--replicas", "4", "--pools", "0/0,1/3", "--seeds", "1", "--requests", "150", "--out", dir)
	if code != 0 || !strings.Contains(out, "planned 2 simulations") {
		t.Fatalf("plan: exit %d: %s %s", code, out, errOut)
	}
	data, err := os.ReadFile(filepath.Join(dir, "plan.json"))
	if err != nil {
		t.Fatal(err)
	}
	var plan struct {
		Spec struct {
			Pools []struct{ Prefill, Decode int } `json:"pools"`
		} `json:"spec"`
		Jobs []struct {
			Label  string                                        `json:"label"`
			Pool   struct{ Prefill, Decode int }                 `json:"pool"`
			Config struct{ PrefillReplicas, DecodeReplicas int } `json:"config"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(data, &plan); err != nil || len(plan.Jobs) != 2 || len(plan.Spec.Pools) != 2 {
		t.Fatalf("plan.json: %v, %s", err, data)
	}
	j := plan.Jobs[1]
	if j.Label != "cost_model+P1D3" || j.Pool.Prefill != 1 || j.Pool.Decode != 3 || j.Config.PrefillReplicas != 1 || j.Config.DecodeReplicas != 3 {
		t.Errorf("job 1: %+v", j)
	}
	if j := plan.Jobs[0]; j.Label != "cost_model+aggregated" || j.Config.PrefillReplicas != 0 {
		t.Errorf("job 0: %+v", j)
	}
}
