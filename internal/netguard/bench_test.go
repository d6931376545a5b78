package netguard

import (
	"context"
	"net"
	"net/netip"
	"testing"
)

// loopListener returns the same connection from every Accept: the cost of
// a wrapper over it is the wrapper's alone.
type loopListener struct{ c net.Conn }

func (l loopListener) Accept() (net.Conn, error) { return l.c, nil }
func (l loopListener) Close() error              { return nil }
func (l loopListener) Addr() net.Addr            { return l.c.LocalAddr() }

// BenchmarkAcceptClose measures one Accept and its connection's Close,
// through the wrapper and without it: over a listener that costs nothing
// (the wrapper's own overhead), and over TCP on 127.0.0.1 (where the
// client's dial is in the loop too).
func BenchmarkAcceptClose(b *testing.B) {
	guards := []struct {
		name string
		cfg  *Config // nil: the bare listener
	}{
		{"bare", nil},
		{"total", &Config{MaxConns: 1 << 20}},
		{"per-client", &Config{MaxConns: 1 << 20, MaxConnsPerClient: 1024}},
		{"per-client+flood", &Config{MaxConns: 1 << 20, MaxConnsPerClient: 1024, FloodConnsPerClient: 256}},
	}
	wrap := func(b *testing.B, ln net.Listener, cfg *Config) net.Listener {
		if cfg == nil {
			return ln
		}
		l, err := NewListener(ln, *cfg)
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	for _, g := range guards {
		b.Run("fake/"+g.name, func(b *testing.B) {
			ln := wrap(b, loopListener{newFakeConn(tcpAddr("192.0.2.1"))}, g.cfg)
			b.ReportAllocs()
			for b.Loop() {
				c, err := ln.Accept()
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
	for _, g := range guards {
		b.Run("tcp/"+g.name, func(b *testing.B) {
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			ln := wrap(b, raw, g.cfg)
			defer ln.Close()
			addr := raw.Addr().String()
			b.ReportAllocs()
			for b.Loop() {
				client, err := net.Dial("tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				c, err := ln.Accept()
				if err != nil {
					b.Fatal(err)
				}
				// The client resets its end first: no TIME_WAIT is left
				// to tie up the machine's ports.
				client.(*net.TCPConn).SetLinger(0)
				client.Close()
				c.Close()
			}
		})
	}
}

// BenchmarkRejectTCP measures a connection over the cap over TCP on
// 127.0.0.1, from the client's dial to the Listener's close of it: on a
// listener from net.Listen (keep-alive set on every accepted connection
// by Go) and from Listen (keep-alive left to the admitted ones).
func BenchmarkRejectTCP(b *testing.B) {
	for _, lc := range []struct {
		name   string
		listen func() (net.Listener, error)
	}{
		{"net.Listen", func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }},
		{"netguard.Listen", func() (net.Listener, error) { return Listen(context.Background(), "tcp", "127.0.0.1:0") }},
	} {
		b.Run(lc.name, func(b *testing.B) {
			raw, err := lc.listen()
			if err != nil {
				b.Fatal(err)
			}
			rejected := make(chan struct{}, 1)
			l, err := NewListener(raw, Config{MaxConns: 1, KeepAlive: net.KeepAliveConfig{Enable: true},
				OnReject: func(Reason, netip.Addr) { rejected <- struct{}{} }})
			if err != nil {
				b.Fatal(err)
			}
			addr := raw.Addr().String()
			held, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			first, err := l.Accept() // takes the only slot
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan struct{})
			go func() { // every later connection is over the cap: Accept returns at Close
				defer close(done)
				l.Accept()
			}()
			b.ReportAllocs()
			for b.Loop() {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				<-rejected
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
			b.StopTimer()
			l.Close()
			<-done
			first.Close()
			held.Close()
		})
	}
}
