package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/ardanlabs/jinja"
)

// Request is what a chat template is rendered from. JSON fields are kept
// as raw JSON so that object keys stay in request order all the way into
// the template (tojson of a tool schema prints them in that order).
type Request struct {
	// Messages holds one JSON object per message: role, content (a
	// string, null, or a list of content parts), and anything else the
	// client sent (tool_calls, tool_call_id, name, reasoning_content ...).
	Messages []json.RawMessage
	// Tools is the request's JSON array of tools, or nil.
	Tools json.RawMessage
	// Documents is a JSON array of documents for RAG templates, or nil.
	Documents json.RawMessage
	// AddGenerationPrompt appends the assistant turn's opening.
	// ParseRequest defaults it to true, as vLLM does.
	AddGenerationPrompt bool
	// ContinueFinalMessage ends the prompt inside the final message so
	// that the model continues it (transformers' continue_final_message).
	ContinueFinalMessage bool
	// ChatTemplateKwargs is a JSON object of extra template variables
	// (for example {"enable_thinking": false}), or nil.
	ChatTemplateKwargs json.RawMessage

	// parsed is ParseRequest's decoding of the fields above, nil for a
	// Request built by hand.
	parsed *parsedRequest
}

// ParseRequest reads an OpenAI /v1/chat/completions request body: messages,
// tools, documents, add_generation_prompt (default true, as in vLLM),
// continue_final_message and chat_template_kwargs. Other fields are
// ignored. Errors name the field to fix.
//
// The body is read once: the messages, tools, documents and kwargs are
// decoded into the values Render needs, so that rendering the request
// does not decode them again (Render still decodes any field changed since).
func ParseRequest(body []byte) (Request, error) {
	if req, ok := parseRequestFast(body); ok {
		return req, nil
	}
	// Errors, and valid bodies the single pass does not take (a repeated
	// field, very deep nesting), go the long way, which words the errors.
	return parseRequestSlow(body)
}

// parsedRequest is what ParseRequest decoded. Each value is kept with a
// private copy of the bytes it was decoded from: Render uses it only while
// the request's field holds exactly those bytes, and gives the template a
// copy, since templates can change lists and dicts (append, pop, update).
type parsedRequest struct {
	messages []decoded
	// tools, documents and chat_template_kwargs; src is nil when absent
	fields [3]decoded
}

// decoded is a JSON value's bytes and its decodeJSON.
type decoded struct {
	src []byte
	val jinja.Value
}

func (p *parsedRequest) message(i int) *decoded {
	if p == nil || i >= len(p.messages) {
		return nil
	}
	return &p.messages[i]
}

func (p *parsedRequest) tools() *decoded     { return p.field(0) }
func (p *parsedRequest) documents() *decoded { return p.field(1) }
func (p *parsedRequest) kwargs() *decoded    { return p.field(2) }

func (p *parsedRequest) field(i int) *decoded {
	if p == nil {
		return nil
	}
	return &p.fields[i]
}

// value returns decodeJSON(raw): a copy of d's value when d was decoded
// from the same bytes, else a fresh decode.
func (d *decoded) value(raw []byte) (jinja.Value, error) {
	if d != nil && d.src != nil && bytes.Equal(d.src, raw) {
		return cloneValue(d.val), nil
	}
	return decodeJSON(raw)
}

// parseRequestFast is ParseRequest in one pass over the body, for a valid
// request. It gives up (false) on anything else, and then
// parseRequestSlow decides; when it succeeds, parseRequestSlow would
// return the same fields (TestParseRequestFastMatchesSlow).
func parseRequestFast(body []byte) (Request, bool) {
	// src is private and never written: decoded strings share its memory
	// and Render compares fields with it. The fields point into pub.
	src := bytes.Clone(body)
	p := jsonParser{data: src, immutable: true}
	var (
		msgSpans []span
		msgVals  []jinja.Value
		fields   [3]span // tools, documents, chat_template_kwargs
		vals     [3]jinja.Value
		bools    [2]jinja.Value // add_generation_prompt, continue_final_message
		seen     [6]bool
	)
	p.space()
	if p.i >= len(src) || src[p.i] != '{' {
		return Request{}, false
	}
	p.i++
	p.space()
	if p.i < len(src) && src[p.i] == '}' {
		return Request{}, false // no messages
	}
	for {
		p.space()
		if p.i >= len(src) || src[p.i] != '"' {
			return Request{}, false
		}
		key, err := p.str()
		if err != nil {
			return Request{}, false
		}
		p.space()
		if p.i >= len(src) || src[p.i] != ':' {
			return Request{}, false
		}
		p.i++
		p.space()
		field := -1
		switch key {
		case "messages":
			field = 0
		case "tools":
			field = 1
		case "documents":
			field = 2
		case "chat_template_kwargs":
			field = 3
		case "add_generation_prompt":
			field = 4
		case "continue_final_message":
			field = 5
		}
		if field >= 0 {
			if seen[field] {
				return Request{}, false // the last one counts: leave it to the slow path
			}
			seen[field] = true
		}
		start := p.i
		if field == 0 {
			if msgSpans, msgVals, err = p.messages(); err != nil {
				return Request{}, false
			}
		} else {
			v, err := p.value(0)
			if err != nil {
				return Request{}, false
			}
			switch {
			case field >= 1 && field <= 3:
				fields[field-1], vals[field-1] = span{start, p.i}, v
			case field >= 4:
				bools[field-4] = v
			}
		}
		p.space()
		if p.i < len(src) && src[p.i] == ',' {
			p.i++
			continue
		}
		if p.i < len(src) && src[p.i] == '}' {
			p.i++
			break
		}
		return Request{}, false
	}
	p.space()
	if p.i != len(src) || len(msgSpans) == 0 {
		return Request{}, false
	}
	for _, m := range msgVals {
		if !validMessage(m) {
			return Request{}, false
		}
	}
	req := Request{AddGenerationPrompt: true}
	for i, want := range []func(jinja.Value) bool{jinja.Value.IsList, jinja.Value.IsList, jinja.Value.IsDict} {
		if v := vals[i]; seen[i+1] && !v.IsNone() && !want(v) {
			return Request{}, false
		}
	}
	for i, dst := range []*bool{&req.AddGenerationPrompt, &req.ContinueFinalMessage} {
		switch v := bools[i]; {
		case !seen[i+4], v.IsNone():
		case v.IsBool():
			*dst = v.AsBool()
		default:
			return Request{}, false
		}
	}

	pub := bytes.Clone(body)
	pr := &parsedRequest{messages: make([]decoded, len(msgSpans))}
	req.Messages = make([]json.RawMessage, len(msgSpans))
	for i, s := range msgSpans {
		req.Messages[i] = pub[s.start:s.end:s.end]
		pr.messages[i] = decoded{src: src[s.start:s.end:s.end], val: msgVals[i]}
	}
	for i, dst := range []*json.RawMessage{&req.Tools, &req.Documents, &req.ChatTemplateKwargs} {
		if !seen[i+1] || vals[i].IsNone() {
			continue
		}
		s := fields[i]
		*dst = pub[s.start:s.end:s.end]
		pr.fields[i] = decoded{src: src[s.start:s.end:s.end], val: vals[i]}
	}
	req.parsed = pr
	return req, true
}

// messages reads the messages array: each message must be an object. It
// returns each message's span and value.
func (p *jsonParser) messages() (spans []span, vals []jinja.Value, err error) {
	if p.i >= len(p.data) || p.data[p.i] != '[' {
		return nil, nil, p.errorf("expected an array")
	}
	p.i++
	p.space()
	if p.i < len(p.data) && p.data[p.i] == ']' {
		return nil, nil, p.errorf("empty array")
	}
	for {
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != '{' {
			return nil, nil, p.errorf("expected an object")
		}
		start := p.i
		v, err := p.value(0)
		if err != nil {
			return nil, nil, err
		}
		spans = append(spans, span{start, p.i})
		vals = append(vals, v)
		p.space()
		if p.i < len(p.data) && p.data[p.i] == ',' {
			p.i++
			continue
		}
		if p.i < len(p.data) && p.data[p.i] == ']' {
			p.i++
			return spans, vals, nil
		}
		return nil, nil, p.errorf("expected ',' or ']' in an array")
	}
}

// span is where a value lies in the body.
type span struct{ start, end int }

// validMessage is checkMessage on a decoded message: an object whose role
// is a string (or null, which encoding/json reads as "") and whose
// content, if set, is a string, null or an array.
func validMessage(m jinja.Value) bool {
	if !m.IsDict() {
		return false
	}
	role, ok := m.AsDict().Get("role")
	if !ok || !role.IsString() && !role.IsNone() {
		return false
	}
	c, ok := m.AsDict().Get("content")
	return !ok || c.IsNone() || c.IsString() || c.IsList()
}

// parseRequestSlow is ParseRequest with encoding/json; it words the errors.
func parseRequestSlow(body []byte) (Request, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return Request{}, fmt.Errorf("request body: must be a JSON object: %w", err)
	}
	if fields == nil {
		return Request{}, errors.New("request body: must be a JSON object, got null")
	}
	req := Request{AddGenerationPrompt: true}
	raw, ok := fields["messages"]
	if !ok || isNull(raw) {
		return Request{}, errors.New("messages: missing; send a non-empty array of message objects")
	}
	if err := json.Unmarshal(raw, &req.Messages); err != nil {
		return Request{}, fmt.Errorf("messages: must be an array of message objects: %w", err)
	}
	if len(req.Messages) == 0 {
		return Request{}, errors.New("messages: empty; send at least one message")
	}
	for i, m := range req.Messages {
		if err := checkMessage(m); err != nil {
			return Request{}, fmt.Errorf("messages[%d]%w", i, err)
		}
	}
	if raw, ok := fields["tools"]; ok && !isNull(raw) {
		if !isKind(raw, '[') {
			return Request{}, errors.New("tools: must be an array of tool objects or null")
		}
		req.Tools = raw
	}
	if raw, ok := fields["documents"]; ok && !isNull(raw) {
		if !isKind(raw, '[') {
			return Request{}, errors.New("documents: must be an array or null")
		}
		req.Documents = raw
	}
	for name, dst := range map[string]*bool{
		"add_generation_prompt":  &req.AddGenerationPrompt,
		"continue_final_message": &req.ContinueFinalMessage,
	} {
		if raw, ok := fields[name]; ok && !isNull(raw) {
			if err := json.Unmarshal(raw, dst); err != nil {
				return Request{}, fmt.Errorf("%s: must be true or false", name)
			}
		}
	}
	if raw, ok := fields["chat_template_kwargs"]; ok && !isNull(raw) {
		if !isKind(raw, '{') {
			return Request{}, errors.New("chat_template_kwargs: must be a JSON object or null")
		}
		req.ChatTemplateKwargs = raw
	}
	return req, nil
}

// checkMessage validates the shape ParseRequest promises; the error text
// continues "messages[i]".
func checkMessage(m json.RawMessage) error {
	var f map[string]json.RawMessage
	if err := json.Unmarshal(m, &f); err != nil || f == nil {
		return errors.New(": must be a JSON object with a role")
	}
	var role string
	if err := json.Unmarshal(f["role"], &role); err != nil {
		return errors.New(".role: must be a string such as \"user\"")
	}
	if c, ok := f["content"]; ok && !isNull(c) && !isKind(c, '"') && !isKind(c, '[') {
		return errors.New(".content: must be a string, null, or an array of content parts")
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

func isKind(raw json.RawMessage, first byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == first
}

// conversation is a request converted to template values the way vLLM's
// chat endpoint converts it (parse_chat_messages, tool model_dump).
type conversation struct {
	messages  jinja.Value
	tools     jinja.Value
	documents jinja.Value
	kwargs    *jinja.Dict
	// finalText is the text of the last message, for continue_final_message.
	finalText    string
	hasFinalText bool
}

// convert turns req into template values:
//   - each message becomes {role, content, then the message's other keys in
//     request order}; content is flattened to one string (text parts joined
//     by "\n", null becoming "") or, for ContentOpenAI, a list of
//     {"type": "text", "text": ...} and {"type": "image"|"audio"|"video"}
//     parts; a tool message's all-text parts are joined into one string;
//   - an assistant message's tool_calls are dropped when null or empty, and
//     each function.arguments given as a JSON string is parsed into its
//     value ({} when not valid JSON, or when null);
//   - an assistant message's reasoning (or reasoning_content) is exposed
//     under both names;
//   - each tool becomes vLLM's ChatCompletionToolsParam dump: {"type",
//     "function": {"name", "description", "parameters", then any other
//     keys}, then any other keys}, with null for a missing description or
//     parameters.
func convert(req Request, format ContentFormat) (conversation, error) {
	var c conversation
	msgs := make([]jinja.Value, len(req.Messages))
	for i, raw := range req.Messages {
		v, err := req.parsed.message(i).value(raw)
		if err != nil {
			return c, fmt.Errorf("messages[%d]: invalid JSON: %w", i, err)
		}
		m, text, hasText, err := convertMessage(v, format)
		if err != nil {
			return c, fmt.Errorf("messages[%d]%w", i, err)
		}
		msgs[i] = m
		if i == len(req.Messages)-1 {
			c.finalText, c.hasFinalText = text, hasText
		}
	}
	c.messages = jinja.NewList(msgs)
	c.tools = jinja.None()
	if len(req.Tools) > 0 && !isNull(req.Tools) {
		v, err := req.parsed.tools().value(req.Tools)
		if err != nil {
			return c, fmt.Errorf("tools: invalid JSON: %w", err)
		}
		if c.tools, err = convertTools(v); err != nil {
			return c, err
		}
	}
	c.documents = jinja.None()
	if len(req.Documents) > 0 && !isNull(req.Documents) {
		v, err := req.parsed.documents().value(req.Documents)
		if err != nil {
			return c, fmt.Errorf("documents: invalid JSON: %w", err)
		}
		if !v.IsList() {
			return c, fmt.Errorf("documents: must be an array, got %s", kindName(v))
		}
		c.documents = v
	}
	if len(req.ChatTemplateKwargs) > 0 && !isNull(req.ChatTemplateKwargs) {
		v, err := req.parsed.kwargs().value(req.ChatTemplateKwargs)
		if err != nil {
			return c, fmt.Errorf("chat_template_kwargs: invalid JSON: %w", err)
		}
		if !v.IsDict() {
			return c, fmt.Errorf("chat_template_kwargs: must be an object, got %s", kindName(v))
		}
		c.kwargs = v.AsDict()
	}
	return c, nil
}

// convertMessage converts one message; it also returns the text that
// continue_final_message continues (the content string, or the last text
// part). Errors continue "messages[i]".
func convertMessage(v jinja.Value, format ContentFormat) (jinja.Value, string, bool, error) {
	if !v.IsDict() {
		return v, "", false, fmt.Errorf(": must be an object, got %s", kindName(v))
	}
	in := v.AsDict()
	roleV := get(v, "role")
	if !roleV.IsString() {
		return v, "", false, fmt.Errorf(".role: must be a string, got %s", kindName(roleV))
	}
	role := roleV.AsString()

	var parts []jinja.Value
	contentV := get(v, "content")
	switch {
	case contentV.IsUndefined(), contentV.IsNone():
	case contentV.IsString():
		parts = []jinja.Value{contentV}
	case contentV.IsList():
		parts = contentV.AsList().Items
	default:
		return v, "", false, fmt.Errorf(".content: must be a string, null or an array of content parts, got %s", kindName(contentV))
	}

	var texts []string
	var out []jinja.Value
	for j, p := range parts {
		kind, text, err := contentPart(p)
		if err != nil {
			return v, "", false, fmt.Errorf(".content[%d]%w", j, err)
		}
		switch kind {
		case "":
			continue
		case "text":
			texts = append(texts, text)
			if format == ContentOpenAI {
				out = append(out, dictOf("type", jinja.NewString("text"), "text", jinja.NewString(text)))
			}
		default:
			if format == ContentOpenAI {
				out = append(out, dictOf("type", jinja.NewString(kind)))
			}
		}
	}
	var content jinja.Value
	if format == ContentOpenAI {
		if out == nil {
			out = []jinja.Value{}
		}
		content = jinja.NewList(out)
		if role == "tool" && len(out) == len(texts) {
			content = jinja.NewString(joinLines(texts))
		}
	} else {
		content = jinja.NewString(joinLines(texts))
	}
	// transformers continues the content string, or the last part that
	// has a text.
	finalText, hasFinal := "", false
	if content.IsString() {
		finalText, hasFinal = content.AsString(), true
	} else {
		for _, p := range slices.Backward(content.AsList().Items) {
			if t := get(p, "text"); t.IsString() {
				finalText, hasFinal = t.AsString(), true
				break
			}
		}
	}

	msg := jinja.NewDict()
	md := msg.AsDict()
	md.Set("role", roleV)
	md.Set("content", content)
	for _, k := range in.Keys {
		if k == "role" || k == "content" {
			continue
		}
		md.Set(k, in.Data[k])
	}
	if role == "assistant" {
		if err := convertToolCalls(md); err != nil {
			return v, "", false, err
		}
		r := get(v, "reasoning")
		if r.IsUndefined() || r.IsNone() {
			r = get(v, "reasoning_content")
		}
		if !r.IsUndefined() && !r.IsNone() {
			md.Set("reasoning", r)
			md.Set("reasoning_content", r)
		}
	}
	return msg, finalText, hasFinal, nil
}

// contentPart classifies one content part as vLLM's parser does: "text"
// with its text, a media modality ("image", "audio", "video"), or "" for a
// part to skip (a text part without text).
func contentPart(p jinja.Value) (kind, text string, err error) {
	if p.IsString() {
		return "text", p.AsString(), nil
	}
	if !p.IsDict() {
		return "", "", fmt.Errorf(": must be a string or an object with a type, got %s", kindName(p))
	}
	typ := get(p, "type")
	if typ.IsUndefined() || typ.IsNone() {
		for _, k := range []string{"image_url", "image_embeds", "audio_url", "input_audio", "audio_embeds", "video_url"} {
			if get(p, k).IsUndefined() {
				continue
			}
			return modality(k), "", nil
		}
		return "", "", errors.New(".type: missing; use \"text\", \"image_url\", \"input_audio\" or another part type")
	}
	if !typ.IsString() {
		return "", "", fmt.Errorf(".type: must be a string, got %s", kindName(typ))
	}
	switch t := typ.AsString(); t {
	case "text", "input_text", "output_text", "refusal", "thinking":
		key := "text"
		switch t {
		case "refusal":
			key = "refusal"
		case "thinking":
			key = "thinking"
		}
		tv := get(p, key)
		if tv.IsUndefined() || tv.IsNone() {
			return "", "", nil
		}
		if !tv.IsString() {
			return "", "", fmt.Errorf(".%s: must be a string, got %s", key, kindName(tv))
		}
		return "text", tv.AsString(), nil
	case "image_url", "input_image", "image_embeds", "image_pil", "audio_url", "input_audio", "audio_embeds", "video_url":
		return modality(t), "", nil
	default:
		return "", "", fmt.Errorf(".type: unsupported content part type %q; use text, image_url, input_audio, audio_url or video_url", t)
	}
}

func modality(partType string) string {
	switch partType {
	case "audio_url", "input_audio", "audio_embeds":
		return "audio"
	case "video_url":
		return "video"
	}
	return "image"
}

func joinLines(texts []string) string {
	switch len(texts) {
	case 0:
		return ""
	case 1:
		return texts[0]
	}
	n := len(texts) - 1
	for _, t := range texts {
		n += len(t)
	}
	b := make([]byte, 0, n)
	for i, t := range texts {
		if i > 0 {
			b = append(b, '\n')
		}
		b = append(b, t...)
	}
	return string(b)
}

// convertToolCalls applies vLLM's _postprocess_messages to an assistant
// message. Errors continue "messages[i]".
func convertToolCalls(md *jinja.Dict) error {
	tc, ok := md.Get("tool_calls")
	if !ok {
		return nil
	}
	if tc.IsNone() {
		deleteKey(md, "tool_calls")
		return nil
	}
	if !tc.IsList() {
		return fmt.Errorf(".tool_calls: must be an array or null, got %s", kindName(tc))
	}
	if tc.AsList().Len() == 0 {
		deleteKey(md, "tool_calls")
		return nil
	}
	calls := make([]jinja.Value, tc.AsList().Len())
	for j, call := range tc.AsList().Items {
		fn := get(call, "function")
		if !fn.IsDict() {
			return fmt.Errorf(".tool_calls[%d].function: must be an object with name and arguments, got %s", j, kindName(fn))
		}
		newFn := copyDict(fn.AsDict())
		args := get(fn, "arguments")
		switch {
		case args.IsString():
			parsed, err := decodeJSON([]byte(args.AsString()))
			if err != nil {
				parsed = jinja.NewDict()
			}
			newFn.AsDict().Set("arguments", parsed)
		case args.IsDict(), args.IsList():
		default:
			newFn.AsDict().Set("arguments", jinja.NewDict())
		}
		newCall := copyDict(call.AsDict())
		newCall.AsDict().Set("function", newFn)
		calls[j] = newCall
	}
	md.Set("tool_calls", jinja.NewList(calls))
	return nil
}

// convertTools dumps tools the way vLLM's pydantic ChatCompletionToolsParam
// does.
func convertTools(v jinja.Value) (jinja.Value, error) {
	if !v.IsList() {
		return v, fmt.Errorf("tools: must be an array, got %s", kindName(v))
	}
	out := make([]jinja.Value, v.AsList().Len())
	for i, t := range v.AsList().Items {
		if !t.IsDict() {
			return v, fmt.Errorf("tools[%d]: must be an object, got %s", i, kindName(t))
		}
		typ := get(t, "type")
		if typ.IsUndefined() {
			typ = jinja.NewString("function")
		}
		if !typ.IsString() || typ.AsString() != "function" {
			return v, fmt.Errorf("tools[%d].type: must be \"function\"", i)
		}
		fn := get(t, "function")
		if !fn.IsDict() {
			return v, fmt.Errorf("tools[%d].function: must be an object with a name, got %s", i, kindName(fn))
		}
		name := get(fn, "name")
		if !name.IsString() {
			return v, fmt.Errorf("tools[%d].function.name: must be a string, got %s", i, kindName(name))
		}
		nf := jinja.NewDict()
		nd := nf.AsDict()
		nd.Set("name", name)
		for _, k := range []string{"description", "parameters"} {
			val := get(fn, k)
			if val.IsUndefined() {
				val = jinja.None()
			}
			nd.Set(k, val)
		}
		if p := get(nf, "parameters"); !p.IsNone() && !p.IsDict() {
			return v, fmt.Errorf("tools[%d].function.parameters: must be an object or null, got %s", i, kindName(p))
		}
		if d := get(nf, "description"); !d.IsNone() && !d.IsString() {
			return v, fmt.Errorf("tools[%d].function.description: must be a string or null, got %s", i, kindName(d))
		}
		for _, k := range fn.AsDict().Keys {
			if !nd.Has(k) {
				nd.Set(k, fn.AsDict().Data[k])
			}
		}
		nt := jinja.NewDict()
		td := nt.AsDict()
		td.Set("type", typ)
		td.Set("function", nf)
		for _, k := range t.AsDict().Keys {
			if !td.Has(k) {
				td.Set(k, t.AsDict().Data[k])
			}
		}
		out[i] = nt
	}
	return jinja.NewList(out), nil
}

func dictOf(kv ...any) jinja.Value {
	d := jinja.NewDict()
	for i := 0; i+1 < len(kv); i += 2 {
		d.AsDict().Set(kv[i].(string), kv[i+1].(jinja.Value))
	}
	return d
}

func deleteKey(d *jinja.Dict, key string) {
	if !d.Has(key) {
		return
	}
	delete(d.Data, key)
	for i, k := range d.Keys {
		if k == key {
			d.Keys = append(d.Keys[:i:i], d.Keys[i+1:]...)
			break
		}
	}
}
