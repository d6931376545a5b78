package bench

import (
	"time"

	"golang.org/x/sys/unix"
)

// sleepFor sleeps what left says is left in the kernel (nanosleep), where
// Go's timers round a wait under a millisecond up to one when nothing else
// wakes the process: the thread uses no CPU meanwhile and, its timer slack
// set to a nanosecond (50 µs by default), wakes within tens of
// microseconds of the time. A signal (Go preempts goroutines with them)
// ends a nanosleep early: the loop then sleeps what is left.
func sleepFor(left func() time.Duration) {
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0) // this thread's; best effort
	for d := left(); d > 0; d = left() {
		ts := unix.NsecToTimespec(d.Nanoseconds())
		_ = unix.Nanosleep(&ts, nil)
	}
}
