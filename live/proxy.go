package live

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/router"
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

// hopHeaders are not forwarded (RFC 9110 section 7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// errorBody is OpenAI's error shape.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    any     `json:"code"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	var e errorBody
	e.Error.Message, e.Error.Type = msg, typ
	if code != "" {
		e.Error.Code = code
	}
	b, _ := json.Marshal(e)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// handleGenerate proxies POST /v1/completions and /v1/chat/completions.
func (s *Server) handleGenerate(w http.ResponseWriter, r *http.Request) {
	chat := r.URL.Path == "/v1/chat/completions"
	began := time.Now()
	reqID := r.Header.Get(HeaderRequestID)
	if reqID == "" {
		reqID = s.newRequestID()
	}
	w.Header().Set(HeaderRequestID, reqID)

	body, err := readBody(w, r, int64(s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			s.met.outcome("", "too_large")
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large", fmt.Sprintf("request body exceeds %d bytes", mbe.Limit))
			return
		}
		s.met.outcome("", "client_gone")
		return
	}
	f, err := readFields(body)
	if err != nil {
		s.met.outcome("", "bad_request")
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", err.Error())
		return
	}
	name := ""
	if f.Model != nil {
		name = *f.Model
	}
	m, alias := s.lookup(name)
	if m == nil {
		s.met.outcome("", "unknown_model")
		if name == "" {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "", "the model field is required: this gateway serves several models (GET /v1/models lists them)")
			return
		}
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", fmt.Sprintf("The model `%s` does not exist.", name))
		return
	}
	prio, ok := priorityOf(r.Header)
	if !ok {
		s.met.outcome(m.name, "bad_request")
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_priority",
			fmt.Sprintf("header %s: must be an integer from 0 to %d, got %q", HeaderPriority, gateway.MaxPriorityLimit, r.Header.Get(HeaderPriority)))
		return
	}
	if alias {
		body = rewriteModel(body, f, m.name)
	}

	// Tokenize at the edge to predict what each replica has cached.
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	ids, outcome := s.tokenize(ctx, m, chat, body, f)
	s.met.tokenized(m.name, outcome)
	salt := m.salt
	if f.CacheSalt != nil && *f.CacheSalt != "" {
		salt = kvblock.Salt(m.name, "", *f.CacheSalt)
	}
	req := gateway.Request{PromptKnown: ids != nil, MaxTokens: f.maxTokens(chat), Priority: prio, Bytes: int64(len(body))}
	if ids != nil {
		req.PromptTokens = len(ids)
		req.BlockHashes = kvblock.AppendHashes(make([]kvblock.Hash, 0, len(ids)/m.blockSize+1), salt, ids, m.blockSize)
	} else {
		req.PromptTokens = len(body) / 4 // a rough size, for load accounting only
	}
	req.Tenant = r.Header.Get(HeaderTenant)
	if f.User != nil {
		req.Session = sessionOf(*f.User)
		if req.Tenant == "" {
			req.Tenant = *f.User
		}
	}

	// a owns the request's life in the gateway core: whatever way this
	// handler returns, what it still holds there is given back.
	a := &attempt{}
	defer func() {
		m.abort(a, false)
		if a.submitted {
			s.met.queueWait(m.name, a.queued)
		}
	}()
	decided := time.Now()
	d := m.submit(a, req)
	took := time.Since(decided) // the core's decision (the lock's wait included)
	s.met.decisionTime(m.name, took)
	if !s.await(ctx, w, r, m, a, d, &req) {
		return
	}
	backoff := s.cfg.Retry.Backoff
	var resp *http.Response
	passThrough := false // resp is a failed last try's answer, already accounted for
	for n := 0; ; n++ {
		s.met.decision(m, a.rep)
		s.logDecision(reqID, m, &req, a, took)
		var reused bool
		resp, reused, err = s.forward(ctx, a.rep, r, body, reqID)
		if err == nil && !retryable(resp.StatusCode) {
			break
		}
		// Failed before the first response byte.
		reason := "upstream_error"
		if err == nil {
			reason = "upstream_" + strconv.Itoa(resp.StatusCode)
		}
		if r.Context().Err() != nil {
			if resp != nil {
				resp.Body.Close()
			}
			s.met.outcome(m.name, "client_gone")
			return // the deferred abort takes the attempt back
		}
		// A reused keep-alive connection the engine had just closed is not
		// the engine's fault.
		fault := !(err != nil && reused)
		s.met.errorReason(m.name, reason)
		if n+1 >= s.cfg.Retry.Attempts || ctx.Err() != nil {
			m.fail(a, fault, false)
			if resp != nil {
				passThrough = true
				break // pass the engine's own answer through
			}
			s.met.outcome(m.name, "upstream_failed")
			writeError(w, http.StatusBadGateway, "bad_gateway", "upstream_unreachable", fmt.Sprintf("no replica of %s answered: %v", m.name, err))
			return
		}
		if backoff > 0 {
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				if resp != nil {
					resp.Body.Close()
				}
				s.met.outcome(m.name, "timeout")
				writeError(w, http.StatusGatewayTimeout, "timeout", "", "the request deadline passed while retrying")
				return
			}
			backoff = min(2*backoff, s.cfg.Retry.MaxBackoff)
		}
		decided = time.Now()
		d = m.retry(a, fault)
		took = time.Since(decided)
		s.met.decisionTime(m.name, took)
		if d.Kind == gateway.Rejected && d.Reason == gateway.ReasonNoReplica {
			// Every replica was tried.
			if resp != nil {
				passThrough = true
				break
			}
			s.met.outcome(m.name, "upstream_failed")
			writeError(w, http.StatusBadGateway, "bad_gateway", "upstream_unreachable", fmt.Sprintf("no replica of %s answered: %v", m.name, err))
			return
		}
		if resp != nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			resp = nil
		}
		s.met.retry(m.name)
		if !s.await(ctx, w, r, m, a, d, &req) {
			return
		}
	}
	s.relay(w, r, m, a, resp, passThrough, req.BlockHashes, ids, salt, began)
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

// await waits while a is queued for the core's decision, then answers a
// rejection; it reports whether a is dispatched. A client that goes away
// while a waits takes it out of the queue (the handler's deferred abort).
func (s *Server) await(ctx context.Context, w http.ResponseWriter, r *http.Request, m *model, a *attempt, d gateway.Decision, req *gateway.Request) bool {
	if d.Kind == gateway.Queued {
		waitStart := time.Now()
		select {
		case g := <-a.ch:
			a.queued += time.Since(waitStart)
			d = g.d
			a.take(d, g.rep)
		case <-ctx.Done():
			a.queued += time.Since(waitStart)
			if r.Context().Err() != nil {
				s.met.outcome(m.name, "client_gone")
				return false
			}
			s.met.outcome(m.name, "timeout")
			w.Header().Set(HeaderQueued, formatMs(a.queued))
			writeError(w, http.StatusGatewayTimeout, "timeout", "", "the request deadline passed while it waited in the queue")
			return false
		}
	}
	if d.Kind == gateway.Rejected {
		s.reject(w, m, a, d, req)
		return false
	}
	return true
}

// reject answers a request the core rejected, in OpenAI's error shape: 429
// with Retry-After when the queue is full, timed out or would not reach it
// in time, 503 with Retry-After when no replica is healthy, 400 when it is
// too long for the model.
func (s *Server) reject(w http.ResponseWriter, m *model, a *attempt, d gateway.Decision, req *gateway.Request) {
	s.met.rejected(m.name, d.Reason)
	s.met.outcome(m.name, d.Reason)
	h := w.Header()
	h.Set(HeaderQueued, formatMs(a.queued))
	status := d.Status
	if status == 0 {
		status = http.StatusServiceUnavailable
	}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		h.Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(d.RetryAfter.Seconds())))))
	}
	if d.Reason == gateway.ReasonTooLong {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "context_length_exceeded",
			fmt.Sprintf("the prompt (%d tokens) plus max_tokens exceeds the model's maximum context length (%d tokens)", req.PromptTokens, m.maxModelLen))
		return
	}
	if status == http.StatusServiceUnavailable {
		// No replica is healthy (at once, or by the time the queue timed out).
		writeError(w, status, "service_unavailable", "no_replica_available", fmt.Sprintf("no replica of %s is healthy (%s); retry shortly", m.name, d.Reason))
		return
	}
	var msg string
	switch d.Reason {
	case gateway.ReasonQueueFull:
		msg = fmt.Sprintf("the queue of %s is full; retry later", m.name)
	case gateway.ReasonQueueTimeout:
		msg = fmt.Sprintf("no replica of %s could take the request within the queue timeout; retry later", m.name)
	case gateway.ReasonNoCapacity:
		msg = fmt.Sprintf("no replica of %s can take the request now (queueing is off); retry later", m.name)
	case gateway.ReasonSLOShed:
		msg = fmt.Sprintf("the queue of %s would not reach the request before its timeout; retry later", m.name)
	default:
		msg = fmt.Sprintf("the request to %s was rejected (%s)", m.name, d.Reason)
	}
	writeError(w, status, "rate_limit_exceeded", d.Reason, msg)
}

// formatMs writes a wait in milliseconds, with one decimal.
func formatMs(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64)
}

// relay streams the engine's response to the client, one read at a time,
// flushing each (an engine flushes each SSE event), and ends the attempt
// in the core by how it went. passThrough: resp is the answer of a last
// try that failed, already ended.
func (s *Server) relay(w http.ResponseWriter, r *http.Request, m *model, a *attempt, resp *http.Response, passThrough bool, hashes []kvblock.Hash, prompt []uint32, salt kvblock.Hash, began time.Time) {
	defer resp.Body.Close()
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
	h.Del("Content-Length")
	h.Set(HeaderReplica, a.dec.Name)
	if prompt != nil {
		h.Set(HeaderPredicted, strconv.Itoa(a.dec.PredictedCachedTokens))
	}
	h.Set(HeaderQueued, formatMs(a.queued))
	if cl := resp.Header.Get("Content-Length"); cl != "" && resp.ContentLength >= 0 {
		h.Set("Content-Length", cl)
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	first := false
	ok := resp.StatusCode == http.StatusOK
	var readErr, writeErr error
	// In approximate mode the index learns the answer's blocks too: the
	// engine keeps them cached after the request, as the simulator knows.
	// Every answer is read for its length (the engine's usage where it
	// sends one), which the gateway core learns its output reservations
	// from.
	var ans *answer
	te, canRead := m.enc.(TextEncoder)
	if ok {
		keep := canRead && m.index == router.IndexApproximate && prompt != nil
		ans = newAnswer(strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"), keep)
	}
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if !first {
				first = true
				if ok && !passThrough {
					m.firstByte(a) // an error answer stays pending: the engine computed nothing
				}
				s.met.ttft(m.name, time.Since(began))
			}
			if ans != nil {
				ans.feed(buf[:n])
			}
			if _, writeErr = w.Write(buf[:n]); writeErr == nil {
				writeErr = rc.Flush()
			}
			if writeErr != nil {
				break
			}
		}
		if err != nil {
			if err != io.EOF {
				readErr = err
			}
			break
		}
	}
	complete := readErr == nil && writeErr == nil
	defer func() { s.met.duration(m.name, time.Since(began)) }()
	if passThrough {
		// The last try's failure, passed through as the engine wrote it;
		// its slot and health were already accounted for.
		s.met.outcome(m.name, statusOutcome(resp.StatusCode))
		return
	}
	switch {
	case resp.StatusCode >= 500:
		m.fail(a, true, false)
		s.met.outcome(m.name, "upstream_"+strconv.Itoa(resp.StatusCode))
	case r.Context().Err() != nil || writeErr != nil:
		m.abort(a, true)
		s.met.outcome(m.name, "client_gone")
	case !complete:
		// The stream broke after it started: never replayed.
		m.fail(a, true, false)
		s.met.outcome(m.name, "stream_broken")
	case ok && first:
		var u gateway.Usage
		if ans != nil {
			retokenized := -1
			if text, done := ans.finish(); done {
				ids := te.EncodeText(string(text))
				hashes = withAnswer(hashes, salt, prompt, ids, m.blockSize)
				retokenized = len(ids)
			}
			if n, known := ans.outputTokens(retokenized); known {
				u = gateway.Usage{Known: true, CompletionTokens: n, CachedTokens: max(ans.cached, 0)}
			}
		}
		m.finish(a, hashes, u)
		s.met.outcome(m.name, "ok")
	default:
		// A client error the engine answered (or an empty answer): the
		// replica is fine, the request left nothing cached.
		m.fail(a, false, true)
		s.met.outcome(m.name, statusOutcome(resp.StatusCode))
	}
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

// forward sends the body to rep. reused reports whether the connection was
// a pooled one.
func (s *Server) forward(ctx context.Context, rep *replica, r *http.Request, body []byte, reqID string) (*http.Response, bool, error) {
	u := *rep.base
	u.Path += r.URL.Path
	u.RawQuery = r.URL.RawQuery
	reused := false
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	out, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	for k, vs := range r.Header {
		out.Header[k] = vs
	}
	for _, k := range hopHeaders {
		out.Header.Del(k)
	}
	out.Header.Del("Content-Length")
	out.Header.Set(HeaderRequestID, reqID)
	out.ContentLength = int64(len(body))
	resp, err := s.upstream.Do(out)
	return resp, reused, err
}

// tokenize returns the prompt's token ids as the engine will see them, or
// nil with the reason it could not.
func (s *Server) tokenize(ctx context.Context, m *model, chat bool, body []byte, f fields) ([]uint32, tokOutcome) {
	enc := m.enc
	if enc == nil {
		return nil, tokSkipped
	}
	if chat {
		return s.tok.do(ctx, func() ([]uint32, error) { return enc.EncodeChat(body) })
	}
	prompt, ok := completionPrompt(f.Prompt)
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

// readBody reads the request body up to limit, in one allocation when the
// client announced its length.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, limit)
	if n := r.ContentLength; n > 0 && n <= limit {
		b := make([]byte, n)
		if _, err := io.ReadFull(rd, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return io.ReadAll(rd)
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
