package live

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/inferrail/inferrail/engine/server"
	"github.com/inferrail/inferrail/internal/testcert"
	"github.com/inferrail/inferrail/live/config"
)

// servePicker runs the picker of c until the test ends and returns it and
// its ext_proc address.
func servePicker(t *testing.T, c *config.Config) (*Server, net.Addr) {
	t.Helper()
	s, err := New(c, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeEPP(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("ServeEPP did not return within 10s")
		}
		s.Close()
	})
	var addr net.Addr
	waitUntil(t, "the picker to listen", 5*time.Second, func() bool { addr, _ = s.Addrs(); return addr != nil })
	return s, addr
}

// healthOver asks the picker at addr for its health with creds.
func healthOver(t *testing.T, addr net.Addr, creds credentials.TransportCredentials) (healthpb.HealthCheckResponse_ServingStatus, *x509.Certificate, error) {
	t.Helper()
	var peer *x509.Certificate
	if creds.Info().SecurityProtocol == "tls" {
		creds = &peerCreds{TransportCredentials: creds, seen: &peer}
	}
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: extProcPb.ExternalProcessor_ServiceDesc.ServiceName})
	if err != nil {
		return 0, peer, err
	}
	return r.Status, peer, nil
}

// peerCreds notes the server certificate of each handshake.
type peerCreds struct {
	credentials.TransportCredentials
	seen **x509.Certificate
}

func (p *peerCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, info, err := p.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if ti, ok := info.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
		*p.seen = ti.State.PeerCertificates[0]
	}
	return c, info, err
}

// The picker serves ext_proc over TLS by default, with a certificate it
// signs itself, as gateways expect (they connect with TLS and do not
// verify); with epp.tls its files, read again when they change; with
// secure_serving false, h2c.
func TestEPPServesTLS(t *testing.T) {
	up := newUpstream(t, server.Config{Engine: testEngineConfig()})
	skipVerify := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})

	t.Run("self-signed", func(t *testing.T) {
		c := eppConfig(t, up)
		c.EPP.SecureServing = true
		s, addr := servePicker(t, c)
		waitUntil(t, "SERVING over TLS", 5*time.Second, func() bool {
			st, _, err := healthOver(t, addr, skipVerify)
			return err == nil && st == healthpb.HealthCheckResponse_SERVING
		})
		// A whole request through "Envoy" over TLS, as kgateway and Envoy
		// AI Gateway connect (no verification).
		conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(skipVerify))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		e := &testEPP{Server: s, client: extProcPb.NewExternalProcessorClient(conn)}
		if b := e.open(t, envoyReq{path: "/v1/completions", body: completionBody("", words(1, 10), 2, false)}).serve(); len(b) == 0 {
			t.Fatal("no answer relayed through the picker over TLS")
		}
		_, cert, _ := healthOver(t, addr, skipVerify)
		if cert == nil || cert.Subject.CommonName != "inferrail-epp" || cert.NotAfter.Before(time.Now().AddDate(9, 0, 0)) {
			t.Fatalf("served certificate %+v; want inferrail-epp, valid for years", cert)
		}
		if _, _, err := healthOver(t, addr, insecure.NewCredentials()); err == nil {
			t.Fatal("a plaintext h2c client was answered by a TLS picker")
		}
	})

	t.Run("files", func(t *testing.T) {
		dir := t.TempDir()
		certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		write := func(p testcert.Pair) {
			// The key first: a reload between the writes sees the old pair
			// fail and keeps the one it has.
			if err := os.WriteFile(keyFile, p.KeyPEM, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(certFile, p.CertPEM, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		one := testcert.New(t, 1, "epp-one")
		write(one)
		c := eppConfig(t, up)
		c.EPP.SecureServing = true
		c.EPP.TLS.CertFile, c.EPP.TLS.KeyFile = certFile, keyFile
		_, addr := servePicker(t, c)
		pool := x509.NewCertPool()
		pool.AddCert(one.Cert)
		verified := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost"})
		waitUntil(t, "SERVING over verified TLS", 5*time.Second, func() bool {
			st, _, err := healthOver(t, addr, verified)
			return err == nil && st == healthpb.HealthCheckResponse_SERVING
		})
		two := testcert.New(t, 2, "epp-two")
		write(two)
		waitUntil(t, "the new certificate served", 10*time.Second, func() bool {
			_, cert, err := healthOver(t, addr, skipVerify)
			return err == nil && cert != nil && cert.SerialNumber.Int64() == 2
		})
	})

	t.Run("h2c", func(t *testing.T) {
		c := eppConfig(t, up) // secure_serving: false
		_, addr := servePicker(t, c)
		waitUntil(t, "SERVING over h2c", 5*time.Second, func() bool {
			st, _, err := healthOver(t, addr, insecure.NewCredentials())
			return err == nil && st == healthpb.HealthCheckResponse_SERVING
		})
	})
}
