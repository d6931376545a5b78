package live

import (
	"bytes"
	"encoding/json"
)

// TextEncoder is what an Encoder offers to read an answer back into tokens
// (tokenize.Model has it). With it, the approximate index learns the blocks
// of each answer, as the simulator's does, so a later turn that quotes it is
// predicted cached.
type TextEncoder interface {
	EncodeText(text string) []uint32
}

// maxAnswerBytes bounds the text kept of one answer.
const maxAnswerBytes = 1 << 20

// answer collects the text of a response as it streams through: the text
// or delta content of each SSE event, or of the whole body when the
// response is not a stream.
type answer struct {
	stream bool
	// keepText keeps the answer's text (for the approximate index); without
	// it only the usage is read, and a body is kept only by its tail.
	keepText bool
	pending  []byte // an SSE line not yet complete, or the JSON body (its tail without keepText)
	text     []byte
	over     bool
	// events counts the events that carried text; completion and cached
	// are the usage's completion_tokens and cached_tokens (-1: not seen).
	events     int
	completion int
	cached     int
	// done says the stream's data: [DONE] arrived: the answer is whole,
	// whatever happens to the connection after it.
	done bool
}

// bodyTail is how much of a non-streamed body is kept to read its usage,
// which vLLM writes last.
const bodyTail = 8 << 10

func newAnswer(stream, keepText bool) *answer {
	return &answer{stream: stream, keepText: keepText, completion: -1, cached: -1}
}

var (
	keyCompletion = []byte(`"completion_tokens":`)
	keyCached     = []byte(`"cached_tokens":`)
)

// usageIn reads the usage counts in data, if any.
func (a *answer) usageIn(data []byte) {
	if n, ok := intAfter(data, keyCompletion); ok {
		a.completion = n
	}
	if n, ok := intAfter(data, keyCached); ok {
		a.cached = n
	}
}

// intAfter reads the non-negative integer after the last occurrence of key.
func intAfter(data, key []byte) (int, bool) {
	i := bytes.LastIndex(data, key)
	if i < 0 {
		return 0, false
	}
	j := skipSpace(data, i+len(key))
	n, digits := 0, 0
	for ; j < len(data) && data[j] >= '0' && data[j] <= '9' && digits < 10; j++ {
		n = n*10 + int(data[j]-'0')
		digits++
	}
	return n, digits > 0
}

// outputTokens is the answer's length in tokens: the engine's usage, else
// retokenized, the length of the text as the caller encoded it (-1: not
// encoded), else the events that carried text.
func (a *answer) outputTokens(retokenized int) (int, bool) {
	if a.completion >= 0 {
		return a.completion, true
	}
	if retokenized >= 0 {
		return retokenized, true
	}
	if a.events > 0 {
		return a.events, true
	}
	return 0, false
}

type choiceText struct {
	Choices []struct {
		Text  *string `json:"text"`
		Delta *struct {
			Content *string `json:"content"`
		} `json:"delta"`
		Message *struct {
			Content *string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
}

func (a *answer) add(c choiceText) {
	for _, ch := range c.Choices {
		var s *string
		switch {
		case ch.Text != nil:
			s = ch.Text
		case ch.Delta != nil:
			s = ch.Delta.Content
		case ch.Message != nil:
			s = ch.Message.Content
		}
		if s != nil {
			if len(a.text)+len(*s) > maxAnswerBytes {
				a.over = true
				return
			}
			a.text = append(a.text, *s...)
		}
		return // the first choice only (n = 1)
	}
}

// maxLineBytes bounds an SSE line the answer waits for the end of.
const maxLineBytes = 4 * maxAnswerBytes

// feed takes the next bytes of the response.
func (a *answer) feed(p []byte) {
	if a.over && !a.stream {
		return
	}
	a.pending = append(a.pending, p...)
	if !a.stream {
		if !a.keepText {
			if len(a.pending) > 2*bodyTail {
				a.pending = append(a.pending[:0], a.pending[len(a.pending)-bodyTail:]...)
			}
			return
		}
		if len(a.pending) > 4*maxAnswerBytes {
			a.over = true
		}
		return
	}
	for {
		i := bytes.IndexByte(a.pending, '\n')
		if i < 0 {
			break
		}
		line := bytes.TrimSuffix(a.pending[:i], []byte("\r"))
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = bytes.TrimPrefix(data, []byte(" "))
			switch {
			case len(data) > 0 && data[0] == '{':
				a.event(data)
			case bytes.Equal(data, []byte("[DONE]")):
				a.done = true
			}
		}
		a.pending = a.pending[i+1:]
		if len(a.pending) == 0 {
			a.pending = a.pending[:0:cap(a.pending)]
		}
	}
	if len(a.pending) > maxLineBytes {
		a.over, a.pending = true, nil
	}
}

// finish returns the answer's text, or false when it could not be read.
func (a *answer) finish() ([]byte, bool) {
	if !a.stream {
		a.usageIn(a.pending)
	}
	if a.over || !a.keepText {
		return nil, false
	}
	if !a.stream {
		var c choiceText
		if json.Unmarshal(a.pending, &c) != nil {
			return nil, false
		}
		a.add(c)
	}
	return a.text, !a.over
}

var (
	keyText    = []byte(`"text":`)
	keyContent = []byte(`"content":`)
)

// event takes one SSE event's JSON. The common case (one text or content
// field holding a plain string) is read without decoding the event; anything
// else is decoded.
func (a *answer) event(data []byte) {
	key := keyText
	i := bytes.Index(data, key)
	if i < 0 {
		key = keyContent
		if i = bytes.Index(data, key); i < 0 {
			a.usageIn(data) // no text in this event (usage, role only)
			return
		}
	}
	a.events++
	if !a.keepText || a.over {
		return
	}
	if bytes.Index(data[i+len(key):], key) < 0 {
		j := skipSpace(data, i+len(key))
		if j < len(data) && data[j] == '"' {
			if end, err := skipString(data, j); err == nil && plain(data[j+1:end-1]) {
				if len(a.text)+end-j-2 > maxAnswerBytes {
					a.over = true
					return
				}
				a.text = append(a.text, data[j+1:end-1]...)
				return
			}
		}
	}
	var c choiceText
	if json.Unmarshal(data, &c) == nil {
		a.add(c)
	}
}
