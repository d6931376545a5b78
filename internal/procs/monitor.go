package procs

import (
	"errors"
	"os"
	"strings"
)

// Go's runtime monitor (sysmon) is a thread that retakes processors from
// long system calls and preempts long-running goroutines. While every
// processor is idle it sleeps deeply, and the first system call after
// wakes it (a futex wake and a context switch); woken so, it bets that
// calls will block again and checks every 20 µs for at least a
// millisecond, a context switch each time. A proxy at a few hundred to a
// few thousand requests a second is idle between most of its events, so it
// pays that again and again: about three context switches a request,
// measured, and a fifth of its CPU. The runtime keeps the monitor out of
// deep sleep when GODEBUG sets schedtrace (so that it can print a trace on
// time); with the longest period schedtrace takes, it prints at most once
// in 24.8 days of the machine's uptime, and the monitor, awake, backs off
// to one check every 10 ms while nothing needs it. The setting's one other
// effect: a fatal error's report starts with the scheduler's state.

// MonitorSetting is the GODEBUG setting that keeps the runtime monitor
// awake: schedtrace with its longest period (2^31-1 ms).
const MonitorSetting = "schedtrace=2147483647"

// MonitorEnv returns environ with MonitorSetting added to GODEBUG, and
// true; or environ unchanged and false when GODEBUG already sets
// schedtrace (an operator's trace, or an earlier KeepMonitorAwake). Like
// the runtime, it reads the first GODEBUG in environ; later ones are
// dropped from the result.
func MonitorEnv(environ []string) ([]string, bool) {
	godebug, found := "", false
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			godebug, found = v, true
			break
		}
	}
	if found {
		for _, f := range strings.Split(godebug, ",") {
			if strings.HasPrefix(strings.TrimSpace(f), "schedtrace=") {
				return environ, false
			}
		}
	}
	out := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "GODEBUG=") {
			out = append(out, kv)
		}
	}
	if godebug != "" {
		godebug += ","
	}
	return append(out, "GODEBUG="+godebug+MonitorSetting), true
}

// ErrNoExec reports that the program could not be executed again (on a
// system without /proc/self/exe, or where exec fails): it goes on with the
// monitor as Go runs it.
var ErrNoExec = errors.New("cannot execute the program again")

// KeepMonitorAwake executes the running program again, in the same process
// (same pid, arguments and environment but for GODEBUG), with the runtime
// monitor kept awake (MonitorEnv), unless the environment already keeps
// it so. It returns only when it does not execute: nil when nothing was
// needed, else an error wrapping ErrNoExec. The runtime reads GODEBUG's
// schedtrace at start only, hence the exec. Only a program's main should
// call it, early: before it opens files, connections or listeners, which
// the new program opens again.
func KeepMonitorAwake() error {
	env, need := MonitorEnv(os.Environ())
	if !need {
		return nil
	}
	return execSelf(os.Args, env)
}
