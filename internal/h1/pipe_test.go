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
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/internal/pipenet"
)

// startPipe serves cfg on an in-memory listener (net.Pipe connections)
// inside the caller's bubble; stop closes the server and waits for every
// goroutine it started.
func startPipe(t *testing.T, cfg Config) (l *pipeListener, stop func()) {
	t.Helper()
	if cfg.ErrorLog == nil {
		cfg.ErrorLog = quiet()
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l = &pipeListener{pipenet.Listen("h1")}
	done := make(chan struct{})
	go func() { s.Serve(l); close(done) }()
	return l, func() {
		s.Close()
		<-done
		synctest.Wait()
	}
}

// pipeListener is a pipenet listener that tests dial without errors.
type pipeListener struct{ *pipenet.Listener }

func (l *pipeListener) dial() net.Conn {
	c, err := l.Dial(context.Background(), "", "")
	if err != nil {
		panic(err) // the listener is open for the whole test
	}
	return c
}

// untilClosed reads c to its end and reports how long that took on the
// bubble's clock.
func untilClosed(c net.Conn) time.Duration {
	began := time.Now()
	io.Copy(io.Discard, c)
	return time.Since(began)
}

func TestTimeoutsOnTheClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
		l, stop := startPipe(t, Config{Handler: h, ReadHeaderTimeout: 3 * time.Second, IdleTimeout: 7 * time.Second})
		defer stop()

		// A connection that never sends a byte: read_header_timeout.
		c := l.dial()
		if d := untilClosed(c); d != 3*time.Second {
			t.Fatalf("a silent connection closed after %v, want 3s", d)
		}
		// Headers that never end: read_header_timeout from their first byte.
		c = l.dial()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n")
		if d := untilClosed(c); d != 3*time.Second {
			t.Fatalf("a stalled header closed after %v, want 3s", d)
		}
		// An idle keep-alive connection: idle_timeout after its answer.
		c = l.dial()
		go io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		began := time.Now()
		io.Copy(io.Discard, br)
		if d := time.Since(began); d != 7*time.Second {
			t.Fatalf("an idle connection closed after %v, want 7s", d)
		}
	})
}

// A handler that waits without writing learns of its client's close
// ClientGoneAfter into the request at the latest; one that answers sooner
// costs no read of the connection.
func TestClientGoneOnTheClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ended := make(chan time.Duration, 1)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			began := time.Now()
			io.ReadAll(r.Body)
			select {
			case <-r.Context().Done():
				ended <- time.Since(began)
			case <-time.After(time.Hour):
				ended <- -1
			}
		})
		l, stop := startPipe(t, Config{Handler: h, ClientGoneAfter: 200 * time.Millisecond})
		defer stop()
		for _, closeAfter := range []time.Duration{time.Millisecond, time.Second} {
			c := l.dial()
			io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
			time.Sleep(closeAfter)
			c.Close()
			want := max(closeAfter, 200*time.Millisecond)
			if got := <-ended; got != want {
				t.Fatalf("client closed at %v: the request ended at %v, want %v", closeAfter, got, want)
			}
		}
	})
}

// The property: requests pipelined on one connection, with bodies of any
// size, framed by Content-Length or (last, since it closes the
// connection) chunked, get their answers in order, each whole, framed
// however its size and flushes call for.
func TestPipelinedProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		type req struct {
			post    bool
			body    int
			chunked bool
			answer  int
			flush   bool
		}
		n := rapid.IntRange(1, 6).Draw(rt, "n")
		reqs := make([]req, n)
		for i := range reqs {
			reqs[i] = req{
				post:   rapid.Bool().Draw(rt, "post"),
				body:   rapid.IntRange(0, 6000).Draw(rt, "body"),
				answer: rapid.IntRange(0, 6000).Draw(rt, "answer"),
				flush:  rapid.Bool().Draw(rt, "flush"),
			}
			reqs[i].chunked = i == n-1 && reqs[i].post && rapid.Bool().Draw(rt, "chunked")
		}
		var raw bytes.Buffer
		for i, r := range reqs {
			method := "GET"
			if r.post {
				method = "POST"
			}
			fmt.Fprintf(&raw, "%s /%d?answer=%d&flush=%v HTTP/1.1\r\nHost: x\r\n", method, i, r.answer, r.flush)
			body := strings.Repeat(string(rune('a'+i)), r.body)
			switch {
			case !r.post:
			case r.chunked:
				raw.WriteString("Transfer-Encoding: chunked\r\n\r\n")
				for len(body) > 0 {
					k := min(len(body), 1000)
					fmt.Fprintf(&raw, "%x\r\n%s\r\n", k, body[:k])
					body = body[k:]
				}
				raw.WriteString("0\r\n\r\n")
				continue
			default:
				fmt.Fprintf(&raw, "Content-Length: %d\r\n", r.body)
			}
			raw.WriteString("\r\n")
			if r.post {
				raw.WriteString(body)
			}
		}
		var result []string
		synctest.Test(t, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := io.ReadAll(r.Body)
				if err != nil {
					panic(err)
				}
				k, _ := strconv.Atoi(r.URL.Query().Get("answer"))
				fmt.Fprintf(w, "%s %d|", r.URL.Path, len(b))
				if r.URL.Query().Get("flush") == "true" {
					w.(http.Flusher).Flush()
				}
				w.Write(bytes.Repeat([]byte{'z'}, k))
			})
			l, stop := startPipe(t, Config{Handler: h})
			defer stop()
			c := l.dial()
			go func() { c.Write(raw.Bytes()) }()
			br := bufio.NewReader(c)
			for range reqs {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					result = append(result, "error: "+err.Error())
					break
				}
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					result = append(result, "body error: "+err.Error())
					break
				}
				result = append(result, string(b))
			}
			c.Close()
		})
		if len(result) != n {
			rt.Fatalf("%d answers to %d requests: %q", len(result), n, result)
		}
		for i, r := range reqs {
			body := 0
			if r.post {
				body = r.body
			}
			if want := fmt.Sprintf("/%d %d|%s", i, body, strings.Repeat("z", r.answer)); result[i] != want {
				rt.Fatalf("answer %d: %.80q, want %.80q", i, result[i], want)
			}
		}
	})
}

// FuzzRequests sends any bytes as a connection's requests: the server
// answers each with a well-formed response or closes the connection, and
// never panics.
func FuzzRequests(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /b HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\nzz\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
		"GET / HTTP/1.0\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n",
		"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n",
		"\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var logged bytes.Buffer
		var out []byte
		var methods []string // in the order the handler served them
		synctest.Test(t, func(t *testing.T) {
			var mu sync.Mutex
			lw := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logged.Write(p) })
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				methods = append(methods, r.Method)
				mu.Unlock()
				b, _ := io.ReadAll(r.Body)
				fmt.Fprintf(w, "%s %s %d", r.Method, r.URL.Path, len(b))
			})
			l, stop := startPipe(t, Config{Handler: h, MaxHeaderBytes: 4096, ErrorLog: log.New(lw, "", 0)})
			defer stop()
			c := l.dial()
			go func() { c.Write(data) }()
			out, _ = io.ReadAll(c)
			c.Close()
		})
		if bytes.Contains(logged.Bytes(), []byte("panic")) {
			t.Fatalf("the server panicked: %s", logged.Bytes())
		}
		br := bufio.NewReader(bytes.NewReader(out))
		for {
			if _, err := br.Peek(1); err != nil {
				break
			}
			method := "GET" // a refusal, after the served ones
			if len(methods) > 0 {
				method = methods[0]
			}
			resp, err := http.ReadResponse(br, &http.Request{Method: method})
			if err != nil {
				t.Fatalf("a malformed answer: %v in %q", err, out)
			}
			if resp.StatusCode == http.StatusContinue {
				continue
			}
			if len(methods) > 0 {
				methods = methods[1:]
			}
			if _, err := io.Copy(io.Discard, resp.Body); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("an answer's body: %v in %q", err, out)
			}
		}
	})
}
