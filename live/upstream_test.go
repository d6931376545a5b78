package live

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The lean upstream client reuses a connection only after a response read
// whole from an engine that keeps it alive; a cancelled exchange, a body
// closed early, Connection: close and a close-delimited body each cost
// their connection; headers arrive as sent and the body whole.
func TestH1Client(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/close":
			w.Header().Set("Connection", "close")
		case "/raw": // close-delimited: no length, no chunking
			hj, _, _ := w.(http.Hijacker).Hijack()
			io.WriteString(hj, "HTTP/1.1 200 OK\r\n\r\nraw body")
			hj.Close()
			return
		case "/early": // interim answers before the final one
			hj, bw, _ := w.(http.Hijacker).Hijack()
			io.WriteString(bw, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX-Echo: final\r\nContent-Length: 5\r\n\r\n"+string(b))
			bw.Flush()
			hj.Close()
			return
		case "/many1xx", "/switch":
			hj, bw, _ := w.(http.Hijacker).Hijack()
			if r.URL.Path == "/switch" {
				io.WriteString(bw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
			} else {
				io.WriteString(bw, strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 6)+"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			}
			bw.Flush()
			hj.Close()
			return
		case "/slow":
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		w.Header().Set("X-Echo", r.Header.Get("X-In")+"|"+r.URL.RawQuery)
		w.Write(b)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	h := newH1Client(8, time.Minute)
	defer h.closeIdle(true)
	base, _ := url.Parse(srv.URL)
	get := func(ctx context.Context, path string) (*http.Response, bool, error) {
		u := *base
		u.Path, u.RawQuery, _ = strings.Cut(path, "?")
		return h.do(ctx, &u, plainHeader{"X-In": {"v"}}, plainBody([]byte("hello")))
	}
	read := func(path string) (string, bool) {
		resp, reused, err := get(context.Background(), path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return resp.Header.Get("X-Echo") + " " + string(b), reused
	}
	if got, reused := read("/a?q=1"); got != "v|q=1 hello" || reused {
		t.Fatalf("first: %q reused %v", got, reused)
	}
	if _, reused := read("/b"); !reused || conns.Load() != 1 {
		t.Fatalf("second not on the pooled connection (reused %v, %d connections)", reused, conns.Load())
	}
	read("/close")
	if _, reused := read("/c"); reused || conns.Load() != 2 {
		t.Fatalf("Connection: close was reused (%d connections)", conns.Load())
	}
	if got, _ := read("/raw"); got != " raw body" {
		t.Fatalf("close-delimited body %q", got)
	}
	if _, reused := read("/d"); reused || conns.Load() != 3 {
		t.Fatalf("a close-delimited connection was reused (%d connections)", conns.Load())
	}
	if got, _ := read("/early"); got != "final hello" {
		t.Fatalf("after interim answers: %q, want the final one's", got)
	}
	for _, path := range []string{"/many1xx", "/switch"} {
		if _, _, err := get(context.Background(), path); err == nil {
			t.Fatalf("%s: no error", path)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	resp, _, err := get(ctx, "/slow")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := io.ReadAll(resp.Body); err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("a cancelled body read ended %v after %v", err, time.Since(start))
	}
	if _, reused := read("/e"); reused {
		t.Fatal("a cancelled exchange's connection was reused")
	}
}

// plainHeader sends a header map as it is (but Host and Content-Length,
// which the request head sets).
type plainHeader http.Header

func (h plainHeader) appendLines(b []byte) []byte {
	for k, vs := range h {
		if k == "Host" || k == "Content-Length" {
			continue
		}
		for _, v := range vs {
			b = appendHeaderLine(b, k, v)
		}
	}
	return b
}
