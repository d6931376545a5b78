package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/tenancy/limit"
)

// The tenants' rate limits (workload.Config.Tenants) in the lab, applied as
// the proxy applies an API key's: at a request's arrival, before its
// gateway's core sees it, the request is charged against its tenant's
// bucket by the proxy's own limiter (tenancy/limit.Local) on the run's
// virtual clock: one request on RPM, its estimate (prompt tokens +
// max_tokens) on TPM, a concurrency lease. A refused request is answered
// at once, a 429 never queued: its record is rejected with reason
// rate_limited, the refusing limit (rpm, tpm, concurrency, too_large) and
// the limiter's retry-after. An admitted request is finished on the
// limiter when it ends, as the proxy's release does: with the tokens it
// really used (prompt + completion) when it completes, so TPM is reconciled
// (refunded: the simulated engine never produces more than max_tokens);
// with 0 when the gateway rejected it (no engine answered, nothing was
// computed); with the estimate kept (UsageUnknown) when an engine took it
// and it failed without usage.
//
// Several gateways share one limiter when they share the reservation
// ledger (LedgerShared: one set of buckets, as Redis gives every proxy)
// and have one each, with every tenant's whole limits, when they do not
// (LedgerIndependent: in-process limiters, so a tenant gets up to its limit
// at every gateway, the over-admission of uncoordinated proxies).
//
// The lab's gateways never crash, so a concurrency lease lives until its
// request ends: leases get the limiter's longest lifetime (24h of virtual
// time) and are not renewed.

// Tenant limits switches (Config.NoLimits is the Go form).
const (
	LimitsOn  = "on"
	LimitsOff = "off"
)

// limitEpoch is the wall-clock instant the limiters' virtual clocks start at;
// only differences matter.
var limitEpoch = time.Unix(0, 0).UTC()

// leaseTTL outlives any simulated request (one in flight for longer would
// lose its slot).
const leaseTTL = 24 * time.Hour

// newLimiters builds the run's limiters (nil when no tenant has limits or
// limits are off): one shared, or one per gateway.
func (s *sim) newLimiters() error {
	cfg := &s.cfg
	if cfg.NoLimits || cfg.Source != nil || len(cfg.Workload.Tenants) == 0 {
		return nil
	}
	s.buckets = make(map[string][]limit.Bucket, len(cfg.Workload.Tenants))
	for name, l := range cfg.Workload.Tenants {
		if l.Zero() {
			continue
		}
		s.buckets[name] = []limit.Bucket{{
			ID:     "tenant:" + name,
			Limits: limit.Limits{RPM: l.RPM, TPM: l.TPM, MaxConcurrency: l.MaxConcurrency},
		}}
	}
	if len(s.buckets) == 0 {
		return nil
	}
	clock := func() time.Time { return limitEpoch.Add(s.now) }
	n := 1
	if cfg.Ledger == LedgerIndependent {
		n = len(s.gws)
	}
	s.limiters = make([]*limit.Local, n)
	for i := range s.limiters {
		l, err := limit.NewLocal(limit.Config{Window: limit.DefaultWindow, LeaseTTL: leaseTTL, Now: clock})
		if err != nil {
			return fmt.Errorf("tenant limits: %w", err)
		}
		s.limiters[i] = l
	}
	return nil
}

// limiterOf is the limiter gateway g charges.
func (s *sim) limiterOf(g int) *limit.Local {
	if len(s.limiters) == 1 {
		return s.limiters[0]
	}
	return s.limiters[g]
}

// admitTenant charges a request's tenant at its arrival. It reports false
// when the limit refused it, having recorded the refusal.
func (s *sim) admitTenant(rs *reqState, rec *results.Record) (bool, error) {
	b, ok := s.buckets[rs.w.Tenant]
	if !ok {
		return true, nil
	}
	lim := s.limiterOf(rs.gateway)
	d, err := lim.Reserve(context.Background(), limit.Request{Buckets: b, Tokens: rec.PromptTokens + rs.w.MaxTokens})
	if err != nil {
		return false, fmt.Errorf("tenant %q: %w", rs.w.Tenant, err)
	}
	if !d.Allowed {
		rec.Outcome = results.OutcomeRejected
		rec.Reject = results.RejectRateLimited
		rec.RateLimit = string(d.Reason)
		rec.RetryAfter = d.RetryAfter
		return false, nil
	}
	rs.lim, rs.res = lim, d.Reservation
	return true, nil
}

// finishTenant releases a request's reservation: used is the tokens it
// really used, or limit.UsageUnknown to keep the estimate.
func (s *sim) finishTenant(rs *reqState, used int) {
	if rs.res == nil {
		return
	}
	// Local.Finish fails only for a nil or foreign reservation.
	_ = rs.lim.Finish(context.Background(), rs.res, used)
	rs.lim, rs.res = nil, nil
}

// limitsState is the summary's tenant_limits: "on" or "off" when the
// workload gives tenants limits, "" otherwise.
func (c *Config) limitsState() string {
	if c.Source != nil || !c.Workload.Tenants.Limited() {
		return ""
	}
	if c.NoLimits {
		return LimitsOff
	}
	return LimitsOn
}
