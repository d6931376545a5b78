package live

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/internal/h1"
	"github.com/inferrail/inferrail/internal/netguard"
	"github.com/inferrail/inferrail/live/config"
)

// adminMaxConns caps the admin listener's connections: operators and
// probes, never clients.
const adminMaxConns = 64

// Serve listens on the configured addresses (listen, admin_listen), serves
// Handler and AdminHandler there, and runs the background work (Run) until
// ctx ends; then it drains: readiness fails at once, the listeners stop
// accepting after drain_delay (so load balancers stop sending first; a
// second cancellation of stop, when not nil, cuts the delay short), and
// running streams get drain_timeout to finish. It returns nil after a
// clean drain. Connections are capped (max_connections in total, less for
// one client address: max_connections_per_client, by default all but a
// tenth of the total), a flood is shed by its source
// (flood_connections_per_client), accept errors such as EMFILE back off
// instead of spinning, and TLS certificates are read again when their
// files change.
func (s *Server) Serve(ctx context.Context, stop <-chan struct{}) error {
	total, perClient := s.cfg.MaxConnections, s.cfg.MaxConnectionsPerClient
	if total == 0 {
		n, err := netguard.DefaultMaxConns()
		if err != nil {
			return fmt.Errorf("live: max_connections is 0 and cannot be derived (set it): %w", err)
		}
		total = n
	}
	if perClient == 0 {
		perClient = netguard.PerClientCap(total)
	}
	client, err := s.listen("listen", s.cfg.Listen, s.cfg.TLS, netguard.Config{MaxConns: total, MaxConnsPerClient: perClient, FloodConnsPerClient: s.cfg.FloodConnectionsPerClient})
	if err != nil {
		return err
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	if s.cfg.TLS.Enabled() {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true) // h2c
	}
	hs := &http.Server{
		Handler: s.Handler(), Protocols: &protocols, TLSConfig: client.tls,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout, IdleTimeout: s.cfg.IdleTimeout,
		HTTP2:    &http.HTTP2Config{MaxConcurrentStreams: s.cfg.MaxConcurrentStreams},
		ErrorLog: slogAdapter(s.log, "http server"),
	}
	front, err := s.front(hs, client)
	if err != nil {
		client.Close()
		return err
	}
	errs := make(chan error, 2)
	s.setAddr(&s.clientAddr, client.Addr())
	go func() { errs <- serveOn(front, client) }()
	admin, err := s.serveAdmin(errs)
	if err != nil {
		front.Close()
		return err
	}
	if admin != nil {
		_, al := s.Addrs()
		s.log.Info("serving", "listen", client.Addr().String(), "admin", al.String(), "tls", s.cfg.TLS.Enabled(), "max_connections", client.MaxConns(), "max_connections_per_client", perClient, "flood_connections_per_client", s.cfg.FloodConnectionsPerClient)
	} else {
		s.log.Info("serving", "listen", client.Addr().String(), "tls", s.cfg.TLS.Enabled(), "max_connections", client.MaxConns(), "max_connections_per_client", perClient, "flood_connections_per_client", s.cfg.FloodConnectionsPerClient)
	}
	bgCtx, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	bgDone := make(chan error, 1)
	go func() { bgDone <- s.Run(bgCtx) }()
	closeAll := func() {
		front.Close()
		if admin != nil {
			admin.Close()
		}
		stopBG()
		<-bgDone
	}
	select {
	case err := <-errs:
		closeAll()
		return fmt.Errorf("live: serve: %w", err)
	case <-ctx.Done():
	}
	s.Drain()
	s.log.Info("draining", "delay", s.cfg.DrainDelay.String(), "timeout", s.cfg.DrainTimeout.String())
	if s.cfg.DrainDelay > 0 {
		t := time.NewTimer(s.cfg.DrainDelay)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
		}
	}
	dctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer cancel()
	if err := front.Shutdown(dctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		s.log.Warn("shutdown", "error", err.Error())
	}
	closeAll()
	s.log.Info("stopped")
	return nil
}

// serveAdmin serves AdminHandler on admin_listen (its end is sent to
// errs), or returns nil without admin_listen: Serve's and ServeEPP's admin
// listener.
func (s *Server) serveAdmin(errs chan<- error) (*http.Server, error) {
	if s.cfg.AdminListen == "" {
		return nil, nil
	}
	al, err := s.listen("admin_listen", s.cfg.AdminListen, s.cfg.AdminTLS, netguard.Config{MaxConns: adminMaxConns})
	if err != nil {
		return nil, err
	}
	var ap http.Protocols
	ap.SetHTTP1(true)
	if s.cfg.AdminTLS.Enabled() {
		ap.SetHTTP2(true)
	}
	admin := &http.Server{Handler: s.AdminHandler(), Protocols: &ap, TLSConfig: al.tls, ReadHeaderTimeout: s.cfg.ReadHeaderTimeout, IdleTimeout: s.cfg.IdleTimeout,
		ErrorLog: slogAdapter(s.log, "admin server")}
	s.setAddr(&s.adminAddr, al.Addr())
	go func() { errs <- serveOn(netHTTP{admin}, al) }()
	return admin, nil
}

// Logger is the process log the server writes to (Deps.Logger), for the
// program that runs it to log beside it.
func (s *Server) Logger() *slog.Logger { return s.log }

// Addrs returns the addresses Serve listens on (nil until it does; admin
// nil without admin_listen).
func (s *Server) Addrs() (client, admin net.Addr) {
	s.addrMu.Lock()
	defer s.addrMu.Unlock()
	return s.clientAddr, s.adminAddr
}

func (s *Server) setAddr(dst *net.Addr, a net.Addr) {
	s.addrMu.Lock()
	*dst = a
	s.addrMu.Unlock()
}

// slogAdapter makes an http.Server's error log (one line per broken
// connection or failed handshake, never a state change) debug lines.
func slogAdapter(l *slog.Logger, what string) *log.Logger {
	return slog.NewLogLogger(l.With("source", what).Handler(), slog.LevelDebug)
}

// guarded is a capped listener, with the TLS configuration served on it.
type guarded struct {
	*netguard.Listener
	tls *tls.Config
}

// httpServer is what serves a listener: h1's server or net/http's.
type httpServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// netHTTP serves a listener with net/http's server, TLS when it has a
// configuration.
type netHTTP struct{ *http.Server }

func (n netHTTP) Serve(l net.Listener) error {
	if n.TLSConfig != nil {
		return n.ServeTLS(l, "", "")
	}
	return n.Server.Serve(l)
}

// front is the client listener's server: h1's connection loop for
// HTTP/1 (net/http's server costs more CPU a request: README, overhead),
// with TLS when configured, and hs for HTTP/2 (h2 chosen by ALPN, or h2c).
func (s *Server) front(hs *http.Server, l guarded) (httpServer, error) {
	if l.tls != nil {
		// net/http's server speaks h2 over a connection handed to it only
		// when its configuration offers h2.
		tc := l.tls.Clone()
		tc.NextProtos = []string{"h2", "http/1.1"}
		hs.TLSConfig = tc
	}
	h, err := h1.New(h1.Config{
		Handler: hs.Handler, TLSConfig: l.tls, Fallback: hs,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout, IdleTimeout: s.cfg.IdleTimeout, ReadTimeout: s.cfg.ReadTimeout, WriteTimeout: s.cfg.WriteTimeout,
		ErrorLog: hs.ErrorLog,
	})
	if err != nil {
		return nil, fmt.Errorf("live: %w", err)
	}
	return h, nil
}

func serveOn(hs httpServer, l net.Listener) error {
	err := hs.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// listen opens one capped listener (and its certificate reloader).
func (s *Server) listen(field, addr string, t config.TLS, nc netguard.Config) (guarded, error) {
	ln, err := netguard.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return guarded{}, fmt.Errorf("live: listen on %s: %w (change %s in the configuration)", addr, err, field)
	}
	label := map[string]string{"listen": "client", "admin_listen": "admin"}[field]
	var acceptLog sync.Mutex
	lastAccept := ""
	// TCP keep-alive as net.Listen sets it (15 s), on admitted
	// connections only: one over a cap is closed without it.
	nc.KeepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second}
	// Each series from the start, at 0, so a rate over it is 0 and not
	// missing until the first rejection.
	for _, r := range []netguard.Reason{netguard.ReasonMaxConns, netguard.ReasonMaxConnsPerClient, netguard.ReasonFlood} {
		s.met.connRejected.WithLabelValues(label, string(r))
	}
	s.met.acceptErrors.WithLabelValues(label)
	// A flood is logged when it begins and when it is over, naming whom
	// it shed the most of: an operator's cue to block them upstream.
	nc.OnFlood = func(f netguard.FloodReport) {
		if f.Began {
			s.log.Warn("connection flood: the accept queue fills; shedding new connections from the addresses that hold the most",
				"listener", label, "accept_queue", f.Queue.Len, "accept_queue_max", f.Queue.Max, "flood_connections_per_client", nc.FloodConnsPerClient)
			return
		}
		s.log.Warn("connection flood over", "listener", label, "lasted", f.Lasted.Round(time.Millisecond).String(), "shed", f.Shed, "shed_most_from", topAddrs(f.Top))
	}
	nc.OnReject = func(r netguard.Reason, _ netip.Addr) { s.met.connRejected.WithLabelValues(label, string(r)).Inc() }
	nc.OnAcceptError = func(err error) {
		s.met.acceptErrors.WithLabelValues(label).Inc()
		acceptLog.Lock()
		defer acceptLog.Unlock()
		if msg := err.Error(); msg != lastAccept {
			lastAccept = msg
			s.log.Warn("accept failing; backing off", "listener", label, "error", msg)
		}
	}
	gl, err := netguard.NewListener(ln, nc)
	if err != nil {
		ln.Close()
		return guarded{}, fmt.Errorf("live: %s: %w", field, err)
	}
	s.met.conns.set(label, gl)
	g := guarded{Listener: gl}
	if t.Enabled() {
		if g.tls, err = s.certFiles(label, t); err != nil {
			gl.Close()
			return guarded{}, fmt.Errorf("live: %s: tls: %w", field, err)
		}
	}
	return g, nil
}

// certFiles serves t's certificate and key, read again when they change;
// a reload that fails keeps the current pair. Both are logged, naming the
// listener.
func (s *Server) certFiles(listener string, t config.TLS) (*tls.Config, error) {
	cr, err := netguard.NewCertReloader(netguard.CertConfig{
		CertFile: t.CertFile, KeyFile: t.KeyFile,
		OnError: func(err error) {
			s.log.Error("tls certificate reload failed; keeping the current one", "listener", listener, "error", err.Error())
		},
		OnReload: func(leaf *x509.Certificate) {
			s.log.Info("tls certificate reloaded", "listener", listener, "subject", leaf.Subject.String(), "not_after", leaf.NotAfter)
		},
	})
	if err != nil {
		return nil, err
	}
	return cr.Config(), nil
}

// topAddrs shows a flood's heaviest sources as "ADDR N, ADDR N" (the
// addresses past those counted one by one as "others").
func topAddrs(top []netguard.AddrCount) string {
	var b strings.Builder
	for i, a := range top {
		if i > 0 {
			b.WriteString(", ")
		}
		if a.Addr.IsValid() {
			b.WriteString(a.Addr.String())
		} else {
			b.WriteString("others")
		}
		b.WriteString(" " + strconv.FormatUint(a.N, 10))
	}
	return b.String()
}
