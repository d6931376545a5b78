package tenancy

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseDSN(t *testing.T) {
	for _, tc := range []struct {
		in                      string
		backend, path, host, rd string
	}{
		{"/var/lib/inferrail/keys.db", BackendSQLite, "/var/lib/inferrail/keys.db", "/var/lib/inferrail/keys.db", "sqlite:///var/lib/inferrail/keys.db"},
		{"keys.db", BackendSQLite, "keys.db", "keys.db", "sqlite://keys.db"},
		{"sqlite:///tmp/a/../k.db", BackendSQLite, "/tmp/k.db", "/tmp/k.db", "sqlite:///tmp/k.db"},
		{"sqlite://rel/k.db", BackendSQLite, "rel/k.db", "rel/k.db", "sqlite://rel/k.db"},
		{"postgres://app:pw@db.internal:5433/keys", BackendPostgres, "", "db.internal:5433", "postgres://app:xxxxx@db.internal:5433/keys"},
		{"postgresql://app@db/keys?sslmode=require", BackendPostgres, "", "db", "postgresql://app@db/keys?sslmode=require"},
		{"postgres://app@/keys?host=/run/postgresql&port=5433", BackendPostgres, "", "/run/postgresql port 5433", "postgres://app@/keys?host=/run/postgresql&port=5433"},
		{"postgres:///keys", BackendPostgres, "", "the default socket", "postgres:///keys"},
	} {
		d, err := ParseDSN(tc.in)
		if err != nil {
			t.Errorf("ParseDSN(%q): %v", tc.in, err)
			continue
		}
		if d.Backend != tc.backend || d.Path != tc.path || d.Host != tc.host || d.String() != tc.rd {
			t.Errorf("ParseDSN(%q) = backend %q path %q host %q string %q", tc.in, d.Backend, d.Path, d.Host, d)
		}
		if d.Backend == BackendPostgres && d.URL != tc.in {
			t.Errorf("URL %q, want the input", d.URL)
		}
	}
}

func TestParseDSNErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "empty"},
		{"   ", "empty"},
		{"mysql://u:secretpw@h/db", `unknown scheme "mysql"`},
		{"redis://h:6379", `unknown scheme "redis"`},
		{"file:keys.db", "file: URIs are not supported"},
		{"sqlite://", "empty path"},
		{"sqlite:///a?mode=memory", "must not contain '?'"},
		{":memory:", "in-memory databases are not supported"},
		{"host=db password=secretpw dbname=keys", "key=value form is not supported"},
		{"postgres://u:secretpw@h:port/db", "not a valid URL"},
		{"postgres://u:secret%zzpw@h/db", "not a valid URL"},
	} {
		_, err := ParseDSN(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseDSN(%q): %v, want %q", tc.in, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseDSN(%q): %q shows the password", tc.in, err)
		}
	}
}

// Whatever the driver writes, the password does not come out: plain,
// percent-encoded or as a query parameter.
func TestRedact(t *testing.T) {
	for _, tc := range []struct{ dsn, pw string }{
		{"postgres://app:hunter2hunter2@db:5432/keys", "hunter2hunter2"},
		{"postgres://app:p%40ss%2Fword99@db/keys", "p@ss/word99"},
		{"postgres://app@db/keys?password=qu3ry-secret&sslmode=disable", "qu3ry-secret"},
		{"postgres://app@db/keys?sslpassword=tls-secret", "tls-secret"},
	} {
		d, err := ParseDSN(tc.dsn)
		if err != nil {
			t.Fatal(err)
		}
		raw := rawPassword(tc.dsn)
		inner := fmt.Errorf("driver said: cannot connect to %s with password %s (%s)\nsecond line", tc.dsn, tc.pw, raw)
		err = d.Redact(inner)
		for _, s := range []string{err.Error(), d.String(), fmt.Sprintf("%v %+v %#v %s", d, d, d, d)} {
			if strings.Contains(s, tc.pw) || raw != "" && strings.Contains(s, raw) {
				t.Errorf("%q shows the password", s)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("not one line: %q", err)
		}
		if !errors.Is(err, inner) {
			t.Error("Redact hides the wrapped error from errors.Is")
		}
		if !strings.Contains(err.Error(), "db") {
			t.Errorf("the host is gone: %q", err)
		}
	}
	if (DSN{}).Redact(nil) != nil {
		t.Error("Redact(nil) is not nil")
	}
}
