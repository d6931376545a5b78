package live

import (
	"bytes"
	"io"
	"net"

	"github.com/inferrail/inferrail/internal/openai"
)

// A stream's usage, asked for by the proxy (stream_usage, on by default).
// An engine reports a stream's token counts only when its client asks
// (stream_options.include_usage); without them the proxy meters the prompt
// as its edge tokenizer counts it and the answer by its chunks, and the
// engine's cached tokens go unseen. So when a streamed request has no
// stream_options, the proxy asks for the usage itself and keeps the one
// event it adds (the usage-only chunk vLLM sends before data: [DONE], its
// choices empty) from the client, who gets the stream it asked for.
// A request with stream_options of its own is sent as it is.

// streamUsageField is what the proxy adds to a body it asks usage for.
var streamUsageField = []byte(`,"stream_options":{"include_usage":true}`)

// asksUsage says whether the proxy asks the engine for in's usage.
func (s *Server) asksUsage(in *inbound) bool {
	return s.cfg.StreamUsage && in.f.Stream && !in.f.StreamOptions && !in.op.prefillOnly() && in.op != opResponses // a Responses stream always ends with its usage
}

// upBody is a request body as it goes to an engine: head, then ins, then
// tail, written in place (one writev) rather than copied into one slice.
type upBody struct{ head, ins, tail []byte }

// plainBody is b as it is.
func plainBody(b []byte) upBody { return upBody{head: b} }

// len is the body's length in bytes.
func (u upBody) len() int { return len(u.head) + len(u.ins) + len(u.tail) }

// appendTo appends the body's non-empty parts to bufs.
func (u upBody) appendTo(bufs net.Buffers) net.Buffers {
	for _, p := range [...][]byte{u.head, u.ins, u.tail} {
		if len(p) > 0 {
			bufs = append(bufs, p)
		}
	}
	return bufs
}

// reader reads the body from its start.
func (u upBody) reader() io.Reader {
	if len(u.ins) == 0 && len(u.tail) == 0 {
		return bytes.NewReader(u.head)
	}
	return io.MultiReader(bytes.NewReader(u.head), bytes.NewReader(u.ins), bytes.NewReader(u.tail))
}

// withStreamUsage returns body, a JSON object with at least one key,
// with stream_options.include_usage set as its last key (body is not
// copied: the addition goes between its parts).
func withStreamUsage(body []byte) upBody {
	i := bytes.LastIndexByte(body, '}')
	if i < 0 {
		return plainBody(body)
	}
	return upBody{head: body[:i], ins: streamUsageField, tail: body[i:]}
}

// maxHeldEvent bounds the start of an event held for its end (a usage
// event is a few hundred bytes).
const maxHeldEvent = 64 << 10

// keyUsage marks the bytes that may hold a usage event.
var keyUsage = []byte(`"usage"`)

// pass feeds p, the engine's next bytes, to a and returns what of them goes
// to the client (end: they are the engine's last): p, or bytes in a buffer
// of a's that the next pass reuses. A nil a passes p.
func (a *answer) pass(p []byte, end bool) []byte {
	if a == nil {
		return p
	}
	return a.passTo(p, end, &a.out)
}

// passTo is pass with the buffer its result may be in.
func (a *answer) passTo(p []byte, end bool, out *[]byte) []byte {
	if a == nil {
		return p
	}
	a.feed(p)
	if !a.strip {
		return p
	}
	return a.withoutUsage(p, end, out)
}

// withoutUsage returns p less the usage-only events it completes, in *buf
// unless that is p whole. An event cut between reads is held until its end
// comes (the client could not use its start); at the stream's end what is
// held goes out as it is.
func (a *answer) withoutUsage(p []byte, end bool, buf *[]byte) []byte {
	if len(a.held) == 0 && !bytes.Contains(p, keyUsage) && endsEvent(p) {
		return p // whole events, none of them the usage
	}
	data := p
	if len(a.held) > 0 {
		a.held = append(a.held, p...)
		data = a.held
	}
	out := (*buf)[:0]
	for {
		n := eventLen(data, end)
		if n < 0 {
			break
		}
		if ev := data[:n]; !a.usageOnly(ev) {
			out = append(out, ev...)
		}
		data = data[n:]
	}
	// A usage event is small: a longer start is some other event's, and
	// goes out now rather than grow held without bound.
	if end || len(data) > maxHeldEvent {
		out = append(out, data...)
		data = nil
	}
	a.held = append(a.held[:0], data...) // copy handles the overlap
	*buf = out
	return out
}

// endsEvent reports whether p ends with a blank line: an event's end.
func endsEvent(p []byte) bool {
	return bytes.HasSuffix(p, []byte("\n\n")) || bytes.HasSuffix(p, []byte("\r\n\r\n"))
}

// eventLen is the length of data's first server-sent event with the blank
// line that ends it (LF, CRLF and CR end lines), -1 when it has not ended.
// final: no bytes follow data (a CR last ends its line).
func eventLen(data []byte, final bool) int {
	start := 0 // of the current line
	for i := 0; i < len(data); i++ {
		c := data[i]
		if c != '\n' && c != '\r' {
			continue
		}
		next := i + 1
		if c == '\r' {
			if next == len(data) && !final {
				return -1 // a '\n' may follow in the next bytes
			}
			if next < len(data) && data[next] == '\n' {
				next++
			}
		}
		if i == start {
			return next // a blank line
		}
		start = next
		i = next - 1
	}
	return -1
}

// usageOnly reports whether ev, one whole event, is a chunk with a usage
// and no choices.
func (a *answer) usageOnly(ev []byte) bool {
	if !bytes.Contains(ev, keyUsage) {
		return false
	}
	r := &a.check
	r.Reset()
	evs, err := r.Feed(ev, 0)
	if err != nil || len(evs) != 1 {
		return false
	}
	return evs[0].Kind == openai.KindChunk && evs[0].Choices == 0 && evs[0].HasUsage
}
