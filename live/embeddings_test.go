package live

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/tenancy/limit"
)

// embeddingAnswer is what the tests read of an embeddings answer.
type embeddingAnswer struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

func (g *testGateway) embed(t *testing.T, body map[string]any, hdr map[string]string) (*http.Response, embeddingAnswer, []byte) {
	t.Helper()
	resp, err := g.post(t.Context(), "/v1/embeddings", body, hdr)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var a embeddingAnswer
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
	}
	return resp, a, b
}

// wantPostOnly checks that GET path is 405 with Allow: POST.
func wantPostOnly(t *testing.T, g *testGateway, path string) {
	t.Helper()
	r, err := g.client.Get(g.base + path)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusMethodNotAllowed || r.Header.Get("Allow") != "POST" {
		t.Fatalf("GET %s: %d, Allow %q", path, r.StatusCode, r.Header.Get("Allow"))
	}
}

// POST /v1/embeddings is routed like a generation: one text is tokenized
// at the edge, weighed as its prompt alone and predicted from the index,
// which learns its blocks; several texts go without a prediction; the
// engine's answer comes back whole.
func TestEmbeddingsProxied(t *testing.T) {
	a := newUpstream(t, server.Config{Engine: testEngineConfig()})
	b := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := testConfig(t, a, b)
	c.Models[0].DefaultMaxTokens = 1024 // a generation's weight; never an embedding's
	g := startGateway(t, c)
	text := words(100, 200)

	resp, ans, body := g.embed(t, map[string]any{"model": "sim", "input": text}, map[string]string{"X-Request-Id": "emb-1"})
	first := resp.Header.Get(HeaderReplica)
	if resp.StatusCode != http.StatusOK || ans.Object != "list" || ans.Model != server.DefaultModelName || len(ans.Data) != 1 || len(ans.Data[0].Embedding) == 0 ||
		ans.Usage.PromptTokens != 200 || (first != "a" && first != "b") || resp.Header.Get(HeaderRequestID) != "emb-1" {
		t.Fatalf("status %d, headers %v: %s", resp.StatusCode, resp.Header, body)
	}
	if resp.Header.Get(HeaderPredicted) != "0" {
		t.Fatalf("a cold text predicted %q cached tokens", resp.Header.Get(HeaderPredicted))
	}
	// The same text again: the index holds its 12 full blocks where it
	// went, and the same vector comes back.
	resp, again, body := g.embed(t, map[string]any{"input": []string{text}}, nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderReplica) != first || resp.Header.Get(HeaderPredicted) != "192" {
		t.Fatalf("again: %d, replica %q (first %q), predicted %q: %s", resp.StatusCode, resp.Header.Get(HeaderReplica), first, resp.Header.Get(HeaderPredicted), body)
	}
	if len(again.Data) != 1 || len(again.Data[0].Embedding) != len(ans.Data[0].Embedding) || again.Data[0].Embedding[0] != ans.Data[0].Embedding[0] {
		t.Fatalf("the same text embedded differently: %v / %v", again.Data, ans.Data)
	}
	// Several texts: no prediction, every embedding back in order.
	resp, batch, body := g.embed(t, map[string]any{"input": []string{words(10, 5), words(20, 7), words(30, 9)}}, nil)
	if resp.StatusCode != http.StatusOK || len(batch.Data) != 3 || batch.Data[2].Index != 2 || batch.Usage.PromptTokens != 21 || resp.Header.Get(HeaderPredicted) != "" {
		t.Fatalf("batch: %d, predicted %q: %s", resp.StatusCode, resp.Header.Get(HeaderPredicted), body)
	}
	// The engine's own refusal reaches the client as it wrote it.
	resp, _, body = g.embed(t, map[string]any{"input": text, "encoding_format": "int8"}, nil)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "encoding_format") {
		t.Fatalf("a bad encoding_format: %d %s", resp.StatusCode, body)
	}
	// The wrong method is 405 with Allow.
	wantPostOnly(t, g, "/v1/embeddings")
	if in, p := g.inFlight(); in != 0 || p != 0 {
		t.Fatalf("slots held after the requests: %d in flight, %d pending", in, p)
	}
	if got := testutil.ToFloat64(g.met.requests.WithLabelValues(server.DefaultModelName, "ok")); got != 3 {
		t.Fatalf("inferrail_requests_total{outcome=ok} %v, want 3", got)
	}

	// The core weighs an embedding as its prompt, not the model's
	// default_max_tokens: what /admin/explain shows.
	ex := explainEmbedding(t, g, text)
	if !ex.Request.PrefillOnly || ex.Request.MaxTokens != 0 || ex.Admission.OutputTokens != 0 || ex.Request.PromptTokens != 200 {
		t.Fatalf("explained %+v %+v: want prefill only, no output", ex.Request, ex.Admission)
	}
}

func explainEmbedding(t *testing.T, g *testGateway, text string) gateway.Explanation {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"input": text})
	status, b := explainCall(t, g, "", body, nil)
	var ex gateway.Explanation
	if status != http.StatusOK || json.Unmarshal(b, &ex) != nil {
		t.Fatalf("explain: %d %s", status, b)
	}
	return ex
}

// A key's TPM is charged an embedding's prompt alone (no default output)
// and its usage metered from the engine's count.
func TestEmbeddingsChargedAndMetered(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, func(c *config.Config) { c.Models[0].DefaultMaxTokens = 1024 }, Deps{})
	const tpm = 100000
	_, key := g.createKey(t, map[string]any{"name": "embedder", "tpm": tpm})
	text := words(300, 50)
	resp, ans, body := g.testGateway.embed(t, map[string]any{"input": text}, map[string]string{"Authorization": "Bearer " + key})
	if resp.StatusCode != http.StatusOK || ans.Usage.PromptTokens != 50 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get(limit.HeaderRemainingTokens); got != strconv.Itoa(tpm-50) {
		t.Fatalf("remaining tokens %s, want %d: an embedding is charged its prompt alone", got, tpm-50)
	}
	var prompt, completion int64
	for _, u := range g.usageRows(t, "") {
		prompt += u.PromptTokens
		completion += u.OutputTokens
	}
	if prompt != 50 || completion != 0 {
		t.Fatalf("metered %d prompt and %d completion tokens, want 50 and 0", prompt, completion)
	}
}

// The endpoint picker routes POST /v1/embeddings as the proxy does: the
// same text twice goes to the replica that holds it, predicted, and the
// engine's answer passes whole.
func TestEPPEmbeddings(t *testing.T) {
	ups := []*upstream{newUpstream(t, server.Config{Engine: testEngineConfig()}), newUpstream(t, server.Config{Engine: testEngineConfig()})}
	e := startEPP(t, eppConfig(t, ups...), Deps{}, eppOptions{})
	body, _ := json.Marshal(map[string]any{"input": words(2000, 96)})
	first := e.open(t, envoyReq{path: "/v1/embeddings", body: body, chunks: 2})
	var ans embeddingAnswer
	if b := first.serve(); json.Unmarshal(b, &ans) != nil || len(ans.Data) != 1 || ans.Usage.PromptTokens != 96 {
		t.Fatalf("first answer: %s", b)
	}
	waitUntil(t, "the first request's end", 5*time.Second, func() bool { return idle(e.Server) })
	second := e.open(t, envoyReq{path: "/v1/embeddings", body: body})
	if second.pick.endpoint != first.pick.endpoint {
		t.Fatalf("the same text went to %s, then %s", first.pick.endpoint, second.pick.endpoint)
	}
	second.serve()
	if p := second.respHeaders[strings.ToLower(HeaderPredicted)]; p != "80" {
		t.Fatalf("predicted %q cached tokens, want 80 (5 of the text's 6 full blocks: the last token is computed)", p)
	}
	waitUntil(t, "idle", 5*time.Second, func() bool { return idle(e.Server) })
	if outcome(e.Server, "ok") != 2 {
		t.Fatalf("%v requests ok, want 2", outcome(e.Server, "ok"))
	}
}

// vLLM's scoring endpoints (a cross-encoder's /score and /rerank) are
// routed as requests that generate nothing, weighed by their size (not
// tokenized: the model joins each pair its own way), the engine's answer
// passed whole, and metered by its count: prompt_tokens, or total_tokens
// alone as vLLM's rerank answers.
func TestScoringProxied(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, nil, Deps{})
	_, key := g.createKey(t, map[string]any{"name": "ranker"})
	auth := map[string]string{"Authorization": "Bearer " + key}
	docs := []string{"reset your password in settings", "the capital of france is paris"}
	var metered int
	for _, path := range []string{"/rerank", "/v1/rerank", "/v2/rerank"} {
		resp, err := g.post(t.Context(), path, map[string]any{"model": "sim", "query": "reset my password", "documents": docs}, auth)
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Results []struct {
				Index int `json:"index"`
			} `json:"results"`
			Usage struct {
				TotalTokens int `json:"total_tokens"`
			} `json:"usage"`
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &r) != nil || len(r.Results) != 2 || r.Results[0].Index != 0 || r.Usage.TotalTokens == 0 ||
			resp.Header.Get(HeaderReplica) != "a" || resp.Header.Get(HeaderPredicted) != "" {
			t.Fatalf("%s: %d %v %s", path, resp.StatusCode, resp.Header, b)
		}
		metered += r.Usage.TotalTokens
	}
	for _, path := range []string{"/score", "/v1/score"} {
		resp, err := g.post(t.Context(), path, map[string]any{"text_1": "reset my password", "text_2": docs}, auth)
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Data  []struct{ Score float64 } `json:"data"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &r) != nil || len(r.Data) != 2 || r.Data[0].Score <= r.Data[1].Score {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		metered += r.Usage.PromptTokens
	}
	var prompt, output, requests int64
	for _, u := range g.usageRows(t, "") {
		prompt, output, requests = prompt+u.PromptTokens, output+u.OutputTokens, requests+u.Requests
	}
	if requests != 5 || prompt != int64(metered) || output != 0 {
		t.Fatalf("metered %d requests, %d prompt and %d output tokens; want 5, %d (the engine's counts) and 0", requests, prompt, output, metered)
	}
	// The engine's refusal passes through; the wrong method is 405.
	resp, err := g.post(t.Context(), "/v1/rerank", map[string]any{"documents": docs}, auth)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "query") {
		t.Fatalf("no query: %d %s", resp.StatusCode, b)
	}
	wantPostOnly(t, g.testGateway, "/rerank")
}
