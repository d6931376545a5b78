// Package netguard protects a server's listeners from hostile clients: it
// caps the connections open at once, in total and per client address, so
// that clients alone never exhaust the process's file descriptors, keeps
// accepting through temporary accept errors (EMFILE, "too many open
// files") without spinning or giving up, and serves TLS certificates that
// are picked up again when their files change.
//
// Start with Listener (listener.go): NewListener wraps a net.Listener with
// a Config validated once. A connection over a cap is accepted and closed
// at once, counted by Reason and reported through Config.OnReject; its
// slot returns when the connection is closed, once however often Close is
// called. Accept waits out temporary errors (5ms doubling to 1s, as
// net/http does) and reports each through Config.OnAcceptError, so
// http.Server.Serve never sees them. Stats is what a metrics page shows.
// DefaultMaxConns (limit.go) derives the total cap from RLIMIT_NOFILE,
// leaving half of it for the upstream connections a proxy opens. Listen
// opens a TCP listener whose connections get their keep-alive only once
// admitted (Config.KeepAlive).
//
// Then queue.go: the kernel's accept queue of a listener (AcceptQueue, read
// with TCP_INFO on Linux) and the network namespace's listen drops
// (ReadListenDrops). With Config.FloodConnsPerClient a Listener sheds a
// connection flood by its source: while the queue is an eighth full or
// more, connections are taken bare off the queue (acceptFlooded,
// queue_linux.go), and those of a client that holds the floor and its share
// are closed before Go wraps them, so the queue drains faster than it fills
// and the clients that hold few still get in; the kernel would otherwise
// drop every client's SYNs alike once the queue is full.
//
// Then CertReloader (certreload.go): its GetCertificate serves the pair
// loaded from two PEM files and loads them again, in a handshake at most
// once a second, when their size, modification time or inode changed; a
// pair that does not load keeps the one before and is reported once
// through CertConfig.OnError. Config returns a tls.Config around it.
//
// Wrap the raw TCP listener, under any TLS: a connection over a cap is
// then closed before its handshake costs anything.
//
//	ln, _ := net.Listen("tcp", addr)
//	gl, err := netguard.NewListener(ln, netguard.Config{MaxConnsPerClient: 1024})
//	...
//	cr, err := netguard.NewCertReloader(netguard.CertConfig{CertFile: c, KeyFile: k})
//	...
//	srv := &http.Server{Handler: h, TLSConfig: cr.Config(), ReadHeaderTimeout: 10 * time.Second}
//	err = srv.ServeTLS(gl, "", "")
//
// The caps bound descriptors, not time: a client that holds its
// connections open with slow headers or bodies is stopped by the server's
// read timeouts, and by MaxConnsPerClient.
package netguard
