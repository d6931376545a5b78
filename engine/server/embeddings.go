package server

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"time"

	"github.com/inferrail/inferrail/engine/embed"
)

// maxEmbeddingInputs bounds the texts of one embeddings request (OpenAI's
// limit).
const maxEmbeddingInputs = 2048

type embeddingRequest struct {
	Model          *string         `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat *string         `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
	User           *string         `json:"user"`
}

// embeddingData is one embedding: a list of floats, or with
// encoding_format base64 the little-endian float32 bytes in base64.
type embeddingData struct {
	Index     int    `json:"index"`
	Object    string `json:"object"`
	Embedding any    `json:"embedding"`
}

type embeddingResponse struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Data    []embeddingData `json:"data"`
	Usage   usage           `json:"usage"`
}

// handleEmbeddings serves POST /v1/embeddings with package embed's
// deterministic embeddings (DefaultDim dimensions unless the request asks
// for others). They are computed here, not scheduled on the engine: an
// embedding costs the mock engine no KV blocks and no step time.
func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	req, model, ok := decodePooling(s, w, r, func(q *embeddingRequest) *string { return q.Model })
	if !ok {
		return
	}
	texts, err := embeddingInputs(req.Input)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	format := "float"
	if req.EncodingFormat != nil {
		format = *req.EncodingFormat
	}
	if format != "float" && format != "base64" {
		writeAPIError(w, badRequest("encoding_format", "encoding_format %q: must be \"float\" or \"base64\"", format))
		return
	}
	dim := embed.DefaultDim
	if req.Dimensions != nil {
		dim = *req.Dimensions
		if dim < 1 || dim > embed.MaxDim {
			writeAPIError(w, badRequest("dimensions", "dimensions %d: must be from 1 to %d", dim, embed.MaxDim))
			return
		}
	}
	resp := embeddingResponse{
		ID: s.poolingID("embd"), Object: "list",
		Created: time.Now().Unix(), Model: model, Data: make([]embeddingData, len(texts)),
	}
	maxLen := s.cfg.Engine.MaxModelLen
	for i, t := range texts {
		n := len(s.tok.Encode(t))
		if n > maxLen {
			writeAPIError(w, badRequest("input", "input[%d] has %d tokens: this model's maximum context length is %d tokens", i, n, maxLen))
			return
		}
		resp.Usage.PromptTokens += n
		v, err := embed.Vector(t, dim)
		if err != nil {
			writeAPIError(w, badRequest("dimensions", "%v", err))
			return
		}
		d := embeddingData{Index: i, Object: "embedding", Embedding: v}
		if format == "base64" {
			b := make([]byte, 0, 4*len(v))
			for _, x := range v {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
			}
			d.Embedding = base64.StdEncoding.EncodeToString(b)
		}
		resp.Data[i] = d
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens
	writeJSON(w, http.StatusOK, resp)
}

// decodePooling reads the body of a pooling endpoint's request (an
// embedding's, a score's) into a T and resolves its model (model reads it
// from the T); false when it has answered an error.
func decodePooling[T any](s *Server, w http.ResponseWriter, r *http.Request, model func(*T) *string) (*T, string, bool) {
	var req T
	if err := s.decode(w, r, &req); err != nil {
		writeAPIError(w, err)
		return nil, "", false
	}
	name, err := s.checkModel(model(&req))
	if err != nil {
		writeAPIError(w, err)
		return nil, "", false
	}
	return &req, name, true
}

// embeddingInputs reads input: a string or a list of strings, none of them
// blank. Token id lists are refused: the mock embeds text only.
func embeddingInputs(raw json.RawMessage) ([]string, error) {
	return texts("input", "the mock engine embeds text, not token ids", raw)
}

// texts reads field: a string or a list of strings, none blank, at most
// maxEmbeddingInputs; why says why token ids are refused.
func texts(field, why string, raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest(field, "%s is required: a string or a list of strings", field)
	}
	var list []string
	var one string
	if json.Unmarshal(raw, &one) == nil {
		list = []string{one}
	} else if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest(field, "%s must be a string or a list of strings (%s)", field, why)
	}
	if len(list) == 0 || len(list) > maxEmbeddingInputs {
		return nil, badRequest(field, "%s holds %d strings: must be from 1 to %d", field, len(list), maxEmbeddingInputs)
	}
	for i, t := range list {
		if len(bytes.TrimSpace([]byte(t))) == 0 {
			return nil, badRequest(field, "%s[%d] is empty: every %s must hold some text", field, i, field)
		}
	}
	return list, nil
}
