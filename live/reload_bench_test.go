package live

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/inferrail/inferrail/live/config"
)

// cannedEngine answers every completion at once with one small JSON body
// and its usage: the proxy's own path is what a benchmark through it
// measures.
type cannedEngine struct{}

var cannedBody = []byte(`{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":" a b","finish_reason":"length"}],"usage":{"prompt_tokens":40,"completion_tokens":2,"total_tokens":42,"prompt_tokens_details":{"cached_tokens":32}}}`)

func (cannedEngine) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(cannedBody)))
	return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(bytes.NewReader(cannedBody)), ContentLength: int64(len(cannedBody)), Request: r}, nil
}

// BenchmarkRequestPath is one completion through the proxy's handler
// (parse, edge tokenization, the core's decision, the try upstream, the
// answer read and relayed, the end in the core) against an engine that
// answers at once, in process: what the request path costs, and what a
// change to it (the reload's snapshot reads) adds.
func BenchmarkRequestPath(b *testing.B) {
	c := config.Default()
	m := config.DefaultModel()
	m.Name, m.Aliases = "m", []string{"alias"}
	m.MaxConcurrency, m.MaxPending = 1<<20, 1<<20
	for i, n := range []string{"a", "b", "c"} {
		m.Replicas = append(m.Replicas, config.Replica{Name: n, URL: "http://127.0.0.1:" + strconv.Itoa(i+1)})
	}
	c.Models = []config.Model{m}
	c.Log.AccessSample = 0
	s, err := New(&c, Deps{Transport: cannedEngine{}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	h := s.Handler()
	body := []byte(`{"model":"alias","prompt":"` + words(100, 40) + `","max_tokens":2}`)
	one := func() {
		r := httptest.NewRequest("POST", "/v1/completions", bytes.NewReader(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 200 {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	one()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		one()
	}
}
