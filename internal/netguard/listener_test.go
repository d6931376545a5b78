package netguard

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none: valid
	}{
		{"zero", Config{}, nil},
		{"caps", Config{MaxConns: 10, MaxConnsPerClient: 20}, nil},
		{"negative total", Config{MaxConns: -1}, []string{"MaxConns is -1: set it to a positive number, or to 0"}},
		{"negative per client", Config{MaxConnsPerClient: -3}, []string{"MaxConnsPerClient is -3: set it to a positive number, or to 0"}},
		{"both", Config{MaxConns: -1, MaxConnsPerClient: -1}, []string{"MaxConns is -1", "MaxConnsPerClient is -1"}},
		{"flood", Config{MaxConnsPerClient: 20, FloodConnsPerClient: 4}, nil},
		{"negative flood", Config{MaxConnsPerClient: 20, FloodConnsPerClient: -1}, []string{"FloodConnsPerClient is -1: set it to a positive number, or to 0 never to shed"}},
		{"flood without per-client counts", Config{FloodConnsPerClient: 4}, []string{"FloodConnsPerClient needs MaxConnsPerClient"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want an error wrapping ErrInvalidConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to contain %q", err, w)
				}
			}
			if _, err := NewListener(newFakeListener(true), tc.cfg); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("NewListener() = %v, want the Validate error", err)
			}
		})
	}
}

func TestNewListenerDerivesMaxConns(t *testing.T) {
	want, err := DefaultMaxConns()
	if err != nil {
		t.Skipf("no default here: %v", err)
	}
	l, err := NewListener(newFakeListener(true), Config{})
	if err != nil {
		t.Fatal(err)
	}
	if l.MaxConns() != want {
		t.Errorf("MaxConns() = %d, want DefaultMaxConns() = %d", l.MaxConns(), want)
	}
	if _, err := NewListener(nil, Config{MaxConns: 1}); err == nil {
		t.Error("NewListener(nil) succeeded")
	}
}

func TestMaxConnsForLimit(t *testing.T) {
	for _, tc := range []struct {
		limit uint64
		want  int // 0: an error
	}{
		{0, 0},
		{256, 0},
		{257, 0},
		{258, 1},
		{1024, 384},
		{65536, 32640},
		{1 << 20, 524160},
		{^uint64(0), 1<<29 - 128},
	} {
		got, err := maxConnsForLimit(tc.limit)
		if tc.want == 0 {
			if err == nil || !strings.Contains(err.Error(), "raise it to at least 258") {
				t.Errorf("maxConnsForLimit(%d) = %d, %v; want an error saying to raise the limit", tc.limit, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("maxConnsForLimit(%d) = %d, %v; want %d", tc.limit, got, err, tc.want)
		}
	}
}

// PerClientCap leaves other clients at least one slot and at least a
// tenth of them, and takes all the rest (a cap of 1 stays 1).
func TestPerClientCap(t *testing.T) {
	for _, tc := range []struct{ total, want int }{{1, 1}, {2, 1}, {9, 8}, {10, 9}, {20, 18}, {9890, 8901}} {
		if got := PerClientCap(tc.total); got != tc.want {
			t.Errorf("PerClientCap(%d) = %d, want %d", tc.total, got, tc.want)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		total := rapid.IntRange(2, 1<<29).Draw(t, "total")
		got := PerClientCap(total)
		if got < 1 || total-got < 1 || total-got < total/10 || total-got > total/10+1 {
			t.Fatalf("PerClientCap(%d) = %d", total, got)
		}
	})
}

func TestClientAddr(t *testing.T) {
	v4 := netip.MustParseAddr("192.0.2.1")
	v6 := netip.MustParseAddr("2001:db8::1")
	for _, tc := range []struct {
		addr net.Addr
		want netip.Addr
	}{
		{tcpAddr("192.0.2.1"), v4},
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1).To4(), Port: 1}, v4},
		{tcpAddr("::ffff:192.0.2.1"), v4},
		{tcpAddr("2001:db8::1"), v6},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0"}, netip.MustParseAddr("fe80::1")},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8::1"), Port: 53}, v6},
		{&net.IPAddr{IP: net.ParseIP("192.0.2.1")}, v4},
		{stringAddr("192.0.2.1:8080"), v4},
		{stringAddr("[::ffff:192.0.2.1]:8080"), v4},
		{stringAddr("2001:db8::1"), v6},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, netip.Addr{}},
		{stringAddr("pipe"), netip.Addr{}},
		{&net.TCPAddr{}, netip.Addr{}},
		{nil, netip.Addr{}},
	} {
		if got := ClientAddr(tc.addr); got != tc.want {
			t.Errorf("ClientAddr(%v) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

type stringAddr string

func (a stringAddr) Network() string { return "test" }
func (a stringAddr) String() string  { return string(a) }

// Connections over a cap are closed at once and counted by reason, and the
// forms of one IPv4 address count as one client.
func TestCapsByClient(t *testing.T) {
	inner := newFakeListener(true)
	type reject struct {
		reason Reason
		client netip.Addr
	}
	var rejects []reject
	l, err := NewListener(inner, Config{MaxConns: 3, MaxConnsPerClient: 2, OnReject: func(r Reason, c netip.Addr) {
		rejects = append(rejects, reject{r, c})
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct {
		addr   net.Addr
		accept bool
	}{
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1).To4()}, true},
		{tcpAddr("::ffff:192.0.2.1"), true},
		{tcpAddr("192.0.2.1"), false}, // its third: per client
		{tcpAddr("2001:db8::1"), true},
		{tcpAddr("2001:db8::2"), false}, // the fourth: in total
	} {
		fc := newFakeConn(step.addr)
		inner.push(fc)
		c, err := l.Accept()
		if step.accept {
			if err != nil || c == nil || c.RemoteAddr() != step.addr {
				t.Fatalf("step %d: Accept() = %v, %v; want the connection from %v", i, c, err, step.addr)
			}
			continue
		}
		if !errors.Is(err, errDrained) {
			t.Fatalf("step %d: Accept() = %v, %v; want it rejected", i, c, err)
		}
		if n := fc.closes.Load(); n != 1 {
			t.Fatalf("step %d: rejected connection closed %d times, want 1", i, n)
		}
	}
	want := []reject{
		{ReasonMaxConnsPerClient, netip.MustParseAddr("192.0.2.1")},
		{ReasonMaxConns, netip.MustParseAddr("2001:db8::2")},
	}
	if fmt.Sprint(rejects) != fmt.Sprint(want) {
		t.Errorf("OnReject calls %v, want %v", rejects, want)
	}
	s := l.Stats()
	if s.Open != 3 || s.Clients != 2 || s.Accepted != 3 || s.Rejected[ReasonMaxConns] != 1 || s.Rejected[ReasonMaxConnsPerClient] != 1 || s.AcceptErrors != 0 {
		t.Errorf("Stats() = %+v", s)
	}
}

// The cap per client holds on real TCP connections: the one too many is
// closed by the server (the client reads EOF), another address is served,
// and a closed connection's slot serves the next.
func TestPerClientCapTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewListener(ln, Config{MaxConns: 16, MaxConnsPerClient: 2})
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			held <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		close(held)
		for c := range held {
			c.Close()
		}
	})
	dial := func(t *testing.T, local string) (net.Conn, error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		if local != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
		}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}
	// greet returns nil if the server served c, io.EOF if it closed it.
	greet := func(c net.Conn) error {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.ReadFull(c, make([]byte, 2))
		return err
	}
	mustServe := func(t *testing.T, local string) net.Conn {
		t.Helper()
		c, err := dial(t, local)
		if err != nil {
			t.Fatal(err)
		}
		if err := greet(c); err != nil {
			t.Fatalf("connection from %q not served: %v", local, err)
		}
		return <-held
	}

	s1 := mustServe(t, "")
	mustServe(t, "")
	c3, err := dial(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := greet(c3); err != io.EOF {
		t.Fatalf("third connection from 127.0.0.1: read = %v, want EOF", err)
	}
	if s := l.Stats(); s.Open != 2 || s.Clients != 1 || s.Rejected[ReasonMaxConnsPerClient] != 1 {
		t.Fatalf("Stats() = %+v, want 2 open, 1 client, 1 rejected per client", s)
	}

	t.Run("another client", func(t *testing.T) {
		c, err := dial(t, "127.0.0.2")
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.2 here: %v", err)
		}
		if err := greet(c); err != nil {
			t.Fatalf("connection from 127.0.0.2 not served: %v", err)
		}
		<-held
		if s := l.Stats(); s.Open != 3 || s.Clients != 2 {
			t.Fatalf("Stats() = %+v, want 3 open from 2 clients", s)
		}
	})

	open := l.Stats().Open
	s1.Close()
	s1.Close()
	if s := l.Stats(); s.Open != open-1 {
		t.Fatalf("after closing one twice: %d open, want %d", s.Open, open-1)
	}
	mustServe(t, "")
	if s := l.Stats(); s.Rejected[ReasonMaxConnsPerClient] != 1 {
		t.Fatalf("Stats() = %+v, want still 1 rejected", s)
	}
}

// Closing a connection from many goroutines at once gives its slot back
// once.
func TestConnCloseOnce(t *testing.T) {
	inner := newFakeListener(true)
	l, err := NewListener(inner, Config{MaxConns: 2, MaxConnsPerClient: 1})
	if err != nil {
		t.Fatal(err)
	}
	accept := func(ip string) net.Conn {
		t.Helper()
		inner.push(newFakeConn(tcpAddr(ip)))
		c, err := l.Accept()
		if err != nil {
			t.Fatalf("Accept(%s): %v", ip, err)
		}
		return c
	}
	a := accept("192.0.2.1")
	accept("192.0.2.2")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { a.Close() })
	}
	wg.Wait()
	if s := l.Stats(); s.Open != 1 || s.Clients != 1 {
		t.Fatalf("Stats() = %+v, want 1 open from 1 client", s)
	}
	if n := a.(*conn).Conn.(*fakeConn).closes.Load(); n != 8 {
		t.Errorf("underlying Close called %d times, want 8 (each Close closes)", n)
	}
	accept("192.0.2.1")
	if s := l.Stats(); s.Open != 2 || s.Rejected[ReasonMaxConns] != 0 {
		t.Fatalf("Stats() = %+v, want 2 open and none rejected", s)
	}
}

// Whatever the order of accepts and closes, the open count never passes
// the caps, matches a model of them, and returns to zero.
func TestCapsProperty(t *testing.T) {
	addrs := []struct {
		addr net.Addr
		key  int // the client, -1 for none
	}{
		{tcpAddr("192.0.2.1"), 0},
		{&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1).To4()}, 0},
		{tcpAddr("::ffff:192.0.2.1"), 0},
		{tcpAddr("2001:db8::1"), 1},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Zone: "eth0"}, 1},
		{tcpAddr("198.51.100.7"), 2},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, -1},
	}
	rapid.Check(t, func(t *rapid.T) {
		maxConns := rapid.IntRange(1, 12).Draw(t, "maxConns")
		perClient := rapid.IntRange(0, 6).Draw(t, "perClient")
		flood := 0
		if perClient > 0 {
			flood = rapid.IntRange(0, 8).Draw(t, "flood")
		}
		inner := newFakeListener(true)
		reported := map[Reason]uint64{}
		var floods []FloodReport
		l, err := NewListener(inner, Config{MaxConns: maxConns, MaxConnsPerClient: perClient, FloodConnsPerClient: flood,
			OnReject: func(r Reason, _ netip.Addr) { reported[r]++ },
			OnFlood:  func(f FloodReport) { floods = append(floods, f) }})
		if err != nil {
			t.Fatal(err)
		}
		// The accept queue as the kernel would report it: flooded when
		// an eighth full or more.
		queue := AcceptQueue{Max: 16}
		l.queue = func() (AcceptQueue, bool) { return queue, true }
		now := time.Unix(0, 0) // moved by the "wait" action
		l.now = func() time.Time { return now }
		l.afterFunc = noTimer // a flood's end is found by the accepts
		var floodUntil time.Time
		// The floods the model expects reported: began, and over with
		// what they shed.
		var wantFloods []FloodReport
		var inFlood bool
		var floodFrom time.Time
		var floodShed uint64
		type held struct {
			c   net.Conn
			key int
		}
		var open []held
		var closed []net.Conn
		perKey := map[int]int{}
		rejected := map[Reason]uint64{ReasonMaxConns: 0, ReasonMaxConnsPerClient: 0, ReasonFlood: 0}
		var accepted uint64
		t.Repeat(map[string]func(*rapid.T){
			"accept": func(t *rapid.T) {
				a := addrs[rapid.IntRange(0, len(addrs)-1).Draw(t, "addr")]
				fc := newFakeConn(a.addr)
				inner.push(fc)
				c, err := l.Accept()
				var want Reason
				full := flood > 0 && 8*queue.Len >= queue.Max
				switch {
				case full && !inFlood:
					inFlood, floodFrom, floodShed = true, now, 0
					wantFloods = append(wantFloods, FloodReport{Began: true, Queue: queue})
				case flood > 0 && !full && inFlood && !now.Before(floodUntil):
					inFlood = false
					wantFloods = append(wantFloods, FloodReport{Queue: queue, Lasted: floodUntil.Sub(floodFrom), Shed: floodShed})
				}
				if full {
					floodUntil = now.Add(time.Second) // held a second
				}
				flooded := flood > 0 && (full || now.Before(floodUntil))
				switch {
				case len(open) >= maxConns:
					want = ReasonMaxConns
				case perClient > 0 && a.key >= 0 && perKey[a.key] >= perClient:
					want = ReasonMaxConnsPerClient
				case flooded && a.key >= 0 && perKey[a.key]*len(perKey) >= len(open) && (perKey[a.key] >= flood || 8*len(open) >= 7*maxConns):
					// a flood is shed by the clients that hold the
					// most: their share and the floor, or their share
					// alone with the table within an eighth of full
					want = ReasonFlood
				}
				if want == "" {
					if err != nil {
						t.Fatalf("Accept() from %v = %v, want a connection", a.addr, err)
					}
					open = append(open, held{c, a.key})
					if a.key >= 0 {
						perKey[a.key]++
					}
					accepted++
					return
				}
				if !errors.Is(err, errDrained) || fc.closes.Load() != 1 {
					t.Fatalf("Accept() from %v = %v, %v (closed %d times); want it rejected for %s", a.addr, c, err, fc.closes.Load(), want)
				}
				rejected[want]++
				if want == ReasonFlood {
					floodShed++
				}
			},
			"close": func(t *rapid.T) {
				if len(open) == 0 {
					t.Skip("nothing open")
				}
				i := rapid.IntRange(0, len(open)-1).Draw(t, "conn")
				h := open[i]
				open = append(open[:i], open[i+1:]...)
				if h.key >= 0 {
					if perKey[h.key]--; perKey[h.key] == 0 {
						delete(perKey, h.key)
					}
				}
				h.c.Close()
				closed = append(closed, h.c)
			},
			"queue": func(t *rapid.T) {
				queue.Len = rapid.IntRange(0, 16).Draw(t, "queued")
			},
			"wait": func(t *rapid.T) {
				now = now.Add(time.Duration(rapid.IntRange(1, 1500).Draw(t, "ms")) * time.Millisecond)
			},
			"close again": func(t *rapid.T) {
				if len(closed) == 0 {
					t.Skip("nothing closed")
				}
				closed[rapid.IntRange(0, len(closed)-1).Draw(t, "conn")].Close()
			},
			"": func(t *rapid.T) {
				s := l.Stats()
				if s.Open != len(open) || s.Open > maxConns {
					t.Fatalf("%d open, want %d (cap %d)", s.Open, len(open), maxConns)
				}
				if perClient > 0 && s.Clients != len(perKey) {
					t.Fatalf("%d clients, want %d", s.Clients, len(perKey))
				}
				for k, n := range perKey {
					if perClient > 0 && n > perClient {
						t.Fatalf("client %d has %d open, cap %d", k, n, perClient)
					}
				}
				if s.Accepted != accepted || fmt.Sprint(s.Rejected) != fmt.Sprint(rejected) || fmt.Sprint(reported) != fmt.Sprint(nonZero(rejected)) {
					t.Fatalf("Stats() = %+v, OnReject %v; want %d accepted, rejected %v", s, reported, accepted, rejected)
				}
				if len(floods) != len(wantFloods) {
					t.Fatalf("OnFlood told %+v, want %+v", floods, wantFloods)
				}
				for i, f := range floods {
					w := wantFloods[i]
					var top uint64
					for _, a := range f.Top {
						top += a.N
					}
					if f.Began != w.Began || f.Queue != w.Queue || f.Lasted != w.Lasted || f.Shed != w.Shed || top != f.Shed && len(f.Top) < floodTop {
						t.Fatalf("OnFlood told %+v, want %+v", f, w)
					}
				}
			},
		})
		for _, h := range open {
			h.c.Close()
		}
		if s := l.Stats(); s.Open != 0 || s.Clients != 0 {
			t.Fatalf("after closing all: Stats() = %+v", s)
		}
	})
}

func nonZero(m map[Reason]uint64) map[Reason]uint64 {
	out := map[Reason]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func TestNextBackoff(t *testing.T) {
	var got []time.Duration
	d := time.Duration(0)
	for range 11 {
		d = nextBackoff(d)
		got = append(got, d)
	}
	want := "[5ms 10ms 20ms 40ms 80ms 160ms 320ms 640ms 1s 1s 1s]"
	if fmt.Sprint(got) != want {
		t.Errorf("backoffs %v, want %s", got, want)
	}
}

func TestTemporary(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{emfile(), true},
		{&net.OpError{Op: "accept", Err: syscall.ENFILE}, true},
		{fmt.Errorf("wrapped: %w", syscall.ECONNABORTED), true},
		{syscall.EPROTO, true},
		{&net.OpError{Op: "accept", Err: net.ErrClosed}, false},
		{syscall.EBADF, false},
		{syscall.EINVAL, false},
		{errors.New("boom"), false},
		{temporaryError{}, true},
	} {
		if got := temporary(tc.err); got != tc.want {
			t.Errorf("temporary(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

type temporaryError struct{}

func (temporaryError) Error() string   { return "try again" }
func (temporaryError) Temporary() bool { return true }

// Runs of temporary errors are waited out, 5ms doubling to 1s, from 5ms
// again after each connection; each is reported and counted.
func TestAcceptBacksOff(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		runs := rapid.SliceOfN(rapid.IntRange(0, 12), 1, 4).Draw(t, "runs")
		rapid.SyncTest(t, func(t *rapid.T) {
			inner := newFakeListener(false)
			var reports []time.Time
			l, err := NewListener(inner, Config{MaxConns: 100, OnAcceptError: func(err error) {
				if !errors.Is(err, syscall.EMFILE) {
					t.Errorf("OnAcceptError(%v), want EMFILE", err)
				}
				reports = append(reports, time.Now())
			}})
			if err != nil {
				t.Fatal(err)
			}
			total := 0
			for _, n := range runs {
				for range n {
					inner.fail(emfile())
				}
				inner.push(newFakeConn(tcpAddr("192.0.2.1")))
				reports = reports[:0]
				start := time.Now()
				c, err := l.Accept()
				if err != nil {
					t.Fatalf("Accept() = %v after %d EMFILEs, want the connection", err, n)
				}
				c.Close()
				var want time.Duration
				for i := range n {
					if got := reports[i].Sub(start); got != want {
						t.Fatalf("error %d of %d reported at %v, want %v", i+1, n, got, want)
					}
					want += min(5*time.Millisecond<<i, time.Second)
				}
				if got := time.Since(start); got != want || len(reports) != n {
					t.Fatalf("Accept took %v and reported %d errors; want %v and %d", got, len(reports), want, n)
				}
				total += n
			}
			if s := l.Stats(); s.AcceptErrors != uint64(total) {
				t.Fatalf("AcceptErrors = %d, want %d", s.AcceptErrors, total)
			}
			l.Close()
		})
	})
}

func TestAcceptReturnsOtherErrors(t *testing.T) {
	inner := newFakeListener(true)
	boom := errors.New("boom")
	inner.fail(boom)
	l, err := NewListener(inner, Config{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Accept(); err != boom {
		t.Fatalf("Accept() = %v, want %v", err, boom)
	}
	if s := l.Stats(); s.AcceptErrors != 0 {
		t.Errorf("AcceptErrors = %d, want 0", s.AcceptErrors)
	}
}

// Close ends a wait in Accept at once.
func TestCloseEndsBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := newFakeListener(false)
		for range 20 {
			inner.fail(emfile())
		}
		l, err := NewListener(inner, Config{MaxConns: 1})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		errc := make(chan error)
		go func() {
			_, err := l.Accept()
			errc <- err
		}()
		time.Sleep(2500 * time.Millisecond)
		l.Close()
		err = <-errc
		if !errors.Is(err, net.ErrClosed) || time.Since(start) != 2500*time.Millisecond {
			t.Fatalf("Accept() = %v after %v; want net.ErrClosed after 2.5s", err, time.Since(start))
		}
	})
}

// http.Server.Serve keeps serving through EMFILE: the errors never reach
// it (it would log "http: Accept error"), and a request after them is
// answered.
func TestServeThroughEMFILE(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := newFakeListener(false)
		for range 6 {
			inner.fail(emfile())
		}
		var reported int
		l, err := NewListener(inner, Config{MaxConns: 4, OnAcceptError: func(error) { reported++ }})
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		srv := &http.Server{
			Handler:  http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
			ErrorLog: log.New(&logs, "", 0),
		}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()

		client, server := net.Pipe()
		inner.push(server)
		io.WriteString(client, "GET /health HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(client), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		client.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "ok" {
			t.Fatalf("GET /health = %d %q, want 200 ok", resp.StatusCode, body)
		}
		synctest.Wait()
		select {
		case err := <-served:
			t.Fatalf("Serve returned %v", err)
		default:
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-served; err != http.ErrServerClosed {
			t.Fatalf("Serve() = %v, want http.ErrServerClosed", err)
		}
		if reported != 6 || l.Stats().AcceptErrors != 6 || l.Stats().Open != 0 {
			t.Errorf("reported %d, Stats() = %+v; want 6 errors and none open", reported, l.Stats())
		}
		if logs.Len() != 0 {
			t.Errorf("http.Server logged %q", logs.String())
		}
	})
}

// TestFloodReports: OnFlood is told when a flood begins, and when the
// first accept after its hold finds it over: how long it lasted, what it
// shed and from whom.
func TestFloodReports(t *testing.T) {
	inner := newFakeListener(true)
	var floods []FloodReport
	l, err := NewListener(inner, Config{MaxConns: 64, MaxConnsPerClient: 10, FloodConnsPerClient: 2,
		OnFlood: func(f FloodReport) { floods = append(floods, f) }})
	if err != nil {
		t.Fatal(err)
	}
	queue := AcceptQueue{Len: 2, Max: 16} // an eighth: flooded
	l.queue = func() (AcceptQueue, bool) { return queue, true }
	now := time.Unix(100, 0)
	l.now = func() time.Time { return now }
	l.afterFunc = noTimer // the accepts find the end (TestFloodOverWithoutConnections: the timer)
	accept := func(addr string) error { return acceptFrom(l, inner, addr) }
	heavy, light := "192.0.2.1", "198.51.100.7"
	for i, want := range []bool{true, true, false, false, false} { // the floor of 2, then shed
		if err := accept(heavy); (err == nil) != want {
			t.Fatalf("heavy connection %d: Accept() = %v, want served %v", i, err, want)
		}
	}
	if err := accept(light); err != nil {
		t.Fatalf("light connection in the flood: %v", err)
	}
	if len(floods) != 1 || !floods[0].Began || floods[0].Queue != queue {
		t.Fatalf("OnFlood told %+v, want one report that a flood began with the queue at %+v", floods, queue)
	}
	queue.Len = 0
	now = now.Add(500 * time.Millisecond) // within the hold: heavy still shed
	if err := accept(heavy); err == nil {
		t.Fatal("heavy connection served within the flood's hold")
	}
	now = now.Add(600 * time.Millisecond) // the hold is over
	if err := accept(heavy); err != nil {
		t.Fatalf("heavy connection after the flood: %v", err)
	}
	want := FloodReport{Queue: queue, Lasted: time.Second, Shed: 4, Top: []AddrCount{{netip.MustParseAddr(heavy), 4}}}
	if len(floods) != 2 || fmt.Sprint(floods[1]) != fmt.Sprint(want) {
		t.Fatalf("OnFlood told %+v, want the flood over as %+v", floods, want)
	}
}

func TestTopShed(t *testing.T) {
	a, b, c, d := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.4")
	got := topShed(map[netip.Addr]uint64{a: 5, b: 9, c: 5, d: 1}, 3)
	want := []AddrCount{{b, 9}, {a, 5}, {c, 5}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("topShed = %v, want %v", got, want)
	}
	if got := topShed(nil, 3); len(got) != 0 {
		t.Fatalf("topShed(nil) = %v", got)
	}
}

// noTimer stands for time.AfterFunc where a test's clock is its own.
func noTimer(time.Duration, func()) func() { return func() {} }

// TestFloodOverWithoutConnections: a flood is reported over a second after
// the queue was last seen an eighth full even when no connection comes,
// and nothing is reported after Close.
func TestFloodOverWithoutConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := newFakeListener(false)
		var mu sync.Mutex
		var floods []FloodReport
		l, err := NewListener(inner, Config{MaxConns: 64, MaxConnsPerClient: 10, FloodConnsPerClient: 1,
			OnFlood: func(f FloodReport) { mu.Lock(); floods = append(floods, f); mu.Unlock() }})
		if err != nil {
			t.Fatal(err)
		}
		var qmu sync.Mutex
		queue := AcceptQueue{Len: 4, Max: 16}
		l.queue = func() (AcceptQueue, bool) { qmu.Lock(); defer qmu.Unlock(); return queue, true }
		reports := func() []FloodReport { mu.Lock(); defer mu.Unlock(); return slices.Clone(floods) }
		go func() { // holds what it accepts: the first counts toward the floor
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				held = append(held, c)
			}
		}()
		inner.push(newFakeConn(tcpAddr("192.0.2.1")))
		inner.push(newFakeConn(tcpAddr("192.0.2.1"))) // shed
		synctest.Wait()
		if r := reports(); len(r) != 1 || !r[0].Began {
			t.Fatalf("OnFlood told %+v, want a flood begun", r)
		}
		began := time.Now()
		qmu.Lock()
		queue.Len = 0
		qmu.Unlock()
		time.Sleep(900 * time.Millisecond)
		synctest.Wait()
		if r := reports(); len(r) != 1 {
			t.Fatalf("OnFlood told %+v within the hold", r)
		}
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		r := reports()
		if len(r) != 2 || r[1].Began || r[1].Shed != 1 || r[1].Lasted != time.Second {
			t.Fatalf("OnFlood told %+v %v after the queue emptied; want the flood over, 1 shed, lasted 1s", r, time.Since(began))
		}
		// Another flood, then Close within it: no report after.
		qmu.Lock()
		queue.Len = 4
		qmu.Unlock()
		inner.push(newFakeConn(tcpAddr("192.0.2.1")))
		synctest.Wait()
		if r := reports(); len(r) != 3 || !r[2].Began {
			t.Fatalf("OnFlood told %+v, want a second flood begun", r)
		}
		l.Close()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if r := reports(); len(r) != 3 {
			t.Fatalf("OnFlood told %+v after Close", r)
		}
	})
}

// TestFloodNearFull: in a flood from addresses that each hold fewer than
// the floor, those at their share are shed once the connections are within
// an eighth of MaxConns, so a client holding none (a probe) still gets in.
func TestFloodNearFull(t *testing.T) {
	inner := newFakeListener(true)
	l, err := NewListener(inner, Config{MaxConns: 16, MaxConnsPerClient: 10, FloodConnsPerClient: 256})
	if err != nil {
		t.Fatal(err)
	}
	l.queue = func() (AcceptQueue, bool) { return AcceptQueue{Len: 100, Max: 128}, true }
	l.afterFunc = noTimer
	accept := func(addr string) error { return acceptFrom(l, inner, addr) }
	attackers := []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"}
	for i := range 14 { // up to 7/8 of MaxConns: under the floor, served
		if err := accept(attackers[i%3]); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	if err := accept(attackers[0]); err == nil { // 5 of 14 open: its share
		t.Fatal("an address at its share served with the connections within an eighth of the cap")
	}
	if err := accept(attackers[2]); err != nil { // 4 of 14: under its share
		t.Fatalf("an address under its share: %v", err)
	}
	if err := accept("198.51.100.7"); err != nil {
		t.Fatalf("a probe holding no connection: %v", err)
	}
	if s := l.Stats(); s.Open != 16 || s.Rejected[ReasonFlood] != 1 {
		t.Fatalf("Stats() = %+v, want 16 open and 1 shed", s)
	}
}

// acceptFrom queues a connection from addr on inner and accepts through l:
// nil when l served it, an error when it closed it (inner drains).
func acceptFrom(l *Listener, inner *fakeListener, addr string) error {
	inner.push(newFakeConn(tcpAddr(addr)))
	_, err := l.Accept()
	return err
}
