package live

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// fields are what the proxy reads of a request body; everything else passes
// through untouched, for the engine to validate.
type fields struct {
	Model  *string
	Prompt json.RawMessage
	// Input is an embeddings or a Responses API request's input;
	// Instructions the latter's instructions.
	Input        json.RawMessage
	Instructions json.RawMessage
	// PreviousResponseID is a Responses API request's
	// previous_response_id: the stored response it continues.
	PreviousResponseID *string
	// NoStore: a Responses API request's store is false (vLLM stores a
	// response unless it is, when the engine keeps any).
	NoStore bool
	// Background: a Responses API request's background is true (vLLM
	// answers it "queued" and generates it after: bgwatch.go).
	Background bool
	// MaxOutputTokens is a Responses API request's max_output_tokens, read
	// as max_tokens is.
	MaxOutputTokens int
	CacheSalt       *string
	User            *string
	// MaxTokens and MaxCompletionTokens are the values of max_tokens and
	// max_completion_tokens when they are non-negative integers; 0
	// otherwise (absent, null, or a value left for the engine to refuse).
	MaxTokens, MaxCompletionTokens int
	// N is the value of n (the choices to sample) when it is a
	// non-negative integer; 0 otherwise, as MaxTokens.
	N int
	// Stream is the body's stream field when it is true.
	Stream bool
	// StreamOptions: the body has a stream_options key (streamusage.go
	// asks for a stream's usage only without one).
	StreamOptions bool
	// KVParams: the body has a kv_transfer_params key (pd.go drops it).
	KVParams bool
	// modelStart and modelEnd locate the model value in the body.
	modelStart, modelEnd int
}

// readFields walks the top level of the JSON object in body and decodes only
// the values of the keys the proxy uses. It checks the object's structure as
// far as it walks (the engine checks the rest) and is several times faster
// than decoding the whole body.
func readFields(body []byte) (fields, error) {
	var f fields
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return f, errors.New("the body must be a JSON object")
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return f, checkEnd(body, i+1)
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return f, fmt.Errorf("invalid JSON body: expected a key at offset %d", i)
		}
		kEnd, err := skipString(body, i)
		if err != nil {
			return f, err
		}
		key := body[i+1 : kEnd-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var k string
			if err := json.Unmarshal(body[i:kEnd], &k); err != nil {
				return f, fmt.Errorf("invalid JSON body: %v", err)
			}
			key = []byte(k)
		}
		i = skipSpace(body, kEnd)
		if i >= len(body) || body[i] != ':' {
			return f, fmt.Errorf("invalid JSON body: expected ':' at offset %d", i)
		}
		vStart := skipSpace(body, i+1)
		vEnd, err := skipValue(body, vStart, 0)
		if err != nil {
			return f, err
		}
		if err := f.set(key, body[vStart:vEnd], vStart, vEnd); err != nil {
			return f, err
		}
		i = skipSpace(body, vEnd)
		if i < len(body) && body[i] == ',' {
			i = skipSpace(body, i+1)
			continue
		}
		if i < len(body) && body[i] == '}' {
			return f, checkEnd(body, i+1)
		}
		return f, fmt.Errorf("invalid JSON body: expected ',' or '}' at offset %d", i)
	}
}

// set keeps raw when key is one the proxy reads. key stays bytes: a switch
// on its string conversion does not allocate, a string argument would (once
// per key of every body).
func (f *fields) set(key, raw []byte, start, end int) error {
	str := func(dst **string) error {
		if bytes.Equal(raw, []byte("null")) {
			*dst = nil
			return nil
		}
		var s string
		if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' && plain(raw[1:len(raw)-1]) {
			s = string(raw[1 : len(raw)-1]) // no escapes: its bytes are its value
		} else if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("field %q: must be a string", key)
		}
		*dst = &s
		return nil
	}
	switch string(key) {
	case "model":
		f.modelStart, f.modelEnd = start, end
		return str(&f.Model)
	case "prompt":
		f.Prompt = raw
	case "input":
		f.Input = raw
	case "instructions":
		f.Instructions = raw
	case "previous_response_id":
		return str(&f.PreviousResponseID)
	case "store":
		f.NoStore = bytes.Equal(raw, []byte("false"))
	case "background":
		f.Background = bytes.Equal(raw, []byte("true"))
	case "max_output_tokens":
		f.MaxOutputTokens = count(raw)
	case "cache_salt":
		return str(&f.CacheSalt)
	case "user":
		return str(&f.User)
	case "max_tokens":
		f.MaxTokens = count(raw)
	case "max_completion_tokens":
		f.MaxCompletionTokens = count(raw)
	case "n":
		f.N = count(raw)
	case "stream":
		f.Stream = bytes.Equal(raw, []byte("true"))
	case "stream_options":
		f.StreamOptions = true
	case kvParamsKey:
		f.KVParams = true
	}
	return nil
}

// maxCount bounds the counts read from a body, far above any context length.
const maxCount = 1 << 30

// count reads a JSON integer from 0 to maxCount, also written as a number
// with no fraction (100.0, 1e3) or as a string ("16"): vLLM's validation
// (pydantic's lax mode) takes those as integers too; anything else is 0.
func count(raw []byte) int {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		raw = raw[1 : len(raw)-1]
	}
	n, err := strconv.Atoi(string(raw))
	if err != nil {
		x, ferr := strconv.ParseFloat(string(raw), 64)
		if ferr != nil || x != math.Trunc(x) || x < 0 || x > maxCount || !number(raw) {
			return 0
		}
		n = int(x)
	}
	if n < 0 || n > maxCount {
		return 0
	}
	return n
}

// number reports whether raw is a JSON number (ParseFloat also takes
// "Inf", "0x10", "1_0").
func number(raw []byte) bool {
	for _, c := range raw {
		if !(c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
			return false
		}
	}
	return len(raw) > 0
}

// maxTokens is the request's output bound as the engine reads it for op:
// for chat, max_completion_tokens when set, else max_tokens (vLLM's rule);
// for the Responses API max_output_tokens; 0 when none is.
func (f *fields) maxTokens(op opKind) int {
	switch {
	case op == opResponses:
		return f.MaxOutputTokens
	case op == opChat && f.MaxCompletionTokens > 0:
		return f.MaxCompletionTokens
	}
	return f.MaxTokens
}

func checkEnd(body []byte, i int) error {
	if i = skipSpace(body, i); i != len(body) {
		return fmt.Errorf("invalid JSON body: data after the object at offset %d", i)
	}
	return nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the offset just past the string starting at b[i].
func skipString(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, errors.New("invalid JSON body: unterminated string")
}

// skipValue returns the offset just past the JSON value starting at b[i].
// It checks the value's structure without recursion, so any depth the
// engine accepts passes (the open containers are a stack of bits, one per
// level).
func skipValue(b []byte, i, _ int) (int, error) {
	var stack []uint64 // bit set: the container at that depth is an object
	depth := 0
	push := func(obj bool) {
		if depth/64 >= len(stack) {
			stack = append(stack, 0)
		}
		if obj {
			stack[depth/64] |= 1 << (depth % 64)
		} else {
			stack[depth/64] &^= 1 << (depth % 64)
		}
		depth++
	}
	inObject := func() bool { return stack[(depth-1)/64]&(1<<((depth-1)%64)) != 0 }
	j := i
	for {
		// a value at j
		if j >= len(b) {
			return 0, errors.New("invalid JSON body: value expected")
		}
		switch c := b[j]; {
		case c == '"':
			end, err := skipString(b, j)
			if err != nil {
				return 0, err
			}
			j = end
		case c == '{' || c == '[':
			k := skipSpace(b, j+1)
			closing := byte('}')
			if c == '[' {
				closing = ']'
			}
			if k < len(b) && b[k] == closing {
				j = k + 1
				break
			}
			push(c == '{')
			j = k
			if c == '{' {
				var err error
				if j, err = skipKey(b, j); err != nil {
					return 0, err
				}
			}
			continue
		default:
			k := j
			for k < len(b) && b[k] != ',' && b[k] != '}' && b[k] != ']' && b[k] != ' ' && b[k] != '\t' && b[k] != '\n' && b[k] != '\r' {
				k++
			}
			switch lit := string(b[j:k]); {
			case lit == "true" || lit == "false" || lit == "null":
			case len(lit) > 0 && (lit[0] == '-' || lit[0] >= '0' && lit[0] <= '9'):
			default:
				return 0, fmt.Errorf("invalid JSON body: unexpected %q at offset %d", lit, j)
			}
			j = k
		}
		// after a value: close containers, or go on to the next element
		for {
			if depth == 0 {
				return j, nil
			}
			j = skipSpace(b, j)
			closing := byte(']')
			if inObject() {
				closing = '}'
			}
			if j < len(b) && b[j] == ',' {
				j = skipSpace(b, j+1)
				if inObject() {
					var err error
					if j, err = skipKey(b, j); err != nil {
						return 0, err
					}
				}
				break
			}
			if j < len(b) && b[j] == closing {
				j++
				depth--
				continue
			}
			return 0, fmt.Errorf("invalid JSON body: expected ',' or '%c' at offset %d", closing, j)
		}
	}
}

// skipKey skips an object's key and its colon at b[j], returning the
// offset of the value.
func skipKey(b []byte, j int) (int, error) {
	if j >= len(b) || b[j] != '"' {
		return 0, fmt.Errorf("invalid JSON body: expected a key at offset %d", j)
	}
	j, err := skipString(b, j)
	if err != nil {
		return 0, err
	}
	j = skipSpace(b, j)
	if j >= len(b) || b[j] != ':' {
		return 0, fmt.Errorf("invalid JSON body: expected ':' at offset %d", j)
	}
	return skipSpace(b, j+1), nil
}

// completionPrompt returns a completion request's prompt text, when it is
// one string (or a list of one string); ok is false otherwise (token ids or
// several prompts: routed without a prediction). A prompt without escapes
// is raw's own bytes, not a copy: it is only for reading while raw is
// (the encoders keep nothing of what they read).
func completionPrompt(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", false
	}
	var s string
	if raw[0] == '"' {
		// Most prompts need no unescaping: take their bytes as they are.
		if len(raw) >= 2 && raw[len(raw)-1] == '"' && plain(raw[1:len(raw)-1]) {
			if len(raw) == 2 {
				return "", true
			}
			return unsafe.String(&raw[1], len(raw)-2), true
		}
		if json.Unmarshal(raw, &s) == nil {
			return s, true
		}
		return "", false
	}
	var list []string
	if raw[0] == '[' && json.Unmarshal(raw, &list) == nil && len(list) == 1 {
		return list[0], true
	}
	return "", false
}

// promptCount is the number of prompts in a completion request's prompt:
// a list of strings or of token-id lists is a batch, each prompt its own
// request in vLLM; anything else (a string, a list of token ids, a value
// the engine refuses) is one.
func promptCount(raw json.RawMessage) int {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' {
		return 1
	}
	i := skipSpace(raw, 1)
	if i >= len(raw) || raw[i] != '"' && raw[i] != '[' {
		return 1
	}
	k := 0
	for {
		end, err := skipValue(raw, i, 0)
		if err != nil {
			return max(k, 1)
		}
		k++
		if i = skipSpace(raw, end); i >= len(raw) || raw[i] != ',' {
			return k
		}
		i = skipSpace(raw, i+1)
	}
}

// rewriteModel replaces the value of the body's top-level "model" key with
// name, leaving every other byte as it was.
func rewriteModel(body []byte, f fields, name string) []byte {
	if f.Model == nil && f.modelEnd == 0 {
		return body
	}
	q, _ := json.Marshal(name)
	out := make([]byte, 0, len(body)+len(q))
	out = append(out, body[:f.modelStart]...)
	out = append(out, q...)
	return append(out, body[f.modelEnd:]...)
}

// plain reports whether a JSON string's inside holds no escapes, control
// characters or invalid UTF-8, so its bytes are its value.
func plain(b []byte) bool {
	for _, c := range b {
		if c == '\\' || c == '"' || c < 0x20 {
			return false
		}
	}
	return utf8.Valid(b)
}
