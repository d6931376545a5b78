package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/router/tokenize"
)

func newTokenizeCmd(stdout, _ io.Writer) *cobra.Command {
	var spec string
	var addSpecial bool
	cmd := &cobra.Command{
		Use:   "tokenize",
		Short: "Encode texts to token ids with a Hugging Face tokenizer.json",
		Long: `tokenize reads a JSON array of strings on stdin and prints a JSON array of
token-id arrays on stdout, with the same ids as the Hugging Face tokenizers
library. --tokenizer names a model directory (tokenizer.json and
tokenizer_config.json), a tokenizer.json file, or builtin:sim.`,
		Example: `  echo '["Hello world", "<|im_start|>user\nHi<|im_end|>"]' | inferrail tokenize --tokenizer ../shared/tokenizers/qwen2_5
  echo '["Hello"]' | inferrail tokenize --tokenizer ../shared/tokenizers/mistral_7b/tokenizer.json --add-special-tokens`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if spec == "" {
				return usagef("--tokenizer: required (a model directory, a tokenizer.json path, or %s)", tokenize.BuiltinSim)
			}
			enc, err := tokenize.Load(spec)
			if err != nil {
				return usagef("--tokenizer: %w", err)
			}
			var texts []string
			if err := json.NewDecoder(bufio.NewReader(cmd.InOrStdin())).Decode(&texts); err != nil {
				return usagef("stdin: want a JSON array of strings: %w", err)
			}
			out := make([][]uint32, len(texts))
			for i, s := range texts {
				out[i] = enc.EncodeTo(make([]uint32, 0, len(s)/3+4), s, addSpecial)
			}
			w := bufio.NewWriter(stdout)
			if err := json.NewEncoder(w).Encode(out); err != nil {
				return fmt.Errorf("write ids: %w", err)
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&spec, "tokenizer", "", "model directory, tokenizer.json path, or "+tokenize.BuiltinSim)
	cmd.Flags().BoolVar(&addSpecial, "add-special-tokens", false, "let the post-processor add its tokens (BOS for Llama/Mistral), as the completions endpoint does")
	return cmd
}
