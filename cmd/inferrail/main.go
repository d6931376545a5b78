package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError marks bad input: the process exits with code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// run executes the CLI and returns the process exit code: 0 on success, 2 for
// bad input, 1 for any other failure.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "inferrail: "+oneLine(err))
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}

// oneLine folds a joined, multi-line error into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "inferrail",
		Short: "KV-cache-aware routing for LLM inference fleets, and the simulator that proves it",
		Long: `inferrail routes LLM requests to the replica that already holds most of their
prompt in its KV cache, without letting any replica overload, and proves it by
simulation: the real router code against virtual vLLM fleets. The same router
runs as a production proxy (live) in front of real engines, or of mock ones
(engine) that run the simulator's engine model on real time.`,
		Example: `  inferrail sim --workload w1 --policy cost_model --replicas 4
  inferrail compare --workload w1 --policies round_robin,cost_model --seeds 3 --out runs/w1
  inferrail capacity --workload w1 --policies all --slo ttft_p99=2s,tpot_p99=100ms
  inferrail trace stats ../shared/traces/mooncake/conversation_trace.jsonl
  inferrail engine --port 8001 &
  inferrail live --config examples/live.yaml
  inferrail bench --base-url http://127.0.0.1:8080 --workload w1 --replicas 3 --requests 500
  inferrail calibrate --from-log ../shared/traces/vllm-logs/RTX4090-Llama-3.1-8B --holdout 0.5 --out rtx4090.yaml`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newSimCmd(stdout, stderr), newCompareCmd(stdout, stderr), newCapacityCmd(stdout, stderr), newTraceCmd(stdout, stderr),
		newEngineCmd(stdout, stderr), newBenchCmd(stdout, stderr), newCalibrateCmd(stdout, stderr),
		newTokenizeCmd(stdout, stderr), newLiveCmd(stdout, stderr))
	return root
}

// noArgs rejects positional arguments as bad input.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q (flags start with --)", cmd.CommandPath(), args[0])
	}
	return nil
}
