package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"testing"
)

// typicalStream is a vLLM chat stream of 200 events: a role chunk, 197
// one-token content chunks (a few with escapes or non-ASCII text), the
// finishing chunk and the usage chunk, then [DONE].
func typicalStream() []byte {
	var b []byte
	head := `data: {"id":"chatcmpl-7f3e9a1b2c","object":"chat.completion.chunk","created":1767225600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":`
	b = append(b, head+`{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
	words := []string{" the", " kalo", " mire", " tusa", ` \"ne\"`, " café", "\\n"}
	for i := range 197 {
		b = append(b, head+`{"content":"`+words[i%len(words)]+`"},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
	}
	b = append(b, head+`{"content":"."},"logprobs":null,"finish_reason":"length","stop_reason":null}]}`+"\n\n"...)
	b = append(b, `data: {"id":"chatcmpl-7f3e9a1b2c","object":"chat.completion.chunk","created":1767225600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[],"usage":{"prompt_tokens":1024,"total_tokens":1222,"completion_tokens":198,"prompt_tokens_details":{"cached_tokens":512}}}`+"\n\n"...)
	return append(b, "data: [DONE]\n\n"...)
}

// BenchmarkReader feeds the typical 200-event stream, reusing one Reader
// and Answer as the proxy would: one event a Feed (as an engine flushes
// them), or 4 KiB reads. Steady state must allocate nothing.
func BenchmarkReader(b *testing.B) {
	stream := typicalStream()
	events := 0
	var r Reader
	for i := 0; i < len(stream); {
		n := min(4096, len(stream)-i)
		evs, _ := r.Feed(stream[i:i+n], 0)
		events += len(evs)
		i += n
	}
	if events != 201 {
		b.Fatalf("%d events, want 201", events)
	}
	events = 200 // the last is [DONE]
	for _, mode := range []struct {
		name string
		cut  func([]byte) [][]byte
	}{
		{"event-per-feed", func(s []byte) [][]byte {
			var out [][]byte
			for len(s) > 0 {
				i := 0
				for i+1 < len(s) && !(s[i] == '\n' && s[i+1] == '\n') {
					i++
				}
				out = append(out, s[:i+2])
				s = s[i+2:]
			}
			return out
		}},
		{"4KiB-reads", func(s []byte) [][]byte {
			var out [][]byte
			for len(s) > 0 {
				n := min(4096, len(s))
				out = append(out, s[:n])
				s = s[n:]
			}
			return out
		}},
	} {
		chunks := mode.cut(stream)
		b.Run(mode.name, func(b *testing.B) {
			var r Reader
			var a Answer
			b.ReportAllocs()
			b.SetBytes(int64(len(stream)))
			for b.Loop() {
				r.Reset()
				a.Reset()
				for _, c := range chunks {
					evs, err := r.Feed(c, 0)
					if err != nil {
						b.Fatal(err)
					}
					a.Add(evs...)
				}
				if !a.Done || a.Usage.CompletionTokens != 198 {
					b.Fatalf("%+v", a)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
		})
	}
}

// BenchmarkUnmarshalBaseline decodes the same stream the way bench did
// before this package: a bufio.Scanner over lines, json.Unmarshal of each
// event into a struct of pointers. For comparison only.
func BenchmarkUnmarshalBaseline(b *testing.B) {
	stream := typicalStream()
	type chunk struct {
		Choices []struct {
			Text  *string `json:"text"`
			Delta *struct {
				Content *string `json:"content"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens        int `json:"prompt_tokens"`
			CompletionTokens    int `json:"completion_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		sc := bufio.NewScanner(bytes.NewReader(stream))
		var text []byte
		for sc.Scan() {
			data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
			if !ok || string(data) == "[DONE]" {
				continue
			}
			var c chunk
			if err := json.Unmarshal(data, &c); err != nil {
				b.Fatal(err)
			}
			for _, ch := range c.Choices {
				if ch.Delta != nil && ch.Delta.Content != nil {
					text = append(text, *ch.Delta.Content...)
				}
			}
		}
		if len(text) == 0 {
			b.Fatal("no text decoded")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*200), "ns/event")
}
