package report

import (
	"fmt"
	"math"
	"strconv"
)

// noisePhrase is what the Reading section says when the spread across seeds
// exceeds the gap between the two best policies.
const noisePhrase = "within seed noise"

// argBest returns the index of the aggregate with the lowest (or, with
// highest, the highest) value among those keep accepts, the first on ties;
// -1 if none.
func argBest(aggs []policyAgg, value func(a *policyAgg) float64, highest bool, keep func(a *policyAgg) bool) int {
	best := -1
	for i := range aggs {
		a := &aggs[i]
		if keep != nil && !keep(a) {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		v, bv := value(a), value(&aggs[best])
		if (highest && v > bv) || (!highest && v < bv) {
			best = i
		}
	}
	return best
}

func p99Of(a *policyAgg) float64 { return a.TTFTP99.Med }

// reading generates the Reading section's statements from the numbers.
func reading(in Input, aggs []policyAgg, sweep sweepTable) []string {
	var out []string
	out = append(out, readLatency(aggs)...)
	out = append(out, readHitRate(aggs, wordsOf(in))...)
	out = append(out, readSLO(in, aggs)...)
	out = append(out, readAdmission(in, aggs)...)
	out = append(out, readSweep(sweep)...)
	out = append(out, readCapacity(in.Capacity)...)
	return out
}

// factorText is " F× lower than NAME (X ms)".
func factorText(best, other *policyAgg, what string) string {
	if best.TTFTP99.Med <= 0 {
		return fmt.Sprintf("%s (%s ms)", what, fmtMs(other.TTFTP99.Med))
	}
	return fmt.Sprintf("%s lower than %s (%s ms)", fmtFactor(other.TTFTP99.Med/best.TTFTP99.Med), what, fmtMs(other.TTFTP99.Med))
}

func readLatency(aggs []policyAgg) []string {
	if len(aggs) == 0 {
		return nil
	}
	var out []string
	bi := argBest(aggs, p99Of, false, nil)
	best := &aggs[bi]
	s := fmt.Sprintf("%s has the lowest TTFT p99, %s ms.", code(best.Policy), fmtMs(best.TTFTP99.Med))

	rr := argBest(aggs, p99Of, false, func(a *policyAgg) bool { return basePolicy(a.Policy) == "round_robin" })
	cb := argBest(aggs, p99Of, false, func(a *policyAgg) bool { return isCacheBlind(a.Policy) })
	aware := argBest(aggs, p99Of, false, func(a *policyAgg) bool { return !isCacheBlind(a.Policy) })
	switch {
	case len(aggs) == 1:
	case isCacheBlind(best.Policy):
		if aware >= 0 {
			s += fmt.Sprintf(" It is cache-blind: the best cache-aware policy, %s, reaches %s ms (%s higher).",
				code(aggs[aware].Policy), fmtMs(aggs[aware].TTFTP99.Med), ratioText(aggs[aware].TTFTP99.Med, best.TTFTP99.Med))
		}
	default:
		var parts []string
		if rr >= 0 {
			what := code(aggs[rr].Policy)
			if cb == rr {
				what += ", also the best cache-blind policy"
			}
			parts = append(parts, factorText(best, &aggs[rr], what))
		}
		if cb >= 0 && cb != rr {
			parts = append(parts, factorText(best, &aggs[cb], code(aggs[cb].Policy)+", the best cache-blind policy"))
		}
		if len(parts) > 0 {
			s += " That is " + joinAnd(parts) + "."
		}
	}
	out = append(out, s)

	if len(aggs) < 2 {
		return out
	}
	si := argBest(aggs, p99Of, false, func(a *policyAgg) bool { return a.Policy != best.Policy })
	second := &aggs[si]
	gap := second.TTFTP99.Med - best.TTFTP99.Med
	noise := math.Max(best.TTFTP99.Range(), second.TTFTP99.Range())
	switch {
	case len(best.Runs) < 2 && len(second.Runs) < 2:
		out = append(out, fmt.Sprintf("%s and %s, the top two, ran one seed each, so the seed-to-seed spread is unknown.",
			code(best.Policy), code(second.Policy)))
	case noise >= gap:
		out = append(out, fmt.Sprintf("The gap between %s and the runner-up %s (%s ms) is %s: their TTFT p99 varies by up to %s ms across seeds.",
			code(best.Policy), code(second.Policy), fmtMs(gap), noisePhrase, fmtMs(noise)))
	default:
		out = append(out, fmt.Sprintf("%s leads the runner-up %s by %s ms, more than either's TTFT p99 spread across seeds (up to %s ms).",
			code(best.Policy), code(second.Policy), fmtMs(gap), fmtMs(noise)))
	}
	return out
}

// ratioText is a/b as a factor, or "n/a" when b is not positive.
func ratioText(a, b float64) string {
	if b <= 0 {
		return "n/a"
	}
	return fmtFactor(a / b)
}

func readHitRate(aggs []policyAgg, w words) []string {
	if len(aggs) == 0 {
		return nil
	}
	hit := func(a *policyAgg) float64 { return a.HitRate.Med }
	hi := argBest(aggs, hit, true, nil)
	lo := argBest(aggs, hit, false, nil)
	var out []string
	if fmtPct(aggs[hi].HitRate.Med) == fmtPct(aggs[lo].HitRate.Med) {
		if len(aggs) > 1 {
			out = append(out, fmt.Sprintf("Every %s has the same measured prompt-token hit rate, %s.", w.short(), fmtPct(aggs[hi].HitRate.Med)))
		} else {
			out = append(out, fmt.Sprintf("The measured prompt-token hit rate is %s.", fmtPct(aggs[hi].HitRate.Med)))
		}
	} else {
		out = append(out, fmt.Sprintf("The measured prompt-token hit rate is highest for %s (%s) and lowest for %s (%s).",
			code(aggs[hi].Policy), fmtPct(aggs[hi].HitRate.Med), code(aggs[lo].Policy), fmtPct(aggs[lo].HitRate.Med)))
	}
	// Predictions off by 5 points or more, among policies that predict.
	var off []string
	for i := range aggs {
		a := &aggs[i]
		d := a.Predicted.Med - a.HitRate.Med
		if a.Predicted.Med <= 0 || math.Abs(d) < 0.05 {
			continue
		}
		dir := "over"
		if d < 0 {
			dir = "under"
		}
		off = append(off, fmt.Sprintf("%s %sestimates it (predicted %s, measured %s)", code(a.Policy), dir, fmtPct(a.Predicted.Med), fmtPct(a.HitRate.Med)))
	}
	if len(off) > 0 {
		out = append(out, "Router predictions off by 5 points or more: "+joinAnd(off)+".")
	}
	return out
}

func readSLO(in Input, aggs []policyAgg) []string {
	var low, fail []string
	for i := range aggs {
		a := &aggs[i]
		if a.Attainment.Med < 0.99 {
			low = append(low, fmt.Sprintf("%s (%s)", code(a.Policy), fmtPct(a.Attainment.Med)))
		}
		if a.SLOMet < len(a.Runs) {
			fail = append(fail, fmt.Sprintf("%s (%d of %d seeds)", code(a.Policy), len(a.Runs)-a.SLOMet, len(a.Runs)))
		}
	}
	var out []string
	if len(low) > 0 {
		out = append(out, "SLO attainment is below 99% for "+joinAnd(low)+".")
	} else if len(aggs) > 0 {
		out = append(out, "Every "+wordsOf(in).short()+" has SLO attainment of at least 99%.")
	}
	slo := sloText(sloOf(in.Setup.SLO))
	if len(fail) > 0 {
		out = append(out, "The p99 SLO ("+slo+") is missed by "+joinAnd(fail)+".")
	} else if len(aggs) > 0 {
		out = append(out, "Every "+wordsOf(in).short()+" meets the p99 SLO ("+slo+") on every seed.")
	}
	return out
}

func readSweep(t sweepTable) []string {
	if len(t.Rates) < 2 || len(t.Policies) == 0 {
		return nil
	}
	j := len(t.Rates) - 1
	bestTTFT, bestGood := -1, -1
	for i := range t.Policies {
		c := t.Cells[i][j]
		if c == nil {
			continue
		}
		if bestTTFT < 0 || c.TTFTP99.Med < t.Cells[bestTTFT][j].TTFTP99.Med {
			bestTTFT = i
		}
		if bestGood < 0 || c.Goodput.Med > t.Cells[bestGood][j].Goodput.Med {
			bestGood = i
		}
	}
	if bestTTFT < 0 {
		return nil
	}
	ttft := fmtMs(t.Cells[bestTTFT][j].TTFTP99.Med)
	good := fmtRate(t.Cells[bestGood][j].Goodput.Med)
	if bestTTFT == bestGood {
		return []string{fmt.Sprintf("At the highest swept load, %s req/s, %s has both the lowest TTFT p99 (%s ms) and the highest goodput (%s req/s).",
			fmtRate(t.Rates[j]), code(t.Policies[bestTTFT]), ttft, good)}
	}
	return []string{fmt.Sprintf("At the highest swept load, %s req/s, %s has the lowest TTFT p99 (%s ms) and %s the highest goodput (%s req/s).",
		fmtRate(t.Rates[j]), code(t.Policies[bestTTFT]), ttft, code(t.Policies[bestGood]), good)}
}

func readCapacity(c *Capacity) []string {
	if c == nil || len(c.Rows) == 0 {
		return nil
	}
	best := -1
	for i, r := range c.Rows {
		if r.Replicas > 0 && (best < 0 || r.Replicas < c.Rows[best].Replicas) {
			best = i
		}
	}
	var out []string
	if best < 0 {
		out = append(out, fmt.Sprintf("No policy meets the SLO at %s req/s with up to %s.",
			fmtRate(c.RateRPS), plural(c.MaxReplicas, "replica", "replicas")))
		return out
	}
	r := c.Rows[best]
	var tied []string
	for _, row := range c.Rows {
		if row.Replicas == r.Replicas {
			tied = append(tied, code(row.Policy))
		}
	}
	verb := "needs"
	if len(tied) > 1 {
		verb = "need"
	}
	need := strconv.Itoa(r.Replicas)
	if c.Split && len(tied) == 1 {
		need = FleetText(r.Replicas, r.Prefill, r.Decode, true)
	}
	s := fmt.Sprintf("At %s req/s, %s %s the fewest replicas to meet the SLO: %s.", fmtRate(c.RateRPS), joinAnd(tied), verb, need)
	base := c.BaselinePolicy()
	br := c.row(base)
	switch {
	case br == nil:
	case br.Replicas == r.Replicas:
		s += fmt.Sprintf(" So does the cache-blind baseline %s: no saving.", code(base))
	case br.Replicas <= 0:
		s += fmt.Sprintf(" The baseline %s does not meet the SLO with up to %s, so the saving is at least %d.",
			code(base), plural(c.MaxReplicas, "replica", "replicas"), c.MaxReplicas+1-r.Replicas)
	default:
		saved, perFour, _ := c.GPUsSaved(r.Policy)
		s += fmt.Sprintf(" The cache-blind baseline %s needs %d: a saving of %s, %s per four.",
			code(base), br.Replicas, plural(saved, "GPU", "GPUs"), strconv.FormatFloat(perFour, 'f', 2, 64))
	}
	out = append(out, s)
	return out
}
