package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/zeebo/xxh3"
)

// bpe is the BPE model. Merges are keyed by the packed pair of ids
// (left<<32 | right) and hold rank<<32 | merged id, so the lowest value is
// the merge to apply first.
type bpe struct {
	vocab   map[string]uint32
	idToTok []string // model tokens by id ("" for holes)
	merges  map[uint64]uint64

	unk          int64 // unk id, or -1
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix
	fallbackIDs  [256]int32

	// byteLevel is set when the pre-tokenizer ends with ByteLevel: words
	// arrive as raw bytes and byteIDs maps each byte to the id of its
	// byte-level character (all 256 present), rawVocab holds the vocabulary
	// in raw-byte form for ignore_merges.
	byteLevel bool
	byteIDs   [256]uint32
	rawVocab  map[string]uint32

	cache *wordCache
}

// mergeEntry reads a merge given as "a b" or as ["a", "b"].
type mergeEntry [2]string

func (m *mergeEntry) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		a, c, ok := strings.Cut(s, " ")
		if !ok || strings.Contains(c, " ") {
			return fmt.Errorf("merge %q: want two tokens separated by one space", s)
		}
		m[0], m[1] = a, c
		return nil
	}
	var pair []string
	if err := json.Unmarshal(b, &pair); err != nil {
		return err
	}
	if len(pair) != 2 {
		return fmt.Errorf("merge %v: want two tokens", pair)
	}
	m[0], m[1] = pair[0], pair[1]
	return nil
}

func parseBPE(m json.RawMessage, byteLevel bool, cacheEntries int) (*bpe, error) {
	if isNull(m) {
		return nil, errors.New("model is missing")
	}
	typ, err := componentType(m)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if typ != "BPE" && typ != "" {
		return nil, unsupported("model", typ, "BPE")
	}
	var j struct {
		Type         string            `json:"type"`
		Dropout      *float64          `json:"dropout"`
		UnkToken     *string           `json:"unk_token"`
		Prefix       *string           `json:"continuing_subword_prefix"`
		Suffix       *string           `json:"end_of_word_suffix"`
		FuseUnk      bool              `json:"fuse_unk"`
		ByteFallback bool              `json:"byte_fallback"`
		IgnoreMerges bool              `json:"ignore_merges"`
		Vocab        map[string]uint32 `json:"vocab"`
		Merges       []mergeEntry      `json:"merges"`
	}
	if err := json.Unmarshal(m, &j); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if j.Type != "BPE" && !(j.Type == "" && j.Merges != nil) {
		return nil, unsupported("model", j.Type, "BPE")
	}
	if j.Dropout != nil && *j.Dropout != 0 {
		return nil, fmt.Errorf("model BPE: dropout %v is not supported (it makes encoding random; set it to null)", *j.Dropout)
	}
	b := &bpe{
		vocab: j.Vocab, unk: -1, fuseUnk: j.FuseUnk, byteFallback: j.ByteFallback, ignoreMerges: j.IgnoreMerges,
		merges: make(map[uint64]uint64, len(j.Merges)),
	}
	if j.Prefix != nil {
		b.prefix = *j.Prefix
	}
	if j.Suffix != nil {
		b.suffix = *j.Suffix
	}
	maxID := -1
	for _, id := range b.vocab {
		maxID = max(maxID, int(id))
	}
	b.idToTok = make([]string, maxID+1)
	for tok, id := range b.vocab {
		b.idToTok[id] = tok
	}
	if j.UnkToken != nil {
		id, ok := b.vocab[*j.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model BPE: unk_token %q is not in the vocabulary", *j.UnkToken)
		}
		b.unk = int64(id)
	}
	for i := range b.fallbackIDs {
		b.fallbackIDs[i] = -1
		if id, ok := b.vocab[fmt.Sprintf("<0x%02X>", i)]; ok {
			b.fallbackIDs[i] = int32(id)
		}
	}
	rank := uint64(0)
	for _, mg := range j.Merges {
		if strings.HasPrefix(mg[0], "#version") && mg[1] == "" {
			continue
		}
		a, ok1 := b.vocab[mg[0]]
		c, ok2 := b.vocab[mg[1]]
		right := mg[1]
		if len(right) >= len(b.prefix) {
			right = right[len(b.prefix):] // the reference cuts the prefix's length blindly
		}
		merged, ok3 := b.vocab[mg[0]+right]
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("model BPE: merge %q %q uses a token that is not in the vocabulary", mg[0], mg[1])
		}
		b.merges[uint64(a)<<32|uint64(c)] = rank<<32 | uint64(merged)
		rank++
	}
	if byteLevel {
		b.byteLevel = true
		all := true
		for c := 0; c < 256; c++ {
			id, ok := b.vocab[string(byteChars[c])]
			if !ok {
				all = false
				break
			}
			b.byteIDs[c] = id
		}
		if !all || b.prefix != "" || b.suffix != "" {
			return nil, errors.New("model BPE: a ByteLevel pre-tokenizer needs all 256 byte characters in the vocabulary and no continuing_subword_prefix/end_of_word_suffix")
		}
		if b.ignoreMerges {
			b.rawVocab = make(map[string]uint32, len(b.vocab))
			for tok, id := range b.vocab {
				if raw, ok := byteLevelDecode(tok); ok {
					b.rawVocab[raw] = id
				}
			}
		}
	}
	if cacheEntries > 0 {
		b.cache = newWordCache(cacheEntries)
	}
	return b, nil
}

// byteChars maps each byte to its character in byte-level BPE (GPT-2's
// bytes_to_unicode), charBytes the reverse.
var byteChars, charBytes = func() (bc [256]rune, cb map[rune]byte) {
	cb = make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			bc[b] = rune(b)
		} else {
			bc[b] = rune(256 + n)
			n++
		}
		cb[bc[b]] = byte(b)
	}
	return bc, cb
}()

// byteLevelDecode maps a byte-level token back to raw bytes.
func byteLevelDecode(tok string) (string, bool) {
	buf := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := charBytes[r]
		if !ok {
			return "", false
		}
		buf = append(buf, b)
	}
	return string(buf), true
}

// maxCachedWord is the longest word the word cache keeps (as the reference).
const maxCachedWord = 256

// tokenize appends the ids of one pre-tokenized word.
func (b *bpe) tokenize(dst []uint32, w string, sc *scratch) []uint32 {
	if w == "" {
		return dst
	}
	if b.ignoreMerges {
		v := b.vocab
		if b.byteLevel {
			v = b.rawVocab
		}
		if id, ok := v[w]; ok {
			return append(dst, id)
		}
	}
	cacheable := b.cache != nil && len(w) < maxCachedWord
	var h uint64
	if cacheable {
		h = xxh3.HashString(w)
		if out, ok := b.cache.appendIDs(dst, h, w); ok {
			return out
		}
	}
	return b.merge(dst, w, h, cacheable, sc)
}

// wordBatch is how many words tokenizeWords looks up in the cache at once.
const wordBatch = 32

// tokenizeWords appends the ids of pre-tokenized words, in order, as
// tokenize would one by one, with the cache's lookups a batch at a time
// (wordCache.appendBatch).
func (b *bpe) tokenizeWords(dst []uint32, words []string, sc *scratch) []uint32 {
	if b.cache == nil || b.ignoreMerges {
		for _, w := range words {
			dst = b.tokenize(dst, w, sc)
		}
		return dst
	}
	hs := sc.hashes[:0]
	for _, w := range words {
		var h uint64
		if len(w) < maxCachedWord {
			h = xxh3.HashString(w)
		}
		hs = append(hs, h)
	}
	sc.hashes = hs
	for len(words) > 0 {
		var done int
		dst, done = b.cache.appendBatch(dst, words, hs, sc)
		if done == len(words) {
			break
		}
		// words[done] was not in the cache (or is never cached).
		if w := words[done]; w != "" {
			dst = b.merge(dst, w, hs[done], len(w) < maxCachedWord, sc)
		}
		words, hs = words[done+1:], hs[done+1:]
	}
	return dst
}

// merge appends the ids of word w by its merges, and caches them when
// cacheable (h is w's hash then).
func (b *bpe) merge(dst []uint32, w string, h uint64, cacheable bool, sc *scratch) []uint32 {
	start := len(dst)
	syms := sc.syms[:0]
	if b.byteLevel {
		for i := 0; i < len(w); i++ {
			syms = append(syms, b.byteIDs[w[i]])
		}
	} else {
		syms = b.initialSymbols(syms, w, sc)
	}
	if len(syms) <= smallWord {
		syms = b.mergeSmall(syms, sc)
	} else {
		syms = b.mergeHeap(syms, sc)
	}
	sc.syms = syms
	dst = append(dst, syms...)
	if cacheable {
		b.cache.put(h, w, dst[start:])
	}
	return dst
}

// initialSymbols splits a word into characters and looks each up, with the
// reference's prefix/suffix, byte-fallback and unknown-token rules.
func (b *bpe) initialSymbols(syms []uint32, w string, sc *scratch) []uint32 {
	unkID, unkOpen := uint32(0), false
	for i := 0; i < len(w); {
		_, n := utf8.DecodeRuneInString(w[i:])
		ch := w[i : i+n]
		isFirst, isLast := i == 0, i+n == len(w)
		var id uint32
		var ok bool
		if (!isFirst && b.prefix != "") || (isLast && b.suffix != "") {
			buf := sc.buf[:0]
			if !isFirst {
				buf = append(buf, b.prefix...)
			}
			buf = append(buf, ch...)
			if isLast {
				buf = append(buf, b.suffix...)
			}
			id, ok = b.vocab[string(buf)]
			sc.buf = buf
		} else {
			id, ok = b.vocab[ch]
		}
		i += n
		if ok {
			if unkOpen {
				syms = append(syms, unkID)
				unkOpen = false
			}
			syms = append(syms, id)
			continue
		}
		if b.byteFallback {
			all := true
			for k := 0; k < len(ch); k++ {
				if b.fallbackIDs[ch[k]] < 0 {
					all = false
				}
			}
			if all {
				// The reference adds the byte tokens without flushing a
				// pending unknown token first.
				for k := 0; k < len(ch); k++ {
					syms = append(syms, uint32(b.fallbackIDs[ch[k]]))
				}
				continue
			}
		}
		if b.unk >= 0 {
			if unkOpen && !b.fuseUnk {
				syms = append(syms, unkID)
			}
			unkID, unkOpen = uint32(b.unk), true
		}
	}
	if unkOpen {
		syms = append(syms, unkID)
	}
	return syms
}

// smallWord is the longest word merged by repeated scans; longer words use
// a heap, as the reference does (same result, better for long words).
const smallWord = 48

const noMerge = ^uint64(0)

func (b *bpe) pairValue(l, r uint32) uint64 {
	if v, ok := b.merges[uint64(l)<<32|uint64(r)]; ok {
		return v
	}
	return noMerge
}

// mergeSmall applies the lowest-ranked merge, leftmost first, until none
// applies.
func (b *bpe) mergeSmall(syms []uint32, sc *scratch) []uint32 {
	if len(syms) < 2 {
		return syms
	}
	vals := sc.vals[:0]
	for i := 0; i+1 < len(syms); i++ {
		vals = append(vals, b.pairValue(syms[i], syms[i+1]))
	}
	for {
		best, bi := noMerge, -1
		for i, v := range vals {
			if v < best {
				best, bi = v, i
			}
		}
		if bi < 0 {
			break
		}
		syms[bi] = uint32(best)
		copy(syms[bi+1:], syms[bi+2:])
		syms = syms[:len(syms)-1]
		copy(vals[bi:], vals[bi+1:])
		vals = vals[:len(vals)-1]
		if bi > 0 {
			vals[bi-1] = b.pairValue(syms[bi-1], syms[bi])
		}
		if bi < len(vals) {
			vals[bi] = b.pairValue(syms[bi], syms[bi+1])
		}
	}
	sc.vals = vals
	return syms
}

// mergeItem is a candidate merge of the symbol at pos with its successor.
type mergeItem struct {
	val uint64 // rank<<32 | merged id
	pos int32
}

func (m mergeItem) less(o mergeItem) bool {
	if m.val>>32 != o.val>>32 {
		return m.val < o.val
	}
	return m.pos < o.pos
}

// mergeHeap is the reference's algorithm: a heap of candidate merges over a
// linked list of symbols, skipping stale candidates.
func (b *bpe) mergeHeap(syms []uint32, sc *scratch) []uint32 {
	n := len(syms)
	prev, next := sc.prev[:0], sc.next[:0]
	for i := 0; i < n; i++ {
		prev = append(prev, int32(i-1))
		next = append(next, int32(i+1))
	}
	next[n-1] = -1
	alive := sc.alive[:0]
	for i := 0; i < n; i++ {
		alive = append(alive, true)
	}
	h := sc.heap[:0]
	push := func(it mergeItem) {
		h = append(h, it)
		i := len(h) - 1
		for i > 0 {
			p := (i - 1) / 2
			if !h[i].less(h[p]) {
				break
			}
			h[i], h[p] = h[p], h[i]
			i = p
		}
	}
	pop := func() mergeItem {
		top := h[0]
		last := len(h) - 1
		h[0] = h[last]
		h = h[:last]
		i := 0
		for {
			l, r, m := 2*i+1, 2*i+2, i
			if l < len(h) && h[l].less(h[m]) {
				m = l
			}
			if r < len(h) && h[r].less(h[m]) {
				m = r
			}
			if m == i {
				break
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
		return top
	}
	for i := 0; i+1 < n; i++ {
		if v := b.pairValue(syms[i], syms[i+1]); v != noMerge {
			push(mergeItem{v, int32(i)})
		}
	}
	for len(h) > 0 {
		top := pop()
		p := top.pos
		if !alive[p] || next[p] < 0 {
			continue
		}
		q := next[p]
		if b.pairValue(syms[p], syms[q]) != top.val {
			continue // stale
		}
		syms[p] = uint32(top.val)
		alive[q] = false
		next[p] = next[q]
		if next[q] >= 0 {
			prev[next[q]] = p
		}
		if pp := prev[p]; pp >= 0 {
			if v := b.pairValue(syms[pp], syms[p]); v != noMerge {
				push(mergeItem{v, pp})
			}
		}
		if nn := next[p]; nn >= 0 {
			if v := b.pairValue(syms[p], syms[nn]); v != noMerge {
				push(mergeItem{v, p})
			}
		}
	}
	out := 0
	for i := int32(0); i >= 0; i = next[i] {
		syms[out] = syms[i]
		out++
	}
	sc.prev, sc.next, sc.alive, sc.heap = prev, next, alive, h
	return syms[:out]
}
