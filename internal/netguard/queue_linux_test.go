package netguard

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
	ln := smallBacklog(t, 0)
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

// smallBacklog listens on 127.0.0.1 with a backlog of n: an accept queue
// of n, flooded from n/8 queued.
func smallBacklog(t *testing.T, n int) net.Listener {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "listener")
	defer f.Close()
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, n); err != nil {
		t.Fatal(err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// TestFloodSheds: with the accept queue an eighth full or more, the
// connections of an address that holds FloodConnsPerClient and its share
// are closed at accept, unwrapped, while another address's connection,
// queued behind them, is served (taken bare and wrapped: it reads, writes
// and names its peer as any other); the heavy address is still shed for a
// while once the queue is short again.
func TestFloodSheds(t *testing.T) {
	ln := smallBacklog(t, 16) // flooded from 2 queued
	var shed []netip.Addr
	l, err := NewListener(ln, Config{MaxConns: 64, MaxConnsPerClient: 32, FloodConnsPerClient: 4,
		KeepAlive: net.KeepAliveConfig{Enable: true, Idle: 20 * time.Second},
		OnReject:  func(r Reason, a netip.Addr) { shed = append(shed, a) }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := ln.Addr().String()
	heavy := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 2 * time.Second}
	dial := func(d *net.Dialer) net.Conn {
		t.Helper()
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// The heavy address holds its floor, accepted without a flood.
	for range 4 {
		dial(heavy)
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// Then 5 more from it, one from 127.0.0.1, 5 more from it.
	var queued []net.Conn
	for range 5 {
		queued = append(queued, dial(heavy))
	}
	light := dial(&net.Dialer{Timeout: 2 * time.Second})
	for range 5 {
		queued = append(queued, dial(heavy))
	}
	waitQueue(t, l, 11)
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := ClientAddr(c.RemoteAddr()); got != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("Accept() served %v, want 127.0.0.1's connection (the heavy address's five before it shed)", c.RemoteAddr())
	}
	if _, ok := c.(*conn).Conn.(*net.TCPConn); !ok {
		t.Fatalf("the connection served in a flood is a %T, want a *net.TCPConn", c.(*conn).Conn)
	}
	if got := sockopt(t, c.(*conn).Conn, syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE); got != 20 {
		t.Errorf("TCP_KEEPIDLE = %d on the connection served in a flood, want Config.KeepAlive's 20", got)
	}
	light.Write([]byte("ping"))
	buf := make([]byte, 4)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v from the connection served in a flood", buf, err)
	}
	c.Write([]byte("pong"))
	light.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(light, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("the client read %q, %v", buf, err)
	}
	s := l.Stats()
	if s.Rejected[ReasonFlood] != 5 || len(shed) != 5 || shed[0] != netip.MustParseAddr("127.0.0.2") {
		t.Fatalf("Stats() = %+v, OnReject %v: want the heavy address's 5 queued before 127.0.0.1's shed", s, shed)
	}
	for _, q := range queued[:5] { // shed: closed by the listener
		q.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := q.Read(buf); err == nil {
			t.Fatal("a shed connection reads data, want it closed")
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("a shed connection is still open")
		}
	}
	// The queue holds the last 5: shed too, the last ones while the
	// flood is held (a second after the queue was last an eighth full),
	// while 127.0.0.1 is still served.
	dial(&net.Dialer{Timeout: 2 * time.Second})
	c2, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got := ClientAddr(c2.RemoteAddr()); got != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("Accept() served %v, want 127.0.0.1's", c2.RemoteAddr())
	}
	if s := l.Stats(); s.Rejected[ReasonFlood] != 10 || s.Open != 6 {
		t.Fatalf("Stats() = %+v, want 10 shed in all and 6 open", s)
	}
}

// TestFloodOff: without FloodConnsPerClient a full queue sheds nothing.
func TestFloodOff(t *testing.T) {
	ln := smallBacklog(t, 16)
	l, err := NewListener(ln, Config{MaxConns: 64, MaxConnsPerClient: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for range 10 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	waitQueue(t, l, 10)
	for range 10 {
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	if s := l.Stats(); s.Rejected[ReasonFlood] != 0 || s.Open != 10 {
		t.Fatalf("Stats() = %+v, want all 10 served", s)
	}
}

// TestSockaddrTCP: accept4's peer addresses give the client ClientAddr
// gives Go's own accepted connections.
func TestSockaddrTCP(t *testing.T) {
	for _, tc := range []struct {
		sa   unix.Sockaddr
		want string
	}{
		{&unix.SockaddrInet4{Port: 5, Addr: [4]byte{192, 0, 2, 1}}, "192.0.2.1"},
		{&unix.SockaddrInet6{Port: 5, Addr: netip.MustParseAddr("2001:db8::1").As16()}, "2001:db8::1"},
		{&unix.SockaddrInet6{Port: 5, ZoneId: 2, Addr: netip.MustParseAddr("fe80::1").As16()}, "fe80::1"},
		{&unix.SockaddrInet6{Port: 5, Addr: netip.MustParseAddr("::ffff:192.0.2.7").As16()}, "192.0.2.7"},
		{&unix.SockaddrUnix{Name: "/run/x"}, "invalid IP"},
	} {
		if got := ClientAddr(sockaddrTCP(tc.sa)).String(); got != tc.want {
			t.Errorf("ClientAddr(sockaddrTCP(%+v)) = %s, want %s", tc.sa, got, tc.want)
		}
	}
}
