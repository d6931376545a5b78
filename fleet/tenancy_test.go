package fleet

import (
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/tenancy/limit"
	"github.com/inferrail/inferrail/workload"
)

// noisyConfig is examples/tenants-noisy.yaml (three quiet tenants, one at
// 10x its rpm) on the default fleet, cut to d of arrivals.
func noisyConfig(t *testing.T, d time.Duration) Config {
	t.Helper()
	w, err := workload.LoadConfig(filepath.Join("..", "examples", "tenants-noisy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w.Duration = d
	c := DefaultConfig()
	c.Workload = w
	c.Seed = 3
	return c
}

func simulate(t *testing.T, c Config) *Output {
	t.Helper()
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tenantRecords are one tenant's records, in arrival order.
func tenantRecords(recs []results.Record, tenant string) []results.Record {
	var out []results.Record
	for _, r := range recs {
		if r.Tenant == tenant {
			out = append(out, r)
		}
	}
	return out
}

func limited(r *results.Record) bool {
	return r.Outcome == results.OutcomeRejected && r.Reject == results.RejectRateLimited
}

// TestMaxTenantLimitIsTheLimiters: the workload's bound on limits is the
// limiter's.
func TestMaxTenantLimitIsTheLimiters(t *testing.T) {
	if workload.MaxTenantLimit != limit.MaxLimit {
		t.Fatalf("workload.MaxTenantLimit %d, limit.MaxLimit %d", workload.MaxTenantLimit, limit.MaxLimit)
	}
}

// TestTenantRPMBound: a tenant sending 10x its rpm is admitted within the
// limiter's documented bound (tenancy/limit doc, invariant 2): in any
// interval [a, b] of arrivals, admitted ≤ L + (b−a)·L/W; in a window
// (a, a+W] that begins at a refusal, at most L. The refused are answered at
// once, never dispatched; the quiet tenants are never refused.
func TestTenantRPMBound(t *testing.T) {
	c := noisyConfig(t, 5*time.Minute)
	out := simulate(t, c)
	const L, W = 54, time.Minute
	noisy := tenantRecords(out.Records, "noisy")
	var admitted, refused []time.Duration
	for i := range noisy {
		r := &noisy[i]
		if limited(r) {
			refused = append(refused, r.Arrival)
			if r.Replica != -1 || r.HasFirstToken || r.RateLimit != string(limit.ReasonRPM) || r.RetryAfter <= 0 || r.RetryAfter > W/L+time.Millisecond {
				t.Fatalf("refused request %+v", *r)
			}
			continue
		}
		if r.Outcome != results.OutcomeOK {
			t.Fatalf("admitted request %d of noisy: outcome %s", r.ID, r.Outcome)
		}
		admitted = append(admitted, r.Arrival)
	}
	// 5 minutes at 9 req/s: about 2,700 sent, L + 5·L admitted from a cold start.
	if len(noisy) < 2000 || len(admitted) > L+5*L || len(admitted) < 5*L {
		t.Fatalf("noisy: %d sent, %d admitted, want about 2,700 and at most %d", len(noisy), len(admitted), 6*L)
	}
	// Invariant 2: j−i+1 ≤ L + (t_j − t_i)·L/W for every i ≤ j, i.e.
	// max_i (i − t_i·L/W) ≥ j + 1 − L − t_j·L/W.
	rate := float64(L) / W.Seconds()
	best := 0.0
	for j, tj := range admitted {
		best = max(best, -float64(j)+tj.Seconds()*rate)
		if n := float64(j+1) - L - tj.Seconds()*rate + best; n > 1e-6 {
			t.Fatalf("admitted %d up to %v: %.3f above L + (b−a)·L/W", j+1, tj, n)
		}
	}
	// A window that begins at a refusal (the bucket is full) admits at most L.
	for _, a := range refused {
		n := 0
		for _, b := range admitted {
			if b > a && b <= a+W {
				n++
			}
		}
		if n > L {
			t.Fatalf("%d admitted in the minute after the refusal at %v, limit %d", n, a, L)
		}
	}
	for _, q := range []string{"alpha", "bravo", "charlie"} {
		for _, r := range tenantRecords(out.Records, q) {
			if r.Outcome != results.OutcomeOK {
				t.Fatalf("quiet tenant %s: request %d %s (%s)", q, r.ID, r.Outcome, r.Reject)
			}
		}
	}
	if out.Summary.TenantLimits != LimitsOn || out.Summary.Rejected[results.RejectRateLimited] != out.Summary.RejectedTotal {
		t.Fatalf("summary: tenant_limits %q, rejected %v", out.Summary.TenantLimits, out.Summary.Rejected)
	}
}

// replayLimiter runs a run's records back through a fresh limiter on their
// own times, reserving at each arrival and finishing at each end as the
// fleet does, and returns which requests it admits. Finishes at an instant
// come before arrivals at it (no test relies on a tie).
func replayLimiter(t *testing.T, c Config, recs []results.Record) map[uint64]bool {
	t.Helper()
	type ev struct {
		at     time.Duration
		finish bool
		i      int
	}
	var evs []ev
	for i, r := range recs {
		evs = append(evs, ev{at: r.Arrival, i: i})
	}
	var now time.Duration
	lim, err := limit.NewLocal(limit.Config{LeaseTTL: 24 * time.Hour, Now: func() time.Time { return limitEpoch.Add(now) }})
	if err != nil {
		t.Fatal(err)
	}
	res := map[int]*limit.Reservation{}
	admitted := map[uint64]bool{}
	for len(evs) > 0 {
		slices.SortStableFunc(evs, func(a, b ev) int {
			if a.at != b.at {
				return int(a.at - b.at)
			}
			if a.finish != b.finish {
				if a.finish {
					return -1
				}
				return 1
			}
			return a.i - b.i
		})
		e := evs[0]
		evs = evs[1:]
		now = e.at
		r := &recs[e.i]
		if e.finish {
			used := limit.UsageUnknown
			if r.Outcome == results.OutcomeOK {
				used = r.PromptTokens + r.OutputTokens
			}
			if err := lim.Finish(context.Background(), res[e.i], used); err != nil {
				t.Fatal(err)
			}
			continue
		}
		l, ok := c.Workload.Tenants[r.Tenant]
		if !ok || l.Zero() {
			admitted[r.ID] = true
			continue
		}
		d, err := lim.Reserve(context.Background(), limit.Request{
			Buckets: []limit.Bucket{{ID: "tenant:" + r.Tenant, Limits: limit.Limits{RPM: l.RPM, TPM: l.TPM, MaxConcurrency: l.MaxConcurrency}}},
			Tokens:  r.PromptTokens + c.Workload.Output.MaxTokens,
		})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted[r.ID] = true
			res[e.i] = d.Reservation
			if r.Outcome != results.OutcomeOK {
				t.Fatalf("request %d admitted by the replay did not complete in the run: %s", r.ID, r.Outcome)
			}
			evs = append(evs, ev{at: r.End, finish: true, i: e.i})
		}
	}
	return admitted
}

// TestTenantLimitsExact: every decision of the run is the limiter's on the
// run's own arrivals and ends (TPM on the estimate, reconciled with the
// usage at the end; concurrency leases released at the end), under RPM,
// TPM and concurrency limits at once, with one gateway and with three
// sharing one limiter.
func TestTenantLimitsExact(t *testing.T) {
	for _, gws := range []int{1, 3} {
		c := noisyConfig(t, 4*time.Minute)
		c.Gateways = gws
		c.Workload.Tenants = workload.Tenants{
			"alpha": {RPM: 60},                      // half its 120 a minute
			"bravo": {TPM: 100_000},                 // about 250,000 estimated a minute
			"noisy": {RPM: 200, MaxConcurrency: 12}, // the fleet's answers bound it, not the rpm
		}
		out := simulate(t, c)
		want := replayLimiter(t, c, out.Records)
		reasons := map[string]int{}
		for _, r := range out.Records {
			if got := !limited(&r); got != want[r.ID] {
				t.Fatalf("%d gateways: request %d of %q admitted %v by the run, %v by the limiter", gws, r.ID, r.Tenant, got, want[r.ID])
			}
			if limited(&r) {
				reasons[r.Tenant+"/"+r.RateLimit]++
			}
		}
		for _, k := range []string{"alpha/rpm", "bravo/tpm", "noisy/concurrency"} {
			if reasons[k] == 0 {
				t.Fatalf("%d gateways: no refusal %s: %v", gws, k, reasons)
			}
		}
		if reasons["charlie/rpm"]+reasons["charlie/tpm"] != 0 {
			t.Fatalf("charlie has no limits and was refused: %v", reasons)
		}
	}
}

// TestTenantTPMReconciled: TPM is charged on the estimate and reconciled
// with the tokens used. The documented bound holds on net charges (in a
// window (a, a+W] that begins at a TPM refusal of estimate e, the net
// charges up to any admission are below L + e), and the refunds let the
// tenant be admitted more estimate than TPM alone would (more than
// L·(1 + T/W) over T): without reconciliation that is impossible.
func TestTenantTPMReconciled(t *testing.T) {
	c := noisyConfig(t, 4*time.Minute)
	const L = 100_000
	c.Workload.Tenants = workload.Tenants{"bravo": {TPM: L}}
	out := simulate(t, c)
	mt := c.Workload.Output.MaxTokens
	type charge struct {
		at time.Duration
		n  int
	}
	var charges []charge // at admission: +estimate; at the end: used − estimate
	var refusals []charge
	estimates := 0
	var last time.Duration
	for _, r := range tenantRecords(out.Records, "bravo") {
		est := r.PromptTokens + mt
		if limited(&r) {
			if r.RateLimit != string(limit.ReasonTPM) {
				t.Fatalf("request %d refused on %s", r.ID, r.RateLimit)
			}
			refusals = append(refusals, charge{r.Arrival, est})
			continue
		}
		estimates += est
		last = r.Arrival
		charges = append(charges, charge{r.Arrival, est}, charge{r.End, r.PromptTokens + r.OutputTokens - est})
	}
	slices.SortStableFunc(charges, func(a, b charge) int { return int(a.at - b.at) })
	if len(refusals) < 10 {
		t.Fatalf("%d TPM refusals, want the tenant over its TPM", len(refusals))
	}
	for _, a := range refusals {
		net := 0
		for _, ch := range charges {
			if ch.at <= a.at {
				continue
			}
			if ch.at > a.at+time.Minute {
				break
			}
			net += ch.n
			if ch.n > 0 && net >= L+a.n { // an admission with the net charges at L + e
				t.Fatalf("net charges %d after the refusal at %v (estimate %d), want below %d", net, a.at, a.n, L+a.n)
			}
		}
	}
	if bound := float64(L) * (1 + last.Minutes()); float64(estimates) <= bound {
		t.Fatalf("admitted %d tokens of estimates, no more than TPM alone allows (%.0f): no refunds?", estimates, bound)
	}
}

// TestTenantConcurrencyBound: at every admission a tenant has at most
// max_concurrency requests in flight, and the leases come back at the
// requests' ends (it is admitted again afterwards).
func TestTenantConcurrencyBound(t *testing.T) {
	c := noisyConfig(t, 3*time.Minute)
	const C = 5
	c.Workload.Tenants = workload.Tenants{"noisy": {MaxConcurrency: C}}
	out := simulate(t, c)
	var in []results.Record
	refused := 0
	for _, r := range tenantRecords(out.Records, "noisy") {
		if limited(&r) {
			refused++
			if r.RateLimit != string(limit.ReasonConcurrency) || r.RetryAfter != time.Second {
				t.Fatalf("refusal %+v", r)
			}
			continue
		}
		in = append(in, r)
	}
	for i, r := range in {
		n := 0
		for _, o := range in[:i] {
			if o.End > r.Arrival {
				n++
			}
		}
		if n >= C {
			t.Fatalf("request %d admitted at %v with %d in flight, max_concurrency %d", r.ID, r.Arrival, n, C)
		}
	}
	if refused == 0 || len(in) < 10*C {
		t.Fatalf("%d admitted, %d refused", len(in), refused)
	}
}

// TestTenantLimitsDeterministic: the same seed gives the same run bit for
// bit with limits, shared and independent; limits off and a left-out
// tenant show in the summary.
func TestTenantLimitsDeterministic(t *testing.T) {
	for _, ledger := range []string{LedgerShared, LedgerIndependent} {
		c := noisyConfig(t, 2*time.Minute)
		c.Gateways, c.Ledger = 3, ledger
		c.Policy = "cost_model"
		a, b := simulate(t, c), simulate(t, c)
		if ja, jb := summaryJSON(t, a.Summary), summaryJSON(t, b.Summary); string(ja) != string(jb) {
			t.Fatalf("%s: same seed, different summaries:\n%s\n%s", ledger, ja, jb)
		}
		if !reflect.DeepEqual(a.Records, b.Records) {
			t.Fatalf("%s: same seed, different records", ledger)
		}
	}
	c := noisyConfig(t, 2*time.Minute)
	c.NoLimits = true
	off := simulate(t, c)
	if off.Summary.TenantLimits != LimitsOff || off.Summary.RejectedTotal != 0 {
		t.Fatalf("limits off: tenant_limits %q, rejected %d", off.Summary.TenantLimits, off.Summary.RejectedTotal)
	}
	c.Workload.WithoutTenants = []string{"noisy"}
	wo := simulate(t, c)
	if !reflect.DeepEqual(wo.Summary.WithoutTenants, []string{"noisy"}) || len(wo.Summary.PerTenant) != 3 {
		t.Fatalf("without noisy: without_tenants %v, per_tenant %+v", wo.Summary.WithoutTenants, wo.Summary.PerTenant)
	}
	plain := smallConfig(t, "w1", 50)
	if s := simulate(t, plain).Summary; s.TenantLimits != "" || s.PerTenant != nil {
		t.Fatalf("no tenants: tenant_limits %q per_tenant %v", s.TenantLimits, s.PerTenant)
	}
}

// TestTenantLimitsPerGateway: three gateways share the tenant's buckets
// with the shared ledger (as Redis gives every proxy) and keep one each
// with independent ledgers, where the tenant gets its limit at each.
func TestTenantLimitsPerGateway(t *testing.T) {
	admitted := map[string]int{}
	for _, ledger := range []string{LedgerShared, LedgerIndependent} {
		c := noisyConfig(t, 3*time.Minute)
		c.Gateways, c.Ledger = 3, ledger
		for _, r := range tenantRecords(simulate(t, c).Records, "noisy") {
			if !limited(&r) {
				admitted[ledger]++
			}
		}
	}
	const L = 54
	if s := admitted[LedgerShared]; s > L+3*L {
		t.Fatalf("shared: %d admitted in 3 minutes, at most %d", s, 4*L)
	}
	if s, i := admitted[LedgerShared], admitted[LedgerIndependent]; i < 2*s || i > 3*(L+3*L) {
		t.Fatalf("independent limiters admitted %d, shared %d: want about three times as many", i, s)
	}
}

// TestPerTenantSummary: the per-tenant fields of the summary, in JSON.
func TestPerTenantSummary(t *testing.T) {
	c := noisyConfig(t, 2*time.Minute)
	c.Warmup = 20 * time.Second
	out := simulate(t, c)
	var got struct {
		TenantLimits string `json:"tenant_limits"`
		PerTenant    []struct {
			Tenant    string         `json:"tenant"`
			Requests  int            `json:"requests"`
			Completed int            `json:"completed"`
			Failed    int            `json:"failed"`
			FailedBy  map[string]int `json:"failed_by"`
			TTFTP50   float64        `json:"ttft_p50_ms"`
			TTFTP99   float64        `json:"ttft_p99_ms"`
			E2EP99    float64        `json:"e2e_p99_ms"`
		} `json:"per_tenant"`
	}
	b := summaryJSON(t, out.Summary)
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.TenantLimits != "on" || len(got.PerTenant) != 4 {
		t.Fatalf("tenant_limits %q, per_tenant %+v", got.TenantLimits, got.PerTenant)
	}
	sum := 0
	for i, p := range got.PerTenant {
		if want := []string{"alpha", "bravo", "charlie", "noisy"}[i]; p.Tenant != want {
			t.Fatalf("per_tenant[%d] is %q, want %q", i, p.Tenant, want)
		}
		n := 0
		for _, r := range tenantRecords(out.Records, p.Tenant) {
			if r.Arrival >= c.Warmup {
				n++
			}
		}
		if p.Requests != n || p.Completed+p.Failed != p.Requests || p.Failed != p.FailedBy[results.RejectRateLimited] {
			t.Fatalf("%s: %+v, %d measured requests", p.Tenant, p, n)
		}
		if p.Completed > 0 && !(p.TTFTP50 > 0 && p.TTFTP99 >= p.TTFTP50 && p.E2EP99 >= p.TTFTP99) {
			t.Fatalf("%s: latencies %+v", p.Tenant, p)
		}
		sum += p.Requests
	}
	if sum != out.Summary.Requests || got.PerTenant[3].Failed == 0 || got.PerTenant[0].Failed != 0 {
		t.Fatalf("per_tenant %+v against %d requests", got.PerTenant, out.Summary.Requests)
	}
}
