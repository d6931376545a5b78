package compare

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// examples/sweep/xargs.sh with the built binary (plan, four shards two at a
// time through xargs -P 2, merge) writes what compare --out writes, byte
// for byte, and merge prints compare's table.
func TestXargsExampleMatchesCompare(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the inferrail binary")
	}
	for _, tool := range []string{"go", "sh", "seq", "xargs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: %v", tool, err)
		}
	}
	bin := filepath.Join(t.TempDir(), "inferrail")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/inferrail").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	script, err := filepath.Abs(filepath.Join("..", "examples", "sweep", "xargs.sh"))
	if err != nil {
		t.Fatal(err)
	}
	flags := []string{"--workload", "w1", "--policies", "round_robin,cost_model", "--seeds", "2", "--requests", "150", "--rates", "2,3"}
	// The same relative --out in two directories: report.md quotes the command.
	one, sharded := t.TempDir(), t.TempDir()
	run := func(dir string, env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, stderr.String())
		}
		return stdout.String()
	}
	want := run(one, nil, bin, append([]string{"compare", "--out", "run"}, flags...)...)
	got := run(sharded, []string{"INFERRAIL=" + bin, "SHARDS=4", "JOBS=2"}, "sh", append([]string{script, "run"}, flags...)...)
	if !strings.HasSuffix(got, want) {
		t.Errorf("merge printed\n%s\nwant compare's\n%s", got, want)
	}
	for i := range 4 {
		if line := fmt.Sprintf("shard %d/4: 2 of the plan's 8 jobs; ran 2 ", i); !strings.Contains(got, line) {
			t.Errorf("the script's output has no %q:\n%s", line, got)
		}
	}
	entries, err := os.ReadDir(filepath.Join(one, "run"))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	if len(files) < 4 {
		t.Fatalf("compare wrote only %v", files)
	}
	sameFiles(t, filepath.Join(one, "run"), filepath.Join(sharded, "run"), files)
}
