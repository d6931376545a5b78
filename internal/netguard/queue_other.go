//go:build !linux

package netguard

import (
	"net"
	"net/netip"
)

// acceptQueue: only Linux reports a listener's accept queue.
func acceptQueue(net.Listener) (AcceptQueue, bool) { return AcceptQueue{}, false }

// ReadListenDrops: only Linux reports listen drops (/proc/net/netstat).
func ReadListenDrops() (ListenDrops, error) { return ListenDrops{}, ErrNoListenDrops }

// acceptFlooded is never called: flooded is false where the queue is not
// reported.
func (l *Listener) acceptFlooded() (net.Conn, netip.Addr, error) {
	return nil, netip.Addr{}, errNoRaw
}
