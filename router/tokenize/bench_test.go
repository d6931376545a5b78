package tokenize

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/simtok"
)

// BenchmarkEncode encodes the parity corpus once per iteration with the
// caches emptied first (cold), reporting tokens per second on one core.
func BenchmarkEncode(b *testing.B) {
	corpus := loadCorpus(b)
	for _, name := range tokenizerNames {
		b.Run(name, func(b *testing.B) {
			tk := loadShared(b, name)
			dst := make([]uint32, 0, 1<<16)
			tokens := 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				tk.ResetCaches()
				for _, s := range corpus {
					dst = tk.EncodeTo(dst[:0], s, false)
					tokens += len(dst)
				}
			}
			b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkEncodeWarm is BenchmarkEncode with the caches kept between
// iterations.
func BenchmarkEncodeWarm(b *testing.B) {
	corpus := loadCorpus(b)
	for _, name := range []string{"qwen2_5", "mistral_7b"} {
		b.Run(name, func(b *testing.B) {
			tk := loadShared(b, name)
			dst := make([]uint32, 0, 1<<16)
			tokens := 0
			b.ReportAllocs()
			for b.Loop() {
				for _, s := range corpus {
					dst = tk.EncodeTo(dst[:0], s, false)
					tokens += len(dst)
				}
			}
			b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// chatPrompt builds a Qwen chat prompt: a long system prompt, earlier
// turns, and a short new user message that differs per call.
func chatPrompt(system string, turns []string, user string) string {
	var sb strings.Builder
	sb.WriteString("<|im_start|>system\n" + system + "<|im_end|>\n")
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		sb.WriteString("<|im_start|>" + role + "\n" + t + "<|im_end|>\n")
	}
	sb.WriteString("<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n")
	return sb.String()
}

// longText is deterministic prose-and-code filler from the corpus.
func longText(corpus []string, from, minBytes int) string {
	var sb strings.Builder
	for i := from; sb.Len() < minBytes; i++ {
		s := corpus[i%len(corpus)]
		if strings.Contains(s, "<|") || strings.Contains(s, "<s>") || strings.Contains(s, "</s>") || strings.Contains(s, "[INST]") || strings.Contains(s, "<think>") || strings.Contains(s, "<tool") {
			continue
		}
		sb.WriteString(s)
		sb.WriteString("\n")
	}
	return sb.String()
}

// BenchmarkEncodeCachedChat encodes an 8,000-token Qwen chat prompt whose
// system prompt (about 6,000 tokens) and earlier turns were seen before;
// only the short last user message is new.
func BenchmarkEncodeCachedChat(b *testing.B) {
	tk := loadShared(b, "qwen2_5")
	corpus := loadCorpus(b)
	system := longText(corpus, 200, 1)
	for n := 1; len(tk.Encode(system, false)) < 6000; n *= 2 {
		system = longText(corpus, 200, 4000*n)
	}
	var turns []string
	prompt := chatPrompt(system, nil, "hi")
	for i := 0; len(tk.Encode(prompt, false)) < 8000; i++ {
		turns = append(turns, longText(corpus, 1500+i*37, 1200))
		prompt = chatPrompt(system, turns, "hi")
	}
	tk.Encode(prompt, false) // warm the span cache
	users := make([]string, 64)
	for i := range users {
		users[i] = fmt.Sprintf("Question %d: what does the function on line %d return?", i, 3*i+1)
	}
	prompts := make([]string, len(users))
	for i, u := range users {
		prompts[i] = chatPrompt(system, turns, u)
	}
	dst := make([]uint32, 0, 16384)
	b.ReportMetric(float64(len(tk.Encode(prompts[0], false))), "tokens")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		dst = tk.EncodeTo(dst[:0], prompts[i%len(prompts)], false)
		i++
	}
}

// BenchmarkEncode4MB encodes 4 MiB of mixed text with cold caches.
func BenchmarkEncode4MB(b *testing.B) {
	tk := loadShared(b, "qwen2_5")
	text := longText(loadCorpus(b), 0, 4<<20)
	b.ReportAllocs()
	for b.Loop() {
		tk.ResetCaches()
		start := time.Now()
		tk.Encode(text, false)
		b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms/op-wall")
	}
}

// BenchmarkEncodeManyWords encodes prompts of 256 words drawn at random
// from the simulator's vocabulary of 32,000 (bench's W6 text, as
// bench-live sends it) with the word cache warm: a cache of tens of
// thousands of words, larger than the processor's near caches, where each
// lookup's memory accesses are most of the cost.
func BenchmarkEncodeManyWords(b *testing.B) {
	// The span cache off: a prompt here is seen again, a real one is not.
	tk, err := LoadFileOptions(filepath.Join(sharedDir(b), "tokenizers", "qwen2_5", "tokenizer.json"), Options{SpanCacheTokens: -1})
	if err != nil {
		b.Fatal(err)
	}
	sim := simtok.New()
	all := make([]uint32, simtok.VocabSize)
	for i := range all {
		all[i] = uint32(i)
	}
	tk.Encode(sim.Decode(all), false) // every word in the cache
	rng := rand.New(rand.NewPCG(1, 2))
	prompts := make([]string, 512)
	for i := range prompts {
		ids := make([]uint32, 256)
		for j := range ids {
			ids[j] = uint32(rng.IntN(simtok.VocabSize))
		}
		prompts[i] = sim.Decode(ids)
	}
	dst := make([]uint32, 0, 4096)
	tokens, i := 0, 0
	b.ReportAllocs()
	for b.Loop() {
		dst = tk.EncodeTo(dst[:0], prompts[i%len(prompts)], false)
		tokens += len(dst)
		i++
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
}
