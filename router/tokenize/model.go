package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/inferrail/inferrail/engine/simtok"
	"github.com/inferrail/inferrail/router/tokenize/chat"
)

// Model bundles what a router needs to turn one model's requests into the
// token ids its engine (vLLM) will see: the tokenizer, the chat template,
// and the rule for special tokens on each endpoint. Build one with
// LoadModel. A Model is immutable and safe for concurrent use; repeated
// prompt pieces (a shared system prompt, earlier turns) are served from the
// tokenizer's span cache.
type Model struct {
	spec string
	enc  Encoder
	tok  *Tokenizer     // nil for builtin:sim
	tmpl *chat.Template // nil: the mock engine's template (sim) or none
	sim  bool
	// noTemplate says why the model has no chat template ("" when it has one).
	noTemplate string
	// prefix and suffix are what the completions endpoint adds around a
	// prompt (see completionAffix).
	prefix, suffix []uint32
}

// LoadModel loads the model named by spec:
//
//   - a model directory: tokenizer.json, and tokenizer_config.json with its
//     chat template, special tokens and add_bos_token/add_eos_token;
//   - a tokenizer.json path: no chat template (EncodeChat then fails, naming
//     the missing template) unless opts.ChatTemplate supplies one;
//   - "builtin:sim": the simulation tokenizer with the mock engine's chat
//     template (each message as "role: content\n", then "assistant: ").
//
// opts tunes the tokenizer's caches and, through ChatTemplate,
// ChatContentFormat and Now, the chat template.
func LoadModel(spec string, opts Options) (*Model, error) {
	if spec == BuiltinSim {
		m := &Model{spec: spec, enc: simEncoder{simtok.New()}, sim: true}
		if opts.ChatTemplate != "" {
			t, err := chat.New(opts.ChatTemplate, chat.Options{ContentFormat: opts.ChatContentFormat, Now: opts.Now})
			if err != nil {
				return nil, fmt.Errorf("chat template: %w", err)
			}
			m.tmpl = t
		}
		return m, nil
	}
	spec, st, err := locate(spec)
	if err != nil {
		return nil, err
	}
	m := &Model{spec: spec}
	var cfgData []byte
	if st.IsDir() {
		if _, err := os.Stat(filepath.Join(spec, "tokenizer.json")); err != nil {
			return nil, fmt.Errorf("model %q: the directory has no tokenizer.json: %w", spec, err)
		}
		if m.tok, err = LoadDirOptions(spec, opts); err != nil {
			return nil, err
		}
		cfgData, err = os.ReadFile(filepath.Join(spec, "tokenizer_config.json"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read tokenizer config: %w", err)
		}
	} else if m.tok, err = LoadFileOptions(spec, opts); err != nil {
		return nil, err
	}
	m.enc = m.tok
	if m.prefix, m.suffix, err = completionAffix(m.tok); err != nil {
		return nil, fmt.Errorf("model %q: %w", spec, err)
	}
	if m.tmpl, m.noTemplate, err = modelTemplate(spec, cfgData, st.IsDir(), opts); err != nil {
		return nil, err
	}
	return m, nil
}

// modelTemplate compiles the chat template of a model: opts.ChatTemplate
// if set, else the tokenizer_config.json's. With no template it returns
// nil and the reason, for EncodeChat's error.
func modelTemplate(spec string, cfgData []byte, isDir bool, opts Options) (*chat.Template, string, error) {
	if cfgData == nil {
		if opts.ChatTemplate == "" {
			why := fmt.Sprintf("model %q has no chat template (a tokenizer.json path carries none): load the model directory with its tokenizer_config.json, or pass a chat template (Options.ChatTemplate)", spec)
			if isDir {
				why = fmt.Sprintf("model %q has no chat template (the directory has no tokenizer_config.json): add one with a chat_template, or pass a chat template (Options.ChatTemplate)", spec)
			}
			return nil, why, nil
		}
		t, err := chat.New(opts.ChatTemplate, chat.Options{ContentFormat: opts.ChatContentFormat, Now: opts.Now})
		if err != nil {
			return nil, "", fmt.Errorf("chat template: %w", err)
		}
		return t, "", nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(cfgData, &fields); err != nil || fields == nil {
		return nil, "", fmt.Errorf("model %q: tokenizer_config.json must be a JSON object", spec)
	}
	if opts.ChatTemplate != "" {
		// Keep the config's special tokens, replace its template.
		src, err := json.Marshal(opts.ChatTemplate)
		if err != nil {
			return nil, "", fmt.Errorf("chat template: %w", err)
		}
		fields["chat_template"] = src
		if cfgData, err = json.Marshal(fields); err != nil {
			return nil, "", fmt.Errorf("chat template: %w", err)
		}
	} else if raw, ok := fields["chat_template"]; !ok || isNull(raw) {
		return nil, fmt.Sprintf("model %q has no chat template (its tokenizer_config.json has no chat_template): pass one (Options.ChatTemplate)", spec), nil
	}
	src, toolUse, copts, err := chat.ParseTokenizerConfig(cfgData)
	if err != nil {
		return nil, "", fmt.Errorf("model %q: %w", spec, err)
	}
	copts.ContentFormat, copts.Now = opts.ChatContentFormat, opts.Now
	t, err := chat.NewWithToolUse(src, toolUse, copts)
	if err != nil {
		return nil, "", fmt.Errorf("model %q: chat template: %w (set Options.ChatTemplate to replace it)", spec, err)
	}
	return t, "", nil
}

// completionAffix is what vLLM's completions endpoint adds around a prompt;
// the rule is EncodeCompletion's.
func completionAffix(t *Tokenizer) (prefix, suffix []uint32, err error) {
	cfg := t.Config()
	if !llamaStyle(cfg.TokenizerClass) {
		return t.prefix, t.suffix, nil
	}
	addBOS, addEOS := true, false
	if cfg.AddBOS != nil {
		addBOS = *cfg.AddBOS
	}
	if cfg.AddEOS != nil {
		addEOS = *cfg.AddEOS
	}
	if addBOS {
		if cfg.BOSToken == "" {
			return nil, nil, errors.New("tokenizer_config.json: add_bos_token is true but bos_token is not set: set bos_token, or add_bos_token to false")
		}
		id, ok := t.TokenID(cfg.BOSToken)
		if !ok {
			return nil, nil, fmt.Errorf("tokenizer_config.json: bos_token %q is not in the vocabulary: fix bos_token, or set add_bos_token to false", cfg.BOSToken)
		}
		prefix = []uint32{id}
	}
	if addEOS {
		if cfg.EOSToken == "" {
			return nil, nil, errors.New("tokenizer_config.json: add_eos_token is true but eos_token is not set: set eos_token, or add_eos_token to false")
		}
		id, ok := t.TokenID(cfg.EOSToken)
		if !ok {
			return nil, nil, fmt.Errorf("tokenizer_config.json: eos_token %q is not in the vocabulary: fix eos_token, or set add_eos_token to false", cfg.EOSToken)
		}
		suffix = []uint32{id}
	}
	return prefix, suffix, nil
}

// llamaStyle reports whether transformers rebuilds the post-processor of a
// tokenizer class from add_bos_token/add_eos_token (update_post_processor).
func llamaStyle(class string) bool {
	switch strings.TrimSuffix(class, "Fast") {
	case "LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer", "CohereTokenizer":
		return true
	}
	return false
}

// EncodeText tokenizes text as the engine's own output reads back: no
// special tokens added, no template. The proxy uses it to learn the blocks
// of an answer it streamed.
func (m *Model) EncodeText(text string) []uint32 { return m.enc.Encode(text, false) }

// Encoder returns the model's tokenizer as an Encoder.
func (m *Model) Encoder() Encoder { return m.enc }

// Tokenizer returns the Hugging Face tokenizer, nil for builtin:sim.
func (m *Model) Tokenizer() *Tokenizer { return m.tok }

// ChatTemplate returns the compiled chat template, nil when the model has
// none or uses the mock engine's (builtin:sim).
func (m *Model) ChatTemplate() *chat.Template { return m.tmpl }

// HasChatTemplate reports whether EncodeChat can render requests.
func (m *Model) HasChatTemplate() bool { return m.noTemplate == "" }

// CompletionAffix returns copies of the ids EncodeCompletion adds before
// and after a prompt.
func (m *Model) CompletionAffix() (prefix, suffix []uint32) {
	return append([]uint32(nil), m.prefix...), append([]uint32(nil), m.suffix...)
}

// EncodeCompletion returns the ids vLLM's /v1/completions endpoint feeds
// the engine for a text prompt: transformers' tokenizer(prompt,
// add_special_tokens=True), with tokenizer_config.json's add_bos_token and
// add_eos_token applied as transformers applies them:
//
//   - for the Llama-style classes (LlamaTokenizer, CodeLlamaTokenizer,
//     GemmaTokenizer, CohereTokenizer, with or without "Fast"),
//     transformers rebuilds the post-processor when it loads the tokenizer:
//     bos_token first when add_bos_token (default true), eos_token last when
//     add_eos_token (default false), nothing else;
//   - every other class (Qwen2Tokenizer, GPT2Tokenizer,
//     PreTrainedTokenizerFast, ...) uses tokenizer.json's post-processor as
//     written, and the two flags are advisory.
//
// For the shared models both readings agree with the reference library's
// add_special_tokens=true: BOS for Mistral-7B and Mistral-Nemo, nothing for
// Qwen2.5, Qwen3 and GPT-2. builtin:sim adds nothing.
func (m *Model) EncodeCompletion(prompt string) []uint32 {
	return m.AppendCompletion(nil, prompt)
}

// idsFor is the room to make for the ids of n bytes of text, so that a
// prompt's ids take one allocation, not a doubling series of them: with a
// real tokenizer one id per three bytes (English takes about four, rare
// words about three, and text denser in tokens, such as terse code, takes
// a second allocation); builtin:sim cuts at spaces, one id per four bytes
// (five or six bytes an English word, seven for its own).
func (m *Model) idsFor(n int) int {
	if m.sim {
		return n/4 + 8
	}
	return n/3 + 8
}

// AppendCompletion appends EncodeCompletion's ids to dst.
func (m *Model) AppendCompletion(dst []uint32, prompt string) []uint32 {
	return m.appendText(dst, prompt, true)
}

// appendText encodes text, with the completions endpoint's special tokens
// when addSpecial.
func (m *Model) appendText(dst []uint32, text string, addSpecial bool) []uint32 {
	dst = slices.Grow(dst, m.idsFor(len(text))+len(m.prefix)+len(m.suffix))
	if addSpecial {
		dst = append(dst, m.prefix...)
	}
	dst = m.enc.EncodeTo(dst, text, false)
	if addSpecial {
		dst = append(dst, m.suffix...)
	}
	return dst
}

// EncodeChat returns the ids vLLM's /v1/chat/completions endpoint feeds the
// engine for an OpenAI chat request body: the conversation rendered with
// the model's chat template, then tokenized with add_special_tokens false,
// or true when the body sets vLLM's "add_special_tokens": true. Errors say
// which field to fix, or that the model has no chat template.
func (m *Model) EncodeChat(body []byte) ([]uint32, error) {
	return m.AppendChat(nil, body, false)
}

// AppendChat is EncodeChat appending to dst; forceSpecialTokens adds the
// special tokens whatever the body says.
func (m *Model) AppendChat(dst []uint32, body []byte, forceSpecialTokens bool) ([]uint32, error) {
	if m.noTemplate != "" {
		return dst, m.noTemplateError()
	}
	req, err := chat.ParseRequest(body)
	if err != nil {
		return dst, err
	}
	flags, err := parseChatFlags(body)
	if err != nil {
		return dst, err
	}
	var text string
	if m.tmpl == nil { // the mock engine's template
		if flags.ContinueFinalMessage && flags.explicitAddGenerationPrompt && req.AddGenerationPrompt {
			return dst, errors.New("continue_final_message and add_generation_prompt are both true: set add_generation_prompt to false to continue the final message")
		}
		text, err = simRenderChat(req)
	} else {
		text, err = m.tmpl.Render(req)
	}
	if err != nil {
		return dst, err
	}
	return m.appendText(dst, text, forceSpecialTokens || flags.AddSpecialTokens), nil
}

// EncodeChatRequest is EncodeChat for a parsed request, with
// add_special_tokens false.
func (m *Model) EncodeChatRequest(req chat.Request) ([]uint32, error) {
	text, err := m.RenderChat(req)
	if err != nil {
		return nil, err
	}
	return m.appendText(nil, text, false), nil
}

// RenderChat renders a request with the model's chat template, as the
// engine sees it before tokenizing.
func (m *Model) RenderChat(req chat.Request) (string, error) {
	switch {
	case m.noTemplate != "":
		return "", m.noTemplateError()
	case m.tmpl == nil:
		return simRenderChat(req)
	}
	return m.tmpl.Render(req)
}

func (m *Model) noTemplateError() error { return errors.New(m.noTemplate) }

// chatFlags are the chat request fields that chat.Request does not carry.
type chatFlags struct {
	AddSpecialTokens     bool
	ContinueFinalMessage bool
	// explicitAddGenerationPrompt: the body set add_generation_prompt.
	explicitAddGenerationPrompt bool
}

// parseChatFlags reads vLLM's add_special_tokens (default false) and
// whether add_generation_prompt was set explicitly. Keys match exactly, as
// vLLM's request model matches them. It scans the top level of the body
// without decoding the messages again.
func parseChatFlags(body []byte) (chatFlags, error) {
	var f chatFlags
	err := scanObject(body, func(key, val []byte) error {
		switch string(key) {
		case "add_special_tokens":
			switch string(val) {
			case "true":
				f.AddSpecialTokens = true
			case "false", "null":
				f.AddSpecialTokens = false
			default:
				return errors.New("add_special_tokens: must be true or false")
			}
		case "add_generation_prompt":
			f.explicitAddGenerationPrompt = string(val) != "null"
		case "continue_final_message":
			f.ContinueFinalMessage = string(val) == "true"
		}
		return nil
	})
	return f, err
}

// scanObject calls f with each key (unescaped) and raw value (trimmed) of
// a JSON object, in order, without decoding the values.
func scanObject(b []byte, f func(key, val []byte) error) error {
	bad := errors.New("request body: must be a JSON object")
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return bad
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil
	}
	for i < len(b) {
		if b[i] != '"' {
			return bad
		}
		end := skipString(b, i)
		if end < 0 {
			return bad
		}
		key := b[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var k string
			if err := json.Unmarshal(b[i:end], &k); err != nil {
				return bad
			}
			key = []byte(k)
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return bad
		}
		i = skipSpace(b, i+1)
		vend := skipValue(b, i)
		if vend < 0 {
			return bad
		}
		if err := f(key, b[i:vend]); err != nil {
			return err
		}
		i = skipSpace(b, vend)
		if i >= len(b) {
			return bad
		}
		if b[i] == '}' {
			return nil
		}
		if b[i] != ',' {
			return bad
		}
		i = skipSpace(b, i+1)
	}
	return bad
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at b[i]
// (a quote), or -1.
func skipString(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		// The quote ends the string unless an odd run of backslashes
		// (each escaping the next) leads up to it.
		n := 0
		for b[j-1-n] == '\\' {
			n++
		}
		if n%2 == 0 {
			return j + 1
		}
	}
	return -1
}

// skipValue returns the index just past the value starting at b[i], or
// -1; it checks nesting, not the grammar of scalars.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				if i = skipString(b, i); i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// simRenderChat renders a request with builtin:sim's chat template, the
// mock engine's (simtok.RenderChat).
func simRenderChat(req chat.Request) (string, error) {
	msgs := make([]simtok.Message, len(req.Messages))
	for i, raw := range req.Messages {
		if err := json.Unmarshal(raw, &msgs[i]); err != nil {
			return "", fmt.Errorf("messages[%d]: must be an object with a string role: %w", i, err)
		}
	}
	return simtok.RenderChat(msgs, req.AddGenerationPrompt, req.ContinueFinalMessage)
}
