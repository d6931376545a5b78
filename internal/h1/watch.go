package h1

import "time"

// A request's context ends when its client is gone. Writes notice that at
// once (connWriter). A handler that waits without writing (a queued
// request, an answer not streamed) would not notice, so once the request
// is ClientGoneAfter old and its body is read, a goroutine reads the
// connection: an error or EOF there ends the context; a byte (the next
// pipelined request) is kept for the next read. A request that ends sooner,
// or that streams before then, costs no goroutine and no wake-up.

// aLongTimeAgo is a deadline that wakes a blocked read at once.
var aLongTimeAgo = time.Unix(1, 0)

// begin starts a request's watch.
func (c *conn) begin(cancel func(), noBody bool) {
	c.mu.Lock()
	c.cancel = cancel
	c.running, c.streamed, c.armed, c.bodyDone, c.readDeadline = true, false, false, noBody, false
	c.mu.Unlock()
	if c.timer == nil {
		c.timer = time.AfterFunc(c.srv.cfg.ClientGoneAfter, c.arm)
	} else {
		c.timer.Reset(c.srv.cfg.ClientGoneAfter)
	}
}

// end stops the watch when the handler returns.
func (c *conn) end() {
	c.timer.Stop()
	c.mu.Lock()
	c.running, c.cancel = false, nil
	c.mu.Unlock()
}

// arm is the timer's: the request is old enough to be watched.
func (c *conn) arm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running || c.streamed {
		return
	}
	c.armed = true
	if c.bodyDone {
		c.startRead()
	}
}

// bodyRead notes the request body's end (in the handler's goroutine).
func (c *conn) bodyRead() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bodyDone = true
	if c.armed && c.running && !c.streamed {
		c.startRead()
	}
}

// stream notes that the handler flushed a body: from now on its writes
// notice a gone client.
func (c *conn) stream() {
	c.mu.Lock()
	c.streamed = true
	c.mu.Unlock()
}

// startRead starts the background read; c.mu is held.
func (c *conn) startRead() {
	if c.reading || c.hasByte {
		return
	}
	c.reading = true
	if !c.readDeadline {
		// Only the body's deadline is on the connection, and the body
		// is read: the watch waits as long as the request runs.
		c.nc.SetReadDeadline(time.Time{})
	}
	c.bgDone = make(chan struct{})
	go c.backgroundRead(c.bgDone)
}

func (c *conn) backgroundRead(done chan struct{}) {
	n, err := c.nc.Read(c.byteBuf[:])
	c.mu.Lock()
	if n == 1 {
		c.hasByte = true
	}
	if err != nil && !c.aborting && c.cancel != nil {
		c.cancel()
	}
	c.reading = false
	c.mu.Unlock()
	close(done)
}

// abortRead stops a running background read and waits for it.
func (c *conn) abortRead() {
	c.mu.Lock()
	if !c.reading {
		c.mu.Unlock()
		return
	}
	c.aborting = true
	done := c.bgDone
	c.mu.Unlock()
	c.nc.SetReadDeadline(aLongTimeAgo)
	<-done
	c.mu.Lock()
	c.aborting = false
	c.mu.Unlock()
	c.nc.SetReadDeadline(time.Time{})
}

// gone ends the running request's context: a write to the client failed.
func (c *conn) gone() {
	c.mu.Lock()
	if c.cancel != nil {
		c.cancel()
	}
	c.mu.Unlock()
}
