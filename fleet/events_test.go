package fleet

import (
	"testing"
	"time"

	"github.com/inferrail/inferrail/internal/timeheap"
	"pgregory.net/rapid"
)

// A timedQueue pops what a timeheap.Heap pushed the same way pops: by time,
// ties in push order (the simulator relies on it to pair events and their
// batches).
func TestTimedQueueOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var q timedQueue[int]
		var h timeheap.Heap[int]
		base := time.Duration(0)
		for i := range rapid.IntRange(0, 300).Draw(t, "ops") {
			if q.len() > 0 && rapid.Bool().Draw(t, "pop") {
				at, _ := q.front()
				want := h.Pop()
				if got := q.pop(); got != want.V || at != want.At {
					t.Fatalf("popped %d at %v, want %d at %v", got, at, want.V, want.At)
				}
				continue
			}
			// Mostly in order, sometimes a little earlier (another rank).
			base += time.Duration(rapid.IntRange(0, 3).Draw(t, "step"))
			at := base - time.Duration(rapid.IntRange(0, 2).Draw(t, "back"))
			q.push(at, i)
			h.Push(at, i)
			if q.len() != h.Len() {
				t.Fatalf("len %d, want %d", q.len(), h.Len())
			}
		}
	})
}

// The event heap pops what a timeheap.Heap pushed the same way pops, each
// event with its own request: by time, ties in push order.
func TestEventHeapOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var h eventHeap
		var ref timeheap.Heap[event]
		for i := range rapid.IntRange(0, 400).Draw(t, "ops") {
			if h.len() > 0 && rapid.Bool().Draw(t, "pop") {
				want := ref.Pop().V
				if got := h.pop(); got != want {
					t.Fatalf("popped %+v, want %+v", got, want)
				}
				continue
			}
			e := event{
				at:      time.Duration(rapid.IntRange(0, 20).Draw(t, "at")),
				kind:    eventKind(rapid.IntRange(0, int(evOutput)).Draw(t, "kind")),
				replica: int32(rapid.IntRange(-3, 7).Draw(t, "replica")),
				gateway: int32(rapid.IntRange(0, 3).Draw(t, "gateway")),
			}
			if rapid.Bool().Draw(t, "req") {
				e.req = &reqState{rec: i}
			}
			h.push(e)
			ref.Push(e.at, e)
			if h.len() != ref.Len() {
				t.Fatalf("len %d, want %d", h.len(), ref.Len())
			}
		}
	})
}

// BenchmarkEventHeap pushes and pops events through a heap holding about as
// many as a run of 8 replicas does (a step end and a scrape each, a few
// arrivals), reported per push and pop.
func BenchmarkEventHeap(b *testing.B) {
	var h eventHeap
	at := time.Duration(0)
	for i := range 24 {
		h.push(event{at: time.Duration(i) * time.Millisecond, kind: evStepEnd, replica: int32(i % 8)})
	}
	req := &reqState{}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		e := h.pop()
		at = e.at
		e.at = at + time.Duration(1+i%7)*3*time.Millisecond
		if i%8 == 0 {
			e.req = req
		} else {
			e.req = nil
		}
		h.push(e)
		i++
	}
}

// A long run of scrapes, each pushed one interval after the one popped, with
// other events between them (as a simulation's): the FIFO that holds the
// scrapes refills and compacts, and the pops still follow the heap order.
func TestEventHeapScrapeFIFO(t *testing.T) {
	var h eventHeap
	var ref timeheap.Heap[event]
	push := func(e event) { h.push(e); ref.Push(e.at, e) }
	const interval = 100
	for i := range 8 {
		push(event{at: time.Duration(i * interval / 8), kind: evScrape, replica: int32(i)})
	}
	x := uint64(1)
	for range 20000 {
		got, want := h.pop(), ref.Pop().V
		if got != want {
			t.Fatalf("popped %+v, want %+v", got, want)
		}
		x = x*6364136223846793005 + 1442695040888963407
		switch got.kind {
		case evScrape:
			push(event{at: got.at + interval, kind: evScrape, replica: got.replica})
		default:
			if x>>60 < 12 { // most other events beget one more
				push(event{at: got.at + time.Duration(x>>32%150), kind: evStepEnd, replica: got.replica})
			}
		}
		if x>>58 == 0 {
			push(event{at: got.at + time.Duration(x>>40%30), kind: evArrival, replica: -1, req: &reqState{}})
		}
		if h.len() != ref.Len() {
			t.Fatalf("len %d, want %d", h.len(), ref.Len())
		}
	}
	if len(h.fifo) > 4096 {
		t.Fatalf("the scrape FIFO holds %d entries for 8 scrapes", len(h.fifo))
	}
}
