package respcache

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"
)

func canon(t testing.TB, s string) string {
	t.Helper()
	out, err := Canonical(nil, []byte(s))
	if err != nil {
		t.Fatalf("Canonical(%q): %v", s, err)
	}
	return string(out)
}

func TestCanonicalExamples(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2e0,"b":1e0}`},
		{" {\n\t\"a\" : [ 1 , 2 ] }\r\n", `{"a":[1e0,2e0]}`},
		{`1`, `1e0`},
		{`1.0`, `1e0`},
		{`1e0`, `1e0`},
		{`10e-1`, `1e0`},
		{`0.1E+1`, `1e0`},
		{`100`, `1e2`},
		{`0.5`, `5e-1`},
		{`-1.250`, `-125e-2`},
		{`0`, `0`},
		{`-0`, `0`},
		{`-0.0e7`, `0`},
		{`0.000`, `0`},
		{`18446744073709551617`, `18446744073709551617e0`},
		{`18446744073709551616`, `18446744073709551616e0`},
		{`1e0000000000000000000001`, `1e1`},
		{`"a\/b"`, `"a/b"`},
		{`"\u0041\u00e9"`, `"Aé"`},
		{`"Aé"`, `"Aé"`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\u001f\u0000\n\t\"\\"`, `"\u001f\u0000\n\t\"\\"`},
		{`"\u007f\u2028"`, "\"\x7f\u2028\""},
		{`{"é":1,"e":2,"z":3,"":4}`, `{"":4e0,"e":2e0,"z":3e0,"é":1e0}`},
		{`{"a":{"d":null,"c":[true,false,{}]},"b":[]}`, `{"a":{"c":[true,false,{}],"d":null},"b":[]}`},
	} {
		if got := canon(t, tc.in); got != tc.want {
			t.Errorf("Canonical(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCanonicalErrors(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want error
	}{
		{``, ErrSyntax},
		{`{`, ErrSyntax},
		{`{"a":1,}`, ErrSyntax},
		{`[1,]`, ErrSyntax},
		{`01`, ErrSyntax},
		{`1.`, ErrSyntax},
		{`.5`, ErrSyntax},
		{`1e`, ErrSyntax},
		{`+1`, ErrSyntax},
		{`"\x"`, ErrSyntax},
		{`"\u12"`, ErrSyntax},
		{"\"a\x01\"", ErrSyntax},
		{`tru`, ErrSyntax},
		{`{} {}`, ErrSyntax},
		{`{'a':1}`, ErrSyntax},
		{`NaN`, ErrSyntax},
		{`{"a":1,"a":1}`, ErrDuplicateKey},
		{`{"a":1,"\u0061":2}`, ErrDuplicateKey},
		{`[{"x":{"b":0,"b":1}}]`, ErrDuplicateKey},
		{"\"\xff\"", ErrInvalidUTF8},
		{"\"\xed\xa0\x80\"", ErrInvalidUTF8}, // a surrogate as raw UTF-8
		{`"\ud800"`, ErrInvalidUTF8},
		{`"\ud800x"`, ErrInvalidUTF8},
		{`"\ude00"`, ErrInvalidUTF8},
		{`"\ud800\u0041"`, ErrInvalidUTF8},
		{`1e1000000000000001`, ErrNumberRange},
		{strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), ErrTooDeep},
	} {
		_, err := Canonical(nil, []byte(tc.in))
		if !errors.Is(err, tc.want) {
			t.Errorf("Canonical(%.40q) error = %v, want %v", tc.in, err, tc.want)
		}
	}
	if _, err := Canonical(nil, []byte(strings.Repeat("[", MaxDepth)+strings.Repeat("]", MaxDepth))); err != nil {
		t.Errorf("nesting of exactly MaxDepth: %v", err)
	}
}

// jv is a generated JSON value: objects keep their members in order (the
// renderer shuffles them), numbers are exact decimals m·10^e.
type jv struct {
	kind    byte // n(ull) b(ool) i(number) s(tring) a(rray) o(bject)
	b       bool
	m       int64
	e       int
	s       string
	items   []jv
	keys    []string
	members []jv
}

func genString() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.StringMatching(`[a-z]{0,6}`),
		rapid.StringOf(rapid.RuneFrom([]rune{'a', '"', '\\', '/', '\n', '\t', 0x01, 0x1f, 0x7f, 'é', '€', 0x2028, '😀', 0xfffd})),
		rapid.String(),
	)
}

func genValue(depth int) *rapid.Generator[jv] {
	return rapid.Custom(func(t *rapid.T) jv {
		max := 5
		if depth <= 0 {
			max = 3
		}
		switch rapid.IntRange(0, max).Draw(t, "kind") {
		case 0:
			return jv{kind: 'n'}
		case 1:
			return jv{kind: 'b', b: rapid.Bool().Draw(t, "b")}
		case 2:
			return jv{kind: 'i', m: rapid.Int64Range(-1e12, 1e12).Draw(t, "m"), e: rapid.IntRange(-12, 12).Draw(t, "e")}
		case 3:
			return jv{kind: 's', s: genString().Draw(t, "s")}
		case 4:
			return jv{kind: 'a', items: rapid.SliceOfN(genValue(depth-1), 0, 4).Draw(t, "items")}
		default:
			keys := rapid.SliceOfNDistinct(genString(), 0, 5, rapid.ID[string]).Draw(t, "keys")
			v := jv{kind: 'o', keys: keys}
			for i := range keys {
				v.members = append(v.members, genValue(depth-1).Draw(t, "member"+strconv.Itoa(i)))
			}
			return v
		}
	})
}

// render writes v as JSON; with t set it respells it at random: members
// shuffled, whitespace, numbers in other notations, strings with escapes.
func render(t *rapid.T, v jv, dst *strings.Builder) {
	ws := func() {
		if t != nil {
			dst.WriteString(rapid.SampledFrom([]string{"", "", " ", "\n", "\t", "\r\n  "}).Draw(t, "ws"))
		}
	}
	ws()
	switch v.kind {
	case 'n':
		dst.WriteString("null")
	case 'b':
		dst.WriteString(strconv.FormatBool(v.b))
	case 'i':
		dst.WriteString(spellNumber(t, v.m, v.e))
	case 's':
		dst.WriteString(spellString(t, v.s))
	case 'a':
		dst.WriteByte('[')
		for i, it := range v.items {
			if i > 0 {
				dst.WriteByte(',')
			}
			render(t, it, dst)
		}
		ws()
		dst.WriteByte(']')
	case 'o':
		order := make([]int, len(v.keys))
		for i := range order {
			order[i] = i
		}
		if t != nil {
			order = rapid.Permutation(order).Draw(t, "order")
		}
		dst.WriteByte('{')
		for i, j := range order {
			if i > 0 {
				dst.WriteByte(',')
			}
			ws()
			dst.WriteString(spellString(t, v.keys[j]))
			ws()
			dst.WriteByte(':')
			render(t, v.members[j], dst)
		}
		ws()
		dst.WriteByte('}')
	}
	ws()
}

// spellNumber writes m·10^e exactly, in one of several notations.
func spellNumber(t *rapid.T, m int64, e int) string {
	sign := ""
	if m < 0 {
		sign, m = "-", -m
	}
	digits := strconv.FormatInt(m, 10)
	style := 0
	if t != nil {
		style = rapid.IntRange(0, 4).Draw(t, "style")
	}
	switch style {
	case 1: // DIGITS e EXP with an upper-case E and an explicit sign
		if e < 0 {
			return sign + digits + "E" + strconv.Itoa(e)
		}
		return sign + digits + "E+" + strconv.Itoa(e)
	case 2: // trailing zeros: DIGITS000 e (EXP-3)
		if m == 0 {
			return sign + "0.000e" + strconv.Itoa(e)
		}
		return sign + digits + "000e" + strconv.Itoa(e-3)
	case 3: // a decimal point inside the digits
		if len(digits) > 1 {
			k := len(digits) - 1
			return sign + digits[:1] + "." + digits[1:] + "e" + strconv.Itoa(e+k)
		}
		return sign + digits + ".0e" + strconv.Itoa(e)
	case 4: // 0.DIGITS e (EXP+len), with a zero-padded exponent
		x := e + len(digits)
		if x < 0 {
			return sign + "0." + digits + "e-0" + strconv.Itoa(-x)
		}
		return sign + "0." + digits + "e+0" + strconv.Itoa(x)
	}
	// Plain decimal notation.
	switch {
	case e >= 0:
		if m == 0 {
			return sign + "0"
		}
		return sign + digits + strings.Repeat("0", e)
	case -e < len(digits):
		return sign + digits[:len(digits)+e] + "." + digits[len(digits)+e:]
	default:
		return sign + "0." + strings.Repeat("0", -e-len(digits)) + digits
	}
}

func spellString(t *rapid.T, s string) string {
	if t == nil {
		b, _ := json.Marshal(s)
		return string(b)
	}
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		esc := rapid.IntRange(0, 3).Draw(t, "esc") == 0
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || esc && r < 0x10000:
			fmt.Fprintf(&b, `\u%04X`, r)
		case esc:
			r1, r2 := utf16Pair(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		case r == '/' && rapid.Bool().Draw(t, "slash"):
			b.WriteString(`\/`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + r>>10, 0xdc00 + r&0x3ff
}

// TestCanonicalRespelling: any respelling of a value (member order,
// whitespace, number notation, string escapes) has the canonical JSON of
// its plain rendering.
func TestCanonicalRespelling(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := genValue(3).Draw(t, "v")
		var plain, spelled strings.Builder
		render(nil, v, &plain)
		render(t, v, &spelled)
		a, err := Canonical(nil, []byte(plain.String()))
		if err != nil {
			t.Fatalf("plain %q: %v", plain.String(), err)
		}
		b, err := Canonical(nil, []byte(spelled.String()))
		if err != nil {
			t.Fatalf("spelled %q: %v", spelled.String(), err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("canonical JSON differs:\nplain   %s -> %s\nspelled %s -> %s", plain.String(), a, spelled.String(), b)
		}
		if !json.Valid(a) {
			t.Fatalf("canonical JSON %q is not JSON", a)
		}
	})
}

// mutate changes one value somewhere in v (a leaf's value, an array's
// length, a key) and returns the changed copy.
func mutate(t *rapid.T, v jv) jv {
	switch v.kind {
	case 'a':
		if len(v.items) > 0 && rapid.IntRange(0, 3).Draw(t, "deeper") > 0 {
			i := rapid.IntRange(0, len(v.items)-1).Draw(t, "i")
			items := slices.Clone(v.items)
			items[i] = mutate(t, items[i])
			v.items = items
			return v
		}
		v.items = append(slices.Clone(v.items), jv{kind: 'n'})
		return v
	case 'o':
		if len(v.keys) > 0 {
			i := rapid.IntRange(0, len(v.keys)-1).Draw(t, "i")
			if rapid.IntRange(0, 3).Draw(t, "deeper") > 0 {
				members := slices.Clone(v.members)
				members[i] = mutate(t, members[i])
				v.members = members
				return v
			}
			keys := slices.Clone(v.keys)
			keys[i] += "\x00" // a key no other member has
			for slices.Contains(v.keys, keys[i]) {
				keys[i] += "\x00"
			}
			v.keys = keys
			return v
		}
		v.keys, v.members = []string{"k"}, []jv{{kind: 'n'}}
		return v
	case 'n':
		return jv{kind: 'b'}
	case 'b':
		v.b = !v.b
		return v
	case 'i':
		switch rapid.IntRange(0, 2).Draw(t, "how") {
		case 0:
			v.m++
		case 1:
			if v.m == 0 {
				v.m = 1
			} else {
				v.e++
			}
		default:
			return jv{kind: 's', s: spellNumber(nil, v.m, v.e)} // the number as a string
		}
		return v
	default:
		v.s += rapid.SampledFrom([]string{"a", " ", "\x00", "é"}).Draw(t, "suffix")
		return v
	}
}

// TestCanonicalChange: a value changed anywhere changes the canonical
// JSON.
func TestCanonicalChange(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := genValue(3).Draw(t, "v")
		w := mutate(t, v)
		var a, b strings.Builder
		render(nil, v, &a)
		render(t, w, &b)
		ca, err := Canonical(nil, []byte(a.String()))
		if err != nil {
			t.Fatal(err)
		}
		cb, err := Canonical(nil, []byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(ca, cb) {
			t.Fatalf("a change kept the canonical JSON:\n%s\n%s\n-> %s", a.String(), b.String(), ca)
		}
	})
}

// sameValue reports whether two decoded JSON values are equal, numbers
// compared exactly.
func sameValue(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		if hugeExponent(string(a)) || hugeExponent(string(b)) {
			return true // beyond what big.Rat computes in a test's time
		}
		x, okx := new(big.Rat).SetString(string(a))
		y, oky := new(big.Rat).SetString(string(b))
		return okx && oky && x.Cmp(y) == 0
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameValue(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			if w, ok := b[k]; !ok || !sameValue(v, w) {
				return false
			}
		}
		return true
	}
	return a == b
}

// hugeExponent reports a number whose exponent is beyond ±400.
func hugeExponent(s string) bool {
	i := strings.IndexAny(s, "eE")
	if i < 0 {
		return len(s) > 400
	}
	e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
	return err != nil || e > 400 || e < -400 || i > 400
}

func decodeNumbers(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// FuzzCanonical: the canonical JSON is JSON, is its own canonical form,
// and means what the body meant; a body encoding/json accepts fails only
// for the reasons the canonicaliser documents, never as a syntax error.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0,"max_tokens":16}`,
		`{"prompt":"a\u00e9\ud83d\ude00","n":1.0,"seed":1e3,"stream":true,"stream_options":{"include_usage":true}}`,
		`[1, 2.50, -0, 1E+2, "x\/y", null, true, false, {}, []]`,
		`{"a":{"b":{"c":[{"d":0.000001}]}}}`,
		`"\u0000"`, `{"a":1,"a":2}`, "\"\xff\"", `1e99999999999999999999`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := Canonical(nil, body)
		if err != nil {
			if errors.Is(err, ErrSyntax) && json.Valid(body) && utf8.Valid(body) {
				t.Fatalf("valid JSON %q refused as a syntax error: %v", body, err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("canonical JSON %q of %q is not JSON", out, body)
		}
		again, err := Canonical(nil, out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", body, out, again, err)
		}
		a, errA := decodeNumbers(body)
		b, errB := decodeNumbers(out)
		if errA != nil || errB != nil {
			t.Fatalf("encoding/json cannot read %q (%v) or its canonical JSON %q (%v)", body, errA, out, errB)
		}
		if !sameValue(a, b) {
			t.Fatalf("canonical JSON changed the value: %q -> %q", body, out)
		}
	})
}
