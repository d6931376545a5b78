package server

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/inferrail/inferrail/engine/embed"
)

type embeddingReply struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Index     int             `json:"index"`
		Object    string          `json:"object"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func postEmbeddings(t *testing.T, ts *testServer, body string) (int, []byte) {
	t.Helper()
	return postPath(t, ts, "/v1/embeddings", body)
}

// TestEmbeddings: OpenAI's shape, one embedding per input in order, the
// same vectors as package embed computes, base64 the same numbers.
func TestEmbeddings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine()})
		defer ts.stop()
		texts := []string{"How do I reset my password?", "how can i reset my password", "What is the capital of France?"}
		in, _ := json.Marshal(texts)
		status, b := postEmbeddings(t, ts, `{"model": "inferrail-sim", "input": `+string(in)+`, "encoding_format": "float"}`)
		if status != 200 {
			t.Fatalf("status %d: %s", status, b)
		}
		var r embeddingReply
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		if r.Object != "list" || r.Model != "inferrail-sim" || !strings.HasPrefix(r.ID, "embd-") || len(r.Data) != len(texts) {
			t.Fatalf("reply %s", b)
		}
		wantTokens := 0
		vecs := make([][]float32, len(texts))
		for i, d := range r.Data {
			if d.Index != i || d.Object != "embedding" {
				t.Fatalf("data[%d]: index %d object %q", i, d.Index, d.Object)
			}
			if err := json.Unmarshal(d.Embedding, &vecs[i]); err != nil {
				t.Fatal(err)
			}
			want, _ := embed.Vector(texts[i], embed.DefaultDim)
			if !slices.Equal(vecs[i], want) {
				t.Fatalf("data[%d] differs from embed.Vector", i)
			}
			wantTokens += len(ts.tok.Encode(texts[i]))
		}
		if r.Usage.PromptTokens != wantTokens || r.Usage.TotalTokens != wantTokens {
			t.Fatalf("usage %+v, want %d prompt tokens", r.Usage, wantTokens)
		}
		if s := embed.Cosine(vecs[0], vecs[1]); s < 0.95 {
			t.Fatalf("paraphrases: similarity %v", s)
		}
		if s := embed.Cosine(vecs[0], vecs[2]); s > 0.5 {
			t.Fatalf("unrelated: similarity %v", s)
		}

		// One string, base64 (the OpenAI SDKs' default), other dimensions.
		status, b = postEmbeddings(t, ts, `{"input": "How do I reset my password?", "encoding_format": "base64", "dimensions": 64}`)
		if status != 200 {
			t.Fatalf("status %d: %s", status, b)
		}
		r = embeddingReply{}
		if err := json.Unmarshal(b, &r); err != nil || len(r.Data) != 1 {
			t.Fatalf("%v: %s", err, b)
		}
		var s string
		if err := json.Unmarshal(r.Data[0].Embedding, &s); err != nil {
			t.Fatalf("base64 embedding is not a string: %s", r.Data[0].Embedding)
		}
		raw, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(raw) != 4*64 {
			t.Fatalf("base64: %v, %d bytes", err, len(raw))
		}
		want, _ := embed.Vector(texts[0], 64)
		for i := range want {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); got != want[i] {
				t.Fatalf("base64 value %d: %v, want %v", i, got, want[i])
			}
		}
	})
}

func TestEmbeddingsBadRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Engine: testEngine()}
		ts := startPipe(t, cfg)
		defer ts.stop()
		for _, tc := range []struct {
			body   string
			status int
			want   string
		}{
			{`{}`, 400, "input is required"},
			{`{"input": ""}`, 400, "input[0] is empty"},
			{`{"input": ["a", "  "]}`, 400, "input[1] is empty"},
			{`{"input": []}`, 400, "from 1 to"},
			{`{"input": [1, 2, 3]}`, 400, "not token ids"},
			{`{"input": "a", "encoding_format": "int8"}`, 400, "encoding_format"},
			{`{"input": "a", "dimensions": 0}`, 400, "dimensions"},
			{`{"input": "a", "dimensions": 5000}`, 400, "dimensions"},
			{`{"input": "a", "model": "text-embedding-3-small"}`, 404, "does not exist"},
			{`{"input": "` + strings.Repeat("word ", 5000) + `"}`, 400, "maximum context length"},
			{`{"input": `, 400, "invalid JSON"},
		} {
			status, b := postEmbeddings(t, ts, tc.body)
			var e errorResponse
			if status != tc.status || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error.Message, tc.want) {
				t.Errorf("%.60s: status %d body %.200s; want %d mentioning %q", tc.body, status, b, tc.status, tc.want)
			}
		}
		req, _ := http.NewRequest(http.MethodGet, ts.base+"/v1/embeddings", nil)
		resp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
			t.Fatalf("GET: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
		}
	})
}
