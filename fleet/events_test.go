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
