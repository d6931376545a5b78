package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine/simtok"
)

// This file is vLLM's Responses API (entrypoints/openai/responses/):
// POST /v1/responses, streaming and not, and GET /v1/responses/{id}. A
// request's input becomes chat messages, rendered and scheduled exactly as a
// chat completion's (serve), so prefix caching, KV events, metrics,
// max_model_len, faults and aborts behave as they do for chat. With
// Config.ResponsesStore (vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1) finished
// responses are kept, the latest ResponsesStore of them, for retrieval and
// for previous_response_id; without it `store` is silently ignored, as vLLM
// ignores it.
//
// Bodies follow vLLM's ResponsesResponse (responses/protocol.py) and the
// openai package's event classes it sends, in their field order:
// non-streaming bodies are model_dump(), events model_dump_json(), every
// field, None as null. Where vLLM's simple (non-harmony) stream has quirks
// of its own (a bare UUID as the streamed item's id, a content_index that
// grows with every event) the mock follows the OpenAI shape instead: one
// msg_ id throughout, content_index 0. As vLLM does, a stream always ends
// with response.completed, its response's status "incomplete" when the
// length limit ended it.

type responsesRequest struct {
	Model              *string         `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             *bool           `json:"stream"`
	Store              *bool           `json:"store"`
	Background         *bool           `json:"background"`
	PreviousResponseID *string         `json:"previous_response_id"`
	CacheSalt          *string         `json:"cache_salt"`
	// Echoed in the response object as vLLM echoes them, else ignored.
	Metadata          json.RawMessage `json:"metadata"`
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	Tools             json.RawMessage `json:"tools"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	MaxToolCalls      *int            `json:"max_tool_calls"`
	Reasoning         json.RawMessage `json:"reasoning"`
	ServiceTier       *string         `json:"service_tier"`
	Text              json.RawMessage `json:"text"`
	Truncation        *string         `json:"truncation"`
	User              *string         `json:"user"`
}

// responseCall is what a Responses API request adds to its generation.
type responseCall struct {
	id     string // resp_...
	itemID string // msg_..., the output message's
	req    *responsesRequest
	// messages are the ones the prompt was rendered from: instructions,
	// the previous response's conversation and output, the input.
	messages []simtok.Message
	// store: keep the finished response (the server keeps responses and
	// the request did not say store: false).
	store bool
	// background: answered at once, "queued", and generated after
	// (serveBackground).
	background bool
}

// --- the response object and its parts ---

type outputText struct {
	Annotations []struct{}  `json:"annotations"`
	Text        string      `json:"text"`
	Type        string      `json:"type"`
	Logprobs    *[]struct{} `json:"logprobs"`
}

type outputMessage struct {
	ID      string       `json:"id"`
	Content []outputText `json:"content"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Type    string       `json:"type"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type inputTokensDetails struct {
	CachedTokens        int   `json:"cached_tokens"`
	InputTokensPerTurn  []int `json:"input_tokens_per_turn"`
	CachedTokensPerTurn []int `json:"cached_tokens_per_turn"`
}

type outputTokensDetails struct {
	ReasoningTokens         int   `json:"reasoning_tokens"`
	ToolOutputTokens        int   `json:"tool_output_tokens"`
	OutputTokensPerTurn     []int `json:"output_tokens_per_turn"`
	ToolOutputTokensPerTurn []int `json:"tool_output_tokens_per_turn"`
}

// responseUsage is vLLM's ResponseUsage; cached_tokens is always reported
// (no --enable-prompt-tokens-details needed), the per-turn lists are empty
// as vLLM leaves them for a plain (non-harmony) model.
type responseUsage struct {
	InputTokens         int                 `json:"input_tokens"`
	InputTokensDetails  inputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int                 `json:"output_tokens"`
	OutputTokensDetails outputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int                 `json:"total_tokens"`
}

// responseObject is vLLM's ResponsesResponse.
type responseObject struct {
	ID                 string             `json:"id"`
	CreatedAt          int64              `json:"created_at"`
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	Metadata           json.RawMessage    `json:"metadata"`
	Model              string             `json:"model"`
	Object             string             `json:"object"`
	Output             []outputMessage    `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	Temperature        float64            `json:"temperature"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              json.RawMessage    `json:"tools"`
	TopP               float64            `json:"top_p"`
	Background         bool               `json:"background"`
	MaxOutputTokens    int                `json:"max_output_tokens"`
	MaxToolCalls       *int               `json:"max_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Prompt             *string            `json:"prompt"`
	Reasoning          json.RawMessage    `json:"reasoning"`
	ServiceTier        string             `json:"service_tier"`
	Status             string             `json:"status"`
	Text               json.RawMessage    `json:"text"`
	TopLogprobs        *int               `json:"top_logprobs"`
	Truncation         string             `json:"truncation"`
	Usage              *responseUsage     `json:"usage"`
	User               *string            `json:"user"`
	InputMessages      *string            `json:"input_messages"`
	OutputMessages     *string            `json:"output_messages"`
}

// --- stream events (the openai package's classes: fields in their order,
// sequence_number and type last but for output_text.done's text) ---

type eventTail struct {
	SequenceNumber int    `json:"sequence_number"`
	Type           string `json:"type"`
}

func (t eventTail) eventType() string { return t.Type }

type responseEvent struct {
	Response *responseObject `json:"response"`
	eventTail
}

type outputItemEvent struct {
	Item        outputMessage `json:"item"`
	OutputIndex int           `json:"output_index"`
	eventTail
}

type contentPartEvent struct {
	ContentIndex int        `json:"content_index"`
	ItemID       string     `json:"item_id"`
	OutputIndex  int        `json:"output_index"`
	Part         outputText `json:"part"`
	eventTail
}

type textDeltaEvent struct {
	ContentIndex int        `json:"content_index"`
	Delta        string     `json:"delta"`
	ItemID       string     `json:"item_id"`
	Logprobs     []struct{} `json:"logprobs"`
	OutputIndex  int        `json:"output_index"`
	eventTail
}

type textDoneEvent struct {
	ContentIndex   int        `json:"content_index"`
	ItemID         string     `json:"item_id"`
	Logprobs       []struct{} `json:"logprobs"`
	OutputIndex    int        `json:"output_index"`
	SequenceNumber int        `json:"sequence_number"`
	Text           string     `json:"text"`
	Type           string     `json:"type"`
}

func (e textDoneEvent) eventType() string { return e.Type }

// errorEvent is the openai package's ResponseErrorEvent: a failure after
// the stream started.
type errorEvent struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	eventTail
}

// --- the store ---

// responseStore keeps the latest finished responses, at most a given
// number: the oldest goes when one more comes.
type responseStore struct {
	mu    sync.Mutex
	byID  map[string]storedResponse
	order []string // ids, oldest first
}

type storedResponse struct {
	messages []simtok.Message // the request's
	output   string           // the assistant's answer
	obj      *responseObject  // as GET answers it; never changed once stored
	// cancel stops a background response's generation (nil for any
	// other).
	cancel context.CancelFunc
	// log is a background stream's events (nil for any other response):
	// kept, as vLLM's event store keeps them, while the response is.
	log *eventLog
}

func (st *responseStore) get(id string) (storedResponse, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.byID[id]
	return r, ok
}

// put keeps r under id, dropping the oldest beyond limit. A cancelled
// background response stays cancelled: its generation's end, racing the
// cancel, does not replace it.
func (st *responseStore) put(limit int, id string, r storedResponse) {
	if limit <= 0 {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.byID == nil {
		st.byID = make(map[string]storedResponse)
	}
	old, ok := st.byID[id]
	if !ok {
		st.order = append(st.order, id)
	}
	if ok && old.obj.Status == "cancelled" {
		return
	}
	if ok && r.log == nil {
		r.log = old.log // the same response, finished
	}
	st.byID[id] = r
	for len(st.order) > limit {
		delete(st.byID, st.order[0])
		st.order[0] = ""
		st.order = st.order[1:] // append reallocates: the array stays within about 2*limit
	}
}

// cancel marks a background response that is still queued or in progress
// cancelled and stops its generation; ok is false for an unknown id, and
// active false for a response that is not running (vLLM refuses to cancel
// it).
func (st *responseStore) cancel(id string) (o *responseObject, ok, active bool) {
	st.mu.Lock()
	r, ok := st.byID[id]
	if !ok {
		st.mu.Unlock()
		return nil, false, false
	}
	if r.obj.Status != "queued" && r.obj.Status != "in_progress" {
		st.mu.Unlock()
		return r.obj, true, false
	}
	c := *r.obj
	c.Status = "cancelled"
	r.obj = &c
	st.byID[id] = r
	st.mu.Unlock()
	if r.cancel != nil {
		r.cancel()
	}
	return &c, true, true
}

func responseNotFound(id string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "response_id",
		msg: fmt.Sprintf("Response with id '%s' not found.", id)}
}

// hexID is 32 random hex digits, as vLLM's ids are a random uuid's: unique
// across engines (two started with the same seed must not hand out the
// same response id: a gateway in front of both keys stored responses by
// it), and drawn apart from the seeded source the text and faults come
// from, which stay reproducible.
func (s *Server) hexID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// --- handlers ---

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	g, err := s.parseResponses(w, r)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if g.resp.background {
		s.serveBackground(w, r, g)
		return
	}
	s.serve(w, r, g)
}

func (s *Server) handleGetResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	q := r.URL.Query()
	stream, err := queryBool(q.Get("stream"))
	if err != nil {
		writeAPIError(w, badRequest("stream", "stream must be true or false, got %q", q.Get("stream")))
		return
	}
	next := 0
	if v := q.Get("starting_after"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < -1 {
			writeAPIError(w, badRequest("starting_after", "starting_after must be an event's sequence_number (an integer, at least -1), got %q", v))
			return
		}
		next = n + 1
	}
	st, ok := s.responses.get(id)
	if !ok {
		writeAPIError(w, responseNotFound(id))
		return
	}
	if !stream {
		writeJSON(w, http.StatusOK, st.obj)
		return
	}
	// vLLM replays the events of a response made with background and
	// stream from its event store (any other is unknown there), from
	// starting_after's next, and follows it to its end.
	if st.log == nil {
		writeAPIError(w, badRequest("response_id", "Unknown response_id: %s", id))
		return
	}
	s.followEvents(w, r, st.log, next)
}

// queryBool reads a boolean query parameter as FastAPI does ("" is false).
func queryBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "", "false", "0", "off", "f", "n", "no":
		return false, nil
	case "true", "1", "on", "t", "y", "yes":
		return true, nil
	}
	return false, fmt.Errorf("not a boolean: %q", v)
}

// handleCancelResponse is POST /v1/responses/{id}/cancel: a background
// response still queued or in progress is cancelled (its generation
// aborted) and answered with status "cancelled"; any other is refused as
// vLLM refuses it.
func (s *Server) handleCancelResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	o, ok, active := s.responses.cancel(id)
	switch {
	case !ok:
		writeAPIError(w, responseNotFound(id))
	case !active:
		writeAPIError(w, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", msg: "Cannot cancel a synchronous response."})
	default:
		writeJSON(w, http.StatusOK, o)
	}
}

// serveBackground answers a background request at once with its response
// "queued" (stored so: GET reads it, cancel stops it), and generates it
// after, within the engine's life: stored "completed" (or "incomplete")
// when it ends, "failed" when the engine fails it. With stream, as vLLM
// does, the answer is the generation's event stream instead, kept as it
// is written (eventLog) for GET ?stream=true to replay: the client leaving
// it does not stop the generation.
func (s *Server) serveBackground(w http.ResponseWriter, r *http.Request, g *generation) {
	a := s.newActive(g)
	if !s.add(w, a) {
		return
	}
	created := time.Now().Unix()
	o := s.object(g, created, "queued", []outputMessage{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var log *eventLog
	if g.stream {
		log = newEventLog()
	}
	s.responses.put(s.cfg.ResponsesStore, o.ID, storedResponse{messages: g.resp.messages, obj: o, cancel: cancel, log: log})
	go s.background(ctx, cancel, g, a, created, log)
	if log != nil {
		s.followEvents(w, r, log, 0)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

// background generates a background response until it ends, is cancelled
// (ctx) or the engine stops; with log its events are kept there.
func (s *Server) background(ctx context.Context, cancel context.CancelFunc, g *generation, a *active, created int64, log *eventLog) {
	defer cancel()
	var e *respEvents
	if log != nil {
		defer log.end()
		e = &respEvents{s: s, g: g, a: a, created: created, ev: sseEvents{log: log}}
		e.start()
	}
	for {
		select {
		case <-a.notify:
		case <-ctx.Done(): // cancelled
			s.send(command{kind: cmdAbort, id: a.id})
			return
		case <-s.done: // the engine stopped
			return
		}
		emitted, cached, finished, err := a.progress()
		if err != nil {
			if e != nil {
				e.fail(err)
			}
			f := s.object(g, created, "failed", []outputMessage{}, nil)
			s.responses.put(s.cfg.ResponsesStore, g.resp.id, storedResponse{messages: g.resp.messages, obj: f})
			return
		}
		if e != nil {
			// step stores the response when finished (and it has new
			// tokens, as a finishing step has).
			if !e.step(emitted, cached, finished) && finished {
				s.finish(g, a, created, emitted, cached)
			}
			e.ev.buf = e.ev.buf[:0]
		} else if finished {
			s.finish(g, a, created, emitted, cached)
		}
		if finished {
			return
		}
	}
}

// onlyGet answers another method on /v1/responses/{id} as FastAPI does.
func onlyGet(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Allow", "GET")
	writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
}

func (s *Server) parseResponses(w http.ResponseWriter, r *http.Request) (*generation, error) {
	var req responsesRequest
	if err := s.decode(w, r, &req); err != nil {
		return nil, err
	}
	g := &generation{chat: true}
	if err := s.common(g, r, req.Model, nil, req.Stream, nil, nil, req.CacheSalt); err != nil {
		return nil, err
	}
	input, err := responseInput(req.Input)
	if err != nil {
		return nil, err
	}
	if req.MaxOutputTokens != nil && *req.MaxOutputTokens < 1 {
		return nil, badRequest("max_output_tokens", "max_output_tokens must be at least 1, got %d.", *req.MaxOutputTokens)
	}
	var msgs []simtok.Message
	if req.Instructions != nil {
		msgs = append(msgs, textMessage("system", *req.Instructions))
	}
	if req.PreviousResponseID != nil {
		prev, ok := s.responses.get(*req.PreviousResponseID)
		if !ok {
			return nil, responseNotFound(*req.PreviousResponseID)
		}
		msgs = append(msgs, prev.messages...)
		msgs = append(msgs, textMessage("assistant", prev.output))
	}
	msgs = append(msgs, input...)
	if len(msgs) == 0 {
		return nil, badRequest("input", "input holds no messages: give a string or at least one message item")
	}
	text, err := simtok.RenderChat(msgs, true, false)
	if err != nil {
		return nil, badRequest("input", "%v", err)
	}
	g.prompt = s.tok.Encode(text)
	maxLen := s.cfg.Engine.MaxModelLen
	if len(g.prompt) >= maxLen {
		return nil, badRequest("input", "The engine prompt length %d exceeds the max_model_len %d. Please reduce prompt.", len(g.prompt), maxLen)
	}
	// vLLM's default is what fits in max_model_len (as chat's), and a
	// larger max_output_tokens is cut to it rather than refused.
	g.maxTokens = maxLen - len(g.prompt)
	if req.MaxOutputTokens != nil {
		g.maxTokens = min(g.maxTokens, *req.MaxOutputTokens)
	}
	g.resp = &responseCall{
		id: "resp_" + s.hexID(), itemID: "msg_" + s.hexID(), req: &req, messages: msgs,
		store:      s.cfg.ResponsesStore > 0 && (req.Store == nil || *req.Store),
		background: req.Background != nil && *req.Background,
	}
	if g.resp.background && !g.resp.store {
		return nil, badRequest("background", "background can only be used when `store` is true")
	}
	return g, nil
}

// textMessage is a chat message with text content.
func textMessage(role, text string) simtok.Message {
	b, _ := json.Marshal(text)
	return simtok.Message{Role: role, Content: b}
}

var inputRoles = map[string]bool{"user": true, "system": true, "developer": true, "assistant": true}

// responseInput reads input: a string (one user message) or a list of
// message items whose content is a string or a list of input_text and
// output_text parts (joined by newlines, as chat's text parts are).
func responseInput(raw json.RawMessage) ([]simtok.Message, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("input", "input is required: a string or a list of message items")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []simtok.Message{textMessage("user", one)}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badRequest("input", "input must be a string or a list of message items")
	}
	msgs := make([]simtok.Message, 0, len(items))
	for i, it := range items {
		var item struct {
			Type    *string         `json:"type"`
			Role    *string         `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(it, &item); err != nil {
			return nil, badRequest("input", "input[%d] must be a message item: {\"role\": ..., \"content\": ...}", i)
		}
		if item.Type != nil && *item.Type != "message" {
			return nil, badRequest("input", "input[%d] has type %q: the mock engine takes message items only", i, *item.Type)
		}
		if item.Role == nil || !inputRoles[*item.Role] {
			role := "none"
			if item.Role != nil {
				role = strconv.Quote(*item.Role)
			}
			return nil, badRequest("input", "input[%d] has role %s: must be user, system, developer or assistant", i, role)
		}
		text, err := itemText(item.Content)
		if err != nil {
			return nil, badRequest("input", "input[%d].content %v", i, err)
		}
		msgs = append(msgs, textMessage(*item.Role, text))
	}
	return msgs, nil
}

// itemText reads a message item's content: a string or a list of
// input_text and output_text parts.
func itemText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", fmt.Errorf("is missing: give a string or a list of input_text parts")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("must be a string or a list of content parts")
	}
	var b bytes.Buffer
	for i, p := range parts {
		if (p.Type != "input_text" && p.Type != "output_text") || p.Text == nil {
			return "", fmt.Errorf("part %d has type %q: the mock engine takes input_text and output_text parts with text only", i, p.Type)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// --- answers ---

func rawOr(raw json.RawMessage, def string) json.RawMessage {
	if t := bytes.TrimSpace(raw); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return json.RawMessage(def)
	}
	return raw
}

// object is the response object: status "in_progress" (no output, no
// usage yet), "completed" or "incomplete".
func (s *Server) object(g *generation, created int64, status string, output []outputMessage, u *responseUsage) *responseObject {
	q := g.resp.req
	o := &responseObject{
		ID: g.resp.id, CreatedAt: created, Instructions: q.Instructions, Metadata: rawOr(q.Metadata, "null"),
		Model: g.model, Object: "response", Output: output,
		ParallelToolCalls: q.ParallelToolCalls == nil || *q.ParallelToolCalls,
		Temperature:       1, ToolChoice: rawOr(q.ToolChoice, `"auto"`), Tools: rawOr(q.Tools, "[]"), TopP: 1,
		MaxOutputTokens: g.maxTokens, MaxToolCalls: q.MaxToolCalls, PreviousResponseID: q.PreviousResponseID,
		Reasoning: rawOr(q.Reasoning, "null"), ServiceTier: "auto", Status: status, Text: rawOr(q.Text, "null"),
		Truncation: "disabled", Usage: u, User: q.User, Background: g.resp.background,
	}
	if q.Temperature != nil {
		o.Temperature = *q.Temperature
	}
	if q.TopP != nil {
		o.TopP = *q.TopP
	}
	if q.ServiceTier != nil {
		o.ServiceTier = *q.ServiceTier
	}
	if q.Truncation != nil {
		o.Truncation = *q.Truncation
	}
	if status == "incomplete" {
		o.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
	}
	return o
}

// finish builds the finished response object, and keeps it when the
// request is stored (before the client reads it: a follow-up that names it
// finds it).
func (s *Server) finish(g *generation, a *active, created int64, emitted, cached int) (*responseObject, string) {
	text := string(s.tok.AppendDecode(nil, a.tokens[a.promptLen:a.promptLen+emitted]))
	status := "completed"
	if a.finishReason() == "length" {
		status = "incomplete"
	}
	u := &responseUsage{
		InputTokens:         a.promptLen,
		InputTokensDetails:  inputTokensDetails{CachedTokens: cached, InputTokensPerTurn: []int{}, CachedTokensPerTurn: []int{}},
		OutputTokens:        emitted,
		OutputTokensDetails: outputTokensDetails{OutputTokensPerTurn: []int{}, ToolOutputTokensPerTurn: []int{}},
		TotalTokens:         a.promptLen + emitted,
	}
	out := []outputMessage{{ID: g.resp.itemID, Content: []outputText{{Annotations: []struct{}{}, Text: text, Type: "output_text"}},
		Role: "assistant", Status: "completed", Type: "message"}}
	o := s.object(g, created, status, out, u)
	if g.resp.store {
		s.responses.put(s.cfg.ResponsesStore, o.ID, storedResponse{messages: g.resp.messages, output: text, obj: o})
	}
	return o, text
}

// writeResponse answers a finished non-streaming request.
func (s *Server) writeResponse(w http.ResponseWriter, g *generation, a *active, created int64, emitted, cached int) {
	o, _ := s.finish(g, a, created, emitted, cached)
	writeJSON(w, http.StatusOK, o)
}

// sseEvents collects a stream's events, numbering them; with log each
// event is kept there too, whole (a background stream's, eventlog.go).
type sseEvents struct {
	buf []byte
	seq int
	log *eventLog
}

func (e *sseEvents) tail(typ string) eventTail {
	t := eventTail{SequenceNumber: e.seq, Type: typ}
	e.seq++
	return t
}

func (e *sseEvents) add(v interface{ eventType() string }) {
	b, _ := json.Marshal(v)
	at := len(e.buf)
	e.buf = append(e.buf, "event: "...)
	e.buf = append(e.buf, v.eventType()...)
	e.buf = append(e.buf, "\ndata: "...)
	e.buf = append(e.buf, b...)
	e.buf = append(e.buf, "\n\n"...)
	if e.log != nil {
		e.log.add(bytes.Clone(e.buf[at:]))
	}
}

// respEvents builds a Responses stream's events as its generation goes:
// response.created and response.in_progress first; then for each engine
// step that produced tokens the output item and its content part (with
// the first tokens) and one output_text.delta (as the chat stream chunks
// them); at the end the done events and response.completed with usage. A
// failure after the stream started is an error event.
type respEvents struct {
	s       *Server
	g       *generation
	a       *active
	created int64
	ev      sseEvents
	written int // output tokens the events carry
}

func (e *respEvents) start() {
	o := e.s.object(e.g, e.created, "in_progress", []outputMessage{}, nil)
	e.ev.add(responseEvent{Response: o, eventTail: e.ev.tail("response.created")})
	e.ev.add(responseEvent{Response: o, eventTail: e.ev.tail("response.in_progress")})
}

// step adds the events for the generation's progress to emitted tokens
// (finished: its end, which also stores the response); false when there
// is nothing new.
func (e *respEvents) step(emitted, cached int, finished bool) bool {
	if emitted <= e.written {
		return false
	}
	g, ev, itemID := e.g, &e.ev, e.g.resp.itemID
	if e.written == 0 {
		ev.add(outputItemEvent{Item: outputMessage{ID: itemID, Content: []outputText{}, Role: "assistant", Status: "in_progress", Type: "message"},
			eventTail: ev.tail("response.output_item.added")})
		ev.add(contentPartEvent{ItemID: itemID, Part: outputText{Annotations: []struct{}{}, Type: "output_text", Logprobs: &[]struct{}{}},
			eventTail: ev.tail("response.content_part.added")})
	}
	delta := string(e.s.tok.AppendDecode(nil, e.a.tokens[e.a.promptLen+e.written:e.a.promptLen+emitted]))
	e.written = emitted
	ev.add(textDeltaEvent{Delta: delta, ItemID: itemID, Logprobs: []struct{}{}, eventTail: ev.tail("response.output_text.delta")})
	if finished {
		o, text := e.s.finish(g, e.a, e.created, emitted, cached)
		t := ev.tail("response.output_text.done")
		ev.add(textDoneEvent{ItemID: itemID, Logprobs: []struct{}{}, SequenceNumber: t.SequenceNumber, Text: text, Type: t.Type})
		part := outputText{Annotations: []struct{}{}, Text: text, Type: "output_text"}
		ev.add(contentPartEvent{ItemID: itemID, Part: part, eventTail: ev.tail("response.content_part.done")})
		ev.add(outputItemEvent{Item: o.Output[0], eventTail: ev.tail("response.output_item.done")})
		ev.add(responseEvent{Response: o, eventTail: ev.tail("response.completed")})
	}
	return true
}

func (e *respEvents) fail(err error) {
	e.ev.add(errorEvent{Code: "server_error", Message: err.Error(), eventTail: e.ev.tail("error")})
}

// streamResponse writes the response as vLLM's Responses events
// (respEvents) as the engine generates it; the client leaving aborts it.
func (s *Server) streamResponse(w http.ResponseWriter, r *http.Request, g *generation, a *active, created int64) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	sseHeaders(w)
	e := &respEvents{s: s, g: g, a: a, created: created}
	abort := func() { s.send(command{kind: cmdAbort, id: a.id}) }
	flush := func() bool {
		_, err := w.Write(e.ev.buf)
		e.ev.buf = e.ev.buf[:0]
		if err == nil {
			err = rc.Flush()
		}
		return err == nil
	}
	e.start()
	if !flush() {
		abort()
		return
	}
	for {
		select {
		case <-a.notify:
		case <-ctx.Done():
			abort()
			return
		}
		emitted, cached, finished, err := a.progress()
		if err != nil {
			e.fail(err)
			flush()
			return
		}
		stalled := a.stallAt > 0 && emitted >= a.stallAt
		if stalled {
			emitted, finished = a.stallAt, false
		}
		if !e.step(emitted, cached, finished) {
			continue
		}
		if !flush() {
			abort()
			return
		}
		if finished {
			return
		}
		if stalled {
			abort() // the engine stops working on it; the client waits forever
			<-ctx.Done()
			return
		}
	}
}

// sseHeaders starts an event stream's answer.
func sseHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
}
