package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/engine/simtok"
)

type streamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats *bool `json:"continuous_usage_stats"`
}

type completionRequest struct {
	Model         *string         `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        *bool           `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	IgnoreEOS     *bool           `json:"ignore_eos"`
	N             *int            `json:"n"`
	CacheSalt     *string         `json:"cache_salt"`
	// KVTransferParams are the P/D connector's (kvtransfer.go).
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

type chatRequest struct {
	Model                *string          `json:"model"`
	Messages             []simtok.Message `json:"messages"`
	MaxTokens            *int             `json:"max_tokens"`
	MaxCompletionTokens  *int             `json:"max_completion_tokens"`
	Stream               *bool            `json:"stream"`
	StreamOptions        *streamOptions   `json:"stream_options"`
	IgnoreEOS            *bool            `json:"ignore_eos"`
	N                    *int             `json:"n"`
	CacheSalt            *string          `json:"cache_salt"`
	AddGenerationPrompt  *bool            `json:"add_generation_prompt"`
	ContinueFinalMessage *bool            `json:"continue_final_message"`
	KVTransferParams     json.RawMessage  `json:"kv_transfer_params"`
}

// generation is a validated request, common to both endpoints.
type generation struct {
	chat         bool
	model        string
	prompt       []uint32
	maxTokens    int
	ignoreEOS    bool
	stream       bool
	includeUsage bool
	// n is the number of choices (vLLM's n): n sequences sharing the
	// prompt (choices.go). 0 or 1: one.
	n         int
	cacheSalt string
	requestID string
	// kv are the request's kv_transfer_params (nil: none).
	kv *kvParams
	// resp is set for the Responses API (responses.go), which answers
	// in its own shape.
	resp *responseCall
}

// apiError is an error answered with vLLM's error body.
type apiError struct {
	status int
	typ    string
	param  string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", param: param, msg: fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

func writeError(w http.ResponseWriter, status int, typ, param, msg string) {
	var p *string
	if param != "" {
		p = &param
	}
	writeJSON(w, status, errorResponse{Error: errorInfo{Message: msg, Type: typ, Param: p, Code: status}})
}

func writeAPIError(w http.ResponseWriter, err error) {
	var ae *apiError
	if errors.As(err, &ae) {
		writeError(w, ae.status, ae.typ, ae.param, ae.msg)
		return
	}
	writeError(w, http.StatusInternalServerError, "InternalServerError", "", err.Error())
}

// decode reads a JSON body into v, naming what is wrong.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &mbe):
			return &apiError{status: http.StatusRequestEntityTooLarge, typ: "BadRequestError", msg: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
		case errors.As(err, &te):
			return badRequest(te.Field, "invalid type for field %q: got JSON %s, want %s", te.Field, te.Value, te.Type)
		}
		return badRequest("", "invalid JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("", "invalid JSON body: more than one value")
	}
	return nil
}

func (s *Server) checkModel(m *string) (string, error) {
	if m == nil || *m == "" {
		return s.cfg.ServedModelNames[0], nil
	}
	for _, n := range s.cfg.ServedModelNames {
		if *m == n {
			return s.cfg.ServedModelNames[0], nil
		}
	}
	return "", &apiError{status: http.StatusNotFound, typ: "NotFoundError", param: "model", msg: fmt.Sprintf("The model `%s` does not exist.", *m)}
}

func (s *Server) common(g *generation, r *http.Request, model *string, n *int, stream *bool, so *streamOptions, ignoreEOS *bool, salt *string) error {
	var err error
	if g.model, err = s.checkModel(model); err != nil {
		return err
	}
	if g.n, err = s.checkN(n); err != nil {
		return err
	}
	g.stream = stream != nil && *stream
	if so != nil && !g.stream {
		return badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
	}
	g.includeUsage = so != nil && so.IncludeUsage != nil && *so.IncludeUsage
	g.ignoreEOS = ignoreEOS != nil && *ignoreEOS
	if salt != nil {
		if *salt == "" {
			return badRequest("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.")
		}
		g.cacheSalt = *salt
	}
	g.requestID = r.Header.Get("X-Request-Id")
	return nil
}

func (s *Server) parseCompletion(w http.ResponseWriter, r *http.Request) (*generation, error) {
	var req completionRequest
	if err := s.decode(w, r, &req); err != nil {
		return nil, err
	}
	g := &generation{}
	if err := s.common(g, r, req.Model, req.N, req.Stream, req.StreamOptions, req.IgnoreEOS, req.CacheSalt); err != nil {
		return nil, err
	}
	prompt, err := s.completionPrompt(req.Prompt)
	if err != nil {
		return nil, err
	}
	g.prompt = prompt
	if g.kv, err = parseKVParams(req.KVTransferParams); err != nil {
		return nil, err
	}
	if err := checkKVWithN(g); err != nil {
		return nil, err
	}
	g.maxTokens = s.cfg.DefaultMaxTokens
	if req.MaxTokens != nil {
		g.maxTokens = *req.MaxTokens
	}
	return g, s.checkLength(g, "max_tokens")
}

// completionPrompt accepts a string, a list of token ids, or a list holding
// one of those.
func (s *Server) completionPrompt(raw json.RawMessage) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	empty := badRequest("prompt", "Either prompt or prompt_embeds must be provided and non-empty.")
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, empty
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		if text == "" {
			return nil, empty
		}
		return s.tok.Encode(text), nil
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return nil, empty
		}
		return ids, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err == nil {
		if len(list) != 1 {
			return nil, badRequest("prompt", "prompt holds %d prompts: the mock engine takes one prompt per request", len(list))
		}
		if bytes.HasPrefix(bytes.TrimSpace(list[0]), []byte("[[")) {
			return nil, badRequest("prompt", "prompt must be a string, a list of token ids, or a list holding one of those")
		}
		return s.completionPrompt(list[0])
	}
	return nil, badRequest("prompt", "prompt must be a string, a list of token ids, or a list holding one of those")
}

func (s *Server) parseChat(w http.ResponseWriter, r *http.Request) (*generation, error) {
	var req chatRequest
	if err := s.decode(w, r, &req); err != nil {
		return nil, err
	}
	g := &generation{chat: true}
	if err := s.common(g, r, req.Model, req.N, req.Stream, req.StreamOptions, req.IgnoreEOS, req.CacheSalt); err != nil {
		return nil, err
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "messages must be a non-empty list")
	}
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	cont := req.ContinueFinalMessage != nil && *req.ContinueFinalMessage
	if addGen && cont && req.AddGenerationPrompt != nil {
		return nil, badRequest("continue_final_message", "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	text, err := simtok.RenderChat(req.Messages, addGen && !cont, cont)
	if err != nil {
		return nil, badRequest("messages", "%v", err)
	}
	g.prompt = s.tok.Encode(text)
	if g.kv, err = parseKVParams(req.KVTransferParams); err != nil {
		return nil, err
	}
	if err := checkKVWithN(g); err != nil {
		return nil, err
	}
	field := "max_tokens"
	switch {
	case req.MaxCompletionTokens != nil:
		g.maxTokens, field = *req.MaxCompletionTokens, "max_completion_tokens"
	case req.MaxTokens != nil:
		g.maxTokens = *req.MaxTokens
	default:
		g.maxTokens = s.cfg.Engine.MaxModelLen - len(g.prompt)
	}
	return g, s.checkLength(g, field)
}

func (s *Server) checkLength(g *generation, field string) error {
	maxLen := s.cfg.Engine.MaxModelLen
	if len(g.prompt) >= maxLen {
		return badRequest("messages", "This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxLen, len(g.prompt))
	}
	if g.maxTokens < 1 {
		return badRequest(field, "%s must be at least 1, got %d.", field, g.maxTokens)
	}
	if len(g.prompt)+g.maxTokens > maxLen {
		return badRequest(field, "'%s' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			field, g.maxTokens, maxLen, len(g.prompt), g.maxTokens, maxLen, len(g.prompt))
	}
	return nil
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	g, err := s.parseCompletion(w, r)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	s.serve(w, r, g)
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	g, err := s.parseChat(w, r)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	s.serve(w, r, g)
}

type fault uint8

const (
	faultNone fault = iota
	faultError
	faultClose
	faultHang
	faultStall
)

func (s *Server) pickFault() fault {
	f := s.cfg.Faults
	if !f.any() {
		return faultNone
	}
	x := s.drawFloat()
	for _, c := range []struct {
		rate float64
		f    fault
	}{{f.ErrorRate, faultError}, {f.CloseRate, faultClose}, {f.HangRate, faultHang}, {f.StallRate, faultStall}} {
		if x < c.rate {
			return c.f
		}
		x -= c.rate
	}
	return faultNone
}

// newActive builds the engine request of a request's only (or first)
// choice: the output the mock model will write (a pure function of the
// prompt and the seed) and the block hashes of prompt and output.
func (s *Server) newActive(g *generation) *active { return s.newChoice(g, 0, nil) }

// newChoice builds the engine request of choice i: its output's seed mixes
// i in (choice 0's is the request's with n = 1); its prompt blocks hash as
// every other choice's, the prefix cache's keys. notify is the channel it
// signals (nil: a new one).
func (s *Server) newChoice(g *generation, i int, notify chan struct{}) *active {
	out := g.maxTokens
	if !g.ignoreEOS && s.cfg.OutputTokens > 0 {
		out = min(out, s.cfg.OutputTokens)
	}
	tokens := make([]uint32, len(g.prompt), len(g.prompt)+out)
	copy(tokens, g.prompt)
	h := uint64(14695981039346656037) ^ s.cfg.Seed
	for _, t := range g.prompt {
		h = (h ^ uint64(t)) * 1099511628211
	}
	seg := kvblock.Mix64(h + uint64(i)*0x9e3779b97f4a7c15)
	for j := range out {
		tokens = append(tokens, kvblock.SegmentToken(seg, j))
	}
	salt := s.salt
	if g.cacheSalt != "" {
		salt = kvblock.Salt(g.model, "", g.cacheSalt)
	}
	if notify == nil {
		notify = make(chan struct{}, 1)
	}
	return &active{
		id:        engine.RequestID(s.nextID.Add(1)),
		promptLen: len(g.prompt),
		outLen:    out,
		maxTok:    g.maxTokens,
		tokens:    tokens,
		hashes:    kvblock.AppendHashes(nil, salt, tokens, s.cfg.Engine.BlockSize),
		arrival:   time.Now(),
		notify:    notify,
	}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, g *generation) {
	base := g.requestID
	if base == "" {
		base = fmt.Sprintf("%016x%016x", uint64(s.draw(1<<62)), s.nextID.Load())
	}
	w.Header().Set("X-Request-Id", base)
	prefix := "cmpl-"
	if g.chat {
		prefix = "chatcmpl-"
	}
	id := prefix + base
	ctx := r.Context()
	a := s.newActive(g)
	// kids are the request's choices, a first; with n > 1 they share a's
	// notify channel (choices.go).
	kids := []*active{a}
	if g.n > 1 {
		kids = s.newChoices(g, a)
	}
	switch s.pickFault() {
	case faultError:
		writeError(w, s.cfg.Faults.ErrorStatus, "InternalServerError", "", "injected fault: the engine failed this request")
		return
	case faultClose:
		io.Copy(io.Discard, r.Body)
		panic(http.ErrAbortHandler) // closes the connection without a response
	case faultHang:
		<-ctx.Done()
		return
	case faultStall:
		if g.stream {
			a.stallAt = max(1, a.outLen/2) // choice 0's only
		}
	}
	if g.kv != nil && g.kv.doRemotePrefill && s.cfg.KVTransfer.consumes() {
		// A decode of a remote prefill (n = 1): its KV is read from the
		// producer first (kvtransfer.go).
		err := s.transfer(ctx, g.kv, a, s.cachedTokens(a))
		switch {
		case err == nil:
			a.remote = true
		case ctx.Err() != nil:
			return // the client left while the KV moved
		default:
			s.met.failedTransfer()
			if s.cfg.KVTransfer.LoadFailurePolicy == FailureFail {
				writeError(w, http.StatusInternalServerError, "InternalServerError", "", err.Error())
				return
			}
			// recompute: the request prefills here, as any other.
		}
	}
	if !s.add(w, kids...) {
		return
	}
	created := time.Now().Unix()
	if g.stream {
		if g.resp != nil {
			s.streamResponse(w, r, g, a, created)
			return
		}
		s.stream(w, r, g, kids, id, created)
		return
	}
	for {
		select {
		case <-a.notify:
		case <-ctx.Done():
			s.abortChoices(kids)
			return
		}
		finished, err := allFinished(kids)
		if err != nil {
			s.abortChoices(kids)
			writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "", err.Error())
			return
		}
		if finished {
			if g.resp != nil {
				emitted, cached, _, _ := a.progress()
				s.writeResponse(w, g, a, created, emitted, cached)
				return
			}
			s.writeFull(w, r, g, kids, id, created)
			return
		}
	}
}

// add hands a request to the engine's loop: one, or an n > 1 request's
// children (choices.go) in one command, so that they start in the same
// step, all or none. It returns false when the engine refused it (the loop
// has dropped every child), answered on w (400 for a request too large or
// too long for it, 503 while it shuts down, 500 else).
func (s *Server) add(w http.ResponseWriter, kids ...*active) bool {
	reply := make(chan error, 1)
	c := command{kind: cmdAdd, reply: reply}
	if len(kids) == 1 {
		c.req = kids[0]
	} else {
		c.reqs = kids
	}
	if !s.send(c) {
		writeAddError(w, errShuttingDown)
		return false
	}
	if err := <-reply; err != nil {
		writeAddError(w, err)
		return false
	}
	return true
}

// writeAddError answers the engine's refusal of a request.
func writeAddError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, errShuttingDown):
		writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "", err.Error())
	case errors.Is(err, engine.ErrTooLarge) || errors.Is(err, engine.ErrTooLong):
		writeError(w, http.StatusBadRequest, "BadRequestError", "", err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "InternalServerError", "", err.Error())
	}
}

// usage is the usage of a request whose prompt is promptLen tokens long and
// whose choices wrote completion tokens in all.
func (s *Server) usage(promptLen, completion, cached int) usage {
	u := usage{PromptTokens: promptLen, CompletionTokens: completion, TotalTokens: promptLen + completion}
	if s.cfg.EnablePromptTokensDetails {
		u.PromptTokensDetails = &promptTokensDetails{CachedTokens: cached}
	}
	return u
}

// writeFull answers a finished request in one body: a choice per kid, in
// order, usage summed over them (cached tokens are choice 0's).
func (s *Server) writeFull(w http.ResponseWriter, r *http.Request, g *generation, kids []*active, id string, created int64) {
	a := kids[0]
	_, cached, _, _ := a.progress()
	completion := 0
	text := func(c *active) string {
		emitted, _, _, _ := c.progress()
		completion += emitted
		return string(s.tok.AppendDecode(nil, c.tokens[c.promptLen:c.promptLen+emitted]))
	}
	var kv *kvParamsOut
	if g.kv != nil && g.kv.doRemoteDecode && s.cfg.KVTransfer.produces() && a.finishReason() == "length" {
		// A prefill for a remote decode (n = 1): vLLM hands its blocks
		// over when it finished length-capped (request_finished).
		kv = s.produced(r, a, id)
	}
	if g.chat {
		choices := make([]chatChoice, len(kids))
		for i, c := range kids {
			choices[i] = chatChoice{Index: i, Message: chatMessage{Role: "assistant", Content: text(c)}, FinishReason: c.finishReason()}
		}
		writeJSON(w, http.StatusOK, chatResponse{
			ID: id, Object: "chat.completion", Created: created, Model: g.model,
			Choices:          choices,
			Usage:            s.usage(a.promptLen, completion, cached),
			KVTransferParams: kv,
		})
		return
	}
	choices := make([]completionChoice, len(kids))
	for i, c := range kids {
		reason := c.finishReason()
		choices[i] = completionChoice{Index: i, Text: text(c), FinishReason: &reason}
	}
	writeJSON(w, http.StatusOK, completionResponse{
		ID: id, Object: "text_completion", Created: created, Model: g.model,
		Choices:          choices,
		Usage:            s.usage(a.promptLen, completion, cached),
		KVTransferParams: kv,
	})
}

// stream writes the response as server-sent events, one event per engine
// step that produced tokens for a choice (several when the client reads
// slower than the engine writes), flushed as it goes. With n > 1 each event
// carries one choice, by index, in the order the choices progress (chat
// writes every choice's role chunk first, as vLLM's first iteration does);
// the usage chunk and [DONE] follow the last choice's end.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, g *generation, kids []*active, id string, created int64) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc.Flush()
	var buf []byte
	event := func(v any) {
		b, _ := json.Marshal(v)
		buf = append(buf, "data: "...)
		buf = append(buf, b...)
		buf = append(buf, "\n\n"...)
	}
	abort := func() { s.abortChoices(kids) }
	// written[i] counts choice i's tokens written, -1 once its last chunk
	// (or, stalled, its last before the stall) is.
	var one [1]int
	written := one[:]
	if len(kids) > 1 {
		written = make([]int, len(kids))
	}
	open := len(kids) // choices not yet ended
	completion := 0   // tokens of the choices that finished
	roles := !g.chat  // the role chunks are written
	stalled := false  // choice 0 stopped at its stallAt
	notify := kids[0].notify
	for {
		select {
		case <-notify:
		case <-ctx.Done():
			abort()
			return
		}
		buf = buf[:0]
		stallNow := false
		for i, a := range kids {
			if written[i] < 0 {
				continue
			}
			emitted, _, finished, err := a.progress()
			if err != nil {
				// vLLM reports a failure inside a stream as an error event.
				event(errorResponse{Error: errorInfo{Message: err.Error(), Type: "InternalServerError", Code: 500}})
				buf = append(buf, "data: [DONE]\n\n"...)
				w.Write(buf)
				rc.Flush()
				abort()
				return
			}
			stall := a.stallAt > 0 && emitted >= a.stallAt
			if stall {
				emitted, finished = a.stallAt, false
			}
			if emitted <= written[i] && !finished {
				continue
			}
			if !roles {
				for k := range kids {
					event(chatRoleChunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: g.model,
						Choices: []chatRoleChoice{{Index: k, Delta: roleDelta{Role: "assistant"}}}})
				}
				roles = true
			}
			text := string(s.tok.AppendDecode(nil, a.tokens[a.promptLen+written[i]:a.promptLen+emitted]))
			written[i] = emitted
			reason := a.finishReason()
			switch {
			case g.chat && finished:
				event(chatContentChunk[chatFinalChoice]{ID: id, Object: "chat.completion.chunk", Created: created, Model: g.model,
					Choices: []chatFinalChoice{{Index: i, Delta: contentDelta{Content: text}, FinishReason: reason}}})
			case g.chat:
				event(chatContentChunk[chatContentChoice]{ID: id, Object: "chat.completion.chunk", Created: created, Model: g.model,
					Choices: []chatContentChoice{{Index: i, Delta: contentDelta{Content: text}}}})
			default:
				c := completionStreamChoice{Index: i, Text: text}
				if finished {
					c.FinishReason = &reason
				}
				event(completionChunk{ID: id, Object: "text_completion", Created: created, Model: g.model, Choices: []completionStreamChoice{c}})
			}
			switch {
			case finished:
				completion += emitted
			case stall:
				stalled, stallNow = true, true
			default:
				continue
			}
			written[i] = -1
			open--
		}
		if open == 0 && !stalled {
			if g.includeUsage {
				object := "text_completion"
				if g.chat {
					object = "chat.completion.chunk"
				}
				a := kids[0]
				_, cached, _, _ := a.progress()
				u := s.usage(a.promptLen, completion, cached)
				event(usageChunk{ID: id, Object: object, Created: created, Model: g.model, Choices: []struct{}{},
					Usage: streamUsage(u)})
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if len(buf) == 0 {
			continue
		}
		if _, err := w.Write(buf); err != nil {
			abort()
			return
		}
		if err := rc.Flush(); err != nil {
			abort()
			return
		}
		if stallNow {
			// The engine stops working on choice 0; the client waits
			// forever for it.
			s.send(command{kind: cmdAbort, id: kids[0].id})
		}
		if open == 0 {
			if stalled {
				<-ctx.Done()
			}
			return
		}
	}
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	now := time.Now().Unix()
	maxLen := s.cfg.Engine.MaxModelLen
	var data []modelCard
	for i, n := range s.cfg.ServedModelNames {
		root := s.cfg.ServedModelNames[0]
		data = append(data, modelCard{
			ID: n, Object: "model", Created: now, OwnedBy: "vllm", Root: &root, MaxModelLen: &maxLen,
			Permission: []modelPermission{{
				ID: fmt.Sprintf("modelperm-%016x%04x", s.cfg.Seed, i), Object: "model_permission", Created: now,
				AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
			}},
		})
	}
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: data})
}

func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) {
	ok := make(chan bool, 1)
	if !s.send(command{kind: cmdReset, ok: ok}) {
		writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "", "the engine is shutting down")
		return
	}
	select {
	case done := <-ok:
		if !done {
			writeError(w, http.StatusConflict, "ConflictError", "", "prefix cache not reset: requests are running; retry when the engine is idle")
			return
		}
		w.WriteHeader(http.StatusOK)
	case <-r.Context().Done():
	}
}
