package live

import (
	"sync"
	"testing"

	"pgregory.net/rapid"
)

// bgLimit ends a background request's reservation exactly once, with the
// watch's output, whichever of the request (handOver) and the watch
// (ended) comes first, sequentially or at once.
func TestBGLimitEndsOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		output := rapid.IntRange(-1, 1<<20).Draw(t, "output")
		watchFirst := rapid.Bool().Draw(t, "watchFirst")
		concurrent := rapid.Bool().Draw(t, "concurrent")
		var mu sync.Mutex
		var calls []int
		finish := func(o int) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, o)
		}
		b := &bgLimit{}
		switch {
		case concurrent:
			var wg sync.WaitGroup
			wg.Go(func() { b.ended(output) })
			wg.Go(func() { b.handOver(finish) })
			wg.Wait()
		case watchFirst:
			b.ended(output)
			b.handOver(finish)
		default:
			b.handOver(finish)
			if len(calls) != 0 {
				t.Fatalf("finished before the watch ended: %v", calls)
			}
			b.ended(output)
		}
		if len(calls) != 1 || calls[0] != output {
			t.Fatalf("finish called %v, want once with %d", calls, output)
		}
	})
}
