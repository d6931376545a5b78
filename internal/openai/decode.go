package openai

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrBadJSON marks an event's data, or a response body, that is neither
// [DONE] nor one valid JSON object.
var ErrBadJSON = errors.New("not a valid JSON object")

// maxDepth is how deeply objects and arrays may nest, as in encoding/json.
const maxDepth = 10000

// span is where a decoded string lies in the arena; ok is false when the
// field was absent, null or not a string.
type span struct {
	lo, hi int
	ok     bool
}

// fields are the spans of one decoded payload, turned into Event's byte
// slices once the arena stops moving.
type fields struct {
	text, reasoning span
	// id is a Responses API response's id (Event.ResponseID).
	id span
}

// decoder reads the fields an Event holds out of one JSON object, checking
// the whole of it as strictly as encoding/json does, and allocates nothing
// but the ErrorInfo of an error payload. Decoded strings are appended to
// arena.
type decoder struct {
	b     []byte
	i     int
	depth int
	err   error
	arena []byte
	// key holds a key that had escapes, decoded.
	key []byte
	// plain is scanString's verdict on the last string stringRaw read.
	plain bool
}

// choice is one choice object's fields; the content and reasoning of delta
// and message are kept apart, and chosen between at the end.
type choice struct {
	index int
	text  span
	// delta's and message's content, reasoning_content and reasoning.
	delta, message [3]span
	finish         []byte
	finishOK       bool
}

// decodePayload decodes data into ev (its Kind, first choice, usage and
// error) and f. ev.At is left alone.
func (d *decoder) decodePayload(data []byte, ev *Event, f *fields) error {
	d.b, d.i, d.depth, d.err = data, 0, 0, nil
	*f = fields{}
	ev.Kind, ev.Choices, ev.Index, ev.FinishReason = KindChunk, 0, 0, ""
	ev.Usage, ev.HasUsage, ev.Error = Usage{CachedTokens: -1}, false, nil
	ev.Text, ev.Reasoning = nil, nil
	d.ws()
	if d.i >= len(d.b) || d.b[d.i] != '{' {
		d.skipValue()
		if d.err == nil {
			d.err = ErrBadJSON
		}
		return d.err
	}
	d.i++
	if !d.enter() {
		return d.err
	}
	var errInfo *ErrorInfo
	objectIsError, isResponse := false, false
	var top ErrorInfo // the fields of an {"object": "error", ...} body
	var c choice
	// The Responses API's: the event's type, its delta, the response it
	// carries, a response body's output and id (its bytes in d.b).
	var typ, id []byte
	var delta span
	var resp response
	var out output
	for n := 0; d.more('}', &n); {
		key := d.objectKey()
		if d.err != nil {
			break
		}
		switch string(key) {
		case "choices":
			c = choice{}
			ev.Choices = d.choices(&c)
		case "usage":
			ev.Usage, ev.HasUsage = d.usage()
		case "error":
			errInfo = d.errorValue()
		case "object":
			s := d.enum()
			objectIsError = string(s) == "error"
			isResponse = string(s) == "response"
		case "message":
			top.Message = d.stringAlloc()
		case "type":
			typ = d.enum()
		case "delta":
			delta = d.stringSpan()
		case "id":
			id, _ = d.stringRaw()
			if !d.plain && d.needsDecode(id) {
				id = d.unescape(nil, id)
			}
		case "response":
			d.response(&resp)
		case "output":
			d.output(&out)
		case "param":
			top.Param = d.stringPtr()
		case "code":
			top.Code = d.code()
		default:
			d.skipValue()
		}
	}
	if d.err == nil {
		d.ws()
		if d.i < len(d.b) {
			d.fail("invalid character after the top-level object")
		}
	}
	if d.err != nil {
		return d.err
	}
	d.depth--
	ev.Index = c.index
	if c.finishOK {
		ev.FinishReason = intern(c.finish)
	}
	switch {
	case c.text.ok:
		f.text = c.text
	case c.delta[0].ok:
		f.text = c.delta[0]
	case c.message[0].ok:
		f.text = c.message[0]
	}
	for _, s := range [4]span{c.delta[1], c.delta[2], c.message[1], c.message[2]} {
		if s.ok {
			f.reasoning = s
			break
		}
	}
	if isResponse { // a Responses API response body
		if id != nil {
			f.id = d.keep(id)
		}
		f.text, f.reasoning = out.text, out.reasoning
	}
	if resp.ok { // an event that carries the response
		f.id = resp.id
		if resp.hasUsage {
			ev.Usage, ev.HasUsage = resp.usage, true
		}
	}
	switch string(typ) { // a Responses API stream's events
	case "response.output_text.delta":
		f.text = delta
	case "response.reasoning_text.delta", "response.reasoning_summary_text.delta":
		f.reasoning = delta
	case "response.completed", "response.incomplete":
		ev.Kind = KindDone
	case "response.failed":
		e := resp.err
		if e == nil {
			e = &ErrorInfo{Message: "the response failed", Type: "server_error"}
		}
		ev.Kind, ev.Error = KindError, e
	case "error":
		if errInfo == nil && !objectIsError {
			e := new(ErrorInfo)
			*e = top
			errInfo = e
		}
	}
	switch {
	case errInfo != nil:
		ev.Kind, ev.Error = KindError, errInfo
	case objectIsError:
		e := new(ErrorInfo)
		*e = top
		e.Type = string(typ)
		ev.Kind, ev.Error = KindError, e
	}
	return nil
}

// enum reads a string value that names one of a few things (an object's
// kind, an event's type); escapes are decoded. Anything else is nil.
func (d *decoder) enum() []byte {
	s, ok := d.stringRaw()
	if !ok {
		return nil
	}
	if !d.plain && d.needsDecode(s) {
		return d.unescape(nil, s)
	}
	return s
}

// keep copies a decoded string into the arena.
func (d *decoder) keep(s []byte) span {
	lo := len(d.arena)
	d.arena = append(d.arena, s...)
	return span{lo: lo, hi: len(d.arena), ok: true}
}

// response is what an event of the Responses API says of the response it
// carries (response.created, response.completed, response.failed...).
type response struct {
	ok       bool
	id       span
	usage    Usage
	hasUsage bool
	err      *ErrorInfo
}

// response reads an event's response object: its id, usage and error. Its
// output is not read: the events before it carried the text.
func (d *decoder) response(r *response) {
	r.ok = d.object(func(key []byte) {
		switch string(key) {
		case "id":
			r.id = d.stringSpan()
		case "usage":
			r.usage, r.hasUsage = d.usage()
		case "error":
			r.err = d.errorValue()
		default:
			d.skipValue()
		}
	})
}

// output is the text of a Responses API body's output: the first message's
// first output_text part and the first reasoning item's first text.
type output struct{ text, reasoning span }

// output reads a response body's output array.
func (d *decoder) output(o *output) {
	d.array(func() {
		var typ []byte
		var text span
		d.object(func(key []byte) {
			switch string(key) {
			case "type":
				typ = d.enum()
			case "content":
				text = d.parts()
			default:
				d.skipValue()
			}
		})
		switch string(typ) {
		case "message":
			if !o.text.ok {
				o.text = text
			}
		case "reasoning":
			if !o.reasoning.ok {
				o.reasoning = text
			}
		}
	})
}

// parts reads an output item's content array and returns the text of its
// first output_text or reasoning_text part.
func (d *decoder) parts() span {
	var first span
	d.array(func() {
		var typ []byte
		var text span
		d.object(func(key []byte) {
			switch string(key) {
			case "type":
				typ = d.enum()
			case "text":
				text = d.stringSpan()
			default:
				d.skipValue()
			}
		})
		if !first.ok && text.ok && (string(typ) == "output_text" || string(typ) == "reasoning_text") {
			first = text
		}
	})
	return first
}

// choices reads the choices array into c (its first element) and returns
// its length; anything but an array counts as no choices.
func (d *decoder) choices(c *choice) int {
	count := 0
	d.array(func() {
		count++
		if count == 1 && d.peek('{') {
			d.choice(c)
		} else {
			d.skipValue()
		}
	})
	return count
}

func (d *decoder) choice(c *choice) {
	d.object(func(key []byte) {
		switch string(key) {
		case "index":
			c.index, _ = d.int()
		case "text":
			c.text = d.stringSpan()
		case "delta":
			c.delta = d.message()
		case "message":
			c.message = d.message()
		case "finish_reason":
			c.finish, c.finishOK = d.stringRaw()
			if c.finishOK && !d.plain && d.needsDecode(c.finish) {
				c.finish = d.unescape(nil, c.finish)
			}
		default:
			d.skipValue()
		}
	})
}

// message reads a delta or message object: its content, reasoning_content
// and reasoning strings, in that order. Anything but an object has none.
func (d *decoder) message() (m [3]span) {
	d.object(func(key []byte) {
		switch string(key) {
		case "content":
			m[0] = d.stringSpan()
		case "reasoning_content":
			m[1] = d.stringSpan()
		case "reasoning":
			m[2] = d.stringSpan()
		default:
			d.skipValue()
		}
	})
	return m
}

// usage reads a usage object; anything else (null) is no usage.
func (d *decoder) usage() (Usage, bool) {
	u := Usage{CachedTokens: -1}
	ok := d.object(func(key []byte) {
		switch string(key) {
		case "prompt_tokens":
			u.PromptTokens, _ = d.int()
		case "completion_tokens":
			u.CompletionTokens, _ = d.int()
		case "prompt_tokens_details":
			u.CachedTokens = d.details()
		case "input_tokens": // the Responses API's names
			u.PromptTokens, _ = d.int()
		case "output_tokens":
			u.CompletionTokens, _ = d.int()
		case "input_tokens_details":
			u.CachedTokens = d.details()
		default:
			d.skipValue()
		}
	})
	return u, ok
}

// details reads prompt_tokens_details' (input_tokens_details')
// cached_tokens, -1 when absent.
func (d *decoder) details() int {
	cached := -1
	d.object(func(key []byte) {
		if string(key) != "cached_tokens" {
			d.skipValue()
			return
		}
		v, ok := d.int()
		cached = -1
		if ok {
			cached = v
		}
	})
	return cached
}

// errorValue reads the error field: an object in OpenAI's shape, or a bare
// message string; nil for null or anything else.
func (d *decoder) errorValue() *ErrorInfo {
	if d.peek('"') {
		s := d.stringAlloc()
		if d.err != nil {
			return nil
		}
		return &ErrorInfo{Message: s}
	}
	e := new(ErrorInfo)
	if !d.object(func(key []byte) {
		switch string(key) {
		case "message":
			e.Message = d.stringAlloc()
		case "type":
			e.Type = d.stringAlloc()
		case "param":
			e.Param = d.stringPtr()
		case "code":
			e.Code = d.code()
		default:
			d.skipValue()
		}
	}) {
		return nil
	}
	return e
}

// code reads an error code: a string, a number, or anything else as null.
func (d *decoder) code() Code {
	if d.i < len(d.b) {
		switch c := d.b[d.i]; {
		case c == '"':
			return StringCode(d.stringAlloc())
		case c == '-' || c >= '0' && c <= '9':
			start := d.i
			v, isInt := d.number()
			if d.err != nil {
				return Code{}
			}
			return Code{kind: codeNumber, s: string(d.b[start:d.i]), n: v, isInt: isInt}
		}
	}
	d.skipValue()
	return Code{}
}

// --- values ---

// stringSpan decodes a string value into the arena; anything else is
// skipped and reported absent.
func (d *decoder) stringSpan() span {
	raw, ok := d.stringRaw()
	if !ok {
		return span{}
	}
	lo := len(d.arena)
	if !d.plain && d.needsDecode(raw) {
		d.arena = d.unescape(d.arena, raw)
	} else {
		d.arena = append(d.arena, raw...)
	}
	return span{lo: lo, hi: len(d.arena), ok: true}
}

// stringAlloc decodes a string value into a new string ("" for anything
// else). Only error payloads use it.
func (d *decoder) stringAlloc() string {
	raw, ok := d.stringRaw()
	if !ok {
		return ""
	}
	if !d.plain && d.needsDecode(raw) {
		return string(d.unescape(nil, raw))
	}
	return string(raw)
}

func (d *decoder) stringPtr() *string {
	if !d.peek('"') {
		d.skipValue()
		return nil
	}
	s := d.stringAlloc()
	return &s
}

// stringRaw returns a string value's bytes between its quotes, still
// escaped; for anything else it skips the value and returns false.
func (d *decoder) stringRaw() ([]byte, bool) {
	if !d.peek('"') {
		d.skipValue()
		return nil, false
	}
	lo, hi, plain := d.scanString()
	if d.err != nil {
		return nil, false
	}
	d.plain = plain
	return d.b[lo:hi], true
}

// int reads a number value that is a plain integer within int64 (as
// strconv.ParseInt reads it); anything else is skipped and reported absent.
func (d *decoder) int() (int, bool) {
	if d.i < len(d.b) && (d.b[d.i] == '-' || d.b[d.i] >= '0' && d.b[d.i] <= '9') {
		v, ok := d.number()
		return v, ok && d.err == nil
	}
	d.skipValue()
	return 0, false
}

// number scans a JSON number and returns its value when it is an integer
// literal (no fraction or exponent) within int64.
func (d *decoder) number() (int, bool) {
	b := d.b
	i := d.i
	neg := false
	if i < len(b) && b[i] == '-' {
		neg = true
		i++
	}
	digits := i
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		d.i = i
		d.fail("invalid number")
		return 0, false
	}
	intEnd := i
	isInt := true
	if i < len(b) && b[i] == '.' {
		isInt = false
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			d.i = i
			d.fail("invalid number")
			return 0, false
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		isInt = false
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			d.i = i
			d.fail("invalid number")
			return 0, false
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	d.i = i
	if !isInt {
		return 0, false
	}
	var u uint64
	for _, c := range b[digits:intEnd] {
		if u > (math.MaxUint64-9)/10 {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
	}
	switch {
	case !neg && u <= math.MaxInt64:
		return int(u), true
	case neg && u <= 1<<63:
		return int(-int64(u)), true // 1<<63 wraps to math.MinInt64, its own negation
	}
	return 0, false
}

// --- structure ---

func (d *decoder) fail(msg string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: offset %d: %s", ErrBadJSON, d.i, msg)
	}
}

func (d *decoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek skips white space and reports whether the next byte is c.
func (d *decoder) peek(c byte) bool {
	d.ws()
	return d.err == nil && d.i < len(d.b) && d.b[d.i] == c
}

// enter counts one more level of nesting, failing past maxDepth.
func (d *decoder) enter() bool {
	d.depth++
	if d.depth > maxDepth {
		d.fail("nested too deeply")
		return false
	}
	return true
}

// object reads an object, handing each key to field, which reads (or
// skips) its value; anything but an object is skipped. It reports whether
// an object was read (false too when a key was malformed).
func (d *decoder) object(field func(key []byte)) bool {
	if !d.peek('{') {
		d.skipValue()
		return false
	}
	d.i++
	if !d.enter() {
		return false
	}
	for n := 0; d.more('}', &n); {
		key := d.objectKey()
		if d.err != nil {
			return false
		}
		field(key)
	}
	d.depth--
	return true
}

// array reads an array, handing each element to elem, which reads (or
// skips) it; anything but an array is skipped. It reports whether an
// array was read.
func (d *decoder) array(elem func()) bool {
	if !d.peek('[') {
		d.skipValue()
		return false
	}
	d.i++
	if !d.enter() {
		return false
	}
	for n := 0; d.more(']', &n); {
		elem()
	}
	d.depth--
	return d.err == nil
}

// more steps through an object or array whose opening byte was consumed
// (and its level counted with enter): it consumes the comma before every
// element but the first, or the closing byte and then returns false. n
// counts the elements.
func (d *decoder) more(closing byte, n *int) bool {
	if d.err != nil {
		return false
	}
	d.ws()
	if d.i >= len(d.b) {
		d.fail("unexpected end of data")
		return false
	}
	switch c := d.b[d.i]; {
	case c == closing:
		d.i++
		return false
	case *n > 0 && c != ',':
		d.fail("expected a comma or the end of an object or array")
		return false
	case *n > 0:
		d.i++
	}
	*n++
	return true
}

// objectKey reads a key and its colon; a key with escapes is decoded into
// d.key.
func (d *decoder) objectKey() []byte {
	if !d.peek('"') {
		d.fail("expected a string key")
		return nil
	}
	lo, hi, plain := d.scanString()
	if d.err != nil {
		return nil
	}
	key := d.b[lo:hi]
	if !plain && d.needsDecode(key) {
		d.key = d.unescape(d.key[:0], key)
		key = d.key
	}
	d.ws()
	if d.i >= len(d.b) || d.b[d.i] != ':' {
		d.fail("expected a colon after an object key")
		return nil
	}
	d.i++
	d.ws()
	return key
}

// skipValue skips one value, checking it.
func (d *decoder) skipValue() {
	d.ws()
	if d.err != nil {
		return
	}
	if d.i >= len(d.b) {
		d.fail("unexpected end of data")
		return
	}
	switch c := d.b[d.i]; {
	case c == '{':
		d.i++
		if !d.enter() {
			return
		}
		for n := 0; d.more('}', &n); {
			d.objectKey()
			d.skipValue()
		}
		d.depth--
	case c == '[':
		d.i++
		if !d.enter() {
			return
		}
		for n := 0; d.more(']', &n); {
			d.skipValue()
		}
		d.depth--
	case c == '"':
		d.scanString()
	case c == 't':
		d.literal("true")
	case c == 'f':
		d.literal("false")
	case c == 'n':
		d.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		d.number()
	default:
		d.fail("invalid character")
	}
}

func (d *decoder) literal(s string) {
	if len(d.b)-d.i < len(s) || string(d.b[d.i:d.i+len(s)]) != s {
		d.fail("invalid literal")
		return
	}
	d.i += len(s)
}

// plainByte marks the bytes a string holds as themselves: printable ASCII
// but the quote and the backslash.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// scanString checks the string at d.i and returns the bounds of its
// contents, leaving d.i after its closing quote; plain reports that the
// contents are printable ASCII without escapes, their own decoding.
func (d *decoder) scanString() (lo, hi int, plain bool) {
	b := d.b
	i := d.i + 1
	lo = i
	plain = true
	for {
		for i < len(b) && plainByte[b[i]] {
			i++
		}
		if i >= len(b) {
			d.i = i
			d.fail("unterminated string")
			return lo, lo, false
		}
		switch c := b[i]; {
		case c == '"':
			d.i = i + 1
			return lo, i, plain
		case c == '\\':
			plain = false
			if i+1 >= len(b) {
				d.i = i
				d.fail("unterminated string")
				return lo, lo, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex4(b[i+2:i+6]) {
					d.i = i
					d.fail("invalid \\u escape")
					return lo, lo, false
				}
				i += 6
			default:
				d.i = i
				d.fail("invalid escape")
				return lo, lo, false
			}
		case c < 0x20:
			d.i = i
			d.fail("control character in string")
			return lo, lo, false
		default: // a byte of a UTF-8 sequence, or not
			plain = false
			i++
		}
	}
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// needsDecode reports whether a checked string's contents differ from
// their decoded form: escapes, or bytes that are not valid UTF-8.
func (d *decoder) needsDecode(raw []byte) bool {
	// An escape anywhere, or invalid UTF-8 anywhere (a valid non-ASCII
	// prefix does not settle it: an escape may follow).
	return bytes.IndexByte(raw, '\\') >= 0 || !utf8.Valid(raw)
}

// unescape appends the decoded contents of a checked string to dst, as
// encoding/json decodes them: invalid UTF-8 and unpaired surrogates become
// U+FFFD.
func (d *decoder) unescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '\\':
			switch raw[i+1] {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				r := hex4(raw[i+2 : i+6])
				i += 6
				if utf16.IsSurrogate(r) {
					r2 := rune(-1)
					if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
						r2 = hex4(raw[i+2 : i+6])
					}
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						i += 6
						r = dec
					} else {
						r = utf8.RuneError
					}
				}
				dst = utf8.AppendRune(dst, r)
				continue
			default: // '"', '\\', '/'
				dst = append(dst, raw[i+1])
			}
			i += 2
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				dst = utf8.AppendRune(dst, utf8.RuneError)
			} else {
				dst = append(dst, raw[i:i+size]...)
			}
			i += size
		}
	}
	return dst
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c >= 'a':
			c = c - 'a' + 10
		case c >= 'A':
			c = c - 'A' + 10
		default:
			c -= '0'
		}
		r = r<<4 | rune(c)
	}
	return r
}

// finishReasons are the values interned, so a chunk's finish reason costs
// no allocation.
var finishReasons = []string{"stop", "length", "abort", "error", "tool_calls", "content_filter", "function_call", "cache_threshold", "repetition"}

func intern(b []byte) string {
	for _, s := range finishReasons {
		if string(b) == s {
			return s
		}
	}
	return string(b)
}
