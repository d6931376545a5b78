package h1

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkServe is one request after another on a keep-alive loopback
// connection: a 1 KiB POST, answered in three flushed events (chunked), as
// the proxy's streams are; h1 against net/http's server with the same
// handler.
func BenchmarkServe(b *testing.B) {
	body := strings.Repeat("x", 1024)
	raw := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for range 3 {
			io.WriteString(w, "data: {\"choices\":[{\"text\":\"token\"}]}\n\n")
			rc.Flush()
		}
	})
	for _, tc := range []struct {
		name  string
		serve func(net.Listener) (stop func())
	}{
		{"h1", func(l net.Listener) func() {
			s, err := New(Config{Handler: h})
			if err != nil {
				b.Fatal(err)
			}
			go s.Serve(l)
			return func() { s.Close() }
		}},
		{"net-http", func(l net.Listener) func() {
			s := &http.Server{Handler: h}
			go s.Serve(l)
			return func() { s.Close() }
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer tc.serve(ln)()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := io.WriteString(c, raw); err != nil {
					b.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
