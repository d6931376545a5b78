package respcache

import (
	"net/http"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func keyFor(req Request, r rules) (Key, Kind, string) {
	var c canonicalizer
	return c.keyOf(&req, &r)
}

func chatReq(body string) Request {
	return Request{Path: PathChatCompletions, Body: []byte(body), Model: "m", KeyID: "k1"}
}

func TestRules(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		body    string
		maxTemp float64
		want    string // "" cacheable
		kind    Kind
	}{
		{`{` + msgs + `,"temperature":0}`, 0, "", KindJSON},
		{`{` + msgs + `,"temperature":0.0,"n":1,"best_of":1}`, 0, "", KindJSON},
		{`{` + msgs + `,"temperature":-0}`, 0, "", KindJSON},
		{`{` + msgs + `,"temperature":1e-400}`, 0, "", KindJSON}, // reads as 0, as the engine reads it
		{`{` + msgs + `}`, 0, ReasonTemperature, 0},              // absent: OpenAI's default 1
		{`{` + msgs + `,"temperature":null}`, 0, ReasonTemperature, 0},
		{`{` + msgs + `}`, 1, "", KindJSON},
		{`{` + msgs + `}`, 0.99, ReasonTemperature, 0},
		{`{` + msgs + `,"temperature":0.2}`, 0, ReasonTemperature, 0},
		{`{` + msgs + `,"temperature":0.2}`, 0.2, "", KindJSON},
		{`{` + msgs + `,"temperature":0.2}`, 0.19, ReasonTemperature, 0},
		{`{` + msgs + `,"temperature":-1}`, 2, ReasonTemperature, 0},
		{`{` + msgs + `,"temperature":"0"}`, 2, ReasonTemperature, 0},
		{`{` + msgs + `,"temperature":1e400}`, 2, ReasonTemperature, 0},
		{`{` + msgs + `,"temperature":0,"n":2}`, 0, ReasonN, 0},
		{`{` + msgs + `,"temperature":0,"n":"1"}`, 0, ReasonN, 0},
		{`{` + msgs + `,"temperature":0,"n":null}`, 0, "", KindJSON},
		{`{"prompt":"x","temperature":0,"best_of":3}`, 0, ReasonBestOf, 0},
		// Nucleus and vLLM's truncation sampling matter only when sampling.
		{`{` + msgs + `,"temperature":0,"top_p":0.5,"top_k":5,"min_p":0.1}`, 0, "", KindJSON},
		{`{` + msgs + `,"temperature":0.1,"top_p":0.5}`, 0.5, ReasonTopP, 0},
		{`{` + msgs + `,"temperature":0.1,"top_p":1}`, 0.5, "", KindJSON},
		{`{` + msgs + `,"temperature":0.1,"top_p":"x"}`, 0.5, ReasonTopP, 0},
		{`{` + msgs + `,"temperature":0.1,"top_k":40}`, 0.5, ReasonTopK, 0},
		{`{` + msgs + `,"temperature":0.1,"top_k":-1,"min_p":0}`, 0.5, "", KindJSON},
		{`{` + msgs + `,"temperature":0.1,"top_k":0}`, 0.5, "", KindJSON},
		{`{` + msgs + `,"temperature":0.1,"min_p":0.05}`, 0.5, ReasonMinP, 0},
		// seed, logprobs, tools and unknown fields are part of the key only.
		{`{` + msgs + `,"temperature":0,"seed":7,"logprobs":true,"top_logprobs":3,"tools":[{"type":"function","function":{"name":"f"}}],"vendor_x":{"a":1}}`, 0, "", KindJSON},
		{`{` + msgs + `,"temperature":0,"stream":true}`, 0, "", KindSSE},
		{`{` + msgs + `,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`, 0, "", KindSSE},
		{`{` + msgs + `,"temperature":0,"stream":false}`, 0, "", KindJSON},
		{`{` + msgs + `,"temperature":0,"stream":"yes"}`, 0, ReasonStream, 0},
		{`{` + msgs + `,"temperature":0,"stream":true,"stream_options":true}`, 0, ReasonStream, 0},
		{`[1]`, 0, ReasonInvalidBody, 0},
		{`{"temperature":0,`, 0, ReasonInvalidBody, 0},
		{`{"temperature":0,"temperature":1}`, 2, ReasonInvalidBody, 0},
	} {
		_, kind, reason := keyFor(chatReq(tc.body), rules{maxTemperature: tc.maxTemp})
		if reason != tc.want || kind != tc.kind {
			t.Errorf("%s (max_temperature %v): reason %q kind %v, want %q %v", tc.body, tc.maxTemp, reason, kind, tc.want, tc.kind)
		}
	}
}

func TestRulesRequest(t *testing.T) {
	const body = `{"prompt":"x","temperature":0}`
	base := Request{Path: PathCompletions, Body: []byte(body), Model: "m", KeyID: "k"}
	hr := rules{tenantHeader: "X-Tenant"}
	for _, tc := range []struct {
		name string
		req  func(r *Request)
		r    rules
		want string
	}{
		{"ok", func(r *Request) {}, rules{}, ""},
		{"path", func(r *Request) { r.Path = "/v1/embeddings" }, rules{}, ReasonPath},
		{"model", func(r *Request) { r.Model = "" }, rules{}, ReasonNoModel},
		{"no tenant", func(r *Request) { r.KeyID = "" }, rules{}, ReasonNoTenant},
		{"header only", func(r *Request) { r.KeyID = ""; r.Header = http.Header{"X-Tenant": {"t1"}} }, hr, ""},
		{"empty header", func(r *Request) { r.KeyID = ""; r.Header = http.Header{"X-Tenant": {""}} }, hr, ReasonNoTenant},
		{"repeated header", func(r *Request) { r.Header = http.Header{"X-Tenant": {"a", "b"}} }, hr, ReasonTenantHeader},
	} {
		req := base
		tc.req(&req)
		if _, _, reason := keyFor(req, tc.r); reason != tc.want {
			t.Errorf("%s: reason %q, want %q", tc.name, reason, tc.want)
		}
	}
}

// TestKeyMaterial: the resolved model, the tenant (key and header), the
// cache_salt, the path and the kind of answer each change the key; the
// body's model field, stream: false and whitespace do not.
func TestKeyMaterial(t *testing.T) {
	hr := rules{tenantHeader: "X-Tenant"}
	base := Request{Path: PathChatCompletions, Model: "m", KeyID: "k", Header: http.Header{"X-Tenant": {"t"}},
		Body: []byte(`{"model":"alias","messages":[{"role":"user","content":"hi"}],"temperature":0,"cache_salt":"s"}`)}
	k0, _, reason := keyFor(base, hr)
	if reason != "" {
		t.Fatal(reason)
	}
	same := map[string]func(r *Request){
		"body model": func(r *Request) { r.Body = []byte(strings.Replace(string(r.Body), `"alias"`, `"other"`, 1)) },
		"no model":   func(r *Request) { r.Body = []byte(strings.Replace(string(r.Body), `"model":"alias",`, ``, 1)) },
		"stream false": func(r *Request) {
			r.Body = []byte(strings.Replace(string(r.Body), `"temperature":0`, `"temperature":0,"stream":false`, 1))
		},
		"json stream options": func(r *Request) {
			r.Body = []byte(strings.Replace(string(r.Body), `"temperature":0`, `"temperature":0,"stream_options":{"include_usage":true}`, 1))
		},
		"spelling": func(r *Request) {
			r.Body = []byte(` { "cache_salt" : "s", "temperature" : 0.0e5 , "messages":[{"content":"h\u0069","role":"user"}] } `)
		},
	}
	for name, f := range same {
		req := base
		f(&req)
		if k, _, reason := keyFor(req, hr); reason != "" || k != k0 {
			t.Errorf("%s changed the key (reason %q)", name, reason)
		}
	}
	differ := map[string]func(r *Request){
		"model":     func(r *Request) { r.Model = "m2" },
		"key id":    func(r *Request) { r.KeyID = "k2" },
		"tenant":    func(r *Request) { r.Header = http.Header{"X-Tenant": {"t2"}} },
		"no header": func(r *Request) { r.Header = nil },
		"salt":      func(r *Request) { r.Body = []byte(strings.Replace(string(r.Body), `"s"`, `"s2"`, 1)) },
		"no salt":   func(r *Request) { r.Body = []byte(strings.Replace(string(r.Body), `,"cache_salt":"s"`, ``, 1)) },
		"path":      func(r *Request) { r.Path = PathCompletions },
		"stream": func(r *Request) {
			r.Body = []byte(strings.Replace(string(r.Body), `"temperature":0`, `"temperature":0,"stream":true`, 1))
		},
		"content": func(r *Request) { r.Body = []byte(strings.Replace(string(r.Body), `"hi"`, `"hi "`, 1)) },
		"max_tokens": func(r *Request) {
			r.Body = []byte(strings.Replace(string(r.Body), `"temperature":0`, `"temperature":0,"max_tokens":5`, 1))
		},
		"seed": func(r *Request) {
			r.Body = []byte(strings.Replace(string(r.Body), `"temperature":0`, `"temperature":0,"seed":5`, 1))
		},
		"unknown": func(r *Request) {
			r.Body = []byte(strings.Replace(string(r.Body), `"temperature":0`, `"temperature":0,"x":null`, 1))
		},
		"user": func(r *Request) {
			r.Body = []byte(strings.Replace(string(r.Body), `"temperature":0`, `"temperature":0,"user":"u"`, 1))
		},
		"key to hdr":  func(r *Request) { r.KeyID, r.Header = "", http.Header{"X-Tenant": {"k"}} },
		"salt number": func(r *Request) { r.Body = []byte(strings.Replace(string(r.Body), `"s"`, `1`, 1)) },
	}
	seen := map[Key]string{k0: "base"}
	for name, f := range differ {
		req := base
		f(&req)
		k, _, reason := keyFor(req, hr)
		if reason != "" {
			t.Errorf("%s: bypassed (%s)", name, reason)
			continue
		}
		if other, ok := seen[k]; ok {
			t.Errorf("%s has the key of %s", name, other)
		}
		seen[k] = name
	}
	// Stream options are part of a stream's key: include_usage adds a
	// chunk to the answer.
	s1 := base
	s1.Body = []byte(`{"messages":[],"temperature":0,"stream":true}`)
	s2 := base
	s2.Body = []byte(`{"messages":[],"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`)
	a, _, _ := keyFor(s1, hr)
	b, _, _ := keyFor(s2, hr)
	if a == b {
		t.Error("stream_options do not change a stream's key")
	}
}

// genRequest draws a cacheable chat request body as a generated value
// with the fields the rules read set to cacheable values.
func genRequest(t *rapid.T) jv {
	msg := func(role string, content jv) jv {
		return jv{kind: 'o', keys: []string{"role", "content"}, members: []jv{{kind: 's', s: role}, content}}
	}
	var msgs []jv
	for i := range rapid.IntRange(1, 4).Draw(t, "turns") {
		role := []string{"system", "user", "assistant"}[i%3]
		msgs = append(msgs, msg(role, jv{kind: 's', s: genString().Draw(t, "content")}))
	}
	keys := []string{"messages", "temperature", "max_tokens"}
	members := []jv{{kind: 'a', items: msgs}, {kind: 'i', m: 0}, {kind: 'i', m: rapid.Int64Range(1, 4096).Draw(t, "max")}}
	extra := rapid.SliceOfNDistinct(rapid.StringMatching(`x_[a-z]{1,5}`), 0, 4, rapid.ID[string]).Draw(t, "extra")
	for i, k := range extra {
		keys = append(keys, k)
		members = append(members, genValue(2).Draw(t, "extra"+string(rune('0'+i))))
	}
	return jv{kind: 'o', keys: keys, members: members}
}

// TestKeyPermutation: permuting a request's keys, respelling its numbers
// and strings and adding whitespace keeps its key; changing any value (a
// message's text, max_tokens, an extra field anywhere) changes it.
func TestKeyPermutation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := genRequest(t)
		var plain, spelled, changed strings.Builder
		render(nil, v, &plain)
		render(t, v, &spelled)
		req := chatReq(plain.String())
		k0, _, reason := keyFor(req, rules{})
		if reason != "" {
			t.Fatalf("%s: bypassed (%s)", plain.String(), reason)
		}
		req.Body = []byte(spelled.String())
		if k, _, reason := keyFor(req, rules{}); reason != "" || k != k0 {
			t.Fatalf("respelling changed the key (%s):\n%s\n%s", reason, plain.String(), spelled.String())
		}
		// Change one member's value (never the temperature: that makes
		// the request uncacheable, tested in TestRules).
		i := rapid.SampledFrom([]int{0, 2}).Draw(t, "member")
		if len(v.members) > 3 && rapid.Bool().Draw(t, "extra member") {
			i = rapid.IntRange(3, len(v.members)-1).Draw(t, "extra index")
		}
		w := v
		w.members = append([]jv(nil), v.members...)
		w.members[i] = mutate(t, v.members[i])
		render(t, w, &changed)
		req.Body = []byte(changed.String())
		k, _, reason := keyFor(req, rules{})
		if reason != "" {
			t.Fatalf("%s: bypassed (%s)", changed.String(), reason)
		}
		if k == k0 {
			t.Fatalf("a change kept the key:\n%s\n%s", plain.String(), changed.String())
		}
	})
}
