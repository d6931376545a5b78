package semcache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
)

// The paths the cache serves.
const (
	PathCompletions     = "/v1/completions"
	PathChatCompletions = "/v1/chat/completions"
)

// Bypass reasons: why a request is not looked up (Result.Reason, and the
// reason label of inferrail_semantic_cache_bypass_total).
const (
	ReasonDisabled         = "disabled"          // the cache is off
	ReasonNotDeterministic = "not_deterministic" // the determinism rule said no (its own reason follows a colon)
	ReasonPath             = "path"              // not a completions or chat completions request
	ReasonNoTenant         = "no_tenant"         // no tenant: there is no shared pool
	ReasonNoModel          = "no_model"          // no resolved model
	ReasonInvalidBody      = "invalid_body"      // not one JSON object, or messages/prompt of the wrong shape
	ReasonNoUserMessage    = "no_user_message"   // the last message is not the user's
	ReasonNotText          = "not_text"          // token ids, images or other non-text content
	ReasonEmptyText        = "empty_text"        // nothing but white space to embed
	ReasonTooLong          = "too_long"          // the text exceeds max_text_bytes
)

// partitionMagic starts the partition's digest; a change of its layout
// changes it.
const partitionMagic = "inferrail/semcache/partition/1\x00"

// Split returns what a request is matched by and what must match exactly.
// text is the last message of a chat request, which must be the user's
// (its string content, or its text parts joined by newlines), or the
// prompt of a completions request (a string, or a list of one string).
// partition is a SHA-256 digest, in hex, of the path and of the whole body
// with that text taken out (as null): system prompt, earlier turns, model,
// stream, sampling parameters, tools, response_format, cache_salt and any
// other field, re-encoded with sorted keys and numbers as spelled. So two
// requests share answers only when they differ in nothing but the last
// user message, and that message is similar. reason, when not "", is why
// the request cannot be looked up (a Reason* const).
func Split(path string, body []byte) (text, partition, reason string) {
	if path != PathChatCompletions && path != PathCompletions {
		return "", "", ReasonPath
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var root map[string]any
	if err := dec.Decode(&root); err != nil || root == nil {
		return "", "", ReasonInvalidBody
	}
	if _, err := dec.Token(); err == nil {
		return "", "", ReasonInvalidBody // more after the object
	}
	if path == PathChatCompletions {
		msgs, ok := root["messages"].([]any)
		if !ok || len(msgs) == 0 {
			return "", "", ReasonInvalidBody
		}
		last, ok := msgs[len(msgs)-1].(map[string]any)
		if !ok {
			return "", "", ReasonInvalidBody
		}
		if role, _ := last["role"].(string); role != "user" {
			return "", "", ReasonNoUserMessage
		}
		var why string
		if text, why = contentText(last["content"]); why != "" {
			return "", "", why
		}
		last["content"] = nil
	} else {
		switch p := root["prompt"].(type) {
		case string:
			text = p
		case []any:
			if len(p) != 1 {
				return "", "", ReasonNotText
			}
			s, ok := p[0].(string)
			if !ok {
				return "", "", ReasonNotText
			}
			text = s
		default:
			return "", "", ReasonNotText
		}
		root["prompt"] = nil
	}
	if strings.TrimSpace(text) == "" {
		return "", "", ReasonEmptyText
	}
	rest, err := json.Marshal(root) // map keys sorted
	if err != nil {
		return "", "", ReasonInvalidBody
	}
	h := sha256.New()
	h.Write([]byte(partitionMagic))
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write(rest)
	return text, hex.EncodeToString(h.Sum(nil)), ""
}

// contentText reads a message's content: a string, or a list of text
// parts joined by newlines.
func contentText(c any) (string, string) {
	switch v := c.(type) {
	case string:
		return v, ""
	case []any:
		var b strings.Builder
		for i, p := range v {
			part, ok := p.(map[string]any)
			if !ok {
				return "", ReasonInvalidBody
			}
			if typ, _ := part["type"].(string); typ != "text" {
				return "", ReasonNotText
			}
			s, ok := part["text"].(string)
			if !ok {
				return "", ReasonInvalidBody
			}
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(s)
		}
		return b.String(), ""
	case nil:
		return "", ReasonEmptyText
	}
	return "", ReasonInvalidBody
}
