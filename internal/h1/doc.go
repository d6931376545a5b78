// Package h1 serves HTTP/1.1 with a loop of its own on each connection, for
// the proxy's hot path: net/http's parsers (http.ReadRequest) and its
// handler interface (http.Handler, http.ResponseWriter, and
// http.ResponseController's Flush, SetReadDeadline and SetWriteDeadline),
// without net/http's server around them. A request is served in its
// connection's goroutine, with no goroutine of its own and no background
// read of the connection while the handler runs: the proxy spends about
// 10% less CPU a request than on net/http's server, 8-12 µs (the two
// builds in turn at 1,000 and 3,000 requests a second on a 2-core machine:
// scripts/ab-live.sh; README, overhead).
//
// Start at Server: Serve runs it on a listener, Shutdown drains it, Close
// ends it. What it keeps from net/http's server, and tests: header size cap
// (431) and read_header/idle timeouts; the request checks net/http makes
// (Host, header names and values, one chunked transfer coding only, one
// Content-Length; 400, 501, 505, 417); 100 Continue sent when the handler
// first reads a body that asks for it, never otherwise; a chunked request
// body's connection closed after its answer (RFC 9112 §6.1); responses
// framed by Content-Length (given, or counted when the handler ends before
// 2 KiB), chunked, or by the connection's close for HTTP/1.0 (kept alive when
// the client asks and the length is known); pipelined
// requests answered in turn; a request's context ends when the handler
// returns, when a write to the client fails, and, while the handler waits
// without having streamed (queued, or before a whole answer), when the
// client closes the connection: a read of the connection is started for
// that once the request is ClientGoneAfter old, as net/http starts one for
// every request. panic(http.ErrAbortHandler) closes the connection without
// a log line. With TLSConfig the handshake is bounded by
// ReadHeaderTimeout and ALPN chooses: http/1.1 is served here (the request
// has its TLS state), h2 is handed to Fallback, a net/http server, as is
// an h2c connection (prior knowledge) without TLS.
package h1
