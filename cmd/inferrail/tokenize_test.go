package main

import (
	"encoding/json"
	"os"
	"path/filepath"
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

	dir := filepath.Join("..", "..", "..", "shared", "tokenizers", "mistral_7b")
	if _, err := os.Stat(dir); err == nil {
		withStdin(t, `["Hello"]`, func() { code, out, errOut = runCLI("tokenize", "--tokenizer", dir, "--add-special-tokens") })
		if code != 0 || strings.TrimSpace(out) != "[[1,22557]]" {
			t.Errorf("mistral_7b: exit %d, stdout %q, stderr %q", code, out, errOut)
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
	} {
		withStdin(t, c.stdin, func() { code, out, errOut = runCLI(c.args...) })
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}
