package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// piece is a part of a normalized span on its way to the model. first is
// true when the piece starts at offset 0 of the original text (Metaspace's
// prepend_scheme "first" depends on it).
type piece struct {
	s     string
	first bool
}

// preTokenizer is the compiled pre_tokenizer: steps in order, then the
// byte-level mapping when the last step is ByteLevel.
type preTokenizer struct {
	steps     []preStep
	byteLevel *byteLevelPre
}

// preStep splits one piece into pieces.
type preStep interface {
	apply(dst []piece, p piece, sc *scratch) []piece
	positional() bool
}

// stepper returns the matcher whose matches are the final pieces when the
// pre-tokenizer is one tiling split (a hand-written pattern, Isolated) with
// ByteLevel, or ByteLevel alone: such text streams to the model without
// collecting pieces. ok is false otherwise; a nil stepper with ok true means
// there is no pre-tokenizer (the whole piece goes to the model).
func (p *preTokenizer) stepper() (st stepper, ok bool) {
	if p.byteLevel != nil && p.byteLevel.addPrefixSpace {
		return nil, false
	}
	var split *splitStep
	switch {
	case len(p.steps) == 0 && p.byteLevel == nil:
		return nil, true
	case len(p.steps) == 0 && p.byteLevel.split != nil:
		split = p.byteLevel.split
	case len(p.steps) == 1 && p.byteLevel != nil && p.byteLevel.split == nil:
		sp, isSplit := p.steps[0].(*splitStep)
		if !isSplit {
			return nil, false
		}
		split = sp
	default:
		return nil, false
	}
	if split.invert || split.behavior != isolated {
		return nil, false
	}
	st, ok = split.m.(stepper)
	return st, ok
}

func (p *preTokenizer) positional() bool {
	for _, s := range p.steps {
		if s.positional() {
			return true
		}
	}
	return false
}

var preTokenizerTypes = []string{"ByteLevel", "Split", "Metaspace", "Sequence"}

func parsePreTokenizer(m json.RawMessage) (*preTokenizer, error) {
	p := &preTokenizer{}
	if isNull(m) {
		return p, nil
	}
	if err := p.add(m); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *preTokenizer) add(m json.RawMessage) error {
	typ, err := componentType(m)
	if err != nil {
		return fmt.Errorf("pre_tokenizer: %w", err)
	}
	if p.byteLevel != nil {
		return fmt.Errorf("pre_tokenizer %s after ByteLevel is not supported (ByteLevel must come last)", typ)
	}
	switch typ {
	case "Sequence":
		var s struct {
			Pretokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(m, &s); err != nil {
			return fmt.Errorf("pre_tokenizer Sequence: %w", err)
		}
		for _, c := range s.Pretokenizers {
			if err := p.add(c); err != nil {
				return err
			}
		}
		return nil
	case "ByteLevel":
		b := struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}{}
		if err := json.Unmarshal(m, &b); err != nil {
			return fmt.Errorf("pre_tokenizer ByteLevel: %w", err)
		}
		bl := &byteLevelPre{addPrefixSpace: b.AddPrefixSpace}
		if b.UseRegex == nil || *b.UseRegex {
			bl.split = &splitStep{m: gpt2Matcher{}, behavior: isolated}
		}
		p.byteLevel = bl
		return nil
	case "Split":
		var s struct {
			Pattern  patternJSON `json:"pattern"`
			Behavior string      `json:"behavior"`
			Invert   bool        `json:"invert"`
		}
		if err := json.Unmarshal(m, &s); err != nil {
			return fmt.Errorf("pre_tokenizer Split: %w", err)
		}
		st, err := newSplitStep(s.Pattern, s.Behavior, s.Invert)
		if err != nil {
			return fmt.Errorf("pre_tokenizer Split: %w", err)
		}
		p.steps = append(p.steps, st)
		return nil
	case "Metaspace":
		var s struct {
			Replacement    string `json:"replacement"`
			PrependScheme  string `json:"prepend_scheme"`
			Split          *bool  `json:"split"`
			AddPrefixSpace *bool  `json:"add_prefix_space"`
		}
		if err := json.Unmarshal(m, &s); err != nil {
			return fmt.Errorf("pre_tokenizer Metaspace: %w", err)
		}
		ms, err := newMetaspace(s.Replacement, s.PrependScheme, s.AddPrefixSpace, s.Split)
		if err != nil {
			return fmt.Errorf("pre_tokenizer Metaspace: %w", err)
		}
		p.steps = append(p.steps, ms)
		return nil
	}
	return unsupported("pre_tokenizer", typ, preTokenizerTypes...)
}

// run pre-tokenizes one normalized span, appending the pieces to dst.
func (p *preTokenizer) run(dst []piece, s piece, sc *scratch) []piece {
	cur := append(sc.pa[:0], s)
	for _, st := range p.steps {
		next := sc.pb[:0]
		for _, c := range cur {
			next = st.apply(next, c, sc)
		}
		sc.pa, sc.pb = next, cur
		cur = next
	}
	if p.byteLevel != nil {
		next := sc.pb[:0]
		for _, c := range cur {
			next = p.byteLevel.apply(next, c, sc)
		}
		sc.pa, sc.pb = next, cur
		cur = next
	}
	dst = append(dst, cur...)
	sc.pa = cur
	return dst
}

// byteLevelPre is the ByteLevel pre-tokenizer: an optional leading space,
// the GPT-2 split, then (in the model) the byte-to-character mapping.
type byteLevelPre struct {
	addPrefixSpace bool
	split          *splitStep
}

func (b *byteLevelPre) apply(dst []piece, p piece, sc *scratch) []piece {
	if b.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
		p.s = " " + p.s
	}
	if b.split == nil {
		return append(dst, p)
	}
	return b.split.apply(dst, p, sc)
}

// Split delimiter behaviours.
const (
	removed = iota
	isolated
	mergedWithPrevious
	mergedWithNext
	contiguous
)

var behaviors = map[string]int{
	"Removed": removed, "Isolated": isolated, "MergedWithPrevious": mergedWithPrevious,
	"MergedWithNext": mergedWithNext, "Contiguous": contiguous,
}

// matcher finds the non-overlapping matches of a pattern.
type matcher interface {
	appendMatches(dst []span, s string) []span
}

type span struct{ start, end int }

// flagSpan is a match (true) or the text between matches (false).
type flagSpan struct {
	start, end int
	match      bool
}

type splitStep struct {
	m        matcher
	behavior int
	invert   bool
}

func newSplitStep(p patternJSON, behavior string, invert bool) (*splitStep, error) {
	b, ok := behaviors[behavior]
	if !ok {
		return nil, fmt.Errorf("behavior %q is not supported (supported: Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)", behavior)
	}
	st := &splitStep{behavior: b, invert: invert}
	switch {
	case p.String != nil:
		if *p.String == "" {
			return nil, fmt.Errorf("empty String pattern: give a non-empty pattern")
		}
		st.m = literalMatcher(*p.String)
	case p.Regex != nil:
		if m := knownMatcher(*p.Regex); m != nil {
			st.m = m
			break
		}
		re, err := compileRegex(*p.Regex)
		if err != nil {
			return nil, err
		}
		st.m = regexMatcher{re}
	default:
		return nil, fmt.Errorf("pattern needs a \"String\" or a \"Regex\"")
	}
	return st, nil
}

func (st *splitStep) positional() bool { return false }

func (st *splitStep) apply(dst []piece, p piece, sc *scratch) []piece {
	sc.matches = st.m.appendMatches(sc.matches[:0], p.s)
	sc.spans = splitSpans(sc.spans[:0], sc.matches, len(p.s), st.invert, st.behavior)
	for _, f := range sc.spans {
		if f.match || f.start == f.end {
			continue // match=true marks a removed delimiter here
		}
		dst = append(dst, piece{s: p.s[f.start:f.end], first: p.first && f.start == 0})
	}
	return dst
}

// splitSpans turns matches into the pieces to keep (match=false) and to drop
// (match=true), following the reference library's split behaviours.
func splitSpans(dst []flagSpan, matches []span, n int, invert bool, behavior int) []flagSpan {
	base := len(dst)
	prev := 0
	for _, m := range matches {
		if prev != m.start {
			dst = append(dst, flagSpan{prev, m.start, invert})
		}
		dst = append(dst, flagSpan{m.start, m.end, !invert})
		prev = m.end
	}
	if prev != n {
		dst = append(dst, flagSpan{prev, n, invert})
	}
	all := dst[base:]
	out := all[:0]
	switch behavior {
	case isolated:
		for _, f := range all {
			out = append(out, flagSpan{f.start, f.end, false})
		}
	case removed:
		out = all
	case contiguous:
		prevMatch := false
		for _, f := range all {
			if f.match == prevMatch && len(out) > 0 {
				out[len(out)-1].end = f.end
			} else {
				out = append(out, flagSpan{f.start, f.end, false})
			}
			prevMatch = f.match
		}
	case mergedWithPrevious:
		prevMatch := false
		for _, f := range all {
			if f.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = f.end
			} else {
				out = append(out, flagSpan{f.start, f.end, false})
			}
			prevMatch = f.match
		}
	case mergedWithNext:
		// Walk backwards, writing from the end of all, then slide to the front.
		w := len(all)
		prevMatch := false
		for i := len(all) - 1; i >= 0; i-- {
			f := all[i]
			if f.match && !prevMatch && w < len(all) {
				all[w].start = f.start
			} else {
				w--
				all[w] = flagSpan{f.start, f.end, false}
			}
			prevMatch = f.match
		}
		out = append(out, all[w:]...)
	}
	return dst[:base+len(out)]
}

// literalMatcher finds a fixed string.
type literalMatcher string

func (l literalMatcher) appendMatches(dst []span, s string) []span {
	off := 0
	for {
		i := strings.Index(s[off:], string(l))
		if i < 0 {
			return dst
		}
		dst = append(dst, span{off + i, off + i + len(l)})
		off += i + len(l)
	}
}

// regexMatcher runs any other pattern on regexp2.
type regexMatcher struct{ re *regexp2.Regexp }

func (r regexMatcher) appendMatches(dst []span, s string) []span {
	forEachRegexMatch(r.re, s, func(start, end int) { dst = append(dst, span{start, end}) })
	return dst
}

// metaspace replaces spaces by a marker (▁), may prepend one, and splits
// before each marker.
type metaspace struct {
	rep     string
	repRune rune
	scheme  int // 0 always, 1 first, 2 never
	split   bool
}

func newMetaspace(rep, scheme string, addPrefixSpace, split *bool) (*metaspace, error) {
	r, n := utf8.DecodeRuneInString(rep)
	if n == 0 || n != len(rep) {
		return nil, fmt.Errorf("replacement must be one character, got %q", rep)
	}
	m := &metaspace{rep: rep, repRune: r, split: split == nil || *split}
	switch scheme {
	case "", "always":
		m.scheme = 0
	case "first":
		m.scheme = 1
	case "never":
		m.scheme = 2
	default:
		return nil, fmt.Errorf("prepend_scheme %q is not supported (supported: always, first, never)", scheme)
	}
	if addPrefixSpace != nil && !*addPrefixSpace {
		if scheme != "" && scheme != "never" {
			return nil, fmt.Errorf("add_prefix_space false does not match prepend_scheme %q", scheme)
		}
		m.scheme = 2
	}
	return m, nil
}

func (m *metaspace) positional() bool { return m.scheme == 1 }

func (m *metaspace) apply(dst []piece, p piece, sc *scratch) []piece {
	s := strings.ReplaceAll(p.s, " ", m.rep)
	if !strings.HasPrefix(s, m.rep) && (m.scheme == 0 || (m.scheme == 1 && p.first)) {
		s = m.rep + s
	}
	if !m.split {
		return append(dst, piece{s: s, first: p.first})
	}
	sc.matches = literalMatcher(m.rep).appendMatches(sc.matches[:0], s)
	sc.spans = splitSpans(sc.spans[:0], sc.matches, len(s), false, mergedWithNext)
	for _, f := range sc.spans {
		if f.start < f.end {
			dst = append(dst, piece{s: s[f.start:f.end], first: p.first && f.start == 0})
		}
	}
	return dst
}
