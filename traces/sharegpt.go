package traces

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// ShareGPTOptions configure the ShareGPT reader.
type ShareGPTOptions struct {
	Options
	// Tokenize counts a text's tokens. Nil estimates them as
	// ceil(len(text in UTF-8 bytes)/4), since the package has no tokenizer.
	Tokenize func(string) int
}

// EstimateTokens is the ShareGPT reader's default token count:
// ceil(len(s)/4), s's length in UTF-8 bytes over four.
func EstimateTokens(s string) int { return (len(s) + 3) / 4 }

// NewShareGPT reads ShareGPT conversations with estimated token counts (see
// NewShareGPTWith).
func NewShareGPT(r io.Reader, name string, opts Options) Reader {
	return NewShareGPTWith(r, name, ShareGPTOptions{Options: opts})
}

// NewShareGPTWith reads ShareGPT conversations: a JSON array of
//
//	{"id": ..., "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": text}, ...]}
//
// (or the same objects one after another, as JSON lines). The array is
// streamed: one conversation at a time is held in memory.
//
// Each human (or user) message followed by a gpt (or assistant, chatgpt,
// bard, model) answer is one request whose prompt is the whole conversation
// so far, history resent as in vLLM's multi-turn benchmark: InputTokens is
// the sum of the token counts of every message up to and including the
// question (other messages, such as system ones, count as history), and
// OutputTokens the answer's. A question with no answer after it makes no
// request but stays in the history.
//
// ShareGPT has no timestamps: every Arrival is 0 and the caller applies a
// rate. Session is the conversation's 1-based position in the file, Turn the
// request's 0-based position in its conversation, ID the request's 1-based
// position in the file, and Parent the ID of the conversation's previous
// request (0 for the first). ShareGPT replays carry sessions only, no block
// identity (BlockSize 0). Errors name the line where the conversation starts.
// A conversation that is not an object with a conversations list, and a
// request with an empty prompt, are bad records; invalid JSON ends the read.
func NewShareGPTWith(r io.Reader, name string, opts ShareGPTOptions) Reader {
	tok := opts.Tokenize
	if tok == nil {
		tok = EstimateTokens
	}
	lc := &lineCounter{r: r}
	br := bufio.NewReaderSize(lc, 64<<10)
	return &shareGPTReader{br: br, lc: lc, name: name, opts: opts.Options, tokenize: tok}
}

// shareGPTReader streams a ShareGPT file.
type shareGPTReader struct {
	br       *bufio.Reader
	lc       *lineCounter
	dec      *json.Decoder
	name     string
	opts     Options
	tokenize func(string) int
	array    bool

	convs   uint64        // conversations read
	reqs    uint64        // requests made, bad ones included
	pending []shareGPTReq // the current conversation's requests not yet returned
	skipped int
	err     error // final error, returned again by every later Next
}

type shareGPTReq struct {
	rec Record
	err error // a *LineError wrapping ErrBadRecord
}

type shareGPTConv struct {
	Conversations *[]shareGPTMessage `json:"conversations"`
}

type shareGPTMessage struct {
	From  string `json:"from"`
	Value string `json:"value"`
}

// Next implements Reader. After a *LineError wrapping ErrBadRecord, Next may
// be called again to go on.
func (s *shareGPTReader) Next() (Record, error) {
	for {
		for len(s.pending) > 0 {
			p := s.pending[0]
			s.pending = s.pending[1:]
			if p.err == nil {
				return p.rec, nil
			}
			if !s.opts.SkipBad {
				return Record{}, p.err
			}
			s.skipped++
		}
		if s.err != nil {
			return Record{}, s.err
		}
		s.pending = s.pending[:0]
		if err := s.readConversation(); err != nil {
			s.err = err
		}
	}
}

// Skipped implements Counter.
func (s *shareGPTReader) Skipped() int { return s.skipped }

// start reads up to the first conversation.
func (s *shareGPTReader) start() error {
	if b, err := s.br.Peek(3); err == nil && bytes.Equal(b, utf8BOM) {
		_, _ = s.br.Discard(3)
	}
	for {
		c, err := s.br.ReadByte()
		if errors.Is(err, io.EOF) {
			return io.EOF
		}
		if err != nil {
			return fmt.Errorf("%s: read: %w", s.name, err)
		}
		if c == ' ' || c == '\t' || c == '\r' || c == '\n' {
			continue
		}
		_ = s.br.UnreadByte()
		switch c {
		case '[':
			s.array = true
		case '{':
		default:
			return &LineError{File: s.name, Line: s.lc.lineAt(s.lc.read - int64(s.br.Buffered())), Err: errors.New("not a ShareGPT file: want a JSON array of conversations")}
		}
		break
	}
	// The decoder's offsets count from here: note where here is.
	s.lc.shift = s.lc.read - int64(s.br.Buffered())
	s.dec = json.NewDecoder(s.br)
	if s.array {
		if _, err := s.dec.Token(); err != nil {
			return s.syntax(err)
		}
	}
	return nil
}

// readConversation reads one conversation into pending.
func (s *shareGPTReader) readConversation() error {
	if s.dec == nil {
		if err := s.start(); err != nil {
			return err
		}
	}
	if s.array && !s.dec.More() {
		if _, err := s.dec.Token(); err != nil { // the closing bracket
			return s.syntax(err)
		}
		if _, err := s.dec.Token(); !errors.Is(err, io.EOF) {
			return &LineError{File: s.name, Line: s.line(s.dec.InputOffset()), Err: errors.New("data after the array of conversations")}
		}
		return io.EOF
	}
	var raw json.RawMessage
	if err := s.dec.Decode(&raw); err != nil {
		if !s.array && errors.Is(err, io.EOF) {
			return io.EOF
		}
		return s.syntax(err)
	}
	line := s.line(s.dec.InputOffset() - int64(len(raw)))
	s.convs++
	var conv shareGPTConv
	if err := json.Unmarshal(raw, &conv); err != nil {
		s.pending = append(s.pending, shareGPTReq{err: &LineError{File: s.name, Line: line, Err: jsonBad(err)}})
		return nil
	}
	if conv.Conversations == nil {
		s.pending = append(s.pending, shareGPTReq{err: &LineError{File: s.name, Line: line, Err: badf("missing conversations")}})
		return nil
	}
	msgs := *conv.Conversations
	counts := make([]int, len(msgs))
	for i, m := range msgs {
		counts[i] = s.tokenize(m.Value)
	}
	history, turn, parent := 0, 0, uint64(0)
	for i, m := range msgs {
		n := counts[i]
		history = min(history+min(max(n, 0), maxTokens+1), maxTokens+1)
		if !isQuestion(m.From) || i+1 >= len(msgs) || !isAnswer(msgs[i+1].From) {
			continue
		}
		s.reqs++
		rec := Record{ID: s.reqs, Session: s.convs, Parent: parent, Turn: turn, Model: s.opts.Model}
		turn++
		parent = rec.ID
		err := badIf(n < 0, "token count %d of turn %d's question is negative", n, turn-1)
		if err == nil {
			rec.InputTokens, err = checkCount("input tokens", float64(history))
		}
		if err == nil {
			rec.OutputTokens, err = checkCount("output tokens", float64(counts[i+1]))
		}
		if err == nil {
			err = rec.Validate()
		}
		if err != nil {
			s.pending = append(s.pending, shareGPTReq{err: &LineError{File: s.name, Line: line, Err: fmt.Errorf("turn %d: %w", turn-1, err)}})
			continue
		}
		s.pending = append(s.pending, shareGPTReq{rec: rec})
	}
	return nil
}

// badIf returns a bad-record error when cond holds.
func badIf(cond bool, format string, args ...any) error {
	if cond {
		return badf(format, args...)
	}
	return nil
}

// syntax makes a final error of a JSON decoding error.
func (s *shareGPTReader) syntax(err error) error {
	line := s.line(s.dec.InputOffset())
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		line = s.line(se.Offset)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		// The input ended inside a value: name its last line.
		err = io.ErrUnexpectedEOF
		line = s.lc.lineAt(s.lc.read - 1)
	}
	return &LineError{File: s.name, Line: line, Err: fmt.Errorf("invalid JSON: %w", err)}
}

// line is the line of a decoder offset.
func (s *shareGPTReader) line(off int64) int { return s.lc.lineAt(off + s.lc.shift) }

func isQuestion(from string) bool {
	switch strings.ToLower(from) {
	case "human", "user":
		return true
	}
	return false
}

func isAnswer(from string) bool {
	switch strings.ToLower(from) {
	case "gpt", "assistant", "chatgpt", "bard", "bing", "model":
		return true
	}
	return false
}

// lineCounter counts the lines of what passes through it, so that byte
// offsets can be turned into line numbers. It keeps the offsets of the
// newlines read but not yet asked about; lineAt must be asked about
// non-decreasing offsets.
type lineCounter struct {
	r     io.Reader
	read  int64   // bytes read so far
	shift int64   // added to the offsets lineAt is given by its users
	nl    []int64 // offsets of newlines beyond the last lineAt
	lines int     // newlines before the last lineAt's offset
}

func (c *lineCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	for i, b := range p[:max(n, 0)] {
		if b == '\n' {
			c.nl = append(c.nl, c.read+int64(i))
		}
	}
	c.read += int64(max(n, 0))
	return n, err
}

// lineAt is the 1-based line of a byte offset.
func (c *lineCounter) lineAt(off int64) int {
	i := 0
	for i < len(c.nl) && c.nl[i] < off {
		i++
	}
	c.lines += i
	c.nl = c.nl[i:]
	return c.lines + 1
}
