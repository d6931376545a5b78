// Package testredis runs a real redis-server for a test: its own process on
// a unix socket in a temporary directory (no TCP port, so no collisions with
// other tests or agents on the machine), without persistence, killed when
// the test ends. Stop and Restart keep the same socket path, so a client
// built once reconnects by itself: that is how the limiter's reconnection
// test works. Pause and Resume (SIGSTOP, SIGCONT) simulate a hung server.
//
// The binary is Debian's redis-server (`make test` installs it). When it is
// missing the test is skipped under -short and fails otherwise.
package testredis

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StartTimeout bounds how long Start and Restart wait for the server to
// answer PING.
const StartTimeout = 10 * time.Second

// stopTimeout bounds how long Stop waits after SIGTERM before SIGKILL.
const stopTimeout = 5 * time.Second

// Server is one redis-server process owned by a test.
type Server struct {
	// Network is "unix"; Addr is the socket's path. Together they are what
	// a go-redis Options{Network, Addr} needs.
	Network, Addr string

	t    testing.TB
	bin  string
	dir  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	out  *lockedBuffer
}

// find is Find, replaced by the package's own test of a missing binary.
var find = Find

// Find returns the path of redis-server: $PATH first, then /usr/bin.
func Find() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	const deb = "/usr/bin/redis-server"
	if _, err := os.Stat(deb); err == nil {
		return deb, nil
	}
	return "", errors.New("redis-server not found on PATH or at /usr/bin/redis-server")
}

// Start starts a redis-server for t and registers its end in t.Cleanup. It
// returns once the server answers PING (at most StartTimeout).
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := find()
	if err != nil {
		if testing.Short() {
			t.Skipf("testredis: %v (skipped in -short; `make test` installs redis-server)", err)
		}
		t.Fatalf("testredis: %v: `make test` installs redis-server (apt-get install redis-server)", err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "redis.sock")
	// A unix socket path is limited to 107 bytes; a long test name makes
	// t.TempDir() too deep, so fall back to a short directory.
	if len(sock) > 100 {
		short, err := os.MkdirTemp("", "tr")
		if err != nil {
			t.Fatalf("testredis: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(short) })
		dir = short
		sock = filepath.Join(dir, "redis.sock")
	}
	s := &Server{Network: "unix", Addr: sock, t: t, bin: bin, dir: dir, out: &lockedBuffer{}}
	t.Cleanup(s.cleanup)
	if err := s.start(); err != nil {
		t.Fatalf("testredis: %v", err)
	}
	return s
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("already running")
	}
	cmd := exec.Command(s.bin,
		"--port", "0",
		"--unixsocket", s.Addr,
		"--unixsocketperm", "700",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", "",
		"--databases", "1",
	)
	cmd.Stdout = s.out
	cmd.Stderr = s.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(StartTimeout)
	for {
		err := ping(s.Addr)
		if err == nil {
			return nil
		}
		select {
		case <-done:
			s.cmd, s.done = nil, nil
			return fmt.Errorf("redis-server exited during start: %s", s.out.tail())
		default:
		}
		if time.Now().After(deadline) {
			s.killLocked()
			return fmt.Errorf("redis-server did not answer PING within %v (last: %v): %s", StartTimeout, err, s.out.tail())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ping sends one PING on a fresh connection and wants +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("unix", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}

// Stop ends the server (SIGTERM, then SIGKILL after 5 s) and waits for it
// to exit. Its data is gone: it runs without persistence.
func (s *Server) Stop() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused server cannot act on SIGTERM
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
		s.t.Logf("testredis: redis-server ignored SIGTERM for %v; killing", stopTimeout)
		_ = s.cmd.Process.Kill()
		select {
		case <-s.done:
		case <-time.After(stopTimeout):
			s.t.Errorf("testredis: redis-server survived SIGKILL for %v", stopTimeout)
		}
	}
	s.cmd, s.done = nil, nil
	_ = os.Remove(s.Addr)
}

// Restart starts a stopped server again on the same socket path (empty).
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("testredis: restart: %v", err)
	}
}

// Pause stops the process with SIGSTOP: connections stay open and nothing
// answers, as with a hung server. Resume undoes it.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("testredis: signal %v: server not running", sig)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("testredis: signal %v: %v", sig, err)
	}
}

// Running reports whether the process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Log is what the server has written so far (its log goes to stdout).
func (s *Server) Log() string { return s.out.String() }

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
	}
	s.cmd, s.done = nil, nil
}

func (s *Server) cleanup() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill() // no graceful shutdown needed: nothing persists
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
	}
	s.cmd, s.done = nil, nil
}

// lockedBuffer collects the process's output; exec copies into it from its
// own goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 1<<20 { // bounded: a test's log, not a file
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *lockedBuffer) tail() string {
	s := b.String()
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return s
}
