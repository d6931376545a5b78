package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Options tunes a Tokenizer's caches and limits. The zero value gives the
// defaults; a negative cache size turns that cache off.
type Options struct {
	// WordCacheEntries bounds the cache of pre-tokenized words to their ids
	// (default 65,536 words; words of 256 bytes or more are never cached).
	WordCacheEntries int
	// SpanCacheTokens bounds the cache of long spans (text between added
	// tokens) by the total number of cached ids (default 1,048,576).
	SpanCacheTokens int
	// MinSpanBytes is the shortest span the span cache keeps (default 512).
	MinSpanBytes int

	// The fields below are read by LoadModel only.

	// ChatTemplate, when set, replaces the model's chat template with this
	// Jinja2 source; it is the only way to give a bare tokenizer.json one.
	ChatTemplate string
	// ChatContentFormat is vLLM's --chat-template-content-format: "auto"
	// (or empty) detects it from the template, "string" or "openai" force it.
	ChatContentFormat string
	// Now is the clock behind a chat template's strftime_now; nil means
	// time.Now. Pin it for reproducible renders.
	Now func() time.Time
}

const (
	defaultWordCacheEntries = 1 << 16
	defaultSpanCacheTokens  = 1 << 20
	defaultMinSpanBytes     = 512
)

// withDefaults validates o and fills in the defaults.
func (o Options) withDefaults() (Options, error) {
	if o.MinSpanBytes < 0 {
		return o, fmt.Errorf("options: MinSpanBytes must be zero (default) or positive, got %d", o.MinSpanBytes)
	}
	if o.WordCacheEntries == 0 {
		o.WordCacheEntries = defaultWordCacheEntries
	}
	if o.SpanCacheTokens == 0 {
		o.SpanCacheTokens = defaultSpanCacheTokens
	}
	if o.MinSpanBytes == 0 {
		o.MinSpanBytes = defaultMinSpanBytes
	}
	return o, nil
}

// Config holds what tokenizer_config.json says beyond tokenizer.json.
// Encode follows tokenizer.json (as the reference library does);
// Model.EncodeCompletion applies AddBOS/AddEOS as transformers does.
type Config struct {
	// AddBOS and AddEOS are add_bos_token and add_eos_token, nil when absent.
	AddBOS, AddEOS *bool
	// BOSToken and EOSToken are the tokens' text ("" when absent or null).
	BOSToken, EOSToken string
	// TokenizerClass is tokenizer_class, for example "Qwen2Tokenizer".
	TokenizerClass string
	// ChatTemplate is the raw chat_template field (a string, or a list of
	// {name, template} objects), nil when absent.
	ChatTemplate json.RawMessage
}

// LoadFile reads a tokenizer.json with default options.
func LoadFile(path string) (*Tokenizer, error) { return LoadFileOptions(path, Options{}) }

// LoadFileOptions reads a tokenizer.json.
func LoadFileOptions(path string, opts Options) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tokenizer: %w", err)
	}
	t, err := ParseOptions(data, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// LoadDir reads dir/tokenizer.json and, when present, dir/tokenizer_config.json
// (BOS/EOS flags and tokens, the chat template), with default options.
func LoadDir(dir string) (*Tokenizer, error) { return LoadDirOptions(dir, Options{}) }

// LoadDirOptions is LoadDir with options.
func LoadDirOptions(dir string, opts Options) (*Tokenizer, error) {
	t, err := LoadFileOptions(filepath.Join(dir, "tokenizer.json"), opts)
	if err != nil {
		return nil, err
	}
	cpath := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(cpath)
	if errors.Is(err, os.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read tokenizer config: %w", err)
	}
	cfg, err := parseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cpath, err)
	}
	t.cfg = cfg
	return t, nil
}

// Parse builds a Tokenizer from the bytes of a tokenizer.json, with default
// options.
func Parse(data []byte) (*Tokenizer, error) { return ParseOptions(data, Options{}) }

type fileJSON struct {
	Truncation    json.RawMessage  `json:"truncation"`
	Padding       json.RawMessage  `json:"padding"`
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         json.RawMessage  `json:"model"`
}

type addedTokenJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// ParseOptions builds a Tokenizer from the bytes of a tokenizer.json.
func ParseOptions(data []byte, opts Options) (*Tokenizer, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if !isNull(f.Truncation) {
		return nil, errors.New("tokenizer.json: truncation is not supported (set it to null)")
	}
	if !isNull(f.Padding) {
		return nil, errors.New("tokenizer.json: padding is not supported (set it to null)")
	}
	t := &Tokenizer{opts: opts}
	if t.norm, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if t.model, err = parseBPE(f.Model, t.pre.byteLevel != nil, opts.WordCacheEntries); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if t.added, err = newAddedVocab(f.AddedTokens, t.norm); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if t.decoder, err = parseDecoder(f.Decoder); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	var post affix
	if post, err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	t.prefix, t.suffix = post.prefix, post.suffix
	t.vocabSize = len(t.model.vocab)
	for _, a := range t.added.tokens {
		if _, ok := t.model.vocab[a.content]; !ok {
			t.vocabSize++
		}
	}
	if opts.SpanCacheTokens > 0 {
		t.spans = newSpanCache(opts.SpanCacheTokens)
	}
	t.positional = t.pre.positional()
	t.stream, t.streamOK = t.pre.stepper()
	return t, nil
}

func isNull(m json.RawMessage) bool {
	m = bytes.TrimSpace(m)
	return len(m) == 0 || string(m) == "null"
}

// componentType reads the "type" field of a component.
func componentType(m json.RawMessage) (string, error) {
	var h struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(m, &h); err != nil {
		return "", err
	}
	return h.Type, nil
}

// unsupported names a component this package does not implement.
func unsupported(component, typ string, supported ...string) error {
	return fmt.Errorf("%s type %q is not supported (supported: %s)", component, typ, strings.Join(supported, ", "))
}

// pattern is the {"String": ...} or {"Regex": ...} object of Split and Replace.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func parseConfig(data []byte) (Config, error) {
	var raw struct {
		AddBOS         *bool           `json:"add_bos_token"`
		AddEOS         *bool           `json:"add_eos_token"`
		BOS            json.RawMessage `json:"bos_token"`
		EOS            json.RawMessage `json:"eos_token"`
		TokenizerClass string          `json:"tokenizer_class"`
		ChatTemplate   json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Config{}, err
	}
	cfg := Config{AddBOS: raw.AddBOS, AddEOS: raw.AddEOS, TokenizerClass: raw.TokenizerClass}
	var err error
	if cfg.BOSToken, err = specialTokenText(raw.BOS); err != nil {
		return Config{}, fmt.Errorf("bos_token: %w", err)
	}
	if cfg.EOSToken, err = specialTokenText(raw.EOS); err != nil {
		return Config{}, fmt.Errorf("eos_token: %w", err)
	}
	if !isNull(raw.ChatTemplate) {
		cfg.ChatTemplate = append(json.RawMessage(nil), raw.ChatTemplate...)
	}
	return cfg, nil
}

// specialTokenText reads a token given as a string or as {"content": ...}.
func specialTokenText(m json.RawMessage) (string, error) {
	if isNull(m) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(m, &s); err == nil {
		return s, nil
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(m, &o); err != nil {
		return "", fmt.Errorf("want a string or an object with \"content\": %w", err)
	}
	return o.Content, nil
}
