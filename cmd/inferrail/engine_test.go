package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"
)

// The data-parallel and output-lag settings reach the server's engine from
// the profile's YAML, and the vLLM-named flags override the profile.
func TestEngineDataParallelFlagsAndProfile(t *testing.T) {
	profile := filepath.Join(t.TempDir(), "dp.yaml")
	yaml := "data_parallel_size: 3\nenable_expert_parallel: true\nlatency:\n  output_lag_steps: 1\n  output_delay_ms: 2.5\n"
	if err := os.WriteFile(profile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		ranks int
		ep    bool
		lag   float64
	}{
		{nil, 1, false, 0},
		{[]string{"--data-parallel-size", "2", "--enable-expert-parallel"}, 2, true, 0},
		{[]string{"--profile", profile}, 3, true, 1},
		{[]string{"--profile", profile, "--data-parallel-size", "4"}, 4, true, 1},
	} {
		var f engineFlags
		cmd := &cobra.Command{}
		f.addFlags(cmd)
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := f.config(cmd)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		e := cfg.Engine
		if e.Ranks() != tc.ranks || e.ExpertParallel != tc.ep || e.Latency.OutputLagSteps != tc.lag {
			t.Errorf("%v: %d ranks, expert parallel %v, lag %v; want %d, %v, %v", tc.args, e.Ranks(), e.ExpertParallel, e.Latency.OutputLagSteps, tc.ranks, tc.ep, tc.lag)
		}
		if tc.lag != 0 && e.Latency.OutputDelayMs != 2.5 {
			t.Errorf("%v: output delay %v ms, want 2.5", tc.args, e.Latency.OutputDelayMs)
		}
	}
}
