package lane

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// appendJob appends its number to the log it shares with the others: the
// log is the worker's until the caller waits.
type appendJob struct {
	n   int
	log *[]int
}

func (j *appendJob) Run() { *j.log = append(*j.log, j.n) }

// TestJobsRunInOrder: every job runs once, in the order handed over, and a
// ticket waited for has run with every job before it, however the caller
// interleaves handing over (past Size in hand) and waiting.
func TestJobsRunInOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var l Lane
		var log []int
		jobs := make([]appendJob, rapid.IntRange(0, 3*Size).Draw(t, "jobs"))
		var tickets []uint64
		for i := range jobs {
			jobs[i] = appendJob{n: i, log: &log}
			tickets = append(tickets, l.Do(&jobs[i]))
			if tickets[i] != uint64(i+1) {
				t.Fatalf("job %d: ticket %d", i, tickets[i])
			}
			if rapid.IntRange(0, 9).Draw(t, "wait") == 0 {
				k := rapid.IntRange(0, i).Draw(t, "which")
				l.Wait(tickets[k])
				// Every job up to k has run (the log itself is read at
				// the end: later jobs may be appending to it now).
				if l.done.Load() < tickets[k] {
					t.Fatalf("waited for job %d, not done", k)
				}
			}
		}
		if len(tickets) > 0 {
			l.Wait(tickets[len(tickets)-1])
		}
		if len(log) != len(jobs) {
			t.Fatalf("%d jobs ran, %d handed over", len(log), len(jobs))
		}
		for i, n := range log {
			if n != i {
				t.Fatalf("job %d ran %dth", n, i)
			}
		}
		l.Wait(0) // returns at once
	})
}

func BenchmarkDoWait(b *testing.B) {
	var l Lane
	var log []int
	j := appendJob{log: &log}
	b.ReportAllocs()
	for b.Loop() {
		l.Wait(l.Do(&j))
		log = log[:0]
	}
}

// gateJob runs until its gate has been opened three times, or gives up
// after 5 s (so that a Wait that does no spare work fails the test rather
// than hanging it).
type gateJob struct {
	gate     *atomic.Int32
	timedOut *atomic.Bool
}

func (j gateJob) Run() {
	for start := time.Now(); j.gate.Load() < 3; {
		if time.Since(start) > 5*time.Second {
			j.timedOut.Store(true)
			return
		}
		runtime.Gosched()
	}
}

// TestSpareWorkWhileWaiting: Wait does the spare work while the job it
// waits for has not run (the job here needs three pieces of it, and the
// worker is busy with it).
func TestSpareWorkWhileWaiting(t *testing.T) {
	var l Lane
	var gate atomic.Int32
	var timedOut atomic.Bool
	l.SetSpare(func() bool {
		gate.Add(1)
		return true
	})
	l.Wait(l.Do(gateJob{&gate, &timedOut}))
	if timedOut.Load() {
		t.Fatal("the job waited for never got the spare work it needed")
	}
	if n := gate.Load(); n < 3 {
		t.Fatalf("%d pieces of spare work, the job needed 3", n)
	}
}

// TestWorkerDoesSpareWork: between jobs the worker does the spare work
// until it runs out, without anyone waiting; then it leaves as usual.
func TestWorkerDoesSpareWork(t *testing.T) {
	var l Lane
	var calls atomic.Int32
	const pieces = 100
	l.SetSpare(func() bool { return calls.Add(1) < pieces })
	var log []int
	l.Wait(l.Do(&appendJob{log: &log}))
	for start := time.Now(); calls.Load() < pieces || l.worker.Load(); {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("after 5 s: %d pieces of spare work of %d, worker running %v", calls.Load(), pieces, l.worker.Load())
		}
		runtime.Gosched()
	}
	if n := calls.Load(); n < pieces {
		t.Fatalf("%d pieces of spare work, want %d", n, pieces)
	}
}
