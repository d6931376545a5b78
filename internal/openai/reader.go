package openai

import (
	"bytes"
	"errors"
	"fmt"
	"time"
	"unsafe"
)

// DefaultMaxEventBytes is the longest line, and the most data one event may
// gather, that a Reader accepts unless told otherwise. vLLM's largest
// events (a first chunk that echoes a long prompt, or carries its
// logprobs) stay well below it.
const DefaultMaxEventBytes = 8 << 20

// ErrTooLong marks a line, or an event's data, longer than
// Reader.MaxEventBytes.
var ErrTooLong = errors.New("openai: server-sent event longer than the limit")

// Reader reads a server-sent event stream of /v1/completions,
// /v1/chat/completions or /v1/responses incrementally: fed the response body's bytes in
// chunks split anywhere (inside "data: ", a CRLF or a UTF-8 sequence), it
// returns the events each chunk completes, stamped with the clock reading
// the caller gives. It follows the SSE standard: LF, CRLF and CR end lines,
// lines starting with ':' are comments, the data lines of one event are
// joined with newlines, a blank line ends the event, other fields (event,
// id, retry) are ignored, a leading byte order mark is dropped.
//
// Its memory is bounded: a line, or an event's data, longer than
// MaxEventBytes is an error. In steady state it allocates nothing for text
// and usage events (error events allocate their ErrorInfo).
//
// The zero Reader is ready. A Reader is not safe for concurrent use.
type Reader struct {
	// MaxEventBytes bounds a line and an event's data; 0 means
	// DefaultMaxEventBytes.
	MaxEventBytes int

	carry   []byte // the start of a line not yet ended
	data    []byte // the current event's data lines, each with its '\n'
	hasData bool   // the current event had a data field
	skipLF  bool   // the last line ended with '\r': a '\n' first in the next bytes is part of it
	started bool   // the first line was read (a byte order mark may lead it)
	n       int    // events decoded so far, for error messages
	err     error

	events []Event
	spans  []fields
	dec    decoder
}

var bom = []byte("\xef\xbb\xbf")

// Reset makes r ready for a new stream, keeping its buffers.
func (r *Reader) Reset() {
	limit := r.MaxEventBytes
	carry, data, events, spans, arena, key := r.carry[:0], r.data[:0], r.events[:0], r.spans[:0], r.dec.arena[:0], r.dec.key[:0]
	*r = Reader{MaxEventBytes: limit, carry: carry, data: data, events: events, spans: spans}
	r.dec.arena, r.dec.key = arena, key
}

// Retained is the bytes of buffer r keeps for the next stream after a
// Reset: a pool of Readers can drop those a huge event grew.
func (r *Reader) Retained() int {
	const eventSize, spanSize = int(unsafe.Sizeof(Event{})), int(unsafe.Sizeof(fields{}))
	return cap(r.carry) + cap(r.data) + cap(r.dec.arena) + cap(r.dec.key) + cap(r.events)*eventSize + cap(r.spans)*spanSize
}

// Err returns the error that stopped the reader, if any.
func (r *Reader) Err() error { return r.err }

func (r *Reader) limit() int {
	if r.MaxEventBytes > 0 {
		return r.MaxEventBytes
	}
	return DefaultMaxEventBytes
}

// Feed reads the next bytes of the stream, received at now (any clock the
// caller keeps: the reading is copied into Event.At), and returns the
// events they complete. The events, and the memory their Text and
// Reasoning point into, are valid until the next call. Feed does not keep
// p.
//
// An error stops the reader: a line or event longer than MaxEventBytes
// (ErrTooLong), or event data that is neither [DONE] nor one JSON object
// (ErrBadJSON). Feed then returns the events before it and the error, and
// every later call returns the same error.
func (r *Reader) Feed(p []byte, now time.Duration) ([]Event, error) {
	if r.err != nil {
		return nil, r.err
	}
	r.begin()
	limit := r.limit()
	for len(p) > 0 && r.err == nil {
		if r.skipLF {
			r.skipLF = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		end := bytes.IndexByte(p, '\n')
		search := p
		if end >= 0 {
			search = p[:end]
		}
		if cr := bytes.IndexByte(search, '\r'); cr >= 0 {
			end = cr
		}
		if end < 0 {
			if len(r.carry)+len(p) > limit {
				r.err = fmt.Errorf("%w: a line exceeds %d bytes", ErrTooLong, limit)
				break
			}
			r.carry = append(r.carry, p...)
			break
		}
		line := p[:end]
		if len(r.carry)+len(line) > limit {
			r.err = fmt.Errorf("%w: a line exceeds %d bytes", ErrTooLong, limit)
			break
		}
		if len(r.carry) > 0 {
			r.carry = append(r.carry, line...)
			line = r.carry
		}
		if p[end] == '\r' {
			if end+1 < len(p) {
				if p[end+1] == '\n' {
					end++
				}
			} else {
				r.skipLF = true
			}
		}
		p = p[end+1:]
		r.line(line, now, limit)
		r.carry = r.carry[:0]
	}
	return r.finish(), r.err
}

// End reads the end of the stream at now and returns the events it
// completes. Unlike the SSE standard, which drops them, it keeps a last
// line that lacks its line end and a last event that lacks its blank line:
// a server that closes right after "data: [DONE]\n" has still said it.
// Reset the Reader before it reads another stream.
func (r *Reader) End(now time.Duration) ([]Event, error) {
	if r.err != nil {
		return nil, r.err
	}
	r.begin()
	if len(r.carry) > 0 {
		r.line(r.carry, now, r.limit())
		r.carry = r.carry[:0]
	}
	if r.err == nil {
		r.dispatch(now)
	}
	r.skipLF = false
	return r.finish(), r.err
}

func (r *Reader) begin() {
	r.events, r.spans, r.dec.arena = r.events[:0], r.spans[:0], r.dec.arena[:0]
}

// finish points the events' text at the arena, which no longer moves.
func (r *Reader) finish() []Event {
	a := r.dec.arena
	for i := range r.events {
		f := &r.spans[i]
		e := &r.events[i]
		e.Text, e.Reasoning, e.ResponseID = f.bytes(a)
	}
	return r.events
}

// bytes returns f's text, reasoning and response id in arena a (nil for
// none, or empty).
func (f *fields) bytes(a []byte) (text, reasoning, id []byte) {
	at := func(s span) []byte {
		if s.hi > s.lo {
			return a[s.lo:s.hi:s.hi]
		}
		return nil
	}
	return at(f.text), at(f.reasoning), at(f.id)
}

// line takes one line, without its line end.
func (r *Reader) line(line []byte, now time.Duration, limit int) {
	if !r.started {
		r.started = true
		line = bytes.TrimPrefix(line, bom)
	}
	if len(line) == 0 {
		r.dispatch(now)
		return
	}
	if line[0] == ':' {
		return // a comment
	}
	name, value := line, []byte(nil)
	if c := bytes.IndexByte(line, ':'); c >= 0 {
		name, value = line[:c], line[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	if string(name) != "data" {
		return // event, id, retry or unknown: nothing this package needs
	}
	if len(r.data)+len(value)+1 > limit {
		r.err = fmt.Errorf("%w: an event's data exceeds %d bytes", ErrTooLong, limit)
		return
	}
	r.data = append(r.data, value...)
	r.data = append(r.data, '\n')
	r.hasData = true
}

// dispatch ends the current event.
func (r *Reader) dispatch(now time.Duration) {
	if !r.hasData {
		return
	}
	data := trimJSONSpace(r.data[:len(r.data)-1])
	r.data, r.hasData = r.data[:0], false
	if len(data) == 0 {
		return // data with nothing in it: no event
	}
	r.n++
	r.events = append(r.events, Event{At: now})
	r.spans = append(r.spans, fields{})
	e := &r.events[len(r.events)-1]
	if string(data) == "[DONE]" {
		e.Kind = KindDone
		return
	}
	if err := r.dec.decodePayload(data, e, &r.spans[len(r.spans)-1]); err != nil {
		r.events = r.events[:len(r.events)-1]
		r.spans = r.spans[:len(r.spans)-1]
		r.err = fmt.Errorf("openai: event %d (%s): %w", r.n, excerpt(data), err)
	}
}

// trimJSONSpace trims the white space JSON allows around a value.
func trimJSONSpace(b []byte) []byte {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// excerpt quotes the start of data for an error message.
func excerpt(data []byte) string {
	const n = 80
	if len(data) > n {
		return fmt.Sprintf("%q...", data[:n])
	}
	return fmt.Sprintf("%q", data)
}

// ParseResponse decodes a non-streamed /v1/completions,
// /v1/chat/completions or /v1/responses body, or an error body, into the fields an
// event has (Kind is KindChunk or KindError; At is zero). Its Text and
// Reasoning are its own.
func ParseResponse(body []byte) (Event, error) {
	var d decoder
	var e Event
	var f fields
	if err := d.decodePayload(body, &e, &f); err != nil {
		return Event{}, fmt.Errorf("openai: response body (%s): %w", excerpt(trimJSONSpace(body)), err)
	}
	e.Text, e.Reasoning, e.ResponseID = f.bytes(d.arena)
	return e, nil
}
