package netguard

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// certCheckInterval is the least time between two looks at the files.
const certCheckInterval = time.Second

// CertConfig names a certificate and key pair for a CertReloader.
type CertConfig struct {
	// CertFile is the PEM certificate: the leaf first, then its chain.
	CertFile string
	// KeyFile is the PEM private key of the leaf.
	KeyFile string
	// OnError, if non-nil, is called once for each change of the files
	// that leaves a pair that does not load (missing, unparsable, or a key
	// that is not the certificate's); the pair served before stays. It
	// runs in the handshake that noticed the change.
	OnError func(err error)
	// OnReload, if non-nil, is called after a changed pair loaded, with its
	// leaf certificate (for its subject and expiry). It runs in the
	// handshake that noticed the change, or in Reload.
	OnReload func(leaf *x509.Certificate)
}

// CertReloader serves a certificate and key from PEM files, and picks them
// up again when they change, for tls.Config.GetCertificate. A handshake
// looks at the files' size, modification time and identity (inode) at most
// once a second, and loads the pair again when one of them changed; files
// replaced by a rename or a symlink swap (as Kubernetes updates a secret)
// are seen. A change that keeps all three is not: call Reload. Its methods
// are safe for concurrent use.
type CertReloader struct {
	cfg  CertConfig
	now  func() time.Time
	base time.Time // construction; times are measured from it, monotonically
	cert atomic.Pointer[tls.Certificate]
	next atomic.Int64 // the time of the next look, in nanoseconds from base

	mu   sync.Mutex // held by a look or a Reload; guards seen
	seen [2]fileState
}

// fileState is what a look saw of one file: its metadata, or the error of
// its stat.
type fileState struct {
	info os.FileInfo
	err  string
}

func statFile(name string) fileState {
	info, err := os.Stat(name)
	if err != nil {
		return fileState{err: err.Error()}
	}
	return fileState{info: info}
}

// same reports whether s and o saw the same file, unchanged.
func (s fileState) same(o fileState) bool {
	if s.info == nil || o.info == nil {
		return s.info == nil && o.info == nil && s.err == o.err
	}
	return os.SameFile(s.info, o.info) && s.info.Size() == o.info.Size() && s.info.ModTime().Equal(o.info.ModTime())
}

// NewCertReloader loads the pair of cfg, or says which file is wrong and
// how.
func NewCertReloader(cfg CertConfig) (*CertReloader, error) {
	return newCertReloader(cfg, time.Now)
}

func newCertReloader(cfg CertConfig, now func() time.Time) (*CertReloader, error) {
	if cfg.CertFile == "" || cfg.KeyFile == "" {
		return nil, errors.New("netguard: CertFile and KeyFile are both required")
	}
	r := &CertReloader{cfg: cfg, now: now, base: now()}
	seen := r.stat()
	cert, err := loadPair(cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return nil, err
	}
	r.seen = seen
	r.cert.Store(cert)
	r.next.Store(int64(certCheckInterval))
	return r, nil
}

// GetCertificate returns the current certificate, having first loaded the
// files again if a second has passed since the last look and they changed.
// It never fails: a pair that does not load leaves the current one.
func (r *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := int64(r.now().Sub(r.base))
	if next := r.next.Load(); now >= next && r.next.CompareAndSwap(next, now+int64(certCheckInterval)) {
		r.look()
	}
	return r.cert.Load(), nil
}

// Certificate returns the certificate served now.
func (r *CertReloader) Certificate() *tls.Certificate { return r.cert.Load() }

// look loads the pair again if the files changed since the last look,
// reporting a failure once. A Reload under way makes it a no-op.
func (r *CertReloader) look() {
	if !r.mu.TryLock() {
		return
	}
	defer r.mu.Unlock()
	seen := r.stat()
	if seen[0].same(r.seen[0]) && seen[1].same(r.seen[1]) {
		return
	}
	r.seen = seen
	cert, err := loadPair(r.cfg.CertFile, r.cfg.KeyFile)
	if err != nil {
		if r.cfg.OnError != nil {
			r.cfg.OnError(fmt.Errorf("%w (keeping the certificate loaded before)", err))
		}
		return
	}
	r.cert.Store(cert)
	if r.cfg.OnReload != nil {
		r.cfg.OnReload(cert.Leaf)
	}
}

// Reload loads the pair now, changed or not (on SIGHUP, say). On failure
// it keeps the current pair and returns the error, without OnError.
func (r *CertReloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = r.stat()
	cert, err := loadPair(r.cfg.CertFile, r.cfg.KeyFile)
	if err != nil {
		return err
	}
	r.cert.Store(cert)
	if r.cfg.OnReload != nil {
		r.cfg.OnReload(cert.Leaf)
	}
	return nil
}

func (r *CertReloader) stat() [2]fileState {
	return [2]fileState{statFile(r.cfg.CertFile), statFile(r.cfg.KeyFile)}
}

// Config returns a server tls.Config that serves r's certificate: TLS 1.2
// at least, HTTP/2 and HTTP/1.1 offered by ALPN, Go's default cipher
// suites and curves. http.Server.ServeTLS takes it as TLSConfig.
func (r *CertReloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: r.GetCertificate,
	}
}

// loadPair reads and parses a certificate and key pair, naming the file at
// fault.
func loadPair(certFile, keyFile string) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("netguard: read certificate file: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("netguard: read key file: %w", err)
	}
	if !hasPEM(certPEM, isCertBlock) {
		hint := ""
		if hasPEM(certPEM, isKeyBlock) {
			hint = " (it holds a private key: are the two files swapped?)"
		}
		return nil, fmt.Errorf("netguard: certificate file %s has no PEM CERTIFICATE block%s", certFile, hint)
	}
	if !hasPEM(keyPEM, isKeyBlock) {
		hint := ""
		if hasPEM(keyPEM, isCertBlock) {
			hint = " (it holds a certificate: are the two files swapped?)"
		}
		return nil, fmt.Errorf("netguard: key file %s has no PEM PRIVATE KEY block%s", keyFile, hint)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("netguard: certificate file %s with key file %s: %w", certFile, keyFile, err)
	}
	if pair.Leaf == nil { // GODEBUG x509keypairleaf=0
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("netguard: certificate file %s: %w", certFile, err)
		}
	}
	return &pair, nil
}

func isCertBlock(typ string) bool { return typ == "CERTIFICATE" }
func isKeyBlock(typ string) bool  { return strings.HasSuffix(typ, "PRIVATE KEY") }

// hasPEM reports whether data holds a PEM block whose type passes want.
func hasPEM(data []byte, want func(typ string) bool) bool {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return false
		}
		if want(b.Type) {
			return true
		}
	}
}
