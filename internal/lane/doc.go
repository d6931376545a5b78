// Package lane runs one goroutine's side work on a second core: jobs handed
// over in order, run in order by a worker goroutine, each waited for only
// when its result is needed.
//
// Start with Lane. A simulation is one event loop; the second core of a
// small machine can take the work the loop does not need at once (the KV
// index's bookkeeping after a routing decision, router/kvindex), as long as
// the loop waits for a job before it touches what that job touches. The
// worker polls rather than parks: a parked goroutine waits tens of
// microseconds for an idle core to wake and take it, longer than most jobs. It leaves after Idle without a job, so that a
// lane nobody uses holds no goroutine, and the next job starts another. The
// caller polls for a job it waits for too, yielding now and then in case
// the worker shares its core.
//
// SetSpare gives both goroutines work for their idle moments (a
// simulation's coming arrivals, to read and hash): the caller does it while
// it waits, the worker between jobs.
//
// A Lane is for one caller goroutine: Do and Wait are not safe for
// concurrent use (the worker is the lane's own).
package lane
