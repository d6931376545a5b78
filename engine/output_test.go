package engine

import (
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

func TestProfileOutputAt(t *testing.T) {
	for _, tc := range []struct {
		lag, delay   float64
		end, d, prev time.Duration
		want         time.Duration
	}{
		{0, 0, 50 * time.Millisecond, 10 * time.Millisecond, 40 * time.Millisecond, 50 * time.Millisecond},
		{1, 0, 50 * time.Millisecond, 10 * time.Millisecond, 0, 60 * time.Millisecond},
		{0.5, 2, 50 * time.Millisecond, 10 * time.Millisecond, 0, 57 * time.Millisecond},
		{1, 2, 50 * time.Millisecond, 10 * time.Millisecond, 90 * time.Millisecond, 90 * time.Millisecond}, // never before the previous
		{0, 0.0015, time.Millisecond, time.Millisecond, 0, time.Millisecond + 1500*time.Nanosecond},
		{1.0 / 3, 0, 0, 10, 0, 3}, // rounded to the nanosecond
	} {
		p := Profile{OutputLagSteps: tc.lag, OutputDelayMs: tc.delay}
		if got := p.OutputAt(tc.end, tc.d, tc.prev); got != tc.want {
			t.Errorf("lag %v delay %v: OutputAt(%v, %v, %v) = %v, want %v", tc.lag, tc.delay, tc.end, tc.d, tc.prev, got, tc.want)
		}
	}
}

// With one step of lag and 2 ms of output delay, a lone request's first
// token reaches the API server one prefill step after the prefill ends,
// plus 2 ms, and every later token one decode step after its step, plus
// 2 ms (TestHandComputedTimings has the step times).
func TestOutputLagHandComputed(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Latency.OutputLagSteps = 1
	cfg.Latency.OutputDelayMs = 2
	e, _ := New(cfg)
	if err := e.Add(0, mkReq(1, 16, []kvblock.Segment{{ID: 1, Len: 100}}, 3)); err != nil {
		t.Fatal(err)
	}
	type step struct{ end, out time.Duration }
	want := []step{
		{ms(21.0165), ms(21.0165 + 21.0165 + 2)},       // prefill: TTFT 44.033 ms
		{ms(33.179428), ms(33.179428 + 12.162928 + 2)}, // 47.342356
		{ms(45.342484), ms(45.342484 + 12.163056 + 2)}, // 59.50554: E2E
	}
	var now time.Duration
	for i, w := range want {
		res := e.Step(now)
		if d := absDur(res.End() - w.end); d > time.Nanosecond {
			t.Fatalf("step %d ends at %v, want %v", i, res.End(), w.end)
		}
		if d := absDur(res.OutputAt - w.out); d > 2*time.Nanosecond {
			t.Fatalf("step %d: tokens out at %v, want %v", i, res.OutputAt, w.out)
		}
		if len(res.Emitted) != 1 || res.Emitted[0].Output != i+1 {
			t.Fatalf("step %d emitted %+v", i, res.Emitted)
		}
		// The scheduler moves on at the step's end, not at its output.
		if at, ok := e.NextStep(); ok && at != res.End() {
			t.Fatalf("step %d: next step at %v, want the end %v", i, at, res.End())
		}
		now = res.End()
	}
	if e.Len() != 0 {
		t.Fatal("request not finished after three steps")
	}
}

// A short step after a long one would deliver its tokens before the long
// step's: OutputAt waits for the previous step's instead.
func TestOutputLagIsMonotone(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Latency.OutputLagSteps = 1
	e, _ := New(cfg)
	e.Add(0, mkReq(1, 16, []kvblock.Segment{{ID: 1, Len: 16}}, 20))
	var now time.Duration
	var outs []time.Duration
	var durs []time.Duration
	clamped := 0
	for i := 0; ; i++ {
		if i == 3 { // a long prompt joins a decoding request
			e.Add(now, mkReq(2, 16, []kvblock.Segment{{ID: 2, Len: 1800}}, 2))
		}
		if _, ok := e.NextStep(); !ok {
			break
		}
		res := e.Step(now)
		if n := len(outs); n > 0 {
			free := res.End() + res.Duration
			switch {
			case res.OutputAt < outs[n-1]:
				t.Fatalf("step %d out at %v before the previous step's %v", i, res.OutputAt, outs[n-1])
			case free < outs[n-1]:
				if res.OutputAt != outs[n-1] {
					t.Fatalf("step %d: out at %v, want the previous step's %v", i, res.OutputAt, outs[n-1])
				}
				clamped++
			case res.OutputAt != free:
				t.Fatalf("step %d: out at %v, want end+duration %v", i, res.OutputAt, free)
			}
		}
		outs = append(outs, res.OutputAt)
		durs = append(durs, res.Duration)
		now = res.End()
	}
	// The long prefill step (about 0.19 s) is followed by decode steps of
	// about 12 ms: the first waits for the prefill step's output.
	if clamped == 0 {
		t.Fatalf("no step waited for its predecessor's output (durations %v)", durs)
	}
}

// Under any schedule OutputAt is at least End, never decreases, and is
// End itself without lag terms.
func TestOutputAtProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.NumGPUBlocks = rapid.IntRange(16, 200).Draw(t, "blocks")
		cfg.MaxNumBatchedTokens = rapid.IntRange(16, 512).Draw(t, "budget")
		cfg.Latency.OutputLagSteps = rapid.Float64Range(0, 8).Draw(t, "lag")
		cfg.Latency.OutputDelayMs = rapid.Float64Range(0, 20).Draw(t, "delay")
		if rapid.Bool().Draw(t, "zero") {
			cfg.Latency.OutputLagSteps, cfg.Latency.OutputDelayMs = 0, 0
		}
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var now, prev time.Duration
		id := RequestID(0)
		for range rapid.IntRange(1, 60).Draw(t, "ops") {
			if rapid.Bool().Draw(t, "add") {
				id++
				e.Add(now, mkReq(id, 16, []kvblock.Segment{{ID: rapid.Uint64Range(1, 3).Draw(t, "seg"), Len: rapid.IntRange(1, 300).Draw(t, "len")}}, rapid.IntRange(1, 30).Draw(t, "out")))
				continue
			}
			at, ok := e.NextStep()
			if !ok {
				continue
			}
			now = max(now, at)
			res := e.Step(now)
			if res.OutputAt < res.End() || res.OutputAt < prev {
				t.Fatalf("output at %v: end %v, previous %v", res.OutputAt, res.End(), prev)
			}
			if cfg.Latency.OutputLagSteps == 0 && cfg.Latency.OutputDelayMs == 0 && res.OutputAt != res.End() {
				t.Fatalf("no lag, yet output at %v != end %v", res.OutputAt, res.End())
			}
			prev = res.OutputAt
			now = res.End()
		}
	})
}
