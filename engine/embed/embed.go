package embed

import (
	"fmt"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// DefaultDim is the default number of dimensions.
const DefaultDim = 256

// MaxDim is the most dimensions Vector computes.
const MaxDim = 4096

// isStop reports whether w is one of the English function words left out
// of the features: they carry little of a question's meaning, and two
// unrelated questions share many of them. Negations are not among them.
func isStop(w string) bool {
	switch w {
	case "a", "an", "the", "this", "that", "these", "those", "i", "me", "my", "mine", "we", "us",
		"our", "you", "your", "yours", "he", "him", "his", "she", "her", "it", "its", "they",
		"them", "their", "is", "are", "was", "were", "be", "been", "being", "am", "do", "does",
		"did", "doing", "done", "have", "has", "had", "having", "can", "could", "would", "should",
		"will", "shall", "may", "might", "must", "of", "to", "in", "on", "at", "by", "for", "from",
		"with", "about", "into", "onto", "over", "under", "as", "than", "then", "so", "and", "or",
		"but", "if", "what", "whats", "which", "who", "whom", "whose", "when", "where", "why",
		"how", "please", "tell", "give", "show", "explain", "describe", "let", "know", "like", "just", "also", "some",
		"any", "there", "here", "s", "t", "d", "ll", "m", "re", "ve":
		return true
	}
	return false
}

// Vector returns the embedding of text in dim dimensions (1 to MaxDim),
// L2 normalised. A text of nothing but white space has the zero vector.
func Vector(text string, dim int) ([]float32, error) {
	if dim < 1 || dim > MaxDim {
		return nil, fmt.Errorf("embed: %d dimensions: want 1 to %d", dim, MaxDim)
	}
	v := make([]float64, dim)
	words := Words(text)
	content := words[:0:0]
	for _, w := range words {
		if !isStop(w) {
			content = append(content, w)
		}
	}
	if len(content) == 0 {
		content = words // only function words: use them
	}
	for _, w := range content {
		weight := 1.0
		if isNegation(w) {
			weight = negationWeight
		}
		addWord(v, stem(w), weight)
	}
	if len(content) == 0 {
		// Nothing but punctuation or symbols: their trigrams.
		if s := strings.Join(strings.Fields(text), " "); s != "" {
			addWord(v, s, 1)
		}
	}
	out := make([]float32, dim)
	var sum float64
	for _, x := range v {
		sum += x * x
	}
	if sum == 0 {
		return out, nil
	}
	inv := 1 / math.Sqrt(sum)
	for i, x := range v {
		out[i] = float32(x * inv)
	}
	return out, nil
}

// negationWeight is how much more a negation weighs than another word: a
// "not" added to a sentence of four content words moves it to a similarity
// of 0.71 rather than 0.89.
const negationWeight = 2

// isNegation reports whether w turns a sentence's meaning around.
func isNegation(w string) bool {
	switch w {
	case "not", "no", "never", "none", "nor", "without", "cannot", "cant", "dont", "doesnt", "didnt",
		"isnt", "arent", "wasnt", "werent", "wont", "wouldnt", "shouldnt", "couldnt", "neither":
		return true
	}
	return false
}

// addWord adds the features of one word with the given weight: itself,
// and its character trigrams between ^ and $ (together as heavy as the
// word).
func addWord(v []float64, w string, weight float64) {
	add(v, "w:", w, weight)
	runes := make([]rune, 0, utf8.RuneCountInString(w)+2)
	runes = append(runes, '^')
	runes = append(runes, []rune(w)...)
	runes = append(runes, '$')
	n := len(runes) - 2
	if n < 1 {
		return
	}
	gram := weight / math.Sqrt(float64(n))
	for i := 0; i+3 <= len(runes); i++ {
		add(v, "g:", string(runes[i:i+3]), gram)
	}
}

// add hashes prefix+feature (FNV-1a, 64 bits) to a dimension and a sign.
func add(v []float64, prefix, feature string, weight float64) {
	h := uint64(14695981039346656037)
	for i := 0; i < len(prefix); i++ {
		h = (h ^ uint64(prefix[i])) * 1099511628211
	}
	for i := 0; i < len(feature); i++ {
		h = (h ^ uint64(feature[i])) * 1099511628211
	}
	// A final avalanche so that the low bits (the dimension) and the top
	// bit (the sign) depend on every byte.
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	i := h % uint64(len(v))
	if h>>63 == 1 {
		weight = -weight
	}
	v[i] += weight
}

// Words returns the normalised words of text: NFKD with combining marks
// dropped, lower case, maximal runs of letters and digits (apostrophes
// inside a word dropped).
func Words(text string) []string {
	var words []string
	var b strings.Builder
	flush := func() {
		if b.Len() > 0 {
			words = append(words, b.String())
			b.Reset()
		}
	}
	var it norm.Iter
	it.InitString(norm.NFKD, text)
	prevLetter := false
	for !it.Done() {
		seg := it.Next()
		for len(seg) > 0 {
			r, size := utf8.DecodeRune(seg)
			seg = seg[size:]
			switch {
			case unicode.Is(unicode.Mn, r):
				// a combining mark: dropped
			case unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(unicode.ToLower(r))
				prevLetter = true
				continue
			case (r == '\'' || r == '’') && prevLetter:
				// inside a word: dropped; at its end, the next rune ends it
				continue
			default:
				flush()
			}
			prevLetter = false
		}
	}
	flush()
	return words
}

// stem strips common English suffixes, keeping at least three letters:
// -ies -> y, -es after s/x/z/ch/sh, -s (not -ss, -us, -is), -ing, -ed (a
// doubled final consonant undoubled: resetting -> reset), -ly; then a
// final e (summarize and summarized -> summariz).
func stem(w string) string {
	s := stripSuffix(w)
	if n := len(s); n > 3 && s[n-1] == 'e' {
		return s[:n-1]
	}
	return s
}

func stripSuffix(w string) string {
	n := len(w)
	switch {
	case n > 4 && strings.HasSuffix(w, "ies"):
		return w[:n-3] + "y"
	case n > 4 && strings.HasSuffix(w, "es") && (strings.HasSuffix(w[:n-2], "s") || strings.HasSuffix(w[:n-2], "x") ||
		strings.HasSuffix(w[:n-2], "z") || strings.HasSuffix(w[:n-2], "ch") || strings.HasSuffix(w[:n-2], "sh")):
		return w[:n-2]
	case n > 3 && strings.HasSuffix(w, "s") && !strings.HasSuffix(w, "ss") && !strings.HasSuffix(w, "us") && !strings.HasSuffix(w, "is"):
		return w[:n-1]
	case n > 5 && strings.HasSuffix(w, "ing"):
		return undouble(w[:n-3])
	case n > 4 && strings.HasSuffix(w, "ed"):
		return undouble(w[:n-2])
	case n > 5 && strings.HasSuffix(w, "ly"):
		return w[:n-2]
	}
	return w
}

// undouble drops the last letter of a stem that ends in a doubled
// consonant other than l, s or z (resett -> reset, but fall stays).
func undouble(s string) string {
	n := len(s)
	if n >= 4 && s[n-1] == s[n-2] && !strings.ContainsRune("aeiouylsz", rune(s[n-1])) {
		return s[:n-1]
	}
	return s
}

// Cosine returns the cosine similarity of a and b (the dot product of two
// normalised vectors); 0 when either is zero or their lengths differ.
func Cosine(a, b []float32) float64 {
	if len(a) != len(b) {
		return 0
	}
	var dot, na, nb float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	if na == 0 || nb == 0 {
		return 0
	}
	return dot / math.Sqrt(na*nb)
}
