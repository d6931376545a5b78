package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// start serves h on a loopback port and returns its address.
func start(t testing.TB, cfg Config) (*Server, string) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return s, ln.Addr().String()
}

// dial opens a raw connection to addr.
func dial(t testing.TB, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func send(t testing.TB, c net.Conn, raw string) {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
}

func read(t testing.TB, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// closed tells whether the server closed c (after what br holds).
func closed(c net.Conn, br *bufio.Reader) bool {
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	for {
		_, err := br.ReadByte()
		if err == nil {
			continue
		}
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
}

func quiet() *log.Logger { return log.New(io.Discard, "", 0) }

func TestFraming(t *testing.T) {
	big := strings.Repeat("x", 3000)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/small":
			io.WriteString(w, "<html>hi</html>")
		case "/big":
			io.WriteString(w, big)
		case "/flush":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: 1\n\n")
			w.(http.Flusher).Flush()
			io.WriteString(w, "data: 2\n\n")
		case "/whole-stream": // an event stream written whole, never flushed
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: 1\n\ndata: [DONE]\n\n")
		case "/length":
			w.Header().Set("Content-Length", "5")
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, "he")
			w.(http.Flusher).Flush()
			io.WriteString(w, "llo")
		case "/short":
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "abc")
		case "/nocontent":
			w.WriteHeader(http.StatusNoContent)
			if _, err := io.WriteString(w, "x"); !errors.Is(err, http.ErrBodyNotAllowed) {
				panic(fmt.Sprintf("write after 204: %v", err))
			}
		case "/late":
			w.Header().Set("X-Early", "1")
			w.WriteHeader(http.StatusTeapot)
			w.Header().Set("X-Late", "1") // after WriteHeader: not sent
			io.WriteString(w, "tea")
		case "/empty":
		}
	})
	_, addr := start(t, Config{Handler: h, ErrorLog: quiet()})
	c, br := dial(t, addr)
	get := func(path, method string) (*http.Response, string) {
		send(t, c, method+" "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		return read(t, br, method)
	}
	resp, body := get("/small", "GET")
	if resp.ContentLength != int64(len("<html>hi</html>")) || body != "<html>hi</html>" || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" || resp.Header.Get("Date") == "" {
		t.Fatalf("small: length %d, type %q, date %q, body %q", resp.ContentLength, resp.Header.Get("Content-Type"), resp.Header.Get("Date"), body)
	}
	resp, body = get("/big", "GET")
	if len(resp.TransferEncoding) != 1 || body != big {
		t.Fatalf("big: transfer encoding %v, %d bytes", resp.TransferEncoding, len(body))
	}
	resp, body = get("/whole-stream", "GET")
	if resp.ContentLength != -1 || len(resp.TransferEncoding) != 1 || body != "data: 1\n\ndata: [DONE]\n\n" {
		t.Fatalf("an event stream written whole: length %d, transfer encoding %v, body %q; want it chunked as any stream", resp.ContentLength, resp.TransferEncoding, body)
	}
	resp, body = get("/flush", "GET")
	if len(resp.TransferEncoding) != 1 || body != "data: 1\n\ndata: 2\n\n" || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("flush: transfer encoding %v, body %q", resp.TransferEncoding, body)
	}
	resp, body = get("/length", "GET")
	if resp.ContentLength != 5 || body != "hello" || len(resp.TransferEncoding) != 0 {
		t.Fatalf("length: %d %v %q", resp.ContentLength, resp.TransferEncoding, body)
	}
	resp, _ = get("/length", "HEAD")
	if resp.ContentLength != 5 {
		t.Fatalf("HEAD: length %d", resp.ContentLength)
	}
	resp, body = get("/nocontent", "GET")
	if resp.StatusCode != 204 || body != "" {
		t.Fatalf("204: %d %q", resp.StatusCode, body)
	}
	resp, body = get("/late", "GET")
	if resp.StatusCode != http.StatusTeapot || resp.Header.Get("X-Early") != "1" || resp.Header.Get("X-Late") != "" || body != "tea" {
		t.Fatalf("late: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	resp, body = get("/empty", "GET")
	if resp.StatusCode != 200 || resp.ContentLength != 0 || body != "" {
		t.Fatalf("empty: %d %d %q", resp.StatusCode, resp.ContentLength, body)
	}
	// A body shorter than its Content-Length: the connection closes so the
	// client cannot read the next answer into it.
	send(t, c, "GET /short HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); err == nil || string(b) != "abc" {
		t.Fatalf("short body: %q, %v; want abc and an unexpected EOF", b, err)
	}

	// A client's Connection: close is answered in kind, and honoured.
	c, br = dial(t, addr)
	send(t, c, "GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if resp, body := read(t, br, "GET"); !resp.Close || body != "<html>hi</html>" {
		t.Fatalf("Connection: close: close %v, body %q", resp.Close, body)
	}
	if !closed(c, br) {
		t.Fatal("a connection its client asked to close was kept")
	}

	// HTTP/1.0: the close ends a body of unknown length.
	c, br = dial(t, addr)
	send(t, c, "GET /big HTTP/1.0\r\n\r\n")
	resp, body = read(t, br, "GET")
	if !resp.Close || body != big || len(resp.TransferEncoding) != 0 {
		t.Fatalf("HTTP/1.0: close %v, %v, %d bytes", resp.Close, resp.TransferEncoding, len(body))
	}
	if !closed(c, br) {
		t.Fatal("HTTP/1.0 connection left open")
	}

	// HTTP/1.0 with keep-alive (ab -k): kept while each answer's length is
	// known, closed after one whose length is not.
	c, br = dial(t, addr)
	for _, path := range []string{"/small", "/length", "/small"} {
		send(t, c, "GET "+path+" HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
		resp, _ = read(t, br, "GET")
		if resp.Close || resp.Header.Get("Connection") != "keep-alive" || resp.ContentLength < 0 {
			t.Fatalf("HTTP/1.0 keep-alive %s: close %v, Connection %q, length %d", path, resp.Close, resp.Header.Get("Connection"), resp.ContentLength)
		}
	}
	send(t, c, "GET /big HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
	resp, body = read(t, br, "GET")
	if !resp.Close || body != big {
		t.Fatalf("HTTP/1.0 keep-alive, unknown length: close %v, %d bytes", resp.Close, len(body))
	}
	if !closed(c, br) {
		t.Fatal("HTTP/1.0 connection left open after a close-delimited answer")
	}
}

func TestRefusals(t *testing.T) {
	var served atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) })
	_, addr := start(t, Config{Handler: h, MaxHeaderBytes: 1024, ErrorLog: quiet()})
	for _, tc := range []struct {
		name, raw string
		status    int
	}{
		{"no host", "GET / HTTP/1.1\r\n\r\n", 400},
		{"two hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
		{"bad host", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400},
		{"bad header name", "GET / HTTP/1.1\r\nHost: a\r\nBad Name: 1\r\n\r\n", 400},
		{"bad header value", "GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n", 400},
		{"gzip coding", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
		{"two codings", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501},
		{"two lengths", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400},
		{"bad length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400},
		{"http/2 request", "GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505},
		{"request line", "GET\r\n\r\n", 400},
		{"expect", "POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\n", 417},
		{"header cap", "GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("a", 8000) + "\r\n\r\n", 431},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := dial(t, addr)
			send(t, c, tc.raw)
			resp, _ := read(t, br, "GET")
			if resp.StatusCode != tc.status || !resp.Close {
				t.Fatalf("status %d close %v, want %d and close", resp.StatusCode, resp.Close, tc.status)
			}
			if !closed(c, br) {
				t.Fatal("connection left open")
			}
		})
	}
	if n := served.Load(); n != 0 {
		t.Fatalf("the handler served %d refused requests", n)
	}
}

// A chunked body's connection closes after its answer: bytes after it are
// never read as a request (RFC 9112 §6.1), whatever Content-Length said.
func TestChunkedRequestCloses(t *testing.T) {
	var paths []string
	var mu sync.Mutex
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		w.Write(b)
	})
	_, addr := start(t, Config{Handler: h, ErrorLog: quiet()})
	c, br := dial(t, addr)
	send(t, c, "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, body := read(t, br, "POST")
	if resp.StatusCode != 200 || body != "abc" || !resp.Close {
		t.Fatalf("status %d body %q close %v", resp.StatusCode, body, resp.Close)
	}
	if !closed(c, br) {
		t.Fatal("connection left open after a chunked body")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 || paths[0] != "/a" {
		t.Fatalf("served %v", paths)
	}
}

func TestExpectContinue(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/refuse" {
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	})
	_, addr := start(t, Config{Handler: h, ErrorLog: quiet()})
	c, br := dial(t, addr)
	send(t, c, "POST /read HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, "100 Continue") {
		t.Fatalf("first line %q, %v; want 100 Continue", line, err)
	}
	br.ReadString('\n')
	send(t, c, "hello")
	if resp, body := read(t, br, "POST"); resp.StatusCode != 200 || body != "hello" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	// Refused unread: no 100 Continue, and the connection closes (the
	// client may or may not send the body).
	send(t, c, "POST /refuse HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5000000\r\n\r\n")
	line, _ = br.ReadString('\n')
	if !strings.Contains(line, "413") {
		t.Fatalf("first line %q, want 413", line)
	}
	for {
		l, err := br.ReadString('\n')
		if err != nil || l == "\r\n" {
			break
		}
	}
	if !closed(c, br) {
		t.Fatal("connection left open after a refused 100-continue body")
	}
}

func TestPanics(t *testing.T) {
	var logged bytes.Buffer
	var mu sync.Mutex
	lw := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logged.Write(p) })
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/abort" {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: 1\n\n")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		panic("boom")
	})
	_, addr := start(t, Config{Handler: h, ErrorLog: log.New(lw, "", 0)})
	c, br := dial(t, addr)
	send(t, c, "GET /abort HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); err == nil || string(b) != "data: 1\n\n" {
		t.Fatalf("aborted stream: %q, %v; want its first event, then an error", b, err)
	}
	c, br = dial(t, addr)
	send(t, c, "GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
	if !closed(c, br) {
		t.Fatal("connection left open after a panic")
	}
	mu.Lock()
	defer mu.Unlock()
	if s := logged.String(); !strings.Contains(s, "boom") || strings.Contains(s, "abort Handler") || strings.Count(s, "h1: panic") != 1 {
		t.Fatalf("log: %q", s)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// A client that closes its connection ends the request's context, while
// the handler waits without writing; a pipelined request behind it does
// not.
func TestClientGone(t *testing.T) {
	ended := make(chan string, 4)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		select {
		case <-r.Context().Done():
			ended <- "gone"
		case <-time.After(300 * time.Millisecond):
			ended <- "served"
			io.WriteString(w, "ok")
		}
	})
	_, addr := start(t, Config{Handler: h, ClientGoneAfter: 10 * time.Millisecond})
	for _, body := range []string{"", "abc"} {
		c, _ := dial(t, addr)
		send(t, c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
		time.Sleep(50 * time.Millisecond)
		c.Close()
		if got := <-ended; got != "gone" {
			t.Fatalf("body %q: the handler's request %s after the client closed", body, got)
		}
	}
	c, br := dial(t, addr)
	send(t, c, "GET /1 HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n")
	for i := range 2 {
		if resp, body := read(t, br, "GET"); body != "ok" {
			t.Fatalf("pipelined %d: %d %q", i, resp.StatusCode, body)
		}
		if got := <-ended; got != "served" {
			t.Fatalf("pipelined %d ended %s", i, got)
		}
	}
}

// A failed write ends the request's context at once.
func TestWriteFailureEndsContext(t *testing.T) {
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		for i := 0; ; i++ {
			if _, err := io.WriteString(w, "data: x\n\n"); err != nil {
				break
			}
			if err := rc.Flush(); err != nil {
				break
			}
			if i == 2 {
				ended <- nil
			}
			time.Sleep(5 * time.Millisecond)
		}
		ended <- r.Context().Err()
	})
	_, addr := start(t, Config{Handler: h, ClientGoneAfter: time.Hour, ErrorLog: quiet()})
	c, _ := dial(t, addr)
	send(t, c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	<-ended
	c.Close()
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the request's context lives on after a failed write")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("writes to a closed client kept succeeding")
	}
}

func TestShutdown(t *testing.T) {
	release := make(chan struct{})
	began := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(began)
			<-release
		}
		io.WriteString(w, "ok")
	})
	s, addr := start(t, Config{Handler: h, ErrorLog: quiet()})
	idle, ibr := dial(t, addr)
	send(t, idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	read(t, ibr, "GET")
	busy, bbr := dial(t, addr)
	send(t, busy, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-began
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	if !closed(idle, ibr) {
		t.Fatal("an idle connection stayed open through Shutdown")
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatal("a new connection was accepted after Shutdown")
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v while a request ran", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	resp, body := read(t, bbr, "GET")
	if body != "ok" || !resp.Close {
		t.Fatalf("the running request: %q, close %v", body, resp.Close)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A request that outlives Shutdown's context: its error, and Close
	// ends the request.
	s2, addr2 := start(t, Config{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }), ErrorLog: quiet()})
	c, _ := dial(t, addr2)
	send(t, c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	time.Sleep(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s2.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want its context's deadline", err)
	}
	s2.Close()
	waitNoConns(t, s2, "after Close")
}

func TestTimeouts(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	_, addr := start(t, Config{Handler: h, ReadHeaderTimeout: 100 * time.Millisecond, IdleTimeout: 200 * time.Millisecond, ErrorLog: quiet()})
	// Headers that never end.
	c, br := dial(t, addr)
	send(t, c, "GET / HTTP/1.1\r\nHost: x\r\n")
	began := time.Now()
	if !closed(c, br) {
		t.Fatal("a stalled header kept its connection")
	}
	if d := time.Since(began); d > time.Second {
		t.Fatalf("closed after %v", d)
	}
	// A connection that never sends a byte.
	c, br = dial(t, addr)
	if !closed(c, br) {
		t.Fatal("a silent connection was kept")
	}
	// An idle keep-alive connection.
	c, br = dial(t, addr)
	send(t, c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	read(t, br, "GET")
	began = time.Now()
	if !closed(c, br) {
		t.Fatal("an idle connection was kept")
	}
	if d := time.Since(began); d < 150*time.Millisecond {
		t.Fatalf("an idle connection closed after %v, before idle_timeout", d)
	}
}

func TestH2CHandoff(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "%s %s", r.Proto, r.URL.Path) })
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	p.SetHTTP1(true)
	s, addr := start(t, Config{Handler: h, Fallback: &http.Server{Handler: h, Protocols: &p}, ErrorLog: quiet()})
	var cp http.Protocols
	cp.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: &cp}, Timeout: 5 * time.Second}
	for range 2 {
		resp, err := client.Get("http://" + addr + "/two")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "HTTP/2.0 /two" {
			t.Fatalf("h2c: %q", b)
		}
	}
	resp, err := http.Get("http://" + addr + "/one")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "HTTP/1.1 /one" {
		t.Fatalf("HTTP/1.1: %q", b)
	}
	// Shutdown drains the handed-off connections too (net/http's).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with an idle h2c connection: %v", err)
	}
	if _, err := client.Get("http://" + addr + "/three"); err == nil {
		t.Fatal("an h2c request served after Shutdown")
	}
}

func TestConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("no handler accepted")
	}
	if _, err := New(Config{Handler: http.NotFoundHandler(), IdleTimeout: -1}); err == nil {
		t.Fatal("a negative timeout accepted")
	}
}

// Many clients at once, keep-alive, bodies and answers of many sizes, some
// hanging up mid-answer: every answer read whole is right, and once the
// clients are gone no connection and no goroutine is left.
func TestConcurrentClients(t *testing.T) {
	before := runtime.NumGoroutine()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		fmt.Fprintf(w, "%d:", len(b))
		for i := 0; i < n; i += 1000 {
			w.Write(bytes.Repeat([]byte{'y'}, min(1000, n-i)))
			w.(http.Flusher).Flush()
		}
	})
	s, addr := start(t, Config{Handler: h, ClientGoneAfter: time.Millisecond, ErrorLog: quiet()})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			br := bufio.NewReader(c)
			for i := range 30 {
				size, n := (g*31+i*17)%5000, (g*7+i*13)%7000
				fmt.Fprintf(c, "POST /?n=%d HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", n, size, strings.Repeat("b", size))
				if g%4 == 0 && i == 20 {
					return // hang up before the answer
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					errs <- fmt.Errorf("client %d request %d: %w", g, i, err)
					return
				}
				b, err := io.ReadAll(resp.Body)
				if want := fmt.Sprintf("%d:%s", size, strings.Repeat("y", n)); err != nil || string(b) != want {
					errs <- fmt.Errorf("client %d request %d: %d bytes (%v), want %d", g, i, len(b), err, len(want))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitNoConns(t, s, "after their clients closed")
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+2 {
		t.Fatalf("%d goroutines, %d before", n, before)
	}
}

// waitNoConns fails t unless s holds no connection within 5 s.
func waitNoConns(t *testing.T, s *Server, when string) {
	t.Helper()
	open := func() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.conns) }
	for deadline := time.Now().Add(5 * time.Second); open() > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := open(); n > 0 {
		t.Fatalf("%d connections left %s", n, when)
	}
}
