package simtok

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Message is one chat message as builtin:sim's chat template reads it.
type Message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// RenderChat is builtin:sim's chat template, the mock engine's: each message
// as "role: content\n", then "assistant: " when a generation prompt is asked
// for. Content may be a string, null, or a list of text parts, joined by
// newlines as vLLM's "string" content format does. With continueFinal the
// last message is left open (no newline, no generation prompt).
func RenderChat(msgs []Message, addGenerationPrompt, continueFinal bool) (string, error) {
	var b strings.Builder
	for i, m := range msgs {
		if m.Role == "" {
			return "", fmt.Errorf("messages[%d].role is missing", i)
		}
		content, err := MessageText(m.Content)
		if err != nil {
			return "", fmt.Errorf("messages[%d].content: %w", i, err)
		}
		b.WriteString(m.Role)
		b.WriteString(": ")
		b.WriteString(content)
		if !(continueFinal && i == len(msgs)-1) {
			b.WriteString("\n")
		}
	}
	if addGenerationPrompt && !continueFinal {
		b.WriteString("assistant: ")
	}
	return b.String(), nil
}

// MessageText returns a message content's text.
func MessageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string, null or a list of content parts")
	}
	texts := make([]string, 0, len(parts))
	for i, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", fmt.Errorf("part %d has type %q: the mock engine takes text parts only", i, p.Type)
		}
		texts = append(texts, *p.Text)
	}
	return strings.Join(texts, "\n"), nil
}
