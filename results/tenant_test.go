package results

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// tenantRecords are hand-made records of two tenants and one untenanted
// request; warmup 1s.
func tenantRecords() []Record {
	return []Record{
		// Warmup: excluded.
		{ID: 0, Tenant: "a", Replica: 0, Arrival: 500 * ms, FirstToken: 600 * ms, End: 2 * s, HasFirstToken: true, OutputTokens: 2, Outcome: OutcomeOK},
		// a: TTFT 100ms, 300ms, 500ms; E2E 1s, 2s; one engine failure with a first token, one rate limited.
		{ID: 1, Tenant: "a", Replica: 0, Arrival: 1 * s, FirstToken: 1100 * ms, End: 2 * s, HasFirstToken: true, OutputTokens: 5, Outcome: OutcomeOK},
		{ID: 2, Tenant: "a", Replica: 1, Arrival: 2 * s, FirstToken: 2300 * ms, End: 4 * s, HasFirstToken: true, OutputTokens: 5, Outcome: OutcomeOK},
		{ID: 3, Tenant: "a", Replica: 1, Arrival: 3 * s, FirstToken: 3500 * ms, HasFirstToken: true, Outcome: OutcomeFailed},
		{ID: 4, Tenant: "a", Replica: -1, Arrival: 4 * s, Outcome: OutcomeRejected, Reject: RejectRateLimited, RateLimit: "rpm", RetryAfter: 1100 * ms},
		// b: everything refused, on two reasons; a rejection's first token is ignored.
		{ID: 5, Tenant: "b", Replica: -1, Arrival: 5 * s, FirstToken: 5 * s, HasFirstToken: true, Outcome: OutcomeRejected, Reject: RejectRateLimited, RateLimit: "tpm"},
		{ID: 6, Tenant: "b", Replica: -1, Arrival: 6 * s, Outcome: OutcomeRejected, Reject: RejectQueueFull},
		// No tenant.
		{ID: 7, Replica: 0, Arrival: 7 * s, FirstToken: 7200 * ms, End: 8 * s, HasFirstToken: true, OutputTokens: 3, Outcome: OutcomeOK},
	}
}

func TestSummarizePerTenant(t *testing.T) {
	sum := Summarize(tenantRecords(), SummaryOptions{Warmup: s, Replicas: []ReplicaInfo{{Name: "r0"}, {Name: "r1"}}})
	want := []TenantSummary{
		{Tenant: "", Requests: 1, Completed: 1, FailedBy: map[string]int{}, TTFTP50Ms: 200, TTFTP99Ms: 200, E2EP99Ms: 1000},
		{Tenant: "a", Requests: 4, Completed: 2, Failed: 2, FailedBy: map[string]int{RejectRateLimited: 1, string(OutcomeFailed): 1},
			// TTFTs 100, 300, 500 ms: p50 300, p99 at index 1.98 = 496; E2E 1s, 2s: p99 1990.
			TTFTP50Ms: 300, TTFTP99Ms: 496, E2EP99Ms: 1990},
		{Tenant: "b", Requests: 2, Failed: 2, FailedBy: map[string]int{RejectRateLimited: 1, RejectQueueFull: 1}},
	}
	if !reflect.DeepEqual(sum.PerTenant, want) {
		t.Fatalf("per_tenant:\n got %+v\nwant %+v", sum.PerTenant, want)
	}
	if sum.Rejected[RejectRateLimited] != 2 || sum.RejectedTotal != 3 || sum.Failed != 4 {
		t.Fatalf("rejected %v total %d failed %d", sum.Rejected, sum.RejectedTotal, sum.Failed)
	}
	// No tenant on any measured request: no per_tenant (omitted from JSON).
	plain := Summarize(handRecords(), handOptions())
	if plain.PerTenant != nil {
		t.Fatalf("per_tenant without tenants: %+v", plain.PerTenant)
	}
	var b bytes.Buffer
	if err := WriteJSON(&b, plain); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"per_tenant", "tenant_limits", "without_tenants"} {
		if strings.Contains(b.String(), `"`+k+`"`) {
			t.Fatalf("%s in a summary without tenants:\n%s", k, b.String())
		}
	}
	// The JSON keys of an entry.
	sum.TenantLimits, sum.WithoutTenants = "on", []string{"noisy"}
	b.Reset()
	if err := WriteJSON(&b, sum); err != nil {
		t.Fatal(err)
	}
	var m struct {
		TenantLimits   string           `json:"tenant_limits"`
		WithoutTenants []string         `json:"without_tenants"`
		PerTenant      []map[string]any `json:"per_tenant"`
	}
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m.TenantLimits != "on" || len(m.WithoutTenants) != 1 || len(m.PerTenant) != 3 {
		t.Fatalf("decoded %+v", m)
	}
	for _, e := range m.PerTenant {
		for _, k := range []string{"tenant", "requests", "completed", "failed", "failed_by", "ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms"} {
			if _, ok := e[k]; !ok {
				t.Fatalf("per_tenant entry lacks %q: %v", k, e)
			}
		}
		if fb, ok := e["failed_by"].(map[string]any); !ok || fb == nil {
			t.Fatalf("failed_by is %v, want an object", e["failed_by"])
		}
	}
}

func TestFormatTableTenants(t *testing.T) {
	sum := Summarize(tenantRecords(), SummaryOptions{Warmup: s, Replicas: []ReplicaInfo{{Name: "r0"}, {Name: "r1"}}})
	sum.Policy, sum.Workload, sum.TenantLimits = "cost_model", "w6", "on"
	var buf bytes.Buffer
	if err := FormatTable(&buf, []Summary{sum}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"cost_model per tenant (tenant limits on):",
		"(none)",
		"2/4",
		"300/496",
		"2 (failed 1, rate_limited 1)",
		"2 (queue_full 1, rate_limited 1)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if strings.HasSuffix(line, " ") {
			t.Errorf("line %d has trailing spaces: %q", i+1, line)
		}
	}
	plain := Summarize(handRecords(), handOptions())
	buf.Reset()
	if err := FormatTable(&buf, []Summary{plain}); err != nil || strings.Contains(buf.String(), "per tenant") {
		t.Fatalf("tenant lines without tenants (err %v):\n%s", err, buf.String())
	}
}

func TestRowsRateLimit(t *testing.T) {
	rows := RowsFromRecords(tenantRecords(), "w6", "cost_model", 1)
	if r := rows[4]; r.Reject != RejectRateLimited || r.RateLimit != "rpm" || r.RetryAfterMs != 1100 || r.Tenant != "a" {
		t.Fatalf("rate-limited row %+v", r)
	}
	if r := rows[1]; r.RateLimit != "" || r.RetryAfterMs != 0 {
		t.Fatalf("completed row %+v", r)
	}
	var b bytes.Buffer
	if err := WriteParquet(&b, rows); err != nil {
		t.Fatal(err)
	}
	back, err := ReadParquet(bytes.NewReader(b.Bytes()), int64(b.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, rows) {
		t.Fatal("rate_limit and retry_after_ms do not round-trip")
	}
}
