package openai

import (
	"io"
	"time"
)

// DoneGrace is how long a client of an engine waits for a stream's end
// after its data: [DONE]. An engine ends the response at once (vLLM's
// server and inferrail engine in a write of their own), so a longer wait
// means one that keeps the stream open, and the stream counts as whole.
const DoneGrace = 50 * time.Millisecond

// endLimit bounds what ReadEnd reads after data: [DONE].
const endLimit = 64 << 10

// ReadEnd reads a stream on from data: [DONE] to the response's end, for
// at most DoneGrace and 64 KiB, so that its connection can serve the next
// request: a response closed before its end takes the connection with it,
// and the next request's time to first token includes a new connection's
// set-up. cancel ends the request (its context's cancel), and with it a
// read that outlasts DoneGrace.
func ReadEnd(body io.Reader, cancel func()) {
	t := time.AfterFunc(DoneGrace, cancel)
	defer t.Stop()
	_, _ = io.Copy(io.Discard, io.LimitReader(body, endLimit))
}
