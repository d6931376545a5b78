package chat

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

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
	simple := true
	for p.i < len(p.data) {
		c := p.data[p.i]
		switch {
		case c == '"':
			raw := p.data[start:p.i]
			p.i++
			if simple && utf8.Valid(raw) {
				return string(raw), nil
			}
			return unquote(raw)
		case c == '\\':
			simple = false
			p.i += 2
		case c < 0x20:
			return "", p.errorf("control character in a string")
		default:
			p.i++
		}
	}
	return "", p.errorf("unterminated string")
}

// unquote decodes the inside of a JSON string with escapes or invalid
// UTF-8.
func unquote(raw []byte) (string, error) {
	b := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			if c < utf8.RuneSelf {
				b = append(b, c)
				i++
				continue
			}
			r, size := utf8.DecodeRune(raw[i:])
			b = utf8.AppendRune(b, r) // invalid bytes become U+FFFD
			i += size
			continue
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
	return string(b), nil
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

// copyDict returns a shallow copy of an object value.
func copyDict(d *jinja.Dict) jinja.Value {
	out := jinja.NewDict()
	od := out.AsDict()
	for _, k := range d.Keys {
		od.Set(k, d.Data[k])
	}
	return out
}
