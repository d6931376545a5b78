package live

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/internal/openai"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/tenancy/limit"
)

// streamChoices reads a completions stream's text by choice index (vLLM
// writes one choice per chunk).
func streamChoices(t *testing.T, sse string) map[int]string {
	t.Helper()
	var r openai.Reader
	evs, err := r.Feed([]byte(sse), 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, ev := range evs {
		if ev.Choices > 0 {
			out[ev.Index] += string(ev.Text)
		}
	}
	return out
}

// A request of n choices: the answer the index learns is the first
// choice's (the stream interleaves the three), so a next turn that quotes
// it is predicted cached as far as the engine has it.
func TestChoicesFirstAnswerIndexed(t *testing.T) {
	g := startGateway(t, testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true})))
	prompt := words(400, 100)
	resp, err := g.post(context.Background(), "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 40, "ignore_eos": true, "stream": true, "n": 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	answers := streamChoices(t, string(b))
	if len(answers) != 3 || answers[0] == answers[1] || len(strings.Fields(answers[0])) != 40 {
		t.Fatalf("%d %d choices: %v", resp.StatusCode, len(answers), answers)
	}
	resp, err = g.post(context.Background(), "/v1/completions", map[string]any{"prompt": prompt + answers[0] + words(900, 20), "max_tokens": 2, "ignore_eos": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cached := cachedTokensOf(resp)
	// 100 prompt tokens and 39 of the first answer's are held: 8 blocks.
	if resp.Header.Get(HeaderPredicted) != "128" || cached != 128 {
		t.Fatalf("predicted %s cached tokens, the engine found %d; want 128 and 128", resp.Header.Get(HeaderPredicted), cached)
	}
}

// n over the model's max_n is answered 400 before any engine sees it; n
// up to it is served, weighed as n sequences (the explanation says so:
// a 7-token sequence is one block, four of them four),
// and a reload changes the bound.
func TestChoicesBounded(t *testing.T) {
	var seen atomic.Int64
	up := &upstream{t: t, cfg: server.Config{Engine: testEngineConfig()}, wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/completions" {
				seen.Add(1)
			}
			h.ServeHTTP(w, r)
		})
	}}
	up.start("127.0.0.1:0")
	t.Cleanup(up.kill)
	c := testConfig(t, up)
	c.Models[0].MaxN = 4
	g := startGateway(t, c)
	ask := func(n any) (*http.Response, []byte) {
		return callWith(t, g, "", map[string]any{"prompt": words(10, 20), "max_tokens": 5, "ignore_eos": true, "n": n}, nil)
	}
	for _, n := range []any{5, 5.0, "5", 1000000} {
		resp, b := ask(n)
		e := errorOf(t, b)
		if resp.StatusCode != http.StatusBadRequest || e.Code.String() != "integer_above_max_value" || !strings.Contains(e.Message, "<= 4 (max_n of model") {
			t.Fatalf("n %v over max_n 4: %d %s", n, resp.StatusCode, b)
		}
	}
	if n := g.outcomes("bad_request"); n != 4 {
		t.Fatalf("%v bad requests counted, want 4", n)
	}
	if n := seen.Load(); n != 0 {
		t.Fatalf("the engine saw %d requests", n)
	}
	resp, b := ask(4)
	var ans struct {
		Choices []struct {
			Index int `json:"index"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &ans); err != nil || resp.StatusCode != 200 || len(ans.Choices) != 4 || ans.Usage.CompletionTokens != 20 {
		t.Fatalf("n 4: %d %s", resp.StatusCode, b)
	}
	status, ex := explainCall(t, g, "", []byte(`{"prompt":"hi there","max_tokens":5,"n":4}`), nil)
	var exp gateway.Explanation
	if err := json.Unmarshal(ex, &exp); err != nil || status != 200 || exp.Request.Sequences != 4 || exp.Candidates[0].WeightBlocks != 4 {
		t.Fatalf("the explanation does not weigh 4 sequences: %d %s", status, ex)
	}
	if status, ex := explainCall(t, g, "", []byte(`{"prompt":"hi there","max_tokens":5,"n":5}`), nil); status != 400 {
		t.Fatalf("explained n 5 over max_n 4: %d %s", status, ex)
	}
	// A batch of three prompts, n 2 each: six sequences (max_n bounds n).
	status, ex = explainCall(t, g, "", []byte(`{"prompt":["hi there","a b",[1,2]],"max_tokens":5,"n":2}`), nil)
	if err := json.Unmarshal(ex, &exp); err != nil || status != 200 || exp.Request.Sequences != 6 {
		t.Fatalf("three prompts of n 2: %d %s", status, ex)
	}
}

func TestPromptCount(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want int
	}{
		{`"one"`, 1}, {`["one"]`, 1}, {`["a", "b", "c"]`, 3}, {`[1, 2, 3]`, 1}, {`[[1, 2], [3]]`, 2},
		{` [ "a" , [1] ] `, 2}, {`[]`, 1}, {`null`, 1}, {``, 1}, {`["a", `, 1}, {`["a", "b"`, 2}, {`{"a": 1}`, 1},
	} {
		if got := promptCount(json.RawMessage(c.raw)); got != c.want {
			t.Errorf("%s: %d prompts, want %d", c.raw, got, c.want)
		}
	}
}

// The rate limiter charges a request of n choices its prompt plus n times
// its output bound, as OpenAI counts it.
func TestChoicesChargedPerChoice(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	g := startTenantGateway(t, up, nil, Deps{})
	prompt := words(300, 20)
	p := promptTokens(t, prompt)
	const limitTPM = 10000
	_, key := g.createKey(t, map[string]any{"name": "choices", "tpm": limitTPM})
	resp, b := callWith(t, g.testGateway, key, map[string]any{"prompt": prompt, "max_tokens": 50, "n": 3, "ignore_eos": true}, nil)
	if resp.StatusCode != 200 || resp.Header.Get(limit.HeaderRemainingTokens) != strconv.Itoa(limitTPM-p-3*50) {
		t.Fatalf("n 3: %d, remaining %s, want %d: %s", resp.StatusCode, resp.Header.Get(limit.HeaderRemainingTokens), limitTPM-p-3*50, b)
	}
	// 3 x 4000 cannot fit 10,000 whatever the bucket holds; 1 x 4000 could.
	resp, b = callWith(t, g.testGateway, key, map[string]any{"prompt": prompt, "max_tokens": 4000, "n": 3}, nil)
	if e := errorOf(t, b); resp.StatusCode != 429 || !strings.Contains(e.Message, "never fit") || !strings.Contains(e.Message, "Requested "+strconv.Itoa(p+12000)) {
		t.Fatalf("n 3 of 4000: %d %s", resp.StatusCode, b)
	}
}

// A reload changes max_n for the next request.
func TestChoicesMaxNReloaded(t *testing.T) {
	f := newFileConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	f.ModelExtra = "    max_n: 2\n"
	g, path := startFromFile(t, f)
	ask := func() int {
		resp, _ := callWith(t, g, "", map[string]any{"prompt": words(10, 20), "max_tokens": 2, "n": 3}, nil)
		return resp.StatusCode
	}
	if got := ask(); got != http.StatusBadRequest {
		t.Fatalf("n 3 over max_n 2: %d", got)
	}
	f.ModelExtra = "    max_n: 3\n"
	g.reload(t, path, f)
	if got := ask(); got != http.StatusOK {
		t.Fatalf("n 3 after max_n became 3: %d", got)
	}
}

// promptCount never fails on any input, and on a valid JSON array of
// strings or arrays it counts the elements as encoding/json does.
func FuzzPromptCount(f *testing.F) {
	for _, s := range []string{`"one"`, `["a","b"]`, `[[1,2],[3]]`, `[1,2]`, `[]`, `["a",`, `[{"a":1}]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		n := promptCount(raw)
		if n < 1 {
			t.Fatalf("%q: %d prompts", raw, n)
		}
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
			return
		}
		first := strings.TrimSpace(string(list[0]))
		if first[0] != '"' && first[0] != '[' {
			return // token ids: one prompt
		}
		if n != len(list) {
			t.Fatalf("%q: %d prompts, encoding/json %d", raw, n, len(list))
		}
	})
}
