package tokenize

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Hugging Face model id is found in the local cache (refs/main, or the
// only snapshot), never downloaded; a missing one says where it looked.
func TestLoadFromHFCache(t *testing.T) {
	src := filepath.Join(sharedDir(t), "tokenizers", "gpt2")
	cache := t.TempDir()
	t.Setenv("HF_HUB_CACHE", cache)
	snap := filepath.Join(cache, "models--openai-community--gpt2", "snapshots", "abc123")
	if err := os.MkdirAll(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(snap, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := LoadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := Load("openai-community/gpt2")
	if _, err := LoadModel("openai-community/gpt2", Options{}); err != nil {
		t.Fatalf("LoadModel: %v", err)
	}
	if err != nil {
		t.Fatalf("the only snapshot: %v", err)
	}
	text := "Hello, Hugging Face cache."
	if got, w := enc.Encode(text, false), want.Encode(text, false); len(got) != len(w) || got[0] != w[0] {
		t.Errorf("ids %v, want %v", got, w)
	}
	// refs/main picks among several snapshots.
	other := filepath.Join(cache, "models--openai-community--gpt2", "snapshots", "def456")
	os.MkdirAll(other, 0o755)
	os.WriteFile(filepath.Join(other, "tokenizer.json"), []byte("{}"), 0o644)
	if _, err := Load("openai-community/gpt2"); err == nil || !strings.Contains(err.Error(), "several snapshots") {
		t.Errorf("two snapshots, no refs/main: %v", err)
	}
	os.MkdirAll(filepath.Join(cache, "models--openai-community--gpt2", "refs"), 0o755)
	os.WriteFile(filepath.Join(cache, "models--openai-community--gpt2", "refs", "main"), []byte("abc123\n"), 0o644)
	if _, err := Load("openai-community/gpt2"); err != nil {
		t.Errorf("refs/main: %v", err)
	}
	if _, err := Load("nobody/nothing"); err == nil || !strings.Contains(err.Error(), "not in the local Hugging Face cache") || !strings.Contains(err.Error(), cache) {
		t.Errorf("missing model: %v", err)
	}
}
