package live

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/inferrail/inferrail/internal/openai"
)

// try is one forwarding of a request to a replica, up to its first
// response byte: the engine's response (nil when none came), and the first
// chunk of its body read into buf[:n].
type try struct {
	rep    *replica // where it went
	resp   *http.Response
	buf    *[]byte
	n      int
	eof    bool // the body ended with its first read
	err    error
	reused bool // the connection was a pooled one
	// timedOut: first_byte_timeout passed before the first byte.
	timedOut bool
	// nth is the try's number (0: the request's first); sent is when it
	// was forwarded, first when its first byte was read.
	nth         int
	sent, first time.Time
	cancel      context.CancelFunc
	ctx         context.Context
	span        trace.Span // the try's CLIENT span (nil: tracing is off)
}

// reason names a failed try for metrics and error bodies.
func (t *try) reason() string {
	switch {
	case t.timedOut:
		return "first_byte_timeout"
	case t.err == nil && t.resp != nil:
		return "upstream_" + strconv.Itoa(t.resp.StatusCode)
	case t.err == nil:
		return "upstream_error"
	}
	return "upstream_" + errCause(t.err)
}

// errCause classifies a transport error in a few words, without the URL or
// address it names.
func errCause(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection_reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection_closed"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case strings.Contains(err.Error(), "no such host"):
		return "dns_error"
	}
	return "error"
}

// close gives back what a try holds that is not relayed.
func (t *try) close() {
	endUpstream(t, "")
	if t.resp != nil {
		if t.n > 0 || t.eof {
			t.resp.Body.Close()
		} else {
			io.Copy(io.Discard, io.LimitReader(t.resp.Body, 64<<10))
			t.resp.Body.Close()
		}
	}
	if t.buf != nil {
		bufPool.Put(t.buf)
		t.buf = nil
	}
	if t.cancel != nil {
		t.cancel()
	}
}

// attempt forwards the body to rep and reads the response's first chunk.
// For a streamed request the engine must send its first byte within
// first_byte_timeout, or the try fails (and is retried elsewhere); a
// non-streamed answer's first byte is its end, bounded by request_timeout
// only.
//
// body is what goes to rep: the client's, or a P/D decode's (pd.go);
// remote says it is the decode of a remote prefill, whose non-streamed
// answer is read whole to drop any kv_transfer_params the engine echoed.
func (s *Server) attempt(ctx context.Context, in *inbound, body upBody, remote bool, rep *replica, r *http.Request, reqID string) *try {
	t := &try{rep: rep}
	if s.tr != nil {
		ctx, t.span = s.tr.upstream(ctx, in, rep)
	}
	t.ctx, t.cancel = context.WithCancel(ctx)
	stream := in.f.Stream
	var timedOut atomic.Bool
	var timer *time.Timer
	if stream {
		timer = time.AfterFunc(s.cfg.FirstByteTimeout, func() { timedOut.Store(true); t.cancel() })
	}
	t.sent = time.Now()
	t.resp, t.reused, t.err = s.forward(t.ctx, rep, r, body, reqID)
	if t.err == nil && remote && !stream {
		stripKVParams(t.resp)
	}
	if t.err == nil && !retryable(t.resp.StatusCode) {
		t.buf = bufPool.Get().(*[]byte)
		for t.n == 0 && t.err == nil {
			t.n, t.err = t.resp.Body.Read(*t.buf)
		}
		t.first = time.Now()
		if t.err == io.EOF {
			t.err, t.eof = nil, true
		}
		if t.err != nil && t.n == 0 {
			// No first byte: the try failed.
			t.resp.Body.Close()
			t.resp = nil
			bufPool.Put(t.buf)
			t.buf = nil
		} else {
			t.err = nil
		}
	}
	if timer != nil && !timer.Stop() && t.resp != nil {
		// The timeout fired as the first byte arrived: the try's context
		// is cancelled, so the answer cannot be read on. It failed.
		t.resp.Body.Close()
		t.resp, t.err = nil, context.Canceled
		bufPool.Put(t.buf)
		t.buf, t.n, t.eof = nil, 0, false
	}
	t.timedOut = timedOut.Load() && t.resp == nil
	return t
}

// Header policy: hop-by-hop headers (RFC 9110 section 7.6.1) and those the
// Connection header names are never forwarded; nor are the client's own
// forwarding headers (the proxy sets X-Forwarded-For and -Proto), its
// request id (the proxy sends its own), or, unless forward_client_auth,
// its credentials.
var (
	hopHeaders     = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}
	dropUpstream   = map[string]bool{"X-Forwarded-For": true, "X-Forwarded-Proto": true, "X-Forwarded-Host": true, "Forwarded": true, "X-Real-Ip": true, HeaderRequestID: true, "Content-Length": true, "Expect": true, "Host": true}
	credentialHdrs = map[string]bool{"Authorization": true, "Cookie": true}
	hopSet         = func() map[string]bool {
		m := map[string]bool{}
		for _, h := range hopHeaders {
			m[h] = true
		}
		return m
	}()
)

// copyAnswerHeaders copies an engine's response headers to the client's
// answer but the hop-by-hop ones, those its Connection header names, its
// request id (the proxy answers with its own) and Content-Length (the
// caller sets it when the body passes unchanged).
func copyAnswerHeaders(dst, src http.Header) {
	named := connectionNamed(src)
	for k, vs := range src {
		if hopSet[k] || named[k] || k == "Content-Length" || k == HeaderRequestID {
			continue
		}
		dst[k] = vs
	}
}

// connectionNamed returns the headers a Connection header names.
func connectionNamed(h http.Header) map[string]bool {
	vs := h.Values("Connection")
	if len(vs) == 0 {
		return nil
	}
	named := map[string]bool{}
	for _, v := range vs {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				named[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	return named
}

// upstreamHeaders are the headers sent to an engine for a client's
// request: the client's under the header policy, the proxy's forwarding
// headers and request id, and extra (a trace context, which replaces the
// client's own). The lean client writes them straight into the request's
// head; header builds a map of them for net/http's transport.
type upstreamHeaders struct {
	in    http.Header
	named map[string]bool // the headers the client's Connection names
	auth  bool            // forward_client_auth
	xff   string          // X-Forwarded-For ("" when the address has no host)
	proto string          // X-Forwarded-Proto
	reqID string
	extra http.Header
	// bearer is the engines' own Authorization (api_key_file), which
	// replaces any client's; "" for none.
	bearer string
}

func (s *Server) upstreamHeaders(r *http.Request, reqID string, rep *replica) *upstreamHeaders {
	u := &upstreamHeaders{in: r.Header, named: connectionNamed(r.Header), auth: s.cfg.ForwardClientAuth, proto: "http", reqID: reqID, bearer: rep.authorization()}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		u.xff = host
	}
	if r.TLS != nil {
		u.proto = "https"
	}
	return u
}

// forwards reports whether the client's header k goes upstream.
func (u *upstreamHeaders) forwards(k string) bool {
	return !(hopSet[k] || u.named[k] || dropUpstream[k] || credentialHdrs[k] && !u.auth || u.extra[k] != nil || u.bearer != "" && k == "Authorization")
}

func (u *upstreamHeaders) appendLines(b []byte) []byte {
	for k, vs := range u.in {
		if u.forwards(k) {
			for _, v := range vs {
				b = appendHeaderLine(b, k, v)
			}
		}
	}
	for k, vs := range u.extra {
		for _, v := range vs {
			b = appendHeaderLine(b, k, v)
		}
	}
	if u.bearer != "" {
		b = appendHeaderLine(b, "Authorization", u.bearer)
	}
	if u.xff != "" {
		b = appendHeaderLine(b, "X-Forwarded-For", u.xff)
	}
	b = appendHeaderLine(b, "X-Forwarded-Proto", u.proto)
	return appendHeaderLine(b, HeaderRequestID, u.reqID)
}

func (u *upstreamHeaders) header() http.Header {
	out := make(http.Header, len(u.in)+len(u.extra)+3)
	for k, vs := range u.in {
		if u.forwards(k) {
			out[k] = vs
		}
	}
	for k, vs := range u.extra {
		out[k] = vs
	}
	if u.bearer != "" {
		out["Authorization"] = []string{u.bearer}
	}
	if u.xff != "" {
		out["X-Forwarded-For"] = []string{u.xff}
	}
	out["X-Forwarded-Proto"] = []string{u.proto}
	out[HeaderRequestID] = []string{u.reqID}
	return out
}

// forward sends the body to rep. reused reports whether the connection was
// a pooled one. The transport is called directly: a proxy follows no
// redirects, and http.Client's per-request header copies and timers cost
// more than the rest of forward.
func (s *Server) forward(ctx context.Context, rep *replica, r *http.Request, body upBody, reqID string) (*http.Response, bool, error) {
	u := *rep.base
	u.Path += r.URL.Path
	u.RawQuery = r.URL.RawQuery
	hdr := s.upstreamHeaders(r, reqID, rep)
	if s.tr != nil {
		// The try's span goes on in the engine (a client's own
		// traceparent is forwarded as is when tracing is off).
		hdr.extra = http.Header{}
		s.tr.prop.Inject(ctx, propagation.HeaderCarrier(hdr.extra))
	}
	if s.h1 != nil && u.Scheme == "http" {
		return s.h1.do(ctx, &u, hdr, body)
	}
	tr := &reuseTrace{}
	tr.ct.GotConn = tr.got
	out := &http.Request{
		Method: http.MethodPost, URL: &u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: hdr.header(), Body: io.NopCloser(body.reader()),
		ContentLength: int64(body.len()), Host: u.Host,
	}
	out = out.WithContext(httptrace.WithClientTrace(ctx, &tr.ct))
	resp, err := s.upstream.Transport.RoundTrip(out)
	return resp, tr.reused, err
}

// reuseTrace records whether a request went out on a pooled connection.
type reuseTrace struct {
	ct     httptrace.ClientTrace
	reused bool
}

func (t *reuseTrace) got(i httptrace.GotConnInfo) { t.reused = i.Reused }

// pipe carries an engine's response from the goroutine that reads it to
// the handler that writes it to the client, holding up to limit bytes: an
// engine that has finished is done with, however slowly the client reads.
type pipe struct {
	mu        sync.Mutex
	buf       []byte
	limit     int
	end       bool
	failure   string // why the stream broke, "" when it ended well
	abandoned bool   // the client is gone: nothing more is wanted
	data      chan struct{}
	room      chan struct{}
}

func newPipe(limit int) *pipe {
	return &pipe{limit: limit, data: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// push appends b, waiting while the pipe is full; false: the client is gone.
func (p *pipe) push(b []byte) bool {
	for {
		p.mu.Lock()
		if p.abandoned {
			p.mu.Unlock()
			return false
		}
		if len(p.buf) == 0 || len(p.buf)+len(b) <= p.limit {
			p.buf = append(p.buf, b...)
			p.mu.Unlock()
			signal(p.data)
			return true
		}
		p.mu.Unlock()
		<-p.room
	}
}

// close ends the stream; failure says why it broke ("" for a whole one).
func (p *pipe) close(failure string) {
	p.mu.Lock()
	p.end, p.failure = true, failure
	p.mu.Unlock()
	signal(p.data)
}

// abandon tells the reader the client is gone.
func (p *pipe) abandon() {
	p.mu.Lock()
	p.abandoned = true
	p.mu.Unlock()
	signal(p.room)
}

// take waits for bytes, swapping spare in for them; end reports the stream
// is over (with its failure) once everything was taken.
func (p *pipe) take(spare []byte) (b []byte, end bool, failure string) {
	for {
		p.mu.Lock()
		if len(p.buf) > 0 {
			b, p.buf = p.buf, spare[:0]
			p.mu.Unlock()
			signal(p.room)
			return b, false, ""
		}
		if p.end {
			p.mu.Unlock()
			return nil, true, p.failure
		}
		p.mu.Unlock()
		<-p.data
	}
}

// Stream failures the client is told of.
const (
	failBroken   = "stream_broken"
	failIdle     = "stream_idle_timeout"
	failDeadline = "request_timeout"
)

// relay streams the engine's response to the client and ends the attempt
// in the core by how the engine's side went. The handler reads the engine
// (stream_idle_timeout bounds each read) and writes each chunk to the
// client (write_timeout bounds each write); a write that blocks for
// slowWrite hands the engine's side to a goroutine that reads the rest
// into a pipe of response_buffer_bytes and ends the attempt the moment the
// engine is done, so a slow client never holds an engine slot. A client
// that stops reading is cut off and its upstream cancelled; a stream that
// breaks after its first byte ends, for the client, with an error event
// (SSE) and an aborted response, never a clean end. passThrough: t is the
// answer of a last try that failed, already ended in the core.
func (s *Server) relay(w http.ResponseWriter, r *http.Request, ctx context.Context, in *inbound, a *attempt, t *try, passThrough, showPredicted bool, began time.Time, ar *accessRecord) {
	m := in.m
	resp := t.resp
	if t.buf == nil {
		t.buf = bufPool.Get().(*[]byte) // a passed-through answer not read yet
	}
	defer t.close()
	h := w.Header()
	copyAnswerHeaders(h, resp.Header)
	h.Set(HeaderReplica, a.dec.Name)
	if showPredicted {
		h.Set(HeaderPredicted, strconv.Itoa(a.dec.PredictedCachedTokens))
	}
	h.Set(HeaderQueued, formatMs(a.queued))
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	// A stream the proxy takes its usage event out of is shorter than the
	// engine's.
	if cl := resp.Header.Get("Content-Length"); cl != "" && resp.ContentLength >= 0 && !(sse && in.askedUsage) {
		h.Set("Content-Length", cl)
	}
	ok := resp.StatusCode == http.StatusOK
	ar.status = resp.StatusCode
	if t.n > 0 {
		ar.ttft = time.Since(began)
		s.met.ttft(m, t.rep, ar.ttft)
		if ok && !passThrough {
			m.firstByte(a) // an error answer stays pending: the engine computed nothing
		}
	}
	rc := http.NewResponseController(w)
	rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	w.WriteHeader(resp.StatusCode)

	// In approximate mode the index learns the answer's blocks too: the
	// engine keeps them cached after the request, as the simulator knows.
	// Every answer is read for its length (the engine's usage where it
	// sends one), which the gateway core learns its output reservations
	// from.
	var ans *answer
	if ok {
		ans = answerOf(in, sse)
		// Whichever way relay ends, the engine's side is done with ans by
		// then (drainPipe waits for the watchdog).
		defer ans.release()
	}
	if t.eof {
		// The whole answer came in the first read: nothing to wait for.
		out := ans.pass((*t.buf)[:t.n], true)
		s.settle(in, a, t, ans, true, "", passThrough, ar)
		s.observeOverhead(in, a, t, began, ar)
		w.Write(out)
		s.met.duration(m, t.rep, time.Since(began))
		return
	}
	end := func(whole bool, failure string) {
		s.settle(in, a, t, ans, whole, failure, passThrough, ar)
	}
	// The handler relays on its own while the client reads: it reads the
	// engine and writes each chunk to the client. When a write blocks for
	// slowWrite, the watchdog takes the engine's side over from that moment:
	// it reads the rest into a pipe (and ends the attempt as soon as the
	// engine is done), and the handler writes from the pipe.
	idle := &atomic.Bool{}
	idleTimer := time.AfterFunc(time.Hour, func() { idle.Store(true); t.cancel() })
	idleTimer.Stop()
	defer idleTimer.Stop()
	h2 := &handoff{p: newPipe(int(s.cfg.ResponseBufferBytes)), done: make(chan struct{})}
	watch := time.AfterFunc(time.Hour, func() {
		defer close(h2.done)
		whole, failure := s.pump(r, ctx, t, h2.p, ans, idle, idleTimer)
		end(whole, failure)
		h2.p.close(failure)
	})
	watch.Stop()
	buf := *t.buf
	pending := ans.pass(buf[:t.n], false)
	s.observeOverhead(in, a, t, began, ar) // the first write follows
	upDone, piped := false, false
	var failure string
	var werr error
	for {
		if len(pending) > 0 {
			if upDone && failure == "" {
				// The engine's last bytes: written, not flushed, so the
				// server sends them with the response's end in one write
				// when the handler returns.
				rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
				_, werr = w.Write(pending)
				break
			}
			// Read before the watchdog runs: once armed, it may own ans.
			held := ans != nil && ans.done
			if !upDone {
				watch.Reset(slowWrite)
			}
			if held {
				// data: [DONE] is here: only the response's end follows.
				// Held unflushed, it goes out with that end in one write
				// (the next read waits openai.DoneGrace at most for it).
				rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
				_, werr = w.Write(pending)
				rc.SetWriteDeadline(time.Time{})
			} else {
				werr = s.write(w, rc, pending)
			}
			if !upDone && !watch.Stop() {
				piped = true // the watchdog reads the engine now
				break
			}
			if werr != nil {
				break
			}
		}
		if upDone {
			break
		}
		if ans != nil && ans.done {
			idleTimer.Reset(min(openai.DoneGrace, s.cfg.StreamIdleTimeout))
		} else {
			idleTimer.Reset(s.cfg.StreamIdleTimeout)
		}
		n, err := t.resp.Body.Read(buf)
		idleTimer.Stop()
		pending = ans.pass(buf[:n], err != nil)
		if err != nil {
			// The engine is done (or broke): its slot is free before the
			// last write.
			upDone = true
			var whole bool
			whole, failure = s.endOf(r, ctx, t, ans, idle, err)
			end(whole, failure)
		}
	}
	if piped {
		failure, werr = s.drainPipe(w, rc, t, h2, werr)
	} else if werr != nil {
		// The client is gone or does not read: cut it off, and the
		// engine's work with it.
		t.cancel()
		if !upDone {
			end(ans != nil && ans.done, "")
		}
	}
	s.met.duration(m, t.rep, time.Since(began))
	if werr != nil || failure == "" {
		rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		return
	}
	// The stream broke after it started: tell the client, in the stream
	// when it is one, then abort the response so no client mistakes it
	// for a whole one.
	if sse {
		rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		w.Write(streamErrorEvent(in.op, failure, ans))
		rc.Flush()
	}
	panic(http.ErrAbortHandler)
}

// slowWrite is how long a write to the client may block before the
// engine's side of the stream is handed to a goroutine of its own.
const slowWrite = 20 * time.Millisecond

// handoff is a relay's engine side once a slow client made the handler
// give it up: the pipe it fills and the end of the goroutine filling it.
type handoff struct {
	p    *pipe
	done chan struct{}
}

// write writes b to the client and flushes it, within write_timeout.
func (s *Server) write(w http.ResponseWriter, rc *http.ResponseController, b []byte) error {
	rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	_, err := w.Write(b)
	if err == nil {
		err = rc.Flush()
	}
	// No deadline runs between writes: an HTTP/2 stream is reset when one
	// passes, written to or not.
	rc.SetWriteDeadline(time.Time{})
	return err
}

// observeOverhead records the proxy's own part of a first try's time to
// first byte, as its first write to the client is due: from the request's
// arrival (began) to its forwarding, less its wait in the queue, plus from
// the engine's first byte to now. A retried request (the failed tries'
// time) and a P/D one (the remote prefill's) are left out.
func (s *Server) observeOverhead(in *inbound, a *attempt, t *try, began time.Time, ar *accessRecord) {
	if t.nth != 0 || ar.pd != "" || t.first.IsZero() {
		return
	}
	s.met.overhead(in.m, t.sent.Sub(began)-a.queued+time.Since(t.first))
}

// drainPipe writes what the watchdog reads into h's pipe to the client
// until the engine's side ends (werr: the write that was blocked failed);
// it returns why the stream broke and the client's write error.
func (s *Server) drainPipe(w http.ResponseWriter, rc *http.ResponseController, t *try, h *handoff, werr error) (string, error) {
	pb := bufPool.Get().(*[]byte)
	spare := (*pb)[:0]
	var failure string
	for werr == nil {
		b, end, f := h.p.take(spare)
		if end {
			failure = f
			break
		}
		werr = s.write(w, rc, b)
		spare = b
	}
	if werr != nil {
		h.p.abandon()
		t.cancel()
	}
	<-h.done
	// The pool's buffers are read into whole; one the pipe grew past 64
	// KiB is left to the collector.
	if cap(spare) <= 64<<10 {
		*pb = spare[:cap(spare)]
		bufPool.Put(pb)
	}
	return failure, werr
}

// pump reads the rest of the engine's response into p, feeding ans, from
// the moment the handler handed it over. whole says the engine's answer
// arrived complete (its end, or its data: [DONE], was read); otherwise
// failure says why the stream broke, "" when the client left first.
func (s *Server) pump(r *http.Request, ctx context.Context, t *try, p *pipe, ans *answer, idle *atomic.Bool, idleTimer *time.Timer) (whole bool, failure string) {
	pb := bufPool.Get().(*[]byte)
	defer bufPool.Put(pb)
	buf := *pb
	// The handler may still be writing what pass last returned it.
	var out []byte
	for {
		idleTimer.Reset(s.cfg.StreamIdleTimeout)
		n, err := t.resp.Body.Read(buf)
		idleTimer.Stop()
		if n > 0 || err != nil {
			b := ans.passTo(buf[:n], err != nil, &out)
			if len(b) > 0 && !p.push(b) {
				return ans != nil && ans.done, ""
			}
		}
		if err != nil {
			return s.endOf(r, ctx, t, ans, idle, err)
		}
	}
}

// endOf says how a stream ended when a read of the engine returned err:
// whole when its end or its data: [DONE] was read, else why it broke (""
// when the client left).
func (s *Server) endOf(r *http.Request, ctx context.Context, t *try, ans *answer, idle *atomic.Bool, err error) (whole bool, failure string) {
	switch {
	case err == io.EOF:
		return true, ""
	case ans != nil && ans.done:
		return true, "" // the answer was whole: what broke after it does not matter
	case r.Context().Err() != nil:
		return false, "" // the client left
	case idle.Load():
		return false, failIdle
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return false, failDeadline
	case t.ctx.Err() != nil:
		return false, "" // cancelled by the writer: the client does not read
	}
	return false, failBroken
}

// settle ends a's dispatch in the core by how the engine's side of the
// stream went, and records the outcome. It runs when the engine is done,
// before the client may have read everything.
func (s *Server) settle(in *inbound, a *attempt, t *try, ans *answer, whole bool, failure string, passThrough bool, ar *accessRecord) {
	m := in.m
	resp := t.resp
	endUpstream(t, failure)
	m.answered(t.rep, resp.StatusCode)
	if passThrough {
		// The last try's failure, passed through as the engine wrote it;
		// its slot and health were already accounted for.
		s.outcomeOf(ar, m.name, statusOutcome(resp.StatusCode))
		return
	}
	switch {
	case resp.StatusCode >= 500:
		m.fail(a, true, false)
		s.outcomeOf(ar, m.name, "upstream_"+strconv.Itoa(resp.StatusCode))
	case !whole && failure == "":
		// The client left (or stopped reading) before the engine was done;
		// the engine had answered, so it did nothing wrong.
		if !s.leftBackground(in, a, t.rep, ans) { // a background one goes on in the engine
			m.abort(a, true)
		}
		s.outcomeOf(ar, m.name, "client_gone")
		ar.status = statusClientGone
	case failure == failDeadline:
		m.fail(a, false, false)
		s.leftBackground(in, nil, t.rep, ans)
		s.outcomeOf(ar, m.name, "timeout")
		s.met.errorReason(m.name, failure)
	case failure != "":
		// The stream broke after it started: never replayed.
		m.fail(a, true, false)
		s.leftBackground(in, nil, t.rep, ans)
		s.outcomeOf(ar, m.name, failure)
		s.met.errorReason(m.name, failure)
	case resp.StatusCode == http.StatusOK && (t.n > 0):
		if out, cached := s.learn(in, a, ans); out >= 0 {
			ar.outputTokens, ar.cachedTokens, ar.cachedKnown = out, cached, ans != nil && ans.cached >= 0
		}
		ar.enginePrompt(ans)
		s.met.ok(m)
		ar.outcome = "ok"
	default:
		// A client error the engine answered (or an empty answer): the
		// replica is fine, the request left nothing cached.
		m.fail(a, false, true)
		s.outcomeOf(ar, m.name, statusOutcome(resp.StatusCode))
	}
}

// streamErrorEvent is the SSE event that ends a broken stream, as vLLM
// writes a failure mid-stream (internal/openai.AppendError), without the
// data: [DONE] vLLM sends after it: the response is aborted next. A
// Responses API stream gets that API's error event, numbered after the
// events ans read (nil: none).
func streamErrorEvent(op opKind, failure string, ans *answer) []byte {
	msg := "the engine's stream broke before it was complete"
	code := http.StatusBadGateway
	switch failure {
	case failIdle:
		msg = "the engine sent nothing for longer than stream_idle_timeout"
		code = http.StatusGatewayTimeout
	case failDeadline:
		msg = "the request did not complete within request_timeout"
		code = http.StatusGatewayTimeout
	}
	if op == opResponses {
		seq := 0
		if ans != nil {
			seq = ans.a.Events
		}
		return openai.AppendResponsesError(nil, msg, failure, seq)
	}
	return openai.AppendError(nil, msg, failure, code)
}

// bodyBudget bounds the request bodies held at once.
type bodyBudget struct {
	used atomic.Int64
	max  int64
}

// take holds n more bytes, or reports that it would pass the bound.
func (b *bodyBudget) take(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *bodyBudget) give(n int64) {
	if n > 0 {
		b.used.Add(-n)
	}
}

var errBodyBudget = errors.New("max_inflight_body_bytes reached")

// budgetReader reads a body while holding its bytes in a bodyBudget
// (prepaid: the whole announced length is held already).
type budgetReader struct {
	r       io.Reader
	b       *bodyBudget
	held    int64
	prepaid bool
}

func (br *budgetReader) Read(p []byte) (int, error) {
	if br.prepaid {
		return br.r.Read(p)
	}
	want := int64(len(p))
	if !br.b.take(want) {
		return 0, errBodyBudget
	}
	n, err := br.r.Read(p)
	br.b.give(want - int64(n))
	br.held += int64(n)
	return n, err
}
