package live

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/live/config"
)

// The pool never runs more than its workers at once, turns away what its
// queue cannot hold, and gives up on a wait past its timeout.
func TestTokPoolBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newTokPool(config.Tokenize{Workers: 2, Queue: 3, Timeout: 20 * time.Millisecond})
		var running, peak atomic.Int64
		slow := func() ([]uint32, error) {
			n := running.Add(1)
			if n > peak.Load() {
				peak.Store(n)
			}
			time.Sleep(15 * time.Millisecond)
			running.Add(-1)
			return []uint32{1}, nil
		}
		var mu sync.Mutex
		got := map[tokOutcome]int{}
		var wg sync.WaitGroup
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, o := p.do(context.Background(), slow)
				mu.Lock()
				got[o]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		// 2 run at once, 3 wait (2 of them get a slot at 15 ms, 1 more at
		// 30 ms is past its 20 ms timeout), 5 are turned away.
		if peak.Load() != 2 || got[tokOK] != 4 || got[tokTimeout] != 1 || got[tokQueueFull] != 5 {
			t.Fatalf("peak %d, outcomes %v", peak.Load(), got)
		}
		if _, o := p.do(context.Background(), func() ([]uint32, error) { return nil, errors.New("x") }); o != tokError {
			t.Fatalf("failing encoder: %s", o)
		}
	})
}
