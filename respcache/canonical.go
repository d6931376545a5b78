package respcache

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Errors of the canonicaliser. A body that fails with any of them is never
// cached (bypass reason invalid_body): the engine would reject most of them,
// and the rest (a duplicate key, a lone surrogate) have no one meaning.
var (
	// ErrSyntax: the body is not JSON.
	ErrSyntax = errors.New("respcache: invalid json")
	// ErrDuplicateKey: an object names one key twice.
	ErrDuplicateKey = errors.New("respcache: duplicate object key")
	// ErrInvalidUTF8: a string holds bytes that are not UTF-8, or a
	// \u escape of a lone surrogate.
	ErrInvalidUTF8 = errors.New("respcache: invalid utf-8 in a string")
	// ErrTooDeep: arrays and objects nest deeper than MaxDepth.
	ErrTooDeep = errors.New("respcache: json nested too deep")
	// ErrNumberRange: a number's exponent is beyond ±10^15.
	ErrNumberRange = errors.New("respcache: number exponent out of range")
	// ErrTooBig: the body is 2 GiB or more.
	ErrTooBig = errors.New("respcache: json too big")
)

// MaxDepth bounds the nesting of arrays and objects the canonicaliser
// reads; a request's tools schemas stay far below it.
const MaxDepth = 512

// maxExponent bounds a number's decimal exponent (after normalisation).
const maxExponent = 1_000_000_000_000_000

// Canonical appends the canonical JSON of body to dst:
//
//   - object members sorted by key (byte order of their canonical
//     encoding), without whitespace anywhere;
//   - strings decoded and written again with the fewest escapes: \" \\
//     and the control characters (\b \f \n \r \t, else \u00xx), every
//     other character as its UTF-8 bytes;
//   - numbers written exactly, as their significant digits and a decimal
//     exponent: [-]DIGITSeEXP, with neither leading nor trailing zeros in
//     DIGITS, so 1, 1.0, 1e0 and 10e-1 are all 1e0, 0.5 is 5e-1, 100 is 1e2
//     and -0 is 0. No number passes through a float: 2^64+1 and 2^64 stay
//     apart.
//
// Two bodies have the same canonical JSON exactly when they are the same
// JSON value. Bodies with a duplicate key, invalid UTF-8, a lone surrogate
// escape, nesting beyond MaxDepth or an exponent beyond ±10^15 are errors.
func Canonical(dst, body []byte) ([]byte, error) {
	var c canonicalizer
	root, err := c.parse(body)
	if err != nil {
		return dst, err
	}
	c.out = dst
	if err := c.emit(root, 0); err != nil {
		return dst, err
	}
	return c.out, nil
}

// Kinds of node.
const (
	nodeScalar uint8 = iota
	nodeArray
	nodeObject
)

// node is one JSON value of a parsed body. A scalar's canonical text is
// arena[lo:hi]; an object member's key (a canonical string, quotes
// included) is arena[klo:khi]. Children of arrays and objects are linked
// through first and next (-1 ends).
type node struct {
	kind        uint8
	lo, hi      int32
	klo, khi    int32
	first, last int32
	next        int32
}

// canonicalizer parses a body into nodes, writing the canonical text of
// its scalars and keys into one arena, then emits the canonical JSON by
// walking the nodes (objects sorted): each byte is copied twice at most,
// whatever the nesting. Its slices are reused from one body to the next.
type canonicalizer struct {
	in    []byte
	pos   int
	arena []byte
	nodes []node
	stack []int32 // members of the objects being emitted, sorted
	digit []byte  // a number's significant digits
	out   []byte
}

func (c *canonicalizer) reset(in []byte) {
	c.in, c.pos = in, 0
	c.arena, c.nodes, c.stack, c.out = c.arena[:0], c.nodes[:0], c.stack[:0], c.out[:0]
}

func (c *canonicalizer) syntax(what string) error {
	return fmt.Errorf("%w: %s at offset %d", ErrSyntax, what, c.pos)
}

// parse reads in into nodes and returns the root's index.
func (c *canonicalizer) parse(in []byte) (int32, error) {
	c.reset(in)
	if len(in) >= math.MaxInt32 {
		return 0, ErrTooBig
	}
	root, err := c.value(0)
	if err != nil {
		return 0, err
	}
	c.ws()
	if c.pos != len(c.in) {
		return 0, c.syntax("data after the value")
	}
	return root, nil
}

func (c *canonicalizer) ws() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *canonicalizer) newNode(kind uint8) int32 {
	c.nodes = append(c.nodes, node{kind: kind, first: -1, last: -1, next: -1})
	return int32(len(c.nodes) - 1)
}

// link appends child to parent's children.
func (c *canonicalizer) link(parent, child int32) {
	p := &c.nodes[parent]
	if p.first < 0 {
		p.first = child
	} else {
		c.nodes[p.last].next = child
	}
	p.last = child
}

func (c *canonicalizer) value(depth int) (int32, error) {
	c.ws()
	if c.pos >= len(c.in) {
		return 0, c.syntax("unexpected end")
	}
	switch ch := c.in[c.pos]; {
	case ch == '{':
		return c.object(depth + 1)
	case ch == '[':
		return c.array(depth + 1)
	case ch == '"':
		n := c.newNode(nodeScalar)
		lo := len(c.arena)
		if err := c.str(); err != nil {
			return 0, err
		}
		c.nodes[n].lo, c.nodes[n].hi = int32(lo), int32(len(c.arena))
		return n, nil
	case ch == 't':
		return c.literal("true")
	case ch == 'f':
		return c.literal("false")
	case ch == 'n':
		return c.literal("null")
	case ch == '-' || ch >= '0' && ch <= '9':
		n := c.newNode(nodeScalar)
		lo := len(c.arena)
		if err := c.number(); err != nil {
			return 0, err
		}
		c.nodes[n].lo, c.nodes[n].hi = int32(lo), int32(len(c.arena))
		return n, nil
	}
	return 0, c.syntax("unexpected character")
}

func (c *canonicalizer) literal(lit string) (int32, error) {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(lit)) {
		return 0, c.syntax("invalid literal")
	}
	c.pos += len(lit)
	n := c.newNode(nodeScalar)
	lo := len(c.arena)
	c.arena = append(c.arena, lit...)
	c.nodes[n].lo, c.nodes[n].hi = int32(lo), int32(len(c.arena))
	return n, nil
}

func (c *canonicalizer) array(depth int) (int32, error) {
	if depth > MaxDepth {
		return 0, ErrTooDeep
	}
	c.pos++ // [
	n := c.newNode(nodeArray)
	c.ws()
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		return n, nil
	}
	for {
		v, err := c.value(depth)
		if err != nil {
			return 0, err
		}
		c.link(n, v)
		c.ws()
		if c.pos >= len(c.in) {
			return 0, c.syntax("unexpected end in an array")
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
		case ']':
			c.pos++
			return n, nil
		default:
			return 0, c.syntax("want , or ] in an array")
		}
	}
}

func (c *canonicalizer) object(depth int) (int32, error) {
	if depth > MaxDepth {
		return 0, ErrTooDeep
	}
	c.pos++ // {
	n := c.newNode(nodeObject)
	c.ws()
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		return n, nil
	}
	for {
		c.ws()
		if c.pos >= len(c.in) || c.in[c.pos] != '"' {
			return 0, c.syntax("want a key in an object")
		}
		klo := len(c.arena)
		if err := c.str(); err != nil {
			return 0, err
		}
		khi := len(c.arena)
		c.ws()
		if c.pos >= len(c.in) || c.in[c.pos] != ':' {
			return 0, c.syntax("want : after a key")
		}
		c.pos++
		v, err := c.value(depth)
		if err != nil {
			return 0, err
		}
		c.nodes[v].klo, c.nodes[v].khi = int32(klo), int32(khi)
		c.link(n, v)
		c.ws()
		if c.pos >= len(c.in) {
			return 0, c.syntax("unexpected end in an object")
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
		case '}':
			c.pos++
			return n, nil
		default:
			return 0, c.syntax("want , or } in an object")
		}
	}
}

const hexDigits = "0123456789abcdef"

// plain marks the bytes a string holds as they are: not a control
// character, a quote, a backslash or part of a multi-byte sequence. It is
// never written after its initialisation.
var plain = func() (t [256]bool) {
	for b := 0x20; b < 0x80; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// str reads the string at c.pos (its opening quote) and appends its
// canonical encoding, quotes included, to the arena.
func (c *canonicalizer) str() error {
	c.pos++ // "
	c.arena = append(c.arena, '"')
	in := c.in
	for {
		// The run of bytes that need no work.
		start := c.pos
		for c.pos < len(in) && plain[in[c.pos]] {
			c.pos++
		}
		c.arena = append(c.arena, in[start:c.pos]...)
		if c.pos >= len(in) {
			return c.syntax("unterminated string")
		}
		switch b := in[c.pos]; {
		case b == '"':
			c.pos++
			c.arena = append(c.arena, '"')
			return nil
		case b < 0x20:
			return c.syntax("control character in a string")
		case b >= 0x80:
			r, size := utf8.DecodeRune(in[c.pos:])
			if r == utf8.RuneError && size <= 1 {
				return ErrInvalidUTF8
			}
			c.arena = append(c.arena, in[c.pos:c.pos+size]...)
			c.pos += size
		default: // backslash
			if c.pos+1 >= len(in) {
				return c.syntax("unterminated escape")
			}
			e := in[c.pos+1]
			c.pos += 2
			switch e {
			case '"', '\\', '/':
				c.appendRune(rune(e))
			case 'b':
				c.appendRune('\b')
			case 'f':
				c.appendRune('\f')
			case 'n':
				c.appendRune('\n')
			case 'r':
				c.appendRune('\r')
			case 't':
				c.appendRune('\t')
			case 'u':
				r, ok := c.hex4()
				if !ok {
					return c.syntax("invalid \\u escape")
				}
				if r >= 0xd800 && r < 0xdc00 {
					// A high surrogate wants its low one next.
					if c.pos+1 < len(in) && in[c.pos] == '\\' && in[c.pos+1] == 'u' {
						c.pos += 2
						lo, ok := c.hex4()
						if !ok {
							return c.syntax("invalid \\u escape")
						}
						if lo < 0xdc00 || lo >= 0xe000 {
							return ErrInvalidUTF8
						}
						r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
					} else {
						return ErrInvalidUTF8
					}
				} else if r >= 0xdc00 && r < 0xe000 {
					return ErrInvalidUTF8
				}
				c.appendRune(r)
			default:
				return c.syntax("invalid escape")
			}
		}
	}
}

func (c *canonicalizer) hex4() (rune, bool) {
	if c.pos+4 > len(c.in) {
		return 0, false
	}
	var r rune
	for _, b := range c.in[c.pos : c.pos+4] {
		var v byte
		switch {
		case b >= '0' && b <= '9':
			v = b - '0'
		case b >= 'a' && b <= 'f':
			v = b - 'a' + 10
		case b >= 'A' && b <= 'F':
			v = b - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	c.pos += 4
	return r, true
}

// appendRune writes r as canonical string content.
func (c *canonicalizer) appendRune(r rune) {
	switch {
	case r == '"':
		c.arena = append(c.arena, '\\', '"')
	case r == '\\':
		c.arena = append(c.arena, '\\', '\\')
	case r == '\b':
		c.arena = append(c.arena, '\\', 'b')
	case r == '\f':
		c.arena = append(c.arena, '\\', 'f')
	case r == '\n':
		c.arena = append(c.arena, '\\', 'n')
	case r == '\r':
		c.arena = append(c.arena, '\\', 'r')
	case r == '\t':
		c.arena = append(c.arena, '\\', 't')
	case r < 0x20:
		c.arena = append(c.arena, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
	default:
		c.arena = utf8.AppendRune(c.arena, r)
	}
}

// number reads the number at c.pos and appends its canonical form.
func (c *canonicalizer) number() error {
	in := c.in
	neg := false
	if in[c.pos] == '-' {
		neg = true
		c.pos++
	}
	if c.pos >= len(in) {
		return c.syntax("want a digit")
	}
	intStart := c.pos
	switch b := in[c.pos]; {
	case b == '0':
		c.pos++
	case b >= '1' && b <= '9':
		for c.pos < len(in) && in[c.pos] >= '0' && in[c.pos] <= '9' {
			c.pos++
		}
	default:
		return c.syntax("want a digit")
	}
	intPart := in[intStart:c.pos]
	var frac []byte
	if c.pos < len(in) && in[c.pos] == '.' {
		c.pos++
		fs := c.pos
		for c.pos < len(in) && in[c.pos] >= '0' && in[c.pos] <= '9' {
			c.pos++
		}
		if c.pos == fs {
			return c.syntax("want a digit after the decimal point")
		}
		frac = in[fs:c.pos]
	}
	var exp int64
	if c.pos < len(in) && (in[c.pos] == 'e' || in[c.pos] == 'E') {
		c.pos++
		eneg := false
		if c.pos < len(in) && (in[c.pos] == '+' || in[c.pos] == '-') {
			eneg = in[c.pos] == '-'
			c.pos++
		}
		es := c.pos
		for c.pos < len(in) && in[c.pos] >= '0' && in[c.pos] <= '9' {
			if exp <= maxExponent {
				exp = exp*10 + int64(in[c.pos]-'0')
			}
			c.pos++
		}
		if c.pos == es {
			return c.syntax("want a digit in the exponent")
		}
		if exp > maxExponent {
			return ErrNumberRange
		}
		if eneg {
			exp = -exp
		}
	}
	// The significant digits, without leading or trailing zeros.
	d := append(append(c.digit[:0], intPart...), frac...)
	c.digit = d
	exp -= int64(len(frac))
	i := 0
	for i < len(d) && d[i] == '0' {
		i++
	}
	d = d[i:]
	if len(d) == 0 {
		c.arena = append(c.arena, '0')
		return nil
	}
	j := len(d)
	for d[j-1] == '0' {
		j--
	}
	exp += int64(len(d) - j)
	d = d[:j]
	if exp > maxExponent || exp < -maxExponent {
		return ErrNumberRange
	}
	if neg {
		c.arena = append(c.arena, '-')
	}
	c.arena = append(c.arena, d...)
	c.arena = append(c.arena, 'e')
	c.arena = strconv.AppendInt(c.arena, exp, 10)
	return nil
}

// emit appends node n's canonical JSON to c.out.
func (c *canonicalizer) emit(n int32, depth int) error {
	nd := &c.nodes[n]
	switch nd.kind {
	case nodeScalar:
		c.out = append(c.out, c.arena[nd.lo:nd.hi]...)
	case nodeArray:
		c.out = append(c.out, '[')
		for ch := nd.first; ch >= 0; ch = c.nodes[ch].next {
			if ch != nd.first {
				c.out = append(c.out, ',')
			}
			if err := c.emit(ch, depth+1); err != nil {
				return err
			}
		}
		c.out = append(c.out, ']')
	case nodeObject:
		return c.emitObject(n, depth, nil)
	}
	return nil
}

// emitObject appends object n's canonical JSON, leaving out the members
// whose key skip reports.
func (c *canonicalizer) emitObject(n int32, depth int, skip func(key []byte) bool) error {
	base := len(c.stack)
	for ch := c.nodes[n].first; ch >= 0; ch = c.nodes[ch].next {
		c.stack = append(c.stack, ch)
	}
	top := len(c.stack)
	members := c.stack[base:top]
	c.sortMembers(members)
	c.out = append(c.out, '{')
	wrote := false
	for i := base; i < top; i++ {
		ch := c.stack[i]
		key := c.key(ch)
		if i > base && bytes.Equal(key, c.key(c.stack[i-1])) {
			return ErrDuplicateKey
		}
		if skip != nil && skip(key) {
			continue
		}
		if wrote {
			c.out = append(c.out, ',')
		}
		wrote = true
		c.out = append(c.out, key...)
		c.out = append(c.out, ':')
		if err := c.emit(ch, depth+1); err != nil {
			return err
		}
	}
	c.out = append(c.out, '}')
	c.stack = c.stack[:base]
	return nil
}

func (c *canonicalizer) key(n int32) []byte {
	nd := &c.nodes[n]
	return c.arena[nd.klo:nd.khi]
}

// sortMembers sorts members by key: insertion sort for the few members
// most objects have, else the standard library's.
func (c *canonicalizer) sortMembers(m []int32) {
	if len(m) <= 12 {
		for i := 1; i < len(m); i++ {
			for j := i; j > 0 && bytes.Compare(c.key(m[j-1]), c.key(m[j])) > 0; j-- {
				m[j-1], m[j] = m[j], m[j-1]
			}
		}
		return
	}
	slices.SortFunc(m, func(a, b int32) int { return bytes.Compare(c.key(a), c.key(b)) })
}
