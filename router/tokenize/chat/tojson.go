package chat

import (
	"errors"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// filterToJSON is transformers' tojson: Python's json.dumps with
// ensure_ascii=False by default, and the indent, separators, sort_keys and
// ensure_ascii keyword arguments. It replaces the library's filter, which
// prints 1000.0 as 1000 where Python prints 1000.0.
func filterToJSON(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson: missing value")
	}
	e := jsonEncoder{itemSep: ", ", keySep: ": "}
	// Positional arguments follow json.dumps's order after the value:
	// ensure_ascii, indent, separators, sort_keys.
	opt := func(pos int, name string) (jinja.Value, bool) {
		if v, ok := kwargs[name]; ok {
			return v, true
		}
		if pos < len(args) {
			return args[pos], true
		}
		return jinja.Undefined(), false
	}
	if v, ok := opt(1, "ensure_ascii"); ok {
		e.ascii = v.IsTruthy()
	}
	if v, ok := opt(2, "indent"); ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsInt():
			e.indent = strings.Repeat(" ", max(0, int(v.AsInt())))
		case v.IsString():
			e.indent = v.AsString()
		default:
			return jinja.Undefined(), errors.New("tojson: indent must be an integer or a string")
		}
		e.indented = true
		e.itemSep = ","
	}
	if v, ok := opt(3, "separators"); ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Get(0).IsString() || !v.AsList().Get(1).IsString() {
			return jinja.Undefined(), errors.New("tojson: separators must be a pair of strings")
		}
		e.itemSep = v.AsList().Get(0).AsString()
		e.keySep = v.AsList().Get(1).AsString()
	}
	if v, ok := opt(4, "sort_keys"); ok {
		e.sortKeys = v.IsTruthy()
	}
	var sb strings.Builder
	if err := e.encode(&sb, args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(sb.String()), nil
}

type jsonEncoder struct {
	itemSep, keySep string
	indent          string
	indented        bool
	ascii           bool
	sortKeys        bool
}

func (e *jsonEncoder) newline(sb *strings.Builder, level int) {
	if !e.indented {
		return
	}
	sb.WriteByte('\n')
	for range level {
		sb.WriteString(e.indent)
	}
}

func (e *jsonEncoder) encode(sb *strings.Builder, v jinja.Value, level int) error {
	if level > maxDepth {
		return errors.New("tojson: value nested too deeply")
	}
	switch {
	case v.IsNone(), v.IsUndefined():
		sb.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case v.IsInt():
		sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		sb.WriteString(pyFloatRepr(v.AsFloat()))
	case v.IsString():
		writePyJSONString(sb, v.AsString(), e.ascii)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				sb.WriteString(e.itemSep)
			}
			e.newline(sb, level+1)
			if err := e.encode(sb, it, level+1); err != nil {
				return err
			}
		}
		e.newline(sb, level)
		sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			sb.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if e.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(e.itemSep)
			}
			e.newline(sb, level+1)
			writePyJSONString(sb, k, e.ascii)
			sb.WriteString(e.keySep)
			if err := e.encode(sb, d.Data[k], level+1); err != nil {
				return err
			}
		}
		e.newline(sb, level)
		sb.WriteByte('}')
	default:
		return errors.New("tojson: a function is not JSON serializable")
	}
	return nil
}

// pyFloatRepr formats f as Python's repr(float) does: the shortest digits
// that round-trip, in positional notation when the decimal exponent is in
// [-4, 16), with a trailing ".0" for integral values; Infinity and NaN as
// json.dumps writes them.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	neg := false
	if s[0] == '-' {
		neg = true
		s = s[1:]
	}
	mant, expStr, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expStr)
	digits := strings.Replace(mant, ".", "", 1)
	var out strings.Builder
	if neg {
		out.WriteByte('-')
	}
	if exp >= -4 && exp < 16 {
		if exp < 0 {
			out.WriteString("0.")
			out.WriteString(strings.Repeat("0", -exp-1))
			out.WriteString(digits)
		} else if len(digits) <= exp+1 {
			out.WriteString(digits)
			out.WriteString(strings.Repeat("0", exp+1-len(digits)))
			out.WriteString(".0")
		} else {
			out.WriteString(digits[:exp+1])
			out.WriteByte('.')
			out.WriteString(digits[exp+1:])
		}
		return out.String()
	}
	out.WriteString(digits[:1])
	if len(digits) > 1 {
		out.WriteByte('.')
		out.WriteString(digits[1:])
	}
	out.WriteByte('e')
	if exp < 0 {
		out.WriteByte('-')
		exp = -exp
	} else {
		out.WriteByte('+')
	}
	if exp < 10 {
		out.WriteByte('0')
	}
	out.WriteString(strconv.Itoa(exp))
	return out.String()
}

const hexDigits = "0123456789abcdef"

// writePyJSONString writes s quoted as json.dumps does: \" \\ \n \r \t \b
// \f, other control characters as \u00XX, and with ascii every non-ASCII
// character as \uXXXX (surrogate pairs above the BMP).
func writePyJSONString(sb *strings.Builder, s string, ascii bool) {
	sb.WriteByte('"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			if !ascii {
				i++
				continue
			}
			r, size := utf8.DecodeRuneInString(s[i:])
			sb.WriteString(s[start:i])
			if r >= 0x10000 {
				r -= 0x10000
				writeU(sb, 0xd800+(r>>10))
				writeU(sb, 0xdc00+(r&0x3ff))
			} else {
				writeU(sb, r)
			}
			i += size
			start = i
			continue
		}
		sb.WriteString(s[start:i])
		switch c {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			writeU(sb, rune(c))
		}
		i++
		start = i
	}
	sb.WriteString(s[start:])
	sb.WriteByte('"')
}

func writeU(sb *strings.Builder, r rune) {
	sb.WriteString(`\u`)
	sb.WriteByte(hexDigits[(r>>12)&0xf])
	sb.WriteByte(hexDigits[(r>>8)&0xf])
	sb.WriteByte(hexDigits[(r>>4)&0xf])
	sb.WriteByte(hexDigits[r&0xf])
}
