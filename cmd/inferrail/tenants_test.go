package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/results"
)

var noisyExample = filepath.Join("..", "..", "examples", "tenants-noisy.yaml")

// TestSimTenants: the isolation example runs, with its per-tenant table and
// JSON, limits off, and without the noisy tenant.
func TestSimTenants(t *testing.T) {
	code, out, errOut := runCLI("sim", "--workload-file", noisyExample, "--duration", "1m")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"round_robin per tenant (tenant limits on):", "noisy", "rate_limited"} {
		if !strings.Contains(out, want) {
			t.Fatalf("table lacks %q:\n%s", want, out)
		}
	}
	sim := func(args ...string) results.Summary {
		t.Helper()
		code, out, errOut := runCLI(append([]string{"sim", "--workload-file", noisyExample, "--duration", "1m", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		var s results.Summary
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return s
	}
	on := sim()
	if on.TenantLimits != "on" || len(on.PerTenant) != 4 || on.Rejected["rate_limited"] == 0 || on.PerTenant[3].FailedBy["rate_limited"] != on.Rejected["rate_limited"] {
		t.Fatalf("limits on: %+v", on.PerTenant)
	}
	if off := sim("--limits", "off"); off.TenantLimits != "off" || off.RejectedTotal != 0 {
		t.Fatalf("limits off: tenant_limits %q rejected %d", off.TenantLimits, off.RejectedTotal)
	}
	wo := sim("--set", "without_tenants=[noisy]")
	if len(wo.PerTenant) != 3 || len(wo.WithoutTenants) != 1 || wo.RejectedTotal != 0 {
		t.Fatalf("without noisy: %+v", wo)
	}
	// One field of one tenant's limits by --set: the others are kept.
	if s := sim("--set", "tenants.alpha.rpm=30"); s.PerTenant[0].FailedBy["rate_limited"] == 0 {
		t.Fatalf("alpha at rpm 30 not limited: %+v", s.PerTenant[0])
	}
}

func TestTenantFlagsBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"sim", "--workload-file", noisyExample, "--limits", "maybe"}, "--limits"},
		{[]string{"sim", "--workload-file", noisyExample, "--limits", "on,off"}, "only compare"},
		{[]string{"sim", "--workload", "w1", "--limits", "off"}, "--limits: the workload gives no tenant a limit"},
		{[]string{"sim", "--workload-file", noisyExample, "--set", "tenants.noisy.rpm=-1"}, "tenants.noisy.rpm"},
		{[]string{"sim", "--workload-file", noisyExample, "--set", "tenants.zulu.rpm=1"}, "tenants.zulu"},
		{[]string{"sim", "--workload-file", noisyExample, "--set", "tenants.noisy.rps=1"}, "rps"},
		{[]string{"sim", "--workload-file", noisyExample, "--set", "without_tenants=[zulu]"}, "without_tenants[0]"},
		{[]string{"compare", "--workload-file", noisyExample, "--isolate", "zulu", "--out", dir}, "isolate"},
		{[]string{"compare", "--workload-file", noisyExample, "--isolate", "", "--out", dir}, "--isolate"},
		{[]string{"compare", "--workload-file", noisyExample, "--limits", "on,on", "--out", dir}, "--limits"},
		{[]string{"compare", "--workload", "w1", "--limits", "on,off", "--out", dir}, "--limits"},
		{[]string{"capacity", "--workload-file", noisyExample, "--limits", "on,off"}, "only compare"},
	} {
		code, out, errOut := runCLI(c.args...)
		if code != 2 || out != "" || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, c.mention) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q (want 2 and one line naming %q)", c.args, code, out, errOut, c.mention)
		}
	}
}

// TestCompareIsolation: compare --isolate with --limits on,off prints and
// writes the isolation table.
func TestCompareIsolation(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "iso")
	code, out, errOut := runCLI("compare", "--workload-file", noisyExample, "--duration", "2m", "--policies", "cost_model",
		"--isolate", "noisy", "--limits", "on,off", "--seeds", "1", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"cost_model+limits-on+without-noisy", "cost_model+limits-off", "other tenants' TTFT p99 with noisy against without it", "(all others)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("stdout lacks %q:\n%s", want, out)
		}
	}
	var sums []results.Summary
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &sums); err != nil || len(sums) != 4 {
		t.Fatalf("results.json: %v, %d summaries", err, len(sums))
	}
	if sums[0].TenantLimits != "on" || sums[1].WithoutTenants[0] != "noisy" || sums[2].TenantLimits != "off" {
		t.Fatalf("summaries: %+v %+v %+v", sums[0].TenantLimits, sums[1].WithoutTenants, sums[2].TenantLimits)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	for _, want := range []string{"## Tenants", "### Isolation from `noisy`", "--isolate=noisy", "--limits=on,off"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
}
