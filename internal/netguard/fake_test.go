package netguard

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// errDrained is what a draining fakeListener's Accept returns when it has
// nothing queued.
var errDrained = errors.New("fake listener drained")

// accepted is one result of a fakeListener's Accept.
type accepted struct {
	c   net.Conn
	err error
}

// fakeListener returns the connections and errors queued on it in order.
// Draining, it returns errDrained when none is queued; otherwise it waits
// for one, or for Close.
type fakeListener struct {
	queue    chan accepted
	draining bool
	calls    atomic.Int64

	once   sync.Once
	closed chan struct{}
}

func newFakeListener(draining bool) *fakeListener {
	return &fakeListener{queue: make(chan accepted, 1024), draining: draining, closed: make(chan struct{})}
}

func (f *fakeListener) push(c net.Conn) { f.queue <- accepted{c: c} }
func (f *fakeListener) fail(err error)  { f.queue <- accepted{err: err} }
func (f *fakeListener) Addr() net.Addr  { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443} }
func (f *fakeListener) Close() error    { f.once.Do(func() { close(f.closed) }); return nil }

func (f *fakeListener) Accept() (net.Conn, error) {
	f.calls.Add(1)
	if f.draining {
		select {
		case a := <-f.queue:
			return a.c, a.err
		case <-f.closed:
			return nil, net.ErrClosed
		default:
			return nil, errDrained
		}
	}
	select {
	case a := <-f.queue:
		return a.c, a.err
	case <-f.closed:
		return nil, net.ErrClosed
	}
}

// emfile is the error net.TCPListener.Accept returns out of descriptors.
func emfile() error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

// fakeConn is a connection from a chosen remote address that counts its
// Closes.
type fakeConn struct {
	remote net.Addr
	closes atomic.Int64
}

func newFakeConn(remote net.Addr) *fakeConn { return &fakeConn{remote: remote} }

func (c *fakeConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (c *fakeConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *fakeConn) Close() error                     { c.closes.Add(1); return nil }
func (c *fakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443} }
func (c *fakeConn) RemoteAddr() net.Addr             { return c.remote }
func (c *fakeConn) SetDeadline(time.Time) error      { return nil }
func (c *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fakeConn) SetWriteDeadline(time.Time) error { return nil }

// tcpAddr returns the TCP address of ip, as net.ParseIP spells it (16
// bytes for an IPv4 address, as an accepted socket's is).
func tcpAddr(ip string) *net.TCPAddr {
	return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}
}
