// Package timeheap is a binary min-heap of values ordered by a time, then by
// the order they were pushed: the project's one priority queue (the
// simulator's events, the gateway core's queue deadlines, the prefix index's
// speculative expiries, the mock engine's delayed outputs, bench's send
// schedule). It is written by hand rather than on
// container/heap, whose interface boxing costs an allocation per push; the
// comparisons are on the item's own fields, so they inline.
package timeheap

import "time"

// Item is one entry: its time, its push order and its value.
type Item[T any] struct {
	At  time.Duration
	Seq uint64
	V   T
}

// Heap is a min-heap by (At, Seq). The zero value is empty and ready.
type Heap[T any] struct {
	items []Item[T]
	seq   uint64
}

// Len is the number of items.
func (h *Heap[T]) Len() int { return len(h.items) }

// Cap is the capacity of the heap's backing array, for memory accounting.
func (h *Heap[T]) Cap() int { return cap(h.items) }

// Peek returns the value of the i-th item in heap order, 0 <= i < Len: item
// 0 is the earliest; the others are among the earliest in no particular
// order (a lookahead window, e.g. to prepare the next few).
func (h *Heap[T]) Peek(i int) T { return h.items[i].V }

func less[T any](a, b *Item[T]) bool {
	if a.At != b.At {
		return a.At < b.At
	}
	return a.Seq < b.Seq
}

// Push adds v at time at; of two items at the same time the one pushed
// first comes out first.
func (h *Heap[T]) Push(at time.Duration, v T) {
	h.seq++
	h.items = append(h.items, Item[T]{At: at, Seq: h.seq, V: v})
	i := len(h.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !less(&h.items[i], &h.items[p]) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

// Top returns the earliest item without removing it; ok is false when the
// heap is empty.
func (h *Heap[T]) Top() (it Item[T], ok bool) {
	if len(h.items) == 0 {
		return it, false
	}
	return h.items[0], true
}

// Pop removes and returns the earliest item; the heap must not be empty.
func (h *Heap[T]) Pop() Item[T] {
	top := h.items[0]
	last := len(h.items) - 1
	h.items[0] = h.items[last]
	var zero Item[T]
	h.items[last] = zero // drop what the value references
	h.items = h.items[:last]
	i, n := 0, last
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && less(&h.items[r], &h.items[l]) {
			m = r
		}
		if !less(&h.items[m], &h.items[i]) {
			break
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
	return top
}
