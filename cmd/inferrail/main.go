package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/internal/procs"
)

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr, procs.KeepMonitorAwake))
}

// usageError marks bad input: the process exits with code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// run executes the CLI in this process, as tests do, and returns the
// process exit code: 0 on success, 2 for bad input, 1 for any other failure.
func run(args []string, stdout, stderr io.Writer) int {
	return execute(args, stdout, stderr, nil)
}

// execute is run with what only main gives: keepAwake, which live, epp
// and engine call before they open anything (with sysmon: awake) to execute the
// program again with Go's runtime monitor kept awake.
func execute(args []string, stdout, stderr io.Writer, keepAwake func() error) int {
	root := newRootCmdWith(stdout, stderr, keepAwake)
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

func newRootCmd(stdout, stderr io.Writer) *cobra.Command { return newRootCmdWith(stdout, stderr, nil) }

func newRootCmdWith(stdout, stderr io.Writer, keepAwake func() error) *cobra.Command {
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
	root.Version = version()
	root.AddCommand(newSimCmd(stdout, stderr), newCompareCmd(stdout, stderr), newCapacityCmd(stdout, stderr), newTraceCmd(stdout, stderr),
		newEngineCmd(stdout, stderr, keepAwake), newBenchCmd(stdout, stderr), newCalibrateCmd(stdout, stderr),
		newTokenizeCmd(stdout, stderr), newLiveCmd(stdout, stderr, keepAwake), newVersionCmd(stdout))
	root.AddCommand(newEPPCmd(stdout, stderr, keepAwake))
	root.AddCommand(newFidelityCmd(stdout, stderr))
	root.AddCommand(newKeysCmd(stdout, stderr), newUsageCmd(stdout))
	root.AddCommand(newExplainCmd(stdout))
	// cobra adds help and completion when it runs; add them now so that
	// they are guarded like the rest.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	registerCompletions(root)
	guardGroups(root)
	guardHelp(root)
	return root
}

func newVersionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of inferrail (as --version does)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(stdout, "%s version %s\n", cmd.Root().Name(), cmd.Root().Version)
			return err
		},
	}
}

// guardGroups makes every command group (a command with subcommands and no
// action of its own) refuse an unknown subcommand as bad input; without one
// it prints its help, as cobra does.
func guardGroups(c *cobra.Command) {
	for _, sub := range c.Commands() {
		guardGroups(sub)
	}
	if !c.HasSubCommands() || c.Runnable() {
		return
	}
	c.Args = cobra.ArbitraryArgs
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		return unknownCommand(cmd, args[0])
	}
}

// guardHelp makes `help` refuse a topic that names no command.
func guardHelp(root *cobra.Command) {
	for _, h := range root.Commands() {
		if h.Name() != "help" || h.Run == nil {
			continue
		}
		show := h.Run
		h.Run = nil
		h.RunE = func(cmd *cobra.Command, args []string) error {
			if target, rest, err := cmd.Root().Find(args); err == nil && target.HasSubCommands() && len(rest) > 0 {
				return unknownCommand(target, rest[0])
			}
			show(cmd, args)
			return nil
		}
	}
}

// unknownCommand is the usage error for a subcommand c does not have: it
// names the ones it has.
func unknownCommand(c *cobra.Command, name string) error {
	var valid []string
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() || sub.Name() == "help" {
			valid = append(valid, sub.Name())
		}
	}
	hint := ""
	if s := c.SuggestionsFor(name); len(s) > 0 {
		hint = fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
	}
	return usagef("unknown command %q for %q%s: want one of %s", name, c.CommandPath(), hint, strings.Join(valid, ", "))
}

// noArgs rejects positional arguments as bad input.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q (flags start with --)", cmd.CommandPath(), args[0])
	}
	return nil
}
