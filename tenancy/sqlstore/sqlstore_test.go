package sqlstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inferrail/inferrail/internal/testpg"
	"github.com/inferrail/inferrail/tenancy"
	"github.com/inferrail/inferrail/tenancy/storetest"
)

// dbName is a per-test database name: the same for every open in one
// test, different between tests.
func dbName(t testing.TB) string {
	sum := sha256.Sum256([]byte(t.Name()))
	return "t_" + hex.EncodeToString(sum[:10])
}

func openCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// sqliteUnderTest gives the suite the database file to read.
type sqliteUnderTest struct {
	tenancy.Store
	path string
}

// Raw is the database file with its WAL and shared-memory files.
func (s *sqliteUnderTest) Raw(t *testing.T) []byte {
	var all []byte
	for _, suffix := range []string{"", "-wal", "-shm"} {
		b, err := os.ReadFile(s.path + suffix)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}

func (s *sqliteUnderTest) Migrations(t *testing.T) []storetest.Migration {
	db, err := sql.Open("sqlite", s.path+"?_pragma=query_only(1)&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryContext(t.Context(), `SELECT version, applied_at FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []storetest.Migration
	for rows.Next() {
		var m storetest.Migration
		var at string
		if err := rows.Scan(&m.Version, &at); err != nil {
			t.Fatal(err)
		}
		if m.AppliedAt, err = parseSQLiteTime(at); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func openSQLiteForTest(t *testing.T, dir string) tenancy.Store {
	path := filepath.Join(dir, dbName(t)+".db")
	// Alternate the two DSN forms.
	dsn := path
	if len(t.Name())%2 == 0 {
		dsn = "sqlite://" + path
	}
	s, err := Open(openCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &sqliteUnderTest{Store: s, path: path}
}

func TestSQLiteConformance(t *testing.T) {
	dir := t.TempDir()
	storetest.Run(t, func(t *testing.T) tenancy.Store { return openSQLiteForTest(t, dir) })
}

// pgUnderTest gives the suite the tables and the server's files to read.
type pgUnderTest struct {
	tenancy.Store
	dsn string
	srv *testpg.Server
}

func (s *pgUnderTest) conn(t *testing.T) *pgx.Conn {
	conn, err := pgx.Connect(t.Context(), s.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Raw is every row of every table as text, then the on-disk files of the
// tables and their indexes, then the write-ahead log.
func (s *pgUnderTest) Raw(t *testing.T) []byte {
	ctx := t.Context()
	conn := s.conn(t)
	if _, err := conn.Exec(ctx, `CHECKPOINT`); err != nil {
		t.Fatal(err)
	}
	tables := queryStrings(t, conn, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1`)
	var all bytes.Buffer
	for _, tbl := range tables {
		for _, r := range queryStrings(t, conn, `SELECT t::text FROM `+pgx.Identifier{tbl}.Sanitize()+` t`) {
			all.WriteString(r + "\n")
		}
	}
	files := queryStrings(t, conn, `SELECT pg_relation_filepath(c.oid) FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname IN ('public', 'pg_toast') AND pg_relation_filepath(c.oid) IS NOT NULL`)
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(s.srv.DataDir(), f))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		all.Write(b)
	}
	wal, _ := filepath.Glob(filepath.Join(s.srv.DataDir(), "pg_wal", "0*"))
	for _, f := range wal {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	return all.Bytes()
}

func queryStrings(t *testing.T, conn *pgx.Conn, q string) []string {
	rows, err := conn.Query(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (s *pgUnderTest) Migrations(t *testing.T) []storetest.Migration {
	rows, err := s.conn(t).Query(t.Context(), `SELECT version, applied_at FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (storetest.Migration, error) {
		var m storetest.Migration
		err := r.Scan(&m.Version, &m.AppliedAt)
		m.AppliedAt = m.AppliedAt.UTC()
		return m, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func openPGForTest(t *testing.T, srv *testpg.Server) tenancy.Store {
	dsn := srv.Database(t, dbName(t))
	s, err := Open(openCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &pgUnderTest{Store: s, dsn: dsn, srv: srv}
}

func TestPostgresConformance(t *testing.T) {
	srv := testpg.StartServer(t)
	storetest.Run(t, func(t *testing.T) tenancy.Store { return openPGForTest(t, srv) })
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// An unreachable store gives one line naming the host, never the password.
func TestOpenUnreachablePostgres(t *testing.T) {
	port := closedPort(t)
	const pw = "Sup3r-s3cret_pw"
	for _, dsn := range []string{
		fmt.Sprintf("postgres://inferrail:%s@127.0.0.1:%d/keys?sslmode=disable", pw, port),
		fmt.Sprintf("postgresql://inferrail:%s@127.0.0.1:%d/keys?sslmode=disable&connect_timeout=5", pw, port),
		fmt.Sprintf("postgres://inferrail@127.0.0.1:%d/keys?sslmode=disable&password=%s", port, pw),
		fmt.Sprintf("postgres://inferrail:%s@127.0.0.1:%d/keys?sslmode=disable", "p%40ss%2Fw0rd-"+pw, port),
	} {
		start := time.Now()
		s, err := Open(openCtx(t), dsn)
		if err == nil {
			s.Close()
			t.Fatalf("Open on a closed port succeeded")
		}
		msg := err.Error()
		t.Logf("%v (in %v)", msg, time.Since(start).Round(time.Millisecond))
		host := fmt.Sprintf("127.0.0.1:%d", port)
		if !strings.Contains(msg, host) {
			t.Errorf("error does not name the host %s: %s", host, msg)
		}
		for _, secret := range []string{pw, "p@ss/w0rd", "p%40ss"} {
			if strings.Contains(msg, secret) {
				t.Errorf("error contains the password: %s", msg)
			}
		}
		if strings.ContainsAny(msg, "\r\n") {
			t.Errorf("error is not one line: %q", msg)
		}
		if time.Since(start) > 15*time.Second {
			t.Errorf("Open took %v to fail", time.Since(start))
		}
	}
}

func TestOpenSQLiteErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ dsn, want string }{
		{filepath.Join(dir, "missing", "x.db"), "directory " + filepath.Join(dir, "missing") + " does not exist"},
		{"sqlite://" + filepath.Join(dir, "missing", "x.db"), filepath.Join(dir, "missing", "x.db")},
		{dir, "it is a directory"},
		{"", "empty"},
		{"mysql://u:pw@h/db", `unknown scheme "mysql"`},
		{"host=localhost password=pw", "key=value form is not supported"},
	} {
		s, err := Open(openCtx(t), tc.dsn)
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", tc.dsn)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Open(%q): %q, want one line with %q", tc.dsn, err, tc.want)
		}
		if strings.Contains(err.Error(), "pw") {
			t.Errorf("Open(%q): %q shows the password", tc.dsn, err)
		}
	}
	// A file that is not a database.
	bad := filepath.Join(dir, "not.db")
	if err := os.WriteFile(bad, bytes.Repeat([]byte("not sqlite "), 100), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(openCtx(t), bad); err == nil {
		s.Close()
		t.Error("Open of a file that is not a database succeeded")
	} else if !strings.Contains(err.Error(), bad) {
		t.Errorf("error does not name the file: %v", err)
	}
}

func TestSQLiteSettings(t *testing.T) {
	dir := t.TempDir()
	s := openSQLiteForTest(t, dir).(*sqliteUnderTest).Store.(*sqliteStore)
	var mode string
	var busy, queryOnly int
	if err := s.w.QueryRowContext(t.Context(), `PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode %q (%v), want wal", mode, err)
	}
	if err := s.r.QueryRowContext(t.Context(), `PRAGMA busy_timeout`).Scan(&busy); err != nil || busy != 5000 {
		t.Errorf("busy_timeout %d (%v), want 5000", busy, err)
	}
	if err := s.r.QueryRowContext(t.Context(), `PRAGMA query_only`).Scan(&queryOnly); err != nil || queryOnly != 1 {
		t.Errorf("readers' query_only %d (%v), want 1", queryOnly, err)
	}
	if n := s.w.Stats().MaxOpenConnections; n != 1 {
		t.Errorf("writer has %d connections, want 1", n)
	}
}

func TestMigrationsEmbedded(t *testing.T) {
	lite, err := migrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	pg, err := migrations("postgres")
	if err != nil {
		t.Fatal(err)
	}
	if len(lite) != len(pg) {
		t.Errorf("%d sqlite migrations, %d postgres: every version needs both", len(lite), len(pg))
	}
	for i := range min(len(lite), len(pg)) {
		if lite[i].Name != pg[i].Name {
			t.Errorf("migration %d is %q for sqlite, %q for postgres", i+1, lite[i].Name, pg[i].Name)
		}
	}
}

func TestPending(t *testing.T) {
	known := []migration{{Version: 1}, {Version: 2}, {Version: 3}}
	for _, tc := range []struct {
		applied []int
		todo    int
		err     string
	}{
		{nil, 3, ""},
		{[]int{1}, 2, ""},
		{[]int{1, 2, 3}, 0, ""},
		{[]int{1, 2, 3, 4}, 0, "version 4, newer than this binary knows (3)"},
		{[]int{1, 3}, 0, "without gaps"},
		{[]int{2}, 0, "without gaps"},
	} {
		todo, err := pending(known, tc.applied)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("pending(%v): %v, want %q", tc.applied, err, tc.err)
			}
			continue
		}
		if err != nil || len(todo) != tc.todo {
			t.Errorf("pending(%v): %d, %v; want %d", tc.applied, len(todo), err, tc.todo)
		}
	}
}

// A database at a newer schema version than the binary knows is refused,
// with a message that says what to do.
func TestNewerSchemaRefused(t *testing.T) {
	known, err := migrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	bump := fmt.Sprintf("INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, 'future', '2030-01-01T00:00:00.000000Z')", len(known)+1)
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "keys.db")
		s, err := Open(openCtx(t), path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.(*sqliteStore).w.ExecContext(t.Context(), bump); err != nil {
			t.Fatal(err)
		}
		s.Close()
		checkRefused(t, path)
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := testpg.Start(t)
		s, err := Open(openCtx(t), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.(*pgStore).pool.Exec(t.Context(), bump); err != nil {
			t.Fatal(err)
		}
		checkRefused(t, dsn)
	})
}

func checkRefused(t *testing.T, dsn string) {
	t.Helper()
	s, err := Open(openCtx(t), dsn)
	if err == nil {
		s.Close()
		t.Fatal("Open of a database from the future succeeded")
	}
	if !strings.Contains(err.Error(), "newer than this binary knows") || !strings.Contains(err.Error(), "upgrade inferrail") {
		t.Errorf("error %q does not say what to do", err)
	}
	t.Log(err)
}

// Gateways starting at once against a fresh database: every Open works
// and each migration is applied once.
func TestConcurrentOpen(t *testing.T) {
	const n = 4
	check := func(t *testing.T, dsn string, count func(tenancy.Store) int) {
		var wg sync.WaitGroup
		stores := make([]tenancy.Store, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				stores[i], errs[i] = Open(openCtx(t), dsn)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("Open %d: %v", i, err)
			}
			defer stores[i].Close()
		}
		known, _ := migrations("sqlite")
		if got := count(stores[0]); got != len(known) {
			t.Errorf("schema_migrations has %d rows, want %d", got, len(known))
		}
	}
	t.Run("sqlite", func(t *testing.T) {
		check(t, filepath.Join(t.TempDir(), "keys.db"), func(s tenancy.Store) int {
			var c int
			if err := s.(*sqliteStore).r.QueryRowContext(t.Context(), `SELECT count(*) FROM schema_migrations`).Scan(&c); err != nil {
				t.Fatal(err)
			}
			return c
		})
	})
	t.Run("postgres", func(t *testing.T) {
		check(t, testpg.Start(t), func(s tenancy.Store) int {
			var c int
			if err := s.(*pgStore).pool.QueryRow(t.Context(), `SELECT count(*) FROM schema_migrations`).Scan(&c); err != nil {
				t.Fatal(err)
			}
			return c
		})
	})
}

// The stores under benchmarks: a key lookup, and a metering flush of 100
// rows (the writer's batch).
func BenchmarkSQLiteGetKey(b *testing.B) {
	s, err := Open(context.Background(), filepath.Join(b.TempDir(), "keys.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchGetKey(b, s)
}

func BenchmarkSQLiteAddUsage100(b *testing.B) {
	s, err := Open(context.Background(), filepath.Join(b.TempDir(), "keys.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchAddUsage(b, s)
}

func BenchmarkPostgresGetKey(b *testing.B) {
	s, err := Open(context.Background(), testpg.Start(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchGetKey(b, s)
}

func BenchmarkPostgresAddUsage100(b *testing.B) {
	s, err := Open(context.Background(), testpg.Start(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchAddUsage(b, s)
}

func benchGetKey(b *testing.B, s tenancy.Store) {
	k, _, err := tenancy.NewKey("bench", time.Now())
	if err != nil {
		b.Fatal(err)
	}
	k.Models = []string{"m1", "m2"}
	if _, err := s.CreateKey(context.Background(), k); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.GetKey(context.Background(), k.ID); err != nil {
			b.Fatal(err)
		}
	}
}

func benchAddUsage(b *testing.B, s tenancy.Store) {
	rows := make([]tenancy.Usage, 100)
	h := time.Now()
	for i := range rows {
		rows[i] = tenancy.Usage{KeyID: fmt.Sprintf("key%02d", i%50), Model: fmt.Sprintf("m%d", i%2), Hour: h,
			Requests: 1, PromptTokens: 1000, OutputTokens: 100, TTFTSeconds: 0.2, DurationSeconds: 2}
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.AddUsage(context.Background(), rows); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(rows))/b.Elapsed().Seconds(), "rows/s")
}
