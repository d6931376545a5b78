//go:build race

package live

// raceEnabled reports whether the race detector is on: a test whose point
// is the numbers of a long run (the fidelity check) skips itself under it,
// as the run without it checks them.
const raceEnabled = true
