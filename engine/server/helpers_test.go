package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/inferrail/inferrail/internal/pipenet"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine"
)

// testServer is a running server and a client that reaches it.
type testServer struct {
	*Server
	client *http.Client
	base   string
	stop   func()
	// halt stops the engine's loop alone (the HTTP server stays) and
	// waits for it to end, as an engine that goes away mid-request.
	halt func()
}

// startPipe starts s over an in-memory listener (usable inside synctest).
func startPipe(t testing.TB, cfg Config) *testServer {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln := pipenet.Listen("engine")
	hs := &http.Server{Handler: s.Handler()}
	runDone := make(chan struct{})
	go func() { s.Run(ctx); close(runDone) }()
	go hs.Serve(ln)
	tr := &http.Transport{DialContext: ln.Dial, MaxIdleConnsPerHost: 4096}
	ts := &testServer{Server: s, client: &http.Client{Transport: tr}, base: "http://engine"}
	ts.halt = func() { cancel(); <-runDone }
	ts.stop = func() {
		tr.CloseIdleConnections()
		hs.Close()
		ln.Close()
		cancel()
		<-runDone
		// Let connections that linger after an early response (net/http
		// waits up to 500 ms) finish; in a synctest bubble this costs no
		// real time.
		time.Sleep(time.Second)
	}
	return ts
}

// startTCP starts a server on 127.0.0.1.
func startTCP(t testing.TB, cfg Config) *testServer {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return startTCPWith(t, s)
}

// startTCPWith serves s on 127.0.0.1.
func startTCPWith(t testing.TB, s *Server) *testServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s.Handler()}
	runDone := make(chan struct{})
	go func() { s.Run(ctx); close(runDone) }()
	go hs.Serve(ln)
	tr := &http.Transport{MaxIdleConnsPerHost: 4096, MaxConnsPerHost: 0}
	ts := &testServer{Server: s, client: &http.Client{Transport: tr}, base: "http://" + ln.Addr().String()}
	ts.stop = func() {
		tr.CloseIdleConnections()
		hs.Close()
		cancel()
		<-runDone
	}
	return ts
}

func (ts *testServer) post(ctx context.Context, path string, body any) (*http.Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.base+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return ts.client.Do(req)
}

// sseEvent is one data event and when it was read.
type sseEvent struct {
	data string
	at   time.Time
}

// readSSE reads data events until [DONE] or EOF.
func readSSE(r io.Reader) ([]sseEvent, error) {
	var out []sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			return out, fmt.Errorf("unexpected SSE line %q", line)
		}
		out = append(out, sseEvent{data: data, at: time.Now()})
		if data == "[DONE]" {
			return out, nil
		}
	}
	if err := sc.Err(); err != nil {
		return out, err
	}
	return out, errors.New("stream ended without [DONE]")
}

// words returns n distinct vocabulary words, one token each.
func words(s *Server, first, n int) string {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(first + i)
	}
	return s.tok.Decode(ids)
}

// testEngine is a small, fast engine configuration.
func testEngine() engine.Config {
	c := engine.DefaultConfig()
	c.NumGPUBlocks = 512
	c.MaxModelLen = 4096
	return c
}
