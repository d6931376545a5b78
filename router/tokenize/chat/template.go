package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// Options are the values transformers makes available to a chat template
// besides the conversation, and how content reaches it.
type Options struct {
	// Special tokens as the template sees them (bos_token, eos_token, ...).
	// An empty string leaves the variable undefined, as transformers does
	// for a token the tokenizer does not set.
	BosToken, EosToken, UnkToken, PadToken, SepToken, ClsToken, MaskToken string
	// AdditionalSpecialTokens is additional_special_tokens.
	AdditionalSpecialTokens []string
	// ContentFormat is vLLM's --chat-template-content-format: "auto" (or
	// empty) detects it from the template, "string" or "openai" force it.
	ContentFormat string
	// Now is the clock behind strftime_now; nil means time.Now. Pass a
	// fixed clock for reproducible renders.
	Now func() time.Time
}

// TemplateError is returned when the template calls raise_exception; its
// Message is the template's own text (for example Mistral's "conversation
// roles must alternate user/assistant/...").
type TemplateError struct {
	Message string
}

func (e *TemplateError) Error() string {
	return "chat template rejected the conversation: " + e.Message
}

// Template is a chat template compiled once and rendered many times. It is
// safe for concurrent use.
type Template struct {
	def     *compiled
	toolUse *compiled // used when the request has tools; may be nil
	base    map[string]jinja.Value
	now     func() time.Time
}

type compiled struct {
	tmpl   *jinja.Template
	format ContentFormat
	names  map[string]bool // identifiers the template uses
}

// hfParams are apply_chat_template's own parameters, which vLLM lets
// chat_template_kwargs set even when the template never names them.
var hfParams = []string{"add_generation_prompt", "continue_final_message", "tools", "documents"}

// New compiles a chat template source (Jinja2, as in tokenizer_config.json).
func New(source string, opts Options) (*Template, error) {
	c, err := compile(source, opts.ContentFormat)
	if err != nil {
		return nil, err
	}
	return newTemplate(c, nil, opts)
}

func newTemplate(def, toolUse *compiled, opts Options) (*Template, error) {
	t := &Template{def: def, toolUse: toolUse, now: opts.Now, base: map[string]jinja.Value{}}
	if t.now == nil {
		t.now = time.Now
	}
	for name, tok := range map[string]string{
		"bos_token": opts.BosToken, "eos_token": opts.EosToken, "unk_token": opts.UnkToken,
		"pad_token": opts.PadToken, "sep_token": opts.SepToken, "cls_token": opts.ClsToken,
		"mask_token": opts.MaskToken,
	} {
		if tok != "" {
			t.base[name] = jinja.NewString(tok)
		}
	}
	if opts.AdditionalSpecialTokens != nil {
		items := make([]jinja.Value, len(opts.AdditionalSpecialTokens))
		for i, s := range opts.AdditionalSpecialTokens {
			items[i] = jinja.NewString(s)
		}
		t.base["additional_special_tokens"] = jinja.NewList(items)
	}
	t.base["raise_exception"] = jinja.NewCallable("raise_exception", raiseException)
	t.base[toJSONFilterName] = jinja.NewCallable("tojson", filterToJSON)
	return t, nil
}

func compile(source, format string) (*compiled, error) {
	norm, err := normalizeSource(source)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	tmpl, err := jinja.Compile(norm)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	segs, err := lexTemplate(normalizeNewlines(source))
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	c := &compiled{tmpl: tmpl, names: templateNames(segs)}
	switch format {
	case "", "auto":
		c.format = detectContentFormat(segs)
	case "string":
		c.format = ContentString
	case "openai":
		c.format = ContentOpenAI
	default:
		return nil, fmt.Errorf("content format %q: use auto, string or openai", format)
	}
	return c, nil
}

func raiseException(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	msg := ""
	if len(args) > 0 {
		if args[0].IsString() {
			msg = args[0].AsString()
		} else {
			msg = args[0].String()
		}
	}
	return jinja.Undefined(), &TemplateError{Message: msg}
}

// ContentFormat reports how message content reaches the default template.
func (t *Template) ContentFormat() ContentFormat { return t.def.format }

// Render renders req as vLLM's chat endpoint would before tokenizing:
// messages converted as vLLM converts them (see Request), the template
// context holding messages, tools, documents, add_generation_prompt, the
// special tokens, strftime_now and raise_exception, then the request's
// chat_template_kwargs (only the keys the template uses or that
// apply_chat_template takes, as vLLM filters them; they may override the
// others). With ContinueFinalMessage the output is cut after the final
// message's text, as transformers does.
func (t *Template) Render(req Request) (string, error) {
	if req.ContinueFinalMessage && req.AddGenerationPrompt {
		return "", errors.New("continue_final_message and add_generation_prompt are both true: set add_generation_prompt to false to continue the final message")
	}
	c := t.def
	if t.toolUse != nil && len(req.Tools) > 0 && !isNull(req.Tools) {
		c = t.toolUse
	}
	conv, err := convert(req, c.format)
	if err != nil {
		return "", err
	}
	data := make(map[string]jinja.Value, len(t.base)+8)
	for k, v := range t.base {
		data[k] = v
	}
	now := t.now
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now: pass a format string such as \"%d %b %Y\"")
		}
		return jinja.NewString(strftime(args[0].AsString(), now())), nil
	})
	data["messages"] = conv.messages
	data["tools"] = conv.tools
	data["documents"] = conv.documents
	data["add_generation_prompt"] = jinja.NewBool(req.AddGenerationPrompt)
	continueFinal := req.ContinueFinalMessage
	if conv.kwargs != nil {
		for _, k := range conv.kwargs.Keys {
			v := conv.kwargs.Data[k]
			switch k {
			case "chat_template", "tokenize":
				continue
			case "messages", "conversation":
				return "", fmt.Errorf("chat_template_kwargs.%s: not allowed; send the conversation in messages", k)
			case "continue_final_message":
				continueFinal = v.IsTruthy()
				continue
			}
			if !c.names[k] && !isHFParam(k) {
				continue
			}
			data[k] = v
		}
	}
	out, err := c.tmpl.RenderValues(data)
	if err != nil {
		var te *TemplateError
		if errors.As(err, &te) {
			return "", te
		}
		return "", fmt.Errorf("render chat template: %w", err)
	}
	if continueFinal {
		return continueFinalMessage(out, conv)
	}
	return out, nil
}

func isHFParam(k string) bool {
	for _, p := range hfParams {
		if p == k {
			return true
		}
	}
	return false
}

// continueFinalMessage cuts rendered just after the final message's text,
// as transformers' render_jinja_template does.
func continueFinalMessage(rendered string, conv conversation) (string, error) {
	if !conv.hasFinalText {
		return "", errors.New("continue_final_message: the final message has no text to continue; give it text content")
	}
	final := conv.finalText
	stripped := trimRightPy(trimLeftPy(final))
	loc := strings.LastIndex(rendered, stripped)
	if loc < 0 {
		return "", errors.New("continue_final_message: the final message does not appear in the rendered chat; this template cannot continue it")
	}
	lstripped := trimLeftPy(final)
	if end := loc + len(lstripped); end <= len(rendered) && rendered[loc:end] == final {
		return rendered[:end], nil
	}
	return rendered[:loc+len(stripped)], nil
}

// ParseTokenizerConfig reads a tokenizer_config.json: the default chat
// template source (the chat_template string, or the entry named "default"
// in a list of {name, template}), the "tool_use" template when the list has
// one, and the special tokens (strings or {"content": ...} objects).
func ParseTokenizerConfig(data []byte) (source, toolUse string, opts Options, err error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil {
		return "", "", Options{}, fmt.Errorf("tokenizer_config.json: not a JSON object: %w", err)
	}
	raw, ok := cfg["chat_template"]
	if !ok || isNull(raw) {
		return "", "", Options{}, errors.New("tokenizer_config.json: no chat_template; this model has no chat template, pass one to New")
	}
	if err := json.Unmarshal(raw, &source); err != nil {
		var list []struct {
			Name     string `json:"name"`
			Template string `json:"template"`
		}
		if err := json.Unmarshal(raw, &list); err != nil {
			return "", "", Options{}, errors.New("tokenizer_config.json: chat_template must be a string or a list of {name, template}")
		}
		found := false
		for _, e := range list {
			switch e.Name {
			case "default":
				source, found = e.Template, true
			case "tool_use":
				toolUse = e.Template
			}
		}
		if !found {
			return "", "", Options{}, errors.New("tokenizer_config.json: chat_template list has no entry named \"default\"")
		}
	}
	for key, dst := range map[string]*string{
		"bos_token": &opts.BosToken, "eos_token": &opts.EosToken, "unk_token": &opts.UnkToken,
		"pad_token": &opts.PadToken, "sep_token": &opts.SepToken, "cls_token": &opts.ClsToken,
		"mask_token": &opts.MaskToken,
	} {
		if raw, ok := cfg[key]; ok {
			if *dst, err = tokenContent(raw); err != nil {
				return "", "", Options{}, fmt.Errorf("tokenizer_config.json: %s: %w", key, err)
			}
		}
	}
	if raw, ok := cfg["additional_special_tokens"]; ok && !isNull(raw) {
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil {
			return "", "", Options{}, errors.New("tokenizer_config.json: additional_special_tokens must be a list")
		}
		opts.AdditionalSpecialTokens = make([]string, len(list))
		for i, r := range list {
			if opts.AdditionalSpecialTokens[i], err = tokenContent(r); err != nil {
				return "", "", Options{}, fmt.Errorf("tokenizer_config.json: additional_special_tokens[%d]: %w", i, err)
			}
		}
	}
	return source, toolUse, opts, nil
}

// tokenContent reads a special token written as a string, null or an
// AddedToken object {"content": ...}.
func tokenContent(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", errors.New("must be a string or an object with a content string")
	}
	return *obj.Content, nil
}

// FromTokenizerConfig compiles the chat template of a tokenizer_config.json
// with its special tokens and the wall clock. To pin the clock or the
// content format, use ParseTokenizerConfig and NewWithToolUse.
func FromTokenizerConfig(data []byte) (*Template, error) {
	source, toolUse, opts, err := ParseTokenizerConfig(data)
	if err != nil {
		return nil, err
	}
	return NewWithToolUse(source, toolUse, opts)
}

// NewWithToolUse is New for a model with a second template that
// transformers picks when the request has tools ("tool_use" in
// tokenizer_config.json); an empty toolUse means none.
func NewWithToolUse(source, toolUse string, opts Options) (*Template, error) {
	def, err := compile(source, opts.ContentFormat)
	if err != nil {
		return nil, err
	}
	var tu *compiled
	if toolUse != "" {
		if tu, err = compile(toolUse, opts.ContentFormat); err != nil {
			return nil, fmt.Errorf("tool_use %w", err)
		}
	}
	return newTemplate(def, tu, opts)
}
