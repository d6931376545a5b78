package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/openai"
	"github.com/inferrail/inferrail/router/gateway"
)

// Headers the proxy reads and adds.
const (
	HeaderReplica   = "X-Inferrail-Replica"
	HeaderPredicted = "X-Inferrail-Predicted-Cached-Tokens"
	HeaderRequestID = "X-Request-Id"
	// HeaderQueued is on every proxied response and every rejection by the
	// queue: the milliseconds the request waited for a replica.
	HeaderQueued = "X-Inferrail-Queued-Ms"
	// HeaderPriority is a request's priority class, an integer from 0 to
	// 1000 (higher is served first), capped by the model's max_priority.
	HeaderPriority = "X-Inferrail-Priority"
	// HeaderTenant names a request's tenant for the queue's fairness; the
	// body's user field stands in without it.
	HeaderTenant = "X-Inferrail-Tenant"
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// writeError answers an error in OpenAI's shape, its write bounded by
// write_timeout.
func (s *Server) writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	e := openai.ErrorBody{Error: openai.ErrorInfo{Message: msg, Type: typ}}
	if code != "" {
		e.Error.Code = openai.StringCode(code)
	}
	b, _ := json.Marshal(e)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// handleGenerate proxies POST /v1/completions, /v1/chat/completions,
// /v1/responses, /v1/embeddings and vLLM's scoring endpoints.
func (s *Server) handleGenerate(w http.ResponseWriter, r *http.Request) {
	op, _ := opOf(r.URL.Path)
	began := time.Now()
	reqID := s.requestID(w, r)
	ar := &accessRecord{began: began, method: r.Method, path: r.URL.Path}
	defer s.logAccess(r, ar)
	var in *inbound
	if s.rec != nil { // the recording's row, once the rest has ended
		tok := s.rec.begin(reqID, began)
		defer func() { s.rec.end(tok, reqID, in, ar) }()
	}
	if s.tr != nil {
		if ctx, sp := s.tr.server(r, op); sp != nil {
			r = r.WithContext(ctx)
			defer func() { endServer(sp, in, ar, reqID) }()
		}
	}

	g, ok := s.authenticate(w, r, ar) // auth: keys (tenancy.go)
	if !ok {
		return
	}
	body, held, ok := s.readRequestBody(w, r, ar)
	defer s.bodies.give(held)
	if !ok {
		return
	}
	var perr *apiError
	in, perr = s.parse(r.Header, body, op)
	if perr == nil {
		perr = s.authorize(g, in, r.Header)
	}
	if perr != nil {
		ar.model, ar.status, ar.outcome = perr.model, perr.status, perr.outcome
		s.answerError(w, perr)
		return
	}
	m := in.m
	ar.model = m.name
	if in.f.Background && in.op == opResponses {
		if e := s.holdBackground(in); e != nil { // bgwatch.go
			ar.status, ar.outcome = e.status, e.outcome
			s.answerError(w, e)
			return
		}
		defer s.dropBackground(in)
	}

	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	if e := s.locateHome(ctx, r, reqID, in, g != nil && s.ten.auth); e != nil { // a response another gateway answered (locate.go)
		ar.status, ar.outcome = e.status, e.outcome
		s.answerError(w, e)
		return
	}
	// The response caches (cache.go): a hit is answered here; a miss's
	// answer goes to the client through the capture, stored at the end.
	ct, cerr := s.lookupCaches(ctx, r, g, in)
	switch {
	case cerr != nil:
		ar.status, ar.outcome = cerr.status, cerr.outcome
		s.answerError(w, cerr)
		return
	case ct != nil && ct.hit != nil:
		s.serveCached(ctx, w, g, in, ar, ct)
		return
	case ct != nil:
		w = ct.capture.Wrap(w)
		defer s.finishCaches(ct)
	}
	s.weigh(ctx, in, r.Header)
	if in.ids != nil {
		ar.promptTokens = len(in.ids)
	}
	if e := s.reserve(ctx, w, g, in); e != nil {
		ar.status, ar.outcome = e.status, e.outcome
		s.answerError(w, e)
		return
	}
	// g's limits and usage end when the request does (after a's, below).
	defer s.release(g, in, ar)

	// a owns the request's life in the gateway core: whatever way this
	// handler returns, what it still holds there is given back.
	a := &attempt{}
	defer func() {
		m.abort(a, false)
		if a.submitted {
			s.met.queueWait(m, a.queued)
		}
		ar.queued, ar.predicted = a.queued, a.dec.PredictedCachedTokens
	}()
	rsp := s.tr.route(ctx, m)
	decided := time.Now()
	d := m.submit(a, in.req)
	took := time.Since(decided) // the core's decision (the lock's wait included)
	s.met.decisionTime(m, took)
	e := s.wait(ctx, r.Context(), in, a, d)
	endRoute(rsp, in, a, d, e, took)
	if e != nil {
		ar.status, ar.outcome = e.status, e.outcome
		s.answerError(w, e)
		return
	}
	backoff := s.cfg.Retry.Backoff
	in.askedUsage = s.asksUsage(in)
	var t *try
	passThrough := false // t is a failed last try's answer, already accounted for
	for n := 0; ; n++ {
		s.met.decision(m, a.rep)
		s.logDecision(reqID, m, &in.req, a, took)
		ar.replica = a.rep.name
		body, remote := in.body, false
		if a.pre != nil {
			// Disaggregated: the prefill replica first (pd.go).
			var stop prefillStop
			body, stop = s.prefill(ctx, r, in, a, reqID, ar)
			switch stop {
			case "client_gone":
				s.outcomeOf(ar, m.name, "client_gone")
				ar.status = statusClientGone
				return // the deferred abort ends the request and its prefill
			case "timeout":
				m.fail(a, false, false)
				s.outcomeOf(ar, m.name, "timeout")
				ar.status = http.StatusGatewayTimeout
				s.writeError(w, http.StatusGatewayTimeout, "timeout", "request_timeout", fmt.Sprintf("the request did not complete within request_timeout (%v)", s.cfg.RequestTimeout))
				return
			}
			remote = ar.pd == "remote"
		}
		up := plainBody(body)
		if in.askedUsage {
			up = withStreamUsage(body)
		}
		t = s.attempt(ctx, in, up, remote, a.rep, r, reqID)
		t.nth = n
		if t.err == nil && !retryable(t.resp.StatusCode) {
			break
		}
		// Failed before the first response byte.
		if r.Context().Err() != nil {
			t.close()
			s.outcomeOf(ar, m.name, "client_gone")
			ar.status = statusClientGone
			return // the deferred abort takes the attempt back
		}
		if ctx.Err() != nil {
			// The request's own deadline passed: the try is not the
			// replica's fault, and there is no time left for another.
			t.close()
			m.fail(a, false, false)
			s.outcomeOf(ar, m.name, "timeout")
			ar.status = http.StatusGatewayTimeout
			s.writeError(w, http.StatusGatewayTimeout, "timeout", "request_timeout", fmt.Sprintf("the request did not complete within request_timeout (%v)", s.cfg.RequestTimeout))
			return
		}
		reason := t.reason()
		// A reused keep-alive connection the engine had just closed is not
		// the engine's fault.
		fault := !(t.err != nil && t.reused && !t.timedOut)
		s.met.errorReason(m.name, reason)
		s.log.Debug("try failed", "model", m.name, "replica", a.rep.name, "reason", reason, "try", n+1)
		if n+1 >= s.cfg.Retry.Attempts {
			m.fail(a, fault, false)
			if t.resp != nil {
				passThrough = true
				break // pass the engine's own answer through
			}
			s.upstreamFailed(w, m, a.rep, t, ar)
			return
		}
		failed := a.rep
		if backoff > 0 {
			tm := time.NewTimer(backoff)
			select {
			case <-tm.C:
			case <-ctx.Done():
				tm.Stop()
				t.close()
				m.fail(a, fault, false)
				if r.Context().Err() != nil {
					s.outcomeOf(ar, m.name, "client_gone")
					ar.status = statusClientGone
					return
				}
				s.outcomeOf(ar, m.name, "timeout")
				ar.status = http.StatusGatewayTimeout
				s.writeError(w, http.StatusGatewayTimeout, "timeout", "request_timeout", "the request deadline passed while retrying")
				return
			}
			backoff = min(2*backoff, s.cfg.Retry.MaxBackoff)
		}
		rsp = s.tr.route(ctx, m)
		decided = time.Now()
		d = m.retry(a, fault)
		took = time.Since(decided)
		s.met.decisionTime(m, took)
		if d.Kind == gateway.Rejected && d.Reason == gateway.ReasonNoReplica {
			// Every replica was tried.
			endRoute(rsp, in, a, d, &apiError{outcome: "all_tried"}, took)
			if t.resp != nil {
				passThrough = true
				break
			}
			s.upstreamFailed(w, m, failed, t, ar)
			return
		}
		t.close()
		s.met.retry(m.name)
		e := s.wait(ctx, r.Context(), in, a, d)
		endRoute(rsp, in, a, d, e, took)
		if e != nil {
			ar.status, ar.outcome = e.status, e.outcome
			s.answerError(w, e)
			return
		}
	}
	g.relaying(w.Header(), t, ar)
	s.relay(w, r, ctx, in, a, t, passThrough, s.showPredicted(in), began, ar)
	g.done()
}

// requestID is a new request's id: the proxy's own, which keys the
// decision log's sampling and goes upstream. The answer echoes the
// client's x-request-id when it is a sane one, else carries the proxy's.
func (s *Server) requestID(w http.ResponseWriter, r *http.Request) string {
	reqID := s.newRequestID()
	if id := r.Header.Get(HeaderRequestID); validRequestID(id) {
		w.Header().Set(HeaderRequestID, id)
	} else {
		w.Header().Set(HeaderRequestID, reqID)
	}
	return reqID
}

// statusClientGone is the access log's status of a request whose client
// left before an answer (nginx's 499).
const statusClientGone = 499

// upstreamFailed answers 502 when no try reached an engine's answer. The
// body names the last replica tried by its configured name, never its URL.
func (s *Server) upstreamFailed(w http.ResponseWriter, m *model, rep *replica, t *try, ar *accessRecord) {
	s.outcomeOf(ar, m.name, "upstream_failed")
	ar.status = http.StatusBadGateway
	s.writeError(w, http.StatusBadGateway, "bad_gateway", "upstream_unreachable",
		fmt.Sprintf("no replica of %s answered (last tried: %s, %s)", m.name, rep.name, t.reason()))
}

// maxRequestID bounds a client's x-request-id the proxy echoes.
const maxRequestID = 128

// validRequestID reports whether a client's request id is echoed: 1 to 128
// characters of letters, digits and ._:-
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestID {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// readRequestBody reads a request's body within read_timeout, holding its
// bytes against max_inflight_body_bytes; it answers the client itself and
// returns false when the body cannot be taken. held is what the caller
// gives back to s.bodies when the request ends.
func (s *Server) readRequestBody(w http.ResponseWriter, r *http.Request, ar *accessRecord) (body []byte, held int64, ok bool) {
	limit := int64(s.cfg.MaxBodyBytes)
	fail := func(status int, typ, code, msg string) {
		ar.status = status
		w.Header().Set("Connection", "close")
		s.writeError(w, status, typ, code, msg)
	}
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(s.cfg.ReadTimeout))
	if r.ContentLength > limit {
		// Refused before reading: no 100 Continue is sent for it.
		s.outcomeOf(ar, "", "too_large")
		fail(http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large", fmt.Sprintf("request body of %d bytes exceeds max_body_bytes (%d)", r.ContentLength, limit))
		return nil, 0, false
	}
	bb := &budgetReader{r: http.MaxBytesReader(w, r.Body, limit), b: s.bodies}
	var err error
	if n := r.ContentLength; n > 0 {
		if !s.bodies.take(n) {
			err = errBodyBudget
		} else {
			bb.held = n
			bb.prepaid = true
			body = make([]byte, n)
			_, err = io.ReadFull(bb, body)
		}
	} else {
		body, err = io.ReadAll(bb)
	}
	if err == nil {
		// A read deadline left in place would end the request when it
		// passes (the server's background read of the connection fails).
		// A failed body keeps it: the server's discard of what is left
		// then ends at once, and the connection is closed.
		rc.SetReadDeadline(time.Time{})
		return body, bb.held, true
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, errBodyBudget):
		s.outcomeOf(ar, "", "busy")
		w.Header().Set("Retry-After", "1")
		ar.status = http.StatusServiceUnavailable
		s.writeError(w, http.StatusServiceUnavailable, "service_unavailable", "body_budget", "the gateway holds too many request bodies now (max_inflight_body_bytes); retry shortly")
	case errors.As(err, &mbe):
		s.outcomeOf(ar, "", "too_large")
		fail(http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large", fmt.Sprintf("request body exceeds max_body_bytes (%d)", mbe.Limit))
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.outcomeOf(ar, "", "body_timeout")
		fail(http.StatusRequestTimeout, "invalid_request_error", "body_timeout", fmt.Sprintf("the request body did not arrive within read_timeout (%v)", s.cfg.ReadTimeout))
	case r.Context().Err() != nil:
		s.outcomeOf(ar, "", "client_gone")
		ar.status = statusClientGone
	default:
		// A malformed body (a broken chunked encoding, a short body).
		s.outcomeOf(ar, "", "bad_request")
		fail(http.StatusBadRequest, "invalid_request_error", "malformed_body", "the request body could not be read: "+bodyErrText(err))
	}
	return nil, bb.held, false
}

// bodyErrText names what was wrong with a body, without echoing its bytes.
func bodyErrText(err error) string {
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "it ended before its announced length"
	case strings.Contains(err.Error(), "chunk"):
		return "malformed chunked encoding"
	}
	return "read error"
}

// priorityOf reads the priority header: 0 without one (or an empty one),
// false when it is not one integer from 0 to gateway.MaxPriorityLimit.
func priorityOf(h http.Header) (int, bool) {
	vs := h.Values(HeaderPriority)
	if len(vs) == 0 || len(vs) == 1 && strings.TrimSpace(vs[0]) == "" {
		return 0, true
	}
	p, err := strconv.Atoi(strings.TrimSpace(vs[0]))
	if err != nil || p < 0 || p > gateway.MaxPriorityLimit || len(vs) > 1 {
		return 0, false
	}
	return p, true
}

// formatMs writes a wait in milliseconds, with one decimal.
func formatMs(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64)
}

func statusOutcome(code int) string {
	if code == http.StatusOK {
		return "ok"
	}
	return "upstream_" + strconv.Itoa(code)
}

// retryable reports statuses retried on another replica: the engine did not
// start the request.
func retryable(code int) bool {
	return code == http.StatusBadGateway || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout
}

// tokenize returns the prompt's token ids as the engine will see them, or
// nil with the reason it could not.
func (s *Server) tokenize(ctx context.Context, m *model, op opKind, body []byte, f fields) ([]uint32, tokOutcome) {
	enc := m.enc
	if enc == nil {
		return nil, tokSkipped
	}
	if op == opResponses {
		// Its instructions and input as the chat messages vLLM makes of
		// them (responses.go).
		if len(body) > m.promptLimit() {
			return nil, tokTooLong
		}
		chat, ok := responsesChat(&f)
		if !ok {
			return nil, tokSkipped
		}
		body, op = chat, opChat
	}
	if op == opChat {
		// The body bounds its messages' text.
		if len(body) > m.promptLimit() {
			return nil, tokTooLong
		}
		return s.tok.do(ctx, func() ([]uint32, error) { return enc.EncodeChat(body) })
	}
	if op == opScore || op == opRerank {
		// A cross-encoder reads each pair joined its own way: weighed by
		// the body's size.
		return nil, tokSkipped
	}
	raw := f.Prompt
	if op == opEmbedding {
		// One text, tokenized as a completion's prompt (vLLM adds the
		// special tokens to both); a chat-style body (messages) or
		// several texts are routed without a prediction.
		raw = f.Input
	}
	if len(raw) > m.promptLimit() {
		return nil, tokTooLong
	}
	prompt, ok := completionPrompt(raw)
	if !ok {
		return nil, tokSkipped
	}
	return s.tok.do(ctx, func() ([]uint32, error) { return enc.EncodeCompletion(prompt), nil })
}

// sessionOf maps the OpenAI user field to a session id for affinity.
func sessionOf(user string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(user); i++ {
		h = (h ^ uint64(user[i])) * 1099511628211
	}
	return kvblock.Mix64(h)
}

// withAnswer extends a prompt's block hashes with the blocks the engine
// holds once it has answered: the full blocks of prompt and answer but the
// answer's last token (never fed back to the model).
func withAnswer(hashes []kvblock.Hash, salt kvblock.Hash, prompt, answer []uint32, blockSize int) []kvblock.Hash {
	n := len(prompt) + len(answer) - 1
	done := len(hashes) * blockSize
	if n/blockSize <= len(hashes) {
		return hashes
	}
	all := make([]uint32, 0, n-done)
	if done < len(prompt) {
		all = append(all, prompt[done:]...)
	}
	all = append(all, answer[:len(answer)-1]...)
	parent := salt
	if len(hashes) > 0 {
		parent = hashes[len(hashes)-1]
	}
	return kvblock.AppendHashes(hashes[:len(hashes):len(hashes)], parent, all, blockSize)
}
