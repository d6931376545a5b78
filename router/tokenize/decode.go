package tokenize

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// decoder turns token strings back into text, one chain step at a time.
type decoder interface {
	decodeChain(toks []string) []string
}

func parseDecoder(m json.RawMessage) (decoder, error) {
	if isNull(m) {
		return nil, nil
	}
	typ, err := componentType(m)
	if err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	switch typ {
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "ByteFallback":
		return byteFallbackDecoder{}, nil
	case "Fuse":
		return fuseDecoder{}, nil
	case "Metaspace":
		var s struct {
			Replacement    string `json:"replacement"`
			PrependScheme  string `json:"prepend_scheme"`
			Split          *bool  `json:"split"`
			AddPrefixSpace *bool  `json:"add_prefix_space"`
		}
		if err := json.Unmarshal(m, &s); err != nil {
			return nil, fmt.Errorf("decoder Metaspace: %w", err)
		}
		ms, err := newMetaspace(s.Replacement, s.PrependScheme, s.AddPrefixSpace, s.Split)
		if err != nil {
			return nil, fmt.Errorf("decoder Metaspace: %w", err)
		}
		return metaspaceDecoder{ms}, nil
	case "Replace":
		var r struct {
			Pattern patternJSON `json:"pattern"`
			Content string      `json:"content"`
		}
		if err := json.Unmarshal(m, &r); err != nil {
			return nil, fmt.Errorf("decoder Replace: %w", err)
		}
		rp, err := newReplacer(r.Pattern, r.Content)
		if err != nil {
			return nil, fmt.Errorf("decoder Replace: %w", err)
		}
		return replaceDecoder{rp}, nil
	case "Strip":
		var s struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := json.Unmarshal(m, &s); err != nil {
			return nil, fmt.Errorf("decoder Strip: %w", err)
		}
		r, n := utf8.DecodeRuneInString(s.Content)
		if n == 0 || n != len(s.Content) || s.Start < 0 || s.Stop < 0 {
			return nil, fmt.Errorf("decoder Strip: content must be one character and start/stop non-negative, got %q, %d, %d", s.Content, s.Start, s.Stop)
		}
		return stripDecoder{r, s.Start, s.Stop}, nil
	case "Sequence":
		var s struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := json.Unmarshal(m, &s); err != nil {
			return nil, fmt.Errorf("decoder Sequence: %w", err)
		}
		var seq decoderSequence
		for _, c := range s.Decoders {
			d, err := parseDecoder(c)
			if err != nil {
				return nil, err
			}
			if d != nil {
				seq = append(seq, d)
			}
		}
		return seq, nil
	}
	return nil, unsupported("decoder", typ, "ByteLevel", "ByteFallback", "Fuse", "Metaspace", "Replace", "Strip", "Sequence")
}

// Decode returns the text of ids, skipping special added tokens when asked
// and ids that name no token, as the reference library does.
func (t *Tokenizer) Decode(ids []uint32, skipSpecial bool) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if i, ok := t.added.byID[id]; ok {
			a := &t.added.tokens[i]
			if skipSpecial && a.special {
				continue
			}
			if f, ok := t.added.decodeForm[id]; ok {
				toks = append(toks, f)
			} else {
				toks = append(toks, a.content)
			}
			continue
		}
		if int(id) < len(t.model.idToTok) && t.model.idToTok[id] != "" {
			toks = append(toks, t.model.idToTok[id])
		}
	}
	if t.decoder == nil {
		return strings.Join(toks, " ")
	}
	return strings.Join(t.decoder.decodeChain(toks), "")
}

type byteLevelDecoder struct{}

func (byteLevelDecoder) decodeChain(toks []string) []string {
	var buf []byte
	for _, t := range toks {
		start := len(buf)
		ok := true
		for _, r := range t {
			b, in := charBytes[r]
			if !in {
				ok = false
				break
			}
			buf = append(buf, b)
		}
		if !ok {
			buf = append(buf[:start], t...)
		}
	}
	return []string{lossy(buf)}
}

// lossy converts bytes to a string, invalid sequences becoming U+FFFD per
// maximal invalid subpart as Rust's from_utf8_lossy does.
func lossy(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			sb.WriteRune(utf8.RuneError)
			b = b[invalidPrefix(b):]
			continue
		}
		sb.Write(b[:n])
		b = b[n:]
	}
	return sb.String()
}

// invalidPrefix is the length of the maximal invalid subpart at the start
// of b (at least 1): a lead byte followed by the continuation bytes it
// accepts before the sequence breaks.
func invalidPrefix(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	i := 1
	for ; i <= need && i < len(b); i++ {
		if b[i] < lo || b[i] > hi {
			return i
		}
		lo, hi = 0x80, 0xBF
	}
	return i
}

type byteFallbackDecoder struct{}

func (byteFallbackDecoder) decodeChain(toks []string) []string {
	out := make([]string, 0, len(toks))
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range toks {
		if b, ok := fallbackByte(t); ok {
			pending = append(pending, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// fallbackByte parses "<0xAB>".
func fallbackByte(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	var v byte
	for _, c := range []byte(t[3:5]) {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= c - '0'
		case c >= 'a' && c <= 'f':
			v |= c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v |= c - 'A' + 10
		default:
			return 0, false
		}
	}
	return v, true
}

type fuseDecoder struct{}

func (fuseDecoder) decodeChain(toks []string) []string { return []string{strings.Join(toks, "")} }

type metaspaceDecoder struct{ m *metaspace }

func (d metaspaceDecoder) decodeChain(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		var b strings.Builder
		for _, r := range t {
			if r == d.m.repRune {
				if i == 0 && d.m.scheme != 2 {
					continue
				}
				b.WriteByte(' ')
				continue
			}
			b.WriteRune(r)
		}
		out[i] = b.String()
	}
	return out
}

type replaceDecoder struct{ r *replacer }

func (d replaceDecoder) decodeChain(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = d.r.normalize(t)
	}
	return out
}

type stripDecoder struct {
	content     rune
	start, stop int
}

func (d stripDecoder) decodeChain(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		rs := []rune(t)
		lo := 0
		for k := 0; k < d.start && k < len(rs) && rs[k] == d.content; k++ {
			lo = k + 1
		}
		hi := len(rs)
		for k := 0; k < d.stop; k++ {
			idx := len(rs) - k - 1
			if idx < 0 || rs[idx] != d.content {
				break
			}
			hi = idx
		}
		if hi < lo {
			hi = lo
		}
		out[i] = string(rs[lo:hi])
	}
	return out
}

type decoderSequence []decoder

func (q decoderSequence) decodeChain(toks []string) []string {
	for _, d := range q {
		toks = d.decodeChain(toks)
	}
	return toks
}
