package live

import (
	"bytes"
	"sync"

	"github.com/inferrail/inferrail/internal/openai"
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

// maxBodyBytes bounds a non-streamed body kept to read its text.
const maxBodyBytes = 4 * maxAnswerBytes

// bodyTail is how much of a non-streamed body is kept to read its usage
// when its text is not wanted (vLLM writes the usage last).
const bodyTail = 8 << 10

// answer watches a response as it is relayed, through package
// internal/openai: a stream event by event, a body whole (or by its tail
// when only its usage is wanted). It learns the answer's length (the
// engine's usage, else the chunks that carried text), its text (for the
// approximate index, with keepText) and whether the stream ended with
// data: [DONE].
type answer struct {
	stream   bool
	keepText bool
	r        openai.Reader
	a        openai.Answer
	// pending is a non-streamed body (its tail without keepText).
	pending []byte
	// over: the body or the stream could not be read (too long, or not
	// the OpenAI shape); its text is not used.
	over bool
	// done says the stream's data: [DONE] arrived: the answer is whole,
	// whatever happens to the connection after it.
	done bool
	// completion and cached are the usage's completion_tokens and
	// cached_tokens, prompt its prompt_tokens (-1: not seen).
	completion, cached, prompt int
	// whole: a non-streamed body is read whole (its text is wanted, or a
	// response's id, which leads it); otherwise by its tail.
	whole bool
	// prefillOnly: an embedding's or a score's answer, whose usage may
	// say total_tokens alone (vLLM's rerank): that is its prompt. total
	// is total_tokens (-1: not seen).
	prefillOnly bool
	total       int
	// strip: the proxy asked for this stream's usage, which the client
	// does not get (streamusage.go); held is an event's start not yet
	// ended, out the bytes pass returned last.
	strip     bool
	held, out []byte
	check     openai.Reader // reads an event that may be the usage
}

func newAnswer(stream, keepText bool) *answer {
	a, _ := answerPool.Get().(*answer)
	if a == nil {
		a = &answer{}
	}
	r, text, pending, held, out, check := a.r, a.a.Text[:0], a.pending[:0], a.held[:0], a.out[:0], a.check
	r.Reset()
	*a = answer{stream: stream, keepText: keepText, whole: keepText, completion: -1, cached: -1, prompt: -1, total: -1, r: r, pending: pending, held: held, out: out, check: check}
	a.a.Text = text
	a.a.MaxText = maxAnswerBytes
	if !keepText {
		a.a.MaxText = -1
	}
	a.r.MaxEventBytes = 4 * maxAnswerBytes
	return a
}

// answerPool keeps answers' buffers (the reader's, the text's) from one
// request to the next; those grown past maxPooledAnswer are left to the
// collector.
var answerPool sync.Pool

const maxPooledAnswer = 64 << 10

// release gives a back for another request; nothing may use it after.
func (a *answer) release() {
	if a == nil || a.r.Retained()+a.check.Retained()+cap(a.a.Text)+cap(a.pending)+cap(a.held)+cap(a.out) > maxPooledAnswer {
		return
	}
	answerPool.Put(a)
}

// feed takes the next bytes of the response.
func (a *answer) feed(p []byte) {
	if !a.stream {
		if a.over {
			return
		}
		a.pending = append(a.pending, p...)
		switch {
		case !a.whole && len(a.pending) > 2*bodyTail:
			a.pending = append(a.pending[:0], a.pending[len(a.pending)-bodyTail:]...)
		case a.whole && len(a.pending) > maxBodyBytes:
			a.over, a.pending = true, nil
		}
		return
	}
	if a.r.Err() != nil {
		return
	}
	evs, err := a.r.Feed(p, 0)
	a.take(evs)
	if err != nil {
		a.over = true
	}
}

func (a *answer) take(evs []openai.Event) {
	a.a.Add(evs...)
	a.done = a.a.Done
	if a.a.HasUsage {
		a.completion, a.cached = a.a.Usage.CompletionTokens, a.a.Usage.CachedTokens
		if a.a.Usage.PromptTokens > 0 { // a usage without prompt_tokens reads 0
			a.prompt = a.a.Usage.PromptTokens
		}
	}
}

// finish returns the answer's text, or false when it could not be read.
func (a *answer) finish() ([]byte, bool) {
	if !a.stream {
		if !a.whole {
			a.usageIn(a.pending)
			return nil, false
		}
		if a.over {
			return nil, false
		}
		e, err := openai.ParseResponse(a.pending)
		if err != nil {
			return nil, false
		}
		a.take([]openai.Event{e})
	} else if a.r.Err() == nil {
		evs, err := a.r.End(0)
		a.take(evs)
		if err != nil {
			a.over = true
		}
	}
	if a.over || !a.keepText || a.a.Truncated {
		return nil, false
	}
	return a.a.Text, true
}

// responseID is the Responses API response's id the answer carried, ""
// when it had none (or could not be read). finish must have run.
func (a *answer) responseID() string {
	if a.over || len(a.a.ResponseID) == 0 {
		return ""
	}
	return string(a.a.ResponseID)
}

// outputTokens is the answer's length in tokens: the engine's usage, else
// retokenized, the length of the text as the caller encoded it (-1: not
// encoded), else the chunks that carried text.
func (a *answer) outputTokens(retokenized int) (int, bool) {
	if a.completion >= 0 {
		return a.completion, true
	}
	if retokenized >= 0 {
		return retokenized, true
	}
	if a.a.Generated > 0 {
		return a.a.Generated, true
	}
	return 0, false
}

// promptTokens is the prompt's length as the engine counted it (its
// usage's prompt_tokens, or for an answer that generated nothing its
// total_tokens), false when the answer did not say (a stream whose client
// did not ask for usage, an unreadable body).
func (a *answer) promptTokens() (int, bool) {
	switch {
	case a == nil:
		return 0, false
	case a.prompt > 0:
		return a.prompt, true
	case a.prefillOnly && a.total > 0:
		return a.total, true
	}
	return 0, false
}

var (
	keyCompletion = []byte(`"completion_tokens":`)
	keyCached     = []byte(`"cached_tokens":`)
	keyPrompt     = []byte(`"prompt_tokens":`)
	keyTotal      = []byte(`"total_tokens":`)
)

// usageIn reads the usage counts in the tail of a body whose text is not
// wanted (the rest of it was not kept, so it cannot be parsed whole).
func (a *answer) usageIn(data []byte) {
	if n, ok := intAfter(data, keyCompletion); ok {
		a.completion = n
	}
	if n, ok := intAfter(data, keyCached); ok {
		a.cached = n
	}
	if n, ok := intAfter(data, keyPrompt); ok && n > 0 {
		a.prompt = n
	}
	if a.prefillOnly { // its prompt, when the usage says nothing else
		if n, ok := intAfter(data, keyTotal); ok {
			a.total = n
		}
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
