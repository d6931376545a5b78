package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/inferrail/inferrail/router/tokenize"
)

func newTokenizeCmd(stdout, _ io.Writer) *cobra.Command {
	var spec, templatePath string
	var addSpecial, chatMode, completion bool
	cmd := &cobra.Command{
		Use:   "tokenize",
		Short: "Encode texts or chat requests to token ids as vLLM would",
		Long: `tokenize prints token ids with the same ids as the Hugging Face tokenizers
library. --tokenizer names a model directory (tokenizer.json and
tokenizer_config.json), a tokenizer.json file, or builtin:sim.

Without --chat or --completion it reads a JSON array of strings on stdin and
prints a JSON array of id arrays; --add-special-tokens lets tokenizer.json's
post-processor add its tokens.

--completion reads the same array and applies vLLM's /v1/completions rule:
special tokens added, with tokenizer_config.json's add_bos_token and
add_eos_token applied as transformers applies them.

--chat reads one OpenAI chat request body on stdin, renders it with the
model's chat template (or --chat-template FILE) and prints one JSON array of
ids, tokenized as vLLM's /v1/chat/completions does: without special tokens
unless the body sets "add_special_tokens": true or --add-special-tokens is
given.`,
		Example: `  echo '["Hello world", "<|im_start|>user\nHi<|im_end|>"]' | inferrail tokenize --tokenizer ../shared/tokenizers/qwen2_5
  echo '["Hello"]' | inferrail tokenize --tokenizer ../shared/tokenizers/mistral_7b --completion
  echo '{"messages":[{"role":"user","content":"Hi"}]}' | inferrail tokenize --tokenizer ../shared/tokenizers/qwen3 --chat`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if spec == "" {
				return usagef("--tokenizer: required (a model directory, a tokenizer.json path, or %s)", tokenize.BuiltinSim)
			}
			if chatMode && completion {
				return usagef("--chat and --completion: pick one (a chat request body, or an array of prompts)")
			}
			if completion && addSpecial {
				return usagef("--completion already adds special tokens as vLLM's completions endpoint does: drop --add-special-tokens")
			}
			if templatePath != "" && !chatMode {
				return usagef("--chat-template: only used with --chat")
			}
			var opts tokenize.Options
			if templatePath != "" {
				src, err := os.ReadFile(templatePath)
				if err != nil {
					return usagef("--chat-template: %w", err)
				}
				opts.ChatTemplate = string(src)
			}
			m, err := tokenize.LoadModel(spec, opts)
			if err != nil {
				return usagef("--tokenizer: %w", err)
			}
			if chatMode && !m.HasChatTemplate() {
				return usagef("--chat: %s has no chat template: give the model directory whose tokenizer_config.json has a chat_template, or --chat-template FILE", spec)
			}
			in := bufio.NewReader(cmd.InOrStdin())
			var out any
			if chatMode {
				body, err := io.ReadAll(in)
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				ids, err := m.AppendChat(make([]uint32, 0, len(body)/3+4), body, addSpecial)
				if err != nil {
					return usagef("stdin: %w", err)
				}
				out = ids
			} else {
				var texts []string
				if err := json.NewDecoder(in).Decode(&texts); err != nil {
					return usagef("stdin: want a JSON array of strings: %w", err)
				}
				all := make([][]uint32, len(texts))
				for i, s := range texts {
					dst := make([]uint32, 0, len(s)/3+4)
					if completion {
						all[i] = m.AppendCompletion(dst, s)
					} else {
						all[i] = m.Encoder().EncodeTo(dst, s, addSpecial)
					}
				}
				out = all
			}
			w := bufio.NewWriter(stdout)
			if err := json.NewEncoder(w).Encode(out); err != nil {
				return fmt.Errorf("write ids: %w", err)
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&spec, "tokenizer", "", "model directory, tokenizer.json path, or "+tokenize.BuiltinSim)
	cmd.Flags().BoolVar(&addSpecial, "add-special-tokens", false, "add special tokens: tokenizer.json's post-processor for texts; with --chat, the completions rule whatever the body says")
	cmd.Flags().BoolVar(&chatMode, "chat", false, "read one OpenAI chat request body and print the ids of its rendered prompt")
	cmd.Flags().BoolVar(&completion, "completion", false, "encode each string as vLLM's /v1/completions endpoint does (BOS/EOS as tokenizer_config.json asks)")
	cmd.Flags().StringVar(&templatePath, "chat-template", "", "Jinja2 chat template file replacing the model's (needed for a bare tokenizer.json)")
	return cmd
}
