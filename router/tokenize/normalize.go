package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites one span of text (the reference library normalizes
// each span between added tokens on its own).
type normalizer interface {
	normalize(s string) string
}

func parseNormalizer(m json.RawMessage) (normalizer, error) {
	if isNull(m) {
		return nil, nil
	}
	typ, err := componentType(m)
	if err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch typ {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "Prepend":
		var p struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(m, &p); err != nil {
			return nil, fmt.Errorf("normalizer Prepend: %w", err)
		}
		return prepend{p.Prepend}, nil
	case "Replace":
		var r struct {
			Pattern patternJSON `json:"pattern"`
			Content string      `json:"content"`
		}
		if err := json.Unmarshal(m, &r); err != nil {
			return nil, fmt.Errorf("normalizer Replace: %w", err)
		}
		rp, err := newReplacer(r.Pattern, r.Content)
		if err != nil {
			return nil, fmt.Errorf("normalizer Replace: %w", err)
		}
		return rp, nil
	case "Sequence":
		var s struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(m, &s); err != nil {
			return nil, fmt.Errorf("normalizer Sequence: %w", err)
		}
		var seq normSequence
		for _, c := range s.Normalizers {
			n, err := parseNormalizer(c)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	}
	return nil, unsupported("normalizer", typ, "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Prepend", "Replace", "Sequence")
}

type unicodeNorm struct{ f norm.Form }

func (u unicodeNorm) normalize(s string) string {
	if u.f.IsNormalString(s) {
		return s
	}
	return u.f.String(s)
}

// lowercase maps each character to its lower case, one character at a time
// (no final-sigma rule), as the reference library does.
type lowercase struct{}

func (lowercase) normalize(s string) string {
	changed := false
	for _, r := range s {
		if unicode.ToLower(r) != r {
			changed = true
			break
		}
	}
	if !changed {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for _, r := range s {
		if r == 'İ' { // lower-cases to "i̇" (two characters)
			b.WriteString("i\u0307")
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// prepend adds its text in front of a non-empty span.
type prepend struct{ s string }

func (p prepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.s + s
}

// replacer replaces every match of a literal or a regular expression.
type replacer struct {
	lit     string
	re      *regexp2.Regexp
	content string
}

func newReplacer(p patternJSON, content string) (*replacer, error) {
	switch {
	case p.String != nil:
		return &replacer{lit: *p.String, content: content}, nil
	case p.Regex != nil:
		re, err := compileRegex(*p.Regex)
		if err != nil {
			return nil, err
		}
		return &replacer{re: re, content: content}, nil
	}
	return nil, fmt.Errorf("pattern needs a \"String\" or a \"Regex\"")
}

func (r *replacer) normalize(s string) string {
	if r.re == nil {
		if r.lit == "" {
			return s
		}
		return strings.ReplaceAll(s, r.lit, r.content)
	}
	var b strings.Builder
	prev := 0
	forEachRegexMatch(r.re, s, func(start, end int) {
		b.WriteString(s[prev:start])
		b.WriteString(r.content)
		prev = end
	})
	if prev == 0 && b.Len() == 0 {
		return s
	}
	b.WriteString(s[prev:])
	return b.String()
}

type normSequence []normalizer

func (q normSequence) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

// compileRegex compiles a pattern of the reference library (Oniguruma
// syntax) with regexp2, whose .NET syntax covers what tokenizers use:
// lookahead, \p{..} classes, inline (?i:...).
func compileRegex(p string) (*regexp2.Regexp, error) {
	re, err := regexp2.Compile(p, regexp2.Unicode)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", p, err)
	}
	return re, nil
}

// forEachRegexMatch calls fn with the byte offsets of each match of re in s,
// in order, skipping an empty match that ends where the previous one ended
// (as Oniguruma's iterator does).
func forEachRegexMatch(re *regexp2.Regexp, s string, fn func(start, end int)) {
	if s == "" {
		return
	}
	runes := []rune(s)
	// byte offset of each rune index (and of the end).
	offs := make([]int, 0, len(runes)+1)
	for i := range s {
		offs = append(offs, i)
	}
	offs = append(offs, len(s))
	lastEnd := -1
	at := 0
	for at <= len(runes) {
		m, err := re.FindRunesMatchStartingAt(runes, at)
		if err != nil || m == nil {
			return
		}
		start, end := m.Index, m.Index+m.Length
		if start == end && lastEnd == end {
			at = end + 1
			continue
		}
		fn(offs[start], offs[end])
		lastEnd = end
		if end == start {
			at = end + 1
		} else {
			at = end
		}
	}
}

// validUTF8 replaces invalid UTF-8 by U+FFFD, once per invalid run.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
