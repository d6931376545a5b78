package netguard

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// acceptQueue reads a TCP listener's accept queue with getsockopt
// TCP_INFO: for a listening socket Linux reports the queue's length in
// tcpi_unacked and its bound in tcpi_sacked (what ss shows as Recv-Q and
// Send-Q).
func acceptQueue(ln net.Listener) (AcceptQueue, bool) {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return AcceptQueue{}, false
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return AcceptQueue{}, false
	}
	var info *unix.TCPInfo
	var gerr error
	if err := rc.Control(func(fd uintptr) { info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || gerr != nil {
		return AcceptQueue{}, false
	}
	if info.State != unix.BPF_TCP_LISTEN {
		return AcceptQueue{}, false
	}
	return AcceptQueue{Len: int(info.Unacked), Max: int(info.Sacked)}, true
}

// ReadListenDrops reads the network namespace's listen drops from
// /proc/net/netstat.
func ReadListenDrops() (ListenDrops, error) {
	f, err := os.Open("/proc/net/netstat")
	if err != nil {
		return ListenDrops{}, fmt.Errorf("%w: %w", ErrNoListenDrops, err)
	}
	defer f.Close()
	return parseNetstat(f)
}

// acceptFlooded takes connections off the queue with accept4(2) alone,
// up to floodBatch at a time, and admits them as a flooded listener does
// (Config.FloodConnsPerClient): one shed or over a cap is closed at once,
// before Go would set its socket options and register it with the
// poller; the first admitted becomes a net.Conn (net.FileConn: a few
// system calls more than Go's own accept, paid by the connections served
// while a flood lasts) and is returned. A batch that sheds every one
// returns nil with the last client. It returns errQueueEmpty, without
// waiting, when no connection is left queued (Go lets a listener's raw
// descriptor be used, not waited on), and errNoRaw for a listener without
// a descriptor.
func (l *Listener) acceptFlooded() (net.Conn, netip.Addr, error) {
	sc, ok := l.inner.(syscall.Conn)
	if !ok {
		return nil, netip.Addr{}, errNoRaw
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, netip.Addr{}, errNoRaw
	}
	// Up to floodBatch connections in one go: those shed are closed as
	// they come, and the first admitted one ends the batch.
	nfd := -1
	var key netip.Addr
	var aerr error
	empty := false
	if err := rc.Control(func(fd uintptr) {
		for range floodBatch {
			var sa unix.Sockaddr
			nfd, sa, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			if aerr == unix.EAGAIN {
				empty = true
				return
			}
			if aerr != nil {
				if nfd >= 0 { // accepted, but its address did not convert
					unix.Close(nfd)
					nfd = -1
				}
				return
			}
			key = netip.Addr{}
			if l.clients != nil {
				key = l.clientKey(sockaddrTCP(sa))
			}
			reason, ok := l.admit(key, true)
			if ok {
				return
			}
			unix.Close(nfd)
			nfd = -1
			if l.clients == nil {
				key = l.clientKey(sockaddrTCP(sa))
			}
			l.rejected(reason, key)
		}
	}); err != nil {
		return nil, netip.Addr{}, &net.OpError{Op: "accept", Net: l.inner.Addr().Network(), Addr: l.inner.Addr(), Err: err}
	}
	switch {
	case aerr != nil && !empty:
		return nil, netip.Addr{}, &net.OpError{Op: "accept", Net: l.inner.Addr().Network(), Addr: l.inner.Addr(), Err: os.NewSyscallError("accept4", aerr)}
	case nfd < 0 && empty:
		return nil, netip.Addr{}, errQueueEmpty
	case nfd < 0: // a whole batch shed
		return nil, key, nil
	}
	f := os.NewFile(uintptr(nfd), "")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil { // such as EMFILE for the duplicate descriptor: waited out
		l.release(key)
		return nil, netip.Addr{}, &net.OpError{Op: "accept", Net: l.inner.Addr().Network(), Addr: l.inner.Addr(), Err: err}
	}
	return c, key, nil
}

// floodBatch bounds the connections acceptFlooded takes off the queue at a
// time: its queue reading and its setup are paid once for them all.
const floodBatch = 64

// sockaddrTCP is accept4's peer address as a *net.TCPAddr (nil for another
// family).
func sockaddrTCP(sa unix.Sockaddr) net.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]).To16(), Port: a.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	}
	return nil
}
