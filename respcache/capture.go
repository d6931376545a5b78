package respcache

import (
	"bytes"
	"mime"
	"net/http"
	"strings"

	"github.com/inferrail/inferrail/internal/openai"
)

// Why a miss's answer was not stored (Hooks.NotStored, and the reason
// label of inferrail_response_cache_not_stored_total).
const (
	NotStoredTooLarge    = "too_large"        // past max_entry_bytes
	NotStoredStatus      = "status"           // not 200
	NotStoredEncoding    = "content_encoding" // compressed: replayed bytes would lose their encoding
	NotStoredContentType = "content_type"     // not JSON (or not SSE for a stream)
	NotStoredIncomplete  = "incomplete"       // empty, cut short, or a stream without data: [DONE]
	NotStoredErrorEvent  = "error_event"      // an error in the stream, or an error body
	NotStoredMalformed   = "malformed"        // the body is not what the engines write
)

// initialCapture is the first capture buffer's size.
const initialCapture = 16 << 10

// Capture is the ResponseWriter of a miss: every byte written to it goes
// to the client first (unbuffered: Write returns when the client's writer
// did, and Flush flushes it), then into a buffer of at most
// max_entry_bytes with the stream's event boundaries. Finish stores the
// answer when it was whole and successful: status 200, uncompressed, the
// content type of its kind, a JSON body that is a completion (not an
// error), or a stream that ended with data: [DONE] and held no error
// event. A Capture is used by one handler goroutine.
//
// It sets x-inferrail-cache: miss when it wraps a writer. Unwrap gives
// http.ResponseController the writer beneath (write deadlines, flushes).
type Capture struct {
	c      *Cache
	key    Key
	kind   Kind
	flight *flight
	limit  int

	w           http.ResponseWriter
	wroteHeader bool
	status      int
	ctype       string
	encoded     bool

	buf      []byte
	events   []int
	tooLarge bool
	finished bool
	// stored is the entry Finish stored (nil: none).
	stored *Entry
	// SSE boundary scan state: at the start of a line; the last byte was
	// a CR (a LF next is part of its line end); the blank line that ended
	// the last event ended with that CR (a LF next extends the event).
	lineStart, sawCR, crBlank bool
}

// Wrap returns w's capture: write the answer to it instead of w. It sets
// x-inferrail-cache: miss on w's headers.
func (p *Capture) Wrap(w http.ResponseWriter) http.ResponseWriter {
	p.w = w
	p.lineStart = true
	w.Header().Set(HeaderCache, "miss")
	return p
}

// Header returns the client's headers.
func (p *Capture) Header() http.Header { return p.w.Header() }

// WriteHeader records the status, content type and encoding, and sends
// them to the client.
func (p *Capture) WriteHeader(code int) {
	if !p.wroteHeader && code >= 200 { // 1xx informational headers come before
		p.header(code)
	}
	p.w.WriteHeader(code)
}

func (p *Capture) header(code int) {
	p.wroteHeader = true
	p.status = code
	h := p.w.Header()
	p.ctype = h.Get("Content-Type")
	if ce := h.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		p.encoded = true
	}
}

// Write sends b to the client, then keeps it.
func (p *Capture) Write(b []byte) (int, error) {
	if !p.wroteHeader {
		p.header(http.StatusOK)
	}
	n, err := p.w.Write(b)
	p.keep(b[:n])
	return n, err
}

// Flush flushes the client's writer.
func (p *Capture) Flush() { _ = http.NewResponseController(p.w).Flush() }

// FlushError flushes the client's writer and returns its error.
func (p *Capture) FlushError() error { return http.NewResponseController(p.w).Flush() }

// Unwrap returns the client's writer, for http.ResponseController.
func (p *Capture) Unwrap() http.ResponseWriter { return p.w }

func (p *Capture) keep(b []byte) {
	if p.tooLarge || p.finished || len(b) == 0 {
		return
	}
	if len(p.buf)+len(b) > p.limit {
		p.tooLarge = true
		p.buf, p.events = nil, nil
		return
	}
	if p.buf == nil {
		// Most answers fit in the first buffer; a bigger one doubles it.
		p.buf = make([]byte, 0, min(p.limit, max(initialCapture, len(b))))
		if p.kind == KindSSE {
			p.events = make([]int, 0, 64)
		}
	}
	base := len(p.buf)
	p.buf = append(p.buf, b...)
	if p.kind == KindSSE {
		p.scan(b, base)
	}
}

// scan finds the event boundaries in b (at offset base of the stream): a
// blank line ends an event, lines ending in LF, CRLF or CR.
func (p *Capture) scan(b []byte, base int) {
	for i := 0; i < len(b); {
		if p.sawCR {
			p.sawCR = false
			if b[i] == '\n' {
				if p.crBlank {
					p.events[len(p.events)-1]++
				}
				p.crBlank = false
				i++
				continue
			}
			p.crBlank = false
		}
		j := bytes.IndexAny(b[i:], "\r\n")
		if j < 0 {
			p.lineStart = false
			return
		}
		if j > 0 {
			p.lineStart = false
		}
		i += j
		if p.lineStart {
			p.events = append(p.events, base+i+1)
			p.crBlank = b[i] == '\r'
		}
		p.lineStart = true
		p.sawCR = b[i] == '\r'
		i++
	}
}

// Finish ends the capture once the handler is done with the answer: it
// stores a whole, successful answer (and hands it to the identical
// requests waiting for it), or lets those go to the engine themselves. Call
// it exactly once, after the last write, whatever way the handler ends (a
// deferred call runs on the panic that aborts a broken stream, too); later
// calls do nothing. It first flushes what the handler wrote last, so the
// checks and the store's write never delay the client's last byte; with a
// remote store the write happens off the request path altogether.
func (p *Capture) Finish() {
	if p.finished {
		return
	}
	p.finished = true
	if p.wroteHeader {
		// What the handler wrote last goes out now, not after the checks
		// below: the client's last byte does not wait for the cache.
		_ = http.NewResponseController(p.w).Flush()
	}
	e, reason := p.entry()
	if e == nil {
		p.c.hooks.notStored(reason)
	}
	p.stored = e
	p.c.settle(p.key, p.flight, e)
	p.buf, p.events = nil, nil
}

// Entry returns the entry Finish stored (handed to the store and to the
// identical requests waiting), nil before Finish or when the answer was
// not stored. The proxy gives it to the semantic cache (EncodeEntry), so
// a later similar request replays it with the same event boundaries.
func (p *Capture) Entry() *Entry { return p.stored }

// Abandon ends a capture whose request is answered another way (the
// semantic cache had an answer) before anything was written through it:
// nothing is stored under its key, nothing is counted as not stored, and
// the identical requests waiting for it look for their own answer. It
// must be called instead of Finish; Finish after it does nothing.
func (p *Capture) Abandon() {
	if p.finished {
		return
	}
	p.finished = true
	p.c.settle(p.key, p.flight, nil)
	p.buf, p.events = nil, nil
}

// entry builds the stored entry, or says why there is none.
func (p *Capture) entry() (*Entry, string) {
	switch {
	case p.tooLarge:
		return nil, NotStoredTooLarge
	case !p.wroteHeader || len(p.buf) == 0:
		return nil, NotStoredIncomplete
	case p.status != http.StatusOK:
		return nil, NotStoredStatus
	case p.encoded:
		return nil, NotStoredEncoding
	}
	mt, _, err := mime.ParseMediaType(p.ctype)
	if err != nil {
		return nil, NotStoredContentType
	}
	e := &Entry{Kind: p.kind, ContentType: p.ctype, Usage: Usage{CachedTokens: -1}}
	switch p.kind {
	case KindJSON:
		if mt != "application/json" {
			return nil, NotStoredContentType
		}
		ev, err := openai.ParseResponse(p.buf)
		if err != nil {
			return nil, NotStoredMalformed
		}
		if ev.Kind == openai.KindError {
			return nil, NotStoredErrorEvent
		}
		e.Usage = usageOf(ev.Usage, ev.HasUsage)
	case KindSSE:
		if mt != "text/event-stream" {
			return nil, NotStoredContentType
		}
		var r openai.Reader
		r.MaxEventBytes = p.limit
		var last openai.Kind
		read := func(evs []openai.Event) string {
			for i := range evs {
				ev := &evs[i]
				if ev.Kind == openai.KindError {
					return NotStoredErrorEvent
				}
				if last == openai.KindDone {
					return NotStoredMalformed // events after [DONE]
				}
				last = ev.Kind
				if ev.HasUsage {
					e.Usage = usageOf(ev.Usage, true)
				}
			}
			return ""
		}
		evs, err := r.Feed(p.buf, 0)
		if bad := read(evs); bad != "" {
			return nil, bad
		}
		if err != nil {
			return nil, NotStoredMalformed
		}
		evs, err = r.End(0)
		if bad := read(evs); bad != "" {
			return nil, bad
		}
		if err != nil {
			return nil, NotStoredMalformed
		}
		if last != openai.KindDone {
			return nil, NotStoredIncomplete
		}
		e.Events = p.events
	}
	e.Body = p.buf
	if cap(p.buf) > len(p.buf)+len(p.buf)/8 {
		// Appends leave up to twice the room: the store holds (and
		// counts) exactly the answer.
		e.Body = bytes.Clone(p.buf)
	}
	return e, ""
}

func usageOf(u openai.Usage, known bool) Usage {
	if !known {
		return Usage{CachedTokens: -1}
	}
	return Usage{Known: true, PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, CachedTokens: u.CachedTokens}
}
