package live

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
)

// This file is one generation request's way into the gateway core, up to
// its dispatch, for every front end that routes: the HTTP proxy
// (handleGenerate) and the endpoint picker. Each reads the request, weighs
// it, submits it and waits for the core's decision the same way; only how
// an answer reaches the client differs.

// opKind is the OpenAI operation a request asks for (its path).
type opKind uint8

const (
	opCompletion opKind = iota // POST /v1/completions
	opChat                     // POST /v1/chat/completions
	opResponses                // POST /v1/responses (the Responses API: responses.go)
	opEmbedding                // POST /v1/embeddings
	opScore                    // POST /score, /v1/score (vLLM's)
	opRerank                   // POST /rerank, /v1/rerank, /v2/rerank (Jina's and Cohere's shape)
)

// prefillOnly says op generates nothing: the engine computes its prompt
// and answers.
func (op opKind) prefillOnly() bool { return op >= opEmbedding }

// scorePaths are vLLM's scoring endpoints for a cross-encoder model.
var scorePaths = []string{"/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"}

// opOf is the operation served at path, false for none.
func opOf(path string) (opKind, bool) {
	switch path {
	case "/v1/completions":
		return opCompletion, true
	case "/v1/chat/completions":
		return opChat, true
	case "/v1/responses":
		return opResponses, true
	case "/v1/embeddings":
		return opEmbedding, true
	case "/score", "/v1/score":
		return opScore, true
	case "/rerank", "/v1/rerank", "/v2/rerank":
		return opRerank, true
	}
	return 0, false
}

// inbound is a request routed to the engines, as the gateway core sees it.
type inbound struct {
	op   opKind
	body []byte // forwarded as is (its model rewritten for an alias)
	// bg is the watch of the background response the request made, nil
	// for none (bgwatch.go): the rate limiter's reservation ends with it.
	// bgSlot: the request holds a place among max_background_responses,
	// which its watch takes over.
	bg     *bgLimit
	bgSlot bool
	f      fields
	m      *model
	req    gateway.Request
	// ids is the prompt as the engine tokenizes it, nil when unknown; salt
	// seeds its block hashes (the model's, or the request's cache_salt:
	// ownSalt).
	ids     []uint32
	salt    kvblock.Hash
	ownSalt bool
	// askedUsage: the proxy asked the engine for this stream's usage
	// (streamusage.go).
	askedUsage bool
	// adapter is the LoRA adapter the request names ("" for the model
	// itself): its blocks are keyed by it.
	adapter string
	// home is the replica a Responses API request is pinned to: the one
	// that answered the response it continues (responses.go), homeOwner
	// the API key that response was made with ("" without auth: keys).
	home, homeOwner string
	// owner is the request's API key id with auth: keys, "" otherwise.
	owner string
}

// engineModel is the model the engine serves in: the model's name, or the
// LoRA adapter the request names. The caches key answers by it and usage
// is metered under it.
func (in *inbound) engineModel() string {
	if in.adapter != "" {
		return in.adapter
	}
	return in.m.name
}

// apiError is an answer in OpenAI's error shape, with what it is counted
// as in inferrail_requests_total.
type apiError struct {
	status       int
	typ, code    string
	msg          string
	outcome      string
	model        string // "" when no model was resolved
	retryAfter   time.Duration
	queued       time.Duration
	reportQueued bool // x-inferrail-queued-ms goes with the answer
}

// answer counts e and writes it to w (headers included).
func (s *Server) answerError(w http.ResponseWriter, e *apiError) {
	s.met.outcome(e.model, e.outcome)
	if e.status == statusClientGone {
		return
	}
	h := w.Header()
	if e.reportQueued {
		h.Set(HeaderQueued, formatMs(e.queued))
	}
	if e.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfterSeconds(e.retryAfter)))
	}
	s.writeError(w, e.status, e.typ, e.code, e.msg)
}

// retryAfterSeconds rounds a wait up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int { return max(1, int(math.Ceil(d.Seconds()))) }

// parse reads a generation request's fields and headers: its model (an
// alias resolved, and rewritten in the body), its priority.
func (s *Server) parse(h http.Header, body []byte, op opKind) (*inbound, *apiError) {
	f, err := readFields(body)
	if err != nil {
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", msg: err.Error(), outcome: "bad_request"}
	}
	name := ""
	if f.Model != nil {
		name = *f.Model
	}
	m, alias, adapter := s.lookup(name)
	if m == nil {
		if name == "" {
			return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", outcome: "unknown_model",
				msg: "the model field is required: this gateway serves several models (GET /v1/models lists them)"}
		}
		return nil, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found", outcome: "unknown_model",
			msg: fmt.Sprintf("The model `%s` does not exist.", name)}
	}
	prio, ok := priorityOf(h)
	if !ok {
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_priority", outcome: "bad_request", model: m.name,
			msg: fmt.Sprintf("header %s: must be an integer from 0 to %d, got %.40q", HeaderPriority, gateway.MaxPriorityLimit, h.Get(HeaderPriority))}
	}
	if alias {
		body = rewriteModel(body, f, m.name)
	}
	// A client's kv_transfer_params name hosts an engine's KV connector
	// would connect to: only the proxy sets them (pd.go).
	if f.KVParams {
		body = withoutKVParams(body)
	}
	in := &inbound{op: op, body: body, f: f, m: m, req: gateway.Request{Priority: prio, PrefillOnly: op.prefillOnly(), LocalPrefill: op == opResponses}}
	if op == opChat || op == opCompletion { // the operations with n
		if lim := int(m.maxN.Load()); f.N > lim {
			return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "integer_above_max_value", outcome: "bad_request", model: m.name,
				msg: fmt.Sprintf("Invalid 'n': integer above maximum value. Expected a value <= %d (max_n of model %s), but got %d instead.", lim, m.name, f.N)}
		}
		// n sequences of each prompt (a batched completion has
		// several): weighed as such, and prefilled where they are
		// decoded (a KV hand-over is of one sequence).
		seqs := max(1, f.N)
		if op == opCompletion {
			seqs *= promptCount(f.Prompt)
		}
		in.req.Sequences = min(seqs, gateway.MaxSequences)
		in.req.LocalPrefill = seqs > 1
	}
	if adapter {
		in.adapter = name // forwarded as named: the engine serves it
	}
	if op == opResponses {
		s.pinResponse(in)
	}
	return in, nil
}

// weigh tokenizes in's prompt at the edge (to predict what each replica
// has cached and to weigh its KV demand) and fills in the core's request:
// its size, block hashes, tenant and session.
func (s *Server) weigh(ctx context.Context, in *inbound, h http.Header) {
	m, f := in.m, in.f
	ids, outcome := s.tokenize(ctx, m, in.op, in.body, f)
	s.met.tokenized(m, outcome)
	in.ids = ids
	in.salt = m.salt
	in.ownSalt = f.CacheSalt != nil && *f.CacheSalt != ""
	if in.ownSalt || in.adapter != "" {
		// Keyed as the engine keys them: by the adapter and the
		// cache_salt (gateway.KVEvent's LoRA and CacheSalt).
		salt := ""
		if in.ownSalt {
			salt = *f.CacheSalt
		}
		in.salt = kvblock.Salt(m.name, in.adapter, salt)
	}
	req := &in.req
	req.PromptKnown = ids != nil
	if !in.op.prefillOnly() { // an embedding or a score generates nothing
		req.MaxTokens = f.maxTokens(in.op)
	}
	req.Bytes = int64(len(in.body))
	if ids != nil {
		req.PromptTokens = len(ids)
		req.BlockHashes = kvblock.AppendHashes(make([]kvblock.Hash, 0, len(ids)/m.blockSize+1), in.salt, ids, m.blockSize)
	} else {
		// A rough size, for load accounting only; a prompt too long to
		// tokenize is weighed as the longest the engine takes (it refuses
		// a longer one).
		req.PromptTokens = len(in.body) / 4
		if n := m.contextLen(); n > 0 {
			req.PromptTokens = min(req.PromptTokens, n)
		}
	}
	req.Tenant = h.Get(HeaderTenant)
	if f.User != nil {
		req.Session = sessionOf(*f.User)
		if req.Tenant == "" {
			req.Tenant = *f.User
		}
	}
}

// wait waits while a is queued for the core's decision d (ctx bounds the
// request, client is the client's own context) and reports nil once a is
// dispatched, or the error to answer. A client that goes away while a
// waits gets statusClientGone; the caller's abort takes a out of the queue.
func (s *Server) wait(ctx, client context.Context, in *inbound, a *attempt, d gateway.Decision) *apiError {
	m := in.m
	if d.Kind == gateway.Queued {
		waitStart := a.queuedAt
		select {
		case g := <-a.ch:
			a.queued += time.Since(waitStart)
			d = g.d
			a.take(d, g.rep, g.pre)
		case <-ctx.Done():
			a.queued += time.Since(waitStart)
			if client.Err() != nil {
				return &apiError{status: statusClientGone, outcome: "client_gone", model: m.name}
			}
			return &apiError{status: http.StatusGatewayTimeout, typ: "timeout", outcome: "timeout", model: m.name,
				msg: "the request deadline passed while it waited in the queue", queued: a.queued, reportQueued: true}
		}
	}
	if d.Kind == gateway.Rejected {
		return s.rejection(in, a, d)
	}
	return nil
}

// rejection is the answer to a request the core rejected, in OpenAI's
// error shape: 429 with Retry-After when the queue is full, timed out or
// would not reach it in time, 503 with Retry-After when no replica is
// healthy, 400 when it is too long for the model.
func (s *Server) rejection(in *inbound, a *attempt, d gateway.Decision) *apiError {
	m := in.m
	s.met.rejected(m.name, d.Reason)
	e := &apiError{outcome: d.Reason, model: m.name, queued: a.queued, reportQueued: true, status: d.Status}
	if e.status == 0 {
		e.status = http.StatusServiceUnavailable
	}
	if e.status == http.StatusTooManyRequests || e.status == http.StatusServiceUnavailable {
		e.retryAfter = max(d.RetryAfter, time.Second)
	}
	switch {
	case d.Reason == gateway.ReasonTooLong:
		e.status, e.retryAfter = http.StatusBadRequest, 0
		e.typ, e.code = "invalid_request_error", "context_length_exceeded"
		e.msg = fmt.Sprintf("the prompt (%d tokens) plus max_tokens exceeds the model's maximum context length (%d tokens)", in.req.PromptTokens, m.contextLen())
	case e.status == http.StatusServiceUnavailable && in.home != "":
		// Pinned to the replica that holds the response it continues.
		e.typ, e.code = "service_unavailable", "response_replica_unavailable"
		e.msg = fmt.Sprintf("the replica that holds response %.200s (%s) is not available now; retry shortly", *in.f.PreviousResponseID, in.home)
	case e.status == http.StatusServiceUnavailable:
		// No replica is healthy (at once, or by the time the queue timed out).
		e.typ, e.code = "service_unavailable", "no_replica_available"
		e.msg = fmt.Sprintf("no replica of %s is healthy (%s); retry shortly", m.name, d.Reason)
	default:
		e.typ, e.code = "rate_limit_exceeded", d.Reason
		switch d.Reason {
		case gateway.ReasonQueueFull:
			e.msg = fmt.Sprintf("the queue of %s is full; retry later", m.name)
		case gateway.ReasonQueueTimeout:
			e.msg = fmt.Sprintf("no replica of %s could take the request within the queue timeout; retry later", m.name)
		case gateway.ReasonNoCapacity:
			e.msg = fmt.Sprintf("no replica of %s can take the request now (queueing is off); retry later", m.name)
		case gateway.ReasonSLOShed:
			e.msg = fmt.Sprintf("the queue of %s would not reach the request before its timeout; retry later", m.name)
		default:
			e.msg = fmt.Sprintf("the request to %s was rejected (%s)", m.name, d.Reason)
		}
	}
	return e
}

// learn ends a served request in the core: what the engine's answer ans
// (nil when it was not read) teaches about its usage and, in approximate
// mode, the blocks the replica holds now. It returns the output and cached
// tokens it learned (-1 when unknown).
func (s *Server) learn(in *inbound, a *attempt, ans *answer) (output, cached int) {
	m := in.m
	hashes := in.req.BlockHashes
	output, cached = -1, -1
	var u gateway.Usage
	if ans != nil {
		retokenized := -1
		if text, done := ans.finish(); done {
			if te, ok := m.enc.(TextEncoder); ok {
				ids := te.EncodeText(string(text))
				hashes = withAnswer(hashes, in.salt, in.ids, ids, m.blockSize)
				retokenized = len(ids)
			}
		}
		if n, known := ans.outputTokens(retokenized); known {
			u = gateway.Usage{Known: true, CompletionTokens: n, CachedTokens: max(ans.cached, 0)}
			output, cached = n, max(ans.cached, 0)
		}
	}
	if in.ids != nil {
		s.met.served(m, len(in.ids), a.dec.PredictedCachedTokens)
	}
	if ans != nil && ans.cached >= 0 {
		// The hit rate's terms both from the engine when it says; else
		// the edge's count, when there is one.
		prompt, ok := ans.promptTokens()
		if !ok {
			prompt = len(in.ids)
		}
		if prompt > 0 {
			s.met.reported(m, prompt, ans.cached)
		}
	}
	if s.remember(in, a, ans, hashes) {
		return output, cached // a background response: its watch ends it in the core (bgwatch.go)
	}
	m.finish(a, hashes, u)
	return output, cached
}

// showPredicted reports whether an answer to in names the prediction
// (x-inferrail-predicted-cached-tokens): with predicted_cached_header, or
// to a request with its own cache_salt, whose cache no other tenant shares.
func (s *Server) showPredicted(in *inbound) bool {
	return in.ids != nil && (s.cfg.PredictedCachedHeader || in.ownSalt)
}

// answerOf is the reader of a successful answer to in (sse: an event
// stream): in approximate mode it keeps a generation's text when the
// model's encoder can read it back into tokens, so the index learns its
// blocks too (an embedding's or a score's answer holds no text: its usage
// is read from its tail).
func answerOf(in *inbound, sse bool) *answer {
	_, canRead := in.m.enc.(TextEncoder)
	a := newAnswer(sse, canRead && in.m.index == router.IndexApproximate && in.ids != nil && !in.op.prefillOnly())
	a.strip = sse && in.askedUsage
	a.prefillOnly = in.op.prefillOnly()
	// A response's id leads its body: the body is read whole to learn it.
	a.whole = a.whole || in.op == opResponses
	return a
}
