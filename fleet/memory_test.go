package fleet

import (
	"runtime"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/workload"
)

// tinySource is an open-loop stream of n short requests (16 prompt tokens
// of their own, 2 output tokens), one every gap: cheap to simulate, so a
// test can run hundreds of thousands of them.
type tinySource struct {
	n, next int
	gap     time.Duration
	model   string
}

func (s *tinySource) Next() (*workload.Request, bool) {
	if s.next == s.n {
		return nil, false
	}
	s.next++
	id := uint64(s.next)
	return &workload.Request{
		ID: id, Arrival: time.Duration(s.next) * s.gap, Model: s.model,
		Prompt:    []kvblock.Segment{{ID: id, Len: 16}},
		MaxTokens: 2, OutputTokens: 2,
		Output: kvblock.Segment{ID: 1<<40 + id, Len: 2},
	}, true
}

func (s *tinySource) Done(*workload.Request, time.Duration, bool) (*workload.Request, bool) {
	return nil, false
}

// heapNear runs n tiny requests on two replicas without keeping records,
// past a small exact limit, and returns the heap in use after a collection
// once nine tenths of them were created.
func heapNear(t *testing.T, n int) uint64 {
	t.Helper()
	c := DefaultConfig()
	c.Replicas = 2
	c.KeepRecords = false
	c.ExactLimit = 1000
	c.SourceName = "tiny"
	c.Source = func(uint64) (workload.Source, error) {
		return &tinySource{n: n, gap: 5 * time.Millisecond, model: c.Workload.Model}, nil
	}
	var heap uint64
	c.Progress = func(p Progress) {
		if heap == 0 && p.Created >= n*9/10 {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			heap = m.HeapInuse
		}
	}
	out, err := Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	if out.Summary.Completed != n || out.Records != nil {
		t.Fatalf("%d of %d completed, %d records kept", out.Summary.Completed, n, len(out.Records))
	}
	if out.Summary.PercentileError == 0 {
		t.Fatal("the run stayed under its exact limit")
	}
	return heap
}

// A run's memory does not grow with its length: ten times the requests
// hold about the same heap (records stream out, the summary sketches).
func TestMemoryFlatInRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates 220,000 requests")
	}
	small, large := heapNear(t, 20_000), heapNear(t, 200_000)
	t.Logf("heap in use: %.1f MB at 20k requests, %.1f MB at 200k", float64(small)/1e6, float64(large)/1e6)
	// Holding the records alone would add about 40 MB.
	if large > small+small/2+4<<20 {
		t.Errorf("heap grew from %.1f MB at 20k requests to %.1f MB at 200k", float64(small)/1e6, float64(large)/1e6)
	}
}
