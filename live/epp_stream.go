package live

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// eppLinger is how long a stream may stay open once its response ended.
const eppLinger = 10 * time.Second

// eppStream is one ext_proc stream: one request's way through Envoy, from
// its headers to the end of its response.
type eppStream struct {
	svc *eppService
	s   *Server
	srv extProcPb.ExternalProcessor_ProcessServer
	// msgs carries the received messages; it is closed when the stream
	// ends (recvErr says how), after gone is cancelled.
	msgs    chan *extProcPb.ProcessingRequest
	recvErr error
	// gone ends with the stream: Envoy cancelled it or closed its side.
	gone     context.Context
	stopGone context.CancelFunc

	began time.Time
	reqID string
	ar    accessRecord

	// The body modes of Envoy's filter, from the stream's first message.
	// Without a protocol_config both are taken as FULL_DUPLEX_STREAMED.
	reqMode, respMode procmode.ProcessingMode_BodySendMode

	// The request.
	hdr          http.Header
	method, path string
	subset       []string
	hasSubset    bool
	generate     bool // a generation request (the rest is answered here)
	passing      bool // a stored response's request, sent on to its replica (passTo)
	body         []byte
	held         int64 // body bytes held against max_inflight_body_bytes
	trailers     bool  // the body ended with trailers
	headersSent  bool  // the request headers were answered (BUFFERED mode)
	in           *inbound
	a            *attempt // the request's life in the core
	first        *attempt // the first attempt, for the queue wait metric
	rep          *replica // the replica that serves it
	took         time.Duration
	ctx          context.Context // the request's deadline (request_timeout)
	cancel       context.CancelFunc
	span         trace.Span // the request's SERVER span (nil: not traced)

	// The response.
	status    int
	ans       *answer
	bodyBytes int
	ended     bool // the request ended in the core
	respDone  bool // the response ended
}

func newEPPStream(svc *eppService, srv extProcPb.ExternalProcessor_ProcessServer) *eppStream {
	gone, stop := context.WithCancel(srv.Context())
	st := &eppStream{
		svc: svc, s: svc.s, srv: srv, msgs: make(chan *extProcPb.ProcessingRequest), gone: gone, stopGone: stop,
		began: time.Now(), reqMode: procmode.ProcessingMode_FULL_DUPLEX_STREAMED, respMode: procmode.ProcessingMode_FULL_DUPLEX_STREAMED,
	}
	st.ar.began = st.began
	return st
}

// receive hands the stream's messages to run until the stream ends.
func (st *eppStream) receive() {
	defer close(st.msgs)
	defer st.stopGone()
	for {
		req, err := st.srv.Recv()
		if err != nil {
			st.recvErr = err
			return
		}
		select {
		case st.msgs <- req:
		case <-st.gone.Done():
			return
		}
	}
}

// run handles the stream: the request up to its decision, then its
// response. Whatever way it returns, the request is released in the core.
func (st *eppStream) run() error {
	defer st.release()
	if err := st.readRequest(); err != nil || st.respDone {
		return err
	}
	if st.passing {
		return st.passOn()
	}
	if err := st.route(); err != nil || st.respDone {
		if err != nil && !st.respDone && st.a != nil {
			st.streamEnded() // the pick could not be sent
		}
		return err
	}
	return st.followResponse()
}

// release gives back what the request still holds: its dispatch or its
// place in the queue (an early end of the stream), its body bytes.
func (st *eppStream) release() {
	if st.a != nil {
		st.in.m.abort(st.a, false)
	}
	if st.in != nil {
		st.s.dropBackground(st.in) // its place, unless a watch took it (bgwatch.go)
	}
	if st.first != nil && st.first.submitted {
		st.s.met.queueWait(st.in.m, st.first.queued)
		st.ar.queued = st.first.queued
	}
	st.giveBody()
	if st.cancel != nil {
		st.cancel()
	}
	st.stopGone()
	if st.generate {
		st.s.logAccess(&http.Request{RemoteAddr: clientAddr(st.hdr)}, &st.ar)
		endServer(st.span, st.in, &st.ar, st.reqID)
	}
}

func (st *eppStream) giveBody() {
	st.s.bodies.give(st.held)
	st.held = 0
}

// clientAddr is the client's address as Envoy forwards it.
func clientAddr(h http.Header) string {
	xff, _, _ := strings.Cut(h.Get("X-Forwarded-For"), ",")
	return strings.TrimSpace(xff)
}

// next waits for the stream's next message until deadline (nil: no
// bound); ok is false when the stream ended, timedOut when the deadline
// passed first.
func (st *eppStream) next(deadline <-chan time.Time) (msg *extProcPb.ProcessingRequest, ok, timedOut bool) {
	select {
	case msg, ok = <-st.msgs:
		return msg, ok, false
	case <-deadline:
		return nil, false, true
	}
}

// endErr is what Process returns for a stream that ended before its
// request did: nil when Envoy closed or cancelled it, else the receive
// error (a message too large, say). It waits for the receiver to end,
// which it does once the stream has.
func (st *eppStream) endErr() error {
	for range st.msgs {
	}
	switch err := st.recvErr; {
	case err == nil, err == io.EOF, st.srv.Context().Err() != nil, status.Code(err) == codes.Canceled:
		return nil
	default:
		return err
	}
}

// readRequest reads the request's headers and its whole body, within
// read_timeout; it answers what is not a generation request, and bodies
// too large or over the bodies' budget, itself.
func (st *eppStream) readRequest() error {
	s := st.s
	t := time.NewTimer(s.cfg.ReadTimeout)
	defer t.Stop()
	first := true
	for {
		msg, ok, timedOut := st.next(t.C)
		switch {
		case timedOut:
			return st.reject(&apiError{status: http.StatusRequestTimeout, typ: "invalid_request_error", code: "body_timeout", outcome: "body_timeout",
				msg: fmt.Sprintf("the request body did not arrive within read_timeout (%v)", s.cfg.ReadTimeout)})
		case !ok:
			st.respDone = true // nothing to answer: the stream is gone
			if st.ar.method != "" {
				s.met.outcome("", "client_gone")
				st.ar.status = statusClientGone
			}
			return st.endErr()
		}
		if msg.ObservabilityMode {
			return grpcError(codes.FailedPrecondition, "observability_mode is not supported: the endpoint picker must answer every message")
		}
		if first {
			first = false
			if pc := msg.ProtocolConfig; pc != nil {
				st.reqMode, st.respMode = pc.RequestBodyMode, pc.ResponseBodyMode
			}
		}
		switch v := msg.Request.(type) {
		case *extProcPb.ProcessingRequest_RequestHeaders:
			if st.hdr != nil {
				return grpcError(codes.InvalidArgument, "request headers sent twice")
			}
			done, err := st.onHeaders(msg, v.RequestHeaders)
			if err != nil || done || st.respDone {
				return err
			}
		case *extProcPb.ProcessingRequest_RequestBody:
			if st.hdr == nil {
				return grpcError(codes.InvalidArgument, "request body before its headers")
			}
			b := v.RequestBody.Body
			if limit := int64(s.cfg.MaxBodyBytes); int64(len(st.body))+int64(len(b)) > limit {
				return st.reject(&apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "body_too_large", outcome: "too_large",
					msg: fmt.Sprintf("request body exceeds max_body_bytes (%d)", limit)})
			}
			if !s.bodies.take(int64(len(b))) {
				return st.reject(&apiError{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "body_budget", outcome: "busy", retryAfter: time.Second,
					msg: "the gateway holds too many request bodies now (max_inflight_body_bytes); retry shortly"})
			}
			st.held += int64(len(b))
			st.body = append(st.body, b...)
			if v.RequestBody.EndOfStream {
				return nil
			}
		case *extProcPb.ProcessingRequest_RequestTrailers:
			if st.hdr == nil {
				return grpcError(codes.InvalidArgument, "request trailers before its headers")
			}
			st.trailers = true
			return nil
		case nil:
			// Nothing but flow control, which the picker leaves to gRPC.
		default:
			return grpcError(codes.InvalidArgument, "%T before the request was answered", v)
		}
	}
}

// onHeaders takes the request's headers; done says the request has no
// body.
func (st *eppStream) onHeaders(msg *extProcPb.ProcessingRequest, h *extProcPb.HttpHeaders) (done bool, err error) {
	s := st.s
	st.hdr = http.Header{}
	for _, hv := range h.GetHeaders().GetHeaders() {
		v := headerValue(hv)
		switch k := strings.ToLower(hv.GetKey()); k {
		case ":path":
			st.path = v
		case ":method":
			st.method = v
		default:
			if !strings.HasPrefix(k, ":") {
				st.hdr.Add(k, v)
			}
		}
	}
	path, _, _ := strings.Cut(st.path, "?")
	st.ar.method, st.ar.path = st.method, path
	st.reqID = st.hdr.Get(HeaderRequestID)
	if !validRequestID(st.reqID) {
		st.reqID = s.newRequestID()
	}
	if id, ok := storedID(st.method, path); ok {
		// A stored response's request: to the replica that holds it
		// (responses.go), outside the core; one this picker did not see
		// answered (it restarted, or another picker did) is found first
		// (locate.go).
		ctx, cancel := context.WithTimeout(st.gone, s.cfg.RequestTimeout)
		_, rep, _ := s.findStored(ctx, st.clientRequest(), st.reqID, id, false)
		cancel()
		if rep == nil {
			return true, st.reject(responseNotFoundErr("", id))
		}
		st.passing = true
		return true, st.passTo(rep)
	}
	if _, ok := opOf(path); st.method != http.MethodPost || !ok {
		// Answered here as live's client handler answers it.
		return true, st.answerWeb()
	}
	st.generate = true
	switch st.reqMode {
	case procmode.ProcessingMode_FULL_DUPLEX_STREAMED, procmode.ProcessingMode_BUFFERED:
	default:
		if !h.EndOfStream {
			return true, st.reject(&apiError{status: http.StatusInternalServerError, typ: "server_error", code: "epp_body_mode", outcome: "bad_request",
				msg: fmt.Sprintf("the endpoint picker reads whole bodies: set the ext_proc filter's request_body_mode to FULL_DUPLEX_STREAMED or BUFFERED (it is %s)", st.reqMode)})
		}
	}
	if cl := st.hdr.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n > int64(s.cfg.MaxBodyBytes) {
			return true, st.reject(&apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "body_too_large", outcome: "too_large",
				msg: fmt.Sprintf("request body of %d bytes exceeds max_body_bytes (%d)", n, s.cfg.MaxBodyBytes)})
		} else if err == nil && n > 0 {
			st.body = make([]byte, 0, n) // its bytes are held as they arrive
		}
	}
	st.subset, st.hasSubset = subsetHint(msg.GetMetadataContext())
	if h.EndOfStream {
		return true, nil
	}
	if st.reqMode == procmode.ProcessingMode_BUFFERED {
		// Envoy sends a buffered body only once the headers are
		// answered; the pick rides on the body's answer.
		st.headersSent = true
		return false, st.send(&extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extProcPb.HeadersResponse{Response: &extProcPb.CommonResponse{}}}})
	}
	return false, nil
}

// clientRequest is the client's request as the header policy reads it
// (upstreamHeaders): its headers and address.
func (st *eppStream) clientRequest() *http.Request {
	return &http.Request{Header: st.hdr, RemoteAddr: clientAddr(st.hdr)}
}

// answerWeb answers a request that is not a generation one as live's
// client handler does.
func (st *eppStream) answerWeb() error {
	r, err := http.NewRequestWithContext(st.gone, st.method, st.path, http.NoBody)
	if err != nil {
		return st.reject(&apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "bad_path", outcome: "bad_request", msg: "the request's :path or :method is not valid"})
	}
	r.Header = st.hdr
	rec := newEPPRecorder()
	st.svc.web.ServeHTTP(rec, r)
	st.ar.status = rec.code
	return st.immediate(rec, "")
}

// reject answers e as an immediate response (counted as live counts it).
func (st *eppStream) reject(e *apiError) error {
	st.ar.status = e.status
	if e.model != "" {
		st.ar.model = e.model
	}
	rec := newEPPRecorder()
	st.s.answerError(rec, e)
	if e.status == statusClientGone {
		st.respDone = true
		return nil
	}
	return st.immediate(rec, e.outcome)
}

// immediate sends rec's answer as Envoy's immediate response: the request
// goes no further.
func (st *eppStream) immediate(rec *eppRecorder, details string) error {
	st.respDone = true
	code := rec.code
	if code == 0 {
		code = http.StatusOK
	}
	var set []*corev3.HeaderValueOption
	for k, vs := range rec.h {
		if k == "Content-Length" || len(vs) == 0 {
			continue
		}
		set = append(set, setHeader(strings.ToLower(k), vs[0]))
	}
	return st.send(&extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extProcPb.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
		Headers: &extProcPb.HeaderMutation{SetHeaders: set},
		Body:    rec.body,
		Details: details,
	}}})
}

func (st *eppStream) send(r *extProcPb.ProcessingResponse) error {
	if err := st.srv.Send(r); err != nil {
		return err
	}
	return nil
}

// route routes the request as live does (parse, weigh, submit, wait), and
// answers Envoy with the pick: the destination header and metadata, and
// the body passed on (its model rewritten for an alias).
func (st *eppStream) route() error {
	s := st.s
	op, _ := opOf(st.ar.path)
	parent := st.gone
	if s.tr != nil {
		// The request's trace goes on from Envoy's traceparent (the
		// client's, or Envoy's own span with its tracing on).
		if ctx, sp := s.tr.serverOf(st.gone, st.hdr, st.ar.path, op); sp != nil {
			parent, st.span = ctx, sp
		}
	}
	in, perr := s.parse(st.hdr, st.body, op)
	if perr != nil {
		return st.reject(perr)
	}
	st.in = in
	m := in.m
	st.ar.model = m.name
	if in.f.Background && in.op == opResponses {
		if e := s.holdBackground(in); e != nil { // bgwatch.go
			return st.reject(e)
		}
	}
	st.ctx, st.cancel = context.WithTimeout(parent, s.cfg.RequestTimeout)
	if e := s.locateHome(st.ctx, st.clientRequest(), st.reqID, in, false); e != nil { // a response another picker saw answered (locate.go)
		return st.reject(e)
	}
	s.weigh(st.ctx, in, st.hdr)
	s.applyPickerHeaders(st.hdr, in)
	if in.ids != nil {
		st.ar.promptTokens = len(in.ids)
	}
	if st.hasSubset {
		// The gateway allows these endpoints only: the core sees no
		// other replica for this request (none: it rejects it, 503).
		allowed := allowedOf(m, st.subset)
		if in.home != "" {
			// Pinned to the replica that holds the response it continues
			// (responses.go): that one, if the gateway allows it.
			allowed = slices.DeleteFunc(allowed, func(i int) bool { return i != in.req.Allowed[0] })
		}
		in.req.Allowed = allowed
	}
	a := &attempt{}
	st.a, st.first = a, a
	rsp := s.tr.route(st.ctx, m)
	decided := time.Now()
	d := m.submit(a, in.req)
	st.took = time.Since(decided)
	s.met.decisionTime(m, st.took)
	e := s.wait(st.ctx, st.gone, in, a, d)
	endRoute(rsp, in, a, d, e, st.took)
	if e != nil {
		return st.reject(e)
	}
	st.rep = a.rep
	s.met.decision(m, a.rep)
	s.logDecision(st.reqID, m, &in.req, a, st.took)
	st.ar.replica = a.rep.name
	ep := endpointOf(a.rep)
	if n := s.cfg.EPP.FallbackEndpoints; n > 0 && a.pre == nil {
		// The gateway's retries, should the pick fail before an answer;
		// where one is served, served() accounts the move.
		for _, f := range fallbacks(m, a.rep, in.req.Allowed, n) {
			ep += "," + endpointOf(f)
		}
	}

	set := []*corev3.HeaderValueOption{setHeader(eppDestination, ep)}
	remove := pickerHeaders // llm-d's request headers: the engine needs none
	if a.pre != nil {
		// P/D: the decode pod's routing sidecar (llm-d's) runs the
		// prefill there; the decode replica's first byte says it is done.
		set = append(set, setHeader(eppPrefiller, endpointOf(a.pre)))
		st.ar.prefill = a.pre.name
	} else {
		// A client's own value would send its prompt where it chooses.
		remove = removeWithoutPrefill
	}
	if st.span != nil && st.span.IsRecording() {
		// The engine's own spans, when it traces, go under the pick's.
		for k, vs := range s.tr.headersOf(st.ctx, st.span) {
			set = append(set, setHeader(strings.ToLower(k), vs[0]))
		}
	}
	rewritten := len(in.body) != len(st.body) || (len(in.body) > 0 && &in.body[0] != &st.body[0])
	if rewritten {
		set = append(set, setHeader("content-length", strconv.Itoa(len(in.body))))
	}
	common := &extProcPb.CommonResponse{HeaderMutation: &extProcPb.HeaderMutation{SetHeaders: set, RemoveHeaders: remove}, ClearRouteCache: true}
	meta := &structpb.Struct{Fields: map[string]*structpb.Value{
		eppLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{eppDestination: structpb.NewStringValue(ep)}}),
	}}
	body := in.body
	st.body, in.body = nil, nil
	defer st.giveBody()
	if st.headersSent {
		// BUFFERED: the body's answer carries the pick (Envoy holds the
		// headers until it), and the rewritten body if the model was.
		if rewritten {
			common.BodyMutation = &extProcPb.BodyMutation{Mutation: &extProcPb.BodyMutation_Body{Body: body}}
		}
		return st.send(&extProcPb.ProcessingResponse{DynamicMetadata: meta,
			Response: &extProcPb.ProcessingResponse_RequestBody{RequestBody: &extProcPb.BodyResponse{Response: common}}})
	}
	if err := st.send(&extProcPb.ProcessingResponse{DynamicMetadata: meta,
		Response: &extProcPb.ProcessingResponse_RequestHeaders{RequestHeaders: &extProcPb.HeadersResponse{Response: common}}}); err != nil {
		return err
	}
	if len(body) == 0 && !st.trailers {
		return nil // a request without a body
	}
	// FULL_DUPLEX_STREAMED: the body goes back in chunks, the last one
	// ending it unless trailers do.
	for len(body) > 0 {
		n := min(len(body), eppChunk)
		if err := st.send(&extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_RequestBody{RequestBody: &extProcPb.BodyResponse{
			Response: &extProcPb.CommonResponse{BodyMutation: &extProcPb.BodyMutation{Mutation: &extProcPb.BodyMutation_StreamedResponse{
				StreamedResponse: &extProcPb.StreamedBodyResponse{Body: body[:n], EndOfStream: n == len(body) && !st.trailers}}}}}}}); err != nil {
			return err
		}
		body = body[n:]
	}
	if st.trailers {
		return st.send(&extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_RequestTrailers{RequestTrailers: &extProcPb.TrailersResponse{}}})
	}
	return nil
}

// followResponse watches the response go by: its status and the endpoint
// that served it (the headers), its body for the engine's usage, its end.
// request_timeout bounds it; a stream that ends before the response does
// releases the request.
func (st *eppStream) followResponse() error {
	var linger <-chan time.Time
	for {
		if st.respDone && linger == nil {
			// Envoy ends the stream with the response; one that lingers
			// is let go.
			t := time.NewTimer(eppLinger)
			defer t.Stop()
			linger = t.C
		}
		var msg *extProcPb.ProcessingRequest
		var ok bool
		select {
		case msg, ok = <-st.msgs:
		case <-st.ctx.Done():
		case <-linger:
		}
		if !ok {
			if st.respDone {
				return nil
			}
			if st.gone.Err() == nil && st.ctx.Err() != nil {
				// request_timeout passed: not the replica's fault.
				st.in.m.fail(st.a, false, false)
				st.ended = true
				st.s.met.outcome(st.in.m.name, "timeout")
				st.s.met.errorReason(st.in.m.name, failDeadline)
				st.ar.status = http.StatusGatewayTimeout
				return grpcError(codes.DeadlineExceeded, "the request did not complete within request_timeout (%v)", st.s.cfg.RequestTimeout)
			}
			st.streamEnded()
			return st.endErr()
		}
		var err error
		switch v := msg.Request.(type) {
		case *extProcPb.ProcessingRequest_ResponseHeaders:
			err = st.onResponseHeaders(msg, v.ResponseHeaders)
		case *extProcPb.ProcessingRequest_ResponseBody:
			if st.status == 0 {
				err = grpcError(codes.InvalidArgument, "response body before its headers")
				break
			}
			err = st.onResponseBody(v.ResponseBody)
		case *extProcPb.ProcessingRequest_ResponseTrailers:
			if st.status == 0 {
				err = grpcError(codes.InvalidArgument, "response trailers before its headers")
				break
			}
			st.endResponse()
			err = st.send(&extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extProcPb.TrailersResponse{}}})
		case *extProcPb.ProcessingRequest_RequestTrailers:
			err = st.send(&extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_RequestTrailers{RequestTrailers: &extProcPb.TrailersResponse{}}})
		case nil:
		default:
			err = grpcError(codes.InvalidArgument, "unexpected %T after the request was answered", v)
		}
		if err != nil {
			if !st.respDone {
				st.streamEnded()
			}
			return err
		}
	}
}

// onResponseHeaders takes the response's status: 200 is the engine's
// first byte, 5xx a failure of the replica, any other an answer that
// leaves nothing cached. It adds live's response headers (the replica,
// the queue wait, the prediction when shown).
func (st *eppStream) onResponseHeaders(msg *extProcPb.ProcessingRequest, h *extProcPb.HttpHeaders) error {
	s, m := st.s, st.in.m
	if st.status != 0 {
		return grpcError(codes.InvalidArgument, "response headers sent twice")
	}
	ctype := ""
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch strings.ToLower(hv.GetKey()) {
		case ":status":
			st.status, _ = strconv.Atoi(headerValue(hv))
		case "content-type":
			ctype = headerValue(hv)
		}
	}
	if st.status == 0 {
		st.status = http.StatusOK
	}
	st.ar.status = st.status
	if served, ok := servedEndpoint(msg.GetMetadataContext()); ok {
		st.served(served)
	}
	if st.rep != nil {
		s.met.ttft(m, st.rep, time.Since(st.began))
	}
	switch {
	case st.ended:
		// Let go in the core (served elsewhere): only passed on.
	case st.status == http.StatusOK:
		if st.a.pre != nil {
			m.prefillDone(st.a)
			s.met.pd(m.name, "remote")
			st.ar.pd = "remote"
		}
		m.firstByte(st.a)
		st.ans = answerOf(st.in, strings.HasPrefix(ctype, "text/event-stream"))
	case st.status >= 500:
		m.fail(st.a, true, false)
		st.ended = true
		s.met.outcome(m.name, "upstream_"+strconv.Itoa(st.status))
	default:
		// A client error the engine answered: the replica is fine, the
		// request left nothing cached.
		m.fail(st.a, false, true)
		st.ended = true
		s.met.outcome(m.name, statusOutcome(st.status))
	}
	set := []*corev3.HeaderValueOption{setHeader(strings.ToLower(HeaderQueued), formatMs(st.first.queued))}
	if st.rep != nil {
		set = append(set, setHeader(strings.ToLower(HeaderReplica), st.rep.name))
		if s.showPredicted(st.in) {
			set = append(set, setHeader(strings.ToLower(HeaderPredicted), strconv.Itoa(st.a.dec.PredictedCachedTokens)))
		}
	}
	if h.EndOfStream {
		st.endResponse()
	}
	return st.send(&extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extProcPb.HeadersResponse{Response: &extProcPb.CommonResponse{HeaderMutation: &extProcPb.HeaderMutation{SetHeaders: set}}}}})
}

// served takes the endpoint Envoy says served the request. When it is not
// the pick (a retry on a fallback, or the gateway's own choice), the core
// is told before the first byte: the dispatch is taken back from the pick
// (no fault: it did nothing wrong) and the request submitted anew
// restricted to the serving replica (gateway.Request.Allowed) without
// queueing, so its counters, its reservation and, once the answer is in,
// the index name the replica that now holds the prompt. When the serving
// endpoint is not one of the model's replicas, or the core will not take
// the request there now (full, or requests queued ahead of it), the
// request is let go in the core (aborted) and passes through unaccounted.
func (st *eppStream) served(ep string) {
	m := st.in.m
	if st.rep != nil && matches(ep, st.rep) {
		return
	}
	r := replicaAt(m, ep)
	if r == nil {
		m.abort(st.a, true)
		st.rep = nil
		st.ended = true
		st.s.met.outcome(m.name, "served_elsewhere")
		return
	}
	st.a = m.moveTo(st.a, st.in.req, r)
	if st.a.pre != nil {
		// Served elsewhere, with no prefill replica named to it: it
		// prefilled where it decoded.
		m.prefillFailed(st.a, false)
	}
	if st.a.rep == nil {
		st.rep = nil
		st.ended = true
		st.s.met.outcome(m.name, "served_elsewhere")
		return
	}
	st.rep = st.a.rep
	st.ar.replica = r.name
}

// onResponseBody feeds a chunk of the response to the answer and passes
// it on unchanged.
func (st *eppStream) onResponseBody(b *extProcPb.HttpBody) error {
	if st.ans != nil {
		st.ans.feed(b.Body)
	}
	st.bodyBytes += len(b.Body)
	if b.EndOfStream {
		// The engine is done: its slot is free before the last chunk
		// goes on.
		st.endResponse()
	}
	if st.respMode == procmode.ProcessingMode_FULL_DUPLEX_STREAMED {
		return st.send(&extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_ResponseBody{ResponseBody: &extProcPb.BodyResponse{
			Response: &extProcPb.CommonResponse{BodyMutation: &extProcPb.BodyMutation{Mutation: &extProcPb.BodyMutation_StreamedResponse{
				StreamedResponse: &extProcPb.StreamedBodyResponse{Body: b.Body, EndOfStream: b.EndOfStream}}}}}}})
	}
	return st.send(&extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_ResponseBody{ResponseBody: &extProcPb.BodyResponse{Response: &extProcPb.CommonResponse{}}}})
}

// endResponse ends the request in the core once its response is whole: a
// successful answer teaches its usage (learn), an empty one nothing.
func (st *eppStream) endResponse() {
	if st.respDone {
		return
	}
	st.respDone = true
	s, m := st.s, st.in.m
	if st.rep != nil {
		s.met.duration(m, st.rep, time.Since(st.began))
	}
	if st.ended {
		return
	}
	st.ended = true
	ans := st.ans
	switch {
	case st.respMode == procmode.ProcessingMode_NONE:
		ans = nil // Envoy does not send the body: its usage is unknown
	case st.bodyBytes == 0:
		m.fail(st.a, false, true)
		s.met.outcome(m.name, statusOutcome(st.status))
		return
	}
	if out, cached := s.learn(st.in, st.a, ans); out >= 0 {
		st.ar.outputTokens, st.ar.cachedTokens = out, cached
	}
	st.ar.enginePrompt(ans)
	s.met.ok(m)
}

// streamEnded ends in the core a request whose stream ended before its
// response did: Envoy went away, or the client did. An answer whose data:
// [DONE] arrived is whole; otherwise the replica did nothing wrong once it
// answered (abort, counted as client_gone).
func (st *eppStream) streamEnded() {
	if st.respDone {
		return
	}
	m := st.in.m
	whole := st.ans != nil && st.ans.done || st.respMode == procmode.ProcessingMode_NONE && st.status == http.StatusOK
	if whole && !st.ended {
		// An answer whose data: [DONE] arrived is whole; without the
		// body (response_body_mode NONE), the stream's end is the
		// response's.
		st.endResponse()
		return
	}
	st.respDone = true
	if st.ended {
		return
	}
	st.ended = true
	if st.status != http.StatusOK || !st.s.leftBackground(st.in, st.a, st.a.rep, st.ans) { // responses.go
		m.abort(st.a, st.status == http.StatusOK)
	}
	st.s.met.outcome(m.name, "client_gone")
	st.ar.status = statusClientGone
}

// headerValue is an Envoy header's value (raw_value when set).
func headerValue(hv *corev3.HeaderValue) string {
	if len(hv.GetRawValue()) > 0 {
		return string(hv.GetRawValue())
	}
	return hv.GetValue()
}

// removeWithoutPrefill is the header removal of every pick without a
// prefill: a client's prefiller header and llm-d's request headers
// (shared, never written).
var removeWithoutPrefill = append([]string{eppPrefiller}, pickerHeaders...)

// setHeader is a header mutation that replaces any value the header had:
// a client cannot add an endpoint of its own to the pick.
func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// subsetHint reads the filter metadata envoy.lb.subset_hint →
// x-gateway-destination-endpoint-subset: a list of endpoints or a
// comma-joined string. ok says a hint was given (its list may be empty).
func subsetHint(md *corev3.Metadata) (eps []string, ok bool) {
	v, ok := metaValue(md, eppSubsetNS, eppSubset)
	if !ok {
		return nil, false
	}
	return endpointList(stringsOf(v)...), true
}

// servedEndpoint reads the metadata envoy.lb →
// x-gateway-destination-endpoint-served: the first endpoint it names.
func servedEndpoint(md *corev3.Metadata) (string, bool) {
	v, ok := metaValue(md, eppLB, eppServed)
	if !ok {
		return "", false
	}
	if eps := endpointList(stringsOf(v)...); len(eps) > 0 {
		return eps[0], true
	}
	return "", false
}

func metaValue(md *corev3.Metadata, ns, key string) (*structpb.Value, bool) {
	st := md.GetFilterMetadata()[ns]
	if st == nil {
		return nil, false
	}
	v, ok := st.GetFields()[key]
	return v, ok && v != nil
}

// stringsOf is a metadata value's strings: a string, or a list's strings.
func stringsOf(v *structpb.Value) []string {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return []string{k.StringValue}
	case *structpb.Value_ListValue:
		var out []string
		for _, e := range k.ListValue.GetValues() {
			if s, ok := e.GetKind().(*structpb.Value_StringValue); ok {
				out = append(out, s.StringValue)
			}
		}
		return out
	}
	return nil
}

// passTo sends a stored response's request (GET /v1/responses/{id},
// POST /v1/responses/{id}/cancel) to rep, the replica that holds the
// response, without the core: it computes nothing there.
func (st *eppStream) passTo(rep *replica) error {
	ep := endpointOf(rep)
	st.ar.replica = rep.name
	common := &extProcPb.CommonResponse{HeaderMutation: &extProcPb.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(eppDestination, ep)}}, ClearRouteCache: true}
	meta := &structpb.Struct{Fields: map[string]*structpb.Value{
		eppLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{eppDestination: structpb.NewStringValue(ep)}}),
	}}
	return st.send(&extProcPb.ProcessingResponse{DynamicMetadata: meta,
		Response: &extProcPb.ProcessingResponse_RequestHeaders{RequestHeaders: &extProcPb.HeadersResponse{Response: common}}})
}

// passOn answers the rest of a passed request's stream unchanged (its body,
// the response's headers, body and trailers) until Envoy ends it, within
// request_timeout, and eppLinger once the response has ended.
func (st *eppStream) passOn() error {
	defer st.s.logAccess(&http.Request{RemoteAddr: clientAddr(st.hdr)}, &st.ar)
	deadline := time.NewTimer(st.s.cfg.RequestTimeout)
	defer deadline.Stop()
	var linger <-chan time.Time
	for {
		var msg *extProcPb.ProcessingRequest
		var ok bool
		select {
		case msg, ok = <-st.msgs:
		case <-deadline.C:
			return grpcError(codes.DeadlineExceeded, "the request did not complete within request_timeout (%v)", st.s.cfg.RequestTimeout)
		case <-linger:
			return nil
		}
		if !ok {
			return st.endErr()
		}
		var r *extProcPb.ProcessingResponse
		end := false
		switch v := msg.Request.(type) {
		case *extProcPb.ProcessingRequest_RequestBody:
			r = &extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_RequestBody{RequestBody: passBody(v.RequestBody, st.reqMode)}}
		case *extProcPb.ProcessingRequest_RequestTrailers:
			r = &extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_RequestTrailers{RequestTrailers: &extProcPb.TrailersResponse{}}}
		case *extProcPb.ProcessingRequest_ResponseHeaders:
			for _, h := range v.ResponseHeaders.GetHeaders().GetHeaders() {
				if h.GetKey() == ":status" {
					st.ar.status, _ = strconv.Atoi(string(h.GetRawValue()))
				}
			}
			end = v.ResponseHeaders.GetEndOfStream()
			r = &extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extProcPb.HeadersResponse{}}}
		case *extProcPb.ProcessingRequest_ResponseBody:
			end = v.ResponseBody.GetEndOfStream()
			r = &extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_ResponseBody{ResponseBody: passBody(v.ResponseBody, st.respMode)}}
		case *extProcPb.ProcessingRequest_ResponseTrailers:
			end = true
			r = &extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extProcPb.TrailersResponse{}}}
		case nil:
			continue
		default:
			return grpcError(codes.InvalidArgument, "unexpected %T", v)
		}
		if err := st.send(r); err != nil {
			return err
		}
		if end && linger == nil {
			t := time.NewTimer(eppLinger)
			defer t.Stop()
			linger = t.C
		}
	}
}

// passBody is the answer to a body chunk passed on unchanged: in
// FULL_DUPLEX_STREAMED mode the chunk itself goes back.
func passBody(b *extProcPb.HttpBody, mode procmode.ProcessingMode_BodySendMode) *extProcPb.BodyResponse {
	if mode == procmode.ProcessingMode_FULL_DUPLEX_STREAMED {
		return &extProcPb.BodyResponse{Response: &extProcPb.CommonResponse{BodyMutation: &extProcPb.BodyMutation{Mutation: &extProcPb.BodyMutation_StreamedResponse{
			StreamedResponse: &extProcPb.StreamedBodyResponse{Body: b.GetBody(), EndOfStream: b.GetEndOfStream()}}}}}
	}
	return &extProcPb.BodyResponse{Response: &extProcPb.CommonResponse{}}
}
