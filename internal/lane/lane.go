package lane

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Job is work handed to the lane.
type Job interface{ Run() }

// Size bounds the jobs in hand: Do waits for the oldest beyond it.
const Size = 64

// Idle is how long the worker polls for a job before it leaves.
const Idle = 500 * time.Microsecond

// Lane is a queue of jobs and the worker that runs them. The zero value is
// ready to use.
type Lane struct {
	// issued and done count the jobs handed over and those run; job i
	// waits in ring[i%Size] until done passes it.
	issued, done atomic.Uint64
	worker       atomic.Bool // a worker goroutine is running
	ring         [Size]Job
	// spare, when set, is the caller's own work that Wait does while the
	// job it waits for has not run (SetSpare).
	spare func() bool
}

// SetSpare gives the lane spare work to do instead of polling: f does one
// short piece of work that is needed later anyway and reports whether
// there may be more. Wait calls it while the job it waits for has not run,
// on the caller's goroutine inside whatever call waited, and the worker
// calls it between jobs; so f must be safe for concurrent use, must not
// touch what the caller may be in the middle of, and should return false
// at once when the other goroutine is doing a piece. Nil takes it away.
// Call it before the first Do.
func (l *Lane) SetSpare(f func() bool) { l.spare = f }

// Do hands j to the worker and returns its ticket, for Wait. Jobs
// run one at a time in the order they were handed over. The caller must
// not touch what j touches until it has waited for j.
func (l *Lane) Do(j Job) uint64 {
	n := l.issued.Load()
	if n >= Size {
		l.Wait(n - Size + 1)
	}
	l.ring[n%Size] = j
	l.issued.Store(n + 1)
	if !l.worker.Load() && l.worker.CompareAndSwap(false, true) {
		go l.work()
	}
	return n + 1
}

// Wait returns once the job of ticket t (and every job before it) has run;
// ticket 0 at once.
func (l *Lane) Wait(t uint64) {
	if f := l.spare; f != nil {
		for l.done.Load() < t && f() {
		}
	}
	for i := 1; l.done.Load() < t; i++ {
		if i%1024 == 0 {
			runtime.Gosched()
		}
	}
}

// Done reports whether the job of ticket t (and every job before it) has
// run.
func (l *Lane) Done(t uint64) bool { return l.done.Load() >= t }

// Spare does one piece of the spare work (SetSpare), if there is any, and
// reports whether there may be more: for a caller that waits for something
// else than a ticket.
func (l *Lane) Spare() bool { return l.spare != nil && l.spare() }

// work is the worker: it runs each job in turn, and leaves after Idle
// without one.
func (l *Lane) work() {
	last := time.Now()
	for i := 1; ; i++ {
		if d := l.done.Load(); d < l.issued.Load() {
			j := &l.ring[d%Size]
			(*j).Run()
			*j = nil
			l.done.Store(d + 1)
			last = time.Now()
			continue
		}
		if i%64 != 0 {
			continue
		}
		if l.spare != nil && l.spare() {
			last = time.Now()
			continue
		}
		if time.Since(last) < Idle {
			if i%4096 == 0 {
				// Let the process's other goroutines have this core if
				// they need it (simulations side by side).
				runtime.Gosched()
			}
			continue
		}
		l.worker.Store(false)
		// A job handed over just before the store above found the worker
		// still running: take it, unless its caller started another.
		if l.done.Load() == l.issued.Load() || !l.worker.CompareAndSwap(false, true) {
			return
		}
	}
}
