package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/inferrail/inferrail/engine/embed"
)

func postPath(t *testing.T, ts *testServer, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, ts.base+path, strings.NewReader(body))
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// pairScore is the score the mock gives a pair: (1 + cosine) / 2 of their
// embeddings.
func pairScore(a, b string) float64 {
	va, _ := embed.Vector(a, embed.DefaultDim)
	vb, _ := embed.Vector(b, embed.DefaultDim)
	return (1 + embed.Cosine(va, vb)) / 2
}

// /score and /v1/score: one text_1 against every text_2, or the lists in
// pairs; vLLM's response shape with the pairs' tokens as the usage.
func TestScore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine()})
		defer ts.stop()
		q := "how do i reset my password"
		docs := []string{"reset your password in settings", "the capital of france is paris"}
		for _, path := range []string{"/score", "/v1/score"} {
			status, b := postPath(t, ts, path, `{"model": "inferrail-sim", "text_1": "`+q+`", "text_2": ["`+docs[0]+`", "`+docs[1]+`"]}`)
			var r scoreResponse
			if status != 200 || json.Unmarshal(b, &r) != nil {
				t.Fatalf("%s: %d %s", path, status, b)
			}
			want := len(ts.tok.Encode(q))*2 + len(ts.tok.Encode(docs[0])) + len(ts.tok.Encode(docs[1]))
			if r.Object != "list" || !strings.HasPrefix(r.ID, "score-") || len(r.Data) != 2 || r.Data[1].Index != 1 || r.Data[0].Object != "score" ||
				r.Data[0].Score != pairScore(q, docs[0]) || r.Data[0].Score <= r.Data[1].Score || r.Usage.PromptTokens != want || r.Usage.TotalTokens != want {
				t.Fatalf("%s: %+v, want the pairs' scores, the first higher, %d tokens", path, r, want)
			}
		}
		// Lists in pairs.
		status, b := postPath(t, ts, "/score", `{"text_1": ["a b", "c d"], "text_2": ["a b", "e f"]}`)
		var r scoreResponse
		if status != 200 || json.Unmarshal(b, &r) != nil || len(r.Data) != 2 || r.Data[0].Score != pairScore("a b", "a b") || r.Data[1].Score != pairScore("c d", "e f") {
			t.Fatalf("pairs: %d %s", status, b)
		}
		for _, tc := range []struct{ body, param string }{
			{`{"text_2": "x"}`, "text_1"},
			{`{"text_1": "x", "text_2": []}`, "text_2"},
			{`{"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}`, "text_1"},
			{`{"text_1": "x", "text_2": [1, 2]}`, "text_2"},
			{`{"text_1": " ", "text_2": "x"}`, "text_1"},
			{`{"text_1": "x", "text_2": "` + strings.Repeat("word ", 5000) + `"}`, "text_2"},
		} {
			status, b := postPath(t, ts, "/v1/score", tc.body)
			if status != 400 || !strings.Contains(string(b), `"param":"`+tc.param+`"`) {
				t.Errorf("%.60s: %d %s, want 400 on %s", tc.body, status, b, tc.param)
			}
		}
	})
}

// /rerank, /v1/rerank and /v2/rerank: the documents best first, top_n of
// them, each with its index and text; usage is total_tokens alone, as
// vLLM's RerankUsage.
func TestRerank(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine()})
		defer ts.stop()
		q := "reset my password"
		docs := []string{"the capital of france is paris", "reset your password in settings", "password reset by email"}
		for _, path := range []string{"/rerank", "/v1/rerank", "/v2/rerank"} {
			status, b := postPath(t, ts, path, `{"query": "`+q+`", "documents": ["`+strings.Join(docs, `", "`)+`"], "top_n": 2}`)
			var raw map[string]json.RawMessage
			var r rerankResponse
			if status != 200 || json.Unmarshal(b, &r) != nil || json.Unmarshal(b, &raw) != nil {
				t.Fatalf("%s: %d %s", path, status, b)
			}
			if len(r.Results) != 2 || r.Results[0].RelevanceScore < r.Results[1].RelevanceScore || r.Results[0].Index == 0 || r.Results[1].Index == 0 ||
				r.Results[0].Document.Text != docs[r.Results[0].Index] || r.Results[0].RelevanceScore != pairScore(q, docs[r.Results[0].Index]) {
				t.Fatalf("%s: %+v, want the two password documents, best first", path, r.Results)
			}
			want := 0
			for _, d := range docs {
				want += len(ts.tok.Encode(q)) + len(ts.tok.Encode(d))
			}
			if r.Usage.TotalTokens != want || string(raw["usage"]) != `{"total_tokens":`+strconv.Itoa(want)+`}` || !strings.HasPrefix(r.ID, "rerank-") {
				t.Fatalf("%s: usage %s, id %q, want total_tokens %d alone", path, raw["usage"], r.ID, want)
			}
		}
		status, b := postPath(t, ts, "/rerank", `{"query": "q", "documents": ["a", "b", "c"]}`)
		var r rerankResponse
		if status != 200 || json.Unmarshal(b, &r) != nil || len(r.Results) != 3 {
			t.Fatalf("top_n 0: %d %s, want every document", status, b)
		}
		for _, tc := range []struct{ body, param string }{
			{`{"documents": ["a"]}`, "query"},
			{`{"query": "q"}`, "documents"},
			{`{"query": "q", "documents": ["a"], "top_n": -1}`, "top_n"},
		} {
			status, b := postPath(t, ts, "/v1/rerank", tc.body)
			if status != 400 || !strings.Contains(string(b), `"param":"`+tc.param+`"`) {
				t.Errorf("%s: %d %s, want 400 on %s", tc.body, status, b, tc.param)
			}
		}
	})
}
