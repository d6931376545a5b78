package h1

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/inferrail/inferrail/internal/testcert"
)

// With TLS, ALPN's http/1.1 is served here (the request knows its TLS
// state) and h2 by Fallback; a client that never finishes its handshake is
// cut at read_header_timeout.
func TestTLS(t *testing.T) {
	p := testcert.New(t, 1, "h1 test")
	pool := x509.NewCertPool()
	pool.AddCert(p.Cert)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s tls=%v", r.Proto, r.TLS != nil)
	})
	sc := &tls.Config{Certificates: []tls.Certificate{p.TLS}}
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
