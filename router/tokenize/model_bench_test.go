package tokenize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/router/tokenize/chat"
)

// warmChat is an ~8,000-token Qwen2.5 chat whose ~6,000-token system prompt
// (and, in bodies, earlier turns) the model has seen before.
type warmChat struct {
	m *Model
	// bodies share the system prompt and earlier turns; only the short
	// last user message differs.
	bodies [][]byte
	// fresh is a body whose only seen part is the system prompt: its one
	// user message (~2,000 tokens) holds the marker "@@N@@", replaced per
	// call so that its span is never cached.
	fresh  []byte
	tokens int
}

func newWarmChat(b testing.TB) warmChat {
	b.Helper()
	m, err := LoadModel(sharedDir(b)+"/tokenizers/qwen2_5", Options{})
	if err != nil {
		b.Fatal(err)
	}
	corpus := loadCorpus(b)
	msg := func(role, content string) map[string]any { return map[string]any{"role": role, "content": content} }
	body := func(msgs []map[string]any) []byte {
		data, err := json.Marshal(map[string]any{"messages": msgs})
		if err != nil {
			b.Fatal(err)
		}
		return data
	}
	count := func(msgs []map[string]any) int {
		ids, err := m.EncodeChat(body(msgs))
		if err != nil {
			b.Fatal(err)
		}
		return len(ids)
	}
	system := takeTokens(m.Tokenizer(), longText(corpus, 200, 64<<10), 6000)
	history := []map[string]any{msg("system", system)}
	for i := 0; ; i++ {
		left := 8000 - count(append(history, msg("user", "Question 0: what does the function on line 1 return?")))
		if left <= 0 {
			break
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		history = append(history, msg(role, takeTokens(m.Tokenizer(), longText(corpus, 1500+i*37, 16<<10), min(left, 500))))
	}
	w := warmChat{m: m}
	for i := range 64 {
		last := msg("user", fmt.Sprintf("Question %d: what does the function on line %d return?", i, 3*i+1))
		w.bodies = append(w.bodies, body(append(history[:len(history):len(history)], last)))
	}
	user := "@@N@@ " + takeTokens(m.Tokenizer(), longText(corpus, 2500, 32<<10), 2000)
	w.fresh = body([]map[string]any{msg("system", system), msg("user", user)})
	// See the system prompt and the history once.
	ids, err := m.EncodeChat(w.bodies[0])
	if err != nil {
		b.Fatal(err)
	}
	w.tokens = len(ids)
	return w
}

// takeTokens returns the shortest run of text's first lines that holds at
// least n tokens (all of text if it holds fewer).
func takeTokens(tk *Tokenizer, text string, n int) string {
	lines := strings.SplitAfter(text, "\n")
	lo, hi := 1, len(lines)
	for lo < hi {
		mid := (lo + hi) / 2
		if len(tk.Encode(strings.Join(lines[:mid], ""), false)) >= n {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return strings.Join(lines[:lo], "")
}

// BenchmarkEncodeChatWarmSystemPrompt measures EncodeChat (parse, render,
// encode) on an ~8,000-token Qwen2.5 chat whose ~6,000-token system prompt
// was seen before, and each stage alone:
//
//   - history-seen: the system prompt and earlier turns were seen, only the
//     short last user message is new (a multi-turn conversation);
//   - system-seen: only the system prompt was seen, ~2,000 new tokens follow.
func BenchmarkEncodeChatWarmSystemPrompt(b *testing.B) {
	w := newWarmChat(b)
	reqs := make([]chat.Request, len(w.bodies))
	texts := make([]string, len(w.bodies))
	for i, body := range w.bodies {
		var err error
		if reqs[i], err = chat.ParseRequest(body); err != nil {
			b.Fatal(err)
		}
		if texts[i], err = w.m.RenderChat(reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	dst := make([]uint32, 0, 16384)

	b.Logf("history-seen: %d tokens, %d-byte body; system-seen: %d-byte body", w.tokens, len(w.bodies[0]), len(w.fresh))
	b.Run("history-seen/EncodeChat", func(b *testing.B) {
		b.ReportMetric(float64(w.tokens), "tokens")
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			var err error
			if dst, err = w.m.AppendChat(dst[:0], w.bodies[i%len(w.bodies)], false); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("history-seen/parse-request", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := chat.ParseRequest(w.bodies[i%len(w.bodies)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("history-seen/parse-flags", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := parseChatFlags(w.bodies[i%len(w.bodies)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("history-seen/render", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := w.m.RenderChat(reqs[i%len(reqs)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("history-seen/encode", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			dst = w.m.appendText(dst[:0], texts[i%len(texts)], false)
			i++
		}
	})

	freshText, err := renderCase(w.m, w.fresh)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	next := func() string { n++; return strconv.Itoa(n) }
	b.Run("system-seen/EncodeChat", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			body := bytes.Replace(w.fresh, []byte("@@N@@"), []byte(next()), 1)
			var err error
			if dst, err = w.m.AppendChat(dst[:0], body, false); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(dst)), "tokens")
	})
	b.Run("system-seen/encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			dst = w.m.appendText(dst[:0], strings.Replace(freshText, "@@N@@", next(), 1), false)
		}
	})
}

// BenchmarkEncodeChat4MB renders and encodes one 4 MiB user message with
// Qwen2.5's template and cold caches.
func BenchmarkEncodeChat4MB(b *testing.B) {
	m, err := LoadModel(sharedDir(b)+"/tokenizers/qwen2_5", Options{})
	if err != nil {
		b.Fatal(err)
	}
	body := bigChatBody(b, longText(loadCorpus(b), 0, 4<<20))
	b.ReportAllocs()
	for b.Loop() {
		m.Tokenizer().ResetCaches()
		start := time.Now()
		if _, err := m.EncodeChat(body); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms/op-wall")
	}
}
