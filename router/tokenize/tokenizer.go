package tokenize

import (
	"sync"
)

// Tokenizer encodes text to token ids and back, with the same ids as the
// reference library. Build one with Parse, LoadFile or LoadDir; it is safe
// for concurrent use.
type Tokenizer struct {
	opts    Options
	cfg     Config
	added   *addedVocab
	norm    normalizer
	pre     *preTokenizer
	model   *bpe
	decoder decoder

	// prefix and suffix are what the post-processor adds around the ids
	// when special tokens are asked for.
	prefix, suffix []uint32
	vocabSize      int

	spans *spanCache
	// stream, when streamOK, splits normalized text straight into model
	// words (nil: the whole text is one word).
	stream   stepper
	streamOK bool
	// positional is set when a span's ids depend on whether it starts the
	// text (Metaspace with prepend_scheme "first").
	positional bool

	pool sync.Pool // *scratch
}

// scratch holds the buffers one Encode call reuses.
type scratch struct {
	segs, segs2 []segment
	pieces      []piece
	pa, pb      []piece
	matches     []span
	spans       []flagSpan
	syms        []uint32
	vals        []uint64
	words       []string // a batch of pre-tokenized words (tokenizeWords)
	hashes      []uint64 // their hashes
	sink        uint64   // the word cache's warming loads (appendBatch)
	prev, next  []int32
	alive       []bool
	heap        []mergeItem
	buf         []byte
}

func (t *Tokenizer) getScratch() *scratch {
	if sc, ok := t.pool.Get().(*scratch); ok {
		return sc
	}
	return &scratch{}
}

func (t *Tokenizer) putScratch(sc *scratch) {
	// Drop references into the caller's text so the pool does not pin it.
	clear(sc.pieces)
	clear(sc.words[:cap(sc.words)])
	clear(sc.pa)
	clear(sc.pb)
	t.pool.Put(sc)
}

// Encode returns the ids of text. With addSpecialTokens the post-processor
// adds its tokens (BOS for Llama/Mistral, nothing for Qwen and GPT-2).
// Added and special tokens written in the text are always recognised, as in
// the reference library. Invalid UTF-8 is read as U+FFFD.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) []uint32 {
	return t.EncodeTo(nil, text, addSpecialTokens)
}

// EncodeTo appends the ids of text to dst and returns the extended slice;
// with a large enough dst and warm caches it does not allocate.
func (t *Tokenizer) EncodeTo(dst []uint32, text string, addSpecialTokens bool) []uint32 {
	text = validUTF8(text)
	if addSpecialTokens {
		dst = append(dst, t.prefix...)
	}
	sc := t.getScratch()
	sc.segs = t.added.split(sc.segs[:0], text, t.added.raw)
	for _, g := range sc.segs {
		if g.tok >= 0 {
			dst = append(dst, t.added.tokens[g.tok].id)
			continue
		}
		dst = t.encodeSpan(dst, text[g.start:g.end], g.start == 0, sc)
	}
	t.putScratch(sc)
	if addSpecialTokens {
		dst = append(dst, t.suffix...)
	}
	return dst
}

// encodeSpan appends the ids of a span of raw text between added tokens.
func (t *Tokenizer) encodeSpan(dst []uint32, s string, first bool, sc *scratch) []uint32 {
	var key spanKey
	cacheable := t.spans != nil && len(s) >= t.opts.MinSpanBytes
	if cacheable {
		key = newSpanKey(s, first && t.positional)
		if ids, ok := t.spans.get(key); ok {
			return append(dst, ids...)
		}
	}
	start := len(dst)
	n := s
	if t.norm != nil {
		n = t.norm.normalize(s)
	}
	if t.added.norm == nil {
		dst = t.tokenizePiece(dst, piece{s: n, first: first}, sc)
	} else {
		sc.segs2 = t.added.split(sc.segs2[:0], n, t.added.norm)
		for _, g := range sc.segs2 {
			if g.tok >= 0 {
				dst = append(dst, t.added.tokens[g.tok].id)
				continue
			}
			dst = t.tokenizePiece(dst, piece{s: n[g.start:g.end], first: first && g.start == 0}, sc)
		}
	}
	if cacheable {
		t.spans.put(key, dst[start:])
	}
	return dst
}

// tokenizePiece pre-tokenizes a normalized piece and runs the model.
func (t *Tokenizer) tokenizePiece(dst []uint32, p piece, sc *scratch) []uint32 {
	if t.streamOK {
		if t.stream == nil {
			return t.model.tokenize(dst, p.s, sc)
		}
		ws := sc.words[:0]
		for i := 0; i < len(p.s); {
			end := t.stream.at(p.s, i)
			ws = append(ws, p.s[i:end])
			i = end
			if len(ws) == wordBatch {
				dst = t.model.tokenizeWords(dst, ws, sc)
				ws = ws[:0]
			}
		}
		sc.words = ws
		return t.model.tokenizeWords(dst, ws, sc)
	}
	sc.pieces = t.pre.run(sc.pieces[:0], p, sc)
	for i := 0; i < len(sc.pieces); i += wordBatch {
		ws := sc.words[:0]
		for _, w := range sc.pieces[i:min(i+wordBatch, len(sc.pieces))] {
			ws = append(ws, w.s)
		}
		sc.words = ws
		dst = t.model.tokenizeWords(dst, ws, sc)
	}
	return dst
}

// VocabSize is the number of ids: the model's vocabulary plus the added
// tokens that are not in it.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// TokenID returns the id of a token (added tokens first, then the model's
// vocabulary, in its own form, for example "Ġthe" for byte-level BPE).
func (t *Tokenizer) TokenID(tok string) (uint32, bool) {
	if id, ok := t.added.byContent[tok]; ok {
		return id, true
	}
	id, ok := t.model.vocab[tok]
	return id, ok
}

// Token returns the text of an id as the vocabulary writes it.
func (t *Tokenizer) Token(id uint32) (string, bool) {
	if i, ok := t.added.byID[id]; ok {
		return t.added.tokens[i].content, true
	}
	if int(id) < len(t.model.idToTok) && t.model.idToTok[id] != "" {
		return t.model.idToTok[id], true
	}
	return "", false
}

// IsSpecial reports whether id is a special added token.
func (t *Tokenizer) IsSpecial(id uint32) bool { return t.added.isSpecial(id) }

// Config is what tokenizer_config.json said (zero when loaded without it).
func (t *Tokenizer) Config() Config { return t.cfg }

// BOS returns the id of the configured beginning-of-sequence token.
func (t *Tokenizer) BOS() (uint32, bool) {
	if t.cfg.BOSToken == "" {
		return 0, false
	}
	return t.TokenID(t.cfg.BOSToken)
}

// EOS returns the id of the configured end-of-sequence token.
func (t *Tokenizer) EOS() (uint32, bool) {
	if t.cfg.EOSToken == "" {
		return 0, false
	}
	return t.TokenID(t.cfg.EOSToken)
}

// ResetCaches empties the word and span caches (for cold measurements).
func (t *Tokenizer) ResetCaches() {
	if t.model.cache != nil {
		t.model.cache.reset()
	}
	if t.spans != nil {
		t.spans.reset()
	}
}
