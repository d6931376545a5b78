package h1

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// smallBody is how much of a body is held back before the header is sent:
// a handler that ends within it gets a Content-Length (and a sniffed
// Content-Type) instead of chunks.
const smallBody = 2048

// response is a request's http.ResponseWriter. WriteHeader takes the
// header as it is then (later changes do not count, as with net/http);
// the status line and framing go out with the first flush or write past
// smallBody, or when the handler returns.
type response struct {
	c    *conn
	req  *http.Request
	head bool

	status      int
	wroteHeader bool
	committed   bool
	chunked     bool
	closeAfter  bool
	hasCT       bool
	stream      bool  // Content-Type text/event-stream: never length-delimited
	cl          int64 // the handler's Content-Length, -1 without one
	written     int64
	pre         []byte
	err         error
	// readDeadline is the handler's last, which bounds the discard of a
	// body it left unread.
	readDeadline time.Time
	// writeDeadline is the handler's last; without one the answer's end
	// is bounded by WriteTimeout.
	writeDeadline time.Time
}

func (w *response) Header() http.Header { return w.c.header }

func (w *response) WriteHeader(code int) {
	if w.wroteHeader {
		w.c.srv.logf("h1: superfluous WriteHeader(%d) for %s %s", code, w.req.Method, w.req.URL.Path)
		return
	}
	if code < 100 || code > 999 {
		w.c.srv.logf("h1: invalid WriteHeader code %d for %s %s; answering 500", code, w.req.Method, w.req.URL.Path)
		code = http.StatusInternalServerError
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		w.informational(code)
		return
	}
	w.wroteHeader, w.status = true, code
	h := w.c.header
	if v := h["Content-Length"]; len(v) == 1 {
		if n, err := strconv.ParseInt(strings.TrimSpace(v[0]), 10, 64); err == nil && n >= 0 {
			w.cl = n
		} else {
			w.c.srv.logf("h1: invalid Content-Length %q for %s %s; ignored", v[0], w.req.Method, w.req.URL.Path)
		}
	}
	ct, hasCT := h["Content-Type"]
	w.hasCT = hasCT
	w.stream = len(ct) == 1 && strings.HasPrefix(ct[0], "text/event-stream")
	if v, ok := h["Connection"]; ok {
		for _, s := range v {
			if strings.EqualFold(strings.TrimSpace(s), "close") {
				w.closeAfter = true
			}
		}
	}
	w.c.hdr = appendHeaders(w.c.hdr[:0], h, true)
}

// informational sends a 1xx answer at once, with the header as it is.
func (w *response) informational(code int) {
	if w.c.srv.closed.Load() {
		return
	}
	bw := w.c.bw
	bw.WriteString("HTTP/1.1 " + strconv.Itoa(code) + " " + http.StatusText(code) + "\r\n")
	w.c.hdr = appendHeaders(w.c.hdr[:0], w.c.header, false)
	bw.Write(w.c.hdr)
	bw.WriteString("\r\n")
	bw.Flush()
}

// appendHeaders appends h's lines; but for its framing headers
// (Content-Length, Transfer-Encoding, Connection), which commit writes.
func appendHeaders(b []byte, h http.Header, butFraming bool) []byte {
	for k, vs := range h {
		if butFraming && (k == "Content-Length" || k == "Transfer-Encoding" || k == "Connection") {
			continue
		}
		for _, v := range vs {
			b = appendHeader(b, k, v)
		}
	}
	return b
}

// appendHeader appends "k: v\r\n", a CR or LF in v made a space (as
// net/http does).
func appendHeader(b []byte, k, v string) []byte {
	b = append(b, k...)
	b = append(b, ':', ' ')
	for i := 0; i < len(v); i++ {
		ch := v[i]
		if ch == '\r' || ch == '\n' {
			ch = ' '
		}
		b = append(b, ch)
	}
	return append(b, '\r', '\n')
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if w.cl >= 0 && w.written+int64(len(p)) > w.cl {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if w.head {
		return len(p), nil
	}
	if !w.committed {
		if len(w.pre)+len(p) <= smallBody {
			w.pre = append(w.pre, p...)
			return len(p), nil
		}
		w.commit(false)
	}
	return w.body(p)
}

// body writes p framed.
func (w *response) body(p []byte) (int, error) {
	bw := w.c.bw
	if w.chunked {
		var hb [20]byte
		bw.Write(append(strconv.AppendInt(hb[:0], int64(len(p)), 16), '\r', '\n'))
		n, _ := bw.Write(p)
		_, err := bw.WriteString("\r\n")
		if err != nil {
			w.err = err
			return n, err
		}
		return n, nil
	}
	n, err := bw.Write(p)
	if err != nil {
		w.err = err
	}
	return n, err
}

// commit writes the status line and header, and the held-back body.
// final: the handler has returned, so the body's length is known.
func (w *response) commit(final bool) {
	w.committed = true
	c := w.c
	bw := c.bw
	allowed := bodyAllowed(w.status)
	if c.srv.closed.Load() {
		w.closeAfter = true
	}
	if w.status == http.StatusOK && w.req.ProtoAtLeast(1, 1) {
		bw.WriteString("HTTP/1.1 200 OK\r\n")
	} else {
		bw.WriteString("HTTP/1.1 " + strconv.Itoa(w.status) + " " + http.StatusText(w.status) + "\r\n")
	}
	bw.Write(c.hdr)
	if _, ok := c.header["Date"]; !ok {
		bw.Write(c.srv.dateHeader(time.Now()))
	}
	if allowed && !w.hasCT && len(w.pre) > 0 {
		bw.WriteString("Content-Type: " + http.DetectContentType(w.pre) + "\r\n")
	}
	var nb [20]byte
	switch {
	case !allowed:
	case w.cl >= 0:
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(nb[:0], w.cl, 10))
		bw.WriteString("\r\n")
	case final && !w.stream && (!w.head || w.written > 0):
		// A body the handler wrote whole before returning: its length is
		// known. Not an event stream's, which is chunked however it was
		// written (a stream that came whole at once is still a stream).
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(nb[:0], w.written, 10))
		bw.WriteString("\r\n")
	case w.head:
	case w.req.ProtoAtLeast(1, 1):
		w.chunked = true
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	default:
		w.closeAfter = true // HTTP/1.0: the close ends the body
	}
	switch {
	case w.closeAfter:
		bw.WriteString("Connection: close\r\n")
	case !w.req.ProtoAtLeast(1, 1):
		// An HTTP/1.0 client that asked for keep-alive (req.Close is
		// false only then) is told it is kept: 1.0 closes by default.
		bw.WriteString("Connection: keep-alive\r\n")
	}
	bw.WriteString("\r\n")
	if len(w.pre) > 0 {
		p := w.pre
		w.pre = w.pre[:0]
		w.body(p)
	}
}

// FlushError sends the header, if it is not sent, and what the handler
// wrote; it is what http.ResponseController's Flush calls.
func (w *response) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return w.err
	}
	if !w.committed {
		w.commit(false)
	}
	if err := w.c.bw.Flush(); err != nil {
		w.err = err
		return err
	}
	if w.written > 0 {
		w.c.stream()
	}
	return nil
}

// Flush is http.Flusher's.
func (w *response) Flush() { w.FlushError() }

// SetReadDeadline and SetWriteDeadline are http.ResponseController's.
func (w *response) SetReadDeadline(t time.Time) error {
	w.readDeadline = t
	c := w.c
	c.mu.Lock()
	c.readDeadline = true
	c.mu.Unlock()
	return c.nc.SetReadDeadline(t)
}

func (w *response) SetWriteDeadline(t time.Time) error {
	w.writeDeadline = t
	return w.c.setWriteDeadline(t)
}

// finish ends the answer after the handler returns; false: the connection
// cannot carry another.
func (w *response) finish() bool {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(true)
	}
	if w.chunked && w.err == nil {
		w.c.bw.WriteString("0\r\n\r\n")
	}
	if w.cl >= 0 && w.written < w.cl && !w.head && bodyAllowed(w.status) {
		w.closeAfter = true // a short body: the client must not read on
	}
	if w.writeDeadline.IsZero() {
		w.c.setWriteDeadline(time.Now().Add(w.c.srv.cfg.WriteTimeout))
	}
	if err := w.c.bw.Flush(); err != nil || w.err != nil {
		return false
	}
	return !w.closeAfter
}
