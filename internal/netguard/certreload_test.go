package netguard

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inferrail/inferrail/internal/testcert"
)

// newTestPair is a self-signed certificate for localhost and 127.0.0.1.
func newTestPair(t *testing.T, serial int64) testcert.Pair {
	return testcert.New(t, serial, "netguard test")
}

// certFiles are a certificate and key file in a test's directory.
type certFiles struct {
	dir, cert, key string
	mtime          time.Time // of the last write; each write moves it on
}

func newCertFiles(t *testing.T) *certFiles {
	dir := t.TempDir()
	return &certFiles{dir: dir, cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"), mtime: time.Unix(1700000000, 0)}
}

// write replaces a file as certificate tools do (a new file renamed over
// the old), with a modification time an hour past the last write's: two
// writes within the file system's clock tick stay distinct.
func (f *certFiles) write(t *testing.T, name string, data []byte) {
	t.Helper()
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f.mtime = f.mtime.Add(time.Hour)
	if err := os.Chtimes(tmp, f.mtime, f.mtime); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
}

func (f *certFiles) writePair(t *testing.T, p testcert.Pair) {
	t.Helper()
	f.write(t, f.key, p.KeyPEM)
	f.write(t, f.cert, p.CertPEM)
}

func serialOf(c *tls.Certificate) int64 { return c.Leaf.SerialNumber.Int64() }

func TestNewCertReloaderErrors(t *testing.T) {
	p1, p2 := newTestPair(t, 1), newTestPair(t, 2)
	for _, tc := range []struct {
		name      string
		cert, key []byte // nil: no file
		want      []string
	}{
		{"no cert file", nil, p1.KeyPEM, []string{"read certificate file", "tls.crt", "no such file"}},
		{"no key file", p1.CertPEM, nil, []string{"read key file", "tls.key", "no such file"}},
		{"swapped", p1.KeyPEM, p1.CertPEM, []string{"certificate file", "tls.crt", "no PEM CERTIFICATE block", "swapped"}},
		{"key not PEM", p1.CertPEM, []byte("not a key\n"), []string{"key file", "tls.key", "no PEM PRIVATE KEY block"}},
		{"empty cert", []byte{}, p1.KeyPEM, []string{"certificate file", "tls.crt", "no PEM CERTIFICATE block"}},
		{"another key", p1.CertPEM, p2.KeyPEM, []string{"tls.crt", "tls.key", "private key does not match public key"}},
		{"broken certificate", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}), p1.KeyPEM, []string{"tls.crt", "tls.key", "x509"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newCertFiles(t)
			if tc.cert != nil {
				f.write(t, f.cert, tc.cert)
			}
			if tc.key != nil {
				f.write(t, f.key, tc.key)
			}
			r, err := NewCertReloader(CertConfig{CertFile: f.cert, KeyFile: f.key})
			if err == nil {
				t.Fatalf("NewCertReloader() = %v, want an error", r)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if _, err := NewCertReloader(CertConfig{CertFile: "x.crt"}); err == nil || !strings.Contains(err.Error(), "KeyFile") {
		t.Errorf("NewCertReloader without a key file = %v", err)
	}
}

// manualClock is a clock a test moves.
type manualClock struct{ ns atomic.Int64 }

func (c *manualClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *manualClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// A real TLS handshake on 127.0.0.1 sees a swapped certificate once a
// second has passed, and not before.
func TestCertReloaderHandshake(t *testing.T) {
	p1, p2 := newTestPair(t, 1), newTestPair(t, 2)
	f := newCertFiles(t)
	f.writePair(t, p1)
	clock := &manualClock{}
	var reloads atomic.Int64
	r, err := newCertReloader(CertConfig{CertFile: f.cert, KeyFile: f.key, OnReload: func(*x509.Certificate) { reloads.Add(1) }}, clock.now)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := tls.NewListener(ln, r.Config())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if c.(*tls.Conn).Handshake() == nil {
					c.Read(make([]byte, 1)) // until the client closes
				}
			})
		}
	})
	t.Cleanup(func() {
		tl.Close()
		wg.Wait()
	})
	roots := x509.NewCertPool()
	roots.AddCert(p1.Cert)
	roots.AddCert(p2.Cert)
	handshake := func(t *testing.T, cfg *tls.Config) (tls.ConnectionState, error) {
		t.Helper()
		d := &net.Dialer{Timeout: 10 * time.Second}
		c, err := tls.DialWithDialer(d, "tcp", ln.Addr().String(), cfg)
		if err != nil {
			return tls.ConnectionState{}, err
		}
		defer c.Close()
		return c.ConnectionState(), nil
	}
	client := &tls.Config{RootCAs: roots, NextProtos: []string{"h2", "http/1.1"}}
	serial := func(t *testing.T) int64 {
		t.Helper()
		st, err := handshake(t, client)
		if err != nil {
			t.Fatal(err)
		}
		if st.NegotiatedProtocol != "h2" || st.Version < tls.VersionTLS12 {
			t.Fatalf("negotiated %q over %s, want h2 over TLS 1.2 or later", st.NegotiatedProtocol, tls.VersionName(st.Version))
		}
		return st.PeerCertificates[0].SerialNumber.Int64()
	}

	if got := serial(t); got != 1 {
		t.Fatalf("first handshake: serial %d, want 1", got)
	}
	f.writePair(t, p2)
	clock.advance(999 * time.Millisecond)
	if got := serial(t); got != 1 {
		t.Fatalf("within a second of the last look: serial %d, want still 1", got)
	}
	clock.advance(time.Millisecond)
	if got := serial(t); got != 2 {
		t.Fatalf("a second on: serial %d, want 2", got)
	}
	if n := reloads.Load(); n != 1 {
		t.Errorf("OnReload called %d times, want 1", n)
	}
	if _, err := handshake(t, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}); err == nil {
		t.Error("a TLS 1.1 client completed a handshake")
	}
}

// A pair that does not load keeps the one before and is reported once per
// change; a good pair after it is served.
func TestCertReloaderBadPair(t *testing.T) {
	p1, p2, p3 := newTestPair(t, 1), newTestPair(t, 2), newTestPair(t, 3)
	synctest.Test(t, func(t *testing.T) {
		f := newCertFiles(t)
		f.writePair(t, p1)
		var errs []error
		var reloaded []int64
		r, err := NewCertReloader(CertConfig{
			CertFile: f.cert, KeyFile: f.key,
			OnError:  func(err error) { errs = append(errs, err) },
			OnReload: func(leaf *x509.Certificate) { reloaded = append(reloaded, leaf.SerialNumber.Int64()) },
		})
		if err != nil {
			t.Fatal(err)
		}
		// serve waits out the rate limit and handshakes a few times.
		serve := func() int64 {
			time.Sleep(certCheckInterval)
			var serial int64
			for range 3 {
				c, err := r.GetCertificate(&tls.ClientHelloInfo{})
				if err != nil {
					t.Fatal(err)
				}
				serial = serialOf(c)
			}
			return serial
		}
		steps := []struct {
			name   string
			change func()
			serial int64
			errs   int
			want   string // in the last error
		}{
			{"unchanged", func() {}, 1, 0, ""},
			{"garbage key", func() { f.write(t, f.key, []byte("garbage")) }, 1, 1, "key file " + f.key + " has no PEM PRIVATE KEY block (keeping the certificate loaded before)"},
			{"still garbage", func() {}, 1, 1, ""},
			{"key of another", func() { f.write(t, f.key, p2.KeyPEM) }, 1, 2, "private key does not match"},
			{"cert removed", func() { os.Remove(f.cert) }, 1, 3, "read certificate file"},
			{"still removed", func() {}, 1, 3, ""},
			{"its cert too", func() { f.write(t, f.cert, p2.CertPEM) }, 2, 3, ""},
			{"a new pair", func() { f.writePair(t, p3) }, 3, 3, ""},
		}
		for _, s := range steps {
			s.change()
			if got := serve(); got != s.serial || len(errs) != s.errs {
				t.Fatalf("%s: serial %d and %d errors (%v), want %d and %d", s.name, got, len(errs), errs, s.serial, s.errs)
			}
			if s.want != "" && !strings.Contains(errs[len(errs)-1].Error(), s.want) {
				t.Fatalf("%s: error %q, want it to say %q", s.name, errs[len(errs)-1], s.want)
			}
		}
		if len(reloaded) != 2 || reloaded[0] != 2 || reloaded[1] != 3 {
			t.Errorf("OnReload got serials %v, want [2 3]", reloaded)
		}
	})
}

// The files are looked at once a second at most, however many handshakes.
func TestCertReloaderLooksOncePerSecond(t *testing.T) {
	p1, p2 := newTestPair(t, 1), newTestPair(t, 2)
	synctest.Test(t, func(t *testing.T) {
		f := newCertFiles(t)
		f.writePair(t, p1)
		r, err := NewCertReloader(CertConfig{CertFile: f.cert, KeyFile: f.key})
		if err != nil {
			t.Fatal(err)
		}
		get := func() int64 {
			c, _ := r.GetCertificate(nil)
			return serialOf(c)
		}
		time.Sleep(1500 * time.Millisecond)
		get() // looks, and finds nothing new
		f.writePair(t, p2)
		time.Sleep(999 * time.Millisecond)
		if got := get(); got != 1 {
			t.Fatalf("0.999s after a look: serial %d, want 1", got)
		}
		time.Sleep(time.Millisecond)
		if got := get(); got != 2 {
			t.Fatalf("1s after a look: serial %d, want 2", got)
		}
	})
}

func TestCertReloaderReload(t *testing.T) {
	p1, p2 := newTestPair(t, 1), newTestPair(t, 2)
	f := newCertFiles(t)
	f.writePair(t, p1)
	var onError int
	r, err := newCertReloader(CertConfig{CertFile: f.cert, KeyFile: f.key, OnError: func(error) { onError++ }}, (&manualClock{}).now)
	if err != nil {
		t.Fatal(err)
	}
	f.write(t, f.cert, []byte("junk"))
	if err := r.Reload(); err == nil || !strings.Contains(err.Error(), f.cert) {
		t.Fatalf("Reload() = %v, want an error naming %s", err, f.cert)
	}
	if got := serialOf(r.Certificate()); got != 1 || onError != 0 {
		t.Fatalf("after a failed Reload: serial %d, OnError called %d times; want 1 and 0", got, onError)
	}
	f.writePair(t, p2)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := serialOf(r.Certificate()); got != 2 {
		t.Fatalf("after Reload: serial %d, want 2", got)
	}
}

// Handshakes racing with swaps always get a whole pair (run with -race).
func TestCertReloaderConcurrent(t *testing.T) {
	pairs := []testcert.Pair{newTestPair(t, 1), newTestPair(t, 2)}
	f := newCertFiles(t)
	f.writePair(t, pairs[0])
	clock := &manualClock{}
	r, err := newCertReloader(CertConfig{CertFile: f.cert, KeyFile: f.key, OnError: func(error) {}}, clock.now)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				clock.advance(100 * time.Millisecond)
				c, err := r.GetCertificate(nil)
				if err != nil || c == nil || c.PrivateKey == nil {
					bad.Add(1)
					continue
				}
				if s := serialOf(c); s != 1 && s != 2 {
					bad.Add(1)
				}
			}
		})
	}
	for i := range 20 {
		f.writePair(t, pairs[i%2])
		if i%5 == 0 {
			r.Reload()
		}
	}
	close(stop)
	wg.Wait()
	if n := bad.Load(); n != 0 {
		t.Fatalf("%d handshakes got a bad certificate", n)
	}
	if err := r.Reload(); err != nil || serialOf(r.Certificate()) != 2 {
		t.Fatalf("final Reload() = %v, serial %d; want 2", err, serialOf(r.Certificate()))
	}
}

// A pair published as Kubernetes publishes a secret (files behind a
// ..data symlink swapped by a rename) is picked up.
func TestCertReloaderSymlinkSwap(t *testing.T) {
	p1, p2 := newTestPair(t, 1), newTestPair(t, 2)
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		publish := func(version string, p testcert.Pair) {
			if err := os.Mkdir(filepath.Join(dir, version), 0o700); err != nil {
				t.Fatal(err)
			}
			for name, data := range map[string][]byte{"tls.crt": p.CertPEM, "tls.key": p.KeyPEM} {
				if err := os.WriteFile(filepath.Join(dir, version, name), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			tmp := filepath.Join(dir, "..data_tmp")
			if err := os.Symlink(version, tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
		}
		publish("..v1", p1)
		for _, name := range []string{"tls.crt", "tls.key"} {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		r, err := NewCertReloader(CertConfig{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")})
		if err != nil {
			t.Fatal(err)
		}
		publish("..v2", p2)
		if err := os.RemoveAll(filepath.Join(dir, "..v1")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(certCheckInterval)
		c, _ := r.GetCertificate(nil)
		if got := serialOf(c); got != 2 {
			t.Fatalf("after the swap: serial %d, want 2", got)
		}
	})
}
