package live

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// parsed is what a response reader made of one response on a connection:
// its head, its body, whether the connection closes after it, and the
// response after it on the same connection (pipelined), if any.
type parsed struct {
	status  int
	header  http.Header
	length  int64
	chunked bool
	close   bool
	body    string
	bodyErr bool
	next    int // the next response's status (0: none or an error)
}

func parseWith(read func(*bufio.Reader) (*http.Response, error), in string) (parsed, error) {
	br := bufio.NewReaderSize(strings.NewReader(in), 64)
	resp, err := read(br)
	if err != nil {
		return parsed{}, err
	}
	p := parsed{status: resp.StatusCode, header: resp.Header, length: resp.ContentLength, chunked: len(resp.TransferEncoding) > 0, close: resp.Close}
	b, err := io.ReadAll(resp.Body)
	p.body, p.bodyErr = string(b), err != nil
	if err == nil && !resp.Close {
		if next, err := read(br); err == nil {
			p.next = next.StatusCode
		}
	}
	return p, nil
}

func netHTTPRead(br *bufio.Reader) (*http.Response, error) {
	return http.ReadResponse(br, &http.Request{Method: http.MethodPost})
}

// responseCases are what engines send (and some of what they must not),
// each followed on the connection by a second response.
var responseCases = map[string]string{
	"sse chunked": "HTTP/1.1 200 OK\r\nCache-Control: no-cache\r\nContent-Type: text/event-stream; charset=utf-8\r\nX-Request-Id: 2f70\r\nDate: Sun, 06 Dec 2026 14:02:40 GMT\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"f\r\ndata: {\"a\":1}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
	"lower-case names (uvicorn)": "HTTP/1.1 200 OK\r\ndate: x\r\nserver: uvicorn\r\ncontent-type: application/json\r\ncontent-length: 2\r\nx-request-id: abc\r\n\r\n{}",
	"content-length":             "HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\n\r\nhello",
	"zero length":                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
	"repeated equal lengths":     "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
	"chunked wins over length":   "HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
	"chunk extensions, trailer":  "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n",
	"close":                      "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 4\r\n\r\nbusy",
	"close-delimited":            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nto the end",
	"http/1.0":                   "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"http/1.0 keep-alive":        "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
	"no content":                 "HTTP/1.1 204 No Content\r\n\r\n",
	"repeated header, LF only":   "HTTP/1.1 200 OK\nVary: a\nVary: b\nX-Empty:\nContent-Length: 1\n\nx",
	"spaces around a value":      "HTTP/1.1 200 OK\r\nX-A:   v  \t\r\nContent-Length: 1\r\n\r\nx",
	"no reason":                  "HTTP/1.1 200\r\nContent-Length: 1\r\n\r\nx",
	"short body":                 "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
	"broken chunk":               "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
}

// Malformed heads: errors, as net/http's.
var badResponses = map[string]string{
	"empty":             "",
	"cut head":          "HTTP/1.1 200 OK\r\nContent-Le",
	"not http":          "SSH-2.0-OpenSSH\r\n\r\n",
	"bad code":          "HTTP/1.1 2x0 OK\r\n\r\n",
	"two-digit code":    "HTTP/1.1 20 OK\r\n\r\n",
	"no colon":          "HTTP/1.1 200 OK\r\nbroken\r\n\r\n",
	"differing lengths": "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
	"negative length":   "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
	"gzip coding":       "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
	"two codings":       "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
}

// The lean response reader makes of every response what http.ReadResponse
// does: status, headers, framing, body, the connection's fate, and the next
// response on the connection (a chunked body's trailer is consumed).
func TestReadResponseAsNetHTTP(t *testing.T) {
	next := "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"
	for name, in := range responseCases {
		t.Run(name, func(t *testing.T) {
			want, werr := parseWith(netHTTPRead, in+next)
			got, gerr := parseWith(readResponse, in+next)
			if (werr != nil) != (gerr != nil) {
				t.Fatalf("error %v, net/http's %v", gerr, werr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("got  %+v\nwant %+v", got, want)
			}
		})
	}
	for name, in := range badResponses {
		t.Run(name, func(t *testing.T) {
			_, werr := parseWith(netHTTPRead, in)
			_, gerr := parseWith(readResponse, in)
			if werr == nil {
				t.Fatalf("net/http accepts %q: not a malformed case", in)
			}
			if gerr == nil {
				t.Fatalf("accepted, net/http: %v", werr)
			}
		})
	}
}

// Stricter than net/http, which takes these: a name with a space before
// its colon (a smuggling vector in front of other parsers) and obsolete
// line folding (RFC 9112 section 5.2: a recipient may reject it).
func TestReadResponseRefusesWhatNetHTTPTolerates(t *testing.T) {
	for _, in := range []string{
		"HTTP/1.1 200 OK\r\nX-A : b\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-A: b\r\n c\r\nContent-Length: 0\r\n\r\n",
	} {
		if _, err := parseWith(readResponse, in); err == nil {
			t.Errorf("%q: read", in)
		}
	}
}

// A head over 1 MiB is refused, however it is split into lines.
func TestReadResponseBoundsTheHead(t *testing.T) {
	for _, in := range []string{
		"HTTP/1.1 200 OK\r\nX-Long: " + strings.Repeat("a", 2<<20) + "\r\n\r\n",
		"HTTP/1.1 200 OK\r\n" + strings.Repeat("X-A: b\r\n", 200000) + "\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + strings.Repeat("X-T: b\r\n", 200000) + "\r\n",
	} {
		br := bufio.NewReader(strings.NewReader(in))
		resp, err := readResponse(br)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
		}
		if err == nil {
			t.Errorf("a %d-byte head was read", len(in))
		}
	}
}

// Fed anything, the reader never panics, and when both it and net/http
// read a response they agree on it.
func FuzzReadResponse(f *testing.F) {
	for _, in := range responseCases {
		f.Add([]byte(in))
	}
	for _, in := range badResponses {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got, gerr := parseWith(readResponse, string(in))
		want, werr := parseWith(netHTTPRead, string(in))
		if gerr != nil || werr != nil {
			return // one refused what the other read: stricter is fine
		}
		// A status without a body (1xx, 204, 304) has no framing: net/http
		// still reports a Transfer-Encoding it names, this reader none.
		bodiless := want.status/100 == 1 || want.status == http.StatusNoContent || want.status == http.StatusNotModified
		if got.status != want.status || got.length != want.length || got.chunked != want.chunked && !bodiless || got.close != want.close {
			t.Fatalf("head %+v, net/http's %+v", got, want)
		}
		if !got.bodyErr && !want.bodyErr && got.body != want.body {
			t.Fatalf("body %q, net/http's %q", got.body, want.body)
		}
		if fmt.Sprint(got.header) != fmt.Sprint(want.header) && bytes.IndexByte(in, 0) < 0 {
			t.Fatalf("header %v, net/http's %v", got.header, want.header)
		}
	})
}

// BenchmarkReadResponse reads an engine's streamed answer's head (as the
// mock engine writes it) and its chunked body with the lean reader and with
// http.ReadResponse.
func BenchmarkReadResponse(b *testing.B) {
	in := []byte(responseCases["sse chunked"])
	for _, r := range []struct {
		name string
		read func(*bufio.Reader) (*http.Response, error)
	}{{"lean", readResponse}, {"net-http", netHTTPRead}} {
		b.Run(r.name, func(b *testing.B) {
			src := bytes.NewReader(in)
			br := bufio.NewReaderSize(src, 16<<10)
			buf := make([]byte, 4096)
			b.ReportAllocs()
			for b.Loop() {
				src.Reset(in)
				br.Reset(src)
				resp, err := r.read(br)
				if err != nil {
					b.Fatal(err)
				}
				for err == nil {
					_, err = resp.Body.Read(buf)
				}
			}
		})
	}
}
