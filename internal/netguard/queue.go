package netguard

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// AcceptQueue is a listening socket's accept queue as the kernel reports
// it: connections whose handshake completed and that wait for Accept.
// When Len reaches Max the kernel drops new connections' SYNs, and each
// such client waits for its retransmission (1 s for the first), so a
// queue near its bound is a proxy that accepts slower than clients
// connect (a connection flood, or a starved process).
type AcceptQueue struct {
	// Len is the number of connections waiting for Accept.
	Len int
	// Max is the queue's bound: the listen backlog, capped by the
	// kernel's net.core.somaxconn.
	Max int
}

// AcceptQueue reports the wrapped listener's accept queue. It is false
// where the system does not report it (only Linux does, for TCP) or the
// listener is not a TCP one or is closed.
func (l *Listener) AcceptQueue() (AcceptQueue, bool) {
	return l.queue()
}

// ListenDrops are the kernel's counts of connections its listening
// sockets dropped, over the whole network namespace (in Kubernetes, the
// pod's): every listener's, not one's.
type ListenDrops struct {
	// Overflows counts those dropped because an accept queue was full
	// (TcpExt ListenOverflows).
	Overflows uint64
	// Drops counts every connection dropped at a listener, for a full
	// queue or any other reason (TcpExt ListenDrops).
	Drops uint64
}

// ErrNoListenDrops is returned by ReadListenDrops where the system does not
// report them.
var ErrNoListenDrops = errors.New("netguard: the system does not report listen drops")

// parseNetstat reads /proc/net/netstat's format: pairs of lines, the first
// naming a section's fields ("TcpExt: SyncookiesSent ... ListenOverflows
// ..."), the second giving their values in the same order.
func parseNetstat(r io.Reader) (ListenDrops, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var names []string
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "TcpExt:") {
			names = nil
			continue
		}
		fields := strings.Fields(line)[1:]
		if names == nil {
			names = fields
			continue
		}
		if len(fields) != len(names) {
			return ListenDrops{}, fmt.Errorf("netguard: netstat: TcpExt has %d names and %d values", len(names), len(fields))
		}
		var d ListenDrops
		var seen int
		for i, n := range names {
			var dst *uint64
			switch n {
			case "ListenOverflows":
				dst = &d.Overflows
			case "ListenDrops":
				dst = &d.Drops
			default:
				continue
			}
			v, err := strconv.ParseUint(fields[i], 10, 64)
			if err != nil {
				return ListenDrops{}, fmt.Errorf("netguard: netstat: TcpExt %s: %w", n, err)
			}
			*dst = v
			seen++
		}
		if seen != 2 {
			return ListenDrops{}, errors.New("netguard: netstat: TcpExt has no ListenOverflows or ListenDrops")
		}
		return d, nil
	}
	if err := sc.Err(); err != nil {
		return ListenDrops{}, fmt.Errorf("netguard: netstat: %w", err)
	}
	return ListenDrops{}, errors.New("netguard: netstat: no TcpExt values")
}
