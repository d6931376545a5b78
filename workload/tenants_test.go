package workload

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// noisyMix is three quiet tenants and a noisy one.
var noisyMix = []MixClass{
	{Tenant: "a", Share: 2}, {Tenant: "b", Share: 2}, {Tenant: "c", Priority: 1, Share: 2}, {Tenant: "noisy", Share: 9},
}

// TestValidateTenants: every bad value of tenants and without_tenants is an
// error naming its field.
func TestValidateTenants(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tenants Tenants
		without []string
		want    string
	}{
		{"negative rpm", Tenants{"a": {RPM: -1}}, nil, "tenants.a.rpm: must be in [0, 2^40] (0 = unlimited), got -1"},
		{"negative tpm", Tenants{"a": {TPM: -5}}, nil, "tenants.a.tpm: must be in [0, 2^40]"},
		{"negative concurrency", Tenants{"noisy": {MaxConcurrency: -2}}, nil, "tenants.noisy.max_concurrency: must be in [0, 2^40]"},
		{"huge rpm", Tenants{"a": {RPM: MaxTenantLimit + 1}}, nil, "tenants.a.rpm: must be in [0, 2^40]"},
		{"tpm below one request", Tenants{"a": {TPM: 1000}}, nil, "tenants.a.tpm: must be 0 (unlimited) or at least one request's smallest estimate, 1 prompt token + output.max_tokens = 1025, got 1000"},
		{"unknown tenant", Tenants{"z": {RPM: 1}}, nil, `tenants.z: no mix class has tenant "z"`},
		{"empty tenant", Tenants{"": {RPM: 1}}, nil, `tenants[""]: must name a tenant`},
		{"without unknown", nil, []string{"z"}, `without_tenants[0]: no mix class has tenant "z"`},
		{"without empty", nil, []string{"a", ""}, "without_tenants[1]: must name a tenant of the mix"},
		{"without twice", nil, []string{"a", "a"}, `without_tenants[1]: "a" is listed twice`},
		{"without all", nil, []string{"a", "b", "c", "noisy"}, "without_tenants: leaves out every class of the mix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustConfig(t, "w6")
			c.Mix = noisyMix
			c.Tenants, c.WithoutTenants = tc.tenants, tc.without
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v has no *FieldError", err)
			}
		})
	}
	// Without a mix, a tenant with limits names no class.
	c := mustConfig(t, "w1")
	c.Tenants = Tenants{"a": {RPM: 10}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `tenants.a: no mix class has tenant "a"`) {
		t.Fatalf("error %v", err)
	}
	// Good ones: zero limits (unlimited), the largest, a partial list.
	c = mustConfig(t, "w6")
	c.Mix = noisyMix
	c.Tenants = Tenants{"a": {}, "b": {RPM: MaxTenantLimit, TPM: MaxTenantLimit, MaxConcurrency: MaxTenantLimit}, "noisy": {RPM: 54, TPM: 1025}}
	c.WithoutTenants = []string{"noisy", "c"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestTenantsYAML: the YAML form, strict decoding, and --set's merge into
// one tenant's limits.
func TestTenantsYAML(t *testing.T) {
	c, err := ParseConfig([]byte(`workload: w6
mix:
  - {tenant: a, share: 2}
  - {tenant: noisy, share: 9}
tenants:
  a: {rpm: 300, tpm: 1000000}
  noisy: {rpm: 54, max_concurrency: 4}
without_tenants: [noisy]
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Tenants{"a": {RPM: 300, TPM: 1_000_000}, "noisy": {RPM: 54, MaxConcurrency: 4}}
	if !reflect.DeepEqual(c.Tenants, want) || !reflect.DeepEqual(c.WithoutTenants, []string{"noisy"}) {
		t.Fatalf("tenants %+v without %v", c.Tenants, c.WithoutTenants)
	}
	before := c.Tenants
	// One field of one tenant: the others stay.
	if err := Overlay(&c, []byte("tenants:\n  noisy:\n    rpm: 60\n")); err != nil {
		t.Fatal(err)
	}
	if got := c.Tenants["noisy"]; got != (TenantLimits{RPM: 60, MaxConcurrency: 4}) {
		t.Fatalf("noisy after the overlay: %+v", got)
	}
	if before["noisy"].RPM != 54 {
		t.Fatal("Overlay changed the map it decoded onto")
	}
	// A failed overlay leaves the limits alone.
	prev := c.Tenants
	for _, doc := range []string{
		"tenants:\n  a:\n    rpn: 1\n",
		"tenants:\n  a: 5\n",
		"tenants: [a]\n",
		"tenants:\n  a:\n    rpm: lots\n",
		"tenants:\n  a: {rpm: 1}\n  a: {rpm: 2}\n",
	} {
		err := Overlay(&c, []byte(doc))
		if err == nil {
			t.Fatalf("%q accepted", doc)
		}
		if !reflect.DeepEqual(c.Tenants, prev) {
			t.Fatalf("%q: a failed Overlay changed the tenants to %+v", doc, c.Tenants)
		}
	}
	if err := Overlay(&c, []byte("tenants:\n  a:\n    rpn: 1\n")); err == nil || !strings.Contains(err.Error(), "rpn") || !strings.Contains(err.Error(), "tenants.a") {
		t.Fatalf("unknown field: %v", err)
	}
	// null removes one tenant's limits, or all of them.
	if err := Overlay(&c, []byte("tenants:\n  a: null\n")); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Tenants["a"]; ok || len(c.Tenants) != 1 {
		t.Fatalf("tenants after a: null: %+v", c.Tenants)
	}
	if err := Overlay(&c, []byte("tenants: null\n")); err != nil {
		t.Fatal(err)
	}
	if len(c.Tenants) != 0 {
		t.Fatalf("tenants after tenants: null: %+v", c.Tenants)
	}
	// An empty map is no limits, and is omitted when the config is written.
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestWithoutTenantsSameOthers: leaving a tenant out of an open-loop
// workload sends exactly the other requests of the whole workload, draw for
// draw.
func TestWithoutTenantsSameOthers(t *testing.T) {
	for _, name := range []string{"w1", "w4", "w5", "w6", "w7"} {
		t.Run(name, func(t *testing.T) {
			c := mustConfig(t, name)
			c.Requests = 3000
			c.Mix = noisyMix
			all := simulate(t, mustNew(t, c), serviceTime, nil).reqs
			c.WithoutTenants = []string{"noisy", "b"}
			some := simulate(t, mustNew(t, c), serviceTime, nil).reqs
			var want []*Request
			for _, r := range all {
				if r.Tenant != "noisy" && r.Tenant != "b" {
					want = append(want, r)
				}
			}
			if len(want) == 0 || len(want) == len(all) {
				t.Fatalf("%d of %d requests kept", len(want), len(all))
			}
			if !reflect.DeepEqual(some, want) {
				t.Fatalf("without noisy and b: %d requests, want the %d others of the whole workload", len(some), len(want))
			}
		})
	}
}

// TestWithoutTenantsSessions: in the closed-loop workloads a left-out
// tenant's sessions never start, and the others start when they would have
// (with a duration bound, the session starts are the same stream).
func TestWithoutTenantsSessions(t *testing.T) {
	for _, name := range []string{"w2", "w3"} {
		t.Run(name, func(t *testing.T) {
			c := mustConfig(t, name)
			c.Requests, c.Duration = 0, 10*time.Minute
			c.Mix = noisyMix
			starts := func(reqs []*Request) []time.Duration {
				var out []time.Duration
				for _, r := range reqs {
					if r.Turn == 0 && r.Tenant != "noisy" {
						out = append(out, r.Arrival)
					}
				}
				return out
			}
			all := simulate(t, mustNew(t, c), serviceTime, nil).reqs
			c.WithoutTenants = []string{"noisy"}
			some := simulate(t, mustNew(t, c), serviceTime, nil).reqs
			for _, r := range some {
				if r.Tenant == "noisy" {
					t.Fatalf("request %d of the left-out tenant was sent", r.ID)
				}
			}
			if a, b := starts(all), starts(some); len(a) == 0 || !reflect.DeepEqual(a, b) {
				t.Fatalf("%d sessions of the kept tenants start, want the %d of the whole workload at the same times", len(b), len(a))
			}
			if len(some) >= len(all) {
				t.Fatalf("%d requests without noisy, %d with", len(some), len(all))
			}
		})
	}
}
