package server

// Disaggregated prefill/decode (P/D) as vLLM's NixlConnector speaks it over
// HTTP (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
// NIXL connector version 2; vllm/config/kv_transfer.py;
// vllm/entrypoints/openai/completion/serving.py).
//
// A prefill request carries kv_transfer_params {do_remote_decode: true,
// do_remote_prefill: false, remote_*: null} and max_tokens 1. A producer
// (kv_producer, kv_both) runs it as any request; when it finishes
// length-capped (vLLM's condition) its non-streaming answer carries
// kv_transfer_params {do_remote_prefill: true, do_remote_decode: false,
// remote_block_ids, remote_engine_id, remote_request_id, remote_host,
// remote_port, tp_size}, and the producer holds the request's blocks for
// one remote read (until VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s).
//
// A decode request carries those parameters. A consumer (kv_consumer,
// kv_both) reads the blocks from the producer (NIXL's handshake and RDMA
// read; here one HTTP call to the producer's side channel, which the mock
// serves on its API port at POST /inferrail/kv_transfer/read), waits the KV
// transfer time its profile gives for the prompt's tokens it does not hold
// (engine.Config.TransferTime), then schedules the request with its prompt
// already computed: its first token comes after one step. Remote
// parameters that are malformed (a missing or mistyped field), name an
// engine the side channel does not answer for, or blocks it does not hold
// (expired, read already, another prompt's) fail the transfer: it is
// counted in vllm:nixl_num_failed_transfers_total and, with
// kv_load_failure_policy recompute (the mock's default), the request is
// prefilled locally (vLLM's recompute fallback); with fail it is answered
// 500.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
)

// The KV connector and roles the mock emulates (vLLM's names).
const (
	ConnectorNixl = "NixlConnector"

	RoleProducer = "kv_producer"
	RoleConsumer = "kv_consumer"
	RoleBoth     = "kv_both"

	// FailureRecompute prefills a request whose KV transfer failed on the
	// decode engine; FailureFail answers it with an error.
	FailureRecompute = "recompute"
	FailureFail      = "fail"
)

// SideChannelPath is where the mock serves its NIXL side channel: a decode
// engine POSTs {"remote_engine_id", "remote_request_id", "remote_block_ids"}
// there to read a finished prefill's blocks (vLLM does this over ZMQ and
// RDMA, not HTTP).
const SideChannelPath = "/inferrail/kv_transfer/read"

// Bounds of the producer's table of blocks held for a remote read.
const (
	// heldTimeout is how long a prefill's blocks wait for their read
	// (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT default).
	heldTimeout = 480 * time.Second
	// maxHeld bounds the reads waiting; the oldest is dropped past it.
	maxHeld = 1 << 16
	// defaultTransferTimeout bounds one transfer on the decode side.
	defaultTransferTimeout = 30 * time.Second
	// maxParamsBytes bounds a side-channel request body.
	maxParamsBytes = 4 << 20
)

// KVTransfer is vLLM's --kv-transfer-config as the mock takes it: the zero
// value is off (kv_transfer_params are ignored, as vLLM ignores them without
// a connector).
type KVTransfer struct {
	// Connector is "NixlConnector", or "" for none.
	Connector string
	// Role is kv_producer (prefills for remote decode), kv_consumer
	// (decodes remote prefills) or kv_both.
	Role string
	// EngineID identifies the engine in remote_engine_id (vLLM's
	// engine_id); default: a UUID drawn from the seed.
	EngineID string
	// LoadFailurePolicy is what a consumer does when a transfer fails:
	// "recompute" (the default here: prefill locally) or "fail" (answer
	// 500). vLLM's own default is "fail" in recent versions.
	LoadFailurePolicy string
	// SideChannelHost and SideChannelPort are the remote_host and
	// remote_port a producer's answers name (kv_ip and kv_port in the JSON;
	// vLLM's NIXL reads VLLM_NIXL_SIDE_CHANNEL_HOST/PORT instead). Default
	// "" and 0: the host and port the prefill request was addressed to (its
	// Host header), where the mock's side channel is.
	SideChannelHost string
	SideChannelPort int
	// Timeout bounds one transfer on a consumer: the side-channel read and
	// the modelled transfer time together; a transfer that would take
	// longer fails when it passes. Default 30s.
	Timeout time.Duration
}

// On reports whether a connector is configured.
func (k KVTransfer) On() bool { return k.Connector != "" }

func (k KVTransfer) produces() bool { return k.On() && (k.Role == RoleProducer || k.Role == RoleBoth) }
func (k KVTransfer) consumes() bool { return k.On() && (k.Role == RoleConsumer || k.Role == RoleBoth) }

// kvTransferJSON is vLLM's KVTransferConfig, field for field; the fields
// the mock does not model are accepted and ignored.
type kvTransferJSON struct {
	KVConnector           *string         `json:"kv_connector"`
	EngineID              *string         `json:"engine_id"`
	KVBufferDevice        *string         `json:"kv_buffer_device"`
	KVBufferSize          *float64        `json:"kv_buffer_size"`
	KVRole                *string         `json:"kv_role"`
	KVRank                *int            `json:"kv_rank"`
	KVParallelSize        *int            `json:"kv_parallel_size"`
	KVIP                  *string         `json:"kv_ip"`
	KVPort                *int            `json:"kv_port"`
	KVConnectorExtra      json.RawMessage `json:"kv_connector_extra_config"`
	KVConnectorModulePath *string         `json:"kv_connector_module_path"`
	EnablePermuteLocalKV  *bool           `json:"enable_permute_local_kv"`
	KVLoadFailurePolicy   *string         `json:"kv_load_failure_policy"`
}

// ParseKVTransferConfig reads vLLM's --kv-transfer-config JSON, such as
// {"kv_connector":"NixlConnector","kv_role":"kv_producer"}, and checks it:
// an error names what is wrong and what is allowed. An empty string is no
// connector.
func ParseKVTransferConfig(s string) (KVTransfer, error) {
	if strings.TrimSpace(s) == "" {
		return KVTransfer{}, nil
	}
	var j kvTransferJSON
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return KVTransfer{}, fmt.Errorf("invalid JSON: %w", err)
	}
	if dec.More() {
		return KVTransfer{}, errors.New("invalid JSON: more than one value")
	}
	var k KVTransfer
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	k.Connector, k.Role, k.EngineID = str(j.KVConnector), str(j.KVRole), str(j.EngineID)
	k.LoadFailurePolicy, k.SideChannelHost = str(j.KVLoadFailurePolicy), str(j.KVIP)
	if j.KVPort != nil {
		k.SideChannelPort = *j.KVPort
	}
	if j.KVConnector == nil {
		return KVTransfer{}, errors.New("kv_connector is required (the mock emulates NixlConnector)")
	}
	if err := k.validate(); err != nil {
		return KVTransfer{}, err
	}
	return k, nil
}

// validate reports every problem with k.
func (k KVTransfer) validate() error {
	var errs []error
	if !k.On() {
		if k.Role != "" || k.EngineID != "" || k.LoadFailurePolicy != "" {
			errs = append(errs, errors.New("kv_role, engine_id and kv_load_failure_policy need kv_connector"))
		}
		return errors.Join(errs...)
	}
	if k.Connector != ConnectorNixl {
		errs = append(errs, fmt.Errorf("unknown kv_connector %q: the mock engine emulates %s only", k.Connector, ConnectorNixl))
	}
	switch k.Role {
	case RoleProducer, RoleConsumer, RoleBoth:
	case "":
		errs = append(errs, fmt.Errorf("kv_role is required with kv_connector: one of %s, %s, %s", RoleProducer, RoleConsumer, RoleBoth))
	default:
		errs = append(errs, fmt.Errorf("unknown kv_role %q: want one of %s, %s, %s", k.Role, RoleProducer, RoleConsumer, RoleBoth))
	}
	switch k.LoadFailurePolicy {
	case "", FailureRecompute, FailureFail:
	default:
		errs = append(errs, fmt.Errorf("unknown kv_load_failure_policy %q: want %s or %s", k.LoadFailurePolicy, FailureRecompute, FailureFail))
	}
	if k.SideChannelPort < 0 || k.SideChannelPort > 65535 {
		errs = append(errs, fmt.Errorf("kv_port %d: must be within 1..65535 (0: the port the prefill request came to)", k.SideChannelPort))
	}
	if strings.ContainsAny(k.SideChannelHost, "/ \t\r\n") {
		errs = append(errs, fmt.Errorf("kv_ip %q: must be a host name or address", k.SideChannelHost))
	}
	if k.Timeout < 0 {
		errs = append(errs, fmt.Errorf("kv transfer timeout %v: must be positive (0: the default %v)", k.Timeout, defaultTransferTimeout))
	}
	return errors.Join(errs...)
}

func (k *KVTransfer) setDefaults(rng *rand.Rand) {
	if !k.On() {
		return
	}
	if k.EngineID == "" {
		// A version 4 UUID, as vLLM's uuid.uuid4(), from the seeded source.
		var b [16]byte
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		b[6] = b[6]&0x0f | 0x40
		b[8] = b[8]&0x3f | 0x80
		k.EngineID = fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	}
	if k.LoadFailurePolicy == "" {
		k.LoadFailurePolicy = FailureRecompute
	}
	if k.Timeout == 0 {
		k.Timeout = defaultTransferTimeout
	}
}

// kvParams are a request's kv_transfer_params as the NIXL connector reads
// them.
type kvParams struct {
	doRemoteDecode, doRemotePrefill bool
	engineID, requestID, host       string
	port                            int
	blockIDs                        []int
	// problem says why the remote fields of a do_remote_prefill request
	// cannot be used ("" when they can).
	problem string
}

// parseKVParams reads kv_transfer_params: null or absent is nil; anything
// but an object is a bad request (vLLM's dict[str, Any]).
func parseKVParams(raw json.RawMessage) (*kvParams, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, badRequest("kv_transfer_params", "kv_transfer_params must be an object")
	}
	p := &kvParams{}
	truth := func(k string) bool { return bytes.Equal(bytes.TrimSpace(m[k]), []byte("true")) }
	p.doRemoteDecode, p.doRemotePrefill = truth("do_remote_decode"), truth("do_remote_prefill")
	if !p.doRemotePrefill {
		return p, nil
	}
	var problems []string
	field := func(k string, dst any) {
		v, ok := m[k]
		switch {
		case !ok || bytes.Equal(bytes.TrimSpace(v), []byte("null")):
			problems = append(problems, k+" is missing")
		case json.Unmarshal(v, dst) != nil:
			problems = append(problems, k+" has the wrong type")
		}
	}
	// The fields add_new_req_to_recv reads (connector version 2).
	field("remote_engine_id", &p.engineID)
	field("remote_request_id", &p.requestID)
	field("remote_host", &p.host)
	field("remote_port", &p.port)
	field("remote_block_ids", &p.blockIDs)
	switch {
	case len(problems) > 0:
	case p.engineID == "" || p.requestID == "" || p.host == "":
		problems = append(problems, "remote_engine_id, remote_request_id and remote_host must be non-empty")
	case p.port < 1 || p.port > 65535:
		problems = append(problems, fmt.Sprintf("remote_port %d is not a port", p.port))
	case len(p.blockIDs) == 0:
		problems = append(problems, "remote_block_ids is empty")
	case slices.ContainsFunc(p.blockIDs, func(id int) bool { return id < 0 }):
		problems = append(problems, "remote_block_ids holds a negative id")
	}
	p.problem = strings.Join(problems, "; ")
	return p, nil
}

// kvParamsOut are the kv_transfer_params of a producer's answer, in the
// order vLLM's request_finished writes them.
type kvParamsOut struct {
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	RemoteBlockIDs  []int  `json:"remote_block_ids"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteRequestID string `json:"remote_request_id"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
	TPSize          int    `json:"tp_size"`
}

// held is a finished prefill's blocks waiting for their remote read.
type held struct {
	blockIDs []int
	tokens   int
	until    time.Time
}

// heldTable is a producer's prefills waiting for a decode engine to read
// them: bounded in count and time, each read once.
type heldTable struct {
	mu    sync.Mutex
	m     map[string]held
	order []string // insertion order, for expiry and the bound
}

func (t *heldTable) put(id string, h held, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]held{}
	}
	t.expire(now)
	for len(t.order) >= maxHeld {
		delete(t.m, t.order[0])
		t.order = t.order[1:]
	}
	t.m[id] = h
	t.order = append(t.order, id)
}

// take removes and returns the blocks held for id, when they are blockIDs:
// a read that names other blocks takes nothing (found reports whether id
// was held at all).
func (t *heldTable) take(id string, blockIDs []int, now time.Time) (h held, found, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(now)
	h, found = t.m[id]
	if !found || !slices.Equal(h.blockIDs, blockIDs) {
		return h, found, false
	}
	delete(t.m, id)
	return h, true, true
}

// expire drops the entries past their time (and the order's stale ids).
// Call it with mu held.
func (t *heldTable) expire(now time.Time) {
	n := 0
	for n < len(t.order) {
		h, ok := t.m[t.order[n]]
		if ok && now.Before(h.until) {
			break
		}
		if ok {
			delete(t.m, t.order[n])
		}
		n++
	}
	if n > 0 {
		t.order = append(t.order[:0], t.order[n:]...)
	}
}

// blockIDs are the block ids of a's prompt as the producer reports them:
// ceil(prompt/block_size) of them, a full block's derived from its hash
// (so a shared prefix has the same ids, as the prefix cache shares them), a
// last partial block's from the request.
func (s *Server) blockIDs(a *active) []int {
	bs := s.cfg.Engine.BlockSize
	n := (a.promptLen + bs - 1) / bs
	out := make([]int, n)
	nb := uint64(max(1, s.cfg.Engine.NumGPUBlocks))
	for i := range out {
		var h uint64
		if i < len(a.hashes) && (i+1)*bs <= a.promptLen {
			h = kvblock.Mix64(uint64(a.hashes[i].Lo) ^ uint64(a.hashes[i].Hi))
		} else {
			h = kvblock.Mix64(uint64(a.id)<<20 ^ uint64(i))
		}
		out[i] = int(h % nb)
	}
	return out
}

// produced registers a's finished prefill for a remote read and returns
// the kv_transfer_params of its answer. r is the prefill request (its Host
// names the side channel unless the configuration does).
func (s *Server) produced(r *http.Request, a *active, respID string) *kvParamsOut {
	k := s.cfg.KVTransfer
	host, port := k.SideChannelHost, k.SideChannelPort
	if host == "" || port == 0 {
		h, p := hostPort(r)
		if host == "" {
			host = h
		}
		if port == 0 {
			port = p
		}
	}
	out := &kvParamsOut{
		DoRemotePrefill: true, RemoteBlockIDs: s.blockIDs(a), RemoteEngineID: k.EngineID,
		RemoteRequestID: respID + "-" + strconv.FormatUint(uint64(a.id), 16),
		RemoteHost:      host, RemotePort: port, TPSize: 1,
	}
	s.held.put(out.RemoteRequestID, held{blockIDs: out.RemoteBlockIDs, tokens: a.promptLen, until: time.Now().Add(heldTimeout)}, time.Now())
	return out
}

// hostPort splits the host and port a request was addressed to.
func hostPort(r *http.Request) (string, int) {
	def := 80
	if r.TLS != nil {
		def = 443
	}
	h, p, err := net.SplitHostPort(r.Host)
	if err != nil {
		return strings.Trim(r.Host, "[]"), def
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		n = def
	}
	return h, n
}

// readRequest and readAnswer are the side channel's bodies.
type readRequest struct {
	EngineID  string `json:"remote_engine_id"`
	RequestID string `json:"remote_request_id"`
	BlockIDs  []int  `json:"remote_block_ids"`
}

type readAnswer struct {
	EngineID  string `json:"engine_id"`
	BlockSize int    `json:"block_size"`
	NumBlocks int    `json:"num_blocks"`
	Tokens    int    `json:"num_tokens"`
}

// handleRead serves the side channel: a consumer reads the blocks of one
// finished prefill, once.
func (s *Server) handleRead(w http.ResponseWriter, r *http.Request) {
	k := s.cfg.KVTransfer
	if !k.produces() {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "this engine does not produce KV for remote decode"})
		return
	}
	var req readRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxParamsBytes))
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"detail": "invalid read request"})
		return
	}
	if req.EngineID != k.EngineID {
		writeJSON(w, http.StatusConflict, map[string]string{"detail": fmt.Sprintf("remote engine id mismatch: this engine is %s", k.EngineID)})
		return
	}
	h, found, ok := s.held.take(req.RequestID, req.BlockIDs, time.Now())
	switch {
	case !found:
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "no blocks held for that request (expired, read already, or unknown)"})
		return
	case !ok:
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "the blocks asked for are not the request's"})
		return
	}
	writeJSON(w, http.StatusOK, readAnswer{EngineID: k.EngineID, BlockSize: s.cfg.Engine.BlockSize, NumBlocks: s.cfg.Engine.NumGPUBlocks, Tokens: h.tokens})
}

// errTransfer is a failed KV transfer (the cause is wrapped).
var errTransfer = errors.New("kv transfer failed")

// transfer reads a's prompt KV from the producer p names and waits its
// transfer time; cached is what the engine holds of the prompt already. It
// returns nil when the KV arrived, ctx's error when the request ended
// first, or an error wrapping errTransfer. Everything is bounded by
// KVTransfer.Timeout.
func (s *Server) transfer(ctx context.Context, p *kvParams, a *active, cached int) error {
	if p.problem != "" {
		return fmt.Errorf("%w: invalid kv_transfer_params: %s", errTransfer, p.problem)
	}
	bs := s.cfg.Engine.BlockSize
	if want := (a.promptLen + bs - 1) / bs; len(p.blockIDs) != want {
		return fmt.Errorf("%w: %d remote blocks for a prompt of %d blocks", errTransfer, len(p.blockIDs), want)
	}
	began := time.Now()
	tctx, cancel := context.WithTimeout(ctx, s.cfg.KVTransfer.Timeout)
	defer cancel()
	body, _ := json.Marshal(readRequest{EngineID: p.engineID, RequestID: p.requestID, BlockIDs: p.blockIDs})
	u := "http://" + net.JoinHostPort(p.host, strconv.Itoa(p.port)) + SideChannelPath
	req, err := http.NewRequestWithContext(tctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %v", errTransfer, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.xfer.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: side channel %s: %v", errTransfer, net.JoinHostPort(p.host, strconv.Itoa(p.port)), err)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: side channel: %v", errTransfer, err)
	}
	if resp.StatusCode != http.StatusOK {
		var d struct {
			Detail string `json:"detail"`
		}
		json.Unmarshal(b, &d)
		return fmt.Errorf("%w: side channel answered %d: %s", errTransfer, resp.StatusCode, d.Detail)
	}
	var ra readAnswer
	if err := json.Unmarshal(b, &ra); err != nil || ra.EngineID != p.engineID {
		return fmt.Errorf("%w: side channel answered for another engine", errTransfer)
	}
	if ra.BlockSize != bs {
		return fmt.Errorf("%w: remote block size %d, local %d (heterogeneous block sizes are not emulated)", errTransfer, ra.BlockSize, bs)
	}
	// The blocks move: the prompt's tokens this engine does not hold.
	wait := transferTime(s.cfg.Engine, max(0, a.promptLen-cached)) - time.Since(began)
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-tctx.Done():
			t.Stop()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: the transfer did not end within %v", errTransfer, s.cfg.KVTransfer.Timeout)
		}
	}
	s.met.transferred(time.Since(began), a.promptLen-cached, s.cfg.Engine)
	return nil
}

// cachedTokens asks the engine goroutine how many leading prompt tokens of
// a its prefix cache holds (0 once the engine has stopped).
func (s *Server) cachedTokens(a *active) int {
	n := make(chan int, 1)
	if !s.send(command{kind: cmdCached, req: a, n: n}) {
		return 0
	}
	select {
	case v := <-n:
		return v
	case <-s.done:
		return 0
	}
}

// transferTime is the modelled KV transfer time of tokens to an engine of
// profile c (engine.Config.TransferTime: pd_transfer's base latency, then
// the bytes at its bandwidth).
func transferTime(c engine.Config, tokens int) time.Duration { return c.TransferTime(tokens) }

// kvBytes is the size of tokens' KV in c's profile; false when unknown.
func kvBytes(c engine.Config, tokens int) (float64, bool) {
	return c.KVBytes(tokens), c.KVBytesPerToken > 0
}
