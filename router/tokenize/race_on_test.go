//go:build race

package tokenize

// raceEnabled reports whether the race detector is on: under it sync.Pool
// drops items at random, so allocation counts are not the program's.
const raceEnabled = true
