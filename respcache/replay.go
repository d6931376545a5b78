package respcache

import (
	"errors"
	"net/http"
	"strconv"
	"time"
)

// Replay writes e to w as the engine first answered it: status 200, its
// Content-Type and x-inferrail-cache: hit, then the body byte for byte. A
// JSON body goes in one write with its Content-Length; a stream goes event
// by event at its recorded boundaries, each flushed, as fast as the client
// reads (ids and created timestamps are those of the first answer). Each
// write is bounded by writeTimeout (0: none) through
// http.ResponseController, and no deadline is left running between writes
// (an HTTP/2 stream is reset when one passes); a writer that cannot set
// deadlines (a recorder) is written without. The error is the first failed
// write: the client is gone or too slow.
func Replay(w http.ResponseWriter, e *Entry, writeTimeout time.Duration) error {
	return ReplayAs(w, e, writeTimeout, "hit")
}

// ReplayAs is Replay with another x-inferrail-cache value: "semantic" for
// an answer the semantic cache found for a similar request.
func ReplayAs(w http.ResponseWriter, e *Entry, writeTimeout time.Duration, cacheHeader string) error {
	h := w.Header()
	h.Set("Content-Type", e.ContentType)
	h.Set(HeaderCache, cacheHeader)
	rp := replayer{w: w, rc: http.NewResponseController(w), timeout: writeTimeout}
	if writeTimeout > 0 && errors.Is(rp.rc.SetWriteDeadline(time.Time{}), http.ErrNotSupported) {
		rp.timeout = 0 // asked once: a recorder, or a writer that hides its connection
	}
	if e.Kind != KindSSE {
		h.Set("Content-Length", strconv.Itoa(len(e.Body)))
		w.WriteHeader(http.StatusOK)
		return rp.write(e.Body, false)
	}
	h.Del("Content-Length")
	w.WriteHeader(http.StatusOK)
	prev := 0
	for _, end := range e.Events {
		if err := rp.write(e.Body[prev:end], true); err != nil {
			return err
		}
		prev = end
	}
	if prev < len(e.Body) {
		return rp.write(e.Body[prev:], true)
	}
	return nil
}

type replayer struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

// write writes b (and flushes it) within the write timeout.
func (r *replayer) write(b []byte, flush bool) error {
	if r.timeout > 0 {
		_ = r.rc.SetWriteDeadline(time.Now().Add(r.timeout))
		defer func() { _ = r.rc.SetWriteDeadline(time.Time{}) }()
	}
	if _, err := r.w.Write(b); err != nil {
		return err
	}
	if !flush {
		return nil
	}
	if err := r.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}
