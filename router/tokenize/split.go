package tokenize

import (
	"unicode"
	"unicode/utf8"
)

// Hand-written matchers for the split patterns of the common tokenizers.
// They follow the backtracking (leftmost-first) semantics of the reference
// regex engine exactly; split_test.go checks them against regexp2 on random
// text. Any other pattern runs on regexp2.

const (
	// gpt2Pattern is the ByteLevel pre-tokenizer's built-in pattern.
	gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// qwenPattern is Qwen2/2.5/3's; llama3Pattern differs by \p{N}{1,3}.
	qwenPattern   = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// tekkenPattern is Mistral-Nemo's (Tekken).
	tekkenPattern = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// stepper is a matcher whose matches tile the text: at returns the end of
// the match that starts at i.
type stepper interface {
	matcher
	at(s string, i int) int
}

// knownMatcher returns the hand-written matcher for a pattern, or nil.
func knownMatcher(p string) matcher {
	switch p {
	case gpt2Pattern:
		return gpt2Matcher{}
	case qwenPattern:
		return qwenMatcher{maxDigits: 1}
	case llama3Pattern:
		return qwenMatcher{maxDigits: 3}
	case tekkenPattern:
		return tekkenMatcher{}
	}
	return nil
}

// runeAt decodes the rune at byte i (utf8.RuneError, 0 at the end).
func runeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return utf8.RuneError, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

var asciiClass = func() (t [128]uint8) {
	for c := 0; c < 128; c++ {
		r := rune(c)
		switch {
		case unicode.IsLetter(r):
			t[c] = clL
		case unicode.IsNumber(r):
			t[c] = clN
		case unicode.IsSpace(r):
			t[c] = clS
		default:
			t[c] = clO
		}
	}
	return t
}()

// character classes used by the patterns.
const (
	clL = 1 + iota // \p{L}
	clN            // \p{N}
	clS            // \s
	clO            // anything else
)

func class(r rune) uint8 {
	if r < 128 {
		return asciiClass[r]
	}
	switch {
	case unicode.IsLetter(r):
		return clL
	case unicode.IsNumber(r):
		return clN
	case unicode.IsSpace(r):
		return clS
	}
	return clO
}

// spaceRun returns the end of the run of whitespace starting at i and the
// start of the last \r or \n in it (-1 when none).
func spaceRun(s string, i int) (end, lastNL int) {
	lastNL = -1
	for i < len(s) {
		r, n := runeAt(s, i)
		if class(r) != clS {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = i
		}
		i += n
	}
	return i, lastNL
}

// matchSpaces applies `\s+(?!\S)|\s+` at i (a whitespace character), after
// `\s*[\r\n]+` when withNL is set.
func matchSpaces(s string, i int, withNL bool) int {
	end, lastNL := spaceRun(s, i)
	if withNL && lastNL >= 0 {
		return lastNL + 1 // \r and \n are one byte
	}
	if end == len(s) {
		return end
	}
	// \s+(?!\S): give back the last whitespace character, if one remains.
	_, lastStart := lastRuneStart(s, i, end)
	if lastStart > i {
		return lastStart
	}
	return end
}

// lastRuneStart returns the last rune in s[i:end] and its start.
func lastRuneStart(s string, i, end int) (rune, int) {
	r, n := utf8.DecodeLastRuneInString(s[i:end])
	return r, end - n
}

// contraction matches 's|'t|'re|'ve|'m|'ll|'d at i (s[i] == '\”), with
// case folding when fold is set; it returns the end or -1.
func contraction(s string, i int, fold bool) int {
	r1, n1 := runeAt(s, i+1)
	if n1 == 0 {
		return -1
	}
	if fold {
		r1 = foldLower(r1)
	}
	switch r1 {
	case 's', 't', 'm', 'd':
		return i + 1 + n1
	case 'r', 'v', 'l':
		r2, n2 := runeAt(s, i+1+n1)
		if n2 == 0 {
			return -1
		}
		if fold {
			r2 = foldLower(r2)
		}
		if (r1 == 'r' || r1 == 'v') && r2 == 'e' || r1 == 'l' && r2 == 'l' {
			return i + 1 + n1 + n2
		}
	}
	return -1
}

// foldLower folds the letters the contractions use, including the long s
// (U+017F), which Unicode case-folds to s.
func foldLower(r rune) rune {
	if r >= 'A' && r <= 'Z' {
		return r + 'a' - 'A'
	}
	if r == 'ſ' {
		return 's'
	}
	return r
}

// runOf returns the end of the run of characters of class c starting at i.
func runOf(s string, i int, c uint8) int {
	for i < len(s) {
		if b := s[i]; b < utf8.RuneSelf { // most text: no call a byte
			if asciiClass[b] != c {
				break
			}
			i++
			continue
		}
		r, n := runeAt(s, i)
		if class(r) != c {
			break
		}
		i += n
	}
	return i
}

// gpt2Matcher: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
type gpt2Matcher struct{}

func (gpt2Matcher) appendMatches(dst []span, s string) []span {
	i := 0
	for i < len(s) {
		end := gpt2At(s, i)
		dst = append(dst, span{i, end})
		i = end
	}
	return dst
}

func (gpt2Matcher) at(s string, i int) int { return gpt2At(s, i) }

func gpt2At(s string, i int) int {
	r, n := runeAt(s, i)
	if r == '\'' {
		if e := contraction(s, i, false); e >= 0 {
			return e
		}
	}
	c := class(r)
	if r == ' ' {
		r2, n2 := runeAt(s, i+1)
		if n2 > 0 {
			if c2 := class(r2); c2 != clS {
				return runOf(s, i+1+n2, c2)
			}
		}
	}
	if c != clS {
		return runOf(s, i+n, c)
	}
	return matchSpaces(s, i, false)
}

// qwenMatcher: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
type qwenMatcher struct{ maxDigits int }

func (q qwenMatcher) appendMatches(dst []span, s string) []span {
	i := 0
	for i < len(s) {
		end := q.at(s, i)
		dst = append(dst, span{i, end})
		i = end
	}
	return dst
}

func (q qwenMatcher) at(s string, i int) int {
	r, n := runeAt(s, i)
	if r == '\'' {
		if e := contraction(s, i, true); e >= 0 {
			return e
		}
	}
	c := class(r)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c == clL {
		return runOf(s, i+n, clL)
	}
	if c != clN && r != '\r' && r != '\n' {
		if r2, n2 := runeAt(s, i+n); n2 > 0 && class(r2) == clL {
			return runOf(s, i+n+n2, clL)
		}
	}
	// \p{N}{1,max}
	if c == clN {
		end := i + n
		for k := 1; k < q.maxDigits; k++ {
			r2, n2 := runeAt(s, end)
			if n2 == 0 || class(r2) != clN {
				break
			}
			end += n2
		}
		return end
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	if e := otherRun(s, i, r, n, c, false); e >= 0 {
		return e
	}
	return matchSpaces(s, i, true)
}

// otherRun matches ` ?[^\s\p{L}\p{N}]+[\r\n]*` (with '/' in the trailing
// class when slash is set) at i, or returns -1.
func otherRun(s string, i int, r rune, n int, c uint8, slash bool) int {
	j := -1
	if r == ' ' {
		if r2, n2 := runeAt(s, i+1); n2 > 0 && class(r2) == clO {
			j = i + 1
		}
	} else if c == clO {
		j = i
	}
	if j < 0 {
		return -1
	}
	j = runOf(s, j, clO)
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || slash && s[j] == '/') {
		j++
	}
	return j
}

// tekkenMatcher: Mistral-Nemo's pattern (see tekkenPattern).
type tekkenMatcher struct{}

func (tekkenMatcher) appendMatches(dst []span, s string) []span {
	i := 0
	for i < len(s) {
		end := tekkenAt(s, i)
		dst = append(dst, span{i, end})
		i = end
	}
	return dst
}

// isUpperish is [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]; isLowerish is
// [\p{Ll}\p{Lm}\p{Lo}\p{M}].
func isUpperish(r rune) bool {
	if r < 128 {
		return r >= 'A' && r <= 'Z'
	}
	return unicode.IsLetter(r) && !unicode.Is(unicode.Ll, r) || unicode.IsMark(r)
}

func isLowerish(r rune) bool {
	if r < 128 {
		return r >= 'a' && r <= 'z'
	}
	return unicode.IsLetter(r) && !unicode.Is(unicode.Lu, r) && !unicode.Is(unicode.Lt, r) || unicode.IsMark(r)
}

// tekkenWord1 matches [X]*[Y]+ from j (X upperish, Y lowerish), returning
// the end or -1: the greedy X* gives back characters until a Y can start.
func tekkenWord1(s string, j int) int {
	k := j
	lastY := -1 // start of the last Y character inside the X run
	for k < len(s) {
		r, n := runeAt(s, k)
		if !isUpperish(r) {
			break
		}
		if isLowerish(r) {
			lastY = k
		}
		k += n
	}
	if r, n := runeAt(s, k); n > 0 && isLowerish(r) {
		k += n
		for k < len(s) {
			r, n := runeAt(s, k)
			if !isLowerish(r) {
				break
			}
			k += n
		}
		return k
	}
	if lastY >= 0 {
		_, n := runeAt(s, lastY)
		return lastY + n
	}
	return -1
}

// tekkenWord2 matches [X]+[Y]* from j, or returns -1.
func tekkenWord2(s string, j int) int {
	k := j
	for k < len(s) {
		r, n := runeAt(s, k)
		if !isUpperish(r) {
			break
		}
		k += n
	}
	if k == j {
		return -1
	}
	for k < len(s) {
		r, n := runeAt(s, k)
		if !isLowerish(r) {
			break
		}
		k += n
	}
	return k
}

func (tekkenMatcher) at(s string, i int) int { return tekkenAt(s, i) }

func tekkenAt(s string, i int) int {
	r, n := runeAt(s, i)
	c := class(r)
	optional := c != clL && c != clN && r != '\r' && r != '\n' // [^\r\n\p{L}\p{N}]
	for _, word := range [2]func(string, int) int{tekkenWord1, tekkenWord2} {
		if optional {
			if e := word(s, i+n); e >= 0 {
				return e
			}
		}
		if e := word(s, i); e >= 0 {
			return e
		}
	}
	if c == clN {
		return i + n
	}
	if e := otherRun(s, i, r, n, c, true); e >= 0 {
		return e
	}
	return matchSpaces(s, i, true)
}
