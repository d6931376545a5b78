package results

import (
	"fmt"
	"math"
)

// Conclusion says in one line what a set of runs of the same requests
// shows: the TTFT p99 and hit rate of the policy named ours against the
// best and the worst of the others. It returns "" when ours is not among
// them or it is alone.
func Conclusion(sums []Summary, ours string) string {
	var me *Summary
	best, worst := -1, -1
	for i := range sums {
		s := &sums[i]
		if s.Policy == ours {
			me = s
			continue
		}
		if best < 0 || s.TTFT.P99 < sums[best].TTFT.P99 {
			best = i
		}
		if worst < 0 || s.TTFT.P99 > sums[worst].TTFT.P99 {
			worst = i
		}
	}
	if me == nil || best < 0 {
		return ""
	}
	ratio := func(a, b float64) string {
		if b <= 0 || math.IsNaN(a/b) {
			return "n/a"
		}
		return fmt.Sprintf("%.2fx", a/b)
	}
	line := fmt.Sprintf("%s: TTFT p99 %s ms, %s %s's %s ms", ours, fmtMs(me.TTFT.P99), ratio(me.TTFT.P99, sums[worst].TTFT.P99), sums[worst].Policy, fmtMs(sums[worst].TTFT.P99))
	if best != worst {
		line += fmt.Sprintf(" and %s %s's %s ms", ratio(me.TTFT.P99, sums[best].TTFT.P99), sums[best].Policy, fmtMs(sums[best].TTFT.P99))
	}
	line += fmt.Sprintf("; prefix-cache hit rate %s against %s", fmtPct(me.HitRate), fmtPct(sums[worst].HitRate))
	if best != worst {
		line += " and " + fmtPct(sums[best].HitRate)
	}
	return line
}
