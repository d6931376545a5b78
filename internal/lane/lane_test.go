package lane

import (
	"testing"

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
