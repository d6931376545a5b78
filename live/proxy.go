package live

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/router"
)

// Response headers the proxy adds.
const (
	HeaderReplica   = "X-Inferrail-Replica"
	HeaderPredicted = "X-Inferrail-Predicted-Cached-Tokens"
	HeaderRequestID = "X-Request-Id"
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

	body, err := readBody(w, r, s.opts.MaxBodyBytes)
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
	if alias {
		body = rewriteModel(body, f, m.name)
	}

	// Tokenize at the edge to predict what each replica has cached.
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.RequestTimeout)
	defer cancel()
	req := router.Request{}
	ids, outcome := s.tokenize(ctx, m, chat, body, f)
	s.met.tokenized(m.name, outcome)
	salt := m.salt
	if f.CacheSalt != nil && *f.CacheSalt != "" {
		salt = kvblock.Salt(m.name, "", *f.CacheSalt)
	}
	if ids != nil {
		req.PromptTokens = len(ids)
		req.BlockHashes = kvblock.AppendHashes(make([]kvblock.Hash, 0, len(ids)/m.opts.Engine.BlockSize+1), salt, ids, m.opts.Engine.BlockSize)
	} else {
		req.PromptTokens = len(body) / 4 // a rough size, for load accounting only
	}
	if f.User != nil {
		req.Session = sessionOf(*f.User)
	}

	tried := map[*replica]bool{}
	backoff := s.opts.Backoff
	var resp *http.Response
	var a attempt
	for n := 0; ; n++ {
		decided := time.Now()
		a, err = m.route(&req, tried, decided)
		s.met.decisionTime(m.name, time.Since(decided))
		if err != nil {
			if n == 0 {
				s.met.outcome(m.name, "no_replica")
				w.Header().Set("Retry-After", "1")
				writeError(w, http.StatusServiceUnavailable, "service_unavailable", "no_replica_available",
					fmt.Sprintf("no replica of %s can take the request now (all busy or unhealthy); retry shortly", m.name))
				return
			}
			break // every healthy replica tried
		}
		tried[a.rep] = true
		s.met.decision(m, a)
		s.logDecision(reqID, m, &req, a, time.Since(decided))
		var reused bool
		resp, reused, err = s.forward(ctx, a.rep, r, body, reqID)
		if err == nil && !retryable(resp.StatusCode) {
			break
		}
		// Failed before the first response byte: take the attempt back and
		// try an untried replica.
		m.release(&a, false, true, nil)
		a.released = true
		reason := "upstream_error"
		if err == nil {
			reason = "upstream_" + strconv.Itoa(resp.StatusCode)
		}
		if r.Context().Err() != nil {
			if resp != nil {
				resp.Body.Close()
			}
			s.met.outcome(m.name, "client_gone")
			return
		}
		// A reused keep-alive connection the engine had just closed is not
		// the engine's fault.
		if !(err != nil && reused) {
			if m.failed(a.rep, time.Now()) {
				s.met.ejected(m.name, a.rep.name)
			}
		}
		s.met.errorReason(m.name, reason)
		last := n+1 >= s.opts.Attempts || ctx.Err() != nil
		if last {
			if resp != nil {
				break // pass the engine's own answer through
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
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			s.met.outcome(m.name, "timeout")
			writeError(w, http.StatusGatewayTimeout, "timeout", "", "the request deadline passed while retrying")
			return
		}
		backoff = min(2*backoff, s.opts.MaxBackoff)
	}
	if resp == nil {
		s.met.outcome(m.name, "no_replica")
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "service_unavailable", "no_replica_available", fmt.Sprintf("every replica of %s failed or is busy; retry shortly", m.name))
		return
	}
	s.relay(w, r, m, &a, resp, req.BlockHashes, ids, salt, began)
}

// relay streams the engine's response to the client, one read at a time,
// flushing each (an engine flushes each SSE event).
func (s *Server) relay(w http.ResponseWriter, r *http.Request, m *model, a *attempt, resp *http.Response, hashes []kvblock.Hash, prompt []uint32, salt kvblock.Hash, began time.Time) {
	defer resp.Body.Close()
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
	h.Del("Content-Length")
	h.Set(HeaderReplica, a.rep.name)
	if a.predicted >= 0 {
		h.Set(HeaderPredicted, strconv.Itoa(a.predicted))
	}
	if cl := resp.Header.Get("Content-Length"); cl != "" && resp.ContentLength >= 0 {
		h.Set("Content-Length", cl)
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	first := false
	var readErr, writeErr error
	// In approximate mode the index learns the answer's blocks too: the
	// engine keeps them cached after the request, as the simulator knows.
	var ans *answer
	te, canRead := m.opts.Encoder.(TextEncoder)
	if canRead && m.opts.Index == router.IndexApproximate && prompt != nil && resp.StatusCode == http.StatusOK {
		ans = &answer{stream: strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")}
	}
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if !first {
				first = true
				if !a.released {
					m.firstByte(a)
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
	served := resp.StatusCode == http.StatusOK && first
	if a.released {
		// The last attempt's failure, passed through as the engine wrote it;
		// its slot and health were already accounted for.
		s.met.outcome(m.name, statusOutcome(resp.StatusCode))
		s.met.duration(m.name, time.Since(began))
		return
	}
	if served && complete && ans != nil {
		if text, ok := ans.finish(); ok {
			hashes = withAnswer(hashes, salt, prompt, te.EncodeText(string(text)), m.opts.Engine.BlockSize)
		}
	}
	m.release(a, served, !first, hashes)
	switch {
	case resp.StatusCode >= 500:
		if m.failed(a.rep, time.Now()) {
			s.met.ejected(m.name, a.rep.name)
		}
		s.met.outcome(m.name, "upstream_"+strconv.Itoa(resp.StatusCode))
	case r.Context().Err() != nil || writeErr != nil:
		m.succeeded(a.rep)
		s.met.outcome(m.name, "client_gone")
	case !complete:
		// The stream broke after it started: never replayed.
		if m.failed(a.rep, time.Now()) {
			s.met.ejected(m.name, a.rep.name)
		}
		s.met.outcome(m.name, "stream_broken")
	default:
		m.succeeded(a.rep)
		s.met.outcome(m.name, statusOutcome(resp.StatusCode))
	}
	s.met.duration(m.name, time.Since(began))
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
	enc := m.opts.Encoder
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
