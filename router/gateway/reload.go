package gateway

import (
	"errors"
	"fmt"
	"time"

	"github.com/inferrail/inferrail/router"
)

// This file changes a running core's configuration (live's hot reload):
// Reconfigure swaps the settings that may change while requests are in
// flight, DetachReplica retires a replica for good. Everything else the
// core holds stays: every replica (its counters, caps, health, ejection,
// engine reports), the index, the queue, and each request's ticket,
// reservation, priority class and deadline.

// CheckReconfigure reports whether Reconfigure would accept cfg, changing
// nothing: cfg must be valid, and leave alone what the core cannot change
// at run time: Model, and what the router is built on (Router.Options,
// which its explanations and the shadow policy read too, Router.Index,
// Router.SpeculationTTL, Router.DefaultCapacityBlocks). Router.Policy may
// change.
func (c *Core) CheckReconfigure(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Router.DefaultCapacityBlocks == 0 {
		cfg.Router.DefaultCapacityBlocks = cfg.DefaultCapacityBlocks // as New does
	}
	old := c.cfg
	var errs []error
	fixed := func(name string, same bool, was, now any) {
		if !same {
			errs = append(errs, fmt.Errorf("%s: cannot change at run time (%v, asked %v)", name, was, now))
		}
	}
	fixed("model", cfg.Model == old.Model, old.Model, cfg.Model)
	fixed("index", cfg.Router.Index == old.Router.Index, old.Router.Index, cfg.Router.Index)
	fixed("block size", cfg.Router.Options.BlockSize == old.Router.Options.BlockSize, old.Router.Options.BlockSize, cfg.Router.Options.BlockSize)
	if cfg.Router.Options.BlockSize == old.Router.Options.BlockSize {
		fixed("policy options (seed, profile, session affinity)", cfg.Router.Options == old.Router.Options, fmt.Sprintf("%+v", old.Router.Options), fmt.Sprintf("%+v", cfg.Router.Options))
	}
	fixed("speculation ttl", cfg.Router.SpeculationTTL == old.Router.SpeculationTTL, old.Router.SpeculationTTL, cfg.Router.SpeculationTTL)
	fixed("index default capacity", cfg.Router.DefaultCapacityBlocks == old.Router.DefaultCapacityBlocks, old.Router.DefaultCapacityBlocks, cfg.Router.DefaultCapacityBlocks)
	if cfg.Router.Policy != old.Router.Policy {
		if _, err := router.NewPolicy(cfg.Router.Policy, cfg.Router.Options); err != nil {
			errs = append(errs, fmt.Errorf("policy: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Reconfigure applies cfg to the running core at time now, or changes
// nothing and returns CheckReconfigure's error. cfg.Ledger and cfg.Trace
// are ignored: the core keeps its own. It returns the queued requests the
// change dispatched or rejected at once (a looser admission may admit the
// head of the queue now).
//
// New requests see every new setting. A request queued before keeps its
// priority class and deadline (a shorter queue.timeout applies to later
// requests only), and a queue made shorter than it is keeps what waits;
// a request in flight keeps its reservation, released as reserved. The
// policy is rebuilt only when its name changes: the new one starts its own
// state (round_robin's position, a random policy's draws, cost_model's
// sessions), the index is kept. A shadow policy (ShadowPolicy) is built
// again when it or the policy it shadows changes: its tally is of one
// pair.
func (c *Core) Reconfigure(now time.Duration, cfg Config) ([]Decision, error) {
	if err := c.CheckReconfigure(cfg); err != nil {
		return nil, err
	}
	c.out = c.out[:0]
	primary := cfg.Router.Policy != c.cfg.Router.Policy
	if primary {
		p, err := router.NewPolicy(cfg.Router.Policy, cfg.Router.Options)
		if err != nil { // CheckReconfigure built it already
			return nil, fmt.Errorf("policy: %w", err)
		}
		c.rt.SetPolicy(p)
	}
	shadow := primary || cfg.ShadowPolicy != c.cfg.ShadowPolicy
	cfg.Router.DefaultCapacityBlocks = c.cfg.Router.DefaultCapacityBlocks
	cfg.Ledger, cfg.Trace = c.cfg.Ledger, c.cfg.Trace
	old := c.cfg.PD
	c.cfg = cfg
	if shadow {
		if err := c.SetShadow(cfg.ShadowPolicy); err != nil { // Validate built it already
			return nil, err
		}
	}
	c.out_.reconfigure(cfg.OutputQuantile, cfg.OutputMinSamples)
	if primary || cfg.PD.Decider != old.Decider || cfg.PD.PrefillPolicy != old.PrefillPolicy {
		if err := c.pd.init(cfg); err != nil { // Validate built its policy already
			return nil, err
		}
	}
	c.drain(now)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "reconfigure", At: now}, c.out)
	}
	return c.out, nil
}

// reconfigure changes the quantile served and the samples it needs; the
// answers seen so far are kept.
func (o *outputEstimate) reconfigure(q float64, minSamples int) {
	o.q, o.min = q, minSamples
	if q == 0 || o.n < minSamples {
		o.valid = false
		return
	}
	o.fit()
}

// DetachReplica takes replica i out of rotation for good, as
// RemoveReplica does (the index forgets it; queued requests no other
// replica can take are refused), and frees its name: a replica added
// later under that name is a new one, with a new index and its own
// counters, health and index entries, instead of i coming back. Requests
// in flight on i end there normally; State(i) keeps reporting them, with
// Gone set and an empty Name.
func (c *Core) DetachReplica(now time.Duration, i int) []Decision {
	o := c.removeReplica(now, i)
	if r := c.rep(i); r != nil {
		r.cfg.Name = ""
	}
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "detach_replica", At: now, Replica: i}, o)
	}
	return o
}
