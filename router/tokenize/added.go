package tokenize

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of added_tokens.
type addedToken struct {
	content                         string
	id                              uint32
	special, lstrip, rstrip, single bool
	normalized                      bool
}

// addedVocab finds added tokens in text. Tokens with normalized=false are
// matched in the raw text, the others in each normalized span, as the
// reference library does.
type addedVocab struct {
	tokens    []addedToken
	byID      map[uint32]int    // id -> index in tokens
	byContent map[string]uint32 // content -> id
	// decodeForm is the normalized text of normalized tokens whose
	// normalization changes them (used by Decode).
	decodeForm map[uint32]string
	raw, norm  *trie
}

func newAddedVocab(list []addedTokenJSON, n normalizer) (*addedVocab, error) {
	v := &addedVocab{
		byID:       make(map[uint32]int, len(list)),
		byContent:  make(map[string]uint32, len(list)),
		decodeForm: map[uint32]string{},
	}
	var rawKeys, normKeys []string
	var rawIdx, normIdx []int
	for _, j := range list {
		if j.Content == "" {
			continue
		}
		a := addedToken{content: j.Content, id: j.ID, special: j.Special, lstrip: j.LStrip, rstrip: j.RStrip, single: j.SingleWord, normalized: j.Normalized}
		if i, ok := v.byID[a.id]; ok {
			v.tokens[i] = a
		} else {
			v.byID[a.id] = len(v.tokens)
			v.tokens = append(v.tokens, a)
		}
		v.byContent[a.content] = a.id
	}
	for i, a := range v.tokens {
		if !a.normalized {
			rawKeys, rawIdx = append(rawKeys, a.content), append(rawIdx, i)
			continue
		}
		form := a.content
		if n != nil {
			form = n.normalize(a.content)
		}
		if form != a.content {
			v.decodeForm[a.id] = form
		}
		normKeys, normIdx = append(normKeys, form), append(normIdx, i)
	}
	var err error
	if v.raw, err = newTrie(rawKeys, rawIdx); err != nil {
		return nil, fmt.Errorf("added_tokens: %w", err)
	}
	if v.norm, err = newTrie(normKeys, normIdx); err != nil {
		return nil, fmt.Errorf("added_tokens: %w", err)
	}
	return v, nil
}

// isSpecial reports whether id is a special added token.
func (v *addedVocab) isSpecial(id uint32) bool {
	i, ok := v.byID[id]
	return ok && v.tokens[i].special
}

// segment is a piece of text: either an added token (tok >= 0) or a span
// to tokenize, s[start:end].
type segment struct {
	start, end int
	tok        int32 // index into addedVocab.tokens, or -1
}

// split appends to dst the segments of s: added tokens found by tr
// (leftmost-longest) and the spans between them, never empty.
func (v *addedVocab) split(dst []segment, s string, tr *trie) []segment {
	if tr == nil || s == "" {
		if s != "" {
			dst = append(dst, segment{0, len(s), -1})
		}
		return dst
	}
	startOffset := 0
	i := 0
	for i < len(s) {
		i = tr.nextCandidate(s, i)
		if i >= len(s) {
			break
		}
		idx, n := tr.longest(s[i:])
		if idx < 0 {
			i++
			continue
		}
		a := &v.tokens[idx]
		start, stop := i, i+n
		i = stop // matches never overlap, even the ones discarded below
		if a.single {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if a.lstrip {
			start = max(spaceLeftmostAtEnd(s[:start]), startOffset)
		}
		if a.rstrip {
			stop += spaceRightmostAtStart(s[stop:])
			i = max(i, stop)
		}
		if startOffset < start {
			dst = append(dst, segment{startOffset, start, -1})
		}
		dst = append(dst, segment{start, stop, int32(idx)})
		startOffset = stop
	}
	if startOffset < len(s) {
		dst = append(dst, segment{startOffset, len(s), -1})
	}
	return dst
}

// isWordRune is Rust regex's Unicode \w.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Pc, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		r == 0x200C || r == 0x200D
}

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordRune(r)
}

// spaceLeftmostAtEnd is where the trailing whitespace of s starts.
func spaceLeftmostAtEnd(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= n
	}
	return i
}

// spaceRightmostAtStart is where the leading whitespace of s ends.
func spaceRightmostAtStart(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}

// trie is a byte trie over the added tokens' text.
type trie struct {
	first [256]bool
	edges map[uint64]int32 // node<<8 | byte -> child node
	term  []int32          // node -> token index, or -1
	// single is the only possible first byte when there is one, else -1.
	single int
}

func newTrie(keys []string, idx []int) (*trie, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	t := &trie{edges: map[uint64]int32{}, term: []int32{-1}}
	for k, key := range keys {
		node := int32(0)
		for i := 0; i < len(key); i++ {
			e := uint64(node)<<8 | uint64(key[i])
			child, ok := t.edges[e]
			if !ok {
				child = int32(len(t.term))
				t.term = append(t.term, -1)
				t.edges[e] = child
			}
			node = child
		}
		t.term[node] = int32(idx[k])
		t.first[key[0]] = true
	}
	t.single = -1
	n := 0
	for b, ok := range t.first {
		if ok {
			n++
			t.single = b
		}
	}
	if n != 1 {
		t.single = -1
	}
	return t, nil
}

// nextCandidate is the first index >= i where a token could start.
func (t *trie) nextCandidate(s string, i int) int {
	if t.single >= 0 {
		for i < len(s) {
			if s[i] == byte(t.single) {
				return i
			}
			// IndexByte is much faster on long runs without the byte.
			j := strings.IndexByte(s[i:], byte(t.single))
			if j < 0 {
				return len(s)
			}
			i += j
		}
		return i
	}
	for i < len(s) && !t.first[s[i]] {
		i++
	}
	return i
}

// longest returns the token index and length of the longest token that
// prefixes s, or -1.
func (t *trie) longest(s string) (int, int) {
	node := int32(0)
	best, bestLen := -1, 0
	for i := 0; i < len(s); i++ {
		child, ok := t.edges[uint64(node)<<8|uint64(s[i])]
		if !ok {
			break
		}
		node = child
		if t.term[node] >= 0 {
			best, bestLen = int(t.term[node]), i+1
		}
	}
	return best, bestLen
}
