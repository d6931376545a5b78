package compare

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/report"
)

// Pool is a disaggregated prefill/decode (P/D) split of a fleet: of its
// replicas, Prefill are prefill-only and Decode decode-only, the rest serve
// both (fleet.Config.PrefillReplicas, DecodeReplicas). The zero Pool is the
// aggregated fleet.
type Pool struct {
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
}

// Aggregated reports whether the pool is the aggregated fleet: no prefill
// and no decode replica.
func (p Pool) Aggregated() bool { return p == Pool{} }

// String names the pool in variant labels: P2D6 (2 prefill, 6 decode
// replicas), or aggregated.
func (p Pool) String() string { return report.PoolName(p.Prefill, p.Decode) }

// Flag is the pool as ParsePools reads it: prefill/decode, e.g. 2/6.
func (p Pool) Flag() string { return strconv.Itoa(p.Prefill) + "/" + strconv.Itoa(p.Decode) }

// Fleet describes n replicas split by the pool, as the capacity report
// does: "6 (2 prefill + 4 decode)"; an aggregated pool is "6 (aggregated)"
// when searched is set (a search over splits chose it), else "6".
func (p Pool) Fleet(n int, searched bool) string {
	return report.FleetText(n, p.Prefill, p.Decode, searched)
}

// poolOf is a configuration's pool.
func poolOf(c fleet.Config) Pool { return Pool{Prefill: c.PrefillReplicas, Decode: c.DecodeReplicas} }

// check says what is wrong with the pool on a fleet of replicas, nil when
// it is a valid split.
func (p Pool) check(replicas int) error {
	switch {
	case p.Prefill < 0 || p.Decode < 0:
		return fmt.Errorf("%s: prefill and decode replicas must be zero or positive", p.Flag())
	case p.Prefill+p.Decode > replicas:
		return fmt.Errorf("%s: %d prefill and %d decode replicas are more than the fleet's %d replicas (--replicas counts every pool)",
			p.Flag(), p.Prefill, p.Decode, replicas)
	case p.Prefill > 0 && p.Prefill == replicas:
		return fmt.Errorf("%s: %d prefill replicas of %d leave no replica to decode on", p.Flag(), p.Prefill, replicas)
	}
	return nil
}

// MaxPools bounds Spec.Pools: each pool is one simulation of every other
// variant, seed and rate.
const MaxPools = 256

// ParsePools reads a comma-separated list of pools, each prefill/decode
// (e.g. 0/0,2/6,4/4: the aggregated fleet, 2 prefill and 6 decode
// replicas, 4 and 4). Spec.Validate checks them against the fleet.
func ParsePools(s string) ([]Pool, error) {
	var out []Pool
	var errs []error
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		pre, dec, ok := strings.Cut(item, "/")
		p, err1 := strconv.Atoi(strings.TrimSpace(pre))
		d, err2 := strconv.Atoi(strings.TrimSpace(dec))
		if !ok || err1 != nil || err2 != nil || p < 0 || d < 0 {
			errs = append(errs, fmt.Errorf("pools: want prefill/decode replica counts, whole numbers from 0, e.g. 2/6 (0/0 is the aggregated fleet), got %q", item))
			continue
		}
		out = append(out, Pool{Prefill: p, Decode: d})
	}
	if len(errs) == 0 && len(out) == 0 {
		errs = append(errs, errors.New("pools: give at least one prefill/decode pool, e.g. 0/0,2/6"))
	}
	if len(out) > MaxPools {
		errs = append(errs, fmt.Errorf("pools: at most %d pools, got %d", MaxPools, len(out)))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// pools lists the compared pools: Spec.Pools, else Base's alone.
func (s *Spec) pools() []Pool {
	if len(s.Pools) == 0 {
		return []Pool{poolOf(s.Base)}
	}
	return s.Pools
}

// validatePools checks Spec.Pools; ok lists the valid ones.
func (s *Spec) validatePools() (ok []Pool, errs []error) {
	seen := map[Pool]bool{}
	if len(s.Pools) > MaxPools {
		errs = append(errs, fmt.Errorf("pools: at most %d pools, got %d (each is one simulation of every other variant, rate and seed)", MaxPools, len(s.Pools)))
	}
	for _, p := range s.Pools {
		switch err := p.check(s.Base.Replicas); {
		case err != nil:
			errs = append(errs, fmt.Errorf("pools: %w", err))
		case seen[p]:
			errs = append(errs, fmt.Errorf("pools: %s listed twice", p.Flag()))
		default:
			ok = append(ok, p)
		}
		seen[p] = true
	}
	return ok, errs
}
