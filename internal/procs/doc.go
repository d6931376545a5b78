// Package procs sizes GOMAXPROCS to a server's load. Go runs goroutines
// on GOMAXPROCS processors (Ps); while one of them is idle, every goroutine
// made ready (a connection readable, a response written) wakes an idle
// thread to look for it, and the thread spins before it sleeps again: on
// a proxy at a few hundred requests a second per core that costs more CPU
// than the requests themselves. A controller keeps as few Ps as the load
// needs, and all of them as soon as it needs more.
//
// Start with Controller (procs.go): Step takes one Sample (the CPU the
// process used, in cores, and the 99th percentile of the time goroutines
// waited for a P, over one interval) and returns the number of Ps to run
// with: at once enough that none is busier than Config.Busy, or twice as
// many when goroutines wait longer than Config.WaitLimit; fewer only
// after Config.DownAfter intervals in which fewer would each have been
// under Config.Idle, and after a lowering that did not hold, only after
// twice as long. Run (run.go) samples the process (getrusage and the
// runtime's /sched/latencies:seconds) every Config.Interval and applies
// Step's answer with runtime.GOMAXPROCS. Setting GOMAXPROCS stops the
// runtime's own updates of it (Go follows a container's CPU limit as it
// changes), so every Config.LimitEvery Run hands it back to the runtime for
// a moment, takes the runtime's value as the controller's Max
// (Controller.SetMax), and hands it back for good when it ends.
//
// KeepMonitorAwake (monitor.go) is the other half: it executes the program
// again with GODEBUG=schedtrace at its longest period, which keeps Go's
// runtime monitor from the deep sleep that costs a lightly loaded server a
// few context switches per request (monitor.go says why).
package procs
