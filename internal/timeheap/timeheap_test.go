package timeheap

import (
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// Items come out by time, ties in push order, whatever the pushes and pops.
func TestOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var h Heap[int]
		type pushed struct {
			at time.Duration
			n  int
		}
		var model []pushed
		n := 0
		for range rapid.IntRange(0, 200).Draw(t, "ops") {
			if len(model) > 0 && rapid.Bool().Draw(t, "pop") {
				slices.SortStableFunc(model, func(a, b pushed) int { return int(a.at - b.at) })
				got := h.Pop()
				if got.At != model[0].at || got.V != model[0].n {
					t.Fatalf("popped (%v, %d), want (%v, %d)", got.At, got.V, model[0].at, model[0].n)
				}
				model = model[1:]
				continue
			}
			at := time.Duration(rapid.IntRange(0, 20).Draw(t, "at"))
			h.Push(at, n)
			model = append(model, pushed{at, n})
			n++
			if h.Len() != len(model) {
				t.Fatalf("len %d, want %d", h.Len(), len(model))
			}
		}
		if top, ok := h.Top(); ok != (len(model) > 0) || ok && top.At != slices.MinFunc(model, func(a, b pushed) int { return int(a.at - b.at) }).at {
			t.Fatalf("top %v %v", top, ok)
		}
	})
}

func BenchmarkPushPop(b *testing.B) {
	var h Heap[int]
	for i := range 10000 {
		h.Push(time.Duration(i*7919%10007), i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		it := h.Pop()
		h.Push(it.At+time.Duration(i%1000), it.V)
		i++
	}
}

// Peek(0) is the earliest item and every Peek(i) is a queued value; Cap
// covers Len.
func TestPeek(t *testing.T) {
	var h Heap[int]
	for i, at := range []time.Duration{5, 3, 9, 3, 1} {
		h.Push(at, i)
	}
	if got := h.Peek(0); got != 4 {
		t.Fatalf("Peek(0) = %d, want 4 (the item at time 1)", got)
	}
	seen := map[int]bool{}
	for i := range h.Len() {
		seen[h.Peek(i)] = true
	}
	if len(seen) != 5 || h.Cap() < h.Len() {
		t.Fatalf("Peek saw %v, Cap %d, Len %d", seen, h.Cap(), h.Len())
	}
}
