package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/traces"
)

// runCLIWithin runs the CLI and fails the test when it does not return
// within d: a run that bad input should stop at once would otherwise hang
// the suite. (The run is left behind then; the test has failed anyway.)
func runCLIWithin(t *testing.T, d time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		var o, e bytes.Buffer
		c := run(args, &o, &e)
		done <- result{c, o.String(), e.String()}
	}()
	select {
	case r := <-done:
		return r.code, r.out, r.err
	case <-time.After(d):
		t.Fatalf("%v: still running after %v (bad input must be refused before the run)", args, d)
		return 0, "", ""
	}
}

// wantUsage checks exit code 2, nothing on stdout, and one line on stderr
// holding every mention.
func wantUsage(t *testing.T, args []string, code int, out, errOut string, mentions ...string) {
	t.Helper()
	if code != 2 {
		t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, errOut)
		return
	}
	if out != "" {
		t.Errorf("%v: wrote to stdout: %q", args, out)
	}
	if strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Errorf("%v: stderr is not one line: %q", args, errOut)
	}
	for _, m := range mentions {
		if !strings.Contains(errOut, m) {
			t.Errorf("%v: stderr %q does not mention %q", args, errOut, m)
		}
	}
}

// A malformed record anywhere in a trace is bad input for every command that
// reads traces, found before the run (first record) or during it (later
// ones); the message names the file, the line and the way out.
func TestCLIBadTraceRecordExitsTwo(t *testing.T) {
	dir := t.TempDir()
	good := `{"timestamp": 0, "input_length": 1000, "output_length": 4, "hash_ids": [0, 1]}` + "\n" +
		`{"timestamp": 10, "input_length": 512, "output_length": 2, "hash_ids": [0]}` + "\n"
	files := map[string]struct{ body, mention string }{
		"negative.jsonl": {good + `{"timestamp": 20, "input_length": -5, "output_length": 3}` + "\n", "input_length -5 is negative"},
		"absent.jsonl":   {good + `{"timestamp": 20, "output_length": 3}` + "\n", "missing input_length"},
		"broken.jsonl":   {good + `{"timestamp": 20, "input_len` + "\n", "invalid JSON"},
		"first.jsonl":    {`{"timestamp": 0, "input_length": 0, "output_length": 1}` + "\n" + good, "input length 0 must be positive"},
	}
	for name, f := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(f.body), 0o644); err != nil {
			t.Fatal(err)
		}
		line := name + ":3:"
		if name == "first.jsonl" {
			line = name + ":1:"
		}
		out := filepath.Join(dir, "out-"+name)
		for _, args := range [][]string{
			{"sim", "--trace", path, "--trace-format", "mooncake"},
			{"sim", "--trace", path},
			{"compare", "--trace", path, "--policies", "round_robin", "--seeds", "1", "--out", out},
			{"capacity", "--trace", path, "--policies", "round_robin", "--seeds", "1", "--max-replicas", "2"},
			{"bench", "--base-url", "http://127.0.0.1:1", "--trace", path, "--speedup", "100", "--timeout", "1s"},
			{"trace", "stats", path},
			{"trace", "convert", path, filepath.Join(dir, "out.parquet")},
		} {
			code, stdout, stderr := runCLIWithin(t, time.Minute, args...)
			wantUsage(t, args, code, stdout, stderr, line, f.mention, "--skip-bad")
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "out.parquet")); err == nil {
		t.Error("trace convert left a partial output behind")
	}
	// With --skip-bad the same files replay what parses.
	path := filepath.Join(dir, "negative.jsonl")
	if code, _, errOut := runCLI("sim", "--trace", path, "--skip-bad", "--json"); code != 0 {
		t.Errorf("--skip-bad: exit %d: %s", code, errOut)
	}
}

// A trace with no request to replay (a CSV header alone, or every record
// skipped as malformed) is bad input that says so, not a bare "EOF".
func TestCLITraceWithoutRequestsExitsTwo(t *testing.T) {
	dir := t.TempDir()
	header := filepath.Join(dir, "header.csv")
	if err := os.WriteFile(header, []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	skipped := filepath.Join(dir, "skipped.jsonl")
	if err := os.WriteFile(skipped, []byte(`{"timestamp": 0, "input_length": 0, "output_length": 1}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path    string
		extra   []string
		mention string
	}{
		{header, nil, "a header and no records"},
		{skipped, []string{"--skip-bad"}, "--skip-bad skipped"},
	} {
		for _, args := range [][]string{
			{"sim", "--trace", c.path},
			{"compare", "--trace", c.path, "--policies", "round_robin", "--seeds", "1", "--out", filepath.Join(dir, "out")},
			{"capacity", "--trace", c.path, "--policies", "round_robin", "--seeds", "1", "--max-replicas", "2"},
			{"bench", "--base-url", "http://127.0.0.1:1", "--trace", c.path, "--timeout", "1s"},
		} {
			args = append(args, c.extra...)
			code, stdout, stderr := runCLIWithin(t, time.Minute, args...)
			wantUsage(t, args, code, stdout, stderr, filepath.Base(c.path)+" holds no requests", c.mention)
		}
	}
}

// A record the stats cannot use (its block size differs from the trace's)
// is bad input too.
func TestCLITraceStatsMixedBlockSizesExitsTwo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mixed.parquet")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := traces.NewParquetWriter(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []traces.Record{
		{ID: 1, InputTokens: 1000, OutputTokens: 1, BlockSize: 512, HashIDs: []uint64{1, 2}},
		{ID: 2, Arrival: time.Second, InputTokens: 32, OutputTokens: 1, BlockSize: 16, HashIDs: []uint64{3, 4}},
	} {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	args := []string{"trace", "stats", path}
	code, out, errOut := runCLI(args...)
	wantUsage(t, args, code, out, errOut, "mixed.parquet", "record 2", "block size 16")
}

// An unknown subcommand is bad input at every level, and the message names
// the valid ones; a group alone still prints its help.
func TestCLIUnknownSubcommandExitsTwo(t *testing.T) {
	cases := []struct {
		args     []string
		mentions []string
	}{
		{[]string{"nosuch"}, []string{`"nosuch"`, "sim", "trace", "compare"}},
		{[]string{"trace", "nosuch"}, []string{`"nosuch"`, `"inferrail trace"`, "convert, stats"}},
		{[]string{"trace", "stat"}, []string{"did you mean stats"}},
		{[]string{"trace", "nosuch", "more"}, []string{`"nosuch"`, "convert, stats"}},
		{[]string{"completion", "nosuch"}, []string{"bash"}},
		{[]string{"help", "nosuch"}, []string{`"nosuch"`, "sim"}},
		{[]string{"help", "trace", "nosuch"}, []string{`"nosuch"`, "convert, stats"}},
	}
	for _, c := range cases {
		code, out, errOut := runCLI(c.args...)
		wantUsage(t, c.args, code, out, errOut, c.mentions...)
	}
	for _, args := range [][]string{{"trace"}, {}, {"help", "trace"}} {
		code, out, errOut := runCLI(args...)
		if code != 0 || !strings.Contains(out, "Available Commands") {
			t.Errorf("%v: exit %d, want 0 and help (stdout %q, stderr %q)", args, code, out, errOut)
		}
	}
}

// Every flag that sizes a run has bounds, refused at once with the flag, the
// range and the reason.
func TestCLIRunSizeBounds(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	base := []string{"--base-url", "http://127.0.0.1:1"}
	cases := []struct {
		args     []string
		mentions []string
	}{
		{[]string{"sim", "--requests", "1000000000000"}, []string{"--requests", "10000000", "compare plan"}},
		{[]string{"sim", "--set", "requests=1000000000000"}, []string{"requests", "10000000"}},
		{[]string{"sim", "--duration", "1000000h"}, []string{"--duration", "10000000", "--requests"}},
		{[]string{"sim", "--rate", "1e12", "--requests", "100"}, []string{"--rate", "1000000"}},
		{[]string{"sim", "--set", "rate=1e12", "--requests", "100"}, []string{"rate", "1000000"}},
		{[]string{"sim", "--scrape-interval", "1ns"}, []string{"--scrape-interval", "1ms"}},
		{[]string{"sim", "--warmup", "10m", "--duration", "5m"}, []string{"--warmup", "5m0s"}},
		{[]string{"sim", "--speedup", "-3", "--requests", "10"}, []string{"--speedup", "--trace"}},
		{[]string{"sim", "--limit", "10", "--requests", "10"}, []string{"--limit", "--trace"}},
		{[]string{"sim", "--trace", sampleTrace, "--speedup", "0"}, []string{"--speedup", "0.001", "1e+06"}},
		{[]string{"sim", "--trace", sampleTrace, "--speedup", "1e-300"}, []string{"--speedup"}},
		{[]string{"sim", "--trace", sampleTrace, "--rate-scale", "0"}, []string{"--rate-scale", "(0, 1]"}},
		{[]string{"sim", "--trace", sampleTrace, "--limit", "100000000000"}, []string{"--limit", "10000000"}},
		{[]string{"compare", "--seeds", "100000000", "--out", out}, []string{"--seeds", "1000"}},
		{[]string{"compare", "--first-seed", "18446744073709551615", "--seeds", "2", "--out", out}, []string{"--first-seed"}},
		{[]string{"compare", "--rates", "1,2e7", "--out", out}, []string{"--rates", "1000000"}},
		{[]string{"compare", "--duration", "100h", "--rates", "1,100", "--out", out}, []string{"--rates: 100 req/s", "--duration"}},
		{[]string{"compare", "--parallel", "100000", "--out", out}, []string{"--parallel", "1024"}},
		{[]string{"capacity", "--duration", "1000h"}, []string{"--duration", "10000000"}},
		{append([]string{"bench", "--requests", "1000000000000"}, base...), []string{"--requests", "10000000"}},
		{append([]string{"bench", "--trace", sampleTrace, "--speedup", "0"}, base...), []string{"--speedup"}},
		{append([]string{"bench", "--rate", "1e12"}, base...), []string{"--rate"}},
		{[]string{"bench", "--base-url", "127.0.0.1:8000", "--requests", "1"}, []string{`"127.0.0.1:8000"`, "http://"}},
	}
	for _, c := range cases {
		code, stdout, stderr := runCLIWithin(t, 30*time.Second, c.args...)
		wantUsage(t, c.args, code, stdout, stderr, c.mentions...)
	}
	// The bounds leave real runs alone: a long run capped by --requests.
	if code, _, errOut := runCLI("sim", "--workload", "w6", "--duration", "1000h", "--requests", "50", "--json"); code != 0 {
		t.Errorf("--duration 1000h --requests 50: exit %d: %s", code, errOut)
	}
}

// The engine refuses nonsense before it listens.
func TestCLIEngineFlagsRefuseNonsense(t *testing.T) {
	cases := []struct {
		args     []string
		mentions []string
	}{
		{[]string{"--drain-timeout", "-1s"}, []string{"--drain-timeout"}},
		{[]string{"--speedup", "0"}, []string{"--speedup"}}, // the engine runs on real time: no such flag
		{[]string{"--port", "-1"}, []string{"--port"}},
		{[]string{"--block-size", "0"}, []string{"block_size"}},
		{[]string{"--num-gpu-blocks-override", "-1"}, []string{"num_gpu_blocks"}},
		{[]string{"--max-num-seqs", "0"}, []string{"max_num_seqs"}},
		{[]string{"--max-num-batched-tokens", "0"}, []string{"max_num_batched_tokens"}},
		{[]string{"--max-model-len", "-1"}, []string{"max_model_len"}},
		{[]string{"--data-parallel-size", "-1"}, []string{"data_parallel_size"}},
		{[]string{"--output-tokens", "-1"}, []string{"output tokens"}},
		{[]string{"--responses-store", "-1"}, []string{"--responses-store", "number of responses to keep"}},
		{[]string{"--fault-error-rate", "-0.5"}, []string{"fault error rate"}},
		{[]string{"--fault-error-status", "200"}, []string{"fault error status"}},
		{[]string{"--procs", "2"}, []string{"--procs", "adaptive or fixed"}},
		{[]string{"--sysmon", "asleep"}, []string{"--sysmon", "awake or go"}},
	}
	for _, c := range cases {
		args := append([]string{"engine", "--port", "0"}, c.args...)
		code, out, errOut := runCLIWithin(t, 10*time.Second, args...)
		wantUsage(t, args, code, out, errOut, c.mentions...)
	}
}

func TestCLIVersion(t *testing.T) {
	defer func(v string) { buildVersion = v }(buildVersion)
	for _, v := range []string{"", "v1.2.3-4-gabcdef"} {
		buildVersion = v
		want := "inferrail version " + version() + "\n"
		if v != "" && version() != v {
			t.Fatalf("version() = %q, want the stamped %q", version(), v)
		}
		if version() == "" {
			t.Fatal("version() is empty")
		}
		for _, args := range [][]string{{"--version"}, {"version"}} {
			code, out, errOut := runCLI(args...)
			if code != 0 || out != want || errOut != "" {
				t.Errorf("%v: exit %d, stdout %q, stderr %q; want 0 and %q", args, code, out, errOut, want)
			}
		}
	}
	if code, _, errOut := runCLI("version", "extra"); code != 2 {
		t.Errorf("version extra: exit %d, want 2 (%s)", code, errOut)
	}
}
