package testpg

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The server answers queries on its socket, databases are made on demand,
// and after the test the server process is gone and its files removed.
func TestStartStop(t *testing.T) {
	var pid int
	var base string
	t.Run("server", func(t *testing.T) {
		s := StartServer(t)
		pid, base = s.cmd.Process.Pid, s.base
		for _, db := range []string{"one", "two", "one"} {
			dsn := s.Database(t, db)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			var got string
			if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			conn.Close(ctx)
			cancel()
			if got != db {
				t.Fatalf("connected to %q, want %q", got, db)
			}
		}
		if _, err := os.Stat(s.DataDir()); err != nil {
			t.Fatal(err)
		}
	})
	if pid == 0 {
		t.Skip("no server started")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("postgres pid %d still there after the test (kill 0: %v)", pid, err)
	}
	if _, err := os.Stat(base); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after the test: %v", base, err)
	}
}

func TestStart(t *testing.T) {
	dsn := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE t (x int); INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"test": true, "t_0123abcd": true, "": false, "Test": false, "a-b": false,
		"x; DROP DATABASE postgres": false, string(make([]byte, 64)): false,
	} {
		if got := validName(name); got != want {
			t.Errorf("validName(%q) = %v, want %v", name, got, want)
		}
	}
}
