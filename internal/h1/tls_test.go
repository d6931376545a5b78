package h1

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"testing"
	"time"
)

// selfSigned is a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "h1 test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// With TLS, ALPN's http/1.1 is served here (the request knows its TLS
// state) and h2 by Fallback; a client that never finishes its handshake is
// cut at read_header_timeout.
func TestTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s tls=%v", r.Proto, r.TLS != nil)
	})
	sc := &tls.Config{Certificates: []tls.Certificate{cert}}
	fb := sc.Clone()
	fb.NextProtos = []string{"h2", "http/1.1"}
	_, addr := start(t, Config{Handler: h, TLSConfig: sc, Fallback: &http.Server{Handler: h, TLSConfig: fb}, ReadHeaderTimeout: 300 * time.Millisecond, ErrorLog: quiet()})
	var h1only, h2only http.Protocols
	h1only.SetHTTP1(true)
	h2only.SetHTTP2(true)
	for _, tc := range []struct {
		protos *http.Protocols
		want   string
	}{
		{&h1only, "HTTP/1.1 tls=true"},
		{&h2only, "HTTP/2.0 tls=true"},
	} {
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Protocols: tc.protos, TLSClientConfig: &tls.Config{RootCAs: pool}}}
		for range 2 {
			resp, err := client.Get("https://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != tc.want {
				t.Fatalf("%q, want %q", b, tc.want)
			}
		}
	}
	c, br := dial(t, addr)
	began := time.Now()
	if !closed(c, br) {
		t.Fatal("a connection that never starts its handshake was kept")
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Fatalf("closed after %v", d)
	}
}
