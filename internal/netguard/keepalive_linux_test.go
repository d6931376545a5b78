package netguard

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"
)

// sockopt reads an integer socket option of c.
func sockopt(t *testing.T, c net.Conn, level, opt int) int {
	t.Helper()
	rc, err := c.(interface {
		SyscallConn() (syscall.RawConn, error)
	}).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	if err := rc.Control(func(fd uintptr) { v, serr = syscall.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return v
}

// TestKeepAliveOnAdmitted: a listener from Listen accepts connections
// without TCP keep-alive, and the Listener sets Config.KeepAlive on those
// it admits (net.Listen's own 15 s by default in live).
func TestKeepAliveOnAdmitted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		keepAlive net.KeepAliveConfig
		want      int // SO_KEEPALIVE
		idle      int // TCP_KEEPIDLE, seconds, when on
	}{
		{"off", net.KeepAliveConfig{}, 0, 0},
		{"on", net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second}, 1, 15},
		{"idle 40s", net.KeepAliveConfig{Enable: true, Idle: 40 * time.Second}, 1, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := Listen(context.Background(), "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			l, err := NewListener(ln, Config{MaxConns: 4, KeepAlive: tc.keepAlive})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			client, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			c, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			inner := c.(*conn).Conn
			if got := sockopt(t, inner, syscall.SOL_SOCKET, syscall.SO_KEEPALIVE); got != tc.want {
				t.Fatalf("SO_KEEPALIVE = %d, want %d", got, tc.want)
			}
			if tc.want == 1 {
				if got := sockopt(t, inner, syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE); got != tc.idle {
					t.Fatalf("TCP_KEEPIDLE = %d, want %d", got, tc.idle)
				}
			}
		})
	}
}
