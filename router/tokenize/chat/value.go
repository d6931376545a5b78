package chat

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/ardanlabs/jinja"
)

// maxDepth bounds JSON nesting so that a hostile body cannot exhaust the
// stack; Python's json module stops near 1,000 levels too.
const maxDepth = 512

// decodeJSON decodes one JSON value into a template value, keeping object
// keys in document order (a Go map would sort them, and tojson of a tool
// schema must keep the request's key order). Numbers without a fraction or
// exponent become integers, as Python's json.loads makes them; a repeated key
// keeps its first position and its last value, as a Python dict does.
// Invalid UTF-8 and lone surrogates become U+FFFD, as encoding/json does.
func decodeJSON(data []byte) (jinja.Value, error) {
	p := jsonParser{data: data}
	p.space()
	v, err := p.value(0)
	if err != nil {
		return jinja.Undefined(), err
	}
	p.space()
	if p.i != len(p.data) {
		return jinja.Undefined(), p.errorf("unexpected data after the JSON value")
	}
	return v, nil
}

// jsonParser is a small strict JSON parser; encoding/json's token API
// allocates per token and was most of Render's time.
type jsonParser struct {
	data []byte
	i    int
	// immutable says data is never written again, so that strings may
	// share its memory instead of copying it.
	immutable bool
}

func (p *jsonParser) errorf(format string, args ...any) error {
	return fmt.Errorf("JSON offset %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *jsonParser) space() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (jinja.Value, error) {
	if depth > maxDepth {
		return jinja.Undefined(), p.errorf("nested deeper than %d levels", maxDepth)
	}
	if p.i >= len(p.data) {
		return jinja.Undefined(), p.errorf("unexpected end of JSON")
	}
	switch c := p.data[p.i]; {
	case c == '{':
		p.i++
		d := jinja.NewDict()
		dict := d.AsDict()
		p.space()
		if p.i < len(p.data) && p.data[p.i] == '}' {
			p.i++
			return d, nil
		}
		for {
			p.space()
			if p.i >= len(p.data) || p.data[p.i] != '"' {
				return jinja.Undefined(), p.errorf("expected a string key")
			}
			key, err := p.str()
			if err != nil {
				return jinja.Undefined(), err
			}
			p.space()
			if p.i >= len(p.data) || p.data[p.i] != ':' {
				return jinja.Undefined(), p.errorf("expected ':' after an object key")
			}
			p.i++
			p.space()
			v, err := p.value(depth + 1)
			if err != nil {
				return jinja.Undefined(), err
			}
			dict.Set(key, v)
			p.space()
			if p.i < len(p.data) && p.data[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.data) && p.data[p.i] == '}' {
				p.i++
				return d, nil
			}
			return jinja.Undefined(), p.errorf("expected ',' or '}' in an object")
		}
	case c == '[':
		p.i++
		items := []jinja.Value{}
		p.space()
		if p.i < len(p.data) && p.data[p.i] == ']' {
			p.i++
			return jinja.NewList(items), nil
		}
		for {
			p.space()
			v, err := p.value(depth + 1)
			if err != nil {
				return jinja.Undefined(), err
			}
			items = append(items, v)
			p.space()
			if p.i < len(p.data) && p.data[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.data) && p.data[p.i] == ']' {
				p.i++
				return jinja.NewList(items), nil
			}
			return jinja.Undefined(), p.errorf("expected ',' or ']' in an array")
		}
	case c == '"':
		s, err := p.str()
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewString(s), nil
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case bytes.HasPrefix(p.data[p.i:], []byte("true")):
		p.i += 4
		return jinja.NewBool(true), nil
	case bytes.HasPrefix(p.data[p.i:], []byte("false")):
		p.i += 5
		return jinja.NewBool(false), nil
	case bytes.HasPrefix(p.data[p.i:], []byte("null")):
		p.i += 4
		return jinja.None(), nil
	}
	return jinja.Undefined(), p.errorf("unexpected character %q", p.data[p.i])
}

func (p *jsonParser) number() (jinja.Value, error) {
	start := p.i
	digits := func() int {
		n := 0
		for p.i < len(p.data) && p.data[p.i] >= '0' && p.data[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.data[p.i] == '-' {
		p.i++
	}
	intStart := p.i
	if digits() == 0 || p.data[intStart] == '0' && p.i-intStart > 1 {
		return jinja.Undefined(), p.errorf("invalid number")
	}
	if p.i < len(p.data) && p.data[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return jinja.Undefined(), p.errorf("invalid number: digits must follow '.'")
		}
	}
	if p.i < len(p.data) && (p.data[p.i] == 'e' || p.data[p.i] == 'E') {
		p.i++
		if p.i < len(p.data) && (p.data[p.i] == '+' || p.data[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return jinja.Undefined(), p.errorf("invalid number: digits must follow the exponent")
		}
	}
	return numberValue(string(p.data[start:p.i])), nil
}

// str reads a JSON string starting at the opening quote.
func (p *jsonParser) str() (string, error) {
	p.i++ // opening quote
	start := p.i
	escaped, ascii := false, true
	for {
		if p.i < len(p.data) {
			n, a := plainLen(p.data[p.i:])
			p.i += n
			ascii = ascii && a
		}
		if p.i >= len(p.data) {
			return "", p.errorf("unterminated string")
		}
		switch c := p.data[p.i]; {
		case c == '"':
			raw := p.data[start:p.i]
			p.i++
			valid := ascii || validUTF8(raw)
			if escaped || !valid {
				return unquote(raw, valid)
			}
			if p.immutable {
				return unsafe.String(unsafe.SliceData(raw), len(raw)), nil
			}
			return string(raw), nil
		case c == '\\':
			escaped = true
			p.i += 2
		default: // c < 0x20
			return "", p.errorf("control character in a string")
		}
	}
}

// plainLen returns how many leading bytes of b need no attention inside a
// JSON string: anything but '"', '\\' and control characters. ascii says
// those bytes are all below 0x80 (else the caller checks them as UTF-8).
// It looks at eight bytes at a time.
func plainLen(b []byte) (n int, ascii bool) {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	var high uint64
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		q := x ^ ('"' * ones)
		bs := x ^ ('\\' * ones)
		// Each term is non-zero exactly when some byte is a quote, a
		// backslash, or below 0x20 (bytes of 0x80 and above never count).
		if ((q-ones)&^q|(bs-ones)&^bs|(x-0x20*ones)&^x)&highs != 0 {
			break
		}
		high |= x
	}
	for ; i < len(b); i++ {
		c := b[i]
		if c == '"' || c == '\\' || c < 0x20 {
			break
		}
		high |= uint64(c)
	}
	return i, high&highs == 0
}

// validUTF8 is utf8.Valid without a branch per rune, which text that mixes
// scripts mispredicts: a DFA (accept, expect 1, 2 or 3 continuation bytes,
// the four restricted second bytes of E0, ED, F0 and F4, error) whose
// transitions for each byte are packed into one word, six bits a state.
func validUTF8(p []byte) bool {
	const highs = 0x8080808080808080
	var st uint64 // bit offset of the state: 0 accepts
	n := len(p)
	for i := 0; i < n; {
		if st&63 == 0 {
			for i+8 <= n && binary.LittleEndian.Uint64(p[i:])&highs == 0 {
				i += 8
			}
		}
		for end := min(i+16, n); i < end; i++ {
			st = utf8DFA[p[i]] >> (st & 63)
		}
		if st&63 == dfaError*6 {
			return false
		}
	}
	return st&63 == 0
}

// The DFA's states.
const (
	dfaAccept = iota
	dfaCont1  // one continuation byte to go
	dfaCont2
	dfaCont3
	dfaE0 // after E0: A0-BF, then one more
	dfaED // after ED: 80-9F (no surrogates), then one more
	dfaF0 // after F0: 90-BF, then two more
	dfaF4 // after F4: 80-8F (nothing above U+10FFFF), then two more
	dfaError
)

// utf8DFA[b] holds, at bit 6*s, 6 times the state that byte b leads to
// from state s.
var utf8DFA = func() (t [256]uint64) {
	for b := range 256 {
		next := func(s int) int {
			cont := b >= 0x80 && b <= 0xBF
			switch s {
			case dfaAccept:
				switch {
				case b < 0x80:
					return dfaAccept
				case b >= 0xC2 && b <= 0xDF:
					return dfaCont1
				case b == 0xE0:
					return dfaE0
				case b == 0xED:
					return dfaED
				case b >= 0xE1 && b <= 0xEF:
					return dfaCont2
				case b == 0xF0:
					return dfaF0
				case b >= 0xF1 && b <= 0xF3:
					return dfaCont3
				case b == 0xF4:
					return dfaF4
				}
			case dfaCont1, dfaCont2, dfaCont3:
				if cont {
					return s - 1
				}
			case dfaE0:
				if b >= 0xA0 && b <= 0xBF {
					return dfaCont1
				}
			case dfaED:
				if b >= 0x80 && b <= 0x9F {
					return dfaCont1
				}
			case dfaF0:
				if b >= 0x90 && b <= 0xBF {
					return dfaCont2
				}
			case dfaF4:
				if b >= 0x80 && b <= 0x8F {
					return dfaCont2
				}
			}
			return dfaError
		}
		for s := dfaAccept; s <= dfaError; s++ {
			t[b] |= uint64(6*next(s)) << (6 * s)
		}
	}
	return t
}()

// unquote decodes the inside of a JSON string with escapes or invalid
// UTF-8; valid says raw is valid UTF-8.
func unquote(raw []byte, valid bool) (string, error) {
	b := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		n := bytes.IndexByte(raw[i:], '\\')
		if n < 0 {
			n = len(raw) - i
		}
		if valid {
			b = append(b, raw[i:i+n]...)
		} else {
			b = appendUTF8(b, raw[i:i+n])
		}
		if i += n; i >= len(raw) {
			break
		}
		if i+1 >= len(raw) {
			return "", errors.New("invalid escape at the end of a string")
		}
		i += 2
		switch raw[i-1] {
		case '"', '\\', '/':
			b = append(b, raw[i-1])
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, ok := hex4(raw, i)
			if !ok {
				return "", errors.New("invalid \\u escape in a string")
			}
			i += 4
			if utf16.IsSurrogate(r) {
				r2, ok2 := rune(0), false
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					r2, ok2 = hex4(raw, i+2)
				}
				if dec := utf16.DecodeRune(r, r2); ok2 && dec != utf8.RuneError {
					r = dec
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			b = utf8.AppendRune(b, r)
		default:
			return "", fmt.Errorf("invalid escape \\%c in a string", raw[i-1])
		}
	}
	// b is not written again: the string may share its memory.
	return unsafe.String(unsafe.SliceData(b), len(b)), nil
}

// appendUTF8 appends s to b with each invalid UTF-8 byte replaced by
// U+FFFD, as encoding/json does.
func appendUTF8(b, s []byte) []byte {
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			b = append(b, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		b = utf8.AppendRune(b, r) // invalid bytes become U+FFFD
		i += size
	}
	return b
}

func hex4(raw []byte, i int) (rune, bool) {
	if i+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// numberValue maps a JSON number the way Python's json.loads does: an
// integer literal is an int, anything with a fraction or exponent a float.
// Integers beyond int64 fall back to float (Python would keep them exact).
func numberValue(s string) jinja.Value {
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return jinja.NewInt(i)
		}
	}
	// Out-of-range values parse to ±Inf, as in Python.
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return jinja.NewString(s)
	}
	return jinja.NewFloat(f)
}

// kindName names a template value's JSON type for error messages.
func kindName(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return "missing"
	case v.IsNone():
		return "null"
	case v.IsBool():
		return "a boolean"
	case v.IsNumber():
		return "a number"
	case v.IsString():
		return "a string"
	case v.IsList():
		return "an array"
	case v.IsDict():
		return "an object"
	}
	return "a function"
}

// get returns d[key] or Undefined when d is not an object or lacks key.
func get(d jinja.Value, key string) jinja.Value {
	if !d.IsDict() {
		return jinja.Undefined()
	}
	v, ok := d.AsDict().Get(key)
	if !ok {
		return jinja.Undefined()
	}
	return v
}

// cloneValue returns a deep copy of v's lists and dicts (strings and other
// scalars are immutable and shared).
func cloneValue(v jinja.Value) jinja.Value {
	switch {
	case v.IsList():
		items := v.AsList().Items
		out := make([]jinja.Value, len(items))
		for i, it := range items {
			out[i] = cloneValue(it)
		}
		return jinja.NewList(out)
	case v.IsDict():
		d := v.AsDict()
		out := jinja.NewDict()
		od := out.AsDict()
		od.Keys = slices.Clone(d.Keys)
		od.Data = make(map[string]jinja.Value, len(d.Data))
		for k, x := range d.Data {
			od.Data[k] = cloneValue(x)
		}
		return out
	}
	return v
}

// copyDict returns a shallow copy of an object value.
func copyDict(d *jinja.Dict) jinja.Value {
	out := jinja.NewDict()
	od := out.AsDict()
	for _, k := range d.Keys {
		od.Set(k, d.Data[k])
	}
	return out
}
