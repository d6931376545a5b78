//go:build race

package kvindex

// raceEnabled reports whether the race detector is on; the slow memory test
// skips itself under it.
const raceEnabled = true
