package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/traces/synth"
)

func newTraceSynthCmd(stdout io.Writer) *cobra.Command {
	c := synth.Default()
	var out string
	cmd := &cobra.Command{
		Use:   "synth --out FILE.jsonl",
		Short: "Generate a trace with long prompts and heavy prefix reuse (the Mooncake kind)",
		Long: `synth writes a synthetic trace in the Mooncake JSON-lines format (timestamp,
input_length, output_length, hash_ids per 512-token block) that sim, compare and
capacity replay with --trace. Requests arrive by a renewal process (--rate,
--arrival-cv: 1 is Poisson); each opens a session (--new-session) or continues
one of the --active-sessions most recent ones. A session starts with one of
--prefixes shared system prompts of --prefix-tokens (Zipf --prefix-zipf) and a
first message (lognormal --input-median, --input-sigma); each later turn's
prompt is the previous prompt and answer plus a message (--turn-median,
--turn-sigma), until it would pass --input-max. Answers are lognormal
(--output-median, --output-sigma, at most --output-max). The defaults give a
prompt median of about 11.6k tokens, p99 about 65k, and 73% of prompt tokens
reusable with an unlimited cache. The same flags and --seed give the same bytes.`,
		Example: `  inferrail trace synth --out long.jsonl
  inferrail trace synth --requests 20000 --rate 8 --arrival-cv 2 --out bursty.jsonl
  inferrail compare --trace long.jsonl --profile Llama-3.1-8B@H200 --replicas 16 --out runs/long`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out: name the trace file to write, for example --out long.jsonl")
			}
			if err := c.Validate(); err != nil {
				return usagef("trace synth: %w", err)
			}
			tmp, err := os.CreateTemp(filepath.Dir(out), ".synth-*")
			if err != nil {
				return fmt.Errorf("trace synth: %w", err)
			}
			if err := synth.Generate(tmp, c); err != nil {
				tmp.Close()
				os.Remove(tmp.Name())
				return err
			}
			if err := tmp.Close(); err != nil {
				os.Remove(tmp.Name())
				return fmt.Errorf("trace synth: %w", err)
			}
			if err := os.Rename(tmp.Name(), out); err != nil {
				os.Remove(tmp.Name())
				return fmt.Errorf("trace synth: %w", err)
			}
			fmt.Fprintf(stdout, "wrote %d requests to %s\n", c.Requests, out)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&out, "out", "", "the trace file to write (Mooncake JSON lines)")
	fl.IntVar(&c.Requests, "requests", c.Requests, "requests to generate")
	fl.Uint64Var(&c.Seed, "seed", c.Seed, "random seed")
	fl.Float64Var(&c.Rate, "rate", c.Rate, "mean arrivals per second")
	fl.Float64Var(&c.ArrivalCV, "arrival-cv", c.ArrivalCV, "coefficient of variation of the gaps between arrivals (1: Poisson; above 1: bursts)")
	fl.Float64Var(&c.NewSession, "new-session", c.NewSession, "probability that a request opens a new session")
	fl.IntVar(&c.ActiveSessions, "active-sessions", c.ActiveSessions, "recent sessions a request may continue")
	fl.IntVar(&c.Prefixes, "prefixes", c.Prefixes, "shared system prompts (0: none)")
	fl.IntVar(&c.PrefixTokens, "prefix-tokens", c.PrefixTokens, "tokens of each shared system prompt")
	fl.Float64Var(&c.PrefixZipf, "prefix-zipf", c.PrefixZipf, "Zipf exponent of the system prompts' popularity (above 1)")
	fl.IntVar(&c.InputMedian, "input-median", c.InputMedian, "median tokens of a session's first message (after the system prompt)")
	fl.Float64Var(&c.InputSigma, "input-sigma", c.InputSigma, "lognormal sigma of the first message's length")
	fl.IntVar(&c.TurnMedian, "turn-median", c.TurnMedian, "median tokens of each later message")
	fl.Float64Var(&c.TurnSigma, "turn-sigma", c.TurnSigma, "lognormal sigma of a later message's length")
	fl.IntVar(&c.InputMax, "input-max", c.InputMax, "longest prompt; a session that would pass it ends")
	fl.IntVar(&c.OutputMedian, "output-median", c.OutputMedian, "median answer tokens")
	fl.Float64Var(&c.OutputSigma, "output-sigma", c.OutputSigma, "lognormal sigma of the answer's length")
	fl.IntVar(&c.OutputMax, "output-max", c.OutputMax, "longest answer")
	fl.IntVar(&c.BlockTokens, "block-tokens", c.BlockTokens, "tokens per hash id")
	return cmd
}
