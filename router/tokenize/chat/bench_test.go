package chat

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchTemplate is Qwen2.5's template from the shared tokenizer files, or
// the Qwen-like template above when they are absent.
func benchTemplate(b *testing.B) *Template {
	if shared := sharedDir(); shared != "" {
		if data, err := os.ReadFile(filepath.Join(shared, "tokenizers", "qwen2_5", "tokenizer_config.json")); err == nil {
			tmpl, err := FromTokenizerConfig(data)
			if err != nil {
				b.Fatal(err)
			}
			return tmpl
		}
	}
	return mustNew(b, qwenLikeTemplate, Options{EosToken: "<|im_end|>"})
}

// benchBody is a ~32 KB (about 8,000 tokens) chat: a system prompt, 12
// rounds of user/assistant text and one tool, from a fixed seed.
func benchBody(b *testing.B) []byte {
	rng := rand.New(rand.NewPCG(1, 2))
	vocab := strings.Fields("the router sends each request to the replica whose prefix cache holds the longest match of its prompt blocks while keeping load balanced across engines 缓存 路由 🚀")
	text := func(n int) string {
		var sb strings.Builder
		for sb.Len() < n {
			sb.WriteString(vocab[rng.IntN(len(vocab))])
			sb.WriteByte(' ')
		}
		return sb.String()
	}
	msgs := []map[string]any{{"role": "system", "content": text(2000)}}
	for range 12 {
		msgs = append(msgs, map[string]any{"role": "user", "content": text(1300)}, map[string]any{"role": "assistant", "content": text(1200)})
	}
	msgs = append(msgs, map[string]any{"role": "user", "content": text(300)})
	body, err := json.Marshal(map[string]any{
		"messages": msgs,
		"tools":    []any{map[string]any{"type": "function", "function": map[string]any{"name": "lookup", "description": "Look a term up.", "parameters": map[string]any{"type": "object", "properties": map[string]any{"term": map[string]any{"type": "string"}}}}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// BenchmarkRender renders a ~32 KB Qwen chat from a parsed request.
func BenchmarkRender(b *testing.B) {
	tmpl := benchTemplate(b)
	req, err := ParseRequest(benchBody(b))
	if err != nil {
		b.Fatal(err)
	}
	out, err := tmpl.Render(req)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(out)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.Render(req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseAndRender includes reading the request body.
func BenchmarkParseAndRender(b *testing.B) {
	tmpl := benchTemplate(b)
	body := benchBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		req, err := ParseRequest(body)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tmpl.Render(req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCompile measures New on Qwen2.5's template (done once per model).
func BenchmarkCompile(b *testing.B) {
	shared := sharedDir()
	if shared == "" {
		b.Skip("shared/tokenizers not found")
	}
	data, err := os.ReadFile(filepath.Join(shared, "tokenizers", "qwen2_5", "tokenizer_config.json"))
	if err != nil {
		b.Skip(err)
	}
	src, _, opts, err := ParseTokenizerConfig(data)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := New(src, opts); err != nil {
			b.Fatal(err)
		}
	}
}
