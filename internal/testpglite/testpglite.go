// Package testpglite runs PGlite for a test: real Postgres with the
// pgvector extension, compiled to WASM and run by node, behind the
// Postgres wire protocol on a free 127.0.0.1 port, in memory, stopped
// when the test ends.
//
// The npm packages (@electric-sql/pglite 0.5.14, @electric-sql/pglite-
// pgvector 0.0.15, @electric-sql/pglite-socket 0.2.17) are read from the
// repository's .cache/node, where the Makefile's node-deps target installs
// them (TESTPGLITE_NODE_DIR names another npm prefix). The server script
// is pglite-server.mjs, beside this file, embedded in the package.
//
// PGlite is single-user Postgres: the server serves one connection at a
// time, and a second waits (up to its connect timeout) until the first has
// closed. (pglite-socket itself refuses it with "Too many connections",
// even for a moment after the first client has gone; the script's front
// queues connections instead.) So a pgx pool on it needs MaxConns 1
// (Server.PoolConfig sets it), and two pools at once wait for each other.
// All connections share PGlite's one Postgres session, so the script runs
// DISCARD ALL before handing it to the next: without that, pgx's default
// statement cache fails on the second connection ("prepared statement
// stmtcache_... already exists"), and settings leak from one connection to
// the next. With it, pgx's default extended protocol with its statement
// cache works, and so does simple protocol; neither is needed.
//
// Starting takes seconds (PGlite runs initdb in WASM: 4 to 17 s measured
// on a shared, loaded 2-core machine): start one server per test function
// and share it between subtests, each in its own table or schema.
//
// When node is missing the test is skipped; when node is there but the
// packages are not, the test fails with the command that installs them.
package testpglite

import (
	"bufio"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed pglite-server.mjs
var script string

// Packages are the npm packages the server needs, as npm install takes
// them.
const Packages = "@electric-sql/pglite@0.5.14 @electric-sql/pglite-pgvector@0.0.15 @electric-sql/pglite-socket@0.2.17"

// NodeDirEnv names an npm prefix to read the packages from instead of the
// repository's .cache/node.
const NodeDirEnv = "TESTPGLITE_NODE_DIR"

// Bounds on every wait.
const (
	// StartTimeout bounds the wait for "pglite ready".
	StartTimeout = 90 * time.Second
	stopTimeout  = 10 * time.Second
)

// Server is one PGlite server owned by a test.
type Server struct {
	// Addr is the server's 127.0.0.1:port.
	Addr string

	cmd     *exec.Cmd
	stdin   io.WriteCloser
	done    chan struct{} // closed when the process has exited
	err     error         // its exit status, once done
	stderr  *lockedBuffer
	once    sync.Once
	stopErr error
}

// Start starts a server for tb and stops it when tb ends. It returns once
// the server listens with the vector extension created (within
// StartTimeout).
func Start(tb testing.TB) *Server {
	tb.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		tb.Skipf("testpglite: node is not on PATH (%v): the PGlite tests need node (Debian's nodejs package) and `make node-deps`", err)
	}
	dir, err := NodeDir()
	if err != nil {
		tb.Fatalf("testpglite: %v", err)
	}
	if err := checkPackages(dir); err != nil {
		tb.Fatalf("testpglite: %v", err)
	}
	tmp := tb.TempDir()
	path := filepath.Join(tmp, "pglite-server.mjs")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		tb.Fatalf("testpglite: %v", err)
	}
	began := time.Now()
	s, err := start(node, path, dir)
	if err != nil {
		tb.Fatalf("testpglite: %v", err)
	}
	tb.Logf("testpglite: PGlite ready on %s in %v", s.Addr, time.Since(began).Round(time.Millisecond))
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Errorf("testpglite: %v", err)
		}
	})
	return s
}

// NodeDir returns the npm prefix the packages are read from: $NodeDirEnv,
// or .cache/node in the module's root (the nearest directory above the
// working directory holding go.mod).
func NodeDir() (string, error) {
	if d := os.Getenv(NodeDirEnv); d != "" {
		return d, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, ".cache", "node"), nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s: set %s to the npm prefix holding the PGlite packages", wd, NodeDirEnv)
		}
	}
}

func checkPackages(dir string) error {
	var missing []string
	for _, p := range strings.Fields(Packages) {
		name := p[:strings.LastIndexByte(p, '@')]
		if _, err := os.Stat(filepath.Join(dir, "node_modules", name, "package.json")); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s missing from %s: run `make node-deps`, or npm install --prefix %s %s",
			strings.Join(missing, ", "), dir, dir, Packages)
	}
	return nil
}

func start(node, script, dir string) (*Server, error) {
	s := &Server{stderr: &lockedBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(node, script, "--node-dir", dir, "--port", "0")
	s.cmd.Stderr = s.stderr
	// Its own process group (killed as one if it will not stop), and a
	// SIGKILL if this process dies first; it also stops when its stdin
	// closes.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "pglite ready "); ok {
				select {
				case ready <- addr:
				default:
				}
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	tm := time.NewTimer(StartTimeout)
	defer tm.Stop()
	select {
	case addr := <-ready:
		if _, _, err := net.SplitHostPort(addr); err != nil {
			s.Stop()
			return nil, fmt.Errorf("pglite-server said it is ready at %q: %w", addr, err)
		}
		s.Addr = addr
		return s, nil
	case <-s.done:
		return nil, fmt.Errorf("pglite-server exited while starting (%v):\n%s", s.err, s.stderr.tail())
	case <-tm.C:
		s.Stop()
		return nil, fmt.Errorf("pglite-server not ready within %v:\n%s", StartTimeout, s.stderr.tail())
	}
}

// DSN is the server's connection string (user and database postgres).
func (s *Server) DSN() string {
	return "postgres://postgres@" + s.Addr + "/postgres?sslmode=disable&connect_timeout=10"
}

// PoolConfig returns a pgxpool configuration for the server: one
// connection, never more (PGlite is single-user).
func (s *Server) PoolConfig(tb testing.TB) *pgxpool.Config {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(s.DSN())
	if err != nil {
		tb.Fatalf("testpglite: %v", err)
	}
	cfg.MaxConns, cfg.MinConns = 1, 0
	return cfg
}

// Stop stops the server: its stdin closed and SIGTERM, SIGKILL to its
// process group after stopTimeout. Calling it again returns the first
// result.
func (s *Server) Stop() error {
	s.once.Do(func() { s.stopErr = s.stop() })
	return s.stopErr
}

func (s *Server) stop() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	s.stdin.Close()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	tm := time.NewTimer(stopTimeout)
	defer tm.Stop()
	select {
	case <-s.done:
		return nil
	case <-tm.C:
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-s.done:
		return fmt.Errorf("pglite-server did not stop within %v; killed", stopTimeout)
	case <-time.After(5 * time.Second):
		return errors.New("pglite-server did not die after SIGKILL")
	}
}

// Stderr returns the end of what the server wrote to stderr.
func (s *Server) Stderr() string { return s.stderr.tail() }

// lockedBuffer collects the server's stderr, keeping the last 64 KiB.
type lockedBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if len(l.b) > 64<<10 {
		l.b = append(l.b[:0], l.b[len(l.b)-32<<10:]...)
	}
	return len(p), nil
}

func (l *lockedBuffer) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.b
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}
