package respcache

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"strconv"
)

// The paths the cache serves.
const (
	PathCompletions     = "/v1/completions"
	PathChatCompletions = "/v1/chat/completions"
)

// Request is what Lookup needs of one generation request.
type Request struct {
	// Path is the request's URL path: PathCompletions or
	// PathChatCompletions (anything else is bypassed).
	Path string
	// Body is the request body as the client sent it (or with its model
	// rewritten: the body's model field is not part of the key, Model is).
	Body []byte
	// Model is the resolved engine model (after aliases): the one the
	// engines serve, LoRA adapter included when it is one.
	Model string
	// KeyID is the authenticated API key's public id, "" without auth.
	KeyID string
	// Header is the client's request headers; Config.TenantHeader is read
	// from them.
	Header http.Header
}

// Key identifies an entry: SHA-256 over the key material (see keyOf).
type Key [32]byte

// String returns the key in hex.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// Kind is the kind of answer an entry holds.
type Kind uint8

// The kinds of answer.
const (
	// KindJSON is a non-streamed answer: one JSON body.
	KindJSON Kind = 1
	// KindSSE is a streamed answer: server-sent events up to data: [DONE].
	KindSSE Kind = 2
)

func (k Kind) String() string {
	switch k {
	case KindJSON:
		return "json"
	case KindSSE:
		return "sse"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Bypass reasons: why a request is not cacheable (Result.Reason, and the
// reason label of inferrail_response_cache_bypass_total).
const (
	ReasonDisabled     = "disabled"      // the cache is off
	ReasonPath         = "path"          // not a completions or chat completions request
	ReasonNoModel      = "no_model"      // Request.Model is empty
	ReasonNoTenant     = "no_tenant"     // neither an API key nor the tenant header
	ReasonTenantHeader = "tenant_header" // the tenant header is repeated
	ReasonInvalidBody  = "invalid_body"  // not one JSON object, or see the canonicaliser's errors
	ReasonTemperature  = "temperature"   // above max_temperature (absent counts as 1), or not a number
	ReasonN            = "n"             // n is not 1
	ReasonBestOf       = "best_of"       // best_of is not 1
	ReasonTopP         = "top_p"         // nucleus sampling (top_p < 1) with temperature > 0
	ReasonTopK         = "top_k"         // vLLM's top_k sampling with temperature > 0
	ReasonMinP         = "min_p"         // vLLM's min_p sampling with temperature > 0
	ReasonStream       = "stream"        // stream is not a boolean, or stream_options not an object
)

// keyMagic starts the key material; a change of the key's layout changes
// it, so that old entries are never read under a new meaning.
const keyMagic = "inferrail/respcache/key/1\x00"

// Canonical literals of the values the rules look at.
var (
	litNull  = []byte("null")
	litTrue  = []byte("true")
	litFalse = []byte("false")
	litZero  = []byte("0")
	litOne   = []byte("1e0")
	litMinus = []byte("-1e0")
)

// skipTop names the body's members that are not part of its canonical
// JSON in the key: the model (Request.Model is), cache_salt (a field of
// its own), stream and stream_options (the answer's kind is).
func skipTop(key []byte) bool {
	switch string(key) {
	case `"model"`, `"stream"`, `"stream_options"`, `"cache_salt"`:
		return true
	}
	return false
}

// rules are the determinism rules' parameters.
type rules struct {
	maxTemperature float64
	tenantHeader   string // canonical header key, "" for none
}

// keyOf decides whether req is cacheable and computes its key and kind; a
// request that is not cacheable gets the reason. The key is SHA-256 over
//
//	keyMagic, then each as a 4-byte big-endian length and its bytes:
//	path, resolved model, API key id, tenant header value, the canonical
//	cache_salt (empty when absent or null); then the kind byte (1 JSON,
//	2 SSE), the canonical stream_options of a streamed request (empty
//	otherwise) and last the canonical JSON of the body without model,
//	stream, stream_options and cache_salt.
func (c *canonicalizer) keyOf(req *Request, r *rules) (Key, Kind, string) {
	if req.Path != PathCompletions && req.Path != PathChatCompletions {
		return Key{}, 0, ReasonPath
	}
	if req.Model == "" {
		return Key{}, 0, ReasonNoModel
	}
	var hdr string
	if r.tenantHeader != "" {
		vs := req.Header[r.tenantHeader]
		if len(vs) > 1 {
			return Key{}, 0, ReasonTenantHeader
		}
		if len(vs) == 1 {
			hdr = vs[0]
		}
	}
	if req.KeyID == "" && hdr == "" {
		return Key{}, 0, ReasonNoTenant
	}
	root, err := c.parse(req.Body)
	if err != nil || c.nodes[root].kind != nodeObject {
		return Key{}, 0, ReasonInvalidBody
	}
	temp, n, bestOf, topP, topK, minP, stream, streamOpts, salt := int32(-1), int32(-1), int32(-1), int32(-1), int32(-1), int32(-1), int32(-1), int32(-1), int32(-1)
	for ch := c.nodes[root].first; ch >= 0; ch = c.nodes[ch].next {
		switch string(c.key(ch)) {
		case `"temperature"`:
			temp = ch
		case `"n"`:
			n = ch
		case `"best_of"`:
			bestOf = ch
		case `"top_p"`:
			topP = ch
		case `"top_k"`:
			topK = ch
		case `"min_p"`:
			minP = ch
		case `"stream"`:
			stream = ch
		case `"stream_options"`:
			streamOpts = ch
		case `"cache_salt"`:
			salt = ch
		}
	}

	t := 1.0 // OpenAI's default
	if v := c.scalar(temp); v != nil && !eq(v, litNull) {
		f, ok := number(v)
		if !ok {
			return Key{}, 0, ReasonTemperature
		}
		t = f
	}
	if t < 0 || t != 0 && t > r.maxTemperature {
		return Key{}, 0, ReasonTemperature
	}
	if !c.absentOr(n, litOne) {
		return Key{}, 0, ReasonN
	}
	if !c.absentOr(bestOf, litOne) {
		return Key{}, 0, ReasonBestOf
	}
	if t > 0 {
		if v := c.scalar(topP); topP >= 0 && !eq(v, litNull) {
			if f, ok := number(v); !ok || f < 1 {
				return Key{}, 0, ReasonTopP
			}
		}
		if !c.absentOr(topK, litZero) && !c.absentOr(topK, litMinus) {
			return Key{}, 0, ReasonTopK
		}
		if !c.absentOr(minP, litZero) {
			return Key{}, 0, ReasonMinP
		}
	}
	kind := KindJSON
	switch v := c.scalar(stream); {
	case stream < 0, eq(v, litNull), eq(v, litFalse):
	case eq(v, litTrue):
		kind = KindSSE
	default:
		return Key{}, 0, ReasonStream
	}
	if kind == KindSSE && streamOpts >= 0 && c.nodes[streamOpts].kind != nodeObject && !eq(c.scalar(streamOpts), litNull) {
		return Key{}, 0, ReasonStream
	}

	out := append(c.out[:0], keyMagic...)
	out = appendField(out, req.Path)
	out = appendField(out, req.Model)
	out = appendField(out, req.KeyID)
	out = appendField(out, hdr)
	c.out = out
	if err := c.emitField(salt); err != nil {
		return Key{}, 0, ReasonInvalidBody
	}
	c.out = append(c.out, byte(kind))
	so := int32(-1)
	if kind == KindSSE {
		so = streamOpts
	}
	if err := c.emitField(so); err != nil {
		return Key{}, 0, ReasonInvalidBody
	}
	if err := c.emitObject(root, 0, skipTop); err != nil {
		return Key{}, 0, ReasonInvalidBody
	}
	return sha256.Sum256(c.out), kind, ""
}

// appendField appends s with its 4-byte length.
func appendField(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(s)))
	return append(dst, s...)
}

// emitField appends node n's canonical JSON with its 4-byte length; an
// absent (-1) or null node is empty.
func (c *canonicalizer) emitField(n int32) error {
	at := len(c.out)
	c.out = append(c.out, 0, 0, 0, 0)
	if n < 0 || eq(c.scalar(n), litNull) {
		return nil
	}
	if err := c.emit(n, 1); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(c.out[at:], uint32(len(c.out)-at-4))
	return nil
}

// scalar returns node n's canonical text when it is a scalar, else nil.
func (c *canonicalizer) scalar(n int32) []byte {
	if n < 0 || c.nodes[n].kind != nodeScalar {
		return nil
	}
	nd := &c.nodes[n]
	return c.arena[nd.lo:nd.hi]
}

// absentOr reports whether node n is absent, null or the canonical want.
func (c *canonicalizer) absentOr(n int32, want []byte) bool {
	if n < 0 {
		return true
	}
	v := c.scalar(n)
	return eq(v, litNull) || eq(v, want)
}

func eq(a, b []byte) bool { return a != nil && string(a) == string(b) }

// number reads a canonical number ([-]DIGITSeEXP or 0).
func number(v []byte) (float64, bool) {
	if len(v) == 0 || !(v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
		return 0, false
	}
	if eq(v, litZero) {
		return 0, true
	}
	// An overflow reads as ±Inf (above every bound), an underflow as 0,
	// as the engine's own float parsing reads it.
	f, _ := strconv.ParseFloat(string(v), 64)
	return f, true
}
