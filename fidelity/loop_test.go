package fidelity

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"

	"github.com/inferrail/inferrail/bench"
	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/internal/testfleet"
	"github.com/inferrail/inferrail/live"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/traces"
	"github.com/inferrail/inferrail/workload"
)

// The loop end to end on virtual time: W1 through bench -> live (cost_model,
// kv admission, recording on) -> 3 mock engines, then Check on the file the
// recorder wrote. The simulator's TTFT p50 and p99 are within 10% of what
// live measured, its hit rate within 0.02, every request is matched, and
// each simulated replica stands for a recorded one.
func TestLoopRecordedFidelity(t *testing.T) {
	n := 900
	if testing.Short() {
		n = 300
	}
	wl, err := workload.DefaultConfig("w1")
	if err != nil {
		t.Fatal(err)
	}
	wl.Requests, wl.Rate, wl.Seed = n, fleet.DefaultRate("w1", 3), 3
	dir := t.TempDir()
	out := runLoop(t, wl, filepath.Join(dir, "rec.parquet"))
	if out.Summary.Failed != 0 {
		t.Fatalf("%d of %d failed through the gateway", out.Summary.Failed, n)
	}
	files, err := filepath.Glob(filepath.Join(dir, "rec-*.parquet"))
	if err != nil || len(files) != 1 {
		t.Fatalf("the recorder wrote %v (%v), want one file", files, err)
	}
	meta, err := traces.ReadRecordingMeta(files[0])
	if err != nil {
		t.Fatal(err)
	}
	r, err := traces.NewParquet(files[0], traces.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var o Options
	o.UseRecording(meta)
	res, err := CheckReader(r, o)
	if err != nil {
		t.Fatal(err)
	}
	ov := &res.Overall
	t.Logf("%d recorded, %d matched; TTFT p50 %.2f/%.2f ms (%s), p99 %.1f/%.1f ms (%s), MAPE %s; hit rate %.4f/%.4f; E2E p50 %s; pairing %.3f",
		res.Counts.Records, res.Counts.Matched, ov.TTFT.Measured.P50, ov.TTFT.Predicted.P50, fmtRel(ov.TTFT.RelError.P50),
		ov.TTFT.Measured.P99, ov.TTFT.Predicted.P99, fmtRel(ov.TTFT.RelError.P99), fmtOpt(ov.TTFT.MAPE, "%"),
		ov.TokenHitRate.Measured, ov.TokenHitRate.Predicted, fmtRel(ov.E2E.RelError.P50), res.Mapping.Agreement)
	if res.Counts.Records != n || res.Counts.Matched != n || res.Policy != "cost_model" || res.PolicyFrom != "metadata" || res.Replicas != 3 {
		t.Fatalf("recorded %d, matched %d of %d; policy %s from %s on %d replicas", res.Counts.Records, res.Counts.Matched, n, res.Policy, res.PolicyFrom, res.Replicas)
	}
	for name, e := range map[string]*float64{"TTFT p50": ov.TTFT.RelError.P50, "TTFT p99": ov.TTFT.RelError.P99} {
		if e == nil || *e > 0.10 || *e < -0.10 {
			t.Errorf("%s: the simulator is off by %s, more than 10%%", name, fmtRel(e))
		}
	}
	if d := ov.TokenHitRate.Diff; d > 0.02 || d < -0.02 || ov.TokenHitRate.Measured < 0.3 {
		t.Errorf("hit rate: measured %.4f, predicted %.4f: want a real hit rate and at most 0.02 apart", ov.TokenHitRate.Measured, ov.TokenHitRate.Predicted)
	}
	if !res.Mapping.Meaningful {
		t.Errorf("per-replica pairing not meaningful: %s", res.Mapping.Why)
	}
	if *flagOut != "" {
		res.Trace = filepath.Base(files[0])
		if _, err := res.Write(*flagOut); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(files[0])
		if err == nil {
			err = os.WriteFile(filepath.Join(*flagOut, filepath.Base(files[0])), data, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// runLoop runs wl through bench -> live (cost_model, kv admission, the
// approximate index, builtin:sim, recording to path) -> 3 mock engines of
// the default profile on virtual time, as live/fidelity_test.go does, and
// returns what bench measured. Every request asks for exactly its output
// length (bench sends max_tokens with ignore_eos).
func runLoop(t *testing.T, wl workload.Config, path string) *bench.Output {
	t.Helper()
	ec := engine.DefaultConfig()
	var out *bench.Output
	synctest.Test(t, func(t *testing.T) {
		out = testfleet.Run(t, testfleet.Config{Engine: ec, Replicas: 3, Workload: wl,
			Gateway: func(reps []config.Replica, tr http.RoundTripper) (testfleet.Gateway, error) {
				o := config.Default()
				o.Record.Path, o.Record.Salt = path, "fidelity-loop-test-salt"
				mo := config.DefaultModel()
				mo.Name, mo.Policy, mo.Index, mo.MaxConcurrency, mo.MaxPending = server.DefaultModelName, "cost_model", config.IndexApproximate, 1024, 1024
				mo.MaxModelLen = ec.MaxModelLen // as the simulator's core knows it
				mo.Replicas = reps
				o.Models = []config.Model{mo}
				return live.New(&o, live.Deps{Transport: tr})
			}})
	})
	return out
}
