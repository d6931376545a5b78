//go:build !linux

package netguard

import "net"

// acceptQueue: only Linux reports a listener's accept queue.
func acceptQueue(net.Listener) (AcceptQueue, bool) { return AcceptQueue{}, false }

// ReadListenDrops: only Linux reports listen drops (/proc/net/netstat).
func ReadListenDrops() (ListenDrops, error) { return ListenDrops{}, ErrNoListenDrops }
