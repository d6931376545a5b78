package compare

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/router/gateway"
)

func labels(vs []Variant) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Label)
	}
	return out
}

func TestVariantLabels(t *testing.T) {
	base := fleet.DefaultConfig()
	s := Spec{Base: base, Policies: []string{"round_robin", "cost_model"}}
	if got := labels(s.Variants()); !reflect.DeepEqual(got, []string{"round_robin", "cost_model"}) {
		t.Errorf("one admission, one ledger: %v", got)
	}
	s.Admissions = []gateway.Admission{gateway.AdmitKV}
	if got := labels(s.Variants()); !reflect.DeepEqual(got, []string{"round_robin", "cost_model"}) {
		t.Errorf("one admission given: %v", got)
	}
	s.Admissions = []gateway.Admission{gateway.AdmitNone, gateway.AdmitKV}
	if got := labels(s.Variants()); !reflect.DeepEqual(got, []string{"round_robin+none", "round_robin+kv", "cost_model+none", "cost_model+kv"}) {
		t.Errorf("two admissions: %v", got)
	}
	s.Admissions = []gateway.Admission{gateway.AdmitKV}
	s.Ledgers = []string{fleet.LedgerShared, fleet.LedgerIndependent}
	vs := s.Variants()
	if got := labels(vs); !reflect.DeepEqual(got, []string{"round_robin+kv+shared", "round_robin+kv+independent", "cost_model+kv+shared", "cost_model+kv+independent"}) {
		t.Errorf("two ledgers: %v", got)
	}
	if v := vs[3]; v.Policy != "cost_model" || v.Admission != gateway.AdmitKV || v.Ledger != fleet.LedgerIndependent {
		t.Errorf("variant %+v", v)
	}
	if !IsCacheBlind("round_robin+kv+shared") || IsCacheBlind("cost_model+kv") {
		t.Error("IsCacheBlind does not judge a label by its policy")
	}
}

func TestAdmissionAndLedgerLists(t *testing.T) {
	all := AdmissionList(" all ")
	if len(all) != len(gateway.Admissions()) || all[0] != gateway.AdmitNone {
		t.Errorf("all = %v", all)
	}
	if got := AdmissionList("none, kv,"); !reflect.DeepEqual(got, []gateway.Admission{"none", "kv"}) {
		t.Errorf("list parsing: %v", got)
	}
	if got := LedgerList("shared,independent"); !reflect.DeepEqual(got, []string{"shared", "independent"}) {
		t.Errorf("ledgers: %v", got)
	}
}

func TestBadAdmissionsAndLedgers(t *testing.T) {
	base := baseConfig(t, "w1", 100)
	cases := []struct {
		admissions []gateway.Admission
		ledgers    []string
		gateways   int
		want       []string
	}{
		{admissions: []gateway.Admission{"kv", "fifo"}, want: []string{"admissions", "fifo"}},
		{admissions: []gateway.Admission{"kv", "none", "kv"}, want: []string{"admissions", `"kv" listed twice`}},
		{ledgers: []string{"shared", "global"}, gateways: 2, want: []string{"ledgers", "global"}},
		{ledgers: []string{"shared", "shared"}, gateways: 2, want: []string{"ledgers", "twice"}},
		{ledgers: []string{"shared", "independent"}, gateways: 1, want: []string{"ledgers", "several gateways"}},
	}
	for _, c := range cases {
		s := Spec{Base: base, Policies: []string{"cost_model"}, Seeds: []uint64{1}, Admissions: c.admissions, Ledgers: c.ledgers}
		s.Base.Gateways = max(1, c.gateways)
		started := false
		s.Progress = func(int, int) { started = true }
		_, err := Run(context.Background(), s)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v %v: error %v should mention %q", c.admissions, c.ledgers, err, w)
			}
		}
		if started {
			t.Error("a simulation ran before validation failed")
		}
	}
	ok := Spec{Base: base, Policies: []string{"cost_model"}, Seeds: []uint64{1}, Admissions: AdmissionList("all")}
	if err := ok.Validate(); err != nil {
		t.Errorf("every admission rule: %v", err)
	}
}

func TestRunAdmissionsAndLedgers(t *testing.T) {
	s := Spec{
		Base:       baseConfig(t, "w7", 300),
		Policies:   []string{"cost_model"},
		Admissions: []gateway.Admission{gateway.AdmitNone, gateway.AdmitKV},
		Ledgers:    []string{fleet.LedgerShared, fleet.LedgerIndependent},
		Seeds:      []uint64{1, 2},
	}
	s.Base.Gateways = 3
	pts, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 8 {
		t.Fatalf("%d points, want 1 policy x 2 admissions x 2 ledgers x 2 seeds", len(pts))
	}
	want := []string{"cost_model+none+shared", "cost_model+none+independent", "cost_model+kv+shared", "cost_model+kv+independent"}
	for i, p := range pts {
		v := want[i/2]
		if p.Label != v || p.Seed != uint64(1+i%2) || p.Policy != "cost_model" {
			t.Fatalf("point %d: %s seed %d, want %s seed %d", i, p.Label, p.Seed, v, 1+i%2)
		}
		if string(p.Admission) != p.Summary.Admission || p.Summary.Ledger != p.Ledger || p.Summary.Gateways != 3 {
			t.Errorf("point %d (%s): summary says admission %q, ledger %q, %d gateways", i, p.Label, p.Summary.Admission, p.Summary.Ledger, p.Summary.Gateways)
		}
	}
}

func TestWriteAdmissionReport(t *testing.T) {
	s := Spec{
		Base:       baseConfig(t, "w7", 400),
		Policies:   []string{"cost_model"},
		Admissions: []gateway.Admission{gateway.AdmitNone, gateway.AdmitKV},
		Seeds:      []uint64{1, 2},
	}
	pts, err := Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Write(dir, s, pts, nil, Meta{Title: "w7", Version: "test", Command: "go test"}); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Admission and queueing", "| cost_model+none | ", "| cost_model+kv | ", "| Admission | `none`, `kv` (compared) |", "gives the most goodput"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
}

func TestCapacityPerVariant(t *testing.T) {
	s := CapacitySpec{
		Base:        baseConfig(t, "w1", 10),
		Policies:    []string{"round_robin", "cost_model"},
		Admissions:  []gateway.Admission{gateway.AdmitNone, gateway.AdmitKV},
		Seeds:       []uint64{1},
		Rate:        5,
		MaxReplicas: 8,
	}
	res, err := capacity(context.Background(), s, fakeRun(map[string][]int{}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res {
		got = append(got, r.Label)
		if r.Replicas != 5 {
			t.Errorf("%s: %d replicas, want 5", r.Label, r.Replicas)
		}
	}
	if !reflect.DeepEqual(got, []string{"round_robin+none", "round_robin+kv", "cost_model+none", "cost_model+kv"}) {
		t.Errorf("labels %v", got)
	}
	rep := &CapacityReport{Spec: s, Results: res}
	if b := rep.Baseline(); b != "round_robin+none" {
		t.Errorf("baseline %q, want round_robin+none", b)
	}
	if p := rep.summary().Policies[1]; p.Policy != "round_robin+kv" || p.Admission != "kv" || p.Saved == nil || *p.Saved != 0 {
		t.Errorf("capacity.json entry %+v", p)
	}
	if p := (&CapacityReport{Spec: CapacitySpec{Policies: []string{"p2c"}}, Results: []CapacityResult{{Policy: "p2c", Label: "p2c", Replicas: 2}}}).summary().Policies[0]; p.Admission != "" {
		t.Errorf("a plain policy's capacity.json entry names an admission: %+v", p)
	}
}
