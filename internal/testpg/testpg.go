package testpg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Bounds on every wait.
const (
	initdbTimeout = 2 * time.Minute
	readyTimeout  = 30 * time.Second
	stopTimeout   = 15 * time.Second
	queryTimeout  = 30 * time.Second
)

// port names the unix socket (.s.PGSQL.<port>); nothing listens on TCP.
const port = 5432

// BinDirEnv, when set, is the directory holding initdb and postgres
// (instead of the newest /usr/lib/postgresql/*/bin).
const BinDirEnv = "TESTPG_BINDIR"

// Server is a running Postgres server owned by one test.
type Server struct {
	base, dataDir, sockDir, logPath string
	major                           int

	cmd  *exec.Cmd
	done chan struct{} // closed when the server process has exited
	err  error         // its exit status, once done

	mu  sync.Mutex
	dbs map[string]bool
}

// BinDir returns the directory with the Postgres server binaries and
// their major version, or an error saying how to get them.
func BinDir() (string, int, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		if !isExec(filepath.Join(d, "initdb")) || !isExec(filepath.Join(d, "postgres")) {
			return "", 0, fmt.Errorf("%s=%s: no initdb and postgres there", BinDirEnv, d)
		}
		return d, versionOf(d), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	var best string
	bestV := -1
	for _, m := range matches {
		d := filepath.Dir(m)
		if v := versionOf(d); v > bestV && isExec(filepath.Join(d, "initdb")) && isExec(m) {
			best, bestV = d, v
		}
	}
	if best == "" {
		return "", 0, errors.New("no Postgres server binaries in /usr/lib/postgresql/*/bin (or set " + BinDirEnv + ")")
	}
	return best, bestV, nil
}

// versionOf reads the major version from .../postgresql/<major>/bin.
func versionOf(binDir string) int {
	v, err := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	if err != nil {
		return 0
	}
	return v
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// Start starts a server for this test and returns the DSN of a fresh,
// empty database on it (user postgres, trust authentication, a unix
// socket). The server stops when the test ends.
func Start(tb testing.TB) string {
	tb.Helper()
	return StartServer(tb).Database(tb, "test")
}

// StartServer starts a server that stops, and whose files are removed,
// when the test ends.
func StartServer(tb testing.TB) *Server {
	tb.Helper()
	bin, major, err := BinDir()
	if err != nil {
		if testing.Short() {
			tb.Skipf("testpg: %v; skipped under -short", err)
		}
		tb.Fatalf("testpg: %v: `make test` installs Debian's postgresql (its db-deps target); -short skips these tests", err)
	}
	cred, err := credential()
	if err != nil {
		tb.Fatalf("testpg: %v", err)
	}
	base, err := os.MkdirTemp("", "testpg-")
	if err != nil {
		tb.Fatalf("testpg: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(base) })
	// The postgres user must reach and own the directory.
	if err := os.Chmod(base, 0o755); err != nil {
		tb.Fatalf("testpg: %v", err)
	}
	s := &Server{
		base: base, dataDir: filepath.Join(base, "data"), sockDir: filepath.Join(base, "sock"),
		logPath: filepath.Join(base, "postgres.log"), major: major, dbs: map[string]bool{},
	}
	if err := os.Mkdir(s.sockDir, 0o755); err != nil {
		tb.Fatalf("testpg: %v", err)
	}
	if cred != nil {
		for _, d := range []string{base, s.sockDir} {
			if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
				tb.Fatalf("testpg: %v", err)
			}
		}
	}

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), initdbTimeout)
	defer cancel()
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", s.dataDir, "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir = base
	initdb.Env = serverEnv()
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	if out, err := initdb.CombinedOutput(); err != nil {
		tb.Fatalf("testpg: initdb in %s: %v\n%s", s.dataDir, err, tail(out))
	}

	logf, err := os.Create(s.logPath)
	if err != nil {
		tb.Fatalf("testpg: %v", err)
	}
	defer logf.Close() // the child has its own descriptor
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", s.dataDir, "-k", s.sockDir, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "log_min_messages=warning")
	s.cmd.Dir = base
	s.cmd.Env = serverEnv()
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// Its own process group (stopped as a group if it will not stop), and
	// a signal if this test process dies first.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	if err := s.cmd.Start(); err != nil {
		tb.Fatalf("testpg: start postgres: %v", err)
	}
	s.done = make(chan struct{})
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	tb.Cleanup(func() {
		if err := s.stop(); err != nil {
			tb.Errorf("testpg: %v", err)
		}
	})
	if err := s.waitReady(); err != nil {
		tb.Fatalf("testpg: %v\n%s", err, s.logTail())
	}
	tb.Logf("testpg: postgres %d ready in %v (socket %s)", major, time.Since(start).Round(time.Millisecond), s.sockDir)
	return s
}

// credential returns who the server runs as: nil (this user) unless we
// are root, then the postgres user.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and Postgres refuses to: want a postgres OS user (Debian's postgresql package creates it): %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user postgres has uid %q gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

func serverEnv() []string {
	env := []string{"LC_ALL=C", "LANG=C", "TZ=UTC"}
	if p := os.Getenv("PATH"); p != "" {
		env = append(env, "PATH="+p)
	}
	return env
}

func (s *Server) waitReady() error {
	deadline := time.Now().Add(readyTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("postgres exited while starting: %v", s.err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("postgres not ready after %v: %v", readyTimeout, last)
}

// stop asks for a fast shutdown (SIGINT: disconnect clients, stop), and
// kills the process group if that takes longer than stopTimeout.
func (s *Server) stop() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
		return nil
	case <-time.After(stopTimeout):
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-s.done:
		return fmt.Errorf("postgres did not stop within %v; killed", stopTimeout)
	case <-time.After(5 * time.Second):
		return fmt.Errorf("postgres (pid %d) did not die after SIGKILL", s.cmd.Process.Pid)
	}
}

// DSN returns the DSN of database db on this server.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", url.PathEscape(db), url.QueryEscape(s.sockDir), port)
}

// Database creates database name on the server if it does not exist yet
// and returns its DSN. Names are [a-z0-9_], up to 63 characters.
func (s *Server) Database(tb testing.TB, name string) string {
	tb.Helper()
	if !validName(name) {
		tb.Fatalf("testpg: database name %q: want 1 to 63 of [a-z0-9_]", name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.dbs[name] {
		ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.DSN("postgres"))
		if err != nil {
			tb.Fatalf("testpg: connect: %v", err)
		}
		defer conn.Close(ctx)
		q := `CREATE DATABASE ` + name
		if s.major >= 15 {
			// The old strategy copies files and checkpoints: faster here
			// than writing the whole template to the WAL.
			q += ` STRATEGY FILE_COPY`
		}
		if _, err := conn.Exec(ctx, q); err != nil {
			tb.Fatalf("testpg: %s: %v", q, err)
		}
		s.dbs[name] = true
	}
	return s.DSN(name)
}

// validName reports whether name is 1 to 63 of [a-z0-9_] (so it needs no
// quoting in SQL).
func validName(name string) bool {
	return name != "" && len(name) <= 63 && strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_')
	}) < 0
}

// DataDir is the cluster's data directory (readable by root, or by the
// user running the tests when not root).
func (s *Server) DataDir() string { return s.dataDir }

// SocketDir is the directory of the server's unix socket.
func (s *Server) SocketDir() string { return s.sockDir }

// Major is the server's major version.
func (s *Server) Major() int { return s.major }

func (s *Server) logTail() string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return "postgres log:\n" + tail(b)
}

func tail(b []byte) string {
	const n = 4096
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
