// Package pipenet is an in-memory network for tests: listeners whose
// connections are net.Pipe pairs, so HTTP servers and clients (engines, the
// proxy, the load generator) run inside a testing/synctest bubble, where
// time is virtual and the network costs nothing.
//
// A Listener serves one address and dials itself; a Network routes dials to
// listeners by address.
package pipenet

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// Listener is a net.Listener over net.Pipe connections.
type Listener struct {
	addr   string
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

// Listen returns a listener for addr (used only in Addr).
func Listen(addr string) *Listener {
	return &Listener{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

// Accept waits for the next connection.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close stops Accept; later dials fail.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr returns a TCP-shaped address (clients print it, nothing dials it).
func (l *Listener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80} }

// Dial connects to l whatever the address: an http.Transport's DialContext.
func (l *Listener) Dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.closed:
		c.Close()
		s.Close()
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: fmt.Errorf("connection refused: %s", l.addr)}
	case <-ctx.Done():
		c.Close()
		s.Close()
		return nil, ctx.Err()
	}
}

// Network routes dials to listeners by address.
type Network struct {
	mu  sync.Mutex
	lns map[string]*Listener
}

// Listen registers a listener for addr ("host:port", as URLs name it).
func (n *Network) Listen(addr string) *Listener {
	l := Listen(addr)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lns == nil {
		n.lns = map[string]*Listener{}
	}
	n.lns[addr] = l
	return l
}

// Dial connects to the listener of addr: an http.Transport's DialContext.
func (n *Network) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.lns[addr]
	n.mu.Unlock()
	if l == nil {
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: fmt.Errorf("connection refused: %s", addr)}
	}
	return l.Dial(ctx, network, addr)
}
