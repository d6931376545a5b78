package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// live and epp ask main's keepAwake to execute the program again before
// the server opens anything, when they serve with sysmon: awake; never
// for --check or with sysmon: go. A keepAwake that cannot exec leaves a
// warning and the command goes on. (The store here is a SQLite file in a
// missing directory, so that the server fails to build right after.)
func TestSysmonAwakeAsksMainToExec(t *testing.T) {
	dir := t.TempDir()
	write := func(sysmon string) string {
		path := filepath.Join(dir, sysmon+".yaml")
		doc := "admin_listen: \"\"\nsysmon: " + sysmon + "\nauth: keys\ntenancy:\n  store: " + filepath.Join(dir, "nope", "t.db") +
			"\nepp: {listen: 127.0.0.1:0}\nmodels:\n  - name: m\n    kv_capacity_blocks: 1000\n    replicas:\n      - url: http://127.0.0.1:1\n"
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	awake, asleep := write("awake"), write("go")
	for _, c := range []struct {
		args  []string
		calls int
	}{
		{[]string{"live", "--config", awake}, 1},
		{[]string{"epp", "--config", awake}, 1},
		{[]string{"live", "--check", "--config", awake}, 0},
		{[]string{"epp", "--check", "--config", awake}, 0},
		{[]string{"live", "--config", asleep}, 0},
		{[]string{"epp", "--config", asleep}, 0},
	} {
		calls := 0
		var o, e bytes.Buffer
		code := execute(c.args, &o, &e, func() error { calls++; return errors.New("no exec here") })
		if code == 0 || !strings.Contains(e.String(), filepath.Join(dir, "nope")) {
			t.Fatalf("%v: exit %d, %q: want the store's error", c.args, code, e.String())
		}
		if calls != c.calls {
			t.Fatalf("%v: keepAwake called %d times, want %d", c.args, calls, c.calls)
		}
		if warned := strings.Contains(e.String(), "sysmon: awake not applied") && strings.Contains(e.String(), "no exec here"); warned != (c.calls == 1) {
			t.Fatalf("%v: warning %v, want %v: %q", c.args, warned, c.calls == 1, e.String())
		}
	}
}

// The engine too, with --sysmon awake (its default), before it listens: on
// a port already taken, so that it fails right after.
func TestEngineSysmonAwakeAsksMainToExec(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	for _, c := range []struct {
		args  []string
		calls int
	}{
		{[]string{"engine", "--port", port}, 1},
		{[]string{"engine", "--port", port, "--sysmon", "awake"}, 1},
		{[]string{"engine", "--port", port, "--sysmon", "go"}, 0},
	} {
		calls := 0
		var o, e bytes.Buffer
		code := execute(c.args, &o, &e, func() error { calls++; return errors.New("no exec here") })
		if code == 0 || !strings.Contains(e.String(), "listen on 127.0.0.1:"+port) {
			t.Fatalf("%v: exit %d, %q: want the listener's error", c.args, code, e.String())
		}
		if calls != c.calls {
			t.Fatalf("%v: keepAwake called %d times, want %d", c.args, calls, c.calls)
		}
		if warned := strings.Contains(e.String(), "--sysmon awake not applied") && strings.Contains(e.String(), "no exec here"); warned != (c.calls == 1) {
			t.Fatalf("%v: warning %v, want %v: %q", c.args, warned, c.calls == 1, e.String())
		}
	}
}
