package server

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/inferrail/inferrail/engine/embed"
)

// This file is vLLM's scoring API for a cross-encoder (reranker) model:
// POST /score and /v1/score (vLLM's own: text_1 against text_2), POST
// /rerank, /v1/rerank and /v2/rerank (Jina's and Cohere's shape: a query
// against documents). A pair's score is how close package embed puts the
// two texts, (1 + cosine) / 2 in [0, 1], as a sigmoid-activated
// cross-encoder scores; like embeddings, they are computed here, not
// scheduled on the engine.

type scoreRequest struct {
	Model *string         `json:"model"`
	Text1 json.RawMessage `json:"text_1"`
	Text2 json.RawMessage `json:"text_2"`
}

type scoreData struct {
	Index  int     `json:"index"`
	Object string  `json:"object"`
	Score  float64 `json:"score"`
}

type scoreResponse struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Data    []scoreData `json:"data"`
	Usage   usage       `json:"usage"`
}

type rerankRequest struct {
	Model     *string         `json:"model"`
	Query     *string         `json:"query"`
	Documents json.RawMessage `json:"documents"`
	TopN      int             `json:"top_n"`
}

type rerankDocument struct {
	Text string `json:"text"`
}

type rerankResult struct {
	Index          int            `json:"index"`
	Document       rerankDocument `json:"document"`
	RelevanceScore float64        `json:"relevance_score"`
}

// rerankUsage is vLLM's RerankUsage: the tokens of every pair, nothing else.
type rerankUsage struct {
	TotalTokens int `json:"total_tokens"`
}

type rerankResponse struct {
	ID      string         `json:"id"`
	Model   string         `json:"model"`
	Usage   rerankUsage    `json:"usage"`
	Results []rerankResult `json:"results"`
}

// handleScore serves POST /score and /v1/score: text_1 and text_2 are each
// a string or a list of strings; one text_1 is scored against every
// text_2, else the lists pair up in order (vLLM's rule).
func (s *Server) handleScore(w http.ResponseWriter, r *http.Request) {
	req, model, ok := decodePooling(s, w, r, func(q *scoreRequest) *string { return q.Model })
	if !ok {
		return
	}
	a, err := scoreTexts("text_1", req.Text1)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	b, err := scoreTexts("text_2", req.Text2)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if len(a) == 1 {
		a = slices.Repeat(a, len(b))
	}
	if len(a) != len(b) {
		writeAPIError(w, badRequest("text_1", "text_1 holds %d texts and text_2 %d: give one text_1, or as many as text_2", len(a), len(b)))
		return
	}
	resp := scoreResponse{ID: s.poolingID("score"), Object: "list", Created: time.Now().Unix(), Model: model, Data: make([]scoreData, len(a))}
	for i := range a {
		sc, n, err := s.scorePair(i, a[i], b[i])
		if err != nil {
			writeAPIError(w, err)
			return
		}
		resp.Usage.PromptTokens += n
		resp.Data[i] = scoreData{Index: i, Object: "score", Score: sc}
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens
	writeJSON(w, http.StatusOK, resp)
}

// handleRerank serves POST /rerank, /v1/rerank and /v2/rerank: the
// documents by relevance to the query, best first, the top_n of them (0:
// all).
func (s *Server) handleRerank(w http.ResponseWriter, r *http.Request) {
	req, model, ok := decodePooling(s, w, r, func(q *rerankRequest) *string { return q.Model })
	if !ok {
		return
	}
	if req.Query == nil || len(bytes.TrimSpace([]byte(*req.Query))) == 0 {
		writeAPIError(w, badRequest("query", "query is required: a string"))
		return
	}
	docs, err := scoreTexts("documents", req.Documents)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if req.TopN < 0 {
		writeAPIError(w, badRequest("top_n", "top_n %d: must be 0 (every document) or more", req.TopN))
		return
	}
	resp := rerankResponse{ID: s.poolingID("rerank"), Model: model, Results: make([]rerankResult, len(docs))}
	for i, d := range docs {
		sc, n, err := s.scorePair(i, *req.Query, d)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		resp.Usage.TotalTokens += n
		resp.Results[i] = rerankResult{Index: i, Document: rerankDocument{Text: d}, RelevanceScore: sc}
	}
	slices.SortStableFunc(resp.Results, func(x, y rerankResult) int { return cmp.Compare(y.RelevanceScore, x.RelevanceScore) })
	if req.TopN > 0 && req.TopN < len(resp.Results) {
		resp.Results = resp.Results[:req.TopN]
	}
	writeJSON(w, http.StatusOK, resp)
}

// scorePair scores the i-th pair and counts its tokens (both texts, as a
// cross-encoder reads them joined); a pair longer than the model's context
// is refused as vLLM refuses it.
func (s *Server) scorePair(i int, a, b string) (score float64, tokens int, err error) {
	tokens = len(s.tok.Encode(a)) + len(s.tok.Encode(b))
	if limit := s.cfg.Engine.MaxModelLen; tokens > limit {
		return 0, 0, badRequest("text_2", "pair %d has %d tokens: this model's maximum context length is %d tokens", i, tokens, limit)
	}
	va, _ := embed.Vector(a, embed.DefaultDim)
	vb, _ := embed.Vector(b, embed.DefaultDim)
	return (1 + embed.Cosine(va, vb)) / 2, tokens, nil
}

// scoreTexts reads a scored field: a string or a list of strings.
func scoreTexts(field string, raw json.RawMessage) ([]string, error) {
	return texts(field, "the mock engine scores text", raw)
}

// poolingID is a response id of a pooling endpoint (kind "embd", "score"
// or "rerank").
func (s *Server) poolingID(kind string) string {
	return fmt.Sprintf("%s-%016x%016x", kind, uint64(s.draw(1<<62)), s.nextID.Add(1))
}
