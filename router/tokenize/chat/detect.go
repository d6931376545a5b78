package chat

import (
	"strings"
)

// ContentFormat says how message content reaches the template, as vLLM's
// --chat-template-content-format "auto" resolves it.
type ContentFormat int

const (
	// ContentString flattens a message's text parts into one string joined
	// by "\n" (vLLM's default, for templates that print message.content).
	ContentString ContentFormat = iota
	// ContentOpenAI passes content as a list of parts such as
	// {"type": "text", "text": ...} and {"type": "image"}, for templates
	// that loop over message content.
	ContentOpenAI
)

// String returns vLLM's name for the format.
func (f ContentFormat) String() string {
	if f == ContentOpenAI {
		return "openai"
	}
	return "string"
}

// detectContentFormat is a textual port of vLLM's _detect_content_format,
// which walks the Jinja2 AST. It collects the names bound to the messages
// list ("messages" and any {% set x = <messages access> %}, transitively),
// then the loop variables of {% for m in <messages access> %}, and answers
// openai when some {% for p in m.content %} or m['content'] loop exists.
// An access is the name itself followed only by slices, filters and tests
// (messages[1:], messages | selectattr(...), ...); for the content loop the
// name is followed by .content or ['content'] first. Tags come from the
// same lexer that feeds the engine, so strings and comments cannot confuse
// it. Anything it does not recognise counts as no match, so the answer
// falls back to "string", vLLM's default.
func detectContentFormat(segs []lexSeg) ContentFormat {
	type assign struct{ target, rhs string }
	type loop struct{ target, iter string }
	var assigns []assign
	var loops []loop
	for _, s := range segs {
		if s.kind != tagBlock {
			continue
		}
		stmt := strings.TrimSpace(s.text)
		kw, rest, _ := strings.Cut(stmt, " ")
		rest = strings.TrimSpace(rest)
		switch kw {
		case "set":
			lhs, rhs, ok := cutTopLevel(rest, "=")
			lhs = strings.TrimSpace(lhs)
			if ok && isIdent(lhs) {
				assigns = append(assigns, assign{lhs, strings.TrimSpace(rhs)})
			}
		case "for":
			target, iter, ok := cutTopLevel(rest, " in ")
			target = strings.TrimSpace(target)
			if !ok || !isIdent(target) {
				continue
			}
			if it, _, found := cutTopLevel(iter, " if "); found {
				iter = it
			}
			iter = strings.TrimSpace(iter)
			iter = strings.TrimSpace(strings.TrimSuffix(iter, " recursive"))
			loops = append(loops, loop{target, iter})
		}
	}
	related := map[string]bool{"messages": true}
	queue := []string{"messages"}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		for _, a := range assigns {
			if !related[a.target] && isAccess(a.rhs, name, "") {
				related[a.target] = true
				queue = append(queue, a.target)
			}
		}
	}
	msgVars := map[string]bool{}
	for _, l := range loops {
		for name := range related {
			if isAccess(l.iter, name, "") {
				msgVars[l.target] = true
			}
		}
	}
	for _, l := range loops {
		for name := range msgVars {
			if isAccess(l.iter, name, "content") {
				return ContentOpenAI
			}
		}
	}
	return ContentString
}

// isAccess reports whether expr is name (then .key or ['key'] when key is
// set) followed only by slices, filters and tests.
func isAccess(expr, name, key string) bool {
	p := exprScanner{s: expr}
	if p.ident() != name {
		return false
	}
	if key != "" {
		p.space()
		switch {
		case p.eat("."):
			if p.ident() != key {
				return false
			}
		case p.eat("["):
			p.space()
			if lit := p.stringLit(); lit != key {
				return false
			}
			p.space()
			if !p.eat("]") {
				return false
			}
		default:
			return false
		}
	}
	for {
		p.space()
		switch {
		case p.done():
			return true
		case p.peek() == '[':
			inner, ok := p.balanced('[', ']')
			if !ok {
				return false
			}
			if _, _, slice := cutTopLevel(inner, ":"); !slice {
				return false
			}
		case p.eat("|"):
			p.space()
			if p.ident() == "" {
				return false
			}
			p.space()
			if p.peek() == '(' {
				if _, ok := p.balanced('(', ')'); !ok {
					return false
				}
			}
		case p.keyword("is"):
			p.space()
			p.keyword("not")
			p.space()
			if p.ident() == "" {
				return false
			}
			// A test's argument (is divisibleby 3, is sameas x) ends the
			// expression; vLLM only looks at the tested node.
			return true
		default:
			return false
		}
	}
}

type exprScanner struct {
	s string
	i int
}

func (p *exprScanner) done() bool { return p.i >= len(p.s) }

func (p *exprScanner) peek() byte {
	if p.done() {
		return 0
	}
	return p.s[p.i]
}

func (p *exprScanner) space() {
	for !p.done() && strings.IndexByte(" \t\n", p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *exprScanner) eat(tok string) bool {
	if strings.HasPrefix(p.s[p.i:], tok) {
		p.i += len(tok)
		return true
	}
	return false
}

func (p *exprScanner) keyword(kw string) bool {
	save := p.i
	if p.ident() == kw {
		return true
	}
	p.i = save
	return false
}

func (p *exprScanner) ident() string {
	start := p.i
	for !p.done() {
		c := p.s[p.i]
		if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || p.i > start && c >= '0' && c <= '9' {
			p.i++
			continue
		}
		break
	}
	return p.s[start:p.i]
}

func (p *exprScanner) stringLit() string {
	q := p.peek()
	if q != '\'' && q != '"' {
		return ""
	}
	end := strings.IndexByte(p.s[p.i+1:], q)
	if end < 0 {
		return ""
	}
	lit := p.s[p.i+1 : p.i+1+end]
	p.i += end + 2
	return lit
}

// balanced consumes an open...close group and returns its inside.
func (p *exprScanner) balanced(open, close byte) (string, bool) {
	depth := 0
	start := p.i
	for !p.done() {
		c := p.s[p.i]
		switch {
		case c == '\'' || c == '"':
			end := strings.IndexByte(p.s[p.i+1:], c)
			if end < 0 {
				return "", false
			}
			p.i += end + 1
		case c == open:
			depth++
		case c == close:
			depth--
			if depth == 0 {
				p.i++
				return p.s[start+1 : p.i-1], true
			}
		}
		p.i++
	}
	return "", false
}

// cutTopLevel cuts s around the first sep outside brackets and quotes.
func cutTopLevel(s, sep string) (before, after string, found bool) {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'' || c == '"':
			end := strings.IndexByte(s[i+1:], c)
			if end < 0 {
				return s, "", false
			}
			i += end + 1
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth--
		case depth == 0 && strings.HasPrefix(s[i:], sep):
			// "==" is not an assignment.
			if sep == "=" && (strings.HasPrefix(s[i:], "==") || i > 0 && strings.IndexByte("!<>=", s[i-1]) >= 0) {
				i++
				continue
			}
			return s[:i], s[i+len(sep):], true
		}
	}
	return s, "", false
}

func isIdent(s string) bool {
	p := exprScanner{s: s}
	return s != "" && p.ident() == s
}

// templateNames returns the identifiers used anywhere inside the
// template's tags: a superset of the variables Jinja2's
// meta.find_undeclared_variables reports, which vLLM uses to decide which
// chat_template_kwargs reach the template.
func templateNames(segs []lexSeg) map[string]bool {
	names := map[string]bool{}
	for _, s := range segs {
		if s.kind != tagVar && s.kind != tagBlock {
			continue
		}
		p := exprScanner{s: s.text}
		for !p.done() {
			c := p.peek()
			switch {
			case c == '\'' || c == '"':
				if p.stringLit() == "" && p.peek() == c {
					p.i++
				}
			case c == '.':
				// An attribute name is not a variable.
				p.i++
				p.space()
				p.ident()
			case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
				names[p.ident()] = true
			default:
				p.i++
			}
		}
	}
	return names
}
