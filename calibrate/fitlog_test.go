package calibrate

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
)

// findShared walks up from the package directory to find shared/rel.
func findShared(rel string) (string, error) {
	dir, _ := os.Getwd()
	for range 6 {
		p := filepath.Join(dir, "shared", rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		dir = filepath.Dir(dir)
	}
	return "", os.ErrNotExist
}

// sharedDir is findShared that skips the test when the data is absent.
func sharedDir(t testing.TB, rel string) string {
	t.Helper()
	p, err := findShared(rel)
	if err != nil {
		t.Skipf("shared data %s not found (it lives in ../shared next to the repository); skipping", rel)
	}
	return p
}

func TestFitLogShared(t *testing.T) {
	for _, run := range []string{"RTX4090-Llama-3.1-8B", "RTXPRO6000-Qwen3-32B"} {
		t.Run(run, func(t *testing.T) {
			l, err := ReadLog(sharedDir(t, "traces/vllm-logs/"+run), ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			opts := LogOptions{Holdout: 0.5}
			if testing.Short() {
				opts.MaxEvaluations = 80
			}
			fit, err := FitLog(l, opts)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(fit.Profile)
			t.Logf("profile %s; fit TTFT %.2f%% E2E %.2f%%; holdout TTFT %.2f%% E2E %.2f%%; start E2E %.1f%%; %d replays, %.1fs",
				b, fit.Fit.TTFTMAPE, fit.Fit.E2EMAPE, fit.Holdout.TTFTMAPE, fit.Holdout.E2EMAPE, fit.StartFit.E2EMAPE, fit.Evaluations, fit.WallS)
			// The project's goals: E2E MAPE within 5%, TTFT within 10%, on held-out requests.
			if !testing.Short() && (fit.Holdout.E2EMAPE > 5 || fit.Holdout.TTFTMAPE > 10) {
				t.Errorf("holdout TTFT MAPE %.2f%%, E2E MAPE %.2f%%: goals are 10%% and 5%%", fit.Holdout.TTFTMAPE, fit.Holdout.E2EMAPE)
			}
		})
	}
}

// synthLog runs requests through the engine with profile p and records what
// it measured, as a vLLM log would.
func synthLog(t testing.TB, p engine.Profile, n int, seed uint64) *Log {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	cfg := engine.DefaultConfig()
	l := &Log{Name: "synthetic", Config: cfg}
	var at time.Duration
	for range n {
		at += time.Duration(rng.ExpFloat64() * float64(150*time.Millisecond))
		l.Requests = append(l.Requests, LogRequest{Arrival: at, PromptTokens: 50 + rng.IntN(3000), OutputTokens: 1 + rng.IntN(400)})
	}
	rp := newReplayer(l)
	if err := rp.run(p); err != nil {
		t.Fatal(err)
	}
	for i := range l.Requests {
		l.Requests[i].TTFT, l.Requests[i].E2E, l.Requests[i].Queue = rp.first[i].Seconds(), rp.last[i].Seconds(), rp.sched[i].Seconds()
	}
	return l
}

func TestFitLogSynthetic(t *testing.T) {
	truth := engine.DefaultConfig().Latency
	l := synthLog(t, truth, 120, 3)
	start := scale(truth, 1.7)
	start.PrefillPairNs = 1
	fit, err := FitLog(l, LogOptions{Holdout: 0.25, Start: start, MaxEvaluations: 250})
	if err != nil {
		t.Fatal(err)
	}
	if fit.StartFit.E2EMAPE < 20 {
		t.Fatalf("the start profile should be far off, got E2E MAPE %.1f%%", fit.StartFit.E2EMAPE)
	}
	if fit.Fit.E2EMAPE > 3 || fit.Fit.TTFTMAPE > 8 || fit.Holdout.E2EMAPE > 3 {
		t.Errorf("fit E2E %.2f%% TTFT %.2f%%, holdout E2E %.2f%%: the truth is reachable", fit.Fit.E2EMAPE, fit.Fit.TTFTMAPE, fit.Holdout.E2EMAPE)
	}
	if fit.Fit.Requests != 90 || fit.Holdout.Requests != 30 {
		t.Errorf("split %d/%d, want 90/30", fit.Fit.Requests, fit.Holdout.Requests)
	}
	// Same input, same output, bit for bit (wall time aside).
	again, _ := FitLog(l, LogOptions{Holdout: 0.25, Start: start, MaxEvaluations: 250})
	if again.Profile != fit.Profile || !reflect.DeepEqual(again.Fit, fit.Fit) {
		t.Errorf("not deterministic: %+v vs %+v", again.Profile, fit.Profile)
	}
}

func TestFitLogOptionErrors(t *testing.T) {
	l := synthLog(t, engine.DefaultConfig().Latency, 5, 1)
	for _, o := range []LogOptions{{Holdout: 1}, {Holdout: -0.1}, {MaxEvaluations: -1}, {Start: engine.Profile{StepFixedMs: -1}}} {
		if _, err := FitLog(l, o); err == nil {
			t.Errorf("%+v: want an error", o)
		}
	}
}

// BenchmarkLogReplay measures one objective evaluation of FitLog: a replay
// of the RTX 4090 log (300 requests), or a synthetic one without shared data.
func BenchmarkLogReplay(b *testing.B) {
	var l *Log
	if dir, err := findShared("traces/vllm-logs/RTX4090-Llama-3.1-8B"); err == nil {
		if l, err = ReadLog(dir, ReadOptions{}); err != nil {
			b.Fatal(err)
		}
	} else {
		l = synthLog(b, engine.DefaultConfig().Latency, 300, 1)
	}
	rp := newReplayer(l)
	p := engine.DefaultConfig().Latency
	b.ReportAllocs()
	for b.Loop() {
		if err := rp.run(p); err != nil {
			b.Fatal(err)
		}
	}
}
