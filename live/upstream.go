package live

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// h1Client carries proxied requests to http:// engines over pooled
// HTTP/1.1 keep-alive connections, on the handler's own goroutine: the
// request is written with one writev, the response read from the
// connection by the goroutine that relays it. net/http's Transport does the
// same work with two goroutines of its own per connection and several
// hand-offs per request, which measured as most of what the proxy added
// over nginx's CPU per request. Responses are parsed by readResponse
// (response.go: http.ReadResponse's framing, Content-Length, chunked,
// close-delimited, with fewer allocations and a bounded head). Scrapes and
// probes, https:// engines and a transport given in Deps use net/http.
type h1Client struct {
	dialer      net.Dialer
	maxIdle     int
	idleTimeout time.Duration

	mu     sync.Mutex
	idle   map[string][]*h1Conn // by host:port, most recently used last
	closed bool
}

type h1Conn struct {
	c      net.Conn
	br     *bufio.Reader
	idleAt time.Time
	// iov and bufs hold a request's head and body parts for its one
	// writev (kept here, they cost no allocation a request).
	iov  [4][]byte
	bufs net.Buffers
}

func newH1Client(maxIdle int, idleTimeout time.Duration) *h1Client {
	return &h1Client{
		dialer:  net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second},
		maxIdle: maxIdle, idleTimeout: idleTimeout, idle: map[string][]*h1Conn{},
	}
}

// get returns an idle connection to addr (reused) or dials one.
func (h *h1Client) get(ctx context.Context, addr string) (*h1Conn, bool, error) {
	now := time.Now()
	h.mu.Lock()
	list := h.idle[addr]
	for len(list) > 0 {
		pc := list[len(list)-1]
		list = list[:len(list)-1]
		if now.Sub(pc.idleAt) < h.idleTimeout {
			h.idle[addr] = list
			h.mu.Unlock()
			return pc, true, nil
		}
		pc.c.Close()
	}
	h.idle[addr] = list
	h.mu.Unlock()
	c, err := h.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	return &h1Conn{c: c, br: bufio.NewReaderSize(c, 16<<10)}, false, nil
}

// put returns a connection whose response was read whole to the pool,
// closing those idle past the timeout and any beyond maxIdle.
func (h *h1Client) put(addr string, pc *h1Conn) {
	pc.idleAt = time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	list := h.idle[addr]
	if h.closed || len(list) >= h.maxIdle {
		pc.c.Close()
		return
	}
	// The oldest are first: drop those idle too long.
	n := 0
	for n < len(list) && pc.idleAt.Sub(list[n].idleAt) >= h.idleTimeout {
		list[n].c.Close()
		n++
	}
	if n > 0 {
		list = append(list[:0], list[n:]...)
	}
	h.idle[addr] = append(list, pc)
}

// closeIdle closes every idle connection; with final, later ones too.
func (h *h1Client) closeIdle(final bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for addr, list := range h.idle {
		for _, pc := range list {
			pc.c.Close()
		}
		delete(h.idle, addr)
	}
	h.closed = h.closed || final
}

var errNoResponse = errors.New("the engine closed the connection before answering")

// longAgo is a deadline in the past: it interrupts a blocked read or write.
var longAgo = time.Unix(1, 0)

// do sends a POST of body to u with hdr's lines and returns the response, whose
// body must be read to its end or closed. reused reports a pooled
// connection. ctx bounds the whole exchange, the body's reads included.
func (h *h1Client) do(ctx context.Context, u *url.URL, hdr headerLines, body upBody) (resp *http.Response, reused bool, err error) {
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	pc, reused, err := h.get(ctx, addr)
	if err != nil {
		return nil, false, err
	}
	// Cancellation interrupts whatever the connection is doing; a
	// connection it touched is never reused.
	stop := context.AfterFunc(ctx, func() { pc.c.SetDeadline(longAgo) })
	fail := func(err error) (*http.Response, bool, error) {
		stop()
		pc.c.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, reused, err
	}
	bp := bufPool.Get().(*[]byte)
	head := appendRequestHead((*bp)[:0], u, hdr, body.len())
	pc.bufs = body.appendTo(append(net.Buffers(pc.iov[:0]), head))
	_, err = pc.bufs.WriteTo(pc.c)
	pc.iov = [4][]byte{} // the body is the request's, not the connection's
	*bp = head[:cap(head)]
	bufPool.Put(bp)
	if err != nil {
		return fail(err)
	}
	resp, err = readResponse(pc.br)
	// Interim answers (103 Early Hints, an unasked 100 Continue) come
	// before the final one: skipped, as net/http's Transport skips them,
	// and as many (max1xx) at most.
	for n := 0; err == nil && resp.StatusCode/100 == 1; n++ {
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			err = errors.New("the engine switched protocols (101), which the proxy never asks for")
		case n == max1xx:
			err = fmt.Errorf("the engine sent more than %d interim (1xx) responses", max1xx)
		default:
			resp, err = readResponse(pc.br)
		}
	}
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = errNoResponse
		}
		return fail(err)
	}
	keep := !resp.Close && (resp.ContentLength >= 0 || len(resp.TransferEncoding) > 0)
	resp.Body = &h1Body{rc: resp.Body, h: h, pc: pc, addr: addr, stop: stop, keep: keep}
	return resp, reused, nil
}

// max1xx bounds the interim responses read before a final one (net/http's
// Transport allows 5).
const max1xx = 5

// headerLines writes a request's header lines ("Name: value\r\n", each
// through appendHeaderLine) after its Host and Content-Length.
type headerLines interface {
	appendLines(b []byte) []byte
}

// appendRequestHead writes a POST's request line and headers.
func appendRequestHead(b []byte, u *url.URL, hdr headerLines, n int) []byte {
	b = append(b, "POST "...)
	b = append(b, u.EscapedPath()...)
	if u.RawQuery != "" {
		b = append(b, '?')
		b = append(b, u.RawQuery...)
	}
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, u.Host...)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, "\r\n"...)
	b = hdr.appendLines(b)
	return append(b, "\r\n"...)
}

// appendHeaderLine writes one header line, or nothing when k or v would
// break the request's framing.
func appendHeaderLine(b []byte, k, v string) []byte {
	if !validHeaderName(k) || !validHeaderValue(v) {
		return b
	}
	b = append(b, k...)
	b = append(b, ": "...)
	b = append(b, v...)
	return append(b, "\r\n"...)
}

// validHeaderName and validHeaderValue keep a header from breaking the
// request's framing (the server parsed them already; this is a second
// guard for headers set in code).
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c == ':' || c >= 0x7f {
			return false
		}
	}
	return true
}

func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}

// h1Body is a response body on a pooled connection: read to its end, the
// connection goes back to the pool; closed before, it is closed.
type h1Body struct {
	rc   io.ReadCloser
	h    *h1Client
	pc   *h1Conn
	addr string
	stop func() bool
	keep bool
	done bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.release(true)
	} else if err != nil {
		b.release(false)
	}
	return n, err
}

func (b *h1Body) Close() error {
	if !b.done {
		b.release(false)
	}
	return nil
}

// release ends the exchange: the connection is reused when the body was
// read whole, the server keeps it alive and no cancellation touched it.
func (b *h1Body) release(whole bool) {
	b.done = true
	untouched := b.stop()
	if whole && b.keep && untouched {
		b.rc.Close()
		b.h.put(b.addr, b.pc)
		return
	}
	// Close the socket first: closing the body alone would read the rest.
	b.pc.c.Close()
	b.rc.Close()
}
