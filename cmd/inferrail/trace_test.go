package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/results"
)

const sampleTrace = "../../traces/testdata/mooncake.jsonl"

func TestTraceStatsAndConvert(t *testing.T) {
	code, out, errOut := runCLI("trace", "stats", sampleTrace, "--cache-tokens", "1024")
	if code != 0 || !strings.Contains(out, "prefix reuse, unlimited cache") {
		t.Fatalf("stats: exit %d %s %s", code, out, errOut)
	}
	code, out, _ = runCLI("trace", "stats", sampleTrace, "--json")
	var st map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["requests"] == nil || st["reuse"] == nil {
		t.Fatalf("stats --json: %d %s", code, out)
	}
	pq := filepath.Join(t.TempDir(), "t.parquet")
	if code, out, errOut := runCLI("trace", "convert", sampleTrace, pq); code != 0 || !strings.Contains(out, "wrote") {
		t.Fatalf("convert: exit %d %s %s", code, out, errOut)
	}
	// The parquet copy replays like the original.
	sim := func(path string) results.Summary {
		code, out, errOut := runCLI("sim", "--trace", path, "--policy", "cost_model", "--json")
		if code != 0 {
			t.Fatalf("sim --trace %s: exit %d %s", path, code, errOut)
		}
		var s results.Summary
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatal(err)
		}
		s.SimWallS, s.Workload = 0, ""
		return s
	}
	a, b := sim(sampleTrace), sim(pq)
	if a.Requests == 0 || a.Completed != a.Requests {
		t.Fatalf("replay: %+v", a)
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Fatalf("the parquet copy simulates differently:\n%s\n%s", ja, jb)
	}
}

func TestTraceBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte("{\"timestamp\": 0, \"input_length\": \"many\"}\n"), 0o644)
	cases := []struct {
		args    []string
		mention string
	}{
		{[]string{"sim", "--trace", filepath.Join(dir, "missing.jsonl")}, "--trace"},
		{[]string{"sim", "--trace", sampleTrace, "--rate", "3"}, "--rate"},
		{[]string{"sim", "--trace", sampleTrace, "--rate-scale", "2"}, "rate-scale"},
		{[]string{"sim", "--trace", bad, "--trace-format", "mooncake"}, "bad.jsonl:1"},
		{[]string{"sim", "--trace", sampleTrace, "--trace-format", "csv"}, "mooncake"},
		{[]string{"trace", "stats"}, "one trace file"},
		{[]string{"trace", "stats", sampleTrace, "--cache-tokens", "lots"}, "--cache-tokens"},
		{[]string{"trace", "convert", sampleTrace, filepath.Join(dir, "out.csv")}, ".parquet"},
	}
	for _, c := range cases {
		code, _, errOut := runCLI(c.args...)
		if code != 2 || !strings.Contains(errOut, c.mention) {
			t.Errorf("%v: exit %d, stderr %q (want 2 naming %q)", c.args, code, errOut, c.mention)
		}
	}
}

func TestCompareOnATrace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cmp")
	code, _, errOut := runCLI("compare", "--trace", sampleTrace, "--policies", "round_robin,cost_model", "--seeds", "2", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil || !strings.Contains(string(md), "trace:mooncake.jsonl") {
		t.Fatalf("report does not name the trace: %v", err)
	}
}

func TestTraceSynth(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "long.jsonl")
	code, stdout, stderr := runCLI("trace", "synth", "--requests", "200", "--out", out)
	if code != 0 || !strings.Contains(stdout, "wrote 200 requests") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, _ = runCLI("trace", "stats", out)
	if code != 0 || !strings.Contains(stdout, "200 (0 skipped)") {
		t.Errorf("stats of the synthetic trace: exit %d: %s", code, stdout)
	}
	for _, args := range [][]string{
		{"--input-max", "100", "--out", out},
		{"--rate", "0", "--out", out},
		{"--requests", "10"},
	} {
		code, _, stderr := runCLI(append([]string{"trace", "synth"}, args...)...)
		if code != 2 || !strings.Contains(stderr, "--") && !strings.Contains(stderr, "must") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and the parameter named", args, code, stderr)
		}
	}
}
