package report

// row returns the capacity row of policy, or nil.
func (c *Capacity) row(policy string) *CapacityRow {
	if c == nil {
		return nil
	}
	for i := range c.Rows {
		if c.Rows[i].Policy == policy {
			return &c.Rows[i]
		}
	}
	return nil
}

// BaselinePolicy is the policy savings are measured against: Baseline when
// set, else the best cache-blind policy of Rows (round_robin, random,
// least_request, p2c): the fewest replicas meeting the SLO, a policy that
// never meets it counting as worst, ties going to the earlier row. It is ""
// when Rows has no cache-blind policy.
func (c *Capacity) BaselinePolicy() string {
	if c == nil {
		return ""
	}
	if c.Baseline != "" {
		return c.Baseline
	}
	best := -1
	for i, r := range c.Rows {
		if !isCacheBlind(r.Policy) {
			continue
		}
		if best < 0 || fewer(r.Replicas, c.Rows[best].Replicas) {
			best = i
		}
	}
	if best < 0 {
		return ""
	}
	return c.Rows[best].Policy
}

// fewer reports whether replica count a beats b, 0 meaning never met.
func fewer(a, b int) bool {
	switch {
	case a <= 0:
		return false
	case b <= 0:
		return true
	}
	return a < b
}

// GPUsSaved returns, for the capacity row of policy, the replicas it saves
// against the baseline (BaselinePolicy) and the saving per four GPUs,
// saved/baselineReplicas*4. ok is false when the policy or the baseline has
// no row or does not meet the SLO up to MaxReplicas. A policy needing more
// replicas than the baseline saves a negative number.
func (c *Capacity) GPUsSaved(policy string) (saved int, perFour float64, ok bool) {
	base := c.row(c.BaselinePolicy())
	r := c.row(policy)
	if base == nil || r == nil || base.Replicas <= 0 || r.Replicas <= 0 {
		return 0, 0, false
	}
	saved = base.Replicas - r.Replicas
	return saved, float64(saved) / float64(base.Replicas) * 4, true
}
