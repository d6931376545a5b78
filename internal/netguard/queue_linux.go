package netguard

import (
	"fmt"
	"net"
	"os"

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
