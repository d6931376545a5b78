package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
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

func TestComparePoolsFlags(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		args    []string
		mention []string
	}{
		{[]string{"compare", "--pools", "0/0,1/3", "--prefill-replicas", "1", "--out", dir}, []string{"--pools", "--prefill-replicas", "--decode-replicas"}},
		{[]string{"compare", "--pools", "0/0,1/3", "--decode-replicas", "3", "--out", dir}, []string{"--pools replaces"}},
		{[]string{"compare", "--pools", "2/x", "--out", dir}, []string{"--pools", `"2/x"`}},
		{[]string{"compare", "--pools", ",", "--out", dir}, []string{"--pools", "at least one"}},
		{[]string{"compare", "--replicas", "4", "--pools", "0/0,1/3,1/3", "--out", dir}, []string{"pools", "1/3 listed twice"}},
		{[]string{"compare", "--replicas", "4", "--pools", "0/0,3/3", "--out", dir}, []string{"pools", "more than the fleet's 4 replicas"}},
		{[]string{"compare", "--replicas", "4", "--pools", "4/0,1/1", "--out", dir}, []string{"pools", "no replica to decode on"}},
		{[]string{"compare", "plan", "--replicas", "4", "--pools", "0/0,5/1", "--out", dir}, []string{"pools", "more than"}},
	}
	for _, c := range cases {
		code, _, errOut := runCLI(c.args...)
		ok := code == 2 && !strings.Contains(errOut, "simulations")
		for _, m := range c.mention {
			ok = ok && strings.Contains(errOut, m)
		}
		if !ok {
			t.Errorf("%v: exit %d, stderr %q (want 2, naming %q, before any run)", c.args, code, errOut, c.mention)
		}
	}
}

func TestComparePoolsWritesVariants(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pd")
	code, out, errOut := runCLI("compare", "--workload", "w1", "--policies", "cost_model", "--replicas", "4", "--pools", "0/0,1/3", "--seeds", "1", "--requests", "150", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "cost_model+aggregated") || !strings.Contains(out, "cost_model+P1D3") {
		t.Fatalf("stdout: %s", out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sums []results.Summary
	if err := json.Unmarshal(data, &sums); err != nil || len(sums) != 2 || sums[0].PD != nil || sums[1].PD == nil || sums[1].PD.PrefillReplicas != 1 {
		t.Fatalf("results.json: %v, %+v", err, sums)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	for _, want := range []string{"## Disaggregated prefill/decode", "| cost_model+P1D3 | 1 / 3 / 0 |", "--pools=0/0,1/3"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
}

func TestCapacityPDSplit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cap")
	code, out, errOut := runCLI("capacity", "--workload", "w1", "--policies", "cost_model", "--seeds", "1", "--requests", "150", "--rate", "2", "--max-replicas", "3", "--pd-split", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	data, err := os.ReadFile(filepath.Join(dir, "capacity.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		PDSplit  bool `json:"pd_split"`
		Policies []struct {
			Replicas int    `json:"replicas"`
			Fleet    string `json:"fleet"`
			Split    *struct {
				Prefill int `json:"prefill_replicas"`
				Decode  int `json:"decode_replicas"`
			} `json:"split"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(data, &c); err != nil || !c.PDSplit || len(c.Policies) != 1 {
		t.Fatalf("capacity.json: %v %s", err, data)
	}
	p := c.Policies[0]
	if p.Replicas < 1 || p.Split == nil || p.Split.Prefill+p.Split.Decode > p.Replicas || !strings.HasPrefix(p.Fleet, strconv.Itoa(p.Replicas)+" (") {
		t.Fatalf("capacity.json's answer: %+v", p)
	}
	if !strings.Contains(out, p.Fleet) {
		t.Errorf("stdout does not give the split %q: %s", p.Fleet, out)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if !strings.Contains(string(md), "| "+p.Fleet+" |") {
		t.Errorf("report.md does not give the split %q", p.Fleet)
	}
}
