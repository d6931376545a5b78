package live

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// eppTLS is the TLS configuration the picker serves ext_proc with
// (epp.secure_serving): epp.tls's files, re-read when they change, else a
// certificate made now and signed by its own key, as the reference picker
// does (gateways do not verify it). what says which, for the log.
func (s *Server) eppTLS() (tc *tls.Config, what string, err error) {
	if t := s.cfg.EPP.TLS; t.Enabled() {
		tc, err := s.certFiles("epp", t)
		if err != nil {
			return nil, "", fmt.Errorf("live: epp.tls: %w", err)
		}
		return tc, "files", nil
	}
	cert, err := selfSigned(time.Now())
	if err != nil {
		return nil, "", fmt.Errorf("live: epp: a self-signed certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, "self-signed", nil
}

// selfSigned makes a P-256 certificate signed by its own key, valid from
// an hour before now for ten years, for the host's name, localhost and
// the loopback addresses.
func selfSigned(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	names := []string{"localhost"}
	if h, err := os.Hostname(); err == nil && h != "" && h != "localhost" {
		names = append(names, h)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "inferrail-epp", Organization: []string{"inferrail"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              names,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
