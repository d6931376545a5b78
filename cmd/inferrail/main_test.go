package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/results"
)

func runCLI(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestBadInputExitsTwoWithOneLine(t *testing.T) {
	dir := t.TempDir()
	badProfile := filepath.Join(dir, "bad.yaml")
	os.WriteFile(badProfile, []byte("latency:\n  prefill_token_us: -1\n"), 0o644)
	unknownKey := filepath.Join(dir, "unknown.yaml")
	os.WriteFile(unknownKey, []byte("num_gpu_blocks: 10\nturbo: true\n"), 0o644)
	cases := []struct {
		args    []string
		mention string
	}{
		{[]string{"sim", "--workload", "w9"}, "--workload"},
		{[]string{"sim", "--policy", "fastest"}, "round_robin"},
		{[]string{"sim", "--rate", "-2"}, "--rate"},
		{[]string{"sim", "--rate", "0"}, "--rate"},
		{[]string{"sim", "--replicas", "0"}, "--replicas"},
		{[]string{"sim", "--requests", "-5"}, "--requests"},
		{[]string{"sim", "--warmup", "-1s"}, "--warmup"},
		{[]string{"sim", "--profile", badProfile}, "latency.prefill_token_us"},
		{[]string{"sim", "--profile", unknownKey}, "turbo"},
		{[]string{"sim", "--profile", filepath.Join(dir, "missing.yaml")}, "--profile"},
		{[]string{"sim", "--set", "w1.prompts=0"}, "w1.prompts"},
		{[]string{"sim", "--set", "w1.bogus=1"}, "bogus"},
		{[]string{"sim", "--set", "noequals"}, "--set"},
		{[]string{"sim", "--replicas", "many"}, "--replicas"},
		{[]string{"sim", "stray"}, "no arguments"},
		{[]string{"sim", "--slo-ttft", "0s"}, "--slo-ttft"},
		{[]string{"sim", "--index", "exact"}, "--index"},
		{[]string{"sim", "--kv-event-delay", "-1ms"}, "--kv-event-delay"},
	}
	for _, c := range cases {
		code, out, errOut := runCLI(c.args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", c.args, code, errOut)
		}
		if out != "" {
			t.Errorf("%v: wrote to stdout: %q", c.args, out)
		}
		if strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, c.mention) {
			t.Errorf("%v: stderr %q should be one line naming %q", c.args, errOut, c.mention)
		}
	}
}

func TestJSONIsTheOnlyStdout(t *testing.T) {
	code, out, errOut := runCLI("sim", "--workload", "w6", "--requests", "200", "--json", "--seed", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var s results.Summary
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("stdout is not one summary object: %v\n%s", err, out)
	}
	if dec.More() {
		t.Fatal("more than one JSON value on stdout")
	}
	if s.Workload != "w6" || s.Completed != 200 || s.Seed != 3 || s.Replicas != 4 {
		t.Fatalf("summary %+v", s)
	}
}

func TestOutWritesSummaryAndRequests(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	code, out, errOut := runCLI("sim", "--workload", "w1", "--requests", "150", "--out", dir, "--policy", "least_request")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "least_request") || !strings.Contains(out, "summary.json") {
		t.Fatalf("table output: %s", out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s results.Summary
	if err := json.Unmarshal(data, &s); err != nil || s.Completed != 150 {
		t.Fatalf("summary.json: %v %+v", err, s)
	}
	f, err := os.Open(filepath.Join(dir, "requests.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	rows, err := results.ReadParquet(f, st.Size())
	if err != nil || len(rows) != 150 || rows[0].Policy != "least_request" {
		t.Fatalf("requests.parquet: %v, %d rows", err, len(rows))
	}
}

func TestWorkloadFileAndSet(t *testing.T) {
	dir := t.TempDir()
	wf := filepath.Join(dir, "w.yaml")
	os.WriteFile(wf, []byte("workload: w2\nrequests: 120\nrate: 5\nw2:\n  turns_max: 3\n"), 0o644)
	code, out, errOut := runCLI("sim", "--workload-file", wf, "--set", "w2.turns_min=3", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var s results.Summary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatal(err)
	}
	if s.Workload != "w2" || s.Requests != 120 || s.RateRPS != 5 {
		t.Fatalf("file settings not applied: %+v", s)
	}
	if code, _, errOut := runCLI("sim", "--workload-file", wf, "--workload", "w1"); code != 2 || !strings.Contains(errOut, "--workload-file") {
		t.Fatalf("both --workload and --workload-file: exit %d %q", code, errOut)
	}
}

func TestDefaultRateScalesWithReplicas(t *testing.T) {
	_, out, _ := runCLI("sim", "--workload", "w6", "--requests", "50", "--replicas", "8", "--json")
	var s results.Summary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatal(err)
	}
	if s.RateRPS != 20 {
		t.Fatalf("default w6 rate on 8 replicas = %v, want 20 (2.5 per replica)", s.RateRPS)
	}
}

func TestHelpHasExamples(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"sim", "--help"}} {
		code, out, _ := runCLI(args...)
		if code != 0 || !strings.Contains(out, "Examples:") {
			t.Errorf("%v: exit %d, examples missing:\n%s", args, code, out)
		}
	}
}

func TestEveryPolicyAndIndexRuns(t *testing.T) {
	for _, idx := range []string{"approximate", "events"} {
		for _, p := range []string{"cost_model", "llmd", "sglang", "prefix_hash"} {
			code, out, errOut := runCLI("sim", "--workload", "w2", "--requests", "150", "--policy", p, "--index", idx, "--json", "--session-affinity")
			if code != 0 {
				t.Fatalf("%s/%s: exit %d: %s", p, idx, code, errOut)
			}
			var s results.Summary
			if err := json.Unmarshal([]byte(out), &s); err != nil || s.Completed != 150 || s.Policy != p {
				t.Fatalf("%s/%s: %v %+v", p, idx, err, s)
			}
		}
	}
}

// sim with several policies prints one table, one legend and the line
// that says what it shows (make demo).
func TestSimSeveralPolicies(t *testing.T) {
	code, stdout, stderr := runCLI("sim", "--workload", "w1", "--policy", "round_robin,cost_model", "--requests", "300")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if strings.Count(stdout, "latencies in ms") != 1 || strings.Count(stdout, "policy ") != 1 || !strings.Contains(stdout, "cost_model: TTFT p99") {
		t.Errorf("want one table, one legend and a conclusion:\n%s", stdout)
	}
	if code, _, stderr := runCLI("sim", "--policy", "round_robin,cost_model", "--json"); code != 2 || !strings.Contains(stderr, "compare") {
		t.Errorf("several policies with --json: exit %d, %q", code, stderr)
	}
	if code, _, _ := runCLI("sim", "--policy", "round_robin,nosuch", "--requests", "10"); code != 2 {
		t.Errorf("an unknown policy among several: exit %d, want 2", code)
	}
}
