package chat

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// qwenLikeTemplate exercises tools, tool calls and tojson without needing
// the shared tokenizer files.
const qwenLikeTemplate = `{%- if tools %}{{- '<|im_start|>system\n' }}{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}{{- '<|im_end|>\n' }}{%- endif %}
{%- for message in messages %}
    {%- if message.role == "assistant" and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}`

// FuzzParseRender: no request body makes ParseRequest or Render panic, and
// a body that is not a JSON object is an error naming the request body.
func FuzzParseRender(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{\"x\":1}"}}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}],"continue_final_message":true,"add_generation_prompt":false}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":false}}`))
	f.Add([]byte(`[1,2`))
	f.Add([]byte(`{"messages":[[[[[[[[[[]]]]]]]]]]}`))
	if data, err := os.ReadFile(filepath.Join("testdata", "parity.json")); err == nil {
		if pf, err := parseParity(data); err == nil {
			for i, c := range pf.Cases {
				if i%7 == 0 {
					f.Add([]byte(c.Request))
				}
			}
		}
	}
	templates := []*Template{
		mustNew(f, qwenLikeTemplate, Options{EosToken: "<|im_end|>"}),
		mustNew(f, `{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}`, Options{BosToken: "<s>"}),
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := ParseRequest(body)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("empty error message")
			}
			trimmed := strings.TrimSpace(string(body))
			if !strings.HasPrefix(trimmed, "{") && !strings.HasPrefix(err.Error(), "request body") {
				t.Fatalf("non-object body %q: error %q does not name the request body", body, err)
			}
			return
		}
		for _, tmpl := range templates {
			_, _ = tmpl.Render(req)
		}
	})
}

// FuzzTemplateSource: no template source makes New or Render panic.
func FuzzTemplateSource(f *testing.F) {
	for _, s := range []string{qwenLikeTemplate, `{%- if x -%}A: {{ y }}{%- endif -%}`, "{% raw %}{{ a }}{% endraw %}", "a\r\n  {% if x %}\r\n{% endif %}\n", `{{ "\"" | tojson }}`, `{# c -#}  x`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := New(src, Options{})
		if err != nil {
			return
		}
		req := Request{Messages: nil, ChatTemplateKwargs: []byte(`{"x":true,"y":"v"}`)}
		_, _ = tmpl.Render(req)
	})
}

// FuzzDecodeJSON: the ordered decoder accepts exactly the JSON that
// encoding/json accepts, and decodes strings to the same text.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"\u00e9\ud83d\ude80"]}`, `"\ud800x"`, `-0.5e+3`, `01`, `[1,]`, "\"\xff\"", `{"a":1}x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := decodeJSON(data)
		if valid := json.Valid(data); valid != (err == nil) {
			t.Fatalf("decodeJSON(%q) error %v, but json.Valid = %v", data, err, valid)
		}
		var s string
		if err == nil && v.IsString() && json.Unmarshal(data, &s) == nil && s != v.AsString() {
			t.Fatalf("decodeJSON(%q) = %q, encoding/json says %q", data, v.AsString(), s)
		}
	})
}
