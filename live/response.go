package live

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// maxResponseHead bounds an engine's status line and header lines, and
// its chunked body's trailer (http.ReadResponse has no bound).
const maxResponseHead = 1 << 20

var errResponseHead = errors.New("the engine's response head exceeds 1 MiB")

// readResponse reads an engine's response to a POST from br, as
// http.ReadResponse does for what engines send (HTTP/1.x; a body framed by
// Content-Length, chunked, or the connection's close; none for 1xx, 204 and
// 304), at a fraction of its allocations: one header map, the values of
// one response sharing one string, common names interned. A malformed head
// is an error; a chunked body's trailer is read (and dropped) at its end,
// so the connection is ready for the next response.
func readResponse(br *bufio.Reader) (*http.Response, error) {
	budget := maxResponseHead
	line, err := headLine(br, &budget)
	if err != nil {
		return nil, err
	}
	resp := &http.Response{}
	if err := statusLine(resp, line); err != nil {
		return nil, err
	}
	// The header lines, then one string of their bytes that names and
	// values point into.
	var rawBuf [512]byte
	var spanBuf [16][4]int
	raw := rawBuf[:0]
	spans := spanBuf[:0] // name and value bounds in raw
	for {
		line, err := headLine(br, &budget)
		if err != nil {
			return nil, err
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return nil, fmt.Errorf("malformed response header line %q (obsolete line folding)", excerpt(line))
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !validHeaderName(string(line[:colon])) {
			return nil, fmt.Errorf("malformed response header line %q", excerpt(line))
		}
		v := bytes.TrimRight(bytes.TrimLeft(line[colon+1:], " \t"), " \t")
		if !validHeaderValue(string(v)) {
			return nil, fmt.Errorf("malformed response header value in %q", excerpt(line))
		}
		at := len(raw)
		raw = append(raw, line[:colon]...)
		vat := len(raw)
		raw = append(raw, v...)
		spans = append(spans, [4]int{at, vat, vat, len(raw)})
	}
	all := string(raw)
	values := make([]string, len(spans))
	h := make(http.Header, len(spans))
	for i, sp := range spans {
		k := canonicalName(all[sp[0]:sp[1]])
		values[i] = all[sp[2]:sp[3]]
		if vs, ok := h[k]; ok {
			h[k] = append(vs, values[i])
		} else {
			h[k] = values[i : i+1 : i+1]
		}
	}
	resp.Header = h
	return resp, frame(resp, br)
}

// headLine reads one line of a response head without its line end,
// charging it to budget. The line aliases br's buffer until the next read.
func headLine(br *bufio.Reader, budget *int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		// Longer than the buffer: gathered, within the budget.
		long := append([]byte(nil), line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			if len(long) > *budget {
				return nil, errResponseHead
			}
			line, err = br.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	if *budget -= len(line); *budget < 0 {
		return nil, errResponseHead
	}
	if err != nil {
		if err == io.EOF && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// statusLine reads "HTTP/1.x NNN reason" into resp.
func statusLine(resp *http.Response, line []byte) error {
	proto, rest, ok := bytes.Cut(line, []byte(" "))
	if !ok {
		return fmt.Errorf("malformed response status line %q", excerpt(line))
	}
	switch string(proto) {
	case "HTTP/1.1":
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	case "HTTP/1.0":
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.0", 1, 0
	default:
		return fmt.Errorf("malformed response status line %q (protocol)", excerpt(line))
	}
	code, reason, _ := bytes.Cut(rest, []byte(" "))
	if len(code) != 3 || code[0] < '1' || code[0] > '9' || code[1] < '0' || code[1] > '9' || code[2] < '0' || code[2] > '9' {
		return fmt.Errorf("malformed response status code in %q", excerpt(line))
	}
	resp.StatusCode = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	if resp.StatusCode == http.StatusOK && string(reason) == "OK" {
		resp.Status = "200 OK"
	} else {
		resp.Status = string(rest)
	}
	return nil
}

// frame sets resp's body from br and its framing: Content-Length,
// chunked, or to the connection's close (RFC 9112 section 6.3 for a
// response to a POST), and whether the connection closes after it.
func frame(resp *http.Response, br *bufio.Reader) error {
	h := resp.Header
	conn := h["Connection"]
	closes := httpguts.HeaderValuesContainsToken(conn, "close")
	resp.Close = closes || resp.ProtoMinor == 0 && !httpguts.HeaderValuesContainsToken(conn, "keep-alive")
	if closes {
		delete(h, "Connection") // as net/http: the framing is said in resp.Close
	}
	// Transfer-Encoding as net/http reads it: removed from the header,
	// ignored in HTTP/1.0, only chunked (alone) taken in HTTP/1.1.
	chunked := false
	if te, ok := h["Transfer-Encoding"]; ok {
		delete(h, "Transfer-Encoding")
		if resp.ProtoMinor > 0 {
			if len(te) != 1 || !strings.EqualFold(strings.TrimSpace(te[0]), "chunked") {
				return fmt.Errorf("unsupported response Transfer-Encoding %q", strings.Join(te, ", "))
			}
			chunked = true
		}
	}
	if c := resp.StatusCode; c/100 == 1 || c == http.StatusNoContent || c == http.StatusNotModified {
		resp.ContentLength, resp.Body = 0, http.NoBody
		return nil
	}
	if chunked {
		delete(h, "Content-Length") // chunked wins (RFC 9112 section 6.3)
		resp.TransferEncoding = chunkedCoding
		resp.ContentLength = -1
		resp.Body = &chunkedBody{r: httputil.NewChunkedReader(br), br: br}
		return nil
	}
	if cl := h["Content-Length"]; len(cl) > 0 {
		n, err := strconv.ParseInt(strings.TrimSpace(cl[0]), 10, 64)
		for _, v := range cl[1:] {
			if strings.TrimSpace(v) != strings.TrimSpace(cl[0]) {
				err = errors.New("differing values")
			}
		}
		if err != nil || n < 0 || strings.HasPrefix(strings.TrimSpace(cl[0]), "+") {
			return fmt.Errorf("malformed response Content-Length %q", strings.Join(cl, ", "))
		}
		h["Content-Length"] = cl[:1]
		resp.ContentLength = n
		if n == 0 {
			resp.Body = http.NoBody
		} else {
			resp.Body = io.NopCloser(&lengthBody{r: br, n: n})
		}
		return nil
	}
	// To the connection's close.
	resp.ContentLength, resp.Close = -1, true
	resp.Body = io.NopCloser(br)
	return nil
}

var chunkedCoding = []string{"chunked"}

// lengthBody is a body of n bytes; fewer before the connection's end is
// io.ErrUnexpectedEOF.
type lengthBody struct {
	r io.Reader
	n int64
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	if b.n <= 0 {
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// chunkedBody is a chunked body; at its last chunk it reads the trailer's
// lines (up to maxResponseHead) and drops them.
type chunkedBody struct {
	r    io.Reader
	br   *bufio.Reader
	done bool
}

func (b *chunkedBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		budget := maxResponseHead
		for {
			line, lerr := headLine(b.br, &budget)
			if lerr != nil {
				if lerr == io.EOF {
					lerr = io.ErrUnexpectedEOF
				}
				return n, lerr
			}
			if len(line) == 0 {
				break
			}
		}
		b.done = true
	}
	return n, err
}

func (b *chunkedBody) Close() error { return nil }

// canonicalName is http.CanonicalHeaderKey without an allocation for the
// names engines send (vLLM's server writes them in lower case).
func canonicalName(k string) string {
	if c, ok := commonNames[k]; ok {
		return c
	}
	return http.CanonicalHeaderKey(k)
}

var commonNames = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Content-Type", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Date", "Server", "Cache-Control", HeaderRequestID, "Vary", "Content-Encoding", "Retry-After", "Trailer", "Traceparent", "Tracestate"} {
		m[k], m[strings.ToLower(k)] = k, k
	}
	return m
}()

// excerpt quotes the start of a malformed line for an error.
func excerpt(b []byte) string {
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}
