package testredis

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	if s.Network != "unix" || s.Addr == "" {
		t.Fatalf("address %s %q", s.Network, s.Addr)
	}
	if err := ping(s.Addr); err != nil {
		t.Fatalf("ping after start: %v", err)
	}
	s.Stop()
	if s.Running() {
		t.Fatal("running after Stop")
	}
	if err := ping(s.Addr); err == nil {
		t.Fatal("ping answered after Stop")
	}
	s.Restart()
	if err := ping(s.Addr); err != nil {
		t.Fatalf("ping after restart on the same socket: %v", err)
	}
}

func TestPauseResume(t *testing.T) {
	s := Start(t)
	s.Pause()
	start := time.Now()
	if err := ping(s.Addr); err == nil {
		t.Fatal("a paused server answered")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("ping against a paused server took %v", d)
	}
	s.Resume()
	if err := ping(s.Addr); err != nil {
		t.Fatalf("ping after resume: %v", err)
	}
}

// A long test name must not make the socket path exceed the unix limit.
func TestLongNameSocketPath(t *testing.T) {
	t.Run("a_subtest_with_a_rather_long_name_so_that_the_temporary_directory_is_deep_enough", func(t *testing.T) {
		s := Start(t)
		if len(s.Addr) > 100 {
			t.Fatalf("socket path %d bytes", len(s.Addr))
		}
		if err := ping(s.Addr); err != nil {
			t.Fatal(err)
		}
	})
}

func TestCleanupKills(t *testing.T) {
	var addr string
	t.Run("inner", func(t *testing.T) {
		addr = Start(t).Addr
	})
	// the subtest's cleanup killed the server; its directory is gone too
	if err := ping(addr); err == nil {
		t.Fatal("server still answering after its test ended")
	}
	if _, err := os.Stat(addr); err == nil {
		t.Fatal("socket still present after cleanup")
	}
}

// fakeTB records Skipf and Fatalf and aborts Start with a panic, as the
// real ones abort with runtime.Goexit.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

type abort struct{}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped = fmt.Sprintf(format, args...)
	panic(abort{})
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	panic(abort{})
}

func startMissing(t *testing.T, short bool) *fakeTB {
	old := find
	find = func() (string, error) { return "", errors.New("redis-server not found") }
	defer func() { find = old }()
	prev := flag.Lookup("test.short").Value.String()
	flag.Set("test.short", strconv.FormatBool(short))
	defer flag.Set("test.short", prev)
	f := &fakeTB{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != (abort{}) {
				panic(r)
			}
		}()
		Start(f)
	}()
	return f
}

// A missing binary skips under -short and fails otherwise, naming make test.
func TestMissingBinary(t *testing.T) {
	if f := startMissing(t, true); f.skipped == "" || f.failed != "" {
		t.Fatalf("-short: skipped %q failed %q", f.skipped, f.failed)
	}
	f := startMissing(t, false)
	if f.failed == "" || f.skipped != "" || !strings.Contains(f.failed, "`make test` installs redis-server") {
		t.Fatalf("without -short: skipped %q failed %q", f.skipped, f.failed)
	}
}
