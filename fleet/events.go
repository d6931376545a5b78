package fleet

import (
	"time"
)

type eventKind uint8

const (
	evArrival   eventKind = iota // a request reaches the router
	evStepEnd                    // a replica's step ends (or an idle replica is kicked)
	evScrape                     // the gateway scrapes a replica's metrics
	evKVEvents                   // a replica's oldest batch of KV events reaches the router
	evGateway                    // a gateway's queue deadline (or an ejection's end)
	evOutput                     // a step's tokens reach the API server after the step's end (output lag)
	evTransfer                   // a prefill replica's KV link may have finished a transfer (pd.go)
	evDecodeAdd                  // a request's KV reached its decode replica (pd.go)
)

// event is one entry of the heap, ordered by (at, the order of pushes).
type event struct {
	at      time.Duration
	kind    eventKind
	replica int32
	gateway int32
	req     *reqState
}

// eventHeap is the run's events by time, then push order: a binary min-heap
// like internal/timeheap's, which pops them in the same order (the order is
// total, so any heap pops the same sequence), specialised for the
// simulator's hottest loop. Its entries hold no pointers (an arrival's
// request waits in reqs, by index), so moving them needs no write barriers
// and the collector never scans them, and sifting moves a hole rather than
// swapping.
//
// Scrapes, a third of a run's events, bypass the heap: every scrape is
// pushed one interval after the scrape being handled, so they come in time
// order and wait in a FIFO (fifo, from head), whose front pop compares with
// the heap's top by the same order.
type eventHeap struct {
	items []heapEntry
	fifo  []heapEntry
	head  int
	seq   uint64
	reqs  []*reqState // the requests of the arrivals in the heap, by heapEntry.req-1
	free  []int32     // unused indices of reqs
}

// heapEntry is an event in the heap: req is one plus the index of its
// request in eventHeap.reqs, or 0.
type heapEntry struct {
	at      time.Duration
	seq     uint64
	replica int32
	gateway int32
	req     int32
	kind    eventKind
}

// before orders entries by time, then push order.
func (a *heapEntry) before(b *heapEntry) bool {
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (h *eventHeap) len() int { return len(h.items) + len(h.fifo) - h.head }

func (h *eventHeap) push(e event) {
	h.seq++
	it := heapEntry{at: e.at, seq: h.seq, replica: e.replica, gateway: e.gateway, kind: e.kind}
	if e.kind == evScrape && e.req == nil && (h.head == len(h.fifo) || h.fifo[len(h.fifo)-1].at <= e.at) {
		if h.head == len(h.fifo) {
			h.fifo, h.head = h.fifo[:0], 0
		} else if h.head >= 1024 && h.head >= len(h.fifo)/2 {
			n := copy(h.fifo, h.fifo[h.head:])
			h.fifo, h.head = h.fifo[:n], 0
		}
		h.fifo = append(h.fifo, it)
		return
	}
	if e.req != nil {
		if k := len(h.free); k > 0 {
			it.req = h.free[k-1] + 1
			h.free = h.free[:k-1]
			h.reqs[it.req-1] = e.req
		} else {
			h.reqs = append(h.reqs, e.req)
			it.req = int32(len(h.reqs))
		}
	}
	h.items = append(h.items, it)
	items := h.items
	i := len(items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !it.before(&items[p]) {
			break
		}
		items[i] = items[p]
		i = p
	}
	items[i] = it
}

// pop removes and returns the earliest event; the heap must not be empty.
func (h *eventHeap) pop() event {
	if h.head < len(h.fifo) && (len(h.items) == 0 || h.fifo[h.head].before(&h.items[0])) {
		it := &h.fifo[h.head]
		h.head++
		return event{at: it.at, kind: it.kind, replica: it.replica, gateway: it.gateway}
	}
	items := h.items
	top := items[0]
	n := len(items) - 1
	last := items[n]
	h.items = items[:n]
	if n > 0 {
		i := 0
		for {
			l := 2*i + 1
			if l >= n {
				break
			}
			m := l
			if r := l + 1; r < n && items[r].before(&items[l]) {
				m = r
			}
			if !items[m].before(&last) {
				break
			}
			items[i] = items[m]
			i = m
		}
		items[i] = last
	}
	e := event{at: top.at, kind: top.kind, replica: top.replica, gateway: top.gateway}
	if top.req != 0 {
		e.req = h.reqs[top.req-1]
		h.reqs[top.req-1] = nil
		h.free = append(h.free, top.req-1)
	}
	return e
}

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
