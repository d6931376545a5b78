package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// idle bounds every read and write of the raw loop.
const idle = 2 * time.Minute

// upConn is a pooled connection to an engine.
type upConn struct {
	c  net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

// pool keeps up to cap(idle) idle connections to one engine.
type pool struct {
	addr string
	idle chan *upConn
}

func (p *pool) get() (*upConn, error) {
	select {
	case u := <-p.idle:
		return u, nil
	default:
	}
	c, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &upConn{c: c, br: bufio.NewReaderSize(c, 32<<10), bw: bufio.NewWriterSize(c, 16<<10)}, nil
}

func (p *pool) put(u *upConn) {
	select {
	case p.idle <- u:
	default:
		u.c.Close()
	}
}

// burner spends a fixed amount of CPU time per request: loops of
// arithmetic, counted against the clock once at start, so that a request
// costs the same work whether or not the thread is descheduled meanwhile.
// -burn makes go-raw cost what a proxy with more work of its own (such as
// routing and tokenization) costs, to tell what that CPU does to the tail.
type burner struct {
	before, after int // loops before forwarding and after the answer
	sink          uint64
}

func newBurner(d time.Duration, before float64) *burner {
	if d <= 0 {
		return &burner{}
	}
	// Loops per microsecond, the best of a few tries (the others were
	// interrupted).
	b := &burner{}
	best := 0.0
	for range 5 {
		const n = 200000
		t0 := time.Now()
		b.spin(n)
		if r := n / float64(time.Since(t0).Microseconds()+1); r > best {
			best = r
		}
	}
	loops := int(best * float64(d.Microseconds()))
	// By default as live: most of its own work (parse, tokenize, route)
	// before the request goes upstream, the rest (settle, index) after the
	// answer.
	b.before = int(float64(loops) * before)
	b.after = loops - b.before
	return b
}

func (b *burner) spin(n int) {
	x := b.sink
	for range n {
		x = x*6364136223846793005 + 1442695040888963407
	}
	b.sink = x
}

func serveRaw(listen string, hosts []string, burn time.Duration, before float64) error {
	var pools []*pool
	for _, h := range hosts {
		pools = append(pools, &pool{addr: h, idle: make(chan *upConn, 512)})
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	var next atomic.Uint64
	b := newBurner(burn, before)
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond) // such as too many open files
			continue
		}
		go serveConn(c, pools, &next, b)
	}
}

// serveConn serves one client connection's requests in turn.
func serveConn(c net.Conn, pools []*pool, next *atomic.Uint64, shared *burner) {
	b := *shared // each connection spins on its own copy
	defer c.Close()
	br := bufio.NewReaderSize(c, 16<<10)
	bw := bufio.NewWriterSize(c, 16<<10)
	buf := make([]byte, 32<<10)
	for {
		c.SetDeadline(time.Now().Add(idle))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(io.LimitReader(req.Body, 32<<20))
		if err != nil {
			return
		}
		p := pools[next.Add(1)%uint64(len(pools))]
		b.spin(b.before)
		if !relayRaw(p, req, body, bw, buf) {
			return
		}
		b.spin(b.after)
	}
}

// relayRaw sends one request to p and relays its answer, chunked; false:
// the client connection cannot go on.
func relayRaw(p *pool, req *http.Request, body []byte, bw *bufio.Writer, buf []byte) bool {
	u, err := p.get()
	if err != nil {
		bw.WriteString("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return bw.Flush() == nil
	}
	u.c.SetDeadline(time.Now().Add(idle))
	u.bw.WriteString(req.Method + " " + req.URL.RequestURI() + " HTTP/1.1\r\nHost: " + p.addr +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n")
	u.bw.Write(body)
	if err := u.bw.Flush(); err != nil {
		u.c.Close()
		return false
	}
	resp, err := http.ReadResponse(u.br, req)
	if err != nil {
		u.c.Close()
		return false
	}
	bw.WriteString("HTTP/1.1 " + strconv.Itoa(resp.StatusCode) + " " + http.StatusText(resp.StatusCode) + "\r\n")
	for k, vs := range resp.Header {
		if k == "Connection" || k == "Transfer-Encoding" || k == "Content-Length" {
			continue
		}
		for _, v := range vs {
			bw.WriteString(k + ": " + v + "\r\n")
		}
	}
	bw.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			bw.WriteString(strconv.FormatInt(int64(n), 16) + "\r\n")
			bw.Write(buf[:n])
			bw.WriteString("\r\n")
			if err == nil && bw.Flush() != nil {
				u.c.Close()
				return false
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			u.c.Close() // a broken stream: no clean end for the client
			return false
		}
	}
	bw.WriteString("0\r\n\r\n")
	if resp.Close {
		u.c.Close()
	} else {
		p.put(u)
	}
	return bw.Flush() == nil
}
