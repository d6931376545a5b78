package workload

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"
)

// MaxTenantLimit bounds each of a tenant's limits: the rate limiter's own
// bound (tenancy/limit.MaxLimit, 2^40), beyond which a double's rounding
// would matter.
const MaxTenantLimit = 1 << 40

// TenantLimits are one tenant's rate limits (Config.Tenants), the limits an
// API key carries in live: requests and tokens per minute and requests in
// flight at once, 0 meaning unlimited for that dimension. The simulator
// charges them as the proxy does (package tenancy/limit): RPM and TPM are
// token buckets whose burst is the whole per-minute allowance, TPM is
// charged on the estimate (prompt + max_tokens) and reconciled with the
// tokens really used (prompt + completion) when the request ends, and a
// request refused by any of them is answered at once with a 429 (outcome
// rejected, reason rate_limited), never queued.
type TenantLimits struct {
	// RPM is the most requests per minute, in [0, 2^40]; 0: unlimited.
	RPM int `yaml:"rpm" json:"rpm"`
	// TPM is the most tokens per minute (prompt + completion), in
	// [0, 2^40]; 0: unlimited. A request whose prompt + max_tokens alone
	// exceed it is always refused.
	TPM int `yaml:"tpm" json:"tpm"`
	// MaxConcurrency is the most requests in flight at once (from
	// admission to their end), in [0, 2^40]; 0: unlimited.
	MaxConcurrency int `yaml:"max_concurrency" json:"max_concurrency"`
}

// Zero reports whether every dimension is unlimited.
func (l TenantLimits) Zero() bool { return l.RPM == 0 && l.TPM == 0 && l.MaxConcurrency == 0 }

// Tenants maps a tenant of Config.Mix to its limits. Decoding YAML onto a
// map that already holds a tenant merges the fields the document sets into
// that tenant's limits, so `--set tenants.noisy.rpm=60` keeps noisy's tpm;
// a null value (`tenants: {noisy: null}`) removes the tenant's limits.
// Decoding never modifies the map it decodes onto: it builds a new one.
type Tenants map[string]TenantLimits

// UnmarshalYAML implements yaml.Unmarshaler: strict (an unknown field is an
// error naming it), merging into existing entries.
func (t *Tenants) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: tenants: want a mapping of tenant to {rpm, tpm, max_concurrency}", n.Line)
	}
	out := maps.Clone(*t)
	if out == nil {
		out = Tenants{}
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		if kn.Kind != yaml.ScalarNode {
			return fmt.Errorf("line %d: tenants: a tenant must be a string", kn.Line)
		}
		name := kn.Value
		if seen[name] {
			return fmt.Errorf("line %d: tenants: tenant %q given twice", kn.Line, name)
		}
		seen[name] = true
		if vn.ShortTag() == "!!null" {
			delete(out, name)
			continue
		}
		if vn.Kind != yaml.MappingNode {
			return fmt.Errorf("line %d: tenants.%s: want a mapping with rpm, tpm, max_concurrency", vn.Line, name)
		}
		lim := out[name]
		for j := 0; j+1 < len(vn.Content); j += 2 {
			fk, fv := vn.Content[j], vn.Content[j+1]
			var dst *int
			switch fk.Value {
			case "rpm":
				dst = &lim.RPM
			case "tpm":
				dst = &lim.TPM
			case "max_concurrency":
				dst = &lim.MaxConcurrency
			default:
				return fmt.Errorf("line %d: tenants.%s: field %s not found (known: rpm, tpm, max_concurrency)", fk.Line, name, fk.Value)
			}
			if err := fv.Decode(dst); err != nil {
				return fmt.Errorf("tenants.%s.%s: %w", name, fk.Value, err)
			}
		}
		out[name] = lim
	}
	*t = out
	return nil
}

// Limited reports whether any tenant has a limit (a non-zero one).
func (t Tenants) Limited() bool {
	for _, l := range t {
		if !l.Zero() {
			return true
		}
	}
	return false
}

// Names returns the tenants with limits, sorted.
func (t Tenants) Names() []string { return slices.Sorted(maps.Keys(t)) }

// tenants checks Config.Tenants and Config.WithoutTenants against the mix.
func (k *checker) tenants(c *Config) {
	if len(c.Tenants) > MaxMixClasses {
		k.fail("tenants", "must have at most %d tenants (one per class of the mix at most), got %d", MaxMixClasses, len(c.Tenants))
		return
	}
	if len(c.WithoutTenants) > MaxMixClasses {
		k.fail("without_tenants", "must have at most %d tenants (one per class of the mix at most), got %d", MaxMixClasses, len(c.WithoutTenants))
		return
	}
	inMix := map[string]bool{}
	for _, m := range c.Mix {
		inMix[m.Tenant] = true
	}
	for _, name := range c.Tenants.Names() {
		lim := c.Tenants[name]
		field := "tenants." + name
		if name == "" {
			field = `tenants[""]`
		}
		switch {
		case name == "":
			k.fail(field, "must name a tenant (requests without a tenant have no limits)")
		case !inMix[name]:
			k.fail(field, "no mix class has tenant %q (the tenants of the mix: %v)", name, mixTenants(c.Mix))
		}
		for _, f := range [...]struct {
			name string
			v    int
		}{{"rpm", lim.RPM}, {"tpm", lim.TPM}, {"max_concurrency", lim.MaxConcurrency}} {
			if f.v < 0 || f.v > MaxTenantLimit {
				k.fail(field+"."+f.name, "must be in [0, 2^40] (0 = unlimited), got %d", f.v)
			}
		}
		if lim.TPM > 0 && lim.TPM < c.Output.MaxTokens+1 {
			k.fail(field+".tpm", "must be 0 (unlimited) or at least one request's smallest estimate, 1 prompt token + output.max_tokens = %d, got %d (every request would be refused)", c.Output.MaxTokens+1, lim.TPM)
		}
	}
	kept := len(c.Mix)
	for i, name := range c.WithoutTenants {
		field := fmt.Sprintf("without_tenants[%d]", i)
		switch {
		case name == "":
			k.fail(field, "must name a tenant of the mix")
			continue
		case !inMix[name]:
			k.fail(field, "no mix class has tenant %q (the tenants of the mix: %v)", name, mixTenants(c.Mix))
			continue
		case slices.Index(c.WithoutTenants, name) < i:
			k.fail(field, "%q is listed twice", name)
			continue
		}
		for _, m := range c.Mix {
			if m.Tenant == name {
				kept--
			}
		}
	}
	if len(c.WithoutTenants) > 0 && len(c.Mix) > 0 && kept == 0 {
		k.fail("without_tenants", "leaves out every class of the mix: keep at least one tenant")
	}
}

// mixTenants lists the distinct non-empty tenants of a mix, in order.
func mixTenants(mix []MixClass) []string {
	var out []string
	for _, m := range mix {
		if m.Tenant != "" && !slices.Contains(out, m.Tenant) {
			out = append(out, m.Tenant)
		}
	}
	return out
}

// withoutTenants is a Source that leaves out the requests of some tenants:
// they are drawn as usual, so every other request is the one the whole
// workload would have sent, and never handed out. A left-out session's turn
// is reported failed to the source, which ends the session.
type withoutTenants struct {
	src  Source
	drop map[string]bool
}

func newWithoutTenants(src Source, tenants []string) Source {
	drop := make(map[string]bool, len(tenants))
	for _, t := range tenants {
		drop[t] = true
	}
	return &withoutTenants{src: src, drop: drop}
}

// Next returns the next arrival of a tenant that is kept.
func (w *withoutTenants) Next() (*Request, bool) {
	for {
		r, ok := w.src.Next()
		if !ok {
			return nil, false
		}
		if !w.drop[r.Tenant] {
			return r, true
		}
		w.discard(r)
	}
}

// Done passes a kept request's end to the source; a follow-up of a left-out
// tenant (which no source gives, sessions keep their tenant) is discarded.
func (w *withoutTenants) Done(req *Request, at time.Duration, ok bool) (*Request, bool) {
	next, more := w.src.Done(req, at, ok)
	if more && w.drop[next.Tenant] {
		w.discard(next)
		return nil, false
	}
	return next, more
}

// TakesAhead is the source's: leaving tenants out tells the source of
// their requests' ends at once (discard), which an open-loop source ignores.
func (w *withoutTenants) TakesAhead() bool { return TakesAhead(w.src) }

// discard ends a left-out request's session, and any follow-up it causes.
func (w *withoutTenants) discard(r *Request) {
	for r != nil {
		next, more := w.src.Done(r, r.Arrival, false)
		if !more {
			return
		}
		r = next
	}
}
