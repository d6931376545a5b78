package workload

import (
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the testdata/golden_*.txt files from the current generators")

// goldenWorkloads are the workloads whose default streams are pinned: other
// packages compare exact numbers computed from them.
var goldenWorkloads = []string{"w1", "w2", "w6"}

// goldenMix is the tenant/priority mix of the pinned mixed streams.
var goldenMix = []MixClass{
	{Tenant: "batch", Priority: 0, Share: 0.6},
	{Tenant: "chat", Priority: 5, Share: 0.3},
	{Tenant: "", Priority: 9, Share: 0.1},
}

// goldenRun is one pinned stream: a workload's default config (seed 1),
// edited.
type goldenRun struct {
	label, workload string
	edit            func(*Config) // nil: the defaults
}

// goldenFile is a golden file and the streams it pins.
type goldenFile struct {
	name string // in testdata
	runs []goldenRun
	// classes renders tenant, priority and max_tokens too. The original
	// golden_streams.txt predates them and must not move.
	classes bool
}

func goldenFiles() []goldenFile {
	orig := goldenFile{name: "golden_streams.txt"}
	for _, name := range goldenWorkloads {
		orig.runs = append(orig.runs, goldenRun{label: name, workload: name})
	}
	withMix := func(c *Config) { c.Mix = goldenMix }
	return []goldenFile{
		orig,
		{name: "golden_w7_mix.txt", classes: true, runs: []goldenRun{
			{label: "w7", workload: "w7"},
			{label: "w1+mix", workload: "w1", edit: withMix},
			{label: "w2+mix", workload: "w2", edit: withMix},
			{label: "w7+mix", workload: "w7", edit: withMix},
		}},
	}
}

// goldenStreams renders, for each run of f, the first 5 requests in arrival
// order and a digest of the whole run (every request's ID, arrival,
// session, turn, prompt segments and output; with classes also its tenant,
// priority and max_tokens), driven through simulate with serviceTime.
func goldenStreams(t *testing.T, f goldenFile) string {
	var b strings.Builder
	for _, run := range f.runs {
		c := mustConfig(t, run.workload)
		if c.Seed != 1 {
			t.Fatalf("%s: default seed %d, want 1", run.workload, c.Seed)
		}
		if run.edit != nil {
			run.edit(&c)
		}
		reqs := simulate(t, mustNew(t, c), serviceTime, nil).reqs
		h := fnv.New64a()
		for i, r := range reqs {
			lens := make([]string, len(r.Prompt))
			for j, s := range r.Prompt {
				lens[j] = fmt.Sprint(s.Len)
			}
			if i < 5 {
				fmt.Fprintf(&b, "%s id=%d arrival=%d session=%d turn=%d ", run.label, r.ID, int64(r.Arrival), r.Session, r.Turn)
				if f.classes {
					fmt.Fprintf(&b, "tenant=%q priority=%d max_tokens=%d ", r.Tenant, r.Priority, r.MaxTokens)
				}
				fmt.Fprintf(&b, "prompt=[%s] output=%d\n", strings.Join(lens, " "), r.OutputTokens)
			}
			fmt.Fprintf(h, "%d %d %d %d %v %v|", r.ID, int64(r.Arrival), r.Session, r.Turn, r.Prompt, r.Output)
			if f.classes {
				fmt.Fprintf(h, "%q %d %d|", r.Tenant, r.Priority, r.MaxTokens)
			}
		}
		fmt.Fprintf(&b, "%s requests=%d digest=%016x\n", run.label, len(reqs), h.Sum64())
	}
	return b.String()
}

// TestGoldenStreams pins the default streams of w1, w2 and w6
// (golden_streams.txt), and those of w7 and of w1, w2 and w7 under a mix
// (golden_w7_mix.txt): a change to a generator or to the arrival process
// must not move them. Regenerate with
// go test ./workload/ -run TestGoldenStreams -update only for an intended
// change.
func TestGoldenStreams(t *testing.T) {
	for _, f := range goldenFiles() {
		t.Run(f.name, func(t *testing.T) {
			path := filepath.Join("testdata", f.name)
			got := goldenStreams(t, f)
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (generate it with -update)", err)
			}
			if got != string(want) {
				t.Fatalf("streams changed:\n got:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
