//go:build !race

package fleet

// raceEnabled reports whether the race detector is on: the slowest tests
// of simulations on one goroutine skip themselves under it (the plain run
// checks them; the race detector's run is for the two-core tests).
const raceEnabled = false
