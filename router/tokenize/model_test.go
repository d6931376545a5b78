package tokenize

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/engine/simtok"
	"github.com/inferrail/inferrail/router/tokenize/chat"
)

// The chat parity fixtures (<name>.chat.oracle.json.gz) hold the reference
// library's ids for every conversation rendered in the chat package's
// golden file (chat/testdata/parity.json); both come from scripts:
// scripts/chat-fixtures/run.sh renders, scripts/tokenize-fixtures/run.sh
// (chat_oracle.js) tokenizes.

var templatedNames = []string{"qwen2_5", "qwen3", "mistral_nemo"}

type chatOracle struct {
	Oracle     string   `json:"oracle"`
	Model      string   `json:"model"`
	Renderer   string   `json:"renderer"`
	WithPrefix []uint32 `json:"with_prefix"`
	WithSuffix []uint32 `json:"with_suffix"`
	Cases      []struct {
		Name        string   `json:"name"`
		TextBytes   int      `json:"text_bytes"`
		IDs         []uint32 `json:"ids"`
		WithSpecial []uint32 `json:"with_special"`
	} `json:"cases"`
}

type chatGolden struct {
	FixtureDate    string            `json:"fixture_date"`
	ContentFormats map[string]string `json:"content_formats"`
	Cases          []struct {
		Template string          `json:"template"`
		Name     string          `json:"name"`
		Request  json.RawMessage `json:"request"`
		Text     *string         `json:"text"`
		Error    string          `json:"error"`
	} `json:"cases"`
}

func loadChatGolden(t testing.TB) chatGolden {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("chat", "testdata", "parity.json"))
	if err != nil {
		t.Fatalf("read chat golden file: %v (regenerate with scripts/chat-fixtures/run.sh)", err)
	}
	var g chatGolden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatalf("chat/testdata/parity.json: %v", err)
	}
	return g
}

// loadSharedModel loads a shared model directory with the golden file's
// clock and content format.
func loadSharedModel(t testing.TB, name string, g chatGolden) *Model {
	t.Helper()
	opts := Options{ChatContentFormat: g.ContentFormats[name]}
	if g.FixtureDate != "" {
		d, err := time.Parse("2006-01-02", g.FixtureDate)
		if err != nil {
			t.Fatalf("fixture_date: %v", err)
		}
		opts.Now = func() time.Time { return d }
	}
	m, err := LoadModel(filepath.Join(sharedDir(t), "tokenizers", name), opts)
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return m
}

// TestEncodeChatParity requires EncodeChat's ids to equal the reference
// library's on every rendered conversation of every templated model, with
// add_special_tokens false (vLLM's chat rule) and forced true; requests the
// template refuses must be refused.
func TestEncodeChatParity(t *testing.T) {
	if testing.Short() {
		t.Skip("loads three large vocabularies; skipped in -short")
	}
	g := loadChatGolden(t)
	for _, name := range templatedNames {
		t.Run(name, func(t *testing.T) {
			var o chatOracle
			readGzipJSON(t, filepath.Join("testdata", name+".chat.oracle.json.gz"), &o)
			m := loadSharedModel(t, name, g)
			byName := map[string]int{}
			for i, c := range o.Cases {
				byName[c.Name] = i
			}
			checked, refused := 0, 0
			for _, c := range g.Cases {
				if c.Template != name {
					continue
				}
				ids, err := m.EncodeChat(c.Request)
				if c.Text == nil {
					if err == nil {
						t.Errorf("%s: encoded a request the reference refuses (%s)", c.Name, c.Error)
					}
					refused++
					continue
				}
				i, ok := byName[c.Name]
				if !ok {
					t.Fatalf("%s: no oracle ids: regenerate with scripts/tokenize-fixtures/run.sh (CHAT_ONLY=1)", c.Name)
				}
				want := o.Cases[i]
				if err != nil {
					t.Errorf("%s: %v", c.Name, err)
					continue
				}
				if !slices.Equal(ids, want.IDs) {
					text, _ := renderCase(m, c.Request)
					t.Errorf("%s: rendered %d bytes (oracle %d)\n got %v\nwant %v", c.Name, len(text), want.TextBytes, trunc32(ids), trunc32(want.IDs))
					continue
				}
				wantWith := want.WithSpecial
				if wantWith == nil {
					wantWith = slices.Concat(o.WithPrefix, want.IDs, o.WithSuffix)
				}
				with, err := m.AppendChat(nil, c.Request, true)
				if err != nil || !slices.Equal(with, wantWith) {
					t.Errorf("%s with special tokens: got %v (%v), want %v", c.Name, trunc32(with), err, trunc32(wantWith))
				}
				checked++
			}
			if checked != len(o.Cases) || checked < 30 {
				t.Errorf("checked %d conversations, oracle has %d (want all, at least 30)", checked, len(o.Cases))
			}
			t.Logf("%s: %d conversations identical to %s (rendered by %s), %d refused as the reference refuses", name, checked, o.Oracle, o.Renderer, refused)
		})
	}
}

func renderCase(m *Model, body []byte) (string, error) {
	req, err := chat.ParseRequest(body)
	if err != nil {
		return "", err
	}
	return m.RenderChat(req)
}

// TestEncodeCompletionMatchesOracle: vLLM's completions rule (with the
// tokenizer_config.json flags) gives the reference library's
// add_special_tokens=true ids for the shared models.
func TestEncodeCompletionMatchesOracle(t *testing.T) {
	corpus := loadCorpus(t)
	for _, name := range testNames(tokenizerNames) {
		t.Run(name, func(t *testing.T) {
			m, err := LoadModel(filepath.Join(sharedDir(t), "tokenizers", name), Options{})
			if err != nil {
				t.Fatal(err)
			}
			o := loadOracle(t, name)
			for i := 0; i < len(corpus); i += 7 {
				want := o.WithSpecial[i]
				if want == nil {
					want = slices.Concat(o.WithPrefix, o.NoSpecial[i], o.WithSuffix)
				}
				if got := m.EncodeCompletion(corpus[i]); !slices.Equal(got, want) {
					t.Fatalf("string %d %q: got %v, want %v", i, trunc(corpus[i]), trunc32(got), trunc32(want))
				}
			}
		})
	}
}

// tinyTemplate is a small chat template over the tiny tokenizer's tokens.
const tinyTemplate = `{%- for m in messages %}{{ bos_token }}{{ m.role }}: {{ m.content }}<|end|>{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}`

// tinyModelDir writes the tiny tokenizer and, when cfg is not nil, a
// tokenizer_config.json into a fresh directory.
func tinyModelDir(t testing.TB, cfg map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tinyJSON(t, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		data, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestCompletionRule checks the add_bos_token/add_eos_token rule on the
// tiny tokenizer, whose tokenizer.json appends <|end|>.
func TestCompletionRule(t *testing.T) {
	tk := tiny(t)
	end, _ := tk.TokenID("<|end|>")
	x, _ := tk.TokenID("<x>")
	hello := tk.Encode("hello", false)
	for _, c := range []struct {
		name    string
		cfg     map[string]any
		want    []uint32
		wantErr string
	}{
		{"no config: tokenizer.json", nil, slices.Concat(hello, []uint32{end}), ""},
		{"llama defaults: bos only", map[string]any{"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<x>", "eos_token": "<|end|>"}, slices.Concat([]uint32{x}, hello), ""},
		{"llama flags", map[string]any{"tokenizer_class": "LlamaTokenizer", "add_bos_token": false, "add_eos_token": true, "bos_token": "<x>", "eos_token": map[string]any{"content": "<|end|>"}}, slices.Concat(hello, []uint32{end}), ""},
		{"llama both", map[string]any{"tokenizer_class": "GemmaTokenizerFast", "add_eos_token": true, "bos_token": "<x>", "eos_token": "<|end|>"}, slices.Concat([]uint32{x}, hello, []uint32{end}), ""},
		{"other classes: tokenizer.json", map[string]any{"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": true, "add_eos_token": false, "bos_token": "<x>"}, slices.Concat(hello, []uint32{end}), ""},
		{"qwen: tokenizer.json", map[string]any{"tokenizer_class": "Qwen2Tokenizer", "add_bos_token": false, "bos_token": nil}, slices.Concat(hello, []uint32{end}), ""},
		{"llama without bos_token", map[string]any{"tokenizer_class": "LlamaTokenizerFast"}, nil, "bos_token is not set"},
		{"llama unknown bos", map[string]any{"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<nope>"}, nil, "not in the vocabulary"},
		{"llama eos without eos_token", map[string]any{"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": false, "add_eos_token": true}, nil, "eos_token is not set"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := LoadModel(tinyModelDir(t, c.cfg), Options{})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := m.EncodeCompletion("hello"); !slices.Equal(got, c.want) {
				t.Errorf("EncodeCompletion = %v, want %v", got, c.want)
			}
			p, s := m.CompletionAffix()
			if got := slices.Concat(p, hello, s); !slices.Equal(got, c.want) {
				t.Errorf("CompletionAffix = %v, %v", p, s)
			}
		})
	}
}

func TestModelChatTemplateSources(t *testing.T) {
	cfg := map[string]any{"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<x>", "chat_template": tinyTemplate}
	tk := tiny(t)
	body := []byte(`{"messages":[{"role":"user","content":"hello"}]}`)

	m, err := LoadModel(tinyModelDir(t, cfg), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := tk.Encode("<x>user: hello<|end|>assistant:", false)
	if got, err := m.EncodeChat(body); err != nil || !slices.Equal(got, want) {
		t.Fatalf("EncodeChat = %v, %v; want %v", got, err, want)
	}
	if !m.HasChatTemplate() || m.ChatTemplate() == nil || m.Tokenizer() == nil {
		t.Error("a model directory with a chat_template has a template and a tokenizer")
	}

	// A bare tokenizer.json has no template: a clear error, unless supplied.
	path := filepath.Join(tinyModelDir(t, nil), "tokenizer.json")
	bare, err := LoadModel(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.EncodeChat(body); err == nil || !strings.Contains(err.Error(), "no chat template") || !strings.Contains(err.Error(), "ChatTemplate") {
		t.Errorf("bare tokenizer.json: err %v, want one naming the missing chat template and how to supply one", err)
	}
	if bare.HasChatTemplate() {
		t.Error("a bare tokenizer.json has no chat template")
	}
	supplied, err := LoadModel(path, Options{ChatTemplate: tinyTemplate})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := supplied.EncodeChat(body); err != nil || !slices.Equal(got, tk.Encode("user: hello<|end|>assistant:", false)) {
		t.Errorf("supplied template: %v, %v", got, err)
	}

	// A config without chat_template: the error names it; a supplied
	// template keeps the config's special tokens.
	delete(cfg, "chat_template")
	dir := tinyModelDir(t, cfg)
	noTmpl, err := LoadModel(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noTmpl.EncodeChat(body); err == nil || !strings.Contains(err.Error(), "no chat_template") {
		t.Errorf("config without chat_template: err %v", err)
	}
	withTmpl, err := LoadModel(dir, Options{ChatTemplate: tinyTemplate})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := withTmpl.EncodeChat(body); err != nil || !slices.Equal(got, want) {
		t.Errorf("supplied template over a config: %v, %v; want %v", got, err, want)
	}
	if _, err := LoadModel(dir, Options{ChatTemplate: "{% if %}"}); err == nil {
		t.Error("a template that does not compile must fail LoadModel")
	}
}

// TestChatAddSpecialTokens: vLLM's add_special_tokens field switches the
// completions rule on for a chat request.
func TestChatAddSpecialTokens(t *testing.T) {
	cfg := map[string]any{"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<x>", "chat_template": tinyTemplate}
	m, err := LoadModel(tinyModelDir(t, cfg), Options{})
	if err != nil {
		t.Fatal(err)
	}
	tk := m.Tokenizer()
	x, _ := tk.TokenID("<x>")
	plain := tk.Encode("<x>user: hi<|end|>assistant:", false)
	for _, c := range []struct {
		body  string
		force bool
		want  []uint32
		err   string
	}{
		{`{"messages":[{"role":"user","content":"hi"}]}`, false, plain, ""},
		{`{"messages":[{"role":"user","content":"hi"}],"add_special_tokens":false}`, false, plain, ""},
		{`{"messages":[{"role":"user","content":"hi"}],"add_special_tokens":null}`, false, plain, ""},
		{`{"messages":[{"role":"user","content":"hi"}],"add_special_tokens":true}`, false, slices.Concat([]uint32{x}, plain), ""},
		{`{"messages":[{"role":"user","content":"hi"}]}`, true, slices.Concat([]uint32{x}, plain), ""},
		{`{"messages":[{"role":"user","content":"hi"}],"add_special_tokens":"yes"}`, false, nil, "add_special_tokens: must be true or false"},
		{`{"messages":[]}`, false, nil, "messages"},
		{`[1,2]`, false, nil, "JSON object"},
	} {
		got, err := m.AppendChat(nil, []byte(c.body), c.force)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.body, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s (force %v): %v, %v; want %v", c.body, c.force, got, err, c.want)
		}
	}
	req, err := chat.ParseRequest([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.EncodeChatRequest(req); err != nil || !slices.Equal(got, plain) {
		t.Errorf("EncodeChatRequest = %v, %v", got, err)
	}
}

// engineRender renders as the mock engine does: its handler reads the
// messages into simtok.Message values and its own flags.
func engineRender(t *rapid.T, messages []byte, addGen, cont *bool) (string, error) {
	var msgs []simtok.Message
	if err := json.Unmarshal(messages, &msgs); err != nil {
		t.Fatalf("messages %s: %v", messages, err)
	}
	add := addGen == nil || *addGen
	c := cont != nil && *cont
	if add && c && addGen != nil {
		return "", fmt.Errorf("both set")
	}
	return simtok.RenderChat(msgs, add && !c, c)
}

// TestSimChatMatchesEngine: builtin:sim's chat template gives the same
// text, and so the same ids, as the mock engine's.
func TestSimChatMatchesEngine(t *testing.T) {
	m, err := LoadModel(BuiltinSim, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !m.HasChatTemplate() || m.Tokenizer() != nil {
		t.Fatal("builtin:sim has the mock engine's template and no Hugging Face tokenizer")
	}
	sim := simtok.New()
	optBool := rapid.Custom(func(t *rapid.T) *bool {
		switch rapid.IntRange(0, 2).Draw(t, "b") {
		case 0:
			return nil
		case 1:
			v := true
			return &v
		}
		v := false
		return &v
	})
	text := rapid.StringOfN(rapid.RuneFrom([]rune("ab \n:é🙂")), 0, 12, -1)
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 4).Draw(t, "n")
		msgs := make([]map[string]any, n)
		for i := range msgs {
			msg := map[string]any{"role": rapid.SampledFrom([]string{"user", "assistant", "system", "tool", ""}).Draw(t, "role")}
			switch rapid.IntRange(0, 4).Draw(t, "content") {
			case 0:
				msg["content"] = text.Draw(t, "text")
			case 1:
				msg["content"] = nil
			case 2: // no content
			case 3:
				parts := []any{}
				for range rapid.IntRange(0, 3).Draw(t, "parts") {
					parts = append(parts, map[string]any{"type": "text", "text": text.Draw(t, "part")})
				}
				msg["content"] = parts
			case 4:
				msg["content"] = []any{map[string]any{"type": "image_url", "image_url": map[string]any{"url": "x"}}}
			}
			msgs[i] = msg
		}
		addGen, cont := optBool.Draw(t, "add_generation_prompt"), optBool.Draw(t, "continue_final_message")
		body := map[string]any{"messages": msgs}
		if addGen != nil {
			body["add_generation_prompt"] = *addGen
		}
		if cont != nil {
			body["continue_final_message"] = *cont
		}
		data, _ := json.Marshal(body)
		mdata, _ := json.Marshal(msgs)
		want, werr := engineRender(t, mdata, addGen, cont)
		got, gerr := m.EncodeChat(data)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%s: engine err %v, model err %v", data, werr, gerr)
		}
		if werr == nil && !slices.Equal(got, sim.Encode(want)) {
			t.Fatalf("%s: ids %v, engine text %q", data, got, want)
		}
		if werr == nil {
			req, err := chat.ParseRequest(data)
			if err != nil {
				t.Fatal(err)
			}
			if text, err := m.RenderChat(req); err != nil || text != want {
				t.Fatalf("%s: RenderChat %q, %v; engine %q", data, text, err, want)
			}
		}
	})
}

// TestModelConcurrent encodes the same chats from many goroutines (run it
// with -race).
func TestModelConcurrent(t *testing.T) {
	m, err := LoadModel(tinyModelDir(t, map[string]any{"chat_template": tinyTemplate}), Options{MinSpanBytes: 8, SpanCacheTokens: 512})
	if err != nil {
		t.Fatal(err)
	}
	bodies := make([][]byte, 16)
	want := make([][]uint32, len(bodies))
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `{"messages":[{"role":"system","content":"hello world hello world"},{"role":"user","content":"aaaa %d hello"}]}`, i)
		if want[i], err = m.EncodeChat(bodies[i]); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for k := range 200 {
				i := (g + k) % len(bodies)
				got, err := m.EncodeChat(bodies[i])
				if err != nil || !slices.Equal(got, want[i]) {
					errs <- fmt.Errorf("body %d: %v, %v; want %v", i, got, err, want[i])
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestLoadModelErrors(t *testing.T) {
	if _, err := LoadModel("no/such/model", Options{}); err == nil || !strings.Contains(err.Error(), BuiltinSim) {
		t.Errorf("missing path: %v", err)
	}
	if _, err := LoadModel(t.TempDir(), Options{}); err == nil || !strings.Contains(err.Error(), "no tokenizer.json") {
		t.Errorf("empty directory: %v", err)
	}
	dir := tinyModelDir(t, nil)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`[1]`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadModel(dir, Options{}); err == nil {
		t.Error("a tokenizer_config.json that is not an object must be refused")
	}
	if _, err := LoadModel(BuiltinSim, Options{ChatTemplate: "{% for %}"}); err == nil {
		t.Error("builtin:sim with a broken template must be refused")
	}
	custom, err := LoadModel(BuiltinSim, Options{ChatTemplate: `{% for m in messages %}[{{ m.content }}]{% endfor %}`})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := custom.EncodeChat([]byte(`{"messages":[{"role":"user","content":"hi there"}]}`)); err != nil || !slices.Equal(got, simtok.New().Encode("[hi there]")) {
		t.Errorf("builtin:sim with a supplied template: %v, %v", got, err)
	}
}

// TestEncodeChat4MB renders and encodes one 4 MiB message (the time is a
// log line; BenchmarkEncodeChat4MB measures it).
func TestEncodeChat4MB(t *testing.T) {
	if testing.Short() {
		t.Skip("4 MiB chat skipped in -short")
	}
	m, err := LoadModel(tinyModelDir(t, map[string]any{"chat_template": tinyTemplate}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	body := bigChatBody(t, strings.Repeat("hello world 🙂 aaaa\n", (4<<20)/24))
	start := time.Now()
	ids, err := m.EncodeChat(body)
	t.Logf("4 MiB chat message: %d ids in %v (err %v)", len(ids), time.Since(start), err)
	if err != nil || len(ids) == 0 {
		t.Fatalf("no ids: %v", err)
	}
}

func bigChatBody(t testing.TB, content string) []byte {
	body, err := json.Marshal(map[string]any{"messages": []any{map[string]any{"role": "user", "content": content}}})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// FuzzEncodeChat: arbitrary bodies never panic; whatever is encoded equals
// the render encoded.
func FuzzEncodeChat(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hello"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"add_special_tokens":true}`,
		`{"messages":[{"role":"assistant","content":"he"}],"continue_final_message":true,"add_generation_prompt":false}`,
		`{"messages":[{"role":"user","content":"<|end|><x>"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"messages":null}`, `[]`, `{}`, `{"messages":[{"role":1}]}`, "\xff",
	} {
		f.Add([]byte(s))
	}
	m, err := LoadModel(tinyModelDir(f, map[string]any{"chat_template": tinyTemplate, "bos_token": "<x>"}), Options{})
	if err != nil {
		f.Fatal(err)
	}
	sim, err := LoadModel(BuiltinSim, Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, mm := range []*Model{m, sim} {
			ids, err := mm.EncodeChat(body)
			if err != nil {
				continue
			}
			req, err := chat.ParseRequest(body)
			if err != nil {
				t.Fatalf("EncodeChat accepted a body ParseRequest refuses: %v", err)
			}
			text, err := mm.RenderChat(req)
			if err != nil {
				continue // e.g. both generation flags on builtin:sim's default
			}
			flags, _ := parseChatFlags(body)
			if want := mm.appendText(nil, text, flags.AddSpecialTokens); !slices.Equal(ids, want) {
				t.Fatalf("EncodeChat = %v, render encoded = %v", ids, want)
			}
		}
	})
}

// TestScanObjectMatchesDecoder: the top-level scanner behind
// add_special_tokens sees the keys and values encoding/json sees.
func TestScanObjectMatchesDecoder(t *testing.T) {
	var value func(t *rapid.T, depth int) any
	value = func(t *rapid.T, depth int) any {
		kind := rapid.IntRange(0, 6).Draw(t, "kind")
		if depth > 2 && kind > 3 {
			kind = 0
		}
		switch kind {
		case 0:
			return rapid.String().Draw(t, "s")
		case 1:
			return rapid.Float64().Draw(t, "f")
		case 2:
			return rapid.Bool().Draw(t, "b")
		case 3:
			return nil
		case 4, 5:
			n := rapid.IntRange(0, 3).Draw(t, "n")
			l := make([]any, n)
			for i := range l {
				l[i] = value(t, depth+1)
			}
			return l
		}
		m := map[string]any{}
		for range rapid.IntRange(0, 3).Draw(t, "n") {
			m[rapid.String().Draw(t, "k")] = value(t, depth+1)
		}
		return m
	}
	rapid.Check(t, func(t *rapid.T) {
		obj := map[string]any{}
		for range rapid.IntRange(0, 5).Draw(t, "keys") {
			k := rapid.SampledFrom([]string{"add_special_tokens", "messages", "a\"b", "é\\", ""}).Draw(t, "key")
			obj[k] = value(t, 0)
		}
		data, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		if rapid.Bool().Draw(t, "indent") {
			data, _ = json.MarshalIndent(obj, " ", "\t")
		}
		var want map[string]json.RawMessage
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		if err := scanObject(data, func(k, v []byte) error { got[string(k)] = string(v); return nil }); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: keys %v, want %d", data, got, len(want))
		}
		for k, v := range want {
			if got[k] != string(v) {
				t.Fatalf("%s: key %q = %q, want %q", data, k, got[k], v)
			}
		}
	})
	for _, bad := range []string{``, `[]`, `{"a"}`, `{"a":}`, `{"a":1`, `{"a":"x}`, `{"a":1,}`, `{"a":[1}`, `nul`} {
		if err := scanObject([]byte(bad), func(k, v []byte) error { return nil }); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestEncodeCompletionOneAllocation: a prompt's ids take one allocation,
// sized from the text's length, with a real tokenizer on English and on
// the simulator's words (fewer bytes a token), and with builtin:sim.
func TestEncodeCompletionOneAllocation(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector are not the program's")
	}
	qwen, err := LoadModel(filepath.Join(sharedDir(t), "tokenizers", "qwen2_5"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := LoadModel(BuiltinSim, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := simtok.New()
	ids := make([]uint32, 256)
	for i := range ids {
		ids[i] = uint32(i * 97 % simtok.VocabSize)
	}
	prompts := map[string]string{
		"english": strings.Repeat("The quick brown fox jumps over the lazy dog, and then it rests. ", 30),
		"w6":      s.Decode(ids),
	}
	for name, p := range prompts {
		for mname, m := range map[string]*Model{"qwen2_5": qwen, "sim": sim} {
			m.EncodeCompletion(p) // warm the caches
			if n := testing.AllocsPerRun(20, func() { m.EncodeCompletion(p) }); n != 1 {
				t.Errorf("%s with %s: %v allocations a prompt, want 1", name, mname, n)
			}
		}
	}
}
