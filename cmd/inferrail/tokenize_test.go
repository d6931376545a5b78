package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// withStdin runs f with os.Stdin reading text.
func withStdin(t *testing.T, text string, f func()) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "stdin.json")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	old := os.Stdin
	os.Stdin = in
	defer func() { os.Stdin = old }()
	f()
}

func TestTokenizeCommand(t *testing.T) {
	var code int
	var out, errOut string
	withStdin(t, `["hello world", ""]`, func() { code, out, errOut = runCLI("tokenize", "--tokenizer", "builtin:sim") })
	var ids [][]uint32
	if code != 0 || json.Unmarshal([]byte(out), &ids) != nil || len(ids) != 2 || len(ids[0]) == 0 || ids[1] == nil {
		t.Fatalf("builtin:sim: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	// builtin:sim chat: the mock engine's template.
	withStdin(t, `{"messages":[{"role":"user","content":"hello world"}]}`, func() { code, out, errOut = runCLI("tokenize", "--tokenizer", "builtin:sim", "--chat") })
	var chatIDs []uint32
	if code != 0 || json.Unmarshal([]byte(out), &chatIDs) != nil || len(chatIDs) == 0 {
		t.Errorf("builtin:sim --chat: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	shared := filepath.Join("..", "..", "..", "shared", "tokenizers")
	if _, err := os.Stat(shared); err != nil {
		t.Log("../shared/tokenizers absent: skipping the cases on real tokenizers")
	} else {
		mistral := filepath.Join(shared, "mistral_7b")
		for _, c := range []struct {
			args  []string
			stdin string
			want  string
		}{
			{[]string{"--tokenizer", mistral, "--add-special-tokens"}, `["Hello"]`, "[[1,22557]]"},
			{[]string{"--tokenizer", mistral}, `["Hello"]`, "[[22557]]"},
			{[]string{"--tokenizer", mistral, "--completion"}, `["Hello", ""]`, "[[1,22557],[1]]"},
			{[]string{"--tokenizer", filepath.Join(mistral, "tokenizer.json"), "--chat", "--chat-template", writeTemp(t, "{% for m in messages %}{{ m.content }}{% endfor %}")}, `{"messages":[{"role":"user","content":"Hello"}]}`, "[22557]"},
			{[]string{"--tokenizer", filepath.Join(mistral, "tokenizer.json"), "--chat", "--add-special-tokens", "--chat-template", writeTemp(t, "{% for m in messages %}{{ m.content }}{% endfor %}")}, `{"messages":[{"role":"user","content":"Hello"}]}`, "[1,22557]"},
		} {
			withStdin(t, c.stdin, func() { code, out, errOut = runCLI(append([]string{"tokenize"}, c.args...)...) })
			if code != 0 || strings.TrimSpace(out) != c.want {
				t.Errorf("%v: exit %d, stdout %q, stderr %q, want %s", c.args, code, out, errOut, c.want)
			}
		}

		// Qwen3 chat: the template's rendering, tokenized without special
		// tokens, equals the ids of the text the template writes.
		qwen := filepath.Join(shared, "qwen3")
		withStdin(t, `{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"enable_thinking":false}}`, func() { code, out, errOut = runCLI("tokenize", "--tokenizer", qwen, "--chat") })
		var got []uint32
		if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
			t.Fatalf("qwen3 --chat: exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		text, _ := json.Marshal([]string{"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"})
		withStdin(t, string(text), func() { code, out, errOut = runCLI("tokenize", "--tokenizer", qwen) })
		var want [][]uint32
		if code != 0 || json.Unmarshal([]byte(out), &want) != nil || len(want) != 1 || !slices.Equal(got, want[0]) {
			t.Errorf("qwen3 --chat gave %v, the rendered text encodes to %v (stderr %q)", got, want, errOut)
		}
		withStdin(t, `{"messages":[{"role":"user","content":"Hi"}]}`, func() {
			code, out, errOut = runCLI("tokenize", "--tokenizer", filepath.Join(qwen, "tokenizer.json"), "--chat")
		})
		if code != 2 || !strings.Contains(errOut, "no chat template") {
			t.Errorf("bare tokenizer.json --chat: exit %d, stderr %q, want 2 naming the missing template", code, errOut)
		}
	}

	for _, c := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"tokenize"}, `[]`, "--tokenizer: required"},
		{[]string{"tokenize", "--tokenizer", "no/such/dir"}, `[]`, "--tokenizer"},
		{[]string{"tokenize", "--tokenizer", "builtin:sim"}, `{"not": "a list"}`, "JSON array of strings"},
		{[]string{"tokenize", "--tokenizer", "builtin:sim", "--completion"}, `"text"`, "JSON array of strings"},
		{[]string{"tokenize", "--tokenizer", "builtin:sim", "--chat"}, `["not a body"]`, "JSON object"},
		{[]string{"tokenize", "--tokenizer", "builtin:sim", "--chat"}, `{"messages":[]}`, "messages"},
		{[]string{"tokenize", "--tokenizer", "builtin:sim", "--chat"}, `{"messages":[{"role":"user","content":"x"}],"add_special_tokens":1}`, "add_special_tokens"},
		{[]string{"tokenize", "--tokenizer", "builtin:sim", "--chat", "--completion"}, `[]`, "pick one"},
		{[]string{"tokenize", "--tokenizer", "builtin:sim", "--completion", "--add-special-tokens"}, `[]`, "drop --add-special-tokens"},
		{[]string{"tokenize", "--tokenizer", "builtin:sim", "--chat-template", "x.jinja"}, `[]`, "only used with --chat"},
		{[]string{"tokenize", "--tokenizer", "builtin:sim", "--chat", "--chat-template", "no/such.jinja"}, `{}`, "--chat-template"},
	} {
		withStdin(t, c.stdin, func() { code, out, errOut = runCLI(c.args...) })
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

// writeTemp writes text to a fresh file and returns its path.
func writeTemp(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "template.jinja")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
