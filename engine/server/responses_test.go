package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// respBody is what the tests read of a response object.
type respBody struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Status             string  `json:"status"`
	Background         bool    `json:"background"`
	Model              string  `json:"model"`
	MaxOutputTokens    int     `json:"max_output_tokens"`
	PreviousResponseID *string `json:"previous_response_id"`
	IncompleteDetails  *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Role    string `json:"role"`
		Status  string `json:"status"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func (r respBody) text() string {
	if len(r.Output) != 1 || len(r.Output[0].Content) != 1 {
		return fmt.Sprintf("<output %+v>", r.Output)
	}
	return r.Output[0].Content[0].Text
}

// respond posts to /v1/responses and decodes a 200 answer.
func respond(t *testing.T, ts *testServer, body map[string]any) (respBody, []byte) {
	t.Helper()
	resp, b := postRaw(t, ts, "/v1/responses", "", body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("POST /v1/responses %v: %d %s", body, resp.StatusCode, b)
	}
	var r respBody
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return r, b
}

func getPath(t *testing.T, ts *testServer, path string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, ts.base+path, nil)
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// chatUsage posts messages to the chat endpoint and returns its answer and
// prompt tokens.
func chatUsage(t *testing.T, ts *testServer, msgs []map[string]any, maxTokens int) (string, int) {
	t.Helper()
	resp, b := postRaw(t, ts, "/v1/chat/completions", "", map[string]any{"messages": msgs, "max_tokens": maxTokens})
	var c chatResponse
	if resp.StatusCode != 200 || json.Unmarshal(b, &c) != nil {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	return c.Choices[0].Message.Content, c.Usage.PromptTokens
}

var (
	respIDPattern = regexp.MustCompile(`^resp_[0-9a-f]{32}$`)
	msgIDPattern  = regexp.MustCompile(`^msg_[0-9a-f]{32}$`)
)

// The non-streamed answer: vLLM's ResponsesResponse field for field, the
// prompt built as the chat endpoint builds it from the same messages (same
// tokens, same generated text), cached tokens reported on a repeat.
func TestResponsesAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), OutputTokens: 5})
		defer ts.stop()
		instr, input := words(ts.Server, 100, 30), words(ts.Server, 200, 40)
		req := map[string]any{"model": "inferrail-sim", "instructions": instr, "input": input, "max_output_tokens": 8,
			"temperature": 0.5, "user": "u1", "metadata": map[string]string{"k": "v"}, "tools": []any{}, "not_a_field": true}
		r, b := respond(t, ts, req)
		want := `{"id":"<string>","created_at":"<number>","incomplete_details":null,"instructions":"<string>","metadata":{"k":"v"},
			"model":"inferrail-sim","object":"response",
			"output":[{"id":"<string>","content":[{"annotations":[],"text":"<string>","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message"}],
			"parallel_tool_calls":true,"temperature":0.5,"tool_choice":"auto","tools":[],"top_p":1,"background":false,"max_output_tokens":8,
			"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"completed",
			"text":null,"top_logprobs":null,"truncation":"disabled",
			"usage":{"input_tokens":"<number>","input_tokens_details":{"cached_tokens":0,"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},
				"output_tokens":5,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],"tool_output_tokens_per_turn":[]},
				"total_tokens":"<number>"},
			"user":"u1","input_messages":null,"output_messages":null}`
		if err := matchJSON([]byte(want), b); err != nil {
			t.Fatalf("%v\nresponse: %s", err, b)
		}
		if !respIDPattern.MatchString(r.ID) || !msgIDPattern.MatchString(r.Output[0].ID) {
			t.Fatalf("ids %q, %q: want resp_ and msg_ with 32 hex digits", r.ID, r.Output[0].ID)
		}
		// The chat endpoint, given the same messages, reads the same prompt
		// and writes the same answer.
		answer, chatPrompt := chatUsage(t, ts, []map[string]any{{"role": "system", "content": instr}, {"role": "user", "content": input}}, 8)
		u := r.Usage
		if u.InputTokens != chatPrompt || u.TotalTokens != chatPrompt+5 || r.text() != answer || len(ts.tok.Encode(r.text())) != 5 {
			t.Fatalf("usage %+v, text %q; chat read %d prompt tokens and wrote %q", *u, r.text(), chatPrompt, answer)
		}
		// A repeat finds the prompt's blocks in the prefix cache.
		r2, _ := respond(t, ts, req)
		if r2.Usage.InputTokensDetails.CachedTokens == 0 || r2.Usage.InputTokensDetails.CachedTokens >= r2.Usage.InputTokens || r2.ID == r.ID {
			t.Fatalf("repeat: id %s (first %s), usage %+v: want a new id and cached tokens", r2.ID, r.ID, *r2.Usage)
		}
		// Served by the engine as any chat request: counted in vLLM's metrics.
		if m := scrape(t, ts); !strings.Contains(m, `vllm:request_success_total{engine="0",finished_reason="stop",model_name="inferrail-sim"} 3`) {
			t.Fatalf("metrics do not count the three requests:\n%s", m)
		}
	})
}

// respEvent is one server-sent event of a Responses stream.
type respEvent struct {
	name string
	data []byte
	v    struct {
		Type           string          `json:"type"`
		SequenceNumber *int            `json:"sequence_number"`
		ItemID         string          `json:"item_id"`
		OutputIndex    *int            `json:"output_index"`
		ContentIndex   *int            `json:"content_index"`
		Delta          string          `json:"delta"`
		Text           string          `json:"text"`
		Code           string          `json:"code"`
		Message        string          `json:"message"`
		Response       json.RawMessage `json:"response"`
	}
}

// readResponseEvents reads `event: <type>` / `data: <json>` pairs to the
// end of the stream; every data has its event's type.
func readResponseEvents(t *testing.T, r io.Reader) []respEvent {
	t.Helper()
	var out []respEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		name, ok := strings.CutPrefix(line, "event: ")
		if !ok {
			t.Fatalf("line %q: want an event line", line)
		}
		if !sc.Scan() {
			t.Fatalf("event %s without data", name)
		}
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			t.Fatalf("event %s: line %q, want its data", name, sc.Text())
		}
		e := respEvent{name: name, data: []byte(data)}
		if err := json.Unmarshal(e.data, &e.v); err != nil || e.v.Type != name || e.v.SequenceNumber == nil {
			t.Fatalf("event %s: data %s: want its type and a sequence number (%v)", name, data, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func streamResponses(t *testing.T, ts *testServer, body map[string]any) []respEvent {
	t.Helper()
	body["stream"] = true
	resp, err := ts.post(context.Background(), "/v1/responses", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	return readResponseEvents(t, resp.Body)
}

// checkEventOrder checks a finished stream's events: their order, their
// numbering, one item throughout, and that the deltas add up to the text.
// It returns the final response.
func checkEventOrder(t *testing.T, evs []respEvent) respBody {
	t.Helper()
	var names []string
	for i, e := range evs {
		names = append(names, e.name)
		if *e.v.SequenceNumber != i {
			t.Fatalf("event %d (%s) has sequence_number %d", i, e.name, *e.v.SequenceNumber)
		}
	}
	got := strings.Join(names, " ")
	order := regexp.MustCompile(`^response\.created response\.in_progress response\.output_item\.added response\.content_part\.added` +
		`( response\.output_text\.delta)+ response\.output_text\.done response\.content_part\.done response\.output_item\.done response\.completed$`)
	if !order.MatchString(got) {
		t.Fatalf("events %s", got)
	}
	var start, final respBody
	if json.Unmarshal(evs[0].v.Response, &start) != nil || json.Unmarshal(evs[len(evs)-1].v.Response, &final) != nil {
		t.Fatal("created or completed without a response")
	}
	if start.Status != "in_progress" || len(start.Output) != 0 || start.Usage != nil || start.ID != final.ID || !respIDPattern.MatchString(start.ID) {
		t.Fatalf("created: %s", evs[0].data)
	}
	var deltas strings.Builder
	var done string
	for _, e := range evs[2 : len(evs)-1] {
		if e.name != "response.output_item.added" && e.name != "response.output_item.done" &&
			(e.v.ItemID != final.Output[0].ID || *e.v.OutputIndex != 0 || *e.v.ContentIndex != 0) {
			t.Fatalf("%s: %s, want item %s, indexes 0", e.name, e.data, final.Output[0].ID)
		}
		switch e.name {
		case "response.output_text.delta":
			deltas.WriteString(e.v.Delta)
		case "response.output_text.done":
			done = e.v.Text
		}
	}
	if deltas.String() != done || done != final.text() || final.Usage == nil {
		t.Fatalf("deltas %q, done %q, final %s", deltas.String(), done, evs[len(evs)-1].data)
	}
	return final
}

// The stream: vLLM's events in order, numbered from 0, the deltas adding up
// to the done text, usage in response.completed.
func TestResponsesStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), OutputTokens: 6})
		defer ts.stop()
		input := []map[string]any{{"type": "message", "role": "user", "content": []map[string]any{{"type": "input_text", "text": words(ts.Server, 50, 20)}}}}
		evs := streamResponses(t, ts, map[string]any{"input": input, "max_output_tokens": 10})
		final := checkEventOrder(t, evs)
		deltas := 0
		for _, e := range evs {
			if e.name == "response.output_text.delta" {
				deltas++
			}
		}
		if deltas < 2 {
			t.Errorf("%d deltas: want one per engine step that wrote tokens", deltas)
		}
		// The same request unstreamed: the same text and usage.
		r, _ := respond(t, ts, map[string]any{"input": input, "max_output_tokens": 10})
		if final.Status != "completed" || final.IncompleteDetails != nil || final.Usage.OutputTokens != 6 || final.Usage.InputTokens != r.Usage.InputTokens ||
			final.Usage.TotalTokens != r.Usage.InputTokens+6 || final.text() != r.text() {
			t.Fatalf("final %s; unstreamed %+v %q", evs[len(evs)-1].data, *r.Usage, r.text())
		}
		// The events' shapes, field for field.
		for i, want := range map[int]string{
			2:            `{"item":{"id":"<string>","content":[],"role":"assistant","status":"in_progress","type":"message"},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}`,
			3:            `{"content_index":0,"item_id":"<string>","output_index":0,"part":{"annotations":[],"text":"","type":"output_text","logprobs":[]},"sequence_number":3,"type":"response.content_part.added"}`,
			4:            `{"content_index":0,"delta":"<string>","item_id":"<string>","logprobs":[],"output_index":0,"sequence_number":4,"type":"response.output_text.delta"}`,
			len(evs) - 4: `{"content_index":0,"item_id":"<string>","logprobs":[],"output_index":0,"sequence_number":"<number>","text":"<string>","type":"response.output_text.done"}`,
			len(evs) - 3: `{"content_index":0,"item_id":"<string>","output_index":0,"part":{"annotations":[],"text":"<string>","type":"output_text","logprobs":null},"sequence_number":"<number>","type":"response.content_part.done"}`,
			len(evs) - 2: `{"item":{"id":"<string>","content":[{"annotations":[],"text":"<string>","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message"},"output_index":0,"sequence_number":"<number>","type":"response.output_item.done"}`,
		} {
			if err := matchJSON([]byte(want), evs[i].data); err != nil {
				t.Errorf("event %d: %v\n%s", i, err, evs[i].data)
			}
		}
	})
}

// Generation stopped by max_output_tokens: status incomplete, reason
// max_output_tokens, streamed or not; a larger max_output_tokens than fits
// is cut to what fits, as vLLM cuts it.
func TestResponsesIncomplete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), OutputTokens: 50})
		defer ts.stop()
		input := words(ts.Server, 10, 12)
		r, _ := respond(t, ts, map[string]any{"input": input, "max_output_tokens": 3})
		if r.Status != "incomplete" || r.IncompleteDetails == nil || r.IncompleteDetails.Reason != "max_output_tokens" || r.Usage.OutputTokens != 3 || r.MaxOutputTokens != 3 {
			t.Fatalf("%+v: want incomplete after 3 tokens", r)
		}
		final := checkEventOrder(t, streamResponses(t, ts, map[string]any{"input": input, "max_output_tokens": 3}))
		if final.Status != "incomplete" || final.IncompleteDetails == nil || final.IncompleteDetails.Reason != "max_output_tokens" || final.Usage.OutputTokens != 3 {
			t.Fatalf("streamed: %+v", final)
		}
		r, _ = respond(t, ts, map[string]any{"input": input, "max_output_tokens": 1 << 20})
		if r.Status != "completed" || r.Usage.OutputTokens != 50 || r.MaxOutputTokens != testEngine().MaxModelLen-r.Usage.InputTokens {
			t.Fatalf("%+v: want 50 tokens, max_output_tokens cut to the context left", r)
		}
		r, _ = respond(t, ts, map[string]any{"input": input})
		if r.MaxOutputTokens != testEngine().MaxModelLen-r.Usage.InputTokens {
			t.Fatalf("default max_output_tokens %d, want the context left", r.MaxOutputTokens)
		}
	})
}

// With the store on, previous_response_id continues a conversation: the
// stored messages and answer come before the new input, and the prefix
// cache holds the first turn. GET /v1/responses/{id} returns the stored
// response, streamed or not.
func TestResponsesPreviousResponse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), OutputTokens: 20, ResponsesStore: 8})
		defer ts.stop()
		first, second := words(ts.Server, 300, 100), words(ts.Server, 900, 10)
		r1, b1 := respond(t, ts, map[string]any{"input": first})
		r2, _ := respond(t, ts, map[string]any{"input": second, "previous_response_id": r1.ID})
		p1, o1 := r1.Usage.InputTokens, r1.Usage.OutputTokens
		if r2.Usage.InputTokens <= p1+o1 || r2.PreviousResponseID == nil || *r2.PreviousResponseID != r1.ID {
			t.Fatalf("second turn: %+v after %d + %d tokens", r2, p1, o1)
		}
		// Exactly the conversation the chat endpoint would read.
		_, chatPrompt := chatUsage(t, ts, []map[string]any{{"role": "user", "content": first}, {"role": "assistant", "content": r1.text()}, {"role": "user", "content": second}}, 1)
		if r2.Usage.InputTokens != chatPrompt {
			t.Fatalf("second turn read %d tokens, the chat endpoint %d for the same conversation", r2.Usage.InputTokens, chatPrompt)
		}
		if min := (p1 + o1 - 16) / 16 * 16; r2.Usage.InputTokensDetails.CachedTokens < min {
			t.Fatalf("second turn found %d cached tokens, want at least %d (the first turn's blocks)", r2.Usage.InputTokensDetails.CachedTokens, min)
		}
		// A third turn chains through the second.
		r3, _ := respond(t, ts, map[string]any{"input": "and then", "previous_response_id": r2.ID, "instructions": "be brief"})
		_, chatPrompt = chatUsage(t, ts, []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": first}, {"role": "assistant", "content": r1.text()},
			{"role": "user", "content": second}, {"role": "assistant", "content": r2.text()}, {"role": "user", "content": "and then"}}, 1)
		if r3.Usage.InputTokens != chatPrompt {
			t.Fatalf("third turn read %d tokens, want %d", r3.Usage.InputTokens, chatPrompt)
		}
		// Retrieval returns the stored body.
		status, got := getPath(t, ts, "/v1/responses/"+r1.ID)
		if status != 200 || !bytes.Equal(got, b1) {
			t.Fatalf("GET: %d %s\nwant %s", status, got, b1)
		}
		// A streamed response is stored too, as response.completed carried it.
		evs := streamResponses(t, ts, map[string]any{"input": second})
		final := checkEventOrder(t, evs)
		status, got = getPath(t, ts, "/v1/responses/"+final.ID)
		var stored struct {
			Response json.RawMessage `json:"response"`
		}
		json.Unmarshal(evs[len(evs)-1].data, &stored)
		if status != 200 || !bytes.Equal(got, stored.Response) {
			t.Fatalf("GET streamed: %d %s\nwant %s", status, got, stored.Response)
		}
		// store: false is not kept.
		r4, _ := respond(t, ts, map[string]any{"input": second, "store": false})
		if status, _ := getPath(t, ts, "/v1/responses/"+r4.ID); status != 404 {
			t.Fatalf("store false: GET %d, want 404", status)
		}
		// Other methods on a response's path are refused as FastAPI does.
		if status, b := postPath(t, ts, "/v1/responses/"+r1.ID, "{}"); status != 405 || string(b) != `{"detail":"Method Not Allowed"}` {
			t.Fatalf("POST on a response: %d %s", status, b)
		}
		if status, _ := getPath(t, ts, "/v1/responses"); status != 405 {
			t.Fatalf("GET /v1/responses: %d, want 405", status)
		}
	})
}

// checkNotFound checks vLLM's 404 for an unknown response id.
func checkNotFound(t *testing.T, status int, b []byte, id string) {
	t.Helper()
	var e errorResponse
	if status != 404 || json.Unmarshal(b, &e) != nil || e.Error.Message != "Response with id '"+id+"' not found." ||
		e.Error.Type != "invalid_request_error" || e.Error.Code != 404 {
		t.Fatalf("%d %s: want vLLM's 404 for %s", status, b, id)
	}
}

// Without the store (vLLM's default), store: true is ignored: nothing can
// be continued or retrieved.
func TestResponsesStoreOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), OutputTokens: 4})
		defer ts.stop()
		r1, _ := respond(t, ts, map[string]any{"input": "hello there ", "store": true})
		resp, b := postRaw(t, ts, "/v1/responses", "", map[string]any{"input": "more ", "previous_response_id": r1.ID})
		checkNotFound(t, resp.StatusCode, b, r1.ID)
		status, b := getPath(t, ts, "/v1/responses/"+r1.ID)
		checkNotFound(t, status, b, r1.ID)
	})
}

// The store keeps the latest N responses: the oldest goes first, and the
// store never grows past N.
func TestResponsesStoreBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), OutputTokens: 4, ResponsesStore: 2})
		defer ts.stop()
		var ids []string
		for i := range 3 {
			r, _ := respond(t, ts, map[string]any{"input": words(ts.Server, 10*i+5, 5)})
			ids = append(ids, r.ID)
		}
		status, b := getPath(t, ts, "/v1/responses/"+ids[0])
		checkNotFound(t, status, b, ids[0])
		resp, b := postRaw(t, ts, "/v1/responses", "", map[string]any{"input": "x ", "previous_response_id": ids[0]})
		checkNotFound(t, resp.StatusCode, b, ids[0])
		for _, id := range ids[1:] {
			if status, b := getPath(t, ts, "/v1/responses/"+id); status != 200 {
				t.Fatalf("GET %s: %d %s", id, status, b)
			}
		}
	})
	var st responseStore
	for i := range 10000 {
		st.put(3, fmt.Sprint(i), storedResponse{})
	}
	if _, ok := st.get("9999"); !ok || len(st.byID) != 3 || cap(st.order) > 64 {
		t.Fatalf("store of 3 after 10000 puts: %d kept, order's capacity %d", len(st.byID), cap(st.order))
	}
	if _, ok := st.get("9996"); ok {
		t.Fatal("the 4th newest is still kept")
	}
}

// Bad requests get vLLM's error body naming the parameter; unknown fields
// are ignored.
func TestResponsesBadRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), OutputTokens: 2})
		defer ts.stop()
		long := strings.Repeat("w ", 5000)
		for _, tc := range []struct {
			body   string
			status int
			param  string
		}{
			{`{"model": "inferrail-sim"}`, 400, "input"},
			{`{"input": 7}`, 400, "input"},
			{`{"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}`, 400, "input"},
			{`{"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}`, 400, "input"},
			{`{"input": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}`, 400, "input"},
			{`{"input": [{"role": "tool", "content": "hi"}]}`, 400, "input"},
			{`{"input": [{"content": "hi"}]}`, 400, "input"},
			{`{"input": [{"role": "user"}]}`, 400, "input"},
			{`{"input": ["hi"]}`, 400, "input"},
			{`{"input": []}`, 400, "input"},
			{`{"input": "` + long + `"}`, 400, "input"},
			{`{"input": "hi", "max_output_tokens": 0}`, 400, "max_output_tokens"},
			{`{"input": "hi", "cache_salt": ""}`, 400, "cache_salt"},
			{`{"input": "hi", "instructions": 3}`, 400, "instructions"},
			{`{"input": "hi", "model": "gpt-4o"}`, 404, "model"},
		} {
			status, b := postPath(t, ts, "/v1/responses", tc.body)
			var e errorResponse
			if status != tc.status || json.Unmarshal(b, &e) != nil || e.Error.Param == nil || *e.Error.Param != tc.param || e.Error.Code != tc.status {
				t.Errorf("%.80s: %d %s; want %d naming %s", tc.body, status, b, tc.status, tc.param)
			}
		}
		// An unknown model is refused as the chat endpoint refuses it.
		_, chat := postPath(t, ts, "/v1/chat/completions", `{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}`)
		if _, b := postPath(t, ts, "/v1/responses", `{"model": "gpt-4o", "input": "hi"}`); !bytes.Equal(b, chat) {
			t.Errorf("unknown model: %s, chat answers %s", b, chat)
		}
		// Every message role and both text part types; fields the mock does
		// not use are accepted.
		status, b := postPath(t, ts, "/v1/responses", `{"input": [{"role": "developer", "content": "d"}, {"role": "system", "content": [{"type": "input_text", "text": "s"}]},
			{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a", "annotations": []}]}, {"role": "user", "content": "u"}],
			"top_p": 0.9, "tool_choice": "none", "reasoning": {"effort": "low"}, "include": [], "prompt_cache_key": "k", "whatever": {"x": 1}}`)
		if status != 200 || !strings.Contains(string(b), `"top_p":0.9`) || !strings.Contains(string(b), `"tool_choice":"none"`) {
			t.Fatalf("%d %s", status, b)
		}
	})
}

// Injected errors answer before the stream as chat's do; an engine that
// fails after the stream started ends it with an error event.
func TestResponsesFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), Faults: Faults{ErrorRate: 1, ErrorStatus: 503}})
		defer ts.stop()
		resp, b := postRaw(t, ts, "/v1/responses", "", map[string]any{"input": "hi ", "stream": true})
		var e errorResponse
		if resp.StatusCode != 503 || json.Unmarshal(b, &e) != nil || e.Error.Code != 503 {
			t.Fatalf("injected error: %d %s", resp.StatusCode, b)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine()})
		defer ts.stop()
		resp, err := ts.post(context.Background(), "/v1/responses", map[string]any{"input": "hi ", "stream": true, "max_output_tokens": 1000})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		var head []byte
		for !bytes.Contains(head, []byte("event: response.output_text.delta")) {
			line, err := br.ReadBytes('\n')
			if err != nil {
				t.Fatalf("%v after %s", err, head)
			}
			head = append(head, line...)
		}
		ts.halt() // the engine goes away mid-stream
		rest, _ := io.ReadAll(br)
		evs := readResponseEvents(t, io.MultiReader(bytes.NewReader(head), bytes.NewReader(rest)))
		last := evs[len(evs)-1]
		want := `{"code":"server_error","message":"` + errShutdown.Error() + `","param":null,"sequence_number":"<number>","type":"error"}`
		if err := matchJSON([]byte(want), last.data); err != nil || last.name != "error" || *last.v.SequenceNumber != len(evs)-1 {
			t.Fatalf("last event %s %s: want an error event (%v)", last.name, last.data, err)
		}
	})
}

// background: true is vLLM's background mode: answered at once "queued"
// with no output or usage, generated after (GET reads it finished when
// done, with the same output a foreground request gets); cancel stops one
// still running ("cancelled", its slot freed in the engine) and refuses a
// finished one as vLLM does; it needs the store.
func TestResponsesBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), ResponsesStore: 8})
		defer ts.stop()
		input := words(ts.Server, 100, 40)
		began := time.Now()
		r, _ := respond(t, ts, map[string]any{"input": input, "background": true, "max_output_tokens": 64})
		if r.Status != "queued" || !r.Background || r.Usage != nil || len(r.Output) != 0 || time.Since(began) != 0 {
			t.Fatalf("background answer: %+v after %v", r, time.Since(began))
		}
		status, b := getPath(t, ts, "/v1/responses/"+r.ID)
		var got respBody
		if status != 200 || json.Unmarshal(b, &got) != nil || got.Status != "queued" {
			t.Fatalf("GET at once: %d %s", status, b)
		}
		time.Sleep(10 * time.Second) // the engine's virtual time: long done
		status, b = getPath(t, ts, "/v1/responses/"+r.ID)
		if status != 200 || json.Unmarshal(b, &got) != nil || got.Status != "incomplete" || got.Usage == nil || got.Usage.OutputTokens != 64 {
			t.Fatalf("GET once done (its max_output_tokens reached): %d %s", status, b)
		}
		fg, _ := respond(t, ts, map[string]any{"input": input, "max_output_tokens": 64})
		if got.text() != fg.text() {
			t.Fatalf("background output %q, foreground %q", got.text(), fg.text())
		}
		resp, b := postRaw(t, ts, "/v1/responses/"+r.ID+"/cancel", "", nil)
		var e errorResponse
		if resp.StatusCode != 400 || json.Unmarshal(b, &e) != nil || e.Error.Message != "Cannot cancel a synchronous response." {
			t.Fatalf("cancel of a finished response: %d %s", resp.StatusCode, b)
		}

		// A long one, cancelled while it runs: its slot is freed.
		long, _ := respond(t, ts, map[string]any{"input": words(ts.Server, 400, 40), "background": true, "max_output_tokens": 3000})
		time.Sleep(50 * time.Millisecond)
		if !strings.Contains(scrape(t, ts), "vllm:num_requests_running{engine=\"0\",model_name=\"inferrail-sim\"} 1\n") {
			t.Fatalf("the background request is not running in the engine:\n%s", grepLines(scrape(t, ts), "num_requests_running"))
		}
		resp, b = postRaw(t, ts, "/v1/responses/"+long.ID+"/cancel", "", nil)
		if resp.StatusCode != 200 || json.Unmarshal(b, &got) != nil || got.Status != "cancelled" {
			t.Fatalf("cancel: %d %s", resp.StatusCode, b)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !strings.Contains(scrape(t, ts), "vllm:num_requests_running{engine=\"0\",model_name=\"inferrail-sim\"} 0\n") {
			t.Fatalf("a request runs after the cancel:\n%s", grepLines(scrape(t, ts), "num_requests_running"))
		}
		if status, b := getPath(t, ts, "/v1/responses/"+long.ID); status != 200 || json.Unmarshal(b, &got) != nil || got.Status != "cancelled" {
			t.Fatalf("GET after cancel: %d %s", status, b)
		}
		resp, b = postRaw(t, ts, "/v1/responses/resp_nosuch/cancel", "", nil)
		checkNotFound(t, resp.StatusCode, b, "resp_nosuch")

		for _, c := range []struct {
			body map[string]any
			msg  string
		}{
			{map[string]any{"input": "x", "background": true, "store": false}, "background can only be used when `store` is true"},
		} {
			resp, b := postRaw(t, ts, "/v1/responses", "", c.body)
			if resp.StatusCode != 400 || !bytes.Contains(b, []byte(c.msg)) {
				t.Fatalf("%v: %d %s", c.body, resp.StatusCode, b)
			}
		}
	})
}

// background with stream is vLLM's resumable stream: the answer is the
// generation's event stream, which the client may leave without stopping
// the generation; GET ?stream=true replays its events from starting_after's
// next one and follows them to response.completed, the same events with
// the same numbers. A response made otherwise has no events to replay
// (400, as vLLM's "Unknown response_id"), an unknown one is 404, a bad
// starting_after 400; cancel ends the followers.
func TestResponsesBackgroundStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), ResponsesStore: 8})
		defer ts.stop()
		input := words(ts.Server, 100, 40)
		ctx, leave := context.WithCancel(context.Background())
		resp, err := ts.post(ctx, "/v1/responses", map[string]any{"input": input, "background": true, "stream": true, "max_output_tokens": 64})
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
			t.Fatalf("background stream: %d %v", resp.StatusCode, resp.Header)
		}
		// The client reads the first event and leaves.
		br := bufio.NewReader(resp.Body)
		var first []byte
		for {
			line, err := br.ReadBytes('\n')
			if err != nil {
				t.Fatalf("first event: %v", err)
			}
			if len(bytes.TrimSpace(line)) == 0 {
				break
			}
			first = append(first, line...)
		}
		leave()
		resp.Body.Close()
		evs0 := readResponseEvents(t, bytes.NewReader(first))
		var start respBody
		if len(evs0) != 1 || evs0[0].name != "response.created" || json.Unmarshal(evs0[0].v.Response, &start) != nil || !start.Background {
			t.Fatalf("first event: %s", first)
		}
		time.Sleep(10 * time.Second) // the engine's virtual time: long done
		status, b := getPath(t, ts, "/v1/responses/"+start.ID)
		var got respBody
		if status != 200 || json.Unmarshal(b, &got) != nil || got.Status != "incomplete" || got.Usage == nil || got.Usage.OutputTokens != 64 {
			t.Fatalf("GET after the client left the stream: %d %s", status, b)
		}
		// Replayed whole, then from the third event on: the same events.
		replay := func(query string) (int, []byte) {
			return getPath(t, ts, "/v1/responses/"+start.ID+"?stream=true"+query)
		}
		status, b = replay("")
		all := readResponseEvents(t, bytes.NewReader(b))
		if status != 200 || checkEventOrder(t, all).text() != got.text() {
			t.Fatalf("replay: %d %s", status, b)
		}
		status, b = replay("&starting_after=1")
		tail := readResponseEvents(t, bytes.NewReader(b))
		if status != 200 || len(tail) != len(all)-2 || !bytes.Equal(tail[0].data, all[2].data) || tail[len(tail)-1].name != "response.completed" {
			t.Fatalf("replay after event 1: %d, %d events of %d", status, len(tail), len(all))
		}

		// Followed live, then cancelled: the follower's stream ends.
		long, err := ts.post(context.Background(), "/v1/responses", map[string]any{"input": words(ts.Server, 400, 40), "background": true, "stream": true, "max_output_tokens": 3000})
		if err != nil {
			t.Fatal(err)
		}
		defer long.Body.Close()
		br = bufio.NewReader(long.Body)
		line, _ := br.ReadBytes('\n')
		data, _ := br.ReadBytes('\n')
		var created struct {
			Response respBody `json:"response"`
		}
		if !bytes.HasPrefix(line, []byte("event: response.created")) || json.Unmarshal(bytes.TrimPrefix(data, []byte("data: ")), &created) != nil {
			t.Fatalf("long: %s %s", line, data)
		}
		followed := make(chan []byte)
		go func() {
			_, b := getPath(t, ts, "/v1/responses/"+created.Response.ID+"?stream=1&starting_after=0")
			followed <- b
		}()
		time.Sleep(50 * time.Millisecond)
		resp2, b := postRaw(t, ts, "/v1/responses/"+created.Response.ID+"/cancel", "", nil)
		if resp2.StatusCode != 200 {
			t.Fatalf("cancel: %d %s", resp2.StatusCode, b)
		}
		b = <-followed
		evs := readResponseEvents(t, bytes.NewReader(b))
		if len(evs) == 0 || evs[0].name != "response.in_progress" || evs[len(evs)-1].name == "response.completed" {
			t.Fatalf("follower of a cancelled response: %d events", len(evs))
		}
		rest, _ := io.ReadAll(br) // the original stream ends too
		if bytes.Contains(rest, []byte("response.completed")) {
			t.Fatal("the cancelled response's stream completed")
		}

		// Errors: not made with background and stream, unknown, bad query.
		fg, _ := respond(t, ts, map[string]any{"input": "x", "max_output_tokens": 2})
		bg, _ := respond(t, ts, map[string]any{"input": "x", "background": true, "max_output_tokens": 2})
		for _, c := range []struct {
			path   string
			status int
			msg    string
		}{
			{"/v1/responses/" + fg.ID + "?stream=true", 400, "Unknown response_id: " + fg.ID},
			{"/v1/responses/" + bg.ID + "?stream=true", 400, "Unknown response_id: " + bg.ID},
			{"/v1/responses/resp_nosuch?stream=true", 404, "resp_nosuch"},
			{"/v1/responses/" + start.ID + "?stream=true&starting_after=x", 400, "starting_after must be"},
			{"/v1/responses/" + start.ID + "?stream=maybe", 400, "stream must be true or false"},
		} {
			if status, b := getPath(t, ts, c.path); status != c.status || !bytes.Contains(b, []byte(c.msg)) {
				t.Fatalf("GET %s: %d %s, want %d %q", c.path, status, b, c.status, c.msg)
			}
		}
	})
}

// grepLines is page's lines that contain sub.
func grepLines(page, sub string) string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// With APIKey (vLLM's --api-key) every path under /v1 asks for it as
// Authorization: Bearer (401 {"error": "Unauthorized"} as vLLM answers);
// /health and /metrics stay open.
func TestAPIKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := startPipe(t, Config{Engine: testEngine(), APIKey: "sk-test"})
		defer ts.stop()
		do := func(method, path, auth string) (int, string) {
			var body io.Reader
			if method == http.MethodPost {
				body = strings.NewReader(`{"prompt":"hi","max_tokens":1}`)
			}
			req, _ := http.NewRequest(method, ts.base+path, body)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := ts.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		for _, c := range []struct {
			method, path, auth string
			want               int
		}{
			{http.MethodPost, "/v1/completions", "", 401},
			{http.MethodPost, "/v1/completions", "Bearer wrong", 401},
			{http.MethodGet, "/v1/models", "sk-test", 401},
			{http.MethodPost, "/v1/completions", "Bearer sk-test", 200},
			{http.MethodGet, "/v1/models", "Bearer sk-test", 200},
			{http.MethodGet, "/health", "", 200},
			{http.MethodGet, "/metrics", "", 200},
		} {
			status, body := do(c.method, c.path, c.auth)
			if status != c.want || status == 401 && strings.TrimSpace(body) != `{"error":"Unauthorized"}` {
				t.Errorf("%s %s (%q): %d %q, want %d", c.method, c.path, c.auth, status, body, c.want)
			}
		}
	})
}
