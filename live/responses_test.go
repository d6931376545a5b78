package live

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/internal/openai"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/gateway"
)

// responseBody is the part of a Responses API answer the tests read.
type responseBody struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Status string `json:"status"`
	Output []struct {
		Type    string `json:"type"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

// respond sends a non-streamed POST /v1/responses.
func (g *testGateway) respond(t *testing.T, body map[string]any) (*http.Response, responseBody, []byte) {
	t.Helper()
	resp, err := g.post(context.Background(), "/v1/responses", body, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var rb responseBody
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &rb); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
	}
	return resp, rb, b
}

// keyedCall sends method path (body marshalled unless nil) with the API
// key and returns the answer, its body read whole.
func keyedCall(t *testing.T, g *testGateway, key, method, path string, body map[string]any) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, g.base+path, rd)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := g.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func storeEngine(t *testing.T) *upstream { return wrappedStoreEngine(t, nil) }

// wrappedStoreEngine is storeEngine with wrap around its handler (none
// when nil).
func wrappedStoreEngine(t *testing.T, wrap func(http.Handler) http.Handler) *upstream {
	u := &upstream{t: t, cfg: server.Config{Engine: testEngineConfig(), ResponsesStore: 100, EnablePromptTokensDetails: true}, wrap: wrap}
	u.start("127.0.0.1:0")
	t.Cleanup(u.kill)
	return u
}

// ignoringBackgroundEngine is a store engine that ignores background (as
// an engine without background mode would): it answers such a request
// whole.
func ignoringBackgroundEngine(t *testing.T) *upstream {
	return wrappedStoreEngine(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == "/v1/responses" {
				var body map[string]any
				json.NewDecoder(r.Body).Decode(&body)
				delete(body, "background")
				b, _ := json.Marshal(body)
				r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
			}
			h.ServeHTTP(w, r)
		})
	})
}

// failingReadsEngine is a store engine whose stored-response reads (GET
// /v1/responses/{id}) answer status while on is set (nil: always).
func failingReadsEngine(t *testing.T, status int, on *atomic.Bool) *upstream {
	return wrappedStoreEngine(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if (on == nil || on.Load()) && r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/responses/") {
				http.Error(w, `{"error":{"message":"`+http.StatusText(status)+`"}}`, status)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
}

// meteredBackground sends key's background request of maxOut output
// tokens through g, waits until a watch ends as how, and returns the
// output tokens metered to key (keyID).
func meteredBackground(t *testing.T, g *tenantGateway, keyID, key string, maxOut int, how string) int64 {
	t.Helper()
	resp, body := keyedCall(t, g.testGateway, key, http.MethodPost, "/v1/responses", map[string]any{"input": words(100, 20), "max_output_tokens": maxOut, "background": true})
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"status":"queued"`)) {
		t.Fatalf("background: %d %s", resp.StatusCode, body)
	}
	return watchedOutput(t, g, keyID, how)
}

// watchedOutput waits until a background watch ends as how, and returns
// the output tokens metered to key keyID.
func watchedOutput(t *testing.T, g *tenantGateway, keyID, how string) int64 {
	t.Helper()
	waitUntil(t, "the background watch "+how, 20*time.Second, func() bool {
		return testutil.ToFloat64(g.met.backgroundWatches.WithLabelValues(how)) == 1
	})
	var out int64
	for _, r := range g.usageRows(t, "?key="+keyID) {
		out += r.OutputTokens
	}
	return out
}

// The Responses API through the proxy: routed and predicted as a chat with
// the instructions and input vLLM makes of it (the prediction matches the
// engine's own cached tokens), metered by its input and output tokens,
// streamed with its events; a response continued with
// previous_response_id goes to the replica that holds it, and GET
// /v1/responses/{id} reaches it too.
func TestResponsesProxied(t *testing.T) {
	a, b := storeEngine(t), storeEngine(t)
	c := testConfig(t, a, b)
	g := startGateway(t, c)
	input := words(100, 300)
	first := map[string]any{"model": "sim", "instructions": "Answer briefly.", "input": input, "max_output_tokens": 8}
	resp, r1, body := g.respond(t, first)
	home := resp.Header.Get(HeaderReplica)
	if resp.StatusCode != http.StatusOK || r1.Object != "response" || !strings.HasPrefix(r1.ID, "resp_") || r1.Usage.OutputTokens != 8 || home == "" {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if resp.Header.Get(HeaderPredicted) != "0" {
		t.Fatalf("a cold prompt predicted %q cached tokens", resp.Header.Get(HeaderPredicted))
	}
	// /admin/explain weighs it as the proxy does: the engine's prompt,
	// max_output_tokens.
	eb, _ := json.Marshal(first)
	status, xb := explainCall(t, g, "?endpoint=responses", eb, nil)
	var ex gateway.Explanation
	if status != http.StatusOK || json.Unmarshal(xb, &ex) != nil || ex.Request.PromptTokens != r1.Usage.InputTokens || ex.Request.MaxTokens != 8 {
		t.Fatalf("explain: %d %s (the engine's prompt: %d tokens)", status, xb, r1.Usage.InputTokens)
	}
	// The same request again, as a list of one message with typed parts:
	// the same prompt, predicted cached where it went, as the engine says.
	again := map[string]any{"model": "sim", "instructions": "Answer briefly.", "store": false, "max_output_tokens": 4,
		"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": input}}}}}
	resp, r2, body := g.respond(t, again)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderReplica) != home || r2.Usage.InputTokens != r1.Usage.InputTokens {
		t.Fatalf("again: %d on %s (first on %s): %s", resp.StatusCode, resp.Header.Get(HeaderReplica), home, body)
	}
	if p := resp.Header.Get(HeaderPredicted); p != fmt.Sprint(r2.Usage.InputTokensDetails.CachedTokens) || r2.Usage.InputTokensDetails.CachedTokens == 0 {
		t.Fatalf("predicted %s cached tokens, the engine had %d", p, r2.Usage.InputTokensDetails.CachedTokens)
	}

	// A chain of turns, each continuing the last: every one on the
	// replica that holds its history.
	prev := r1.ID
	for turn := range 4 {
		resp, r, body := g.respond(t, map[string]any{"previous_response_id": prev, "input": words(500+10*turn, 5), "max_output_tokens": 4})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderReplica) != home || r.Usage.InputTokens <= r1.Usage.InputTokens {
			t.Fatalf("turn %d: %d on %s (home %s): %s", turn, resp.StatusCode, resp.Header.Get(HeaderReplica), home, body)
		}
		prev = r.ID
	}
	// The stored response, read through the proxy; an unknown id is 404.
	get, err := g.client.Get(g.base + "/v1/responses/" + r1.ID)
	if err != nil {
		t.Fatal(err)
	}
	gb, _ := io.ReadAll(get.Body)
	get.Body.Close()
	if get.StatusCode != http.StatusOK || get.Header.Get(HeaderReplica) != home || !bytes.Contains(gb, []byte(r1.ID)) {
		t.Fatalf("GET: %d from %q: %s", get.StatusCode, get.Header.Get(HeaderReplica), gb)
	}
	get, err = g.client.Get(g.base + "/v1/responses/resp_nosuch")
	if err != nil {
		t.Fatal(err)
	}
	gb, _ = io.ReadAll(get.Body)
	get.Body.Close()
	if get.StatusCode != http.StatusNotFound || !bytes.Contains(gb, []byte("Response with id 'resp_nosuch' not found.")) {
		t.Fatalf("GET unknown: %d %s", get.StatusCode, gb)
	}

	// Streamed: the events pass as the engine wrote them, ending with
	// response.completed, whose usage the proxy reads.
	sresp, err := g.post(context.Background(), "/v1/responses", map[string]any{"input": words(900, 40), "max_output_tokens": 5, "stream": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := io.ReadAll(sresp.Body)
	sresp.Body.Close()
	if err != nil || sresp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d %v %s", sresp.StatusCode, err, sb)
	}
	var rd openai.Reader
	evs, err := rd.Feed(sb, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ans openai.Answer
	ans.Add(evs...)
	if !ans.Done || len(strings.Fields(string(ans.Text))) != 5 || ans.Usage.CompletionTokens != 5 || !bytes.Contains(sb, []byte("event: response.completed\n")) || bytes.Contains(sb, []byte("[DONE]")) {
		t.Fatalf("stream %+v: %s", ans, sb)
	}
	if in, p := g.inFlight(); in != 0 || p != 0 {
		t.Fatalf("slots held after the requests: %d in flight, %d pending", in, p)
	}
	if got := testutil.ToFloat64(g.met.requests.WithLabelValues(server.DefaultModelName, "ok")); got != 7 {
		t.Fatalf("inferrail_requests_total{outcome=ok} %v, want 7", got)
	}
	wantPostOnly(t, g, "/v1/responses")

	// The home replica gone, a continuation is refused at once: no other
	// replica holds the response (one would answer 404).
	for _, u := range []*upstream{a, b} {
		if u.url() == replicaURL(t, c, home) {
			u.kill()
		}
	}
	waitUntil(t, "the home replica ejected", 5*time.Second, func() bool {
		resp, _, _ := g.respond(t, map[string]any{"previous_response_id": prev, "input": "x"})
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	resp, _, body = g.respond(t, map[string]any{"previous_response_id": prev, "input": "x"})
	if resp.StatusCode != http.StatusServiceUnavailable || !bytes.Contains(body, []byte("response_replica_unavailable")) {
		t.Fatalf("continuing a response whose replica is gone: %d %s", resp.StatusCode, body)
	}
}

// replicaURL is the URL of c's replica name.
func replicaURL(t *testing.T, c *config.Config, name string) string {
	t.Helper()
	for _, r := range c.Models[0].Replicas {
		if r.Name == name {
			return r.URL
		}
	}
	t.Fatalf("no replica %q", name)
	return ""
}

// A Responses stream broken mid-way ends with that API's error event,
// numbered after the events relayed, and no clean end.
func TestResponsesBrokenStream(t *testing.T) {
	eng := newFakeEngine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_x\",\"status\":\"in_progress\"}}\n\n")
		fmt.Fprint(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"Hi\"}\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	c := fakeConfig(t, eng.URL)
	c.Retry.Attempts = 1
	g := startGateway(t, c)
	resp, err := g.post(context.Background(), "/v1/responses", map[string]any{"input": "hi", "stream": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("a broken stream ended cleanly: %q", b)
	}
	want := `event: error` + "\n" + `data: {"type": "error", "code": "stream_broken", "message": "the engine's stream broke before it was complete", "param": null, "sequence_number": 2}`
	if !bytes.Contains(b, []byte(want)) {
		t.Fatalf("no Responses error event in %q", b)
	}
}

// The prompt the edge tokenizes for a Responses request: the chat
// messages vLLM builds, or none when only the engine knows it.
func TestResponsesChat(t *testing.T) {
	cases := []struct {
		body, want string
	}{
		{`{"input": "hi"}`, `{"messages":[{"role":"user","content":"hi"}]}`},
		{`{"input": "hi", "instructions": "Be brief."}`, `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]}`},
		{`{"input": "hi", "instructions": null}`, `{"messages":[{"role":"user","content":"hi"}]}`},
		{`{"input": [{"role": "user", "content": "a"}, {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]}]}`,
			`{"messages":[{"content":"a","role":"user"},{"content":[{"text":"b","type":"text"}],"role":"assistant"}]}`},
		{`{"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}`,
			`{"messages":[{"content":[{"image_url":"x","type":"input_image"}],"role":"user"}]}`},
		{`{"input": "hi", "previous_response_id": "resp_1"}`, ""},
		{`{"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}`, ""},
		{`{"input": [{"content": "no role"}]}`, ""},
		{`{"input": []}`, ""},
		{`{"input": 5}`, ""},
		{`{"instructions": "x"}`, ""},
	}
	for _, c := range cases {
		f, err := readFields([]byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		got, ok := responsesChat(&f)
		if string(got) != c.want || ok != (c.want != "") {
			t.Errorf("%s: %s %v, want %s", c.body, got, ok, c.want)
		}
		if ok && !json.Valid(got) {
			t.Errorf("%s: invalid JSON %s", c.body, got)
		}
	}
	f, _ := readFields([]byte(`{"max_output_tokens": 12, "max_tokens": 3, "store": false}`))
	if f.maxTokens(opResponses) != 12 || !f.NoStore {
		t.Fatalf("%+v", f)
	}
}

// The ids the proxy remembers are bounded: the oldest half goes when the
// newer half fills, and an id read again is kept.
func TestHomesBounded(t *testing.T) {
	var h homes
	h.put("keep", home{model: "m", replica: "a"})
	for i := range maxHomes {
		h.put(fmt.Sprint(i), home{model: "m", replica: "b"})
		if i == maxHomes/4 {
			if _, ok := h.get("keep"); !ok {
				t.Fatal("lost early")
			}
		}
	}
	if n := len(h.cur) + len(h.old); n > maxHomes {
		t.Fatalf("%d ids kept, bound %d", n, maxHomes)
	}
	if _, ok := h.get("0"); ok {
		t.Fatal("the oldest id was kept")
	}
	if at, ok := h.get(fmt.Sprint(maxHomes - 1)); !ok || at.replica != "b" {
		t.Fatal("the newest id was lost")
	}
}

// Through the endpoint picker: a continuation is picked to the replica
// that answered the response it continues, confined by the gateway's
// subset hint like any pick (the home outside it: 503, as no other replica
// holds the response); GET /v1/responses/{id} is answered from the home.
func TestEPPResponses(t *testing.T) {
	ups := []*upstream{storeEngine(t), storeEngine(t)}
	e := startEPP(t, eppConfig(t, ups...), Deps{}, eppOptions{})
	body, _ := json.Marshal(map[string]any{"input": words(300, 40), "max_output_tokens": 3})
	first := e.open(t, envoyReq{path: "/v1/responses", body: body, chunks: 2})
	var r responseBody
	if b := first.serve(); json.Unmarshal(b, &r) != nil || r.ID == "" {
		t.Fatalf("first answer: %s", b)
	}
	waitUntil(t, "the first request's end", 5*time.Second, func() bool { return idle(e.Server) })
	home := first.pick.endpoint
	other := hostOf(ups[0].url())
	if other == home {
		other = hostOf(ups[1].url())
	}
	next, _ := json.Marshal(map[string]any{"previous_response_id": r.ID, "input": "more", "max_output_tokens": 2})
	for i := range 3 {
		call := e.open(t, envoyReq{path: "/v1/responses", body: next, subset: []string{home, other}})
		if call.pick.endpoint != home {
			t.Fatalf("continuation %d picked %q, the response is on %q", i, call.pick.endpoint, home)
		}
		if b := call.serve(); !bytes.Contains(b, []byte(`"object":"response"`)) {
			t.Fatalf("continuation %d: %s", i, b)
		}
	}
	call := e.open(t, envoyReq{path: "/v1/responses", body: next, subset: []string{other}})
	if call.pick.status() != http.StatusServiceUnavailable || call.pick.errorCode(t) != "response_replica_unavailable" {
		t.Fatalf("the home outside the subset: %+v", call.pick)
	}
	// GET /v1/responses/{id}: sent on to the home, passed through; an
	// unknown id is live's 404.
	get := e.open(t, envoyReq{method: http.MethodGet, path: "/v1/responses/" + r.ID})
	if get.pick.endpoint != home {
		t.Fatalf("GET picked %q, the response is on %q: %+v", get.pick.endpoint, home, get.pick)
	}
	if b := get.serve(); !bytes.Contains(b, []byte(r.ID)) {
		t.Fatalf("GET through the picker: %s", b)
	}
	unknown := e.open(t, envoyReq{method: http.MethodGet, path: "/v1/responses/resp_nosuch"})
	if unknown.pick.status() != http.StatusNotFound {
		t.Fatalf("GET an unknown id: %+v", unknown.pick)
	}
	waitUntil(t, "idle", 5*time.Second, func() bool { return idle(e.Server) })

	// A picker that did not see the response answered (a restart, or
	// another picker) finds it in the pool: GET and continuations go to
	// the home.
	e2 := startEPP(t, eppConfig(t, ups...), Deps{}, eppOptions{})
	get = e2.open(t, envoyReq{method: http.MethodGet, path: "/v1/responses/" + r.ID})
	if get.pick.endpoint != home {
		t.Fatalf("GET through a second picker picked %q, the response is on %q: %+v", get.pick.endpoint, home, get.pick)
	}
	if b := get.serve(); !bytes.Contains(b, []byte(r.ID)) {
		t.Fatalf("GET through a second picker: %s", b)
	}
	e3 := startEPP(t, eppConfig(t, ups...), Deps{}, eppOptions{})
	call = e3.open(t, envoyReq{path: "/v1/responses", body: next})
	if call.pick.endpoint != home {
		t.Fatalf("a continuation through a third picker picked %q, the response is on %q", call.pick.endpoint, home)
	}
	if b := call.serve(); !bytes.Contains(b, []byte(`"object":"response"`)) {
		t.Fatalf("a continuation through a third picker: %s", b)
	}
	for _, p := range []*testEPP{e2, e3} {
		if n := testutil.ToFloat64(p.met.responseSearches.WithLabelValues(searchFound)); n != 1 {
			t.Fatalf("a picker that did not know the response found it %v times, want 1", n)
		}
	}
	waitUntil(t, "idle", 5*time.Second, func() bool { return idle(e2.Server) && idle(e3.Server) })
}

// With auth: keys a stored response is its key's: another key can neither
// continue nor read it (404, as if it did not exist), its own can.
func TestResponsesScopedToKey(t *testing.T) {
	g := startTenantGateway(t, storeEngine(t), nil, Deps{})
	_, keyA := g.createKey(t, map[string]any{"name": "a"})
	_, keyB := g.createKey(t, map[string]any{"name": "b"})
	call := func(key, method, path string, body map[string]any) (int, []byte) {
		t.Helper()
		resp, b := keyedCall(t, g.testGateway, key, method, path, body)
		return resp.StatusCode, b
	}
	status, b := call(keyA, http.MethodPost, "/v1/responses", map[string]any{"input": words(100, 20), "max_output_tokens": 2})
	var r responseBody
	if status != http.StatusOK || json.Unmarshal(b, &r) != nil || r.ID == "" {
		t.Fatalf("a: %d %s", status, b)
	}
	next := map[string]any{"previous_response_id": r.ID, "input": "more", "max_output_tokens": 2}
	if status, b := call(keyB, http.MethodPost, "/v1/responses", next); status != http.StatusNotFound || !bytes.Contains(b, []byte("not found")) {
		t.Fatalf("b continuing a's response: %d %s", status, b)
	}
	if status, b := call(keyB, http.MethodGet, "/v1/responses/"+r.ID, nil); status != http.StatusNotFound {
		t.Fatalf("b reading a's response: %d %s", status, b)
	}
	if status, b := call(keyA, http.MethodPost, "/v1/responses", next); status != http.StatusOK {
		t.Fatalf("a continuing its own: %d %s", status, b)
	}
	if status, b := call(keyA, http.MethodGet, "/v1/responses/"+r.ID, nil); status != http.StatusOK || !bytes.Contains(b, []byte(r.ID)) {
		t.Fatalf("a reading its own: %d %s", status, b)
	}
}

// A background response (background: true) through the proxy: answered
// "queued" by the replica that will hold it, read there until it ends, and
// cancelled there (the proxy passes the cancel to that replica; the engine
// answers "cancelled", or refuses a finished one).
func TestResponsesBackgroundProxied(t *testing.T) {
	a, b := storeEngine(t), storeEngine(t)
	g := startGateway(t, testConfig(t, a, b))
	resp, r, body := g.respond(t, map[string]any{"model": "sim", "input": words(100, 40), "background": true, "max_output_tokens": 8})
	home := resp.Header.Get(HeaderReplica)
	if resp.StatusCode != http.StatusOK || r.Status != "queued" || home == "" {
		t.Fatalf("background: %d on %q: %s", resp.StatusCode, home, body)
	}
	read := func(id string) (string, string) {
		t.Helper()
		resp, err := g.client.Get(g.base + "/v1/responses/" + id)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var rb responseBody
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &rb) != nil {
			t.Fatalf("GET %s: %d %s", id, resp.StatusCode, b)
		}
		return rb.Status, resp.Header.Get(HeaderReplica)
	}
	waitUntil(t, "the background response's end", 5*time.Second, func() bool {
		st, rep := read(r.ID)
		if rep != home {
			t.Fatalf("GET went to %q, the response is on %q", rep, home)
		}
		return st == "incomplete" || st == "completed"
	})
	cancel := func(id string) (int, []byte) {
		t.Helper()
		resp, err := g.client.Post(g.base+"/v1/responses/"+id+"/cancel", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if status, b := cancel(r.ID); status != http.StatusBadRequest || !bytes.Contains(b, []byte("Cannot cancel a synchronous response.")) {
		t.Fatalf("cancel of a finished response: %d %s", status, b)
	}
	// A long one, cancelled while it runs.
	resp, long, body := g.respond(t, map[string]any{"model": "sim", "input": words(400, 40), "background": true, "max_output_tokens": 3000})
	if resp.StatusCode != http.StatusOK || long.Status != "queued" {
		t.Fatalf("long background: %d %s", resp.StatusCode, body)
	}
	if status, b := cancel(long.ID); status != http.StatusOK || !bytes.Contains(b, []byte(`"status":"cancelled"`)) {
		t.Fatalf("cancel through the proxy: %d %s", status, b)
	}
	if st, _ := read(long.ID); st != "cancelled" {
		t.Fatalf("after the cancel: %s", st)
	}
}

// With usage metering (auth: keys), a background response's output tokens
// are metered when it ends: its answer ("queued") carries no usage, so the
// proxy reads it at its replica until its status is final.
func TestResponsesBackgroundMetered(t *testing.T) {
	g := startTenantGateway(t, storeEngine(t), nil, Deps{})
	id, key := g.createKey(t, map[string]any{"name": "bg"})
	if out := meteredBackground(t, g, id, key, 7, "metered"); out != 7 {
		t.Fatalf("metered %d output tokens, want 7 (the response's)", out)
	}
}

// An engine that ignores background and answers whole is metered from its
// answer, once: no watch.
func TestResponsesBackgroundIgnoredMeteredOnce(t *testing.T) {
	u := ignoringBackgroundEngine(t)
	g := startTenantGateway(t, u, nil, Deps{})
	id, key := g.createKey(t, map[string]any{"name": "bg"})
	resp, body := keyedCall(t, g.testGateway, key, http.MethodPost, "/v1/responses", map[string]any{"input": words(100, 20), "max_output_tokens": 7, "background": true})
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"status":"incomplete"`)) {
		t.Fatalf("answered whole: %d %s", resp.StatusCode, body)
	}
	time.Sleep(1500 * time.Millisecond) // past a watch's first read
	var out int64
	for _, r := range g.usageRows(t, "?key="+id) {
		out += r.OutputTokens
	}
	if out != 7 {
		t.Fatalf("metered %d output tokens, want 7 (once)", out)
	}
	for _, how := range []string{"metered", "expired", "lost", "shutdown"} {
		if n := testutil.ToFloat64(g.met.backgroundWatches.WithLabelValues(how)); n != 0 {
			t.Fatalf("a watch ended %s: the answer had its usage", how)
		}
	}
}

// A background response whose end the proxy cannot see (here: its replica
// never answers the read) is metered at its output bound when the watch
// expires, as the rate limiter charges what it does not know.
func TestResponsesBackgroundUnseenMeteredAtBound(t *testing.T) {
	u := failingReadsEngine(t, http.StatusServiceUnavailable, nil)
	g := startTenantGateway(t, u, func(c *config.Config) { c.RequestTimeout = time.Second }, Deps{})
	id, key := g.createKey(t, map[string]any{"name": "bg"})
	if out := meteredBackground(t, g, id, key, 9, "expired"); out != 9 {
		t.Fatalf("metered %d output tokens, want 9 (max_output_tokens)", out)
	}
}

// A background stream (background and stream) that the client leaves is
// generated still, as vLLM generates it: its replica is remembered, so the
// key resumes its stream through the proxy (GET ?stream=true&starting_after,
// with auth: keys, where nothing is searched for) and another key gets 404;
// and its whole output is metered when it ends, not what the stream had
// carried when the client left.
func TestResponsesBackgroundStreamLeft(t *testing.T) {
	g := startTenantGateway(t, storeEngine(t), nil, Deps{})
	keyID, key := g.createKey(t, map[string]any{"name": "bg"})
	_, other := g.createKey(t, map[string]any{"name": "other"})
	b, _ := json.Marshal(map[string]any{"input": words(100, 20), "max_output_tokens": 400, "background": true, "stream": true})
	req, _ := http.NewRequest(http.MethodPost, g.base+"/v1/responses", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := g.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("background stream: %d", resp.StatusCode)
	}
	id, _ := firstEvent(t, resp.Body)
	resp.Body.Close() // the client leaves
	waitUntil(t, "the request ended client_gone", 5*time.Second, func() bool {
		return testutil.ToFloat64(g.met.requests.WithLabelValues(server.DefaultModelName, "client_gone")) == 1
	})
	resp, body := keyedCall(t, g.testGateway, key, http.MethodGet, "/v1/responses/"+id+"?stream=true&starting_after=0", nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" ||
		!bytes.HasPrefix(body, []byte("event: response.in_progress\n")) || !bytes.Contains(body, []byte("event: response.completed\n")) ||
		!bytes.Contains(body, []byte(`"output_tokens":400`)) {
		t.Fatalf("the stream resumed through the proxy: %d %v\n%.300s", resp.StatusCode, resp.Header, body)
	}
	if resp, body := keyedCall(t, g.testGateway, other, http.MethodGet, "/v1/responses/"+id, nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("another key read it: %d %s", resp.StatusCode, body)
	}
	if out := watchedOutput(t, g, keyID, "metered"); out != 400 {
		t.Fatalf("metered %d output tokens, want 400 (the whole response)", out)
	}
}

// firstEvent reads a Responses stream's first event (response.created) from
// r, and returns its response's id and the event's bytes.
func firstEvent(t *testing.T, r io.Reader) (string, []byte) {
	t.Helper()
	br := bufio.NewReader(r)
	var raw []byte
	var created struct {
		Response responseBody `json:"response"`
	}
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatalf("in the first event: %v", err)
		}
		raw = append(raw, line...)
		if len(bytes.TrimSpace(line)) == 0 { // the blank line that ends it
			break
		}
		if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok && json.Unmarshal(d, &created) != nil {
			t.Fatalf("first event: %s", d)
		}
	}
	if created.Response.ID == "" {
		t.Fatalf("first event without a response id: %s", raw)
	}
	return created.Response.ID, raw
}

// The picker too remembers a background stream whose client left (Envoy's
// stream ended mid-response): a GET for it goes to its replica without a
// search.
func TestEPPBackgroundStreamLeft(t *testing.T) {
	ups := []*upstream{storeEngine(t), storeEngine(t)}
	e := startEPP(t, eppConfig(t, ups...), Deps{}, eppOptions{})
	body, _ := json.Marshal(map[string]any{"input": words(300, 40), "max_output_tokens": 400, "background": true, "stream": true})
	call := e.open(t, envoyReq{path: "/v1/responses", body: body})
	resp := call.forward()
	call.respond(resp, "")
	id, first := firstEvent(t, resp.Body)
	call.sendMsg(&extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_ResponseBody{ResponseBody: &extProcPb.HttpBody{Body: first}}})
	call.recv()
	call.cancel() // Envoy's stream ends: the client left
	resp.Body.Close()
	waitUntil(t, "the request's end", 5*time.Second, func() bool { return idle(e.Server) })
	home := call.pick.endpoint
	get := e.open(t, envoyReq{method: http.MethodGet, path: "/v1/responses/" + id})
	if get.pick.endpoint != home {
		t.Fatalf("GET picked %q, the response is on %q: %+v", get.pick.endpoint, home, get.pick)
	}
	get.serve()
	for _, how := range []string{searchFound, searchMissing, searchUnknown, searchBusy} {
		if n := testutil.ToFloat64(e.met.responseSearches.WithLabelValues(how)); n != 0 {
			t.Fatalf("the picker searched for the response it had passed on (%s: %v)", how, n)
		}
	}
}

// A background response holds its key's rate limits until the engine is
// done with it, not only until its "queued" answer: its concurrency slot
// (max_concurrency 1: another request is refused while it runs, served
// once it ended), and TPM is reconciled with the tokens it used (here 300
// of the 2000 its max_output_tokens reserved; without the refund the next
// request of the same estimate would not fit the key's TPM).
func TestResponsesBackgroundHoldsItsLimits(t *testing.T) {
	u := &upstream{t: t, cfg: server.Config{Engine: testEngineConfig(), ResponsesStore: 100, OutputTokens: 300}}
	u.start("127.0.0.1:0")
	t.Cleanup(u.kill)
	g := startTenantGateway(t, u, nil, Deps{})
	keyID, key := g.createKey(t, map[string]any{"name": "bg", "max_concurrency": 1, "tpm": 2500})
	body := map[string]any{"input": words(100, 20), "max_output_tokens": 2000, "background": true}
	resp, b := keyedCall(t, g.testGateway, key, http.MethodPost, "/v1/responses", body)
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"status":"queued"`)) {
		t.Fatalf("background: %d %s", resp.StatusCode, b)
	}
	resp, b = keyedCall(t, g.testGateway, key, http.MethodPost, "/v1/responses", map[string]any{"input": "hi", "max_output_tokens": 1})
	if resp.StatusCode != http.StatusTooManyRequests || !bytes.Contains(b, []byte("max_concurrency")) {
		t.Fatalf("a second request while the background one runs: %d %s", resp.StatusCode, b)
	}
	if out := watchedOutput(t, g, keyID, "metered"); out != 300 {
		t.Fatalf("metered %d output tokens, want 300", out)
	}
	waitUntil(t, "the reservation's end", 5*time.Second, func() bool { return g.ten.active.Load() == 0 })
	resp, b = keyedCall(t, g.testGateway, key, http.MethodPost, "/v1/responses", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the next background request, after the first ended: %d %s", resp.StatusCode, b)
	}
}

// A background response stays in the gateway core, on its replica, until
// the engine is done with it (as its watch reads it), not only until its
// "queued" answer: with one request at a time on the replica, a chat
// request sent after it waits in the queue for it (without a key or
// metering: the core's slot is for every gateway).
func TestResponsesBackgroundHeldInCore(t *testing.T) {
	u := &upstream{t: t, cfg: server.Config{Engine: testEngineConfig(), ResponsesStore: 100, OutputTokens: 150}}
	u.start("127.0.0.1:0")
	t.Cleanup(u.kill)
	c := testConfig(t, u)
	c.Models[0].MaxConcurrency = 1
	g := startGateway(t, c)
	resp, r, b := g.respond(t, map[string]any{"model": "sim", "input": words(100, 20), "max_output_tokens": 2000, "background": true})
	if resp.StatusCode != http.StatusOK || r.Status != "queued" {
		t.Fatalf("background: %d %s", resp.StatusCode, b)
	}
	if in, _ := g.inFlight(); in != 1 {
		t.Fatalf("%d requests in flight in the core after the queued answer, want the background one", in)
	}
	chat, _, err := g.complete(t.Context(), words(7, 10), 2)
	if err != nil {
		t.Fatal(err)
	}
	// Behind the background response's 150 tokens, and freed soon after
	// them: its watch reads it often while a request waits.
	if ms := queuedMs(t, chat); ms < 100 || ms > 850 {
		t.Fatalf("the chat request waited %v ms in the queue, want it behind the background response (150 tokens) and no longer", ms)
	}
	waitUntil(t, "an idle core", 5*time.Second, func() bool { in, _ := g.inFlight(); return in == 0 })
}

// max_background_responses bounds the background responses in flight: one
// more is refused with 429 before it reaches an engine, other requests go
// on, and the place is free again once the watch reads the first ended. A
// background request the engine answers whole (one that ignores
// background) gives its place back with its answer.
func TestBackgroundResponsesBound(t *testing.T) {
	u := &upstream{t: t, cfg: server.Config{Engine: testEngineConfig(), ResponsesStore: 100, OutputTokens: 300}}
	u.start("127.0.0.1:0")
	t.Cleanup(u.kill)
	c := testConfig(t, u)
	c.MaxBackgroundResponses = 1
	g := startGateway(t, c)
	bg := map[string]any{"model": "sim", "input": words(100, 20), "max_output_tokens": 2000, "background": true}
	if resp, r, b := g.respond(t, bg); resp.StatusCode != http.StatusOK || r.Status != "queued" {
		t.Fatalf("background: %d %s", resp.StatusCode, b)
	}
	if !strings.Contains(admin(t, g, "/metrics"), "\ninferrail_background_responses_in_flight 1\n") {
		t.Fatal("inferrail_background_responses_in_flight is not 1 while one runs")
	}
	// GET /admin/background lists it.
	var list struct {
		Max      int `json:"max_background_responses"`
		InFlight int `json:"in_flight"`
		Watched  []struct {
			ID, Model, Replica, Status string
		} `json:"watched"`
	}
	if b := admin(t, g, "/admin/background"); json.Unmarshal([]byte(b), &list) != nil || list.Max != 1 || list.InFlight != 1 || len(list.Watched) != 1 ||
		list.Watched[0].Model != server.DefaultModelName || list.Watched[0].Replica != "a" || !strings.HasPrefix(list.Watched[0].ID, "resp_") {
		t.Fatalf("GET /admin/background while one runs: %s", b)
	}
	served := testutil.ToFloat64(g.met.requests.WithLabelValues(server.DefaultModelName, "ok"))
	resp, _, b := g.respond(t, bg)
	var e wireError
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" || json.Unmarshal(b, &e) != nil ||
		e.Error.Code != "too_many_background_responses" || !strings.Contains(e.Error.Message, "max_background_responses") {
		t.Fatalf("a second background response: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	if testutil.ToFloat64(g.met.requests.WithLabelValues(server.DefaultModelName, "ok")) != served {
		t.Fatal("the refused request reached an engine")
	}
	if resp, _, b := g.respond(t, map[string]any{"model": "sim", "input": "hi", "max_output_tokens": 1}); resp.StatusCode != http.StatusOK {
		t.Fatalf("a foreground request: %d %s", resp.StatusCode, b)
	}
	waitUntil(t, "the first one's end", 10*time.Second, func() bool {
		return strings.Contains(admin(t, g, "/metrics"), "\ninferrail_background_responses_in_flight 0\n")
	})
	if b := admin(t, g, "/admin/background"); !strings.Contains(b, `"in_flight": 0`) || !strings.Contains(b, `"watched": []`) {
		t.Fatalf("GET /admin/background once it ended: %s", b)
	}
	if resp, r, b := g.respond(t, bg); resp.StatusCode != http.StatusOK || r.Status != "queued" {
		t.Fatalf("background after the first ended: %d %s", resp.StatusCode, b)
	}

	// An engine that ignores background: answered whole, no watch.
	ignoring := ignoringBackgroundEngine(t)
	c = testConfig(t, ignoring)
	c.MaxBackgroundResponses = 1
	g = startGateway(t, c)
	for i := range 3 {
		if resp, r, b := g.respond(t, map[string]any{"model": "sim", "input": words(i, 20), "max_output_tokens": 3, "background": true}); resp.StatusCode != http.StatusOK || r.Status == "queued" {
			t.Fatalf("background %d answered whole: %d %s", i, resp.StatusCode, b)
		}
	}
}

// The picker bounds background responses as live does: past
// max_background_responses one more is answered 429 at once, and the place
// comes back when the first one's stream ends without a watch.
func TestEPPBackgroundResponsesBound(t *testing.T) {
	c := eppConfig(t, storeEngine(t))
	c.MaxBackgroundResponses = 1
	e := startEPP(t, c, Deps{}, eppOptions{})
	body, _ := json.Marshal(map[string]any{"input": words(300, 40), "max_output_tokens": 3, "background": true})
	first := e.open(t, envoyReq{path: "/v1/responses", body: body})
	if first.pick.endpoint == "" {
		t.Fatalf("the first background request: %+v", first.pick)
	}
	second := e.open(t, envoyReq{path: "/v1/responses", body: body})
	if second.pick.status() != http.StatusTooManyRequests || second.pick.errorCode(t) != "too_many_background_responses" {
		t.Fatalf("a second background request: %+v", second.pick)
	}
	first.cancel() // Envoy's stream ends before the answer: no watch
	waitUntil(t, "the place given back", 5*time.Second, func() bool {
		third := e.open(t, envoyReq{path: "/v1/responses", body: body})
		defer third.cancel()
		return third.pick.endpoint != ""
	})
}

// A background response its engine no longer has (404 at its read, as an
// engine restarted since answers) ends its watch at once (lost): its slot
// in the core and its key's limits are freed, and it is metered at its
// output bound, as what the proxy does not know is charged.
func TestResponsesBackgroundLost(t *testing.T) {
	var forget atomic.Bool
	u := failingReadsEngine(t, http.StatusNotFound, &forget)
	g := startTenantGateway(t, u, nil, Deps{})
	keyID, key := g.createKey(t, map[string]any{"name": "bg", "max_concurrency": 1})
	resp, b := keyedCall(t, g.testGateway, key, http.MethodPost, "/v1/responses", map[string]any{"input": words(100, 20), "max_output_tokens": 5000, "background": true})
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"status":"queued"`)) {
		t.Fatalf("background: %d %s", resp.StatusCode, b)
	}
	forget.Store(true) // the engine "restarts": it no longer has the response
	began := time.Now()
	if out := watchedOutput(t, g, keyID, "lost"); out != 5000 {
		t.Fatalf("metered %d output tokens, want 5000 (max_output_tokens)", out)
	}
	if took := time.Since(began); took > 3*time.Second {
		t.Fatalf("the watch ended %v after the engine lost the response", took)
	}
	waitUntil(t, "the slot freed", 2*time.Second, func() bool { in, _ := g.inFlight(); return in == 0 })
	if resp, b := keyedCall(t, g.testGateway, key, http.MethodPost, "/v1/responses", map[string]any{"input": "hi", "max_output_tokens": 1}); resp.StatusCode != http.StatusOK {
		t.Fatalf("the key's next request: %d %s", resp.StatusCode, b)
	}
}

// A background response whose replica fails every read (here 503) ends
// its watch after ten failed reads in a row (lost, in about nine seconds),
// not at request_timeout: metered at its output bound, its slot freed.
func TestResponsesBackgroundLostAfterFailures(t *testing.T) {
	u := failingReadsEngine(t, http.StatusServiceUnavailable, nil)
	g := startTenantGateway(t, u, func(c *config.Config) { c.RequestTimeout = time.Hour }, Deps{})
	id, key := g.createKey(t, map[string]any{"name": "bg"})
	began := time.Now()
	if out := meteredBackground(t, g, id, key, 11, "lost"); out != 11 {
		t.Fatalf("metered %d output tokens, want 11 (max_output_tokens)", out)
	}
	if took := time.Since(began); took < 8*time.Second {
		t.Fatalf("lost after %v: want ten failed reads first", took)
	}
	waitUntil(t, "the slot freed", 2*time.Second, func() bool { in, _ := g.inFlight(); return in == 0 })
}
