package netguard

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestAcceptQueue: connections dialled and not yet accepted are counted in
// the listener's accept queue, and leave it as they are accepted.
func TestAcceptQueue(t *testing.T) {
	ln, err := Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewListener(ln, Config{MaxConns: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	q, ok := l.AcceptQueue()
	if !ok || q.Len != 0 || q.Max <= 0 {
		t.Fatalf("idle listener: AcceptQueue() = %+v, %v; want an empty queue with a bound", q, ok)
	}
	const n = 5
	for range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	waitQueue(t, l, n)
	for range n {
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	waitQueue(t, l, 0)
	l.Close()
	if q, ok := l.AcceptQueue(); ok {
		t.Fatalf("closed listener: AcceptQueue() = %+v, true", q)
	}
}

// waitQueue waits (5 s at most) for l's accept queue to hold n.
func waitQueue(t *testing.T, l *Listener, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		q, ok := l.AcceptQueue()
		if ok && q.Len == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("AcceptQueue() = %+v, %v; want Len %d", q, ok, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestListenOverflows fills a listener's accept queue (a backlog of 0
// holds one connection) and sees the kernel count the next connections'
// drops, in ReadListenDrops and with the queue at its bound.
func TestListenOverflows(t *testing.T) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "listener")
	defer f.Close()
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l, err := NewListener(ln, Config{MaxConns: 64})
	if err != nil {
		t.Fatal(err)
	}
	before, err := ReadListenDrops()
	if err != nil {
		t.Fatal(err)
	}
	if before.Drops < before.Overflows {
		t.Fatalf("ReadListenDrops() = %+v: every overflow is a drop too", before)
	}
	first, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	waitQueue(t, l, 1)
	if q, _ := l.AcceptQueue(); q.Max != 0 {
		t.Fatalf("AcceptQueue() = %+v, want Max 0 (the backlog)", q)
	}
	// The queue is full: these SYNs are dropped, and the dials time out
	// waiting for the retransmission.
	for range 3 {
		if c, err := net.DialTimeout("tcp", ln.Addr().String(), 200*time.Millisecond); err == nil {
			c.Close()
		}
	}
	after, err := ReadListenDrops()
	if err != nil {
		t.Fatal(err)
	}
	if after.Overflows < before.Overflows+3 || after.Drops < before.Drops+3 {
		t.Fatalf("listen drops went from %+v to %+v; want 3 more overflows and drops at least", before, after)
	}
}
