package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/results"
)

func TestCompareWritesEverything(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cmp")
	code, out, errOut := runCLI("compare", "--workload", "w1", "--policies", "round_robin,cost_model", "--seeds", "2", "--requests", "300", "--rates", "2,3", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "cost_model") {
		t.Fatalf("stdout: %s", out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sums []results.Summary
	if err := json.Unmarshal(data, &sums); err != nil || len(sums) != 8 {
		t.Fatalf("results.json: %v, %d summaries (want 2 policies x 2 rates x 2 seeds)", err, len(sums))
	}
	for _, f := range []string{"requests.parquet", "report.md", "ttft_cdf.png", "sweep_ttft_p99.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if !strings.Contains(string(md), "inferrail compare") {
		t.Error("report.md does not say how to reproduce it")
	}
}

func TestCompareBadInputFailsBeforeRunning(t *testing.T) {
	dir := t.TempDir()
	blocked := filepath.Join(dir, "file")
	os.WriteFile(blocked, []byte("x"), 0o644)
	cases := []struct {
		args    []string
		mention string
	}{
		{[]string{"compare", "--policies", "round_robin,fastest", "--out", dir}, "fastest"},
		{[]string{"compare", "--slo", "ttft_p99=soon", "--out", dir}, "--slo"},
		{[]string{"compare", "--slo", "latency=2s", "--out", dir}, "latency"},
		{[]string{"compare", "--out", filepath.Join(blocked, "sub")}, "--out"},
		{[]string{"compare", "--rates", "2,x", "--out", dir}, "--rates"},
		{[]string{"compare", "--seeds", "0", "--out", dir}, "--seeds"},
		{[]string{"compare", "--policies", "round_robin"}, "--out"},
		{[]string{"capacity", "--max-replicas", "0"}, "max-replicas"},
		{[]string{"capacity", "--slo", "tpot_p99=-1ms"}, "--slo"},
	}
	for _, c := range cases {
		code, _, errOut := runCLI(c.args...)
		if code != 2 || !strings.Contains(errOut, c.mention) || strings.Contains(errOut, "simulations") {
			t.Errorf("%v: exit %d, stderr %q (want 2, naming %q, before any run)", c.args, code, errOut, c.mention)
		}
	}
}

func TestCapacityPrintsAndWritesReplicasPerPolicy(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cap")
	code, out, errOut := runCLI("capacity", "--workload", "w6", "--policies", "round_robin,cost_model", "--seeds", "1", "--requests", "300", "--rate", "6", "--max-replicas", "6", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "round_robin") || !strings.Contains(out, "saved vs") {
		t.Fatalf("stdout: %s", out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "capacity.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		RateRPS  float64 `json:"rate_rps"`
		Policies []struct {
			Policy   string `json:"policy"`
			Replicas int    `json:"replicas"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(data, &c); err != nil || c.RateRPS != 6 || len(c.Policies) != 2 || c.Policies[0].Replicas < 1 {
		t.Fatalf("capacity.json: %v %+v", err, c)
	}
	for _, f := range []string{"report.md", "capacity.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}

func TestCompareAdmissionsFlags(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		args    []string
		mention string
	}{
		{[]string{"compare", "--admissions", "none,kv", "--admission", "kv", "--out", dir}, "--admissions replaces --admission"},
		{[]string{"compare", "--admissions", "kv,fifo", "--out", dir}, "fifo"},
		{[]string{"compare", "--admissions", "kv,kv", "--out", dir}, "admissions"},
		{[]string{"compare", "--admissions", ",", "--out", dir}, "--admissions"},
		{[]string{"compare", "--gateways", "3", "--ledgers", "shared,independent", "--ledger", "shared", "--out", dir}, "--ledgers replaces --ledger"},
		{[]string{"compare", "--ledgers", "shared,independent", "--out", dir}, "several gateways"},
		{[]string{"compare", "--gateways", "3", "--ledgers", "shared,global", "--out", dir}, "global"},
		{[]string{"capacity", "--admissions", "kv", "--admission", "none"}, "--admissions replaces --admission"},
		{[]string{"capacity", "--admissions", "fifo"}, "fifo"},
	}
	for _, c := range cases {
		code, _, errOut := runCLI(c.args...)
		if code != 2 || !strings.Contains(errOut, c.mention) || strings.Contains(errOut, "simulations") {
			t.Errorf("%v: exit %d, stderr %q (want 2, naming %q, before any run)", c.args, code, errOut, c.mention)
		}
	}
}

func TestCompareAdmissionsWritesVariants(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "adm")
	code, out, errOut := runCLI("compare", "--workload", "w7", "--policies", "cost_model", "--admissions", "none,kv", "--seeds", "1", "--requests", "300", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "cost_model+none") || !strings.Contains(out, "cost_model+kv") {
		t.Fatalf("stdout: %s", out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sums []results.Summary
	if err := json.Unmarshal(data, &sums); err != nil || len(sums) != 2 || sums[0].Admission != "none" || sums[1].Admission != "kv" {
		t.Fatalf("results.json: %v, %d summaries", err, len(sums))
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	for _, want := range []string{"## Admission and queueing", "--admissions=none,kv"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
}

func TestCapacityAdmissions(t *testing.T) {
	code, out, errOut := runCLI("capacity", "--workload", "w6", "--policies", "cost_model", "--admissions", "none,kv", "--seeds", "1", "--requests", "200", "--rate", "4", "--max-replicas", "4")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "cost_model+none") || !strings.Contains(out, "cost_model+kv") {
		t.Fatalf("stdout: %s", out)
	}
}
