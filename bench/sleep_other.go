//go:build !linux

package bench

import "time"

// sleepFor sleeps what left says is left, with Go's timers (on Linux, in
// the kernel: see sleep_linux.go).
func sleepFor(left func() time.Duration) {
	for d := left(); d > 0; d = left() {
		time.Sleep(d)
	}
}
