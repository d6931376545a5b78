package live

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmode "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router"
)

// testEPP is a running `inferrail epp` (serveEPP on loopback) and a gRPC
// client of it.
type testEPP struct {
	*Server
	conn   *grpc.ClientConn
	client extProcPb.ExternalProcessorClient
	health healthpb.HealthClient
	cancel context.CancelFunc
	done   chan error
	stop   func()
}

// eppConfig is testConfig for the picker: its listeners on loopback ports
// of their own, no drain delay.
func eppConfig(t testing.TB, ups ...*upstream) *config.Config {
	c := testConfig(t, ups...)
	c.AdminListen = "127.0.0.1:0"
	c.EPP.Listen = "127.0.0.1:0"
	c.EPP.SecureServing = false // h2c; TestEPPServesTLS covers TLS
	c.DrainDelay, c.DrainTimeout = 0, 2*time.Second
	return c
}

func startEPP(t testing.TB, c *config.Config, deps Deps, o eppOptions) *testEPP {
	t.Helper()
	s, err := New(c, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	hurry := make(chan struct{})
	go func() { done <- s.serveEPP(ctx, hurry, o) }()
	var addr net.Addr
	waitUntil(t, "the picker to listen", 5*time.Second, func() bool { addr, _ = s.Addrs(); return addr != nil })
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e := &testEPP{Server: s, conn: conn, client: extProcPb.NewExternalProcessorClient(conn), health: healthpb.NewHealthClient(conn), cancel: cancel, done: done}
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			close(hurry)
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("ServeEPP: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("ServeEPP did not return within 10s of its context's end")
			}
			conn.Close()
			s.Close()
		})
	}
	t.Cleanup(e.stop)
	return e
}

// envoyReq is a request as Envoy's ext_proc filter hands it over.
type envoyReq struct {
	method string // "" is POST
	path   string
	body   []byte
	chunks int // the body in this many chunks (0, 1: one)
	header map[string]string
	// reqMode and respMode are the filter's body modes (both 0: no
	// protocol_config is sent, which the picker takes as
	// FULL_DUPLEX_STREAMED; one 0: that one FULL_DUPLEX_STREAMED).
	reqMode, respMode procmode.ProcessingMode_BodySendMode
	// subset is the subset hint: nil none, a []string a list value, a
	// string a string value.
	subset any
	// trailers ends the body with request trailers.
	trailers bool
	// noRespBody is response_body_mode NONE.
	noRespBody bool
}

// eppPick is what the picker answered a request.
type eppPick struct {
	immediate *extProcPb.ImmediateResponse
	// endpoint is the destination header, meta the envoy.lb metadata's.
	endpoint, meta string
	// body is the body passed on; contentLength the header set, if any.
	body          []byte
	contentLength string
	clearCache    bool
	// prefiller is the x-prefiller-host-port header set, if any; removed
	// the headers removed.
	prefiller string
	removed   []string
	// traceparent is the traceparent header set, if any.
	traceparent string
}

// eppCall is one ext_proc stream.
type eppCall struct {
	t      testing.TB
	stream extProcPb.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	req    envoyReq
	pick   eppPick
	// respHeaders are the headers the picker set on the response.
	respHeaders map[string]string
	// ended: the picker ended the stream (an early immediate response)
	// while messages were still being sent; Recv gets its answer.
	ended bool
}

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

func (r envoyReq) headers() *extProcPb.HttpHeaders {
	method := r.method
	if method == "" {
		method = http.MethodPost
	}
	hs := []*corev3.HeaderValue{hv(":method", method), hv(":path", r.path), hv(":authority", "gateway"), hv("content-type", "application/json"),
		hv("content-length", strconv.Itoa(len(r.body)))}
	for k, v := range r.header {
		hs = append(hs, hv(strings.ToLower(k), v))
	}
	return &extProcPb.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: len(r.body) == 0 && !r.trailers}
}

func (r envoyReq) first() *extProcPb.ProcessingRequest {
	m := &extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_RequestHeaders{RequestHeaders: r.headers()}}
	if r.reqMode != 0 || r.respMode != 0 || r.noRespBody {
		pc := &extProcPb.ProtocolConfiguration{RequestBodyMode: r.reqMode, ResponseBodyMode: r.respMode}
		if pc.RequestBodyMode == 0 {
			pc.RequestBodyMode = procmode.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		if pc.ResponseBodyMode == 0 && !r.noRespBody {
			pc.ResponseBodyMode = procmode.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		m.ProtocolConfig = pc
	}
	if r.subset != nil {
		var v *structpb.Value
		switch s := r.subset.(type) {
		case string:
			v = structpb.NewStringValue(s)
		case []string:
			l := &structpb.ListValue{}
			for _, e := range s {
				l.Values = append(l.Values, structpb.NewStringValue(e))
			}
			v = structpb.NewListValue(l)
		}
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{eppSubsetNS: {Fields: map[string]*structpb.Value{eppSubset: v}}}}
	}
	return m
}

// bodyChunks splits b into n chunks.
func bodyChunks(b []byte, n int) [][]byte {
	n = max(1, min(n, len(b)))
	var out [][]byte
	for i := range n {
		out = append(out, b[i*len(b)/n:(i+1)*len(b)/n])
	}
	return out
}

// send opens a stream and sends r's headers and body as Envoy does in r's
// mode, without waiting for the pick.
func (e *testEPP) send(t testing.TB, r envoyReq) *eppCall {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	st, err := e.client.Process(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &eppCall{t: t, stream: st, cancel: cancel, req: r}
	t.Cleanup(cancel)
	if err := st.Send(r.first()); err != nil {
		t.Fatal(err)
	}
	if r.reqMode == procmode.ProcessingMode_BUFFERED {
		return c // the body goes once the headers are answered (pick)
	}
	if len(r.body) > 0 {
		chunks := bodyChunks(r.body, r.chunks)
		for i, ch := range chunks {
			c.sendMsg(&extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_RequestBody{RequestBody: &extProcPb.HttpBody{Body: ch, EndOfStream: i == len(chunks)-1 && !r.trailers}}})
		}
	}
	if r.trailers {
		c.sendMsg(&extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_RequestTrailers{RequestTrailers: &extProcPb.HttpTrailers{}}})
	}
	return c
}

func (c *eppCall) sendMsg(m *extProcPb.ProcessingRequest) {
	c.t.Helper()
	if c.ended {
		return
	}
	if err := c.stream.Send(m); err != nil {
		// gRPC: Send returns io.EOF once the server has ended the stream,
		// whose answer Recv then returns (the picker refuses a request as
		// soon as its headers say so, before the body is sent).
		if errors.Is(err, io.EOF) {
			c.ended = true
			return
		}
		c.t.Fatalf("send: %v", err)
	}
}

func (c *eppCall) recv() *extProcPb.ProcessingResponse {
	c.t.Helper()
	r, err := c.stream.Recv()
	if err != nil {
		c.t.Fatalf("recv: %v", err)
	}
	return r
}

// open sends r and reads the picker's answer: an immediate response, or
// the pick with the body passed on.
func (e *testEPP) open(t testing.TB, r envoyReq) *eppCall {
	t.Helper()
	c := e.send(t, r)
	c.readPick()
	return c
}

// readPick reads the answers to the request's messages.
func (c *eppCall) readPick() {
	t, r := c.t, c.req
	t.Helper()
	take := func(resp *extProcPb.ProcessingResponse, common *extProcPb.CommonResponse) {
		for _, h := range common.GetHeaderMutation().GetSetHeaders() {
			switch h.GetHeader().GetKey() {
			case eppDestination:
				c.pick.endpoint = string(h.GetHeader().GetRawValue())
				if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
					t.Errorf("the destination header is appended (%v), not set", h.GetAppendAction())
				}
			case "content-length":
				c.pick.contentLength = string(h.GetHeader().GetRawValue())
			case eppPrefiller:
				c.pick.prefiller = string(h.GetHeader().GetRawValue())
			case "traceparent":
				c.pick.traceparent = string(h.GetHeader().GetRawValue())
			}
		}
		c.pick.removed = append(c.pick.removed, common.GetHeaderMutation().GetRemoveHeaders()...)
		c.pick.clearCache = c.pick.clearCache || common.GetClearRouteCache()
		if md := resp.GetDynamicMetadata(); md != nil {
			c.pick.meta = md.GetFields()[eppLB].GetStructValue().GetFields()[eppDestination].GetStringValue()
		}
	}
	if r.reqMode == procmode.ProcessingMode_BUFFERED {
		resp := c.recv()
		if ir := resp.GetImmediateResponse(); ir != nil {
			c.pick.immediate = ir
			return
		}
		if resp.GetRequestHeaders() == nil || resp.GetRequestHeaders().GetResponse().GetHeaderMutation() != nil {
			t.Fatalf("BUFFERED: headers answered with %v, want a plain continue", resp)
		}
		if len(r.body) == 0 {
			return
		}
		c.sendMsg(&extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_RequestBody{RequestBody: &extProcPb.HttpBody{Body: r.body, EndOfStream: true}}})
		resp = c.recv()
		if ir := resp.GetImmediateResponse(); ir != nil {
			c.pick.immediate = ir
			return
		}
		br := resp.GetRequestBody()
		if br == nil {
			t.Fatalf("BUFFERED: the body was answered with %v", resp)
		}
		take(resp, br.GetResponse())
		c.pick.body = r.body
		if b := br.GetResponse().GetBodyMutation().GetBody(); b != nil {
			c.pick.body = b
		}
		return
	}
	resp := c.recv()
	if ir := resp.GetImmediateResponse(); ir != nil {
		c.pick.immediate = ir
		return
	}
	hr := resp.GetRequestHeaders()
	if hr == nil {
		t.Fatalf("the first answer is %v, want the request headers'", resp)
	}
	take(resp, hr.GetResponse())
	if len(r.body) == 0 && !r.trailers {
		return
	}
	for {
		resp := c.recv()
		br := resp.GetRequestBody()
		if br == nil {
			if r.trailers && resp.GetRequestTrailers() != nil {
				return
			}
			t.Fatalf("a body answer is %v", resp)
		}
		sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			t.Fatalf("FULL_DUPLEX_STREAMED: the body came back as %v, want streamed_response", br)
		}
		c.pick.body = append(c.pick.body, sr.GetBody()...)
		if sr.GetEndOfStream() {
			if r.trailers {
				t.Fatal("the body ended though trailers follow")
			}
			return
		}
	}
}

// forward sends the request as Envoy would to the picked endpoint (its
// path, the body passed on) and returns the engine's response, read up to
// its headers.
func (c *eppCall) forward() *http.Response {
	c.t.Helper()
	if c.pick.endpoint == "" {
		c.t.Fatalf("no endpoint picked: %+v", c.pick)
	}
	method := c.req.method
	if method == "" {
		method = http.MethodPost
	}
	req, err := http.NewRequest(method, "http://"+c.pick.endpoint+c.req.path, bytes.NewReader(c.pick.body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp
}

// respond hands the engine's response headers to the picker (served:
// the served endpoint metadata, "" none) and reads its answer.
func (c *eppCall) respond(resp *http.Response, served string) {
	t := c.t
	t.Helper()
	hs := []*corev3.HeaderValue{hv(":status", strconv.Itoa(resp.StatusCode))}
	for k, vs := range resp.Header {
		hs = append(hs, hv(strings.ToLower(k), vs[0]))
	}
	m := &extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extProcPb.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}}}
	if served != "" {
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{eppLB: {Fields: map[string]*structpb.Value{eppServed: structpb.NewStringValue(served)}}}}
	}
	c.sendMsg(m)
	r := c.recv()
	rh := r.GetResponseHeaders()
	if rh == nil {
		t.Fatalf("the response headers were answered with %v", r)
	}
	c.respHeaders = map[string]string{}
	for _, h := range rh.GetResponse().GetHeaderMutation().GetSetHeaders() {
		c.respHeaders[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
}

// relayBody hands the engine's response body to the picker as it reads
// it, checks each chunk comes back unchanged, and returns the body.
func (c *eppCall) relayBody(resp *http.Response) []byte {
	t := c.t
	t.Helper()
	defer resp.Body.Close()
	duplex := c.req.respMode == 0 || c.req.respMode == procmode.ProcessingMode_FULL_DUPLEX_STREAMED
	var all []byte
	buf := make([]byte, 4<<10)
	for {
		n, err := resp.Body.Read(buf)
		if err != nil && err != io.EOF {
			t.Fatalf("the engine's body: %v", err)
		}
		chunk := append([]byte(nil), buf[:n]...)
		eos := err == io.EOF
		if n == 0 && !eos {
			continue
		}
		all = append(all, chunk...)
		c.sendMsg(&extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_ResponseBody{ResponseBody: &extProcPb.HttpBody{Body: chunk, EndOfStream: eos}}})
		r := c.recv()
		br := r.GetResponseBody()
		if br == nil {
			t.Fatalf("a response body chunk was answered with %v", r)
		}
		if duplex {
			sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil || !bytes.Equal(sr.GetBody(), chunk) || sr.GetEndOfStream() != eos {
				t.Fatalf("the chunk came back as %v, want it unchanged", br)
			}
		} else if br.GetResponse().GetBodyMutation() != nil {
			t.Fatalf("a %v body was mutated: %v", c.req.respMode, br)
		}
		if eos {
			return all
		}
	}
}

// finish ends the stream as Envoy does once the response is through, and
// waits for the picker to end it too.
func (c *eppCall) finish() {
	c.t.Helper()
	if err := c.stream.CloseSend(); err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.stream.Recv(); err != io.EOF {
		c.t.Fatalf("after the response: %v, want the stream's end", err)
	}
	c.cancel()
}

// serve forwards, responds and relays: one whole request through "Envoy".
func (c *eppCall) serve() []byte {
	c.t.Helper()
	resp := c.forward()
	c.respond(resp, "")
	b := c.relayBody(resp)
	c.finish()
	return b
}

// status is an immediate response's HTTP status.
func (p eppPick) status() int {
	if p.immediate == nil {
		return 0
	}
	return int(p.immediate.GetStatus().GetCode())
}

// header is an immediate response's header.
func (p eppPick) header(k string) string {
	for _, h := range p.immediate.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == strings.ToLower(k) {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}

// errorCode is an immediate response's OpenAI error code.
func (p eppPick) errorCode(t testing.TB) string {
	t.Helper()
	var e wireError
	if err := json.Unmarshal(p.immediate.GetBody(), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("immediate %d: the body is not an OpenAI error: %s (%v)", p.status(), p.immediate.GetBody(), err)
	}
	return e.Error.Code
}

func completionBody(model, prompt string, maxTokens int, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true, "stream": stream})
	return b
}

func chatBody(model, user, text string, maxTokens int, stream bool) []byte {
	m := map[string]any{"model": model, "messages": []map[string]string{{"role": "system", "content": "you are terse"}, {"role": "user", "content": text}},
		"max_tokens": maxTokens, "ignore_eos": true, "stream": stream}
	if user != "" {
		m["user"] = user
	}
	b, _ := json.Marshal(m)
	return b
}

// inFlight sums the core's in-flight and pending counters and the queue.
func coreLoad(s *Server) (inFlight, pending, queued, reserved int) {
	for _, m := range s.models {
		snap := m.snapshot()
		queued += snap.queued
		for _, r := range snap.reps {
			inFlight += r.st.Load.InFlight
			pending += r.st.Load.Pending
			reserved += r.st.ReservedBlocks
		}
	}
	return
}

func idle(s *Server) bool {
	in, p, q, r := coreLoad(s)
	return in == 0 && p == 0 && q == 0 && r == 0 && s.bodies.used.Load() == 0
}

// outcome is inferrail_requests_total{outcome} summed over models.
func outcome(s *Server, o string) float64 {
	return counterSum(s, "inferrail_requests_total", "outcome", o)
}

// counterSum is counter family name summed over the series whose label
// has value.
func counterSum(s *Server, name, label, value string) float64 {
	mfs, _ := s.met.reg.Gather()
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// replicaNamed maps an endpoint back to the replica name of c.
func replicaNamed(c *config.Config, ep string) string {
	for _, r := range c.Models[0].Replicas {
		if strings.TrimPrefix(r.URL, "http://") == ep {
			return r.Name
		}
	}
	return "?" + ep
}

// eppStep is one request of the comparison: its body and how it goes.
type eppStep struct {
	path   string
	body   []byte
	stream bool
	chunks int
	mode   procmode.ProcessingMode_BodySendMode
	header map[string]string
}

// For every policy, the picker picks what live's proxy picks for the same
// state: two gateways over two identical sets of engines, one served over
// HTTP as `inferrail live`, one over ext_proc as `inferrail epp` with a
// test client in Envoy's place forwarding to the picked endpoint, get the
// same requests (completions and chats, streamed and not, bodies in one
// chunk and in several, FULL_DUPLEX_STREAMED and BUFFERED, an alias, a
// tenant, a session, an embedding), in batches held in flight together, so load and the
// KV index both count. Request by request the replica is the same, and
// the picker's header, metadata and response headers agree.
func TestEPPPicksAsLive(t *testing.T) {
	slow := testEngineConfig()
	slow.Latency.StepFixedMs = 4
	engines := func() []*upstream {
		var ups []*upstream
		for range 3 {
			ups = append(ups, newUpstream(t, server.Config{Engine: slow, EnablePromptTokensDetails: true}))
		}
		return ups
	}
	liveUps, eppUps := engines(), engines()
	shared := words(100, 48)
	steps := [][]eppStep{
		{
			{path: "/v1/completions", body: completionBody("sim", shared+words(300, 20), 40, true), stream: true},
			{path: "/v1/completions", body: completionBody("", shared+words(400, 20), 40, true), stream: true, chunks: 3},
			{path: "/v1/chat/completions", body: chatBody(server.DefaultModelName, "alice", words(500, 40), 40, true), stream: true, mode: procmode.ProcessingMode_BUFFERED},
		},
		{{path: "/v1/completions", body: completionBody("", shared+words(600, 10), 4, false), chunks: 4}},
		{
			{path: "/v1/chat/completions", body: chatBody("sim", "alice", words(500, 40), 40, true), stream: true, chunks: 5},
			{path: "/v1/completions", body: completionBody("", words(700, 64), 40, true), stream: true, header: map[string]string{HeaderTenant: "team-b", HeaderPriority: "3"}},
			{path: "/v1/completions", body: completionBody("", shared+words(800, 16), 40, true), stream: true, mode: procmode.ProcessingMode_BUFFERED},
		},
		{{path: "/v1/chat/completions", body: chatBody("", "bob", words(900, 30), 4, false), mode: procmode.ProcessingMode_BUFFERED}},
		{{path: "/v1/embeddings", body: []byte(`{"model":"sim","input":"` + shared + words(1200, 8) + `"}`), chunks: 2}},
		{
			{path: "/v1/completions", body: completionBody("", words(700, 64)+words(1000, 8), 40, true), stream: true},
			{path: "/v1/chat/completions", body: chatBody("", "bob", words(900, 30), 40, true), stream: true, chunks: 2},
			{path: "/v1/completions", body: completionBody("", shared+words(1100, 8), 40, true), stream: true},
		},
	}
	for _, pol := range router.Names() {
		t.Run(pol, func(t *testing.T) {
			setup := func(ups []*upstream) *config.Config {
				c := eppConfig(t, ups...)
				c.Models[0].Policy = pol
				c.Seed = 7
				// One scrape each, before the requests: both see the
				// same engines at rest, then nothing changes it.
				c.Scrape.Interval, c.Scrape.Timeout, c.Scrape.MaxAge = time.Hour, time.Second, 2*time.Hour
				return c
			}
			lc, ec := setup(liveUps), setup(eppUps)
			g := startGateway(t, lc)
			e := startEPP(t, ec, Deps{}, eppOptions{})
			scraped := func(s *Server) bool {
				for _, r := range s.models[0].snapshot().reps {
					if r.st.ReportAge < 0 {
						return false
					}
				}
				return true
			}
			waitUntil(t, "one scrape of every engine", 10*time.Second, func() bool { return scraped(g.Server) && scraped(e.Server) })
			n := 0
			var picks []string
			for _, batch := range steps {
				type open struct {
					live *http.Response
					call *eppCall
					resp *http.Response
				}
				var opened []open
				for _, st := range batch {
					n++
					hdr := map[string]string{"Content-Type": "application/json"}
					for k, v := range st.header {
						hdr[k] = v
					}
					req, _ := http.NewRequest(http.MethodPost, g.base+st.path, bytes.NewReader(st.body))
					for k, v := range hdr {
						req.Header.Set(k, v)
					}
					lresp, err := g.client.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					if lresp.StatusCode != 200 {
						b, _ := io.ReadAll(lresp.Body)
						t.Fatalf("request %d: live answered %d %s", n, lresp.StatusCode, b)
					}
					call := e.open(t, envoyReq{path: st.path, body: st.body, chunks: st.chunks, reqMode: st.mode, header: st.header})
					if call.pick.immediate != nil {
						t.Fatalf("request %d: the picker answered %d %s", n, call.pick.status(), call.pick.immediate.GetBody())
					}
					liveRep := lresp.Header.Get(HeaderReplica)
					eppRep := replicaNamed(ec, call.pick.endpoint)
					picks = append(picks, eppRep)
					if liveRep != eppRep {
						t.Fatalf("request %d (%s): live picked %s, the picker %s (%s)", n, st.path, liveRep, eppRep, call.pick.endpoint)
					}
					if call.pick.meta != call.pick.endpoint || !call.pick.clearCache {
						t.Fatalf("request %d: header %q, metadata %q, clear_route_cache %v", n, call.pick.endpoint, call.pick.meta, call.pick.clearCache)
					}
					if bytes.Contains(st.body, []byte(`"sim"`)) {
						if !bytes.Contains(call.pick.body, []byte(`"model":"`+server.DefaultModelName+`"`)) || call.pick.contentLength != strconv.Itoa(len(call.pick.body)) {
							t.Fatalf("request %d: the alias was not rewritten: %s (content-length %q)", n, call.pick.body, call.pick.contentLength)
						}
					} else if !bytes.Equal(call.pick.body, st.body) || call.pick.contentLength != "" {
						t.Fatalf("request %d: the body was changed: %s", n, call.pick.body)
					}
					resp := call.forward()
					call.respond(resp, "")
					if call.respHeaders[strings.ToLower(HeaderReplica)] != liveRep || call.respHeaders[strings.ToLower(HeaderPredicted)] != lresp.Header.Get(HeaderPredicted) {
						t.Fatalf("request %d: response headers %v; live's replica %s, predicted %s", n, call.respHeaders, liveRep, lresp.Header.Get(HeaderPredicted))
					}
					if !st.stream {
						// Not streamed: the engine's answer is whole at
						// its first byte; end it before the next.
						io.Copy(io.Discard, lresp.Body)
						lresp.Body.Close()
						call.relayBody(resp)
						call.finish()
						continue
					}
					opened = append(opened, open{lresp, call, resp})
				}
				for _, o := range opened {
					lb, err := io.ReadAll(o.live.Body)
					o.live.Body.Close()
					if err != nil || !strings.HasSuffix(string(lb), "data: [DONE]\n\n") {
						t.Fatalf("live's stream: %v %q", err, lb)
					}
					if b := o.call.relayBody(o.resp); !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
						t.Fatalf("the engine's stream through the picker: %q", b)
					}
					o.call.finish()
				}
				waitUntil(t, "both gateways idle", 10*time.Second, func() bool { return idle(g.Server) && idle(e.Server) })
			}
			t.Logf("picks: %s", strings.Join(picks, " "))
			if got, want := outcome(e.Server, "ok"), outcome(g.Server, "ok"); got != want || got != float64(n) {
				t.Fatalf("ok outcomes: picker %v, live %v, want %d", got, want, n)
			}
		})
	}
}

// The subset hint (a list or a comma-joined string) confines the pick;
// an empty one, or one naming no replica, is a 503.
func TestEPPSubsetHint(t *testing.T) {
	ups := []*upstream{newUpstream(t, server.Config{Engine: testEngineConfig()}), newUpstream(t, server.Config{Engine: testEngineConfig()}), newUpstream(t, server.Config{Engine: testEngineConfig()})}
	c := eppConfig(t, ups...)
	c.Models[0].Policy = "round_robin"
	e := startEPP(t, c, Deps{}, eppOptions{})
	b, cc := hostOf(ups[1].url()), hostOf(ups[2].url())
	body := completionBody("", words(10, 20), 2, false)
	for i := range 6 {
		call := e.open(t, envoyReq{path: "/v1/completions", body: body, subset: []string{b}})
		if call.pick.endpoint != b {
			t.Fatalf("request %d: picked %q outside the subset [%s]", i, call.pick.endpoint, b)
		}
		call.serve()
	}
	seen := map[string]bool{}
	for range 6 {
		call := e.open(t, envoyReq{path: "/v1/completions", body: body, subset: b + ", " + cc, chunks: 2})
		if call.pick.endpoint != b && call.pick.endpoint != cc {
			t.Fatalf("picked %q outside the subset %s,%s", call.pick.endpoint, b, cc)
		}
		seen[call.pick.endpoint] = true
		call.serve()
	}
	if len(seen) != 2 {
		t.Fatalf("round robin over a subset of two reached %v", seen)
	}
	// An IP alone names every replica at that address (all three here).
	call := e.open(t, envoyReq{path: "/v1/completions", body: body, subset: []string{"127.0.0.1"}})
	if call.pick.endpoint == "" {
		t.Fatalf("an IP-only subset: %+v", call.pick)
	}
	call.serve()
	for name, subset := range map[string]any{"empty list": []string{}, "empty string": "", "unknown endpoints": []string{"10.9.9.9:8000", "127.0.0.1:1"}} {
		call := e.open(t, envoyReq{path: "/v1/completions", body: body, subset: subset})
		if call.pick.status() != 503 || call.pick.header("Retry-After") == "" || call.pick.errorCode(t) != "no_replica_available" {
			t.Fatalf("%s subset: %+v, want 503 no_replica_available with Retry-After", name, call.pick)
		}
	}
	waitUntil(t, "the picker idle", 5*time.Second, func() bool { return idle(e.Server) })
}

// Under overload the picker answers as live does, as immediate responses:
// 429 with Retry-After (queue full; no capacity with queueing off), 503
// with Retry-After (no healthy replica); a queued request is picked when
// the slot frees.
func TestEPPOverload(t *testing.T) {
	u := newUpstream(t, server.Config{Engine: slowEngine()})
	c := eppConfig(t, u)
	c.Models[0].MaxConcurrency = 1
	c.Models[0].Queue.MaxRequests = 1
	e := startEPP(t, c, Deps{}, eppOptions{})
	blocker := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(5000, 20), 30, true)})
	bresp := blocker.forward()
	blocker.respond(bresp, "")
	queued := e.send(t, envoyReq{path: "/v1/completions", body: completionBody("", words(10, 10), 2, false)})
	waitUntil(t, "one request queued", 5*time.Second, func() bool { _, _, q, _ := coreLoad(e.Server); return q == 1 })
	full := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(20, 10), 2, false), chunks: 2})
	if full.pick.status() != 429 || full.pick.header("Retry-After") == "" || full.pick.header(HeaderQueued) == "" || full.pick.errorCode(t) != "queue_full" {
		t.Fatalf("with the queue full: %d %v %s, want 429 queue_full with Retry-After", full.pick.status(), full.pick.immediate.GetHeaders(), full.pick.immediate.GetBody())
	}
	if ct := full.pick.header("Content-Type"); ct != "application/json" {
		t.Fatalf("content-type %q", ct)
	}
	blocker.relayBody(bresp)
	blocker.finish()
	queued.readPick()
	if queued.pick.endpoint != hostOf(u.url()) {
		t.Fatalf("the queued request: %+v", queued.pick)
	}
	queued.serve()
	waitUntil(t, "the picker idle", 5*time.Second, func() bool { return idle(e.Server) })

	// Queueing off: 429 no_capacity at once.
	c2 := eppConfig(t, u)
	c2.Models[0].MaxConcurrency = 1
	c2.Models[0].Queue.MaxRequests = 0
	e2 := startEPP(t, c2, Deps{}, eppOptions{})
	b2 := e2.open(t, envoyReq{path: "/v1/chat/completions", body: chatBody("", "", words(5000, 20), 30, true)})
	r2 := b2.forward()
	b2.respond(r2, "")
	nc := e2.open(t, envoyReq{path: "/v1/chat/completions", body: chatBody("", "", words(30, 10), 2, false), reqMode: procmode.ProcessingMode_BUFFERED})
	if nc.pick.status() != 429 || nc.pick.header("Retry-After") == "" || nc.pick.errorCode(t) != "no_capacity" {
		t.Fatalf("queueing off: %d %s, want 429 no_capacity", nc.pick.status(), nc.pick.immediate.GetBody())
	}
	b2.relayBody(r2)
	b2.finish()

	// No healthy replica: 503 at once.
	c3 := eppConfig(t, u)
	c3.Health.EjectAfter, c3.Health.MaxEjectedShare = 1, 1
	c3.Health.EjectTime, c3.Health.MaxEjectTime = 10*time.Second, 10*time.Second
	e3 := startEPP(t, c3, Deps{}, eppOptions{})
	u.kill()
	waitUntil(t, "the replica's ejection", 5*time.Second, func() bool { return !e3.models[0].healthy() })
	dead := e3.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1, 10), 2, true)})
	if dead.pick.status() != 503 || dead.pick.header("Retry-After") == "" || dead.pick.errorCode(t) != "no_replica_available" {
		t.Fatalf("no healthy replica: %d %s, want 503 no_replica_available", dead.pick.status(), dead.pick.immediate.GetBody())
	}
	if outcome(e3.Server, gatewayNoReplica) != 1 {
		t.Fatalf("the 503 was not counted")
	}
}

const gatewayNoReplica = "no_replica"

// The response path ends the request in the core with the engine's usage:
// in flight returns to 0 and the index learns the prompt on the replica
// that served it, so the same prefix is predicted cached there. When
// Envoy says another replica of ours served it, that one learns it; when
// the served endpoint is not ours, the request is let go.
func TestEPPResponseTeachesTheIndex(t *testing.T) {
	ups := []*upstream{newUpstream(t, server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true}), newUpstream(t, server.Config{Engine: testEngineConfig(), EnablePromptTokensDetails: true})}
	c := eppConfig(t, ups...)
	e := startEPP(t, c, Deps{}, eppOptions{})
	prompt := words(2000, 96)
	first := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", prompt, 8, true), chunks: 3})
	first.serve()
	waitUntil(t, "the first request's end", 5*time.Second, func() bool { return idle(e.Server) })
	second := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", prompt+words(3000, 8), 8, false), respMode: procmode.ProcessingMode_BUFFERED, reqMode: procmode.ProcessingMode_FULL_DUPLEX_STREAMED})
	if second.pick.endpoint != first.pick.endpoint {
		t.Fatalf("the same prefix went to %s, then %s", first.pick.endpoint, second.pick.endpoint)
	}
	resp := second.forward()
	second.respond(resp, "")
	if p := second.respHeaders[strings.ToLower(HeaderPredicted)]; p != "96" {
		t.Fatalf("predicted %q cached tokens on %s, want 96 (the prompt's 6 full blocks)", p, second.pick.endpoint)
	}
	second.relayBody(resp)
	second.finish()
	waitUntil(t, "idle", 5*time.Second, func() bool { return idle(e.Server) })

	// Envoy served a new prefix on the other replica than the pick: the
	// other one holds it now.
	fresh := words(4000, 96)
	moved := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", fresh, 8, true)})
	picked := moved.pick.endpoint
	other := hostOf(ups[0].url())
	if picked == other {
		other = hostOf(ups[1].url())
	}
	moved.pick.endpoint = other // Envoy's fallback
	resp = moved.forward()
	moved.respond(resp, other)
	if got := moved.respHeaders[strings.ToLower(HeaderReplica)]; got != replicaNamed(c, other) {
		t.Fatalf("served by %s: the response says %q", other, got)
	}
	in := map[string]int{}
	for _, r := range e.models[0].snapshot().reps {
		in[endpointOf(r.rep)] = r.st.Load.InFlight
	}
	if in[other] != 1 || in[picked] != 0 {
		t.Fatalf("in flight %v: want the request on %s, none on the pick %s", in, other, picked)
	}
	moved.relayBody(resp)
	moved.finish()
	waitUntil(t, "idle", 5*time.Second, func() bool { return idle(e.Server) })
	again := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", fresh+words(5000, 4), 2, false)})
	if again.pick.endpoint != other {
		t.Fatalf("the moved prefix: picked %s, want %s, which served it", again.pick.endpoint, other)
	}
	again.serve()
	if p := again.respHeaders[strings.ToLower(HeaderPredicted)]; p != "96" {
		t.Fatalf("the moved prefix: predicted %q cached tokens on %s, want 96", p, other)
	}

	// Served by an endpoint that is not ours: let go, nothing held.
	away := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(6000, 20), 2, false)})
	resp = away.forward()
	away.respond(resp, "10.1.2.3:8000")
	away.relayBody(resp)
	away.finish()
	waitUntil(t, "idle", 5*time.Second, func() bool { return idle(e.Server) })
	if outcome(e.Server, "served_elsewhere") != 1 {
		t.Fatal("a request served elsewhere was not counted so")
	}

	// response_body_mode NONE: the stream's end is the response's; the
	// index learns the prompt, the usage is unknown.
	ok := outcome(e.Server, "ok")
	blind := words(7000, 64)
	nb := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", blind, 2, false), noRespBody: true})
	resp = nb.forward()
	nb.respond(resp, "")
	io.Copy(io.Discard, resp.Body) // Envoy relays it without the picker
	resp.Body.Close()
	nb.finish()
	waitUntil(t, "idle", 5*time.Second, func() bool { return idle(e.Server) })
	if outcome(e.Server, "ok") != ok+1 {
		t.Fatal("a response not shown to the picker did not end as ok")
	}
	nb2 := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", blind+words(8000, 4), 2, false)})
	nb2.serve()
	if nb2.pick.endpoint != nb.pick.endpoint || nb2.respHeaders[strings.ToLower(HeaderPredicted)] != "64" {
		t.Fatalf("after a response not shown: %s then %s, predicted %q, want the same replica and 64", nb.pick.endpoint, nb2.pick.endpoint, nb2.respHeaders[strings.ToLower(HeaderPredicted)])
	}
}

// A stream that ends early, at any point, releases the request in the
// core: queued (the slot and the queue place), dispatched before the
// response, mid-response, and mid-body (the body's bytes).
func TestEPPStreamEndsEarly(t *testing.T) {
	u := newUpstream(t, server.Config{Engine: slowEngine()})
	c := eppConfig(t, u)
	c.Models[0].MaxConcurrency = 1
	e := startEPP(t, c, Deps{}, eppOptions{})
	long := func() []byte { return completionBody("", words(5000, 20), 30, true) }

	// Queued, then the client goes away (Envoy cancels the stream).
	blocker := e.open(t, envoyReq{path: "/v1/completions", body: long()})
	bresp := blocker.forward()
	blocker.respond(bresp, "")
	var waiting []*eppCall
	for i := range 3 {
		waiting = append(waiting, e.send(t, envoyReq{path: "/v1/completions", body: completionBody("", words(100+20*i, 10), 2, false)}))
	}
	waitUntil(t, "three requests queued", 5*time.Second, func() bool { _, _, q, _ := coreLoad(e.Server); return q == 3 })
	for _, w := range waiting {
		w.cancel()
	}
	waitUntil(t, "the queue to empty", 5*time.Second, func() bool { _, _, q, _ := coreLoad(e.Server); return q == 0 })
	blocker.relayBody(bresp)
	blocker.finish()
	waitUntil(t, "every slot released", 5*time.Second, func() bool { return idle(e.Server) })

	// Dispatched, then Envoy closes its side before any response.
	d := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(200, 10), 2, false)})
	waitUntil(t, "one in flight", 5*time.Second, func() bool { in, _, _, _ := coreLoad(e.Server); return in == 1 })
	if err := d.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the dispatch released", 5*time.Second, func() bool { return idle(e.Server) })

	// Mid-response: the client leaves after the first chunks.
	m := e.open(t, envoyReq{path: "/v1/completions", body: long()})
	resp := m.forward()
	m.respond(resp, "")
	buf := make([]byte, 64)
	n, _ := resp.Body.Read(buf)
	m.sendMsg(&extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_ResponseBody{ResponseBody: &extProcPb.HttpBody{Body: buf[:n]}}})
	m.recv()
	gone := outcome(e.Server, "client_gone")
	m.cancel()
	resp.Body.Close()
	waitUntil(t, "the stream's request released", 5*time.Second, func() bool { return idle(e.Server) })
	if outcome(e.Server, "client_gone") != gone+1 {
		t.Fatal("the client's leaving was not counted")
	}

	// Mid-body: the body's bytes are given back.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := e.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := envoyReq{path: "/v1/completions", body: long()}
	st.Send(r.first())
	st.Send(&extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_RequestBody{RequestBody: &extProcPb.HttpBody{Body: r.body[:10]}}})
	waitUntil(t, "the body's bytes held", 5*time.Second, func() bool { return e.bodies.used.Load() == 10 })
	cancel()
	waitUntil(t, "the body's bytes given back", 5*time.Second, func() bool { return idle(e.Server) })

	// And the slot is free: a new request is served at once.
	e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(900, 10), 2, false)}).serve()
	waitUntil(t, "idle", 5*time.Second, func() bool { return idle(e.Server) })
}

// Bodies are bounded: past max_body_bytes (announced, or as it arrives)
// a 413; past max_inflight_body_bytes a 503 with Retry-After; a body that
// does not arrive within read_timeout a 408. What is not a generation
// request is answered as live's client handler answers it.
func TestEPPBounds(t *testing.T) {
	u := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := eppConfig(t, u)
	c.MaxBodyBytes = 4 << 10
	c.MaxInflightBodyBytes = 6 << 10
	// Long enough that both stalled bodies below are held at once on a
	// loaded machine (at 200ms a fresh-clone run saw the first time out
	// before the second was counted).
	c.ReadTimeout = time.Second
	e := startEPP(t, c, Deps{}, eppOptions{})
	big := completionBody("", words(1, 2000), 2, false)
	if r := e.open(t, envoyReq{path: "/v1/completions", body: big}); r.pick.status() != 413 || r.pick.errorCode(t) != "body_too_large" {
		t.Fatalf("announced too large: %d", r.pick.status())
	}
	// Without a content-length: counted as it arrives.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := &extProcPb.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{hv(":method", "POST"), hv(":path", "/v1/completions")}}}
	stream := func(chunks ...[]byte) extProcPb.ExternalProcessor_ProcessClient {
		t.Helper()
		st, err := e.client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st.Send(&extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_RequestHeaders{RequestHeaders: h}})
		for _, ch := range chunks {
			st.Send(&extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_RequestBody{RequestBody: &extProcPb.HttpBody{Body: ch}}})
		}
		return st
	}
	immediate := func(st extProcPb.ExternalProcessor_ProcessClient) eppPick {
		t.Helper()
		r, err := st.Recv()
		if err != nil || r.GetImmediateResponse() == nil {
			t.Fatalf("%v %v, want an immediate response", r, err)
		}
		return eppPick{immediate: r.GetImmediateResponse()}
	}
	if p := immediate(stream(bodyChunks(big, 4)...)); p.status() != 413 || p.errorCode(t) != "body_too_large" {
		t.Fatalf("too large as it arrives: %d", p.status())
	}
	// Two bodies of 3 KiB that stall are held (6 KiB, the budget); a third
	// body's bytes are not taken: 503 with Retry-After.
	s1, s2 := stream(big[:3<<10]), stream(big[:3<<10])
	waitUntil(t, "6 KiB held", 5*time.Second, func() bool { return e.bodies.used.Load() == 6<<10 })
	if p := immediate(stream(big[:1<<10])); p.status() != 503 || p.header("Retry-After") != "1" || p.errorCode(t) != "body_budget" {
		t.Fatalf("over max_inflight_body_bytes: %d", p.status())
	}
	// The stalled ones: 408 after read_timeout, their bytes given back.
	for _, st := range []extProcPb.ExternalProcessor_ProcessClient{s1, s2} {
		if p := immediate(st); p.status() != 408 || p.errorCode(t) != "body_timeout" {
			t.Fatalf("a stalled body: %d, want 408", p.status())
		}
	}
	waitUntil(t, "the bodies given back", 5*time.Second, func() bool { return e.bodies.used.Load() == 0 })

	// Not a generation request: live's answers.
	for path, want := range map[string]int{"/v1/models": 200, "/nowhere": 404, "/livez": 200} {
		s, err := e.client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hs := &extProcPb.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{hv(":method", "GET"), hv(":path", path)}}, EndOfStream: true}
		s.Send(&extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_RequestHeaders{RequestHeaders: hs}})
		if p := immediate(s); p.status() != want {
			t.Fatalf("GET %s: %d, want %d", path, p.status(), want)
		} else if path == "/v1/models" && !bytes.Contains(p.immediate.GetBody(), []byte(server.DefaultModelName)) {
			t.Fatalf("/v1/models: %s", p.immediate.GetBody())
		}
	}
	// A priority header out of range: live's 400.
	bad := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1, 5), 2, false), header: map[string]string{HeaderPriority: "high"}})
	if bad.pick.status() != 400 || bad.pick.errorCode(t) != "invalid_priority" {
		t.Fatalf("a bad priority: %d", bad.pick.status())
	}
	// A body mode the picker cannot route with.
	sm := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1, 5), 2, false), reqMode: procmode.ProcessingMode_STREAMED})
	if sm.pick.status() != 500 || !strings.Contains(string(sm.pick.immediate.GetBody()), "FULL_DUPLEX_STREAMED") {
		t.Fatalf("STREAMED mode: %d %s", sm.pick.status(), sm.pick.immediate.GetBody())
	}
	// Trailers end a body too.
	tr := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1, 5), 2, false), trailers: true, chunks: 2})
	if tr.pick.endpoint == "" {
		t.Fatalf("a body ended by trailers: %+v", tr.pick)
	}
	tr.cancel()
	waitUntil(t, "idle", 5*time.Second, func() bool { return idle(e.Server) })
}

// gRPC health: liveness serves while the process does; readiness, the
// server and the ext_proc service while a replica has answered within
// health.ready_window, and not once draining begins.
func TestEPPHealth(t *testing.T) {
	u := newUpstream(t, server.Config{Engine: testEngineConfig()})
	u.kill()
	c := eppConfig(t, u)
	c.DrainDelay = 10 * time.Second
	c.Health.ReadyWindow = 300 * time.Millisecond
	e := startEPP(t, c, Deps{}, eppOptions{})
	check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := e.health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return r.GetStatus()
	}
	want := func(what string, svc string, st healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		waitUntil(t, fmt.Sprintf("%s: %s %v", what, svc, st), 5*time.Second, func() bool { return check(svc) == st })
	}
	serving, not := healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	extProc := extProcPb.ExternalProcessor_ServiceDesc.ServiceName
	want("no engine", "liveness", serving)
	for _, svc := range []string{"readiness", "", extProc} {
		want("no engine", svc, not)
	}
	u.restart()
	for _, svc := range []string{"readiness", "", extProc, "liveness"} {
		want("an engine up", svc, serving)
	}
	e.cancel() // SIGTERM: drain_delay of readiness failing first
	for _, svc := range []string{"readiness", "", extProc} {
		want("draining", svc, not)
	}
	want("draining", "liveness", serving)
	// Streams are still served while the delay runs.
	call := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1, 10), 2, false)})
	if call.pick.endpoint != hostOf(u.url()) {
		t.Fatalf("while draining: %+v", call.pick)
	}
	call.serve()
}

// ServeEPP over its configured listeners: the admin listener serves the
// metrics of what went through the picker, and the drain ends a stream
// still open (releasing it) once drain_timeout passes.
func TestEPPServeAndDrain(t *testing.T) {
	u := newUpstream(t, server.Config{Engine: slowEngine()})
	c := eppConfig(t, u)
	c.DrainTimeout = 300 * time.Millisecond
	s, err := New(c, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeEPP(ctx, nil) }()
	var addr, admin net.Addr
	waitUntil(t, "the listeners", 5*time.Second, func() bool { addr, admin = s.Addrs(); return addr != nil && admin != nil })
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	e := &testEPP{Server: s, client: extProcPb.NewExternalProcessorClient(conn)}
	e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1, 10), 2, false)}).serve()
	resp, err := http.Get("http://" + admin.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`inferrail_requests_total{model="` + server.DefaultModelName + `",outcome="ok"} 1`, "inferrail_decisions_total", "inferrail_time_to_first_byte_seconds", "inferrail_request_duration_seconds", "inferrail_queue_wait_seconds", "inferrail_tokenize_total", "inferrail_prompt_tokens_total"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// A stream left open: the drain cuts it after drain_timeout and the
	// request is released.
	open := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1, 10), 30, true)})
	r := open.forward()
	defer r.Body.Close()
	open.respond(r, "")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeEPP did not return")
	}
	if !idle(s) {
		t.Fatal("the cut stream's request is still held")
	}
	if _, err := open.stream.Recv(); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("the cut stream: %v, want an error", err)
	}
}

// Every wait is bounded: a request queued past queue.timeout is a 429
// queue_timeout, and one whose response outlasts request_timeout ends the
// stream with DEADLINE_EXCEEDED and is released in the core.
func TestEPPWaitsBounded(t *testing.T) {
	u := newUpstream(t, server.Config{Engine: slowEngine()})
	c := eppConfig(t, u)
	c.Models[0].MaxConcurrency = 1
	c.Models[0].Queue.Timeout = 100 * time.Millisecond
	c.RequestTimeout = 400 * time.Millisecond
	e := startEPP(t, c, Deps{}, eppOptions{})
	blocker := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(5000, 20), 30, true)})
	resp := blocker.forward()
	defer resp.Body.Close()
	blocker.respond(resp, "")
	began := time.Now()
	late := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(10, 10), 2, false)})
	if late.pick.status() != 429 || late.pick.errorCode(t) != "queue_timeout" || late.pick.header("Retry-After") == "" {
		t.Fatalf("queued past queue.timeout: %d", late.pick.status())
	}
	if took := time.Since(began); took < 100*time.Millisecond || took > 2*time.Second {
		t.Fatalf("the queue timeout came after %v", took)
	}
	// The blocker's response is never relayed: request_timeout ends it.
	if _, err := blocker.stream.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("past request_timeout: %v, want DEADLINE_EXCEEDED", err)
	}
	waitUntil(t, "the request released", 5*time.Second, func() bool { return idle(e.Server) })
	if outcome(e.Server, "timeout") != 1 {
		t.Fatal("the timeout was not counted")
	}
}

// P/D through the picker: when the core disaggregates a request, the pick
// names the decode replica and, in x-prefiller-host-port, the prefill
// replica, for llm-d's routing sidecar on the decode pod; the decode
// replica's first byte ends the prefill in the core (counted remote). A
// request the core does not disaggregate has a client's own
// x-prefiller-host-port removed.
func TestEPPPrefillForTheSidecar(t *testing.T) {
	pre := newUpstream(t, server.Config{Engine: testEngineConfig()})
	dec := newUpstream(t, server.Config{Engine: testEngineConfig()})
	c := eppConfig(t, pre, dec)
	c.Models[0].Replicas[0].Role, c.Models[0].Replicas[1].Role = "prefill", "decode"
	for _, decider := range []string{"always", "never"} {
		c.Models[0].PD.Decider = decider
		e := startEPP(t, c, Deps{}, eppOptions{})
		for i, mode := range []procmode.ProcessingMode_BodySendMode{procmode.ProcessingMode_FULL_DUPLEX_STREAMED, procmode.ProcessingMode_BUFFERED} {
			call := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(10+1000*i, 64), 4, true), reqMode: mode,
				header: map[string]string{eppPrefiller: "10.9.9.9:8000"}})
			if call.pick.endpoint != hostOf(dec.url()) {
				t.Fatalf("%s, mode %v: picked %q, want the decode replica %s", decider, mode, call.pick.endpoint, hostOf(dec.url()))
			}
			switch decider {
			case "always":
				if call.pick.prefiller != hostOf(pre.url()) {
					t.Fatalf("disaggregated, mode %v: x-prefiller-host-port %q, want the prefill replica %s", mode, call.pick.prefiller, hostOf(pre.url()))
				}
			case "never":
				if call.pick.prefiller != "" || !slices.Contains(call.pick.removed, eppPrefiller) {
					t.Fatalf("not disaggregated, mode %v: x-prefiller-host-port %q set, removed %v; the client's own must go", mode, call.pick.prefiller, call.pick.removed)
				}
			}
			call.serve()
		}
		waitUntil(t, "the picker idle", 5*time.Second, func() bool { return idle(e.Server) })
		want := map[string]float64{"always": 2, "never": 0}[decider]
		if got := pdOutcome(e.Server, "remote"); got != want {
			t.Fatalf("%s: %v requests counted prefilled remotely, want %v", decider, got, want)
		}
		e.stop()
	}
	// The decode replica fails (the sidecar's prefill or its own): the
	// request's prefill ends with it in the core, nothing held, nothing
	// counted remote.
	bad := newUpstream(t, server.Config{Engine: testEngineConfig(), Faults: server.Faults{ErrorRate: 1}})
	c = eppConfig(t, pre, bad)
	c.Models[0].Replicas[0].Role, c.Models[0].Replicas[1].Role = "prefill", "decode"
	c.Models[0].PD.Decider = "always"
	c.Retry.Attempts = 1
	e := startEPP(t, c, Deps{}, eppOptions{})
	call := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(5000, 64), 4, true)})
	if call.pick.prefiller != hostOf(pre.url()) {
		t.Fatalf("x-prefiller-host-port %q, want %s", call.pick.prefiller, hostOf(pre.url()))
	}
	call.serve()
	waitUntil(t, "the picker idle after a failed decode", 5*time.Second, func() bool { return idle(e.Server) })
	if got := pdOutcome(e.Server, "remote"); got != 0 {
		t.Fatalf("a failed decode counted %v remote prefills", got)
	}
}

// pdOutcome is inferrail_pd_requests_total{outcome} summed over models.
func pdOutcome(s *Server, o string) float64 {
	return counterSum(s, "inferrail_pd_requests_total", "outcome", o)
}

// epp.fallback_endpoints: the destination (header and metadata alike)
// lists the pick, then the least loaded other replicas the request may
// go to (within the subset hint); a fallback that serves is accounted the
// request.
func TestEPPFallbackEndpoints(t *testing.T) {
	ups := []*upstream{newUpstream(t, server.Config{Engine: testEngineConfig()}), newUpstream(t, server.Config{Engine: testEngineConfig()}), newUpstream(t, server.Config{Engine: testEngineConfig()})}
	c := eppConfig(t, ups...)
	c.EPP.FallbackEndpoints = 2
	e := startEPP(t, c, Deps{}, eppOptions{})
	body := completionBody("", words(10, 20), 2, false)
	call := e.open(t, envoyReq{path: "/v1/completions", body: body})
	eps := strings.Split(call.pick.endpoint, ",")
	if len(eps) != 3 || call.pick.meta != call.pick.endpoint || eps[0] == eps[1] || eps[1] == eps[2] || eps[0] == eps[2] {
		t.Fatalf("destination %q, metadata %q: want the pick and 2 other replicas", call.pick.endpoint, call.pick.meta)
	}
	call.pick.endpoint = eps[1] // the pick failed: Envoy's first fallback serves
	resp := call.forward()
	call.respond(resp, eps[1])
	if got := call.respHeaders[strings.ToLower(HeaderReplica)]; got != replicaNamed(c, eps[1]) {
		t.Fatalf("served by the fallback %s: the response says %q", eps[1], got)
	}
	call.relayBody(resp)
	call.finish()
	waitUntil(t, "idle", 5*time.Second, func() bool { return idle(e.Server) })
	if outcome(e.Server, "ok") != 1 {
		t.Fatalf("%v requests ok, want 1", outcome(e.Server, "ok"))
	}
	// Within the subset hint: the one other replica it names.
	b, cc := hostOf(ups[1].url()), hostOf(ups[2].url())
	sub := e.open(t, envoyReq{path: "/v1/completions", body: body, subset: []string{b, cc}})
	if eps := strings.Split(sub.pick.endpoint, ","); len(eps) != 2 || !slices.Contains(eps, b) || !slices.Contains(eps, cc) {
		t.Fatalf("subset %s,%s: destination %q", b, cc, sub.pick.endpoint)
	}
}
