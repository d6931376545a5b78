package main

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// The library's validation names settings; the command line names them by
// their flags (flagFor), one line each, exit code 2, before anything runs.
func TestCLIValidationSpeaksInFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		mention string
	}{
		{[]string{"sim", "--replicas", "0"}, "--replicas: must be between 1 and 4096, got 0"},
		{[]string{"sim", "--rate", "2e6"}, "--rate: must be at most 1000000 requests per second"},
		{[]string{"sim", "--rate", "-1"}, "--rate: must be a finite number > 0"},
		{[]string{"sim", "--requests", "20000000"}, "--requests: must be at most 10000000"},
		{[]string{"sim", "--requests", "-3"}, "--requests: must be >= 0"},
		{[]string{"sim", "--scrape-interval", "10us"}, "--scrape-interval: must be at least 1ms"},
		{[]string{"sim", "--index", "psychic"}, "--index: must be one of"},
		{[]string{"sim", "--kv-event-delay", "-1s"}, "--kv-event-delay: must be zero or positive"},
		{[]string{"sim", "--warmup", "-1s"}, "--warmup: must be zero or positive"},
		{[]string{"sim", "--duration", "10s", "--warmup", "20s"}, "--warmup: must be shorter than the run's duration"},
		{[]string{"sim", "--policy", "psychic"}, `--policy: unknown policy "psychic"`},
		{[]string{"sim", "--slo-ttft", "0s"}, "--slo-ttft, --slo-tpot or --slo: ttft p99 must be positive"},
		{[]string{"sim", "--set", "w1.prompts=0"}, "--set w1.prompts: "},
		{[]string{"compare", "--policies", "round_robin", "--rates", "1,0"}, "--rates: each must be a positive number"},
		{[]string{"capacity", "--policies", "round_robin", "--max-replicas", "0"}, "--max-replicas: must be between 1 and 4096"},
	} {
		code, out, errOut := runCLIWithin(t, time.Minute, tc.args...)
		wantUsage(t, tc.args, code, out, errOut, tc.mention)
	}
}

// flagErrors reaches every error of a joined list, through the wrapping
// that names its section, and leaves a setting no flag sets as it was.
func TestFlagErrorsRewritesEachJoinedError(t *testing.T) {
	inner := errors.Join(errors.New("rate: must be positive"), errors.New("w2.turns_min: must be at least 1"))
	err := errors.Join(errors.New("replicas: must be between 1 and 4096, got 0"), fmt.Errorf("workload: %w", inner), errors.New("profile: block_size: must be 16"))
	got := flagErrors(err).Error()
	want := "--replicas: must be between 1 and 4096, got 0\n--rate: must be positive\n--set w2.turns_min: must be at least 1\n--profile: block_size: must be 16"
	if got != want {
		t.Errorf("flagErrors:\n%s\nwant:\n%s", got, want)
	}
	var u usageError
	if !errors.As(flagErrors(err), &u) {
		t.Error("flagErrors does not return a usage error")
	}
}
