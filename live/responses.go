package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// This file is the Responses API (POST /v1/responses) as vLLM serves it: a
// generation like a chat's, whose instructions and input vLLM turns into
// chat messages, and whose stored responses live in the engine that
// answered (vLLM keeps them in memory with VLLM_ENABLE_RESPONSES_API_STORE).
// A request that continues one (previous_response_id) is therefore pinned
// to that replica, and GET /v1/responses/{id} (and .../cancel) is passed to
// it: the proxy remembers which replica answered each response (homes), and
// searches the replicas for one it did not see answered (locate.go).

// responsesChat is a Responses API request's prompt as a chat completions
// body, the messages vLLM builds from it (instructions as the system
// message, then the input: a string as the user's message, a list's
// message items as chat messages: chatMessage), for the edge's tokenizer. It is false when
// the prompt cannot be known here: the request continues a stored response
// (whose history only its engine holds), or its input holds items other
// than messages (tool calls and their outputs, reasoning), which vLLM
// renders its own way.
func responsesChat(f *fields) ([]byte, bool) {
	if f.PreviousResponseID != nil || len(f.Input) == 0 {
		return nil, false
	}
	var b bytes.Buffer
	b.Grow(len(f.Input) + len(f.Instructions) + 64)
	b.WriteString(`{"messages":[`)
	n := 0
	if len(f.Instructions) > 0 && f.Instructions[0] == '"' && string(f.Instructions) != `""` {
		b.WriteString(`{"role":"system","content":`)
		b.Write(f.Instructions)
		b.WriteByte('}')
		n++
	}
	switch f.Input[0] {
	case '"':
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":`)
		b.Write(f.Input)
		b.WriteByte('}')
	case '[':
		var items []json.RawMessage
		if json.Unmarshal(f.Input, &items) != nil || len(items) == 0 {
			return nil, false
		}
		for _, it := range items {
			msg, ok := chatMessage(it)
			if !ok {
				return nil, false
			}
			if n > 0 {
				b.WriteByte(',')
			}
			b.Write(msg)
			n++
		}
	default:
		return nil, false
	}
	b.WriteString(`]}`)
	return b.Bytes(), true
}

// chatMessage is a Responses API input item as the chat message vLLM
// makes of it: a message item (its type "message" or absent) with its
// role and content, its typed text parts (input_text, output_text) text
// parts; false for any other item.
func chatMessage(item json.RawMessage) ([]byte, bool) {
	var msg map[string]json.RawMessage
	if json.Unmarshal(item, &msg) != nil || len(msg["role"]) == 0 {
		return nil, false
	}
	if t, ok := msg["type"]; ok && string(t) != `"message"` {
		return nil, false
	}
	delete(msg, "type")
	content := msg["content"]
	if len(content) > 0 && content[0] == '[' {
		var parts []map[string]json.RawMessage
		if json.Unmarshal(content, &parts) != nil {
			return nil, false
		}
		for _, p := range parts {
			switch string(p["type"]) {
			case `"input_text"`, `"output_text"`:
				p["type"] = json.RawMessage(`"text"`)
			}
		}
		c, err := json.Marshal(parts)
		if err != nil {
			return nil, false
		}
		msg["content"] = c
	}
	out, err := json.Marshal(msg)
	return out, err == nil
}

// maxHomes bounds the response ids the proxy remembers the replica of.
const maxHomes = 1 << 16

// homes remembers which replica answered each response the engines may
// have stored: two generations of at most maxHomes/2 ids each; when the
// newer fills, the older is dropped whole and the newer takes its place
// (an id read again moves to the newer). Safe for concurrent use.
type homes struct {
	mu       sync.Mutex
	cur, old map[string]home
}

// home is where a response was answered: its model and replica's names
// (looked up again when used: a replica may be gone since), and with
// auth: keys the key it was made with (no other key reads it).
type home struct{ model, replica, owner string }

func (h *homes) put(id string, at home) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == nil {
		h.cur = make(map[string]home)
	}
	if len(h.cur) >= maxHomes/2 {
		h.old, h.cur = h.cur, make(map[string]home, maxHomes/2)
	}
	h.cur[id] = at
}

func (h *homes) get(id string) (home, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if at, ok := h.cur[id]; ok {
		return at, true
	}
	at, ok := h.old[id]
	if ok {
		delete(h.old, id)
		if h.cur == nil {
			h.cur = make(map[string]home)
		}
		if len(h.cur) >= maxHomes/2 {
			h.old, h.cur = h.cur, make(map[string]home, maxHomes/2)
		}
		h.cur[id] = at
	}
	return at, ok
}

// pinResponse restricts a Responses API request that continues a stored
// response to the replica that answered it: only that engine holds it.
// An id the proxy does not know (answered before it started, or through
// another gateway) is searched for (locateHome), or else left to the usual
// rule; the engine that gets it answers 404 when it does not hold it.
func (s *Server) pinResponse(in *inbound) {
	if in.f.PreviousResponseID == nil {
		return
	}
	at, ok := s.homes.get(*in.f.PreviousResponseID)
	if !ok || at.model != in.m.name {
		return
	}
	rep := in.m.lookup(at.replica)
	if rep == nil {
		return
	}
	in.req.Allowed = []int{rep.idx}
	in.home, in.homeOwner = rep.name, at.owner
}

// remember notes the replica that answered a Responses API request, when
// the engine may have stored the response (the request did not say store:
// false).
//
// An answer without its output (a background response's "queued") is
// watched to its end (bgwatch.go), which then ends a in the core (held
// are its blocks): remember reports whether the watch took a over.
func (s *Server) remember(in *inbound, a *attempt, ans *answer, held []kvblock.Hash) bool {
	if id := s.keepHome(in, a.rep, ans); id != "" {
		if _, known := ans.outputTokens(-1); !known {
			return s.watchBackground(in, a, a.rep, id, held)
		}
	}
	return false
}

// leftBackground is for a background stream (background and stream)
// whose end the proxy did not relay: the client left, or the stream broke
// or timed out. The engine generates it still (vLLM's background does not
// end with its first stream), so its replica is remembered for the client
// to read it or resume its stream there (GET ?stream=true&starting_after),
// and its output is metered when it ends (bgwatch.go): what the stream
// carried before it was cut is not metered.
//
// With a (the client left: the request is still in the core) the watch
// ends it there when the response ends, and leftBackground reports
// whether it took it over; nil (the stream failed, and a with it) leaves
// the core out.
func (s *Server) leftBackground(in *inbound, a *attempt, rep *replica, ans *answer) bool {
	if !in.f.Background {
		return false
	}
	if id := s.keepHome(in, rep, ans); id != "" {
		return s.watchBackground(in, a, rep, id, in.req.BlockHashes)
	}
	return false
}

// keepHome remembers the replica that answered a Responses API request
// (here and through tenancy.redis) when the engine may have stored the
// response (the request did not say store: false), and returns the
// response's id ("" for none).
func (s *Server) keepHome(in *inbound, rep *replica, ans *answer) string {
	if in.op != opResponses || in.f.NoStore || rep == nil || ans == nil {
		return ""
	}
	id := ans.responseID()
	if id != "" {
		at := home{model: in.m.name, replica: rep.name, owner: in.owner}
		s.homes.put(id, at)
		s.shared.put(id, at) // other gateways (tenancy.redis)
	}
	return id
}

// storedID is the response id a stored response's request names (GET
// /v1/responses/{id}, POST /v1/responses/{id}/cancel); false for any
// other request.
func storedID(method, path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/v1/responses/")
	if !ok {
		return "", false
	}
	id, sub, _ := strings.Cut(rest, "/")
	switch {
	case id == "" || len(id) > maxResponseID:
		return "", false
	case method == http.MethodGet && sub == "" && !strings.Contains(rest, "/"):
	case method == http.MethodPost && sub == "cancel":
	default:
		return "", false
	}
	return id, true
}

// homeOf is the model and replica at names, nil when either is gone.
func (s *Server) homeOf(at home) (*model, *replica) {
	m, _, _ := s.lookup(at.model)
	if m == nil {
		return nil, nil
	}
	if rep := m.lookup(at.replica); rep != nil {
		return m, rep
	}
	return nil, nil
}

// responseNotFoundErr is vLLM's 404 for a response id it does not hold,
// which the proxy answers too for another key's response.
func responseNotFoundErr(model, id string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "response_not_found", outcome: "unknown_response", model: model,
		msg: fmt.Sprintf("Response with id '%.200s' not found.", id)}
}

// maxResponseID bounds the id in /v1/responses/{id}.
const maxResponseID = 256

// maxStoredBody bounds what is read of a stored response request's body
// (it has none).
const maxStoredBody = 64 << 10

// handleStoredResponse passes GET /v1/responses/{id} and POST
// /v1/responses/{id}/cancel to the replica that answered the response,
// and answers 404 in vLLM's words for an id the proxy does not know.
func (s *Server) handleStoredResponse(w http.ResponseWriter, r *http.Request) {
	began := time.Now()
	ar := &accessRecord{began: began, method: r.Method, path: r.URL.Path}
	defer s.logAccess(r, ar)
	reqID := s.requestID(w, r)
	g, ok := s.authenticate(w, r, ar)
	if !ok {
		return
	}
	// These requests carry no body: what a client sends is read and
	// dropped within read_timeout, so a stalled one holds nothing.
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(s.cfg.ReadTimeout))
	io.Copy(io.Discard, io.LimitReader(r.Body, maxStoredBody))
	rc.SetReadDeadline(time.Time{})
	id := r.PathValue("id")
	keyed := g != nil && s.ten.auth
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	var m *model
	var rep *replica
	if id, ok := storedID(r.Method, r.URL.Path); ok {
		var owner string
		m, rep, owner = s.findStored(ctx, r, reqID, id, keyed) // locate.go
		if rep != nil && keyed && owner != g.key.ID {
			rep = nil // another key's: as if it did not exist
		}
	}
	if rep == nil {
		e := responseNotFoundErr("", id)
		ar.status, ar.outcome = e.status, e.outcome
		s.answerError(w, e)
		return
	}
	ar.model, ar.replica = m.name, rep.name
	resp, err := s.forwardStored(ctx, rep, r, reqID)
	if err != nil {
		ar.status, ar.outcome = http.StatusBadGateway, "upstream_failed"
		s.writeError(w, http.StatusBadGateway, "bad_gateway", "upstream_unreachable",
			fmt.Sprintf("the replica that holds response %.200s (%s) did not answer: %s", id, rep.name, errCause(err)))
		return
	}
	defer resp.Body.Close()
	ar.outcome = statusOutcome(resp.StatusCode)
	s.passStored(w, resp, rep, ar)
}

// forwardStored sends a stored response's request to rep as the client
// made it (its method, path and query; these requests carry no body), with
// the proxy's header policy.
func (s *Server) forwardStored(ctx context.Context, rep *replica, r *http.Request, reqID string) (*http.Response, error) {
	u := *rep.base
	u.Path += r.URL.Path
	u.RawQuery = r.URL.RawQuery
	out := &http.Request{
		Method: r.Method, URL: &u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: s.upstreamHeaders(r, reqID, rep).header(), Body: http.NoBody, Host: u.Host,
	}
	return s.upstream.Transport.RoundTrip(out.WithContext(ctx))
}

// passStored copies a stored response's answer to the client, each read
// flushed (vLLM streams a background response's events on ?stream=true),
// each write bounded by write_timeout.
func (s *Server) passStored(w http.ResponseWriter, resp *http.Response, rep *replica, ar *accessRecord) {
	h := w.Header()
	copyAnswerHeaders(h, resp.Header)
	if cl := resp.Header.Get("Content-Length"); cl != "" {
		h.Set("Content-Length", cl) // the body passes unchanged
	}
	h.Set(HeaderReplica, rep.name)
	ar.status = resp.StatusCode
	rc := http.NewResponseController(w)
	rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	w.WriteHeader(resp.StatusCode)
	pb := bufPool.Get().(*[]byte)
	defer bufPool.Put(pb)
	for {
		n, err := resp.Body.Read(*pb)
		if n > 0 && s.write(w, rc, (*pb)[:n]) != nil {
			return
		}
		if err != nil {
			return
		}
	}
}
