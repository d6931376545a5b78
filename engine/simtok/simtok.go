package simtok

import (
	"github.com/inferrail/inferrail/engine/kvblock"
)

const (
	consonants = "bdfghjklmnprstvz"
	vowels     = "aeiou"
	syllables  = len(consonants) * len(vowels) // 80

	// WordBytes is the length of a vocabulary word's text, its trailing space included.
	WordBytes = 7
	// MaxPieceBytes is the longest piece of text that becomes one token.
	MaxPieceBytes = 12
	// VocabSize is the number of token ids (kvblock.SimVocabSize).
	VocabSize = kvblock.SimVocabSize
)

// Tokenizer is the builtin:sim tokenizer. The zero value is not usable; call
// New. It is immutable and safe for concurrent use.
type Tokenizer struct {
	words [VocabSize][WordBytes]byte
	// cons and vow give a letter's place among the consonants and vowels
	// (-1 for other bytes), so a word's id is read back without a map.
	cons [256]int8
	vow  [256]int8
}

// New returns the tokenizer.
func New() *Tokenizer {
	t := &Tokenizer{}
	for i := range t.cons {
		t.cons[i], t.vow[i] = -1, -1
	}
	for i := 0; i < len(consonants); i++ {
		t.cons[consonants[i]] = int8(i)
	}
	for i := 0; i < len(vowels); i++ {
		t.vow[vowels[i]] = int8(i)
	}
	for id := range VocabSize {
		s := [3]int{id / (syllables * syllables), id / syllables % syllables, id % syllables}
		w := &t.words[id]
		for k, syl := range s {
			w[2*k] = consonants[syl/len(vowels)]
			w[2*k+1] = vowels[syl%len(vowels)]
		}
		w[6] = ' '
	}
	return t
}

// Word returns the text of token id (a word and its trailing space). Ids
// outside the vocabulary are reduced modulo VocabSize.
func (t *Tokenizer) Word(id uint32) string {
	w := t.words[id%VocabSize]
	return string(w[:])
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'
}

// Encode returns the token ids of text.
func (t *Tokenizer) Encode(text string) []uint32 {
	return t.AppendEncode(make([]uint32, 0, len(text)/WordBytes+1), text)
}

// AppendEncode appends the token ids of text to dst.
func (t *Tokenizer) AppendEncode(dst []uint32, text string) []uint32 {
	// The same cuts as cut, with the byte's class from a table (this loop
	// runs over every prompt the proxy routes).
	start, need := 0, 0
	for i := 0; i < len(text); i++ {
		switch cls := byteClass[text[i]]; cls {
		case classSpace:
			dst = append(dst, t.piece(text[start:i+1]))
			start, need = i+1, 0
			continue
		case classASCII:
			need = 0
		case classCont:
			if need > 0 {
				need--
			}
		default:
			need = int(cls - classLead1 + 1)
		}
		if need == 0 && i+1-start >= MaxPieceBytes {
			dst = append(dst, t.piece(text[start:i+1]))
			start = i + 1
		}
	}
	if start < len(text) {
		dst = append(dst, t.piece(text[start:]))
	}
	return dst
}

// Byte classes for AppendEncode.
const (
	classASCII uint8 = iota
	classSpace
	classCont  // a UTF-8 continuation byte
	classLead1 // the first byte of a 2-byte rune
	classLead2
	classLead3
)

var byteClass = func() (c [256]uint8) {
	for i := range c {
		switch b := byte(i); {
		case isSpace(b):
			c[i] = classSpace
		case b < 0x80:
			c[i] = classASCII
		case b < 0xC0:
			c[i] = classCont
		case b < 0xE0:
			c[i] = classLead1
		case b < 0xF0:
			c[i] = classLead2
		default:
			c[i] = classLead3
		}
	}
	return c
}()

// cut reports whether a piece ends after byte c, the n-th byte of the piece.
// need counts the continuation bytes still due for the current rune, so a
// long piece is cut between runes; everything it looks at lies to the left
// of the cut.
func cut(c byte, n int, need *int) bool {
	switch {
	case c&0xC0 == 0x80: // continuation byte
		if *need > 0 {
			*need--
		}
	case c >= 0xF0:
		*need = 3
	case c >= 0xE0:
		*need = 2
	case c >= 0xC0:
		*need = 1
	default:
		*need = 0
	}
	return isSpace(c) || n >= MaxPieceBytes && *need == 0
}

// CountTokens returns len(Encode(text)) without allocating.
func (t *Tokenizer) CountTokens(text string) int {
	n, start, need := 0, 0, 0
	for i := 0; i < len(text); i++ {
		if cut(text[i], i+1-start, &need) {
			n++
			start = i + 1
		}
	}
	if start < len(text) {
		n++
	}
	return n
}

// piece maps one piece of text to its id: a vocabulary word to its own id,
// anything else by hashing.
func (t *Tokenizer) piece(p string) uint32 {
	if len(p) == WordBytes && p[6] == ' ' {
		id, ok := 0, true
		for k := 0; k < 3; k++ {
			c, v := t.cons[p[2*k]], t.vow[p[2*k+1]]
			if c < 0 || v < 0 {
				ok = false
				break
			}
			id = id*syllables + int(c)*len(vowels) + int(v)
		}
		if ok && id < VocabSize {
			return uint32(id)
		}
	}
	// FNV-1a, finalised.
	h := uint64(14695981039346656037)
	for i := 0; i < len(p); i++ {
		h ^= uint64(p[i])
		h *= 1099511628211
	}
	return uint32(kvblock.Mix64(h) % VocabSize)
}

// Decode returns the text of ids.
func (t *Tokenizer) Decode(ids []uint32) string {
	return string(t.AppendDecode(make([]byte, 0, len(ids)*WordBytes), ids))
}

// AppendDecode appends the text of ids to dst.
func (t *Tokenizer) AppendDecode(dst []byte, ids []uint32) []byte {
	for _, id := range ids {
		w := &t.words[id%VocabSize]
		dst = append(dst, w[:]...)
	}
	return dst
}

// AppendSegmentText appends the text of a simulator segment (the words of its
// kvblock.SegmentToken ids) to dst.
func (t *Tokenizer) AppendSegmentText(dst []byte, s kvblock.Segment) []byte {
	for pos := 0; pos < s.Len; pos++ {
		w := &t.words[kvblock.SegmentToken(s.ID, pos)]
		dst = append(dst, w[:]...)
	}
	return dst
}
