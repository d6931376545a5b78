package live

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// fields are what the proxy reads of a request body; everything else passes
// through untouched.
type fields struct {
	Model     *string         `json:"model"`
	Prompt    json.RawMessage `json:"prompt"`
	CacheSalt *string         `json:"cache_salt"`
	Stream    *bool           `json:"stream"`
	User      *string         `json:"user"`
}

func readFields(body []byte) (fields, error) {
	var f fields
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return f, errors.New("the body must be a JSON object")
	}
	if err := json.Unmarshal(body, &f); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return f, fmt.Errorf("field %q: got JSON %s, want %s", te.Field, te.Value, te.Type)
		}
		return f, fmt.Errorf("invalid JSON body: %v", err)
	}
	return f, nil
}

// completionPrompt returns a completion request's prompt text, when it is
// one string (or a list of one string); ok is false otherwise (token ids or
// several prompts: routed without a prediction).
func completionPrompt(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", false
	}
	var s string
	if raw[0] == '"' {
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

// rewriteModel replaces the value of the body's top-level "model" key with
// name, leaving every other byte as it was.
func rewriteModel(body []byte, name string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("the body must be a JSON object")
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := t.(string)
		start := dec.InputOffset()
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		if key != "model" {
			continue
		}
		end := dec.InputOffset()
		// start is just after the key; the value follows a colon and
		// whitespace.
		i := bytes.IndexByte(body[start:end], ':')
		if i < 0 {
			return nil, errors.New("malformed model field")
		}
		vs := start + int64(i) + 1
		for vs < end && (body[vs] == ' ' || body[vs] == '\t' || body[vs] == '\n' || body[vs] == '\r') {
			vs++
		}
		q, _ := json.Marshal(name)
		out := make([]byte, 0, len(body)+len(q))
		out = append(out, body[:vs]...)
		out = append(out, q...)
		out = append(out, body[end:]...)
		return out, nil
	}
	return body, nil
}
