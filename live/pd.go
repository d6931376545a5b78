package live

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/router/gateway"
)

// Disaggregated prefill/decode (P/D) on the wire, as vLLM's NixlConnector
// and its proxies speak it (vLLM's tests/v1/kv_connector/nixl_integration/
// toy_proxy_server.py, llm-d's pkg/sidecar/proxy/connector_nixlv2.go):
//
//   - the prefill request is the client's, with kv_transfer_params
//     {do_remote_decode: true, do_remote_prefill: false, remote_engine_id,
//     remote_block_ids, remote_host, remote_port: null}, max_tokens 1 (and
//     max_completion_tokens 1 when the client set it), stream false, no
//     stream_options, no min_tokens or min_completion_tokens (the prefill
//     side does not take them); it goes to the prefill replica, non-streaming,
//     within pd.prefill_timeout;
//   - its answer's kv_transfer_params (do_remote_prefill true, the remote
//     engine, blocks and side channel) tell the decode engine where to read
//     the prompt's KV;
//   - the decode request is the client's own (streaming or not, as it
//     asked) with those kv_transfer_params, relayed to the client as any
//     answer: streamed as it comes, never buffered, nothing waited for.
//
// A prefill that fails (no answer, a non-200 answer, an answer without
// kv_transfer_params, the timeout) ends in the core (PrefillFailed) and the
// client's request goes to the decode replica as an ordinary one, prefilled
// there. A client's own kv_transfer_params never reach an engine (parse
// drops them): they name hosts the engines would connect to.

// kvParamsKey is the body field of the P/D connector's parameters.
const kvParamsKey = "kv_transfer_params"

// prefillParams is the kv_transfer_params of a prefill request.
var prefillParams = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// maxPrefillAnswer bounds a prefill's answer (one token and the KV's
// parameters: a few KiB).
const maxPrefillAnswer = 4 << 20

// maxStripBytes bounds the non-streamed decode answers read whole to drop
// an echoed kv_transfer_params; a longer one is relayed as it is.
const maxStripBytes = 16 << 20

// walkTop calls fn for each key of the JSON object in body, with the
// offsets of the key's opening quote and of its value.
func walkTop(body []byte, fn func(key string, kStart, vStart, vEnd int)) error {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return errors.New("the body must be a JSON object")
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return checkEnd(body, i+1)
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return fmt.Errorf("invalid JSON body: expected a key at offset %d", i)
		}
		kStart := i
		kEnd, err := skipString(body, i)
		if err != nil {
			return err
		}
		key := string(body[i+1 : kEnd-1])
		if bytes.IndexByte(body[i:kEnd], '\\') >= 0 {
			if err := json.Unmarshal(body[i:kEnd], &key); err != nil {
				return fmt.Errorf("invalid JSON body: %w", err)
			}
		}
		i = skipSpace(body, kEnd)
		if i >= len(body) || body[i] != ':' {
			return fmt.Errorf("invalid JSON body: expected ':' at offset %d", i)
		}
		vStart := skipSpace(body, i+1)
		vEnd, err := skipValue(body, vStart, 0)
		if err != nil {
			return err
		}
		fn(key, kStart, vStart, vEnd)
		i = skipSpace(body, vEnd)
		if i < len(body) && body[i] == ',' {
			i = skipSpace(body, i+1)
			continue
		}
		if i < len(body) && body[i] == '}' {
			return checkEnd(body, i+1)
		}
		return fmt.Errorf("invalid JSON body: expected ',' or '}' at offset %d", i)
	}
}

// topField is a key and its JSON value.
type topField struct {
	key   string
	value []byte
}

// rewriteTop returns body without its top-level keys drop names (every
// occurrence) and with add appended, every other byte as it was.
func rewriteTop(body []byte, drop map[string]bool, add []topField) ([]byte, error) {
	out := make([]byte, 0, len(body)+256)
	out = append(out, '{')
	first := true
	err := walkTop(body, func(key string, kStart, _, vEnd int) {
		if drop[key] {
			return
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(out, body[kStart:vEnd]...)
	})
	if err != nil {
		return nil, err
	}
	for _, f := range add {
		if !first {
			out = append(out, ',')
		}
		first = false
		q, _ := json.Marshal(f.key)
		out = append(out, q...)
		out = append(out, ':')
		out = append(out, f.value...)
	}
	return append(out, '}'), nil
}

// hasTop reports whether body's top level has key.
func hasTop(body []byte, key string) bool {
	found := false
	walkTop(body, func(k string, _, _, _ int) { found = found || k == key })
	return found
}

// The keys a prefill request sets or drops.
var prefillDrop = map[string]bool{
	kvParamsKey: true, "stream": true, "stream_options": true, "max_tokens": true, "max_completion_tokens": true,
	"min_tokens": true, "min_completion_tokens": true,
}

// prefillBody is the prefill request of a client's body.
func prefillBody(body []byte) ([]byte, error) {
	one := []byte("1")
	add := []topField{{kvParamsKey, prefillParams}, {"stream", []byte("false")}, {"max_tokens", one}}
	if hasTop(body, "max_completion_tokens") {
		add = append(add, topField{"max_completion_tokens", one})
	}
	return rewriteTop(body, prefillDrop, add)
}

// decodeBody is the decode request of a client's body: the prefill's
// kv_transfer_params (a JSON object) added.
func decodeBody(body, params []byte) ([]byte, error) {
	return rewriteTop(body, map[string]bool{kvParamsKey: true}, []topField{{kvParamsKey, params}})
}

// withoutKVParams drops a client's kv_transfer_params from its body.
func withoutKVParams(body []byte) []byte {
	if !hasTop(body, kvParamsKey) {
		return body
	}
	out, err := rewriteTop(body, map[string]bool{kvParamsKey: true}, nil)
	if err != nil {
		return body // readFields accepted it: cannot happen
	}
	return out
}

// nullKVParams sets a non-null top-level kv_transfer_params of an answer to
// null (the field as vLLM writes it without P/D); ok is false when there
// was nothing to change.
func nullKVParams(body []byte) (out []byte, ok bool) {
	var at [2]int
	found := false
	err := walkTop(body, func(k string, _, vStart, vEnd int) {
		if k == kvParamsKey && !bytes.Equal(body[vStart:vEnd], []byte("null")) {
			at, found = [2]int{vStart, vEnd}, true
		}
	})
	if err != nil || !found {
		return body, false
	}
	out = make([]byte, 0, len(body))
	out = append(out, body[:at[0]]...)
	out = append(out, "null"...)
	return append(out, body[at[1]:]...), true
}

// prefillAnswer is what the proxy reads of a prefill's answer.
type prefillAnswer struct {
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	Choices          []struct {
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

// prefillFailure is why a remote prefill failed: its reason (for
// inferrail_upstream_errors_total, as prefill_<reason>) and whether the
// prefill replica is to blame.
type prefillFailure struct {
	reason string
	fault  bool
}

// stop says what ended a request during its prefill: "" (nothing: go on
// to the decode), "client_gone" or "timeout" (the request's deadline).
type prefillStop string

// prefill runs a's remote prefill (a.pre) and returns the body to send to
// its decode replica: the client's with the prefill's kv_transfer_params,
// or the client's own when the prefill failed (then ended in the core:
// the decode replica prefills). stop is set when the request itself ended
// (its client left or its deadline passed) and nothing more is to be sent.
func (s *Server) prefill(ctx context.Context, r *http.Request, in *inbound, a *attempt, reqID string, ar *accessRecord) ([]byte, prefillStop) {
	m, pre := in.m, a.pre
	ar.prefill = pre.name
	began := time.Now()
	params, fail := s.prefillTry(ctx, r, in, pre, reqID)
	s.met.prefillTime(m.name, time.Since(began))
	if fail == nil {
		body, err := decodeBody(in.body, params)
		if err == nil {
			m.prefillDone(a)
			s.met.pd(m.name, "remote")
			ar.pd = "remote"
			return body, ""
		}
		fail = &prefillFailure{reason: "bad_params", fault: true}
	}
	switch {
	case r.Context().Err() != nil:
		return nil, "client_gone" // the deferred abort ends the request
	case ctx.Err() != nil:
		return nil, "timeout"
	}
	m.prefillFailed(a, fail.fault)
	s.met.errorReason(m.name, "prefill_"+fail.reason)
	s.met.pd(m.name, "fallback")
	ar.pd = "fallback"
	s.log.Debug("prefill failed: prefilling on the decode replica", "model", m.name, "prefill_replica", pre.name, "replica", a.rep.name, "reason", fail.reason)
	return in.body, ""
}

// prefillTry sends the prefill request to pre and returns its answer's
// kv_transfer_params, or why it failed.
func (s *Server) prefillTry(ctx context.Context, r *http.Request, in *inbound, pre *replica, reqID string) (json.RawMessage, *prefillFailure) {
	pbody, err := prefillBody(in.body)
	if err != nil {
		return nil, &prefillFailure{reason: "bad_body"}
	}
	t := &try{rep: pre}
	pctx, cancel := context.WithTimeout(ctx, in.m.prefillTimeout())
	defer cancel()
	if s.tr != nil {
		pctx, t.span = s.tr.upstream(pctx, in, pre)
		if t.span != nil && t.span.IsRecording() {
			t.span.SetAttributes(attribute.String("inferrail.pd.stage", "prefill"))
		}
	}
	var failure string
	defer func() { endUpstream(t, failure) }()
	t.resp, t.reused, t.err = s.forward(pctx, pre, r, plainBody(pbody), reqID)
	if t.err != nil {
		timedOut := pctx.Err() != nil && ctx.Err() == nil
		t.timedOut = timedOut
		if timedOut {
			return nil, &prefillFailure{reason: "timeout", fault: true}
		}
		// A reused keep-alive connection the engine had just closed is
		// not the engine's fault.
		return nil, &prefillFailure{reason: errCause(t.err), fault: !t.reused}
	}
	resp := t.resp
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer+1))
	resp.Body.Close()
	switch {
	case err != nil && pctx.Err() != nil && ctx.Err() == nil:
		failure = "timeout"
		return nil, &prefillFailure{reason: "timeout", fault: true}
	case err != nil:
		failure = failBroken
		return nil, &prefillFailure{reason: errCause(err), fault: true}
	case resp.StatusCode != http.StatusOK:
		// A 4xx is the request's (the decode replica will say what is
		// wrong with it); a 5xx the replica's.
		return nil, &prefillFailure{reason: "upstream_" + strconv.Itoa(resp.StatusCode), fault: resp.StatusCode >= 500}
	case len(b) > maxPrefillAnswer:
		return nil, &prefillFailure{reason: "answer_too_large", fault: true}
	}
	var pa prefillAnswer
	if err := json.Unmarshal(b, &pa); err != nil {
		return nil, &prefillFailure{reason: "bad_answer", fault: true}
	}
	p := bytes.TrimSpace(pa.KVTransferParams)
	if len(p) == 0 || p[0] != '{' {
		// No KV to read. vLLM hands it over only when the prefill ran to
		// max_tokens: one that stopped at once is no engine's fault, an
		// engine without a KV connector (or of the wrong role) is.
		stopped := len(pa.Choices) > 0 && pa.Choices[0].FinishReason != nil && *pa.Choices[0].FinishReason == "stop"
		return nil, &prefillFailure{reason: "no_kv_transfer_params", fault: !stopped}
	}
	return json.RawMessage(p), nil
}

// stripKVParams reads a non-streamed decode answer whole (up to
// maxStripBytes) and nulls a kv_transfer_params the engine echoed, so the
// client sees an ordinary answer.
func stripKVParams(resp *http.Response) {
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "" && !bytes.HasPrefix([]byte(resp.Header.Get("Content-Type")), []byte("application/json")) {
		return
	}
	orig := resp.Body
	b, err := io.ReadAll(io.LimitReader(orig, maxStripBytes+1))
	if err != nil || len(b) > maxStripBytes {
		// Relay what came and what follows as it is.
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(b), &errReader{err}, orig), orig}
		return
	}
	if out, ok := nullKVParams(b); ok {
		b = out
		resp.ContentLength = int64(len(b))
		resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{bytes.NewReader(b), orig}
}

// errReader returns err (nil: EOF, so a MultiReader goes on).
type errReader struct{ err error }

func (e *errReader) Read([]byte) (int, error) {
	if e.err == nil {
		return 0, io.EOF
	}
	return 0, e.err
}

// pdTransfer prices KV transfers for the cost decider as the engines'
// profile does (its kv_bytes_per_token and pd_transfer).
func pdTransfer(p *gateway.PDConfig, ec engine.Config) {
	if ec.KVBytesPerToken > 0 {
		p.KVBytesPerToken = ec.KVBytesPerToken
	}
	p.Transfer = ec.PDTransfer
}
