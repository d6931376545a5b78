// The CLI tells the truth: help that matches what the commands do, errors
// printed once, default rates that follow --profile, and failures named.

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/results"
)

// flagHelp is the help line of --name in a command's help.
func flagHelp(t *testing.T, name string, args ...string) string {
	t.Helper()
	code, out, errOut := runCLI(append(args, "--help")...)
	if code != 0 {
		t.Fatalf("%v --help: exit %d: %s", args, code, errOut)
	}
	re := regexp.MustCompile(`(?m)^\s+--` + name + `\b.*$`)
	return re.FindString(out)
}

// TestHelpTellsTheTruth: each command's --requests, --rate and --out help
// say what the command does, and capacity has no --replicas to ignore.
func TestHelpTellsTheTruth(t *testing.T) {
	for _, c := range []struct {
		cmd, flag, want, not string
	}{
		{"sim", "requests", "default 2000, 600 for w7", ""},
		{"compare", "requests", "default 5000", "2000"},
		{"capacity", "requests", "default 5000", "2000"},
		{"sim", "rate", "--replicas engines of --profile", ""},
		{"capacity", "rate", "default rate for 8 engines of --profile", "x replicas"},
		{"compare", "out", "results.json, requests.parquet, report.md", ""},
		{"capacity", "out", "capacity.json, report.md and the charts", "results.json"},
	} {
		line := flagHelp(t, c.flag, c.cmd)
		if !strings.Contains(line, c.want) || (c.not != "" && strings.Contains(line, c.not)) {
			t.Errorf("%s --%s: help %q, want it to say %q", c.cmd, c.flag, line, c.want)
		}
	}
	if line := flagHelp(t, "replicas", "capacity"); line != "" {
		t.Errorf("capacity still has a --replicas flag: %q", line)
	}
	if code, _, errOut := runCLI("capacity", "--replicas", "4"); code != 2 || !strings.Contains(errOut, "--replicas") {
		t.Errorf("capacity --replicas 4: exit %d, %q; want a usage error", code, errOut)
	}
}

// TestCompareErrorPrintedOnce: a bad policy is reported once.
func TestCompareErrorPrintedOnce(t *testing.T) {
	for _, args := range [][]string{
		{"compare", "--policies", "foo", "--out", t.TempDir()},
		{"capacity", "--policies", "foo"},
	} {
		code, _, errOut := runCLI(args...)
		if code != 2 || strings.Count(errOut, `unknown policy "foo"`) != 1 || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want the error once, on one line", args, code, errOut)
		}
	}
}

// TestDefaultRateFollowsTheProfile: without --rate, a fleet of H100s is
// offered what its engines serve, not the default GPU's rate.
func TestDefaultRateFollowsTheProfile(t *testing.T) {
	rate := func(args ...string) float64 {
		t.Helper()
		code, out, errOut := runCLI(append([]string{"sim", "--workload", "w1", "--requests", "50", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		var s results.Summary
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatal(err)
		}
		return s.RateRPS
	}
	if r := rate(); r != 3.2 {
		t.Errorf("default profile: rate %v, want 3.2", r)
	}
	if r := rate("--profile", "Llama-3.1-8B@H100"); !(r > 2*3.2) {
		t.Errorf("Llama-3.1-8B@H100: default rate %v, want well above the default GPU's 3.2", r)
	}
}

// TestCapacityRunsAtTheRateItSays: capacity without --rate offers the
// default rate of 8 replicas, and its report's workload YAML says so.
func TestCapacityRunsAtTheRateItSays(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cap")
	code, _, errOut := runCLI("capacity", "--workload", "w6", "--policies", "round_robin", "--seeds", "1", "--requests", "200", "--max-replicas", "2", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	data, err := os.ReadFile(filepath.Join(dir, "capacity.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		RateRPS float64 `json:"rate_rps"`
	}
	if err := json.Unmarshal(data, &c); err != nil || c.RateRPS != 20 {
		t.Fatalf("capacity.json rate %v (%v), want w6's 2.5 x 8", c.RateRPS, err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if !strings.Contains(string(md), "\nrate: 20\n") {
		t.Errorf("report.md's workload YAML does not give the rate it ran, 20")
	}
}

const mooncakeTrace = "../../../shared/traces/mooncake/conversation_trace.jsonl"

// TestMooncakeFailuresAreNamed: the Mooncake conversation trace has
// prompts over the default max_model_len; sim and compare say how many
// requests failed and why.
func TestMooncakeFailuresAreNamed(t *testing.T) {
	if testing.Short() {
		t.Skip("replays a 12,031-request trace")
	}
	if _, err := os.Stat(mooncakeTrace); err != nil {
		t.Skipf("no Mooncake trace: %v", err)
	}
	why := "846 failed: prompt + max_tokens over max_model_len 32768 (too_long)"
	code, out, errOut := runCLI("sim", "--trace", mooncakeTrace, "--replicas", "16", "--policy", "round_robin")
	if code != 0 || !strings.Contains(out, "round_robin: "+why) {
		t.Errorf("sim: exit %d, want %q in:\n%s%s", code, why, out, errOut)
	}
	dir := filepath.Join(t.TempDir(), "cmp")
	code, out, errOut = runCLI("compare", "--trace", mooncakeTrace, "--replicas", "16", "--policies", "round_robin", "--seeds", "1", "--out", dir)
	if code != 0 {
		t.Fatalf("compare: exit %d: %s", code, errOut)
	}
	note := "too_long: prompt + max_tokens over max_model_len 32768: 846 requests"
	if !regexp.MustCompile(`(?m)^round_robin\s.*\s846$`).MatchString(out) || strings.Count(out, note) != 1 {
		t.Errorf("compare: want a failed column of 846 and the reason once:\n%s", out)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if !strings.Contains(string(md), "| Failed |") || strings.Count(string(md), note) != 1 {
		t.Errorf("report.md lacks the failed column or the reason")
	}
}
