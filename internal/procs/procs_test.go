package procs

import (
	"context"
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

func mustNew(t *testing.T, cfg Config, start int) *Controller {
	t.Helper()
	c, err := New(cfg, start)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRaisesAtOnceLowersAfterDownAfter(t *testing.T) {
	c := mustNew(t, Config{Max: 8}, 1)
	// 1.2 cores at 50% per P needs 3.
	if got := c.Step(Sample{CPU: 1.2}); got != 3 {
		t.Fatalf("raise: got %d Ps, want 3", got)
	}
	// 0.3 cores fit one P under 40%: only after 8 intervals.
	for i := 1; i < 8; i++ {
		if got := c.Step(Sample{CPU: 0.3}); got != 3 {
			t.Fatalf("interval %d: lowered early to %d", i, got)
		}
	}
	if got := c.Step(Sample{CPU: 0.3}); got != 1 {
		t.Fatalf("after 8 light intervals: got %d Ps, want 1", got)
	}
}

func TestLowersToTheBusiestIntervalsNeed(t *testing.T) {
	c := mustNew(t, Config{Max: 8, DownAfter: 3}, 8)
	c.Step(Sample{CPU: 0.3}) // 1 P would do
	c.Step(Sample{CPU: 1.0}) // 3 Ps at 40%
	if got := c.Step(Sample{CPU: 0.3}); got != 3 {
		t.Fatalf("got %d Ps, want 3 (the most any of the three intervals needed)", got)
	}
}

func TestHysteresisHoldsBetweenIdleAndBusy(t *testing.T) {
	c := mustNew(t, Config{Max: 2}, 2)
	// 0.45 cores: one P would be 45% busy, under Busy (no raise from 1)
	// but over Idle (no lowering from 2).
	for range 100 {
		if got := c.Step(Sample{CPU: 0.45}); got != 2 {
			t.Fatalf("lowered to %d at 0.45 cores", got)
		}
	}
	c = mustNew(t, Config{Max: 2}, 1)
	for range 100 {
		if got := c.Step(Sample{CPU: 0.45}); got != 1 {
			t.Fatalf("raised to %d at 0.45 cores", got)
		}
	}
}

func TestWaitingDoublesWhateverTheCPU(t *testing.T) {
	c := mustNew(t, Config{Max: 16}, 1)
	if got := c.Step(Sample{CPU: 0.1, WaitP99: 10 * time.Millisecond}); got != 2 {
		t.Fatalf("got %d, want 2", got)
	}
	if got := c.Step(Sample{CPU: 0.1, WaitP99: 10 * time.Millisecond}); got != 4 {
		t.Fatalf("got %d, want 4", got)
	}
	for range 20 { // still waiting: never lowered
		c.Step(Sample{CPU: 0.1, WaitP99: 6 * time.Millisecond})
	}
	if got := c.Procs(); got != 16 {
		t.Fatalf("got %d Ps while goroutines kept waiting, want 16", got)
	}
}

func TestAFlappingLoweringWaitsLonger(t *testing.T) {
	c := mustNew(t, Config{Max: 2, DownAfter: 4}, 2)
	lowerAfter := func() int {
		n := 0
		for c.Procs() == 2 {
			c.Step(Sample{CPU: 0.1})
			n++
		}
		return n
	}
	if n := lowerAfter(); n != 4 {
		t.Fatalf("first lowering after %d intervals, want 4", n)
	}
	c.Step(Sample{CPU: 0.1, WaitP99: time.Second}) // it did not hold
	if n := lowerAfter(); n != 8 {
		t.Fatalf("lowering after a flap came after %d intervals, want 8", n)
	}
	c.Step(Sample{CPU: 0.1, WaitP99: time.Second})
	if n := lowerAfter(); n != 16 {
		t.Fatalf("after two flaps: %d intervals, want 16", n)
	}
	// Held for long: forgiven, back to DownAfter.
	for range 16*4*4 + 1 {
		c.Step(Sample{CPU: 0.1})
	}
	c.Step(Sample{CPU: 0.1, WaitP99: time.Second})
	if n := lowerAfter(); n != 4 {
		t.Fatalf("after a lowering that held: %d intervals, want 4", n)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{{Max: 0}, {Max: 2, Busy: 1.5}, {Max: 2, Busy: 0.3, Idle: 0.4}, {Max: 2, Interval: time.Microsecond}, {Max: 2, DownAfter: -1}, {Max: 2, LimitEvery: time.Millisecond}} {
		if _, err := New(c, 1); err == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
}

// The controller's answer is always in [1, Max], never under what the
// sample needs at Busy, and it lowers only after DownAfter intervals, but
// for a lower Max (SetMax), which it follows at once.
func TestStepProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		maxP := rapid.IntRange(1, 64).Draw(t, "max")
		down := rapid.IntRange(1, 10).Draw(t, "down_after")
		c, err := New(Config{Max: maxP, DownAfter: down}, rapid.IntRange(-3, 80).Draw(t, "start"))
		if err != nil {
			t.Fatal(err)
		}
		same := 0
		prev := c.Procs()
		for i := range rapid.IntRange(1, 200).Draw(t, "steps") {
			if rapid.IntRange(0, 9).Draw(t, "resize") == 0 {
				maxP = rapid.IntRange(-1, 64).Draw(t, "new max")
				c.SetMax(maxP)
				maxP = max(maxP, 1)
				if c.Max() != maxP || c.Procs() > maxP || c.Procs() < 1 {
					t.Fatalf("step %d: SetMax(%d) left Max %d, %d Ps", i, maxP, c.Max(), c.Procs())
				}
				if c.Procs() != prev { // dropped to the new Max: counting starts again
					prev, same = c.Procs(), 0
				}
			}
			s := Sample{CPU: rapid.Float64Range(-1, 80).Draw(t, "cpu"), WaitP99: time.Duration(rapid.Int64Range(0, 2e7).Draw(t, "wait"))}
			got := c.Step(s)
			if got < 1 || got > maxP {
				t.Fatalf("step %d: %d Ps outside [1, %d]", i, got, maxP)
			}
			if needs := c.need(s.CPU, 0.5); got < needs {
				t.Fatalf("step %d: %d Ps for %.2f cores, which need %d", i, got, s.CPU, needs)
			}
			if got < prev && same+1 < down {
				t.Fatalf("step %d: lowered after %d intervals, DownAfter %d", i, same+1, down)
			}
			if got == prev {
				same++
			} else {
				same = 0
			}
			prev = got
		}
	})
}

func TestP99(t *testing.T) {
	bounds := []float64{0, 0.001, 0.002, 0.004, math.Inf(1)}
	if got := p99([]uint64{10, 10, 10, 10}, []uint64{10, 10, 10, 10}, bounds); got != 0 {
		t.Fatalf("nothing new: got %v", got)
	}
	// 100 new: 98 under 1ms, 2 between 2 and 4ms: p99 is in the last.
	if got := p99([]uint64{98, 0, 2, 0}, nil, bounds); got != 4*time.Millisecond {
		t.Fatalf("got %v, want 4ms", got)
	}
	if got := p99([]uint64{99, 0, 1, 0}, nil, bounds); got != time.Millisecond {
		t.Fatalf("got %v, want 1ms", got)
	}
}

func TestRunSetsWhatTheControllerDecidesAndRestores(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cpu := make(chan float64, 100)
		for range 3 {
			cpu <- 0.1
		}
		var set []int
		var changes []Change
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() {
			done <- run(ctx, Config{Max: 4, DownAfter: 2}, func() Sample {
				select {
				case c := <-cpu:
					return Sample{CPU: c}
				default:
					return Sample{CPU: 1.9}
				}
			}, func(n int) int { set = append(set, n); return 0 }, func() int { set = append(set, -4); return 4 }, func(c Change) { changes = append(changes, c) })
		}()
		time.Sleep(250*time.Millisecond*3 + time.Millisecond)
		synctest.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// start at 4; the first sample only starts the interval; two light
		// intervals lower to 1; then 1.9 cores need 4 again; on exit, the
		// runtime's own (-4: handed back, 4 Ps).
		want := []int{4, 1, 4, -4}
		if len(set) != len(want) {
			t.Fatalf("set %v, want %v", set, want)
		}
		for i := range want {
			if set[i] != want[i] {
				t.Fatalf("set %v, want %v", set, want)
			}
		}
		if len(changes) != 2 || changes[0].From != 4 || changes[0].To != 1 || changes[1].To != 4 {
			t.Fatalf("changes %+v", changes)
		}
	})
}

// Every LimitEvery, run hands GOMAXPROCS to the runtime for a moment to
// learn what it would pick now (a container resized) and takes that as the
// controller's Max: over it the Ps drop at once, and a raised limit lets
// the load have more.
func TestRunFollowsTheRuntimesLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		limit := 4
		var procs []int // GOMAXPROCS after each call, in order
		var changes []Change
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() {
			done <- run(ctx, Config{Max: 4, DownAfter: 2, LimitEvery: time.Second}, func() Sample {
				return Sample{CPU: 5} // wants every P it may have
			}, func(n int) int { procs = append(procs, n); return 0 }, func() int {
				procs = append(procs, -limit) // handed to the runtime: its value
				return limit
			}, func(c Change) { changes = append(changes, c) })
		}()
		step := func(d time.Duration) { time.Sleep(d); synctest.Wait() }
		step(time.Second + time.Millisecond) // the first check: still 4
		limit = 2                            // resized down
		step(time.Second)
		limit = 8 // and up
		step(time.Second)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		want := []int{4, -4, 4, -2, 2, -8, 8, -8}
		if fmt.Sprint(procs) != fmt.Sprint(want) {
			t.Fatalf("GOMAXPROCS went %v, want %v", procs, want)
		}
		if len(changes) != 2 || changes[0].To != 2 || changes[0].Max != 2 || changes[1].From != 2 || changes[1].To != 8 || changes[1].Max != 8 {
			t.Fatalf("changes %+v", changes)
		}
	})
}

func TestProcessSamplerMeasuresThisProcess(t *testing.T) {
	s, err := newProcessSampler()
	if err != nil {
		t.Fatal(err)
	}
	s.sample()
	end := time.Now().Add(50 * time.Millisecond)
	x := 0
	for time.Now().Before(end) {
		x++
	}
	got := s.sample()
	if got.CPU <= 0.05 || got.CPU > 64 {
		t.Fatalf("a busy loop measured %.2f cores", got.CPU)
	}
	_ = x
}
