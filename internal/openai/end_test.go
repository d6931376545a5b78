package openai

import (
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// ReadEnd reads what follows [DONE] to the end at once, and gives up on a
// stream still open after DoneGrace by cancelling its request.
func TestReadEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		body := strings.NewReader("0\r\n\r\n")
		start := time.Now()
		ReadEnd(body, func() { t.Error("cancelled a stream that ended") })
		if body.Len() != 0 || time.Since(start) != 0 {
			t.Errorf("left %d bytes, took %v", body.Len(), time.Since(start))
		}

		pr, pw := io.Pipe()
		go pw.Write([]byte("more"))
		cancelled := false
		ReadEnd(pr, func() { cancelled = true; pw.CloseWithError(io.ErrClosedPipe) })
		if !cancelled || time.Since(start) != DoneGrace {
			t.Errorf("open stream: cancelled %v after %v, want after %v", cancelled, time.Since(start), DoneGrace)
		}
	})
}
