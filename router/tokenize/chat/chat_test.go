package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ardanlabs/jinja"
	"pgregory.net/rapid"
)

func mustNew(t testing.TB, src string, opts Options) *Template {
	t.Helper()
	tmpl, err := New(src, opts)
	if err != nil {
		t.Fatalf("New(%q): %v", src, err)
	}
	return tmpl
}

func mustRender(t testing.TB, tmpl *Template, body string) string {
	t.Helper()
	req, err := ParseRequest([]byte(body))
	if err != nil {
		t.Fatalf("ParseRequest: %v", err)
	}
	out, err := tmpl.Render(req)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	return out
}

// The engine alone trims "A: " to "A:" here; Jinja2 (and this package)
// keep the space.
func TestWhitespaceWorkaround(t *testing.T) {
	src := `{%- if x -%}A: {{ y }}{%- endif -%}`
	raw, err := jinja.Compile(src)
	if err != nil {
		t.Fatal(err)
	}
	engineOut, err := raw.Render(map[string]any{"x": true, "y": "v"})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := mustNew(t, src, Options{})
	out := mustRender(t, tmpl, `{"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"x":true,"y":"v"}}`)
	if out != "A: v" {
		t.Fatalf("got %q, want %q (Jinja2)", out, "A: v")
	}
	if engineOut == out {
		t.Logf("the engine no longer has the whitespace bug (renders %q); the pre-pass is still correct", engineOut)
	}
}

func TestTojsonMatchesPython(t *testing.T) {
	tmpl := mustNew(t, `{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ tools | tojson(separators=(',', ':'), sort_keys=true) }}|{{ "é<&>" | tojson(ensure_ascii=true) }}`, Options{})
	out := mustRender(t, tmpl, `{"messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"z":1.0,"a":[1e21,1e-7,0.1,-0.0,5],"m":{}}}}]}`)
	want := `[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"z": 1.0, "a": [1e+21, 1e-07, 0.1, -0.0, 5], "m": {}}}}]|` +
		"{\n  \"type\": \"function\",\n  \"function\": {\n    \"name\": \"f\",\n    \"description\": null,\n    \"parameters\": {\n      \"z\": 1.0,\n      \"a\": [\n        1e+21,\n        1e-07,\n        0.1,\n        -0.0,\n        5\n      ],\n      \"m\": {}\n    }\n  }\n}|" +
		`[{"function":{"description":null,"name":"f","parameters":{"a":[1e+21,1e-07,0.1,-0.0,5],"m":{},"z":1.0}},"type":"function"}]|"\u00e9<&>"`
	if out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
}

func TestPyFloatRepr(t *testing.T) {
	for f, want := range map[float64]string{
		0: "0.0", 1: "1.0", -2.5: "-2.5", 1e16: "1e+16", 1234567890123456: "1234567890123456.0",
		0.0001: "0.0001", 0.00001: "1e-05", 1.5e-7: "1.5e-07", 1e22: "1e+22", 0.1: "0.1", 123.456: "123.456",
		math.Inf(1): "Infinity", math.MaxFloat64: "1.7976931348623157e+308",
	} {
		if got := pyFloatRepr(f); got != want {
			t.Errorf("pyFloatRepr(%v) = %q, want %q", f, got, want)
		}
	}
}

// Property: the Python-style repr parses back to the same float.
func TestPyFloatReprRoundTrips(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := rapid.Float64().Draw(t, "f")
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return
		}
		s := pyFloatRepr(f)
		back, err := strconv.ParseFloat(s, 64)
		if err != nil || back != f || math.Signbit(back) != math.Signbit(f) {
			t.Fatalf("pyFloatRepr(%v) = %q parses to %v (%v)", f, s, back, err)
		}
		if !strings.ContainsAny(s, ".e") {
			t.Fatalf("pyFloatRepr(%v) = %q lacks a '.' or exponent", f, s)
		}
	})
}

// Property: tojson of any string is JSON that decodes back to the string,
// and object keys keep insertion order through decodeJSON and tojson.
func TestJSONRoundTripKeepsOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		keys := rapid.SliceOfNDistinct(rapid.StringN(0, 8, -1), 0, 8, rapid.ID[string]).Draw(t, "keys")
		val := rapid.String().Draw(t, "val")
		var b strings.Builder
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			kj, _ := json.Marshal(k)
			vj, _ := json.Marshal(val)
			fmt.Fprintf(&b, "%s: %s", kj, vj)
		}
		b.WriteByte('}')
		v, err := decodeJSON([]byte(b.String()))
		if err != nil {
			t.Fatalf("decode %s: %v", b.String(), err)
		}
		if got := v.AsDict().Keys; fmt.Sprint(got) != fmt.Sprint(keys) && len(keys) > 0 {
			t.Fatalf("keys %q, want %q", got, keys)
		}
		out, err := filterToJSON([]jinja.Value{v}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var back map[string]string
		if err := json.Unmarshal([]byte(out.AsString()), &back); err != nil {
			t.Fatalf("tojson %q is not JSON: %v", out.AsString(), err)
		}
		for _, k := range keys {
			if back[k] != strings.ToValidUTF8(val, "\uFFFD") {
				t.Fatalf("key %q: %q, want %q", k, back[k], val)
			}
		}
	})
}

func TestRaiseExceptionCarriesMessage(t *testing.T) {
	tmpl := mustNew(t, `{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok`, Options{})
	req, err := ParseRequest([]byte(`{"messages":[{"role":"assistant","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmpl.Render(req)
	var te *TemplateError
	if !errors.As(err, &te) || te.Message != "first message must be from the user" {
		t.Fatalf("got %v, want a TemplateError with the template's message", err)
	}
}

func TestStrftimeNowUsesClock(t *testing.T) {
	clock := func() time.Time { return time.Date(2025, 3, 7, 14, 5, 9, 0, time.UTC) }
	tmpl := mustNew(t, `{{ strftime_now("%Y-%m-%d %H:%M:%S %d %b %Y %B %A %a %I%p %-d %j %y %%") }}`, Options{Now: clock})
	out := mustRender(t, tmpl, `{"messages":[{"role":"user","content":"q"}]}`)
	want := "2025-03-07 14:05:09 07 Mar 2025 March Friday Fri 02PM 7 066 25 %"
	if out != want {
		t.Fatalf("got %q, want %q", out, want)
	}
}

func TestContentFormatDetection(t *testing.T) {
	for src, want := range map[string]ContentFormat{
		`{% for m in messages %}{{ m.content }}{% endfor %}`:                                                 ContentString,
		`{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}`:                ContentOpenAI,
		`{% for m in messages %}{% for p in m['content'] | list %}{{ p }}{% endfor %}{% endfor %}`:           ContentOpenAI,
		`{% set ms = messages[1:] %}{% for m in ms %}{% for p in m["content"] %}x{% endfor %}{% endfor %}`:   ContentOpenAI,
		`{% for m in messages | selectattr('role') %}{% for p in m.content if p %}x{% endfor %}{% endfor %}`: ContentOpenAI,
		`{% for m in messages %}{% for p in m.content.split(' ') %}x{% endfor %}{% endfor %}`:                ContentString,
		`{% for m in other %}{% for p in m.content %}x{% endfor %}{% endfor %}`:                              ContentString,
		`{# {% for m in messages %}{% for p in m.content %} #}`:                                              ContentString,
	} {
		if got := mustNew(t, src, Options{}).ContentFormat(); got != want {
			t.Errorf("%s: detected %v, want %v", src, got, want)
		}
	}
	if _, err := New("x", Options{ContentFormat: "xml"}); err == nil {
		t.Error("ContentFormat xml accepted")
	}
}

func TestOpenAIContentParts(t *testing.T) {
	tmpl := mustNew(t, `{% for m in messages %}{% for p in m.content %}[{{ p.type }}:{{ p.text }}]{% endfor %}{% endfor %}`, Options{})
	out := mustRender(t, tmpl, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}},"b"]},{"role":"user","content":"c"},{"role":"user","content":null}]}`)
	if want := "[text:a][image:][text:b][text:c]"; out != want {
		t.Fatalf("got %q, want %q", out, want)
	}
}

func TestContinueFinalMessage(t *testing.T) {
	tmpl := mustNew(t, `{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}`, Options{})
	out := mustRender(t, tmpl, `{"add_generation_prompt":false,"continue_final_message":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":" Once upon "}]}`)
	if want := "<user>hi</user><assistant>Once upon"; out != want {
		t.Fatalf("got %q, want %q", out, want)
	}
	req, _ := ParseRequest([]byte(`{"continue_final_message":true,"messages":[{"role":"user","content":"x"}]}`))
	if _, err := tmpl.Render(req); err == nil || !strings.Contains(err.Error(), "add_generation_prompt") {
		t.Fatalf("continue_final_message with add_generation_prompt: %v", err)
	}
}

func TestFromTokenizerConfig(t *testing.T) {
	cfg := `{"bos_token":{"content":"<s>","lstrip":false},"eos_token":"</s>","pad_token":null,
		"chat_template":[{"name":"default","template":"{{ bos_token }}D{{ eos_token }}{{ pad_token is defined }}"},{"name":"tool_use","template":"T{{ tools | length }}"}]}`
	tmpl, err := FromTokenizerConfig([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if out := mustRender(t, tmpl, `{"messages":[{"role":"user","content":"q"}]}`); out != "<s>D</s>False" {
		t.Fatalf("default template: %q", out)
	}
	if out := mustRender(t, tmpl, `{"messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"f"}}]}`); out != "T1" {
		t.Fatalf("tool_use template: %q", out)
	}
	for _, bad := range []string{`{}`, `{"chat_template":[{"name":"x","template":"y"}]}`, `{"chat_template":5}`, `[`, `{"chat_template":"x","eos_token":5}`} {
		if _, err := FromTokenizerConfig([]byte(bad)); err == nil {
			t.Errorf("FromTokenizerConfig(%s) accepted", bad)
		}
	}
}

func TestKwargsFilteredAndMerged(t *testing.T) {
	tmpl := mustNew(t, `{{ flag }}|{{ add_generation_prompt }}|{{ bos_token }}`, Options{BosToken: "<s>"})
	out := mustRender(t, tmpl, `{"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"flag":"on","bos_token":"<B>","add_generation_prompt":false}}`)
	if out != "on|False|<B>" {
		t.Fatalf("got %q", out)
	}
	req, _ := ParseRequest([]byte(`{"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"messages":[]}}`))
	if _, err := tmpl.Render(req); err == nil {
		t.Fatal("chat_template_kwargs.messages accepted")
	}
}

func TestParseRequestErrorsNameTheField(t *testing.T) {
	for body, field := range map[string]string{
		`nope`:                           "request body",
		`null`:                           "request body",
		`{}`:                             "messages",
		`{"messages":[]}`:                "messages",
		`{"messages":{}}`:                "messages",
		`{"messages":[3]}`:               "messages[0]",
		`{"messages":[{"content":"x"}]}`: "messages[0].role",
		`{"messages":[{"role":"user","content":5}]}`:                   "messages[0].content",
		`{"messages":[{"role":"user"}],"tools":{}}`:                    "tools",
		`{"messages":[{"role":"user"}],"add_generation_prompt":"yes"}`: "add_generation_prompt",
		`{"messages":[{"role":"user"}],"continue_final_message":1}`:    "continue_final_message",
		`{"messages":[{"role":"user"}],"chat_template_kwargs":[]}`:     "chat_template_kwargs",
		`{"messages":[{"role":"user"}],"documents":"d"}`:               "documents",
	} {
		_, err := ParseRequest([]byte(body))
		if err == nil || !strings.HasPrefix(err.Error(), field) {
			t.Errorf("ParseRequest(%s) = %v, want an error naming %s", body, err, field)
		}
	}
	tmpl := mustNew(t, `x`, Options{})
	for body, field := range map[string]string{
		`{"messages":[{"role":"user","content":[{"type":"bogus"}]}]}`:                                 "messages[0].content[0].type",
		`{"messages":[{"role":"assistant","tool_calls":[{"id":"x"}]}]}`:                               "messages[0].tool_calls[0].function",
		`{"messages":[{"role":"user"}],"tools":[{"type":"function","function":{"description":"d"}}]}`: "tools[0].function.name",
		`{"messages":[{"role":"user"}],"tools":[5]}`:                                                  "tools[0]",
	} {
		req, err := ParseRequest([]byte(body))
		if err == nil {
			_, err = tmpl.Render(req)
		}
		if err == nil || !strings.HasPrefix(err.Error(), field) {
			t.Errorf("%s: %v, want an error naming %s", body, err, field)
		}
	}
}

func TestConcurrentRender(t *testing.T) {
	tmpl := mustNew(t, `{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ tools | tojson }}`, Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				body := fmt.Sprintf(`{"messages":[{"role":"user","content":"g%d-%d"}],"tools":[{"type":"function","function":{"name":"f%d"}}]}`, g, i, i)
				req, err := ParseRequest([]byte(body))
				if err != nil {
					errs <- err
					return
				}
				out, err := tmpl.Render(req)
				want := fmt.Sprintf(`user:g%d-%d;[{"type": "function", "function": {"name": "f%d", "description": null, "parameters": null}}]`, g, i, i)
				if err != nil || out != want {
					errs <- fmt.Errorf("got %q, %v; want %q", out, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestCompileErrors(t *testing.T) {
	for _, src := range []string{`{{ x`, `{% if x %}`, `{# open`, `{% raw %}x`} {
		if _, err := New(src, Options{}); err == nil {
			t.Errorf("New(%q) accepted", src)
		}
	}
}
