package compare

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/workload"
)

// isolationSpec is examples/tenants-noisy.yaml (three quiet tenants, one
// sending 10x its rpm) cut to d of arrivals, the first 30s left out, under
// round robin and cost_model, with limits on and off and without the noisy
// tenant.
func isolationSpec(t *testing.T, d time.Duration, seeds ...uint64) Spec {
	t.Helper()
	w, err := workload.LoadConfig(filepath.Join("..", "examples", "tenants-noisy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w.Duration = d
	c := fleet.DefaultConfig()
	c.Workload = w
	c.Warmup = 30 * time.Second
	return Spec{Base: c, Policies: []string{"round_robin", "cost_model"}, Limits: []string{fleet.LimitsOn, fleet.LimitsOff},
		Isolate: "noisy", Seeds: seeds, KeepRecords: true}
}

// TestIsolation is the isolation goal as a regression test: with tenant
// limits on, a tenant sending 10x its limit moves no other tenant's TTFT
// p99 by more than 10% (each quiet tenant's, and theirs pooled, against the
// same seed's run without the noisy tenant, median over seeds); with limits
// off the same tenant takes the fleet past its capacity and moves them by
// far more, so the test can fail.
func TestIsolation(t *testing.T) {
	s := isolationSpec(t, 3*time.Minute, 1, 2, 3)
	pts, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	rows := Isolation(s, pts)
	if len(rows) != 2*2*4 { // policies x limits x (three tenants + pooled)
		t.Fatalf("%d isolation rows: %+v", len(rows), rows)
	}
	for _, r := range rows {
		t.Logf("%-24s %-13s with %6.0f ms without %6.0f ms change %+7.1f%% [%+.1f%%, %+.1f%%]", r.Label, r.Tenant, r.With, r.Without, 100*r.Change, 100*r.ChangeMin, 100*r.ChangeMax)
		if r.Tenant == "noisy" || r.Seeds != 3 || r.Baseline != r.Label+"+without-noisy" {
			t.Fatalf("row %+v", r)
		}
		switch r.Limits {
		case fleet.LimitsOn:
			if !r.Within || r.Change > IsolationGoal || r.Change < -IsolationGoal {
				t.Errorf("%s: %s's TTFT p99 moved %+.1f%% with the noisy tenant (limits on), goal within 10%%", r.Label, r.Tenant, 100*r.Change)
			}
		case fleet.LimitsOff:
			if r.Tenant == OthersRow && r.Change < 1 {
				t.Errorf("%s: without limits the noisy tenant moved the others' TTFT p99 only %+.1f%%: the test cannot fail", r.Label, 100*r.Change)
			}
		}
	}
	// The noisy tenant really is at 10x its limit, and refused only with limits on.
	for _, p := range pts {
		for _, tn := range p.Summary.PerTenant {
			if tn.Tenant != "noisy" {
				if tn.Failed != 0 {
					t.Fatalf("%s seed %d: quiet tenant %s failed %v", p.Label, p.Seed, tn.Tenant, tn.FailedBy)
				}
				continue
			}
			if p.Without != "" {
				t.Fatalf("%s: the left-out tenant was sent", p.Label)
			}
			limited := tn.FailedBy["rate_limited"]
			if p.Limits == fleet.LimitsOn && (limited < 8*tn.Requests/10 || limited > 95*tn.Requests/100) {
				t.Fatalf("%s seed %d: %d of %d noisy requests rate limited, want about 90%%", p.Label, p.Seed, limited, tn.Requests)
			}
			if p.Limits == fleet.LimitsOff && limited != 0 {
				t.Fatalf("%s seed %d: %d rate limited with limits off", p.Label, p.Seed, limited)
			}
		}
	}
}

func TestIsolationVariants(t *testing.T) {
	s := isolationSpec(t, time.Minute, 1)
	want := []string{
		"round_robin+limits-on", "round_robin+limits-on+without-noisy", "round_robin+limits-off", "round_robin+limits-off+without-noisy",
		"cost_model+limits-on", "cost_model+limits-on+without-noisy", "cost_model+limits-off", "cost_model+limits-off+without-noisy",
	}
	vs := s.Variants()
	if got := labels(vs); !reflect.DeepEqual(got, want) {
		t.Fatalf("labels %v", got)
	}
	if v := vs[3]; v.Limits != fleet.LimitsOff || v.Without != "noisy" || v.Policy != "round_robin" {
		t.Fatalf("variant %+v", v)
	}
	// One switch, no isolated tenant: the plain policy labels.
	s.Limits, s.Isolate = []string{fleet.LimitsOff}, ""
	if got := labels(s.Variants()); !reflect.DeepEqual(got, []string{"round_robin", "cost_model"}) {
		t.Fatalf("labels %v", got)
	}
	if s.Variants()[0].Limits != fleet.LimitsOff {
		t.Fatal("the one limits switch is not the variants'")
	}
}

func TestIsolationSpecErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Spec)
		want string
	}{
		{"unknown tenant", func(s *Spec) { s.Isolate = "zulu" }, `isolate: no class of the workload's mix has tenant "zulu"`},
		{"already out", func(s *Spec) { s.Base.Workload.WithoutTenants = []string{"noisy"} }, `isolate: tenant "noisy" is already left out`},
		{"bad switch", func(s *Spec) { s.Limits = []string{"on", "maybe"} }, `limits: each must be on or off, got "maybe"`},
		{"twice", func(s *Spec) { s.Limits = []string{"on", "on"} }, `limits: "on" listed twice`},
		{"no limits", func(s *Spec) { s.Base.Workload.Tenants = nil }, "limits: comparing tenant limits needs a synthetic workload whose tenants have limits"},
		{"only tenant", func(s *Spec) {
			s.Base.Workload.Mix = s.Base.Workload.Mix[3:]
			s.Base.Workload.Tenants = workload.Tenants{"noisy": {RPM: 54}}
		}, "without_tenants: leaves out every class of the mix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := isolationSpec(t, time.Minute, 1)
			tc.edit(&s)
			started := false
			s.Progress = func(int, int) { started = true }
			_, err := Run(context.Background(), s)
			if err == nil || !strings.Contains(err.Error(), tc.want) || started {
				t.Fatalf("error %v (started %v), want one containing %q", err, started, tc.want)
			}
		})
	}
}

// TestReportTenants: report.md has the per-tenant table and the isolation
// table, before the charts.
func TestReportTenants(t *testing.T) {
	s := isolationSpec(t, time.Minute, 1)
	s.Policies = []string{"cost_model"}
	pts, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Write(dir, s, pts, nil, Meta{Title: "isolation", Version: "test", Command: "go test"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	ten, iso, charts := strings.Index(md, "\n## Tenants\n"), strings.Index(md, "\n### Isolation from `noisy`\n"), strings.Index(md, "\n## Charts\n")
	if ten < 0 || iso < ten || charts < iso {
		t.Fatalf("sections at %d, %d, %d:\n%s", ten, iso, charts, md)
	}
	for _, want := range []string{
		"| variant | tenant | requests | completed | rate limited | other failures | TTFT p50 | TTFT p99 | E2E p99 |",
		"| `cost_model+limits-on` | `noisy` |",
		"| `cost_model+limits-off+without-noisy` | `alpha` |",
		"`noisy` rpm 54, tpm 0, max concurrency 0",
		"| `cost_model+limits-on` | (all others) |",
		"With tenant limits on, the largest median change of another tenant's TTFT p99 is",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	// Without tenants, no section.
	plain := Spec{Base: baseConfig(t, "w1", 100), Policies: []string{"round_robin"}, Seeds: []uint64{1}}
	pts, err = Run(context.Background(), plain)
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	if _, err := Write(dir, plain, pts, nil, Meta{Title: "plain"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "report.md")); strings.Contains(string(b), "## Tenants") {
		t.Fatal("a report without tenants has a tenants section")
	}
}
