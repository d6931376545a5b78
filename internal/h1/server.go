package h1

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Config is a server's handler and limits.
type Config struct {
	// Handler serves every HTTP/1 request.
	Handler http.Handler
	// ReadHeaderTimeout bounds reading a request's line and headers, from
	// its first byte (and a new connection's wait for that byte). Default
	// 10s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that waits this long for
	// its next request. Default 2m.
	IdleTimeout time.Duration
	// ReadTimeout bounds reading a request's body, from its header on,
	// when its handler sets no read deadline of its own. Default 30s.
	ReadTimeout time.Duration
	// WriteTimeout bounds the server's own writes: an answer's end after
	// its handler returns (when the handler left no write deadline), 100
	// Continue, and refusals. Default 10s. The handler bounds its writes
	// with http.ResponseController's SetWriteDeadline.
	WriteTimeout time.Duration
	// MaxHeaderBytes caps a request's line and headers; past it the
	// answer is 431. Default 1 MiB (net/http's).
	MaxHeaderBytes int
	// ClientGoneAfter is how old a request gets, while its handler has
	// not streamed, before the connection is read to notice the client
	// closing it (which ends the request's context). Default 50ms; a
	// failed write ends the context at once whatever its age.
	ClientGoneAfter time.Duration
	// TLSConfig, when set, makes every connection TLS: its handshake is
	// bounded by ReadHeaderTimeout, and ALPN offers h2 (served by
	// Fallback, when set) and http/1.1 (served here).
	TLSConfig *tls.Config
	// Fallback, when set, serves the connections that speak HTTP/2: h2
	// chosen by ALPN, or h2c (prior knowledge) without TLS; without it
	// h2 is not offered and h2c gets 505. With TLS, its TLSConfig must
	// offer h2 in NextProtos: net/http's server speaks HTTP/2 only then.
	Fallback *http.Server
	// ErrorLog gets a line per handler panic (but ErrAbortHandler's) and
	// per misuse of a ResponseWriter; nil: the log package's default.
	ErrorLog *log.Logger
}

// Defaults for Config's zero fields.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 10 * time.Second
	DefaultMaxHeaderBytes    = 1 << 20
	DefaultClientGoneAfter   = 50 * time.Millisecond
	// maxDiscard is how much of a body its handler left unread is read
	// and dropped to keep the connection; more closes it (net/http's
	// figure).
	maxDiscard = 256 << 10
)

// Server serves HTTP/1.x on listeners; New makes one.
type Server struct {
	cfg     Config
	baseCtx context.Context
	cancel  context.CancelFunc

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	handoff   *handoffListener
	closed    atomic.Bool // Shutdown or Close called

	date atomic.Pointer[dateLine]
}

// New checks cfg and fills in its defaults.
func New(cfg Config) (*Server, error) {
	if cfg.Handler == nil {
		return nil, errors.New("h1: a handler is required")
	}
	if cfg.ReadHeaderTimeout < 0 || cfg.IdleTimeout < 0 || cfg.ReadTimeout < 0 || cfg.WriteTimeout < 0 || cfg.ClientGoneAfter < 0 || cfg.MaxHeaderBytes < 0 {
		return nil, errors.New("h1: timeouts and the header cap must not be negative")
	}
	if cfg.ReadHeaderTimeout == 0 {
		cfg.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.MaxHeaderBytes == 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if cfg.ClientGoneAfter == 0 {
		cfg.ClientGoneAfter = DefaultClientGoneAfter
	}
	if cfg.ErrorLog == nil {
		cfg.ErrorLog = log.Default()
	}
	if cfg.TLSConfig != nil {
		tc := cfg.TLSConfig.Clone()
		tc.NextProtos = []string{"http/1.1"}
		if cfg.Fallback != nil {
			tc.NextProtos = []string{"h2", "http/1.1"}
		}
		cfg.TLSConfig = tc
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, baseCtx: ctx, cancel: cancel, listeners: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}}
	if cfg.Fallback != nil {
		s.handoff = &handoffListener{ch: make(chan net.Conn), done: make(chan struct{})}
	}
	return s, nil
}

// Serve accepts connections on l and serves each in a goroutine of its
// own until Shutdown or Close, after which it returns
// http.ErrServerClosed; any other accept error that is not a timeout ends
// it too. l is closed when Serve returns.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		l.Close()
		return http.ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	if s.handoff != nil && s.handoff.addr == nil {
		s.handoff.addr = l.Addr()
		go s.cfg.Fallback.Serve(s.handoff)
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
		l.Close()
	}()
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.closed.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		c := s.newConn(nc)
		if c == nil {
			continue
		}
		go c.serve()
	}
}

// Shutdown stops accepting, closes idle connections at once and the rest
// after the answer each is giving (with "Connection: close"), and waits for
// them all until ctx ends (then it returns ctx's error and leaves them to
// Close). The Fallback server is shut down with the same ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	t := time.NewTimer(time.Millisecond)
	defer t.Stop()
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		if s.closeIdle() == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			t.Reset(wait)
		}
	}
	if s.cfg.Fallback != nil {
		return s.cfg.Fallback.Shutdown(ctx)
	}
	return nil
}

// Close stops accepting and closes every connection now, ending the
// requests on them (their contexts end).
func (s *Server) Close() error {
	s.stop()
	s.mu.Lock()
	for c := range s.conns {
		c.raw.Close()
	}
	s.mu.Unlock()
	s.cancel()
	if s.cfg.Fallback != nil {
		return s.cfg.Fallback.Close()
	}
	return nil
}

func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Swap(true) {
		return
	}
	for l := range s.listeners {
		l.Close()
	}
	if s.handoff != nil {
		s.handoff.close()
	}
}

// closeIdle closes the connections waiting for a request and returns how
// many connections are left.
func (s *Server) closeIdle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.idle.Load() {
			c.raw.Close()
		}
	}
	return len(s.conns)
}

func (s *Server) newConn(nc net.Conn) *conn {
	c := &conn{srv: s, raw: nc, nc: nc, remote: nc.RemoteAddr().String(), header: make(http.Header)}
	c.cr.c, c.cr.remain = c, -1
	c.br = readers.Get().(*bufio.Reader)
	c.br.Reset(&c.cr)
	c.cw.c = c
	c.bw = writers.Get().(*bufio.Writer)
	c.bw.Reset(&c.cw)
	c.idle.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		nc.Close()
		return nil
	}
	s.conns[c] = struct{}{}
	return c
}

// The connections' buffers, kept for the next ones (4 KiB each, as
// net/http's: a body or answer larger than one passes through).
var (
	readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4<<10) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}
)

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (s *Server) logf(format string, args ...any) { s.cfg.ErrorLog.Printf(format, args...) }

// dateLine is a Date header for one second.
type dateLine struct {
	sec  int64
	line []byte // "Date: ...\r\n"
}

func (s *Server) dateHeader(now time.Time) []byte {
	sec := now.Unix()
	if d := s.date.Load(); d != nil && d.sec == sec {
		return d.line
	}
	b := append([]byte("Date: "), now.UTC().AppendFormat(nil, http.TimeFormat)...)
	d := &dateLine{sec: sec, line: append(b, "\r\n"...)}
	s.date.Store(d)
	return d.line
}

// conn is one client connection and the request it is serving.
type conn struct {
	srv *Server
	raw net.Conn // as accepted: what Shutdown and Close close
	// nc is what the connection's goroutine reads and writes: raw, or
	// TLS over it.
	nc     net.Conn
	tls    *tls.ConnectionState
	remote string
	cr     connReader
	br     *bufio.Reader
	cw     connWriter
	bw     *bufio.Writer
	idle   atomic.Bool // waiting for a request (Shutdown closes it)
	header http.Header // the response's, reused request to request
	hdr    []byte      // the response's header lines, from WriteHeader on
	pre    []byte      // the response's body held back (response.pre)
	// writeDeadline: a write deadline may be set on nc.
	writeDeadline bool

	// The running request's client-gone watch (watch.go).
	mu       sync.Mutex
	cancel   context.CancelFunc // nil between requests
	running  bool
	streamed bool // the handler flushed a body: writes notice a gone client
	armed    bool // the request is ClientGoneAfter old
	bodyDone bool // the request body was read to its end (or had none)
	reading  bool // a background read is running
	aborting bool
	bgDone   chan struct{}
	hasByte  bool // the background read got a byte of the next request
	byteBuf  [1]byte
	// readDeadline: the handler set a read deadline of its own.
	readDeadline bool
	timer        *time.Timer
}

// serve is the connection's loop: a request, its answer, the next.
func (c *conn) serve() {
	handedOff := false
	defer func() {
		if v := recover(); v != nil {
			c.logPanic(v)
		}
		c.abortRead()
		if c.timer != nil {
			c.timer.Stop()
		}
		c.srv.forget(c)
		if !handedOff {
			c.nc.Close()
			c.raw.Close()
			c.br.Reset(nil)
			readers.Put(c.br)
		}
		c.bw.Reset(nil)
		writers.Put(c.bw)
	}()
	cfg := &c.srv.cfg
	if cfg.TLSConfig != nil {
		tc := tls.Server(c.raw, cfg.TLSConfig)
		c.raw.SetDeadline(time.Now().Add(cfg.ReadHeaderTimeout))
		if err := tc.HandshakeContext(c.srv.baseCtx); err != nil {
			c.srv.logf("h1: TLS handshake error from %s: %v", c.remote, err)
			return
		}
		c.raw.SetDeadline(time.Time{})
		st := tc.ConnectionState()
		if st.NegotiatedProtocol == "h2" && cfg.Fallback != nil {
			c.srv.forget(c)
			handedOff = c.srv.handoff.give(tc)
			return
		}
		c.nc, c.tls = tc, &st
	}
	for first := true; ; first = false {
		c.idle.Store(true)
		if c.srv.closed.Load() {
			return
		}
		wait := cfg.IdleTimeout
		if first {
			wait = cfg.ReadHeaderTimeout
		}
		// The header cap counts from here: what the buffered reader
		// fetches while it waits is part of the request.
		c.cr.limit(int64(cfg.MaxHeaderBytes) + 4096)
		if c.br.Buffered() == 0 {
			c.nc.SetReadDeadline(time.Now().Add(wait))
			if _, err := c.br.Peek(1); err != nil {
				return
			}
		}
		c.idle.Store(false)
		c.nc.SetReadDeadline(time.Now().Add(cfg.ReadHeaderTimeout))
		if first && c.tls == nil && c.preface() {
			if cfg.Fallback == nil {
				c.refuse(http.StatusHTTPVersionNotSupported, "HTTP/2 without TLS is not served here")
				return
			}
			c.nc.SetReadDeadline(time.Time{})
			c.cr.unlimit()
			c.srv.forget(c)
			handedOff = c.srv.handoff.give(&bufferedConn{Conn: c.nc, r: c.br})
			return
		}
		req, err := http.ReadRequest(c.br)
		hitLimit := c.cr.unlimit()
		if err != nil {
			c.refuseRead(err, hitLimit)
			return
		}
		if code, msg := check(req); code != 0 {
			c.refuse(code, msg)
			return
		}
		c.nc.SetReadDeadline(time.Now().Add(cfg.ReadTimeout)) // the body's
		if !c.serveRequest(req) {
			return
		}
	}
}

// setWriteDeadline sets nc's write deadline, noting one is set.
func (c *conn) setWriteDeadline(t time.Time) error {
	if !t.IsZero() {
		c.writeDeadline = true
	}
	return c.nc.SetWriteDeadline(t)
}

// preface tells whether the connection opens with HTTP/2's preface. It
// reads further only while what came so far matches it: an HTTP/1 request
// differs by its second byte at the latest.
func (c *conn) preface() bool {
	const p = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	for n := 1; n <= len(p); n++ {
		b, err := c.br.Peek(n)
		if err != nil || b[n-1] != p[n-1] {
			return false
		}
	}
	return true
}

// check makes net/http's server's checks of a parsed request: what its
// parser leaves to the server.
func check(req *http.Request) (int, string) {
	if req.ProtoMajor != 1 {
		return http.StatusHTTPVersionNotSupported, "unsupported protocol version"
	}
	// ReadRequest moved the Host header to req.Host (and refused two).
	if req.ProtoAtLeast(1, 1) && req.Host == "" && req.Method != "CONNECT" {
		return http.StatusBadRequest, "missing required Host header"
	}
	if !httpguts.ValidHostHeader(req.Host) {
		return http.StatusBadRequest, "malformed Host header"
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return http.StatusBadRequest, "invalid header name"
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return http.StatusBadRequest, "invalid header value"
			}
		}
	}
	if e, ok := req.Header["Expect"]; ok && !(len(e) == 1 && strings.EqualFold(e[0], "100-continue")) {
		return http.StatusExpectationFailed, "unsupported Expect header"
	}
	return 0, ""
}

// refuseRead answers a request that could not be parsed, as net/http's
// server does: nothing for a connection that ended or timed out, 431 past
// the header cap, 501 for a transfer coding other than chunked, 400 else.
func (c *conn) refuseRead(err error, hitLimit bool) {
	switch {
	case hitLimit:
		c.refuse(http.StatusRequestHeaderFieldsTooLarge, "")
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
	case isNetError(err):
	case strings.Contains(err.Error(), "transfer encoding"):
		c.refuse(http.StatusNotImplemented, "unsupported transfer encoding")
	default:
		c.refuse(http.StatusBadRequest, "")
	}
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// refuse answers code in plain text and leaves the connection to close.
func (c *conn) refuse(code int, msg string) {
	text := fmt.Sprintf("%d %s", code, http.StatusText(code))
	if msg != "" {
		text += ": " + msg
	}
	c.setWriteDeadline(time.Now().Add(c.srv.cfg.WriteTimeout))
	fmt.Fprintf(c.bw, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		code, http.StatusText(code), len(text), text)
	c.bw.Flush()
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		// Let the answer reach the client before the close (an RST would
		// drop it with the unread request).
		cw.CloseWrite()
		c.nc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		io.CopyN(io.Discard, c.nc, maxDiscard)
	}
}

// serveRequest runs the handler for req and finishes its answer; false:
// the connection is to close.
func (c *conn) serveRequest(req *http.Request) bool {
	ctx, cancel := context.WithCancel(c.srv.baseCtx)
	defer cancel()
	req.RemoteAddr = c.remote
	req.TLS = c.tls
	body := &reqBody{c: c, rc: req.Body, cont: req.Header["Expect"] != nil && req.ProtoAtLeast(1, 1)}
	delete(req.Header, "Expect")
	chunked := len(req.TransferEncoding) > 0
	noBody := req.Body == http.NoBody || req.ContentLength == 0 && !chunked
	if !noBody {
		req.Body = body
	}
	req = req.WithContext(ctx)
	clear(c.header)
	w := &response{c: c, req: req, cl: -1, head: req.Method == http.MethodHead, pre: c.pre[:0],
		closeAfter: chunked || req.Close || c.srv.closed.Load()}
	body.w = w
	if c.writeDeadline {
		// The last answer's deadline must not cut this one.
		c.nc.SetWriteDeadline(time.Time{})
		c.writeDeadline = false
	}
	c.begin(cancel, noBody)
	aborted := c.call(w, req)
	c.end()
	keep := !aborted && w.finish()
	if cap(w.pre) <= smallBody {
		c.pre = w.pre[:0]
	}
	c.abortRead()
	if !keep || c.srv.closed.Load() {
		return false
	}
	if !noBody && !body.done {
		if body.cont && !body.sentContinue {
			return false // the client may or may not send it: the framing is lost
		}
		// Bounded by the handler's read deadline, or read_header_timeout.
		if w.readDeadline.IsZero() {
			c.nc.SetReadDeadline(time.Now().Add(c.srv.cfg.ReadHeaderTimeout))
		}
		n, err := io.CopyN(io.Discard, body.rc, maxDiscard+1)
		c.nc.SetReadDeadline(time.Time{})
		if n > maxDiscard || err != io.EOF && err != nil {
			return false
		}
	}
	return true
}

// call runs the handler, recovering a panic; true: it panicked (the
// connection is closed, with no answer if none began).
func (c *conn) call(w *response, req *http.Request) (panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			panicked = true
			if v == http.ErrAbortHandler {
				// Flush what the handler wrote before it aborted.
				c.bw.Flush()
				return
			}
			c.logPanic(v)
		}
	}()
	c.srv.cfg.Handler.ServeHTTP(w, req)
	return false
}

// logPanic logs a recovered panic with its goroutine's stack.
func (c *conn) logPanic(v any) {
	buf := make([]byte, 64<<10)
	buf = buf[:runtime.Stack(buf, false)]
	c.srv.logf("h1: panic serving %s: %v\n%s", c.remote, v, buf)
}

// reqBody is a request's body as its handler reads it: it sends 100
// Continue on the first read when the client asked for it, and notes the
// body's end.
type reqBody struct {
	c            *conn
	w            *response
	rc           io.ReadCloser
	cont         bool
	sentContinue bool
	done         bool
	err          error
}

func (b *reqBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.cont && !b.sentContinue {
		b.sentContinue = true
		c := b.c
		c.setWriteDeadline(time.Now().Add(c.srv.cfg.WriteTimeout))
		c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		err := c.bw.Flush()
		c.setWriteDeadline(b.w.writeDeadline)
		if err != nil {
			b.err = err
			return 0, err
		}
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.done = true
		b.c.bodyRead()
	} else if err != nil {
		b.err = err
	}
	return n, err
}

func (b *reqBody) Close() error { return nil }

// connReader is the connection as the buffered reader sees it: a cap on a
// request's header bytes, and the byte a background read took.
type connReader struct {
	c      *conn
	remain int64 // bytes left under the cap; <0: no cap
	hit    bool
}

func (r *connReader) limit(n int64) { r.remain, r.hit = n, false }

func (r *connReader) unlimit() (hit bool) {
	r.remain = -1
	return r.hit
}

func (r *connReader) Read(p []byte) (int, error) {
	if r.remain == 0 {
		r.hit = true
		return 0, io.EOF
	}
	if r.remain > 0 && int64(len(p)) > r.remain {
		p = p[:r.remain]
	}
	if len(p) == 0 {
		return 0, nil
	}
	c := r.c
	c.mu.Lock()
	if c.hasByte {
		p[0] = c.byteBuf[0]
		c.hasByte = false
		c.mu.Unlock()
		if r.remain > 0 {
			r.remain--
		}
		return 1, nil
	}
	c.mu.Unlock()
	n, err := c.nc.Read(p)
	if r.remain > 0 {
		r.remain -= int64(n)
	}
	return n, err
}

// connWriter is the connection as the buffered writer sees it: a failed
// write ends the request's context.
type connWriter struct{ c *conn }

func (w *connWriter) Write(p []byte) (int, error) {
	n, err := w.c.nc.Write(p)
	if err != nil {
		w.c.gone()
	}
	return n, err
}

// bufferedConn is a connection handed to Fallback with what was read of
// it still in r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// handoffListener is how HTTP/2 connections reach Fallback.
type handoffListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
	addr net.Addr
}

func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) close() { l.once.Do(func() { close(l.done) }) }

func (l *handoffListener) Close() error { l.close(); return nil }

func (l *handoffListener) Addr() net.Addr { return l.addr }
