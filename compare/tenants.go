package compare

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/report"
	"github.com/inferrail/inferrail/results"
)

// IsolationGoal is the isolation goal: with tenant limits on, another
// tenant's TTFT p99 with the noisy tenant is within 10% of what it is
// without it.
const IsolationGoal = 0.10

// OthersRow is the Tenant of an isolation row that pools every tenant but
// the isolated one (requests without a tenant included).
const OthersRow = "(all others)"

// IsolationRow is one other tenant under one variant: its TTFT p99 with the
// isolated tenant in the traffic against without it, seed by seed (the
// same seed gives it the same requests in both runs).
type IsolationRow struct {
	// Label is the variant with the isolated tenant, Baseline its twin
	// without it (Label+"+without-"+tenant).
	Label, Baseline string
	// Limits is the variant's tenant limits switch (fleet.LimitsOn or
	// fleet.LimitsOff).
	Limits string
	// Tenant is the other tenant, or OthersRow for all of them pooled
	// (from the requests' records, when the points kept them).
	Tenant string
	// Seeds is the number of seeds both runs have.
	Seeds int
	// With and Without are the medians over seeds of the tenant's TTFT
	// p99 in ms.
	With, Without float64
	// Change is the median over seeds of With/Without − 1 seed by seed;
	// ChangeMin and ChangeMax its range.
	Change, ChangeMin, ChangeMax float64
	// Within: |Change| ≤ IsolationGoal.
	Within bool
}

// Isolation pairs every point of the main rate with its run without the
// isolated tenant (same variant otherwise, same seed) and compares each
// other tenant's TTFT p99, in variant order, then tenant order (the pooled
// row last). Without an isolated tenant it returns nil.
func Isolation(s Spec, pts []Point) []IsolationRow {
	if s.Isolate == "" || len(pts) == 0 {
		return nil
	}
	main := s.rates()[0]
	type key struct {
		label string
		seed  uint64
	}
	byKey := map[key]*Point{}
	for i := range pts {
		p := &pts[i]
		if p.Rate == main {
			byKey[key{p.name(), p.Seed}] = p
		}
	}
	var out []IsolationRow
	for _, v := range s.Variants() {
		if v.Without != "" {
			continue
		}
		twin := v.Label + "+without-" + s.Isolate
		type acc struct{ with, without, change []float64 }
		accs := map[string]*acc{}
		var order []string
		add := func(tenant string, w, wo float64) {
			if !(wo > 0) {
				return // no baseline: the tenant had no first token without the isolated one
			}
			a := accs[tenant]
			if a == nil {
				a = &acc{}
				accs[tenant] = a
				order = append(order, tenant)
			}
			a.with = append(a.with, w)
			a.without = append(a.without, wo)
			a.change = append(a.change, w/wo-1)
		}
		for _, seed := range s.Seeds {
			p, q := byKey[key{v.Label, seed}], byKey[key{twin, seed}]
			if p == nil || q == nil {
				continue
			}
			for _, t := range p.Summary.PerTenant {
				if t.Tenant == s.Isolate {
					continue
				}
				for _, u := range q.Summary.PerTenant {
					if u.Tenant == t.Tenant {
						add(t.Tenant, t.TTFTP99Ms, u.TTFTP99Ms)
					}
				}
			}
			if p.Records != nil && q.Records != nil {
				add(OthersRow, othersP99(p.Records, s.Isolate, s.Base.Warmup), othersP99(q.Records, s.Isolate, s.Base.Warmup))
			}
		}
		// The tenants by name, the pooled row last.
		slices.SortStableFunc(order, func(a, b string) int {
			switch {
			case a == OthersRow:
				return 1
			case b == OthersRow:
				return -1
			}
			return strings.Compare(a, b)
		})
		for _, t := range order {
			a := accs[t]
			r := IsolationRow{Label: v.Label, Baseline: twin, Limits: v.Limits, Tenant: t, Seeds: len(a.with),
				With: medianOf(a.with), Without: medianOf(a.without), Change: medianOf(a.change)}
			r.ChangeMin, r.ChangeMax = slices.Min(a.change), slices.Max(a.change)
			r.Within = math.Abs(r.Change) <= IsolationGoal
			out = append(out, r)
		}
	}
	return out
}

// othersP99 is the TTFT p99 in ms of the measured requests of every tenant
// but one, counted as Summary.TTFT counts them (a first token, not
// rejected).
func othersP99(recs []results.Record, tenant string, warmup time.Duration) float64 {
	var v []float64
	for i := range recs {
		r := &recs[i]
		if r.Arrival < warmup || r.Tenant == tenant || r.Outcome == results.OutcomeRejected || !r.HasFirstToken {
			continue
		}
		v = append(v, float64(r.TTFT())/float64(time.Millisecond))
	}
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return results.Quantile(v, 0.99)
}

// medianOf is the interpolated median of v (0 when empty); v is unchanged.
func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return results.Quantile(s, 0.5)
}

// tenantsMarkdown is report.md's per-tenant section (and, with an isolated
// tenant, its isolation section); "" when no run has tenants.
func tenantsMarkdown(s Spec, pts []Point) string {
	main := s.rates()[0]
	type cell struct {
		requests, completed, limited, otherFailed []float64
		p50, p99, e2e                             []float64
	}
	var labels []string
	cells := map[string]map[string]*cell{}
	tenantOrder := map[string][]string{}
	for i := range pts {
		p := &pts[i]
		if p.Rate != main || len(p.Summary.PerTenant) == 0 {
			continue
		}
		l := p.name()
		if cells[l] == nil {
			labels = append(labels, l)
			cells[l] = map[string]*cell{}
		}
		for _, t := range p.Summary.PerTenant {
			c := cells[l][t.Tenant]
			if c == nil {
				c = &cell{}
				cells[l][t.Tenant] = c
				tenantOrder[l] = append(tenantOrder[l], t.Tenant)
			}
			lim := t.FailedBy[results.RejectRateLimited]
			c.requests = append(c.requests, float64(t.Requests))
			c.completed = append(c.completed, float64(t.Completed))
			c.limited = append(c.limited, float64(lim))
			c.otherFailed = append(c.otherFailed, float64(t.Failed-lim))
			c.p50 = append(c.p50, t.TTFTP50Ms)
			c.p99 = append(c.p99, t.TTFTP99Ms)
			c.e2e = append(c.e2e, t.E2EP99Ms)
		}
	}
	if len(labels) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("## Tenants\n\n")
	b.WriteString("Per tenant, medians over seeds: requests measured, completed, refused by the tenant's rate limit " +
		"(a 429 at once, never queued), other failures (rejections by the gateway, engine failures), and latencies in ms.\n")
	if lines := tenantLimitsLines(s); lines != "" {
		b.WriteString("\n" + lines)
	}
	b.WriteString("\n| variant | tenant | requests | completed | rate limited | other failures | TTFT p50 | TTFT p99 | E2E p99 |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, l := range labels {
		ts := slices.Clone(tenantOrder[l])
		slices.Sort(ts)
		for _, t := range ts {
			c := cells[l][t]
			name := "`" + t + "`"
			if t == "" {
				name = "(none)"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s | %s | %s | %s |\n", l, name,
				count(medianOf(c.requests)), count(medianOf(c.completed)), count(medianOf(c.limited)), count(medianOf(c.otherFailed)),
				msCell(medianOf(c.p50)), msCell(medianOf(c.p99)), msCell(medianOf(c.e2e)))
		}
	}
	if rows := Isolation(s, pts); len(rows) > 0 {
		b.WriteString("\n" + isolationMarkdown(s, rows))
	}
	return b.String()
}

// tenantLimitsLines lists the workload's tenant limits.
func tenantLimitsLines(s Spec) string {
	t := s.Base.Workload.Tenants
	if len(t) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("Tenant limits (0: unlimited): ")
	for i, name := range t.Names() {
		l := t[name]
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "`%s` rpm %d, tpm %d, max concurrency %d", name, l.RPM, l.TPM, l.MaxConcurrency)
	}
	b.WriteString(".\n")
	return b.String()
}

// isolationMarkdown is the isolation section.
func isolationMarkdown(s Spec, rows []IsolationRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### Isolation from `%s`\n\n", s.Isolate)
	fmt.Fprintf(&b, "Every other tenant's TTFT p99 with `%s` in the traffic against the same seed's run without it "+
		"(the other tenants' requests are the same in both), medians over seeds; change is with / without − 1, seed by seed, "+
		"median [min, max]. Goal: within %.0f%% with tenant limits on.\n\n", s.Isolate, 100*IsolationGoal)
	b.WriteString("| variant | tenant | TTFT p99 with | TTFT p99 without | change | within 10% |\n")
	b.WriteString("|---|---|---:|---:|---:|---|\n")
	worst := map[string]float64{}
	for _, r := range rows {
		name := "`" + r.Tenant + "`"
		switch r.Tenant {
		case OthersRow:
			name = OthersRow
		case "":
			name = "(none)"
		}
		yes := "no"
		if r.Within {
			yes = "yes"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s [%s, %s] | %s |\n", r.Label, name, msCell(r.With), msCell(r.Without),
			pct(r.Change), pct(r.ChangeMin), pct(r.ChangeMax), yes)
		if a, ok := worst[r.Limits]; !ok || math.Abs(r.Change) > a {
			worst[r.Limits] = math.Abs(r.Change)
		}
	}
	b.WriteString("\n")
	for _, lim := range []string{fleet.LimitsOn, fleet.LimitsOff} {
		w, ok := worst[lim]
		if !ok || !s.Base.Workload.Tenants.Limited() {
			continue
		}
		fmt.Fprintf(&b, "With tenant limits %s, the largest median change of another tenant's TTFT p99 is %s.\n", lim, pct(w))
	}
	return b.String()
}

func count(v float64) string {
	return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
}

func msCell(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func pct(f float64) string {
	return fmt.Sprintf("%+.1f%%", 100*f)
}

// addTenantSections puts the tenant sections into dir's report.md, before
// its charts (at its end when it has none).
func addTenantSections(dir string, s Spec, pts []Point) error {
	sec := tenantsMarkdown(s, pts)
	if sec == "" {
		return nil
	}
	path := filepath.Join(dir, report.ReportFile)
	md, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("add tenants to the report: %w", err)
	}
	var out []byte
	if i := bytes.Index(md, []byte("\n## Charts\n")); i >= 0 {
		out = slices.Concat(md[:i+1], []byte(sec+"\n"), md[i+1:])
	} else {
		out = slices.Concat(md, []byte("\n"+sec))
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return fmt.Errorf("add tenants to the report: %w", err)
	}
	return nil
}
