package netguard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ErrInvalidConfig is wrapped by every error of Config.Validate.
var ErrInvalidConfig = errors.New("netguard: invalid config")

// Accept backs off from temporary errors as net/http's Server.Serve does:
// the first wait is minBackoff, each next one twice the last, up to
// maxBackoff; an accepted connection starts over.
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = time.Second
)

// Reason names the cap a rejected connection would have passed. Its value
// suits a metric label.
type Reason string

// The reasons a connection is rejected.
const (
	// ReasonMaxConns: Config.MaxConns connections were open.
	ReasonMaxConns Reason = "max_conns"
	// ReasonMaxConnsPerClient: Config.MaxConnsPerClient connections from
	// the same client were open.
	ReasonMaxConnsPerClient Reason = "max_conns_per_client"
	// ReasonFlood: the listener was flooded (its accept queue an eighth
	// full or more, or within a second of it) and the client held at
	// least its share of the open connections, and either
	// Config.FloodConnsPerClient of them or more, or any number with the
	// open ones within an eighth of MaxConns.
	ReasonFlood Reason = "flood"
)

// Config configures a Listener. The zero value caps connections at
// DefaultMaxConns in total and not per client.
type Config struct {
	// MaxConns caps the connections open at once, over every client; 0
	// derives it from the open-file limit (DefaultMaxConns). A connection
	// counts from Accept until its Close.
	MaxConns int
	// MaxConnsPerClient caps the connections open at once from one client
	// (one key of ClientKey); 0 leaves clients capped by MaxConns only.
	// Behind a load balancer or a NAT many clients share one address.
	MaxConnsPerClient int
	// FloodConnsPerClient sheds a connection flood by its source. While
	// the kernel's accept queue is an eighth full or more, and for a
	// second after (connections arrive faster than the process takes
	// them, and once the queue is full the kernel drops every client's
	// SYNs alike, a probe's included, each then retried a second later),
	// connections are taken off the queue bare, up to 64 at a time, and
	// one is closed before Go wraps it if its client already holds
	// FloodConnsPerClient connections or more and at least its share of
	// the open ones (their number over the clients'), or that share alone
	// once the open connections are within an eighth of MaxConns (a flood
	// from many addresses, each under the floor). Closing one costs a
	// fraction of serving it, so the queue drains, and the clients that
	// hold few are served meanwhile. 0 never sheds. It needs MaxConnsPerClient (the per-client counts); the
	// queue is read where the system reports it (Linux), and elsewhere
	// nothing is shed.
	FloodConnsPerClient int
	// OnFlood, if non-nil, is called when a flood begins
	// (FloodConnsPerClient: the accept queue seen an eighth full or more)
	// and when it is over (a second after the queue was last seen so), on
	// an accepting goroutine or a timer's; never after Close.
	OnFlood func(FloodReport)
	// ClientKey maps a connection's remote address to the client it counts
	// for; nil means ClientAddr. A connection whose key is the zero
	// netip.Addr counts toward MaxConns only.
	ClientKey func(remote net.Addr) netip.Addr
	// OnReject, if non-nil, is called on the accepting goroutine after a
	// connection over a cap was closed, with the cap and the client.
	OnReject func(reason Reason, client netip.Addr)
	// OnAcceptError, if non-nil, is called on the accepting goroutine with
	// each temporary accept error (such as EMFILE, "too many open files"),
	// before Accept waits and tries again.
	OnAcceptError func(err error)
	// KeepAlive, when Enable is set, is applied to each admitted TCP
	// connection. Open the wrapped listener with Listen (TCP keep-alive
	// off at accept) so that a connection over a cap is closed without
	// the four setsockopt calls Go's listener would spend on it first.
	KeepAlive net.KeepAliveConfig
}

// Validate reports every problem with c, each wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	if c.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("%w: MaxConns is %d: set it to a positive number, or to 0 to derive it from the open-file limit", ErrInvalidConfig, c.MaxConns))
	}
	if c.MaxConnsPerClient < 0 {
		errs = append(errs, fmt.Errorf("%w: MaxConnsPerClient is %d: set it to a positive number, or to 0 to cap clients by MaxConns only", ErrInvalidConfig, c.MaxConnsPerClient))
	}
	switch {
	case c.FloodConnsPerClient < 0:
		errs = append(errs, fmt.Errorf("%w: FloodConnsPerClient is %d: set it to a positive number, or to 0 never to shed", ErrInvalidConfig, c.FloodConnsPerClient))
	case c.FloodConnsPerClient > 0 && c.MaxConnsPerClient == 0:
		errs = append(errs, fmt.Errorf("%w: FloodConnsPerClient needs MaxConnsPerClient (the per-client counts): set it, or FloodConnsPerClient to 0", ErrInvalidConfig))
	}
	return errors.Join(errs...)
}

// Stats is a snapshot of a Listener's counters.
type Stats struct {
	// Open is the number of connections accepted and not yet closed.
	Open int
	// Clients is the number of clients with an open connection; it is
	// counted only with a per-client cap, and is 0 without one.
	Clients int
	// Accepted counts the connections Accept returned.
	Accepted uint64
	// Rejected counts the connections closed at once, by the cap they
	// would have passed; it holds every Reason, 0 or not.
	Rejected map[Reason]uint64
	// AcceptErrors counts the temporary errors Accept backed off from.
	AcceptErrors uint64
}

// Listener is a net.Listener that caps its open connections in total and
// per client. A connection over a cap is accepted and closed at once, so
// the kernel's backlog keeps moving; temporary accept errors are waited out
// rather than returned. Accept, Close, Stats and the connections' Close are
// safe for concurrent use.
type Listener struct {
	inner         net.Listener
	maxConns      int
	perClient     int
	clientKey     func(net.Addr) netip.Addr
	onReject      func(Reason, netip.Addr)
	onAcceptError func(error)
	keepAlive     net.KeepAliveConfig
	flood         int
	queue         func() (AcceptQueue, bool) // the accept queue, acceptQueue's
	now           func() time.Time
	afterFunc     func(time.Duration, func()) func() // time.AfterFunc, returning its Stop
	onFlood       func(FloodReport)

	// fmu guards the flood in course, if any: when its hold ends, when it
	// began and what it shed.
	fmu       sync.Mutex
	floodEnd  time.Time
	floodFrom time.Time
	floodShed map[netip.Addr]uint64
	floodStop func() // stops the timer that ends the flood
	closed    bool

	closeOnce sync.Once
	done      chan struct{}

	mu      sync.Mutex
	open    int
	clients map[netip.Addr]int // open connections per client, with a per-client cap

	accepted          atomic.Uint64
	rejectedTotal     atomic.Uint64
	rejectedPerClient atomic.Uint64
	rejectedFlood     atomic.Uint64
	acceptErrors      atomic.Uint64
}

var _ net.Listener = (*Listener)(nil)

// NewListener wraps inner with the caps of cfg. It fails if cfg is invalid,
// or if cfg.MaxConns is 0 and the open-file limit cannot give a default.
func NewListener(inner net.Listener, cfg Config) (*Listener, error) {
	if inner == nil {
		return nil, errors.New("netguard: nil listener")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxConns == 0 {
		n, err := DefaultMaxConns()
		if err != nil {
			return nil, fmt.Errorf("netguard: MaxConns is 0 and cannot be derived (set it): %w", err)
		}
		cfg.MaxConns = n
	}
	if cfg.ClientKey == nil {
		cfg.ClientKey = ClientAddr
	}
	l := &Listener{
		inner:         inner,
		maxConns:      cfg.MaxConns,
		perClient:     cfg.MaxConnsPerClient,
		clientKey:     cfg.ClientKey,
		onReject:      cfg.OnReject,
		onAcceptError: cfg.OnAcceptError,
		keepAlive:     cfg.KeepAlive,
		flood:         cfg.FloodConnsPerClient,
		queue:         func() (AcceptQueue, bool) { return acceptQueue(inner) },
		now:           time.Now,
		afterFunc: func(d time.Duration, f func()) func() {
			t := time.AfterFunc(d, f)
			return func() { t.Stop() }
		},
		onFlood: cfg.OnFlood,
		done:    make(chan struct{}),
	}
	if l.perClient > 0 {
		l.clients = make(map[netip.Addr]int)
	}
	return l, nil
}

// Accept returns the next connection within the caps. It closes those over
// a cap, and those a flood sheds (Config.FloodConnsPerClient: taken off the
// queue bare, in batches, by acceptFlooded), and waits out temporary
// errors (5ms, doubling to 1s), reporting each through the callbacks; it
// returns only other errors, and an error wrapping net.ErrClosed once
// Close was called during a wait.
func (l *Listener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		var c net.Conn
		var err error
		var key netip.Addr // the client, needed only with a per-client cap or to report
		flooded, raw := l.flooded(), false
		if flooded {
			// Connections arrive faster than they are taken: each is
			// accepted bare, and closed before Go wraps it if it is
			// shed or over a cap (acceptFlooded).
			c, key, err = l.acceptFlooded()
			switch {
			case err == errQueueEmpty, err == errNoRaw:
				// taken through Go, admitted as flooded
			case err == nil && c == nil:
				continue
			default:
				raw = true
			}
		}
		if !raw {
			c, err = l.inner.Accept()
		}
		if err != nil {
			if !temporary(err) {
				return nil, err
			}
			l.acceptErrors.Add(1)
			if l.onAcceptError != nil {
				l.onAcceptError(err)
			}
			delay = nextBackoff(delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return nil, &net.OpError{Op: "accept", Net: l.inner.Addr().Network(), Addr: l.inner.Addr(), Err: net.ErrClosed}
			}
			continue
		}
		delay = 0
		if !raw { // acceptFlooded admitted its own
			if l.clients != nil {
				key = l.clientKey(c.RemoteAddr())
			}
			if reason, ok := l.admit(key, flooded); !ok {
				if l.clients == nil {
					key = l.clientKey(c.RemoteAddr())
				}
				l.rejected(reason, key)
				c.Close()
				continue
			}
		}
		l.accepted.Add(1)
		if tc, ok := c.(*net.TCPConn); ok && l.keepAlive.Enable {
			// Best effort, as net.Listen's own keep-alive: a
			// connection that cannot take it is served without.
			_ = tc.SetKeepAliveConfig(l.keepAlive)
		}
		return &conn{Conn: c, l: l, key: key}, nil
	}
}

// Listen opens a TCP listener on address ("tcp", "tcp4" or "tcp6" network)
// whose accepted connections come without TCP keep-alive, for NewListener
// to set it (Config.KeepAlive) on the connections it admits only.
func Listen(ctx context.Context, network, address string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	return lc.Listen(ctx, network, address)
}

// acceptFlooded's errors that say to accept through the wrapped listener:
// no connection was queued, or the listener has no descriptor to accept
// from itself.
var (
	errQueueEmpty = errors.New("netguard: no connection queued")
	errNoRaw      = errors.New("netguard: no descriptor to accept from")
)

// rejected counts a connection closed at accept, and reports it.
func (l *Listener) rejected(reason Reason, key netip.Addr) {
	switch reason {
	case ReasonMaxConns:
		l.rejectedTotal.Add(1)
	case ReasonFlood:
		l.rejectedFlood.Add(1)
		l.fmu.Lock()
		if l.floodShed != nil {
			k := key
			if _, ok := l.floodShed[k]; !ok && len(l.floodShed) >= floodAddrs {
				k = netip.Addr{}
			}
			l.floodShed[k]++
		}
		l.fmu.Unlock()
	default:
		l.rejectedPerClient.Add(1)
	}
	if l.onReject != nil {
		l.onReject(reason, key)
	}
}

// floodHold is how long a flood is taken to last after the accept queue
// was last seen an eighth full: without it the flood's source would be
// served again the moment the queue drained, in a burst whose handling
// keeps the acceptor from the queue while it fills again.
const floodHold = time.Second

// flooded reports whether new connections are shed by their source
// (Config.FloodConnsPerClient): the accept queue is an eighth full or
// more, or was within floodHold.
func (l *Listener) flooded() bool {
	if l.flood == 0 {
		return false
	}
	now := l.now()
	q, ok := l.queue()
	full := ok && q.Max > 0 && 8*q.Len >= q.Max
	l.fmu.Lock()
	if l.closed {
		l.fmu.Unlock()
		return false
	}
	var report *FloodReport
	switch {
	case full && l.floodShed == nil: // a flood begins
		l.floodFrom, l.floodShed = now, map[netip.Addr]uint64{}
		report = &FloodReport{Began: true, Queue: q}
		l.floodStop = l.afterFunc(floodHold, l.watchFlood)
	case !full && l.floodShed != nil && !now.Before(l.floodEnd): // it is over
		report = &FloodReport{Queue: q, Lasted: l.floodEnd.Sub(l.floodFrom), Top: topShed(l.floodShed, floodTop)}
		for _, n := range l.floodShed {
			report.Shed += n
		}
		l.floodShed = nil
	}
	if full {
		l.floodEnd = now.Add(floodHold)
	}
	flooded := l.floodShed != nil
	l.fmu.Unlock()
	if report != nil && l.onFlood != nil {
		l.onFlood(*report)
	}
	return flooded
}

// watchFlood ends a flood whose hold is over even when no connection comes
// to notice it, and waits for the end of the hold again while it lasts.
func (l *Listener) watchFlood() {
	l.flooded()
	l.fmu.Lock()
	defer l.fmu.Unlock()
	if l.floodShed != nil && !l.closed {
		l.floodStop = l.afterFunc(max(l.floodEnd.Sub(l.now()), time.Millisecond), l.watchFlood)
	}
}

// floodTop is how many of the addresses a flood shed the most its report
// names; floodAddrs bounds the addresses it counts one by one (a flood
// from more is counted, past them, under the zero Addr).
const (
	floodTop   = 3
	floodAddrs = 1024
)

// FloodReport is what Config.OnFlood is told.
type FloodReport struct {
	// Began is true when the flood begins, false when it is over.
	Began bool
	// Queue is the accept queue when the report was made.
	Queue AcceptQueue
	// Lasted is how long the flood lasted: from the queue first seen an
	// eighth full to the end of its hold (a second after it was last).
	Lasted time.Duration
	// Shed counts the connections the flood shed (ReasonFlood).
	Shed uint64
	// Top are the addresses it shed the most connections of, most first
	// (at most three; the zero Addr counts the addresses past the first
	// 1,024).
	Top []AddrCount
}

// AddrCount is a client and a count.
type AddrCount struct {
	Addr netip.Addr
	N    uint64
}

// topShed returns the k addresses of m with the largest counts, largest
// first (ties by address).
func topShed(m map[netip.Addr]uint64, k int) []AddrCount {
	all := make([]AddrCount, 0, len(m))
	for a, n := range m {
		all = append(all, AddrCount{a, n})
	}
	slices.SortFunc(all, func(x, y AddrCount) int {
		if x.N != y.N {
			return cmp.Compare(y.N, x.N)
		}
		return x.Addr.Compare(y.Addr)
	})
	return all[:min(k, len(all))]
}

// admit takes a slot for a connection of client key, or says which cap
// leaves none; flooded sheds the clients that hold the most
// (Config.FloodConnsPerClient).
func (l *Listener) admit(key netip.Addr, flooded bool) (Reason, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open >= l.maxConns {
		return ReasonMaxConns, false
	}
	if l.clients != nil && key.IsValid() {
		n := l.clients[key]
		if n >= l.perClient {
			return ReasonMaxConnsPerClient, false
		}
		// In a flood, a client holding at least its share is shed once it
		// holds the floor, or at any count once the connections are
		// within an eighth of MaxConns: a flood from many addresses,
		// each under the floor, then leaves that eighth to the clients
		// that hold less than their share (a probe holds none).
		if flooded && n*len(l.clients) >= l.open && (n >= l.flood || 8*l.open >= 7*l.maxConns) {
			return ReasonFlood, false
		}
		l.clients[key] = n + 1
	}
	l.open++
	return "", true
}

// release gives back the slot admit took for key.
func (l *Listener) release(key netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.clients != nil && key.IsValid() {
		if n := l.clients[key] - 1; n > 0 {
			l.clients[key] = n
		} else {
			delete(l.clients, key)
		}
	}
}

// Close closes the wrapped listener and ends a wait in Accept. Connections
// already accepted stay open.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	l.fmu.Lock()
	l.closed = true
	if l.floodStop != nil {
		l.floodStop()
	}
	l.fmu.Unlock()
	return l.inner.Close()
}

// Addr returns the wrapped listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// MaxConns returns the total cap in force: Config.MaxConns, or the one
// derived from the open-file limit.
func (l *Listener) MaxConns() int { return l.maxConns }

// Stats returns the listener's counters.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	open, clients := l.open, len(l.clients)
	l.mu.Unlock()
	return Stats{
		Open:     open,
		Clients:  clients,
		Accepted: l.accepted.Load(),
		Rejected: map[Reason]uint64{
			ReasonMaxConns:          l.rejectedTotal.Load(),
			ReasonMaxConnsPerClient: l.rejectedPerClient.Load(),
			ReasonFlood:             l.rejectedFlood.Load(),
		},
		AcceptErrors: l.acceptErrors.Load(),
	}
}

// conn is an accepted connection holding a slot until its first Close.
type conn struct {
	net.Conn
	l      *Listener
	key    netip.Addr
	closed atomic.Bool
}

// Close closes the connection and, the first time, gives its slot back
// (after the descriptor is released).
func (c *conn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.l.release(c.key)
	}
	return err
}

// ClientAddr is the default Config.ClientKey: the remote IP of a TCP, UDP
// or IP address, or of any address whose String is "ip" or "ip:port", with
// an IPv4-mapped IPv6 address turned into its IPv4 one and the IPv6 zone
// dropped. Other addresses (Unix sockets, pipes) give the zero Addr.
func ClientAddr(remote net.Addr) netip.Addr {
	var ip netip.Addr
	switch a := remote.(type) {
	case nil:
		return netip.Addr{}
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case *net.UDPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case *net.IPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		s := remote.String()
		if ap, err := netip.ParseAddrPort(s); err == nil {
			ip = ap.Addr()
		} else if a, err := netip.ParseAddr(s); err == nil {
			ip = a
		}
	}
	return ip.Unmap().WithZone("")
}

// nextBackoff returns the wait after one of d (0 before the first).
func nextBackoff(d time.Duration) time.Duration {
	if d == 0 {
		return minBackoff
	}
	return min(2*d, maxBackoff)
}

// temporary reports whether an accept error is worth waiting out: the
// errnos of temporaryErrnos (running out of descriptors or buffers, and the
// network errors accept(2) passes on from a connection that already
// failed), or any error that says it is temporary, as net/http asks.
func temporary(err error) bool {
	for _, e := range temporaryErrnos {
		if errors.Is(err, e) {
			return true
		}
	}
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}
