package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// fastParseBodies are request bodies around the edges of ParseRequest's
// single pass: whitespace, escapes, repeated keys, nulls, odd roles and
// content, deep nesting, invalid UTF-8 and trailing data.
var fastParseBodies = []string{
	`{"messages":[{"role":"user","content":"hi"}]}`,
	" \t\r\n{ \"messages\" : [ { \"role\" : \"user\" , \"content\" : \"hi\" } , {\"role\":\"assistant\"} ] , \"tools\" : [ ] , \"documents\" : [ ] } \n",
	`{"messages":[{"role":"user","content":"hi"}],"messages":null}`,
	`{"messages":null,"messages":[{"role":"user","content":"hi"}]}`,
	`{"messages":[{"role":null}]}`,
	`{"messages":[{"role":"user","role":5}]}`,
	`{"messages":[{"role":5,"role":"user"}]}`,
	`{"messages":[{"role":"user","content":5,"content":"x"}]}`,
	`{"messages":[{"role":"user","content":{}}]}`,
	`{"messages":[{"role":"user","content":[1,{"type":"text","text":"a"}]}]}`,
	`{"messag\u0065s":[{"r\u006fle":"user","content":"\u00e9"}]}`,
	`{"messages":[{"role":"user","content":"a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude80\ud800x\udc00"}]}`,
	"{\"messages\":[{\"role\":\"user\",\"content\":\"bad \xff\xfe utf-8 \xe4\\n\xe4\xb8\"}]}",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"tab\there\"}]}",
	`{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":null,"continue_final_message":null}`,
	`{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false,"continue_final_message":true}`,
	`{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false,"add_generation_prompt":null}`,
	`{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":"false"}`,
	`{"messages":[{"role":"user","content":"x"}],"continue_final_message":0}`,
	`{"messages":[{"role":"user","content":"x"}],"tools":null,"documents":null,"chat_template_kwargs":null}`,
	`{"messages":[{"role":"user","content":"x"}],"tools":{},"documents":[]}`,
	`{"messages":[{"role":"user","content":"x"}],"documents":"d"}`,
	`{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":false,"a":[1,2.5,-0,1e400]}}`,
	`{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]}`,
	`{"model":"m","temperature":0.5,"stream":true,"n":-1e5,"x":null,"meta":{"a":[{},[],""]},"messages":[{"role":"user","content":"x"}]}`,
	`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]}`,
	`{"messages":[{"role":"user","content":"x"}]} x`,
	`{"messages":[{"role":"user","content":"x"}],}`,
	`{"messages":[{"role":"user","content":"x"},]}`,
	`{"messages":[{"role":"user","content":"x"}]`,
	`{"messages":[{"role":"user","content":"x}]}`,
	`{"messages":[{"role":"user","content":01}]}`,
	`{"messages":[]}`,
	`{"messages":[null]}`,
	`{"messages":{}}`,
	`{}`,
	`null`,
	`[]`,
	``,
	`{"messages":[{"role":"user","content":"x"}],"deep":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`,
	`{"messages":[{"role":"user","content":"x","deep":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}]}`,
	`{"messages":[{"role":"user","content":"x","deep":` + strings.Repeat("[", 500) + strings.Repeat("]", 500) + `}]}`,
}

// mutatingTemplate changes the values it is given, so that a render that
// reused ParseRequest's values instead of copies would show it next time.
const mutatingTemplate = `{%- for m in messages %}{{ m.role }}:{{ m.content }}{% if m.meta is defined %}{% set _ = m.meta.update({"seen": true}) %}{{ m.meta | tojson }}{% set _ = m.meta.tags.append(1) %}{{ m.meta.tags | length }}{% endif %}
{% endfor %}{% set _ = messages.append(messages[0]) %}{{ messages | length }}{% if tools %}{% set _ = tools[0].function.parameters.update({"z": 0}) %}{{ tools | tojson }}{% endif %}{% if documents %}{% set _ = documents.pop() %}{{ documents | length }}{% endif %}{% if extra is defined %}{% set _ = extra.append(2) %}{{ extra | tojson }}{% endif %}`

func fastParseTemplates(t testing.TB) []*Template {
	return []*Template{
		mustNew(t, qwenLikeTemplate, Options{EosToken: "<|im_end|>"}),
		mustNew(t, `{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}`, Options{ContentFormat: "openai"}),
		mustNew(t, mutatingTemplate, Options{}),
	}
}

// checkFastParse checks that parseRequestFast, when it takes a body,
// returns what parseRequestSlow returns, and that rendering with its
// decoded values gives what rendering the raw fields gives, twice.
func checkFastParse(t testing.TB, body []byte, templates []*Template) {
	t.Helper()
	orig := bytes.Clone(body)
	fast, ok := parseRequestFast(body)
	if !bytes.Equal(body, orig) {
		t.Fatalf("parseRequestFast wrote to the body %q", orig)
	}
	slow, err := parseRequestSlow(body)
	if !ok {
		return
	}
	if err != nil {
		t.Fatalf("parseRequestFast took %q, parseRequestSlow: %v", body, err)
	}
	plain := fast
	plain.parsed = nil
	if !reflect.DeepEqual(plain, slow) {
		t.Fatalf("%q: parseRequestFast = %+v, parseRequestSlow = %+v", body, plain, slow)
	}
	for _, tmpl := range templates {
		want, wantErr := tmpl.Render(slow)
		for range 2 {
			got, err := tmpl.Render(fast)
			if got != want || fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Fatalf("%q: render from decoded values %q, %v; from raw fields %q, %v", body, got, err, want, wantErr)
			}
		}
	}
}

func TestParseRequestFastMatchesSlow(t *testing.T) {
	templates := fastParseTemplates(t)
	taken := 0
	for _, body := range fastParseBodies {
		if _, ok := parseRequestFast([]byte(body)); ok {
			taken++
		}
		checkFastParse(t, []byte(body), templates)
	}
	pf := loadParity(t)
	for _, c := range pf.Cases {
		checkFastParse(t, c.Request, templates)
	}
	mutated := `{"messages":[{"role":"user","content":"a","meta":{"tags":[]}},{"role":"assistant","content":"b","meta":{"tags":[0]}}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"documents":[{"t":1},{"t":2}],"chat_template_kwargs":{"extra":[1]}}`
	if _, ok := parseRequestFast([]byte(mutated)); !ok {
		t.Fatal("parseRequestFast left a valid request to the slow path")
	}
	checkFastParse(t, []byte(mutated), templates)
	if taken < 15 {
		t.Fatalf("parseRequestFast took only %d of the edge-case bodies", taken)
	}
}

// TestRenderSeesChangedFields: a field changed after ParseRequest, in place
// or replaced, is rendered from its new bytes.
func TestRenderSeesChangedFields(t *testing.T) {
	tmpl := mustNew(t, `{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ tools | tojson }}|{{ documents | tojson }}|{{ x }}`, Options{})
	req, err := ParseRequest([]byte(`{"messages":[{"role":"user","content":"abc"},{"role":"user","content":"def"}],"tools":[{"type":"function","function":{"name":"f"}}],"documents":[1],"chat_template_kwargs":{"x":"k"}}`))
	if err != nil {
		t.Fatal(err)
	}
	copy(req.Messages[0][bytes.Index(req.Messages[0], []byte("abc")):], "xyz")
	req.Messages[1] = json.RawMessage(`{"role":"system","content":"new"}`)
	req.Messages = append(req.Messages, json.RawMessage(`{"role":"user","content":"more"}`))
	req.Tools = json.RawMessage(`[{"type":"function","function":{"name":"g"}}]`)
	req.Documents[1] = '2'
	req.ChatTemplateKwargs = json.RawMessage(`{"x":"k2"}`)
	got, err := tmpl.Render(req)
	want := `user:xyz;system:new;user:more;[{"type": "function", "function": {"name": "g", "description": null, "parameters": null}}]|[2]|k2`
	if err != nil || got != want {
		t.Fatalf("got %q, %v; want %q", got, err, want)
	}
}

func TestPlainLen(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []byte{'a', ' ', 0x7f, 0x80, 0xff, 0xe4, '"', '\\', 0x00, 0x1f, 0x20, 0x21, 0x5b, 0x5d}
	for range 20000 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			if rng.IntN(8) == 0 {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			} else {
				b[i] = byte(0x20 + rng.IntN(0x60))
				if b[i] == '"' || b[i] == '\\' {
					b[i] = 'x'
				}
			}
		}
		want, wantASCII := 0, true
		for want < len(b) && b[want] != '"' && b[want] != '\\' && b[want] >= 0x20 {
			wantASCII = wantASCII && b[want] < 0x80
			want++
		}
		if got, ascii := plainLen(b); got != want || ascii != wantASCII {
			t.Fatalf("plainLen(%q) = %d, %v; want %d, %v", b, got, ascii, want, wantASCII)
		}
	}
}

func TestValidUTF8(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	edges := []byte{0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0, 0xed, 0xee, 0xef, 0xf0, 0xf3, 0xf4, 0xf5, 0xff}
	for range 200000 {
		b := make([]byte, rng.IntN(24))
		for i := range b {
			switch rng.IntN(4) {
			case 0:
				b[i] = edges[rng.IntN(len(edges))]
			case 1:
				b[i] = byte(rng.IntN(256))
			default:
				b[i] = 'a'
			}
		}
		if rng.IntN(2) == 0 {
			b = append(b, "日本語 👍🏿 aé"[rng.IntN(8):]...)
		}
		if got, want := validUTF8(b), utf8.Valid(b); got != want {
			t.Fatalf("validUTF8(%q) = %v, want %v", b, got, want)
		}
	}
}

func FuzzValidUTF8(f *testing.F) {
	f.Add([]byte("aé日👍\xed\xa0\x80\xf4\x90"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validUTF8(b), utf8.Valid(b); got != want {
			t.Fatalf("validUTF8(%q) = %v, want %v", b, got, want)
		}
	})
}

// FuzzParseRequestFast: the single pass agrees with encoding/json-based
// parsing, and renders from its decoded values match renders from the raw
// fields.
func FuzzParseRequestFast(f *testing.F) {
	for _, body := range fastParseBodies {
		f.Add([]byte(body))
	}
	if data, err := os.ReadFile(filepath.Join("testdata", "parity.json")); err == nil {
		if pf, err := parseParity(data); err == nil {
			for i, c := range pf.Cases {
				if i%7 == 0 {
					f.Add([]byte(c.Request))
				}
			}
		}
	}
	templates := fastParseTemplates(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFastParse(t, body, templates)
	})
}
