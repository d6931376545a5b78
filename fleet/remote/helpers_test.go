package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// memTransport is an in-memory http.RoundTripper that serves each host
// from its handler, streaming the body through a pipe, so that HTTP code
// runs inside testing/synctest bubbles (where sockets cannot). A request to
// a host without a handler fails as a refused connection would.
type memTransport struct {
	mu       sync.Mutex
	handlers map[string]http.Handler
}

func newMemTransport() *memTransport {
	return &memTransport{handlers: make(map[string]http.Handler)}
}

func (m *memTransport) handle(host string, h http.Handler) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.handlers[host] = h
}

func (m *memTransport) client() *http.Client { return &http.Client{Transport: m} }

var (
	errRefused = errors.New("connection refused")
	errAborted = errors.New("connection reset by peer")
)

func (m *memTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	m.mu.Lock()
	h := m.handlers[req.URL.Host]
	m.mu.Unlock()
	if h == nil {
		return nil, errRefused
	}
	ctx := req.Context()
	pr, pw := io.Pipe()
	w := &pipeWriter{header: make(http.Header), pw: pw, ready: make(chan struct{})}
	go func() {
		defer func() {
			if v := recover(); v != nil {
				if v != http.ErrAbortHandler {
					panic(v)
				}
				pw.CloseWithError(errAborted) // as a server cuts the connection
				w.WriteHeader(http.StatusOK)
			}
		}()
		h.ServeHTTP(w, req)
		w.WriteHeader(http.StatusOK)
		if err := ctx.Err(); err != nil {
			pw.CloseWithError(err) // the client gave up: the body is cut
			return
		}
		pw.Close()
	}()
	select {
	case <-w.ready:
	case <-ctx.Done():
		pr.CloseWithError(ctx.Err())
		return nil, ctx.Err()
	}
	body := &ctxBody{r: pr, done: make(chan struct{})}
	go func() {
		select {
		case <-ctx.Done():
			pw.CloseWithError(ctx.Err()) // reads fail with the context's error
		case <-body.done:
		}
	}()
	return &http.Response{
		Status:     fmt.Sprintf("%d %s", w.code, http.StatusText(w.code)),
		StatusCode: w.code,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  w.sent,
		Body:    body,
		Request: req,
	}, nil
}

// pipeWriter is the server side of memTransport.
type pipeWriter struct {
	header, sent http.Header
	code         int
	pw           *io.PipeWriter
	ready        chan struct{}
	once         sync.Once
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(code int) {
	w.once.Do(func() {
		w.code, w.sent = code, w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(b)
}

// ctxBody is a response body that fails once the request's context ends.
type ctxBody struct {
	r    *io.PipeReader
	done chan struct{}
	once sync.Once
}

func (b *ctxBody) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *ctxBody) Close() error {
	b.once.Do(func() { close(b.done) })
	return b.r.Close()
}

// fixture returns testdata/name.
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// page serves body with a content type.
func page(body []byte, contentType string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.Write(body)
	}
}

// hang answers nothing until the client goes away.
func hang(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }

const textType = "text/plain; version=0.0.4; charset=utf-8"

// runInBackground runs run(ctx) and returns a function that stops it and
// returns its error.
func runInBackground(run func(context.Context) error) func() error {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}
