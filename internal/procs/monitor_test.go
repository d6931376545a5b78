package procs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestMonitorEnv(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []string
		want []string // nil: unchanged, not needed
	}{
		{"no GODEBUG", []string{"A=1", "PATH=/bin"}, []string{"A=1", "PATH=/bin", "GODEBUG=" + MonitorSetting}},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, []string{"A=1", "GODEBUG=" + MonitorSetting}},
		{"other settings kept", []string{"GODEBUG=gctrace=1,madvdontneed=1"}, []string{"GODEBUG=gctrace=1,madvdontneed=1," + MonitorSetting}},
		{"the operator's schedtrace", []string{"GODEBUG=schedtrace=1000", "A=1"}, nil},
		{"already awake", []string{"GODEBUG=gctrace=1," + MonitorSetting}, nil},
		{"the first GODEBUG is the runtime's", []string{"GODEBUG=gctrace=1", "GODEBUG=schedtrace=5"}, []string{"GODEBUG=gctrace=1," + MonitorSetting}},
		{"a key that only ends so", []string{"GODEBUG=xschedtrace=1"}, []string{"GODEBUG=xschedtrace=1," + MonitorSetting}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, need := MonitorEnv(slices.Clone(c.in))
			if c.want == nil {
				if need || !slices.Equal(got, c.in) {
					t.Fatalf("got %q, need %v; want it unchanged", got, need)
				}
				return
			}
			if !need || !slices.Equal(got, c.want) {
				t.Fatalf("got %q, need %v; want %q", got, need, c.want)
			}
		})
	}
}

// Applied to its own result, MonitorEnv asks nothing more: one exec, never
// a loop; and nothing but GODEBUG changes.
func TestMonitorEnvOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		kv := rapid.SampledFrom([]string{"A=1", "B=", "GODEBUG=", "GODEBUG=gctrace=1", "GODEBUG=schedtrace=10", "GODEBUG=x=1,y=2", "PATH=/bin"})
		env := rapid.SliceOf(kv).Draw(t, "env")
		out, need := MonitorEnv(slices.Clone(env))
		if again, need2 := MonitorEnv(slices.Clone(out)); need2 || !slices.Equal(again, out) {
			t.Fatalf("%q: a second call changed %q to %q", env, out, again)
		}
		rest := func(e []string) []string {
			return slices.DeleteFunc(slices.Clone(e), func(s string) bool { return strings.HasPrefix(s, "GODEBUG=") })
		}
		if !slices.Equal(rest(env), rest(out)) {
			t.Fatalf("%q -> %q: more than GODEBUG changed", env, out)
		}
		if need && !strings.HasSuffix(out[len(out)-1], MonitorSetting) {
			t.Fatalf("%q -> %q: no %s", env, out, MonitorSetting)
		}
	})
}

// The child half of TestKeepMonitorAwakeExecs: print the pid, keep the
// monitor awake (an exec the first time), print the pid and GODEBUG.
func TestMain(m *testing.M) {
	if os.Getenv("PROCS_TEST_EXEC_CHILD") == "1" {
		fmt.Printf("pid %d\n", os.Getpid())
		if err := KeepMonitorAwake(); err != nil {
			fmt.Printf("error %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("awake %d %s\n", os.Getpid(), os.Getenv("GODEBUG"))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// KeepMonitorAwake executes the program again in the same process, with
// the setting added to GODEBUG and the rest of the environment as it was,
// once.
func TestKeepMonitorAwakeExecs(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "PROCS_TEST_EXEC_CHILD=1", "GODEBUG=gctrace=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 {
		t.Fatalf("want the pid twice (before and after the exec) and the awake line, got %q", out)
	}
	var pid1, pid2, pid3 int
	var godebug string
	fmt.Sscanf(lines[0], "pid %d", &pid1)
	fmt.Sscanf(lines[1], "pid %d", &pid2)
	fmt.Sscanf(lines[2], "awake %d %s", &pid3, &godebug)
	if pid1 == 0 || pid1 != pid2 || pid2 != pid3 || pid1 != cmd.Process.Pid {
		t.Fatalf("the program should run again in the same process: %q (pid %d)", out, cmd.Process.Pid)
	}
	if godebug != "gctrace=0,"+MonitorSetting {
		t.Fatalf("GODEBUG after the exec: %q", godebug)
	}
	if bytes.Contains(out, []byte("error")) {
		t.Fatalf("%s", out)
	}
}
