package semcache

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"time"
)

// Embedder turns texts into vectors: Client, or a model of the caller's.
type Embedder interface {
	// Embed returns one vector per text, in order.
	Embed(ctx context.Context, texts ...string) ([][]float32, error)
}

// DefaultMaxResponseBytes bounds an embeddings response body.
const DefaultMaxResponseBytes = 16 << 20

// maxErrorBody is how much of an error response is read for its message.
const maxErrorBody = 4 << 10

// ClientOptions configure a Client.
type ClientOptions struct {
	// URL is the server's base URL (see EmbeddingsConfig.URL).
	URL string
	// Model is sent as "model".
	Model string
	// Timeout bounds each call (0: DefaultEmbedTimeout).
	Timeout time.Duration
	// Dimensions, when not 0, is the dimension every embedding must have.
	Dimensions int
	// APIKey, when set, is sent as a bearer token.
	APIKey string
	// MaxResponseBytes bounds a response body (0:
	// DefaultMaxResponseBytes).
	MaxResponseBytes int64
	// HTTPClient sends the requests (nil: a client of its own).
	HTTPClient *http.Client
}

// Client calls an OpenAI-compatible POST /v1/embeddings (vLLM, the OpenAI
// API, `inferrail engine`) with encoding_format float.
type Client struct {
	endpoint string
	model    string
	timeout  time.Duration
	dim      int
	auth     string
	maxBody  int64
	hc       *http.Client
}

var _ Embedder = (*Client)(nil)

// NewClient checks o and returns a client.
func NewClient(o ClientOptions) (*Client, error) {
	if err := checkBaseURL(o.URL); err != nil {
		return nil, fmt.Errorf("semcache: embeddings url %w", err)
	}
	if o.Model == "" {
		return nil, errors.New("semcache: embeddings model is required")
	}
	if o.Timeout < 0 || o.Dimensions < 0 || o.MaxResponseBytes < 0 {
		return nil, errors.New("semcache: embeddings timeout, dimensions and max response bytes must not be negative")
	}
	c := &Client{
		endpoint: strings.TrimSuffix(o.URL, "/") + "/v1/embeddings",
		model:    o.Model, timeout: o.Timeout, dim: o.Dimensions, maxBody: o.MaxResponseBytes, hc: o.HTTPClient,
	}
	if o.APIKey != "" {
		c.auth = "Bearer " + o.APIKey
	}
	if c.timeout == 0 {
		c.timeout = DefaultEmbedTimeout
	}
	if c.maxBody == 0 {
		c.maxBody = DefaultMaxResponseBytes
	}
	if c.hc == nil {
		c.hc = &http.Client{Transport: &http.Transport{
			Proxy: nil, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: true,
		}}
	}
	return c, nil
}

// ReadAPIKey reads a bearer token from file: its one line, trimmed.
func ReadAPIKey(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("semcache: embeddings api key: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4097))
	if err != nil {
		return "", fmt.Errorf("semcache: embeddings api key %s: %w", file, err)
	}
	key := strings.TrimSpace(string(b))
	if len(b) > 4096 || key == "" || strings.ContainsAny(key, " \t\r\n") {
		return "", fmt.Errorf("semcache: embeddings api key %s: want one line of at most 4096 bytes without spaces", file)
	}
	return key, nil
}

type embedRequest struct {
	Input          []string `json:"input"`
	Model          string   `json:"model"`
	EncodingFormat string   `json:"encoding_format"`
}

type embedResponse struct {
	Data []struct {
		Index     *int            `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
}

// Embed implements Embedder: one request for all texts, bounded by the
// client's timeout and ctx.
func (c *Client) Embed(ctx context.Context, texts ...string) ([][]float32, error) {
	if len(texts) == 0 {
		return nil, nil
	}
	body, err := json.Marshal(embedRequest{Input: texts, Model: c.model, EncodingFormat: "float"})
	if err != nil {
		return nil, fmt.Errorf("semcache: embeddings: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("semcache: embeddings: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			return nil, fmt.Errorf("semcache: embeddings: no answer from %s within %v: %w", c.endpoint, c.timeout, err)
		}
		return nil, fmt.Errorf("semcache: embeddings: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, fmt.Errorf("semcache: embeddings: %s answered %d: %s", c.endpoint, resp.StatusCode, errorMessage(b))
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("semcache: embeddings: reading the answer: %w", err)
	}
	if int64(len(b)) > c.maxBody {
		return nil, fmt.Errorf("semcache: embeddings: the answer exceeds %d bytes", c.maxBody)
	}
	return c.parse(b, len(texts))
}

// parse reads an embeddings answer for n inputs.
func (c *Client) parse(b []byte, n int) ([][]float32, error) {
	var r embedResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("semcache: embeddings: the answer is not an embeddings list: %w", err)
	}
	if len(r.Data) != n {
		return nil, fmt.Errorf("semcache: embeddings: %d embeddings for %d inputs", len(r.Data), n)
	}
	out := make([][]float32, n)
	dim := c.dim
	for i, d := range r.Data {
		idx := i
		if d.Index != nil {
			idx = *d.Index
		}
		if idx < 0 || idx >= n || out[idx] != nil {
			return nil, fmt.Errorf("semcache: embeddings: data[%d] has index %d: want each of 0 to %d once", i, idx, n-1)
		}
		v, err := decodeEmbedding(d.Embedding)
		if err != nil {
			return nil, fmt.Errorf("semcache: embeddings: data[%d]: %w", i, err)
		}
		if len(v) == 0 {
			return nil, fmt.Errorf("semcache: embeddings: data[%d] is empty", i)
		}
		if dim == 0 {
			dim = len(v)
		}
		if len(v) != dim {
			return nil, fmt.Errorf("semcache: embeddings: data[%d] has %d dimensions, want %d", i, len(v), dim)
		}
		for j, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, fmt.Errorf("semcache: embeddings: data[%d][%d] is %v", i, j, x)
			}
		}
		out[idx] = v
	}
	return out, nil
}

// decodeEmbedding reads a list of numbers, or base64 little-endian
// float32s (what a server that ignores encoding_format may send).
func decodeEmbedding(raw json.RawMessage) ([]float32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b)%4 != 0 {
			return nil, errors.New("embedding is a string but not base64 float32s")
		}
		v := make([]float32, len(b)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return v, nil
	}
	var v []float32
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("embedding is not a list of numbers: %w", err)
	}
	return v, nil
}

// errorMessage is an OpenAI error body's message, or the body itself
// (printable, cut at 200 bytes).
func errorMessage(b []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
		Detail any `json:"detail"`
	}
	if json.Unmarshal(b, &e) == nil {
		if e.Error.Message != "" {
			return clip(e.Error.Message)
		}
		if e.Detail != nil {
			return clip(fmt.Sprint(e.Detail))
		}
	}
	return clip(string(b))
}

func clip(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	if s == "" {
		s = "(no body)"
	}
	return s
}
