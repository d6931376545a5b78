package fleet

import (
	"time"

	"github.com/inferrail/inferrail/internal/timeheap"
)

type eventKind uint8

const (
	evArrival  eventKind = iota // a request reaches the router
	evStepEnd                   // a replica's step ends (or an idle replica is kicked)
	evScrape                    // the gateway scrapes a replica's metrics
	evKVEvents                  // a replica's oldest batch of KV events reaches the router
	evGateway                   // a gateway's queue deadline (or an ejection's end)
	evOutput                    // a step's tokens reach the API server after the step's end (output lag)
)

// event is one entry of the heap, ordered by (at, the order of pushes).
type event struct {
	at      time.Duration
	kind    eventKind
	replica int32
	gateway int32
	req     *reqState
}

// eventHeap is the run's events by time (internal/timeheap: no allocation
// per push, as container/heap's boxing would cost).
type eventHeap struct{ h timeheap.Heap[event] }

func (h *eventHeap) len() int     { return h.h.Len() }
func (h *eventHeap) push(e event) { h.h.Push(e.at, e) }
func (h *eventHeap) pop() event   { return h.h.Pop().V }

// timed is a value due at a time.
type timed[T any] struct {
	at time.Duration
	v  T
}

// timedQueue holds values by time, ties in push order: the order in which
// the heap pops the events pushed with them. One engine's steps end in
// order, so a push nearly always appends and a pop takes the front;
// independent data-parallel ranks insert a little way back.
type timedQueue[T any] struct {
	items []timed[T]
	head  int
}

func (q *timedQueue[T]) len() int { return len(q.items) - q.head }

func (q *timedQueue[T]) push(at time.Duration, v T) {
	if q.head > 0 && q.head >= len(q.items)/2 {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, timed[T]{at, v})
	for i := len(q.items) - 1; i > q.head && q.items[i-1].at > at; i-- {
		q.items[i-1], q.items[i] = q.items[i], q.items[i-1]
	}
}

// front returns the earliest item's time; ok is false when q is empty.
func (q *timedQueue[T]) front() (at time.Duration, ok bool) {
	if q.head == len(q.items) {
		return 0, false
	}
	return q.items[q.head].at, true
}

// pop removes and returns the earliest value; q must not be empty.
func (q *timedQueue[T]) pop() T {
	it := q.items[q.head]
	q.items[q.head] = timed[T]{}
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return it.v
}
