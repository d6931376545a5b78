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

var update = flag.Bool("update", false, "rewrite testdata/golden_streams.txt from the current generators")

// goldenWorkloads are the workloads whose default streams are pinned: other
// packages compare exact numbers computed from them.
var goldenWorkloads = []string{"w1", "w2", "w6"}

// goldenStreams renders, for each pinned workload with its default config
// (seed 1), the first 5 requests in arrival order and a digest of the whole
// default run (every request's ID, arrival, session, turn, prompt segments
// and output), driven through simulate with serviceTime.
func goldenStreams(t *testing.T) string {
	var b strings.Builder
	for _, name := range goldenWorkloads {
		c := mustConfig(t, name)
		if c.Seed != 1 {
			t.Fatalf("%s: default seed %d, want 1", name, c.Seed)
		}
		reqs := simulate(t, mustNew(t, c), serviceTime, nil).reqs
		h := fnv.New64a()
		for i, r := range reqs {
			lens := make([]string, len(r.Prompt))
			for j, s := range r.Prompt {
				lens[j] = fmt.Sprint(s.Len)
			}
			if i < 5 {
				fmt.Fprintf(&b, "%s id=%d arrival=%d session=%d turn=%d prompt=[%s] output=%d\n",
					name, r.ID, int64(r.Arrival), r.Session, r.Turn, strings.Join(lens, " "), r.OutputTokens)
			}
			fmt.Fprintf(h, "%d %d %d %d %v %v|", r.ID, int64(r.Arrival), r.Session, r.Turn, r.Prompt, r.Output)
		}
		fmt.Fprintf(&b, "%s requests=%d digest=%016x\n", name, len(reqs), h.Sum64())
	}
	return b.String()
}

// TestGoldenStreams pins the default streams of w1, w2 and w6: a change to a
// generator or to the arrival process must not move them. Regenerate with
// go test ./workload/ -run TestGoldenStreams -update only for an intended
// change.
func TestGoldenStreams(t *testing.T) {
	path := filepath.Join("testdata", "golden_streams.txt")
	got := goldenStreams(t)
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
		t.Fatalf("default streams changed:\n got:\n%s\nwant:\n%s", got, want)
	}
}
