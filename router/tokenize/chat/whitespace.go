package chat

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// This file applies Jinja2's whitespace rules to a template's source before
// the template engine sees it, so that the engine's own (slightly wrong)
// whitespace handling never runs.
//
// github.com/ardanlabs/jinja trims whitespace by searching for the nearest
// text segment, skipping over expression tags in between. For
// `{%- if x -%}A: {{ y }}{%- endif -%}` the `{%-` of endif reaches past
// `{{ y }}` and trims "A: " to "A:", where Jinja2 only strips the data
// directly before a tag. The same reach-over affects lstrip_blocks and
// trim_blocks. Rather than patch the engine, normalizeSource lexes the
// template the way Jinja2's lexer does (newline normalisation,
// keep_trailing_newline=False, "-" and "+" whitespace control,
// trim_blocks, lstrip_blocks, {% raw %}), computes each text run's final
// content, and writes the template back out with every whitespace-control
// sign removed and comments dropped. A text run that the engine's default
// lstrip/trim pass could still alter (one that starts with a newline or ends
// in a space, a tab or "{") is written as a string-literal expression, which
// the engine never trims. The result renders byte-identically under the
// engine with its defaults.

type tagKind int

const (
	tagText tagKind = iota
	tagVar
	tagBlock
	tagComment
	tagRaw // {% raw %}...{% endraw %}: its text is literal
)

type lexSeg struct {
	kind tagKind
	// text is the data (tagText, tagRaw) or the tag's inside without its
	// delimiters and signs.
	text string
	// leftSign and rightSign are '-', '+' or 0.
	leftSign, rightSign byte
	// closeNewline reports whether the match that closed this tag ended in
	// a newline (Jinja2's line_starting for the following data).
	closeNewline bool
}

// pyIsSpace reports whether r is whitespace for Python's str.isspace and
// the re module's \s on str patterns.
func pyIsSpace(r rune) bool {
	switch {
	case r == ' ', r >= '\t' && r <= '\r', r >= 0x1c && r <= 0x1f, r == 0x85, r == 0xa0, r == 0x2028, r == 0x2029:
		return true
	case r < 0x1680:
		return false
	}
	return unicode.Is(unicode.Zs, r)
}

func trimLeftPy(s string) string {
	return strings.TrimLeftFunc(s, pyIsSpace)
}

func trimRightPy(s string) string {
	return strings.TrimRightFunc(s, pyIsSpace)
}

// normalizeNewlines turns \r\n and \r into \n and drops one trailing
// newline, as Jinja2 does with keep_trailing_newline=False.
func normalizeNewlines(src string) string {
	if strings.IndexByte(src, '\r') >= 0 {
		src = strings.ReplaceAll(src, "\r\n", "\n")
		src = strings.ReplaceAll(src, "\r", "\n")
	}
	return strings.TrimSuffix(src, "\n")
}

// lexTemplate splits src into data and tags, applying the whitespace
// consumed by the closing side of each tag ("-%}" eats all following
// whitespace, "%}" one newline under trim_blocks) as Jinja2's lexer does.
func lexTemplate(src string) ([]lexSeg, error) {
	var segs []lexSeg
	i := 0
	for i < len(src) {
		open := indexTagOpen(src, i)
		if open < 0 {
			segs = append(segs, lexSeg{kind: tagText, text: src[i:]})
			break
		}
		if open > i {
			segs = append(segs, lexSeg{kind: tagText, text: src[i:open]})
		}
		seg := lexSeg{}
		var closer string
		switch src[open+1] {
		case '{':
			seg.kind, closer = tagVar, "}}"
		case '%':
			seg.kind, closer = tagBlock, "%}"
		default:
			seg.kind, closer = tagComment, "#}"
		}
		j := open + 2
		if j < len(src) && (src[j] == '-' || src[j] == '+') {
			seg.leftSign = src[j]
			j++
		}
		end, inner, err := findClose(src, j, closer, seg.kind == tagComment)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", 1+strings.Count(src[:open], "\n"), err)
		}
		// A sign directly before the closer.
		if n := len(inner); n > 0 && (inner[n-1] == '-' || inner[n-1] == '+' && seg.kind != tagVar) {
			seg.rightSign = inner[n-1]
			inner = inner[:n-1]
		}
		seg.text = inner
		i = end
		if seg.kind == tagBlock && strings.TrimSpace(inner) == "raw" {
			// Jinja2 applies no trim_blocks after {% raw %}.
			if seg.rightSign == '-' {
				i = skipSpace(src, i)
			}
			rawEnd, body, endSeg, err := findEndRaw(src, i)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", 1+strings.Count(src[:open], "\n"), err)
			}
			if endSeg.leftSign == '-' {
				body = trimRightPy(body)
			}
			seg = lexSeg{kind: tagRaw, text: body, leftSign: seg.leftSign, rightSign: endSeg.rightSign}
			i = rawEnd
		}
		i, seg.closeNewline = consumeAfter(src, i, seg)
		segs = append(segs, seg)
	}
	return segs, nil
}

// consumeAfter applies the closing side of a tag: "-" eats all following
// whitespace; a block or comment without a sign eats one newline
// (trim_blocks). It reports whether the consumed text ended in a newline.
func consumeAfter(src string, i int, seg lexSeg) (int, bool) {
	switch {
	case seg.rightSign == '-':
		j := skipSpace(src, i)
		return j, j > i && src[j-1] == '\n'
	case seg.rightSign == '+' || seg.kind == tagVar:
		return i, false
	case i < len(src) && src[i] == '\n':
		return i + 1, true
	}
	return i, false
}

func skipSpace(src string, i int) int {
	for i < len(src) {
		r, size := utf8.DecodeRuneInString(src[i:])
		if !pyIsSpace(r) {
			break
		}
		i += size
	}
	return i
}

// indexTagOpen finds the next "{{", "{%" or "{#" at or after i.
func indexTagOpen(src string, i int) int {
	for {
		k := strings.IndexByte(src[i:], '{')
		if k < 0 || i+k+1 >= len(src) {
			return -1
		}
		switch src[i+k+1] {
		case '{', '%', '#':
			return i + k
		}
		i += k + 1
	}
}

// findClose finds closer from j, skipping quoted strings inside
// expressions and statements. It returns the index after the closer and
// the text between j and the closer.
func findClose(src string, j int, closer string, comment bool) (int, string, error) {
	start := j
	for j < len(src) {
		c := src[j]
		if !comment && (c == '\'' || c == '"') {
			j++
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			j++
			continue
		}
		if c == closer[0] && j+1 < len(src) && src[j+1] == closer[1] {
			return j + 2, src[start:j], nil
		}
		j++
	}
	what := map[string]string{"}}": "expression", "%}": "statement", "#}": "comment"}[closer]
	return 0, "", fmt.Errorf("unclosed %s tag: add the missing %q", what, closer)
}

// findEndRaw finds the {% endraw %} that closes a raw block starting at i.
func findEndRaw(src string, i int) (end int, body string, endSeg lexSeg, err error) {
	for k := i; ; {
		open := strings.Index(src[k:], "{%")
		if open < 0 {
			return 0, "", lexSeg{}, fmt.Errorf("unclosed raw block: add {%% endraw %%}")
		}
		open += k
		j := open + 2
		var sign byte
		if j < len(src) && (src[j] == '-' || src[j] == '+') {
			sign = src[j]
			j++
		}
		closeAt, inner, cerr := findClose(src, j, "%}", true)
		if cerr == nil {
			var right byte
			if n := len(inner); n > 0 && (inner[n-1] == '-' || inner[n-1] == '+') {
				right = inner[n-1]
				inner = inner[:n-1]
			}
			if strings.TrimSpace(inner) == "endraw" {
				return closeAt, src[i:open], lexSeg{kind: tagBlock, leftSign: sign, rightSign: right}, nil
			}
		}
		k = open + 2
	}
}

// applyLeftStrip applies a tag's opening side to the data directly before
// it: "-" strips all trailing whitespace; lstrip_blocks (blocks, comments,
// raw, without "+") strips whitespace back to the start of the line when
// nothing else stands between the line start and the tag (Jinja2 3.1
// tests the run with \s+, so U+3000 counts, not only spaces and tabs).
func applyLeftStrip(text string, tag lexSeg, lineStarting bool) string {
	switch {
	case tag.leftSign == '-':
		return trimRightPy(text)
	case tag.leftSign == '+' || tag.kind == tagVar:
		return text
	}
	lpos := strings.LastIndexByte(text, '\n') + 1
	if lpos == 0 && !lineStarting {
		return text
	}
	if strings.TrimLeftFunc(text[lpos:], pyIsSpace) == "" {
		return text[:lpos]
	}
	return text
}

// normalizeSource rewrites src so that the engine's whitespace handling is
// a no-op and the render equals Jinja2's with trim_blocks and lstrip_blocks.
func normalizeSource(src string) (string, error) {
	segs, err := lexTemplate(normalizeNewlines(src))
	if err != nil {
		return "", err
	}
	var out strings.Builder
	out.Grow(len(src))
	lineStarting := true
	for i, s := range segs {
		switch s.kind {
		case tagText:
			text := s.text
			if i+1 < len(segs) {
				text = applyLeftStrip(text, segs[i+1], lineStarting)
			}
			writeText(&out, text)
		case tagRaw:
			writeLiteral(&out, s.text)
		case tagVar:
			out.WriteString("{{")
			out.WriteString(renameFilters(s.text))
			out.WriteString("}}")
		case tagBlock:
			out.WriteString("{%")
			out.WriteString(renameFilters(s.text))
			out.WriteString("%}")
		case tagComment:
			// Comments render nothing.
		}
		if s.kind != tagText {
			lineStarting = s.closeNewline
		}
	}
	return out.String(), nil
}

// writeText writes a final text run, as a literal when the engine's
// default trimming could touch it.
func writeText(out *strings.Builder, text string) {
	if text == "" {
		return
	}
	last := text[len(text)-1]
	if text[0] == '\n' || last == ' ' || last == '\t' || last == '{' {
		writeLiteral(out, text)
		return
	}
	out.WriteString(text)
}

// writeLiteral writes text as a {{ "..." }} expression using only the
// escapes the engine's string literals understand.
func writeLiteral(out *strings.Builder, text string) {
	if text == "" {
		return
	}
	out.WriteString(`{{ "`)
	for i := 0; i < len(text); i++ {
		switch c := text[i]; c {
		case '\\':
			out.WriteString(`\\`)
		case '"':
			out.WriteString(`\"`)
		case '\n':
			out.WriteString(`\n`)
		case '\t':
			out.WriteString(`\t`)
		default:
			out.WriteByte(c)
		}
	}
	out.WriteString(`" }}`)
}

// filterRenames maps filters whose engine built-in differs from
// transformers' to names the engine resolves from the render context
// (the engine looks a filter up among its built-ins first, then among the
// template variables).
var filterRenames = map[string]string{"tojson": toJSONFilterName}

const toJSONFilterName = "__chat_tojson"

// renameFilters rewrites "| name" in a tag's inside for the filters in
// filterRenames, leaving string literals alone.
func renameFilters(inner string) string {
	var out strings.Builder
	last := 0
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		if c == '\'' || c == '"' {
			end := strings.IndexByte(inner[i+1:], c)
			for end >= 0 && escaped(inner, i+1+end) {
				next := strings.IndexByte(inner[i+2+end:], c)
				if next < 0 {
					end = -1
					break
				}
				end += 1 + next
			}
			if end < 0 {
				break
			}
			i += end + 1
			continue
		}
		if c != '|' {
			continue
		}
		j := i + 1
		for j < len(inner) && (inner[j] == ' ' || inner[j] == '\t' || inner[j] == '\n') {
			j++
		}
		p := exprScanner{s: inner, i: j}
		name := p.ident()
		if repl, ok := filterRenames[name]; ok {
			out.WriteString(inner[last:j])
			out.WriteString(repl)
			last = p.i
		}
		i = p.i - 1
		if i < j {
			i = j - 1
		}
	}
	if last == 0 {
		return inner
	}
	out.WriteString(inner[last:])
	return out.String()
}

// escaped reports whether the byte at i is preceded by an odd number of
// backslashes.
func escaped(s string, i int) bool {
	n := 0
	for i > 0 && s[i-1] == '\\' {
		n++
		i--
	}
	return n%2 == 1
}
