package live

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/internal/testcert"
	"github.com/inferrail/inferrail/live/config"
)

// startServing runs s.Serve on c's addresses (port 0) until the test ends,
// and returns the client and admin base URLs.
func startServing(t *testing.T, c *config.Config) (*Server, string, string, func()) {
	t.Helper()
	c.Listen, c.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	s, err := New(c, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, nil) }()
	var ca, aa net.Addr
	waitUntil(t, "listening", 2*time.Second, func() bool { ca, aa = s.Addrs(); return ca != nil && aa != nil })
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		s.Close()
	}
	scheme := "http://"
	if c.TLS.Enabled() {
		scheme = "https://"
	}
	return s, scheme + ca.String(), "http://" + aa.String(), stop
}

// 3: connections past max_connections_per_client are closed at accept
// while the admin listener's /readyz keeps answering; stalled bodies are
// cut at read_timeout, so the connections come back.
func TestServeConnectionCaps(t *testing.T) {
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.MaxConnectionsPerClient = 4
	c.ReadTimeout = 300 * time.Millisecond
	c.DrainDelay = 0
	_, base, admin, stop := startServing(t, c)
	defer stop()
	var conns []net.Conn
	for range 4 {
		cn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(cn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\": \"")
		conns = append(conns, cn)
	}
	time.Sleep(50 * time.Millisecond)
	extra, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	extra.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := extra.Read(make([]byte, 1)); err != io.EOF || n != 0 {
		t.Fatalf("the connection over the per-client cap was not closed: %d, %v", n, err)
	}
	resp, err := http.Get(admin + "/readyz")
	if err != nil {
		t.Fatalf("admin /readyz silent while the client listener is full: %v", err)
	}
	resp.Body.Close()
	// The stalled bodies time out (408) and free their connections.
	for _, cn := range conns {
		cn.SetReadDeadline(time.Now().Add(3 * time.Second))
		b, _ := io.ReadAll(cn)
		if !strings.Contains(string(b), " 408 ") {
			t.Fatalf("a stalled body got %q", b)
		}
		cn.Close()
	}
	waitUntil(t, "a new connection served", 2*time.Second, func() bool {
		resp, err := http.Get(base + "/livez")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// With max_connections_per_client at its default, one address flooding
// the client listener takes at most nine tenths of max_connections: the
// client port's /readyz still answers a probe from another address.
func TestServeOneAddressNeverTakesEverySlot(t *testing.T) {
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.MaxConnections = 20
	c.DrainDelay = 0
	_, base, _, stop := startServing(t, c)
	defer stop()
	attacker := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: time.Second}
	var held []net.Conn
	defer func() {
		for _, cn := range held {
			cn.Close()
		}
	}()
	for range 25 {
		cn, err := attacker.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatalf("dial from 127.0.0.2 (the loopback network is 127/8): %v", err)
		}
		io.WriteString(cn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
		held = append(held, cn)
	}
	var open atomic.Int64
	var wg sync.WaitGroup
	for _, cn := range held { // a connection over a cap is closed at once
		wg.Go(func() {
			cn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			var ne net.Error
			if _, err := cn.Read(make([]byte, 1)); errors.As(err, &ne) && ne.Timeout() {
				open.Add(1)
			}
		})
	}
	wg.Wait()
	if n := open.Load(); n != 18 { // 20 less a tenth
		t.Fatalf("one address holds %d connections of max_connections 20, want 18", n)
	}
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second} // as the kubelet probes
	for i := range 5 {
		resp, err := probe.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("probe %d from 127.0.0.1 while 127.0.0.2 floods: %v", i, err)
		}
		resp.Body.Close()
	}
}

// Draining: readiness fails first, running streams finish.
func TestServeDrains(t *testing.T) {
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.DrainDelay = 300 * time.Millisecond
	s, base, _, stop := startServing(t, c)
	waitUntil(t, "ready", 2*time.Second, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	waitUntil(t, "not ready while draining", time.Second, func() bool { return s.draining.Load() })
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatalf("stopped accepting before drain_delay: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("readyz %d while draining", resp.StatusCode)
	}
	<-stopped
}

// TLS on the client listener, with a certificate picked up again when its
// files change; the admin port wants its bearer token.
func TestServeTLSAndAdminToken(t *testing.T) {
	dir := t.TempDir()
	pool := x509.NewCertPool()
	writeCert := func(cn string) {
		p := testcert.New(t, time.Now().UnixNano(), cn)
		pool.AddCert(p.Cert)
		os.WriteFile(filepath.Join(dir, "cert.pem"), p.CertPEM, 0o600)
		os.WriteFile(filepath.Join(dir, "key.pem"), p.KeyPEM, 0o600)
	}
	writeCert("first")
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("0123456789abcdef0123\n"), 0o600)
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.TLS = config.TLS{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
	c.AdminTokenFile = token
	c.DrainDelay = 0
	_, base, admin, stop := startServing(t, c)
	defer stop()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
	served := func() string {
		resp, err := client.Get(base + "/livez")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].Subject.CommonName
	}
	if cn := served(); cn != "first" {
		t.Fatalf("served %q", cn)
	}
	time.Sleep(1100 * time.Millisecond) // the reloader looks at most once a second
	writeCert("second")
	waitUntil(t, "the new certificate served", 3*time.Second, func() bool { return served() == "second" })

	for tok, want := range map[string]int{"": 401, "Bearer wrong-token-wrong-token": 401, "Bearer 0123456789abcdef0123": 200} {
		req, _ := http.NewRequest(http.MethodGet, admin+"/metrics", nil)
		if tok != "" {
			req.Header.Set("Authorization", tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("admin /metrics with %q: %d, want %d", tok, resp.StatusCode, want)
		}
	}
	resp, err := http.Get(admin + "/readyz")
	if err != nil || resp.StatusCode == 401 {
		t.Fatalf("readyz needs no token: %v %v", resp, err)
	}
	resp.Body.Close()
	if resp, _ := http.Get(admin + "/debug/pprof/"); resp.StatusCode != 404 {
		t.Fatalf("pprof served without pprof: true (%d)", resp.StatusCode)
	}
}

// Without TLS the client listener serves HTTP/1.1 with h1's loop and hands
// h2c connections (prior knowledge) to net/http's server: both generate.
func TestServeHTTP1AndH2C(t *testing.T) {
	c := testConfig(t, newUpstream(t, server.Config{Engine: testEngineConfig()}))
	c.DrainDelay = 0
	_, base, _, stop := startServing(t, c)
	defer stop()
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	for _, tc := range []struct {
		name   string
		client *http.Client
		proto  int
	}{
		{"http/1.1", &http.Client{Timeout: 10 * time.Second}, 1},
		{"h2c", &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Protocols: &h2c}}, 2},
	} {
		for range 2 { // a second request on the same connection
			resp, err := tc.client.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "hello there", "max_tokens": 4, "stream": true}`))
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.ProtoMajor != tc.proto || !strings.Contains(string(b), "data: [DONE]") {
				t.Fatalf("%s: %s %d, %q", tc.name, resp.Proto, resp.StatusCode, b)
			}
		}
	}
}
