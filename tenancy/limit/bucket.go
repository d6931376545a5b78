package limit

import "math"

// The token-bucket arithmetic, on a level (units in use) that drains at
// limit/window. Time is an integer in any unit (Local: nanoseconds, the Lua
// scripts: microseconds) as long as elapsed and window share it. The Lua
// scripts repeat these formulas operation for operation, so both
// implementations round alike.

// tolerance is the relative slack of a fit: rounding in the drain must not
// refuse the L-th request of a burst or the one a refill just made room for.
const tolerance = 1e-9

// drain is the level after elapsed time units; a backward clock step
// (elapsed < 0) drains nothing.
func drain(level float64, elapsed, window int64, limit int) float64 {
	if elapsed <= 0 || level <= 0 {
		return max(level, 0)
	}
	level -= float64(elapsed) * float64(limit) / float64(window)
	if level < 0 {
		return 0
	}
	return level
}

// later is a bucket's time after an update at now: never before its last
// one. After a backward clock step nothing drains until the clock is past
// the last update again; moving the bucket's time back would drain the
// time in between a second time, and admit more than the limit allows.
func later(last, now int64) int64 { return max(last, now) }

// fits reports whether cost more units keep the level within the limit.
func fits(level, cost float64, limit int) bool {
	l := float64(limit)
	return level+cost <= l+l*tolerance
}

// wait is how long until cost more units would fit: the level must drain to
// limit − cost.
func wait(level, cost float64, limit int, window int64) int64 {
	l := float64(limit)
	return int64(math.Ceil((level + cost - l) * float64(window) / l))
}

// remaining is the whole units that would fit now.
func remaining(level float64, limit int) int {
	l := float64(limit)
	r := math.Floor(l - level + l*tolerance)
	if r < 0 {
		return 0
	}
	if r > l {
		return limit
	}
	return int(r)
}

// resetIn is how long until the level is back to 0 (the full allowance).
func resetIn(level float64, limit int, window int64) int64 {
	if level <= 0 {
		return 0
	}
	return int64(math.Ceil(level * float64(window) / float64(limit)))
}

// share is one gateway's part of a limit for the local fallback: rounded
// down, at least 1 (0 would mean unlimited).
func share(limit, gateways int) int {
	if limit == 0 || gateways <= 1 {
		return limit
	}
	return max(1, limit/gateways)
}
