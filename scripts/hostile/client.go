package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// chatBody is a small chat request.
func chatBody(content string, maxTokens int, stream bool, user string) []byte {
	m := map[string]any{
		"model":      "inferrail-sim",
		"max_tokens": maxTokens,
		"stream":     stream,
		"messages":   []map[string]string{{"role": "user", "content": content}},
	}
	if user != "" {
		m["user"] = user
	}
	b, _ := json.Marshal(m)
	return b
}

// answer is what a client saw of one request.
type answer struct {
	status   int
	err      error // transport error or the body read's error
	timedOut bool
	header   http.Header
	bytes    int
	body     []byte // kept when asked
	sse      bool   // the answer is text/event-stream
	done     bool   // an SSE "data: [DONE]" line arrived
	sseError bool   // an SSE error event arrived
	took     time.Duration
}

func (a answer) ok() bool { return a.err == nil && a.status == http.StatusOK }

// outcome is a short word for a failed answer.
func (a answer) outcome() string {
	switch {
	case a.timedOut:
		return "timeout"
	case a.err != nil:
		return "error"
	case a.status != http.StatusOK:
		return fmt.Sprint(a.status)
	case a.sse && !a.done:
		return "200 without [DONE]"
	}
	return "ok"
}

// send POSTs body to url with hdrs and reads the whole answer, within
// timeout. client nil: a fresh connection.
func send(client *http.Client, url string, body []byte, hdrs map[string]string, timeout time.Duration, keep bool) answer {
	if client == nil {
		tr := &http.Transport{DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		client = &http.Client{Transport: tr}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdrs {
		req.Header.Set(k, v)
	}
	t0 := time.Now()
	var a answer
	resp, err := client.Do(req)
	if err != nil {
		a.err, a.took = err, time.Since(t0)
		a.timedOut = errors.Is(err, context.DeadlineExceeded)
		return a
	}
	defer resp.Body.Close()
	a.status, a.header = resp.StatusCode, resp.Header
	a.sse = strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	var kept bytes.Buffer
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			err = nil // a long line: counted, not parsed
		}
		a.bytes += len(line)
		if keep {
			kept.Write(line)
		}
		scanSSE(&a, line)
		if err != nil {
			if err != io.EOF {
				a.err = err
				a.timedOut = errors.Is(err, context.DeadlineExceeded)
			}
			break
		}
	}
	a.took = time.Since(t0)
	a.body = kept.Bytes()
	return a
}

// scanSSE notes [DONE] and error events in one line of a stream.
func scanSSE(a *answer, line []byte) {
	s := strings.TrimSpace(string(line))
	switch {
	case s == "data: [DONE]":
		a.done = true
	case s == "event: error":
		a.sseError = true
	case strings.HasPrefix(s, "data: {") && strings.Contains(s, `"error"`):
		var v map[string]json.RawMessage
		if json.Unmarshal([]byte(s[len("data: "):]), &v) == nil && v["error"] != nil {
			a.sseError = true
		}
	}
}
