package tenancy

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Backends a DSN can name.
const (
	BackendSQLite   = "sqlite"
	BackendPostgres = "postgres"
)

// DSN is a parsed store location. Its String form is safe to log: it never
// holds a password.
type DSN struct {
	// Backend is BackendSQLite or BackendPostgres.
	Backend string
	// Path is the SQLite database file.
	Path string
	// URL is the Postgres connection URL as given. It may hold a
	// password: pass it to the driver, never to a log.
	URL string
	// Host names where the store is, for messages: the Postgres host (and
	// port) or socket directory, or the SQLite file.
	Host string

	redacted string
	secrets  []string
}

// dsnKeywordForm matches libpq's "host=... dbname=..." form, which is not
// supported (and would otherwise be taken for a file name).
var dsnKeywordForm = regexp.MustCompile(`^\s*[a-z_]+\s*=`)

// ParseDSN parses a store location: "sqlite:///path/to/file.db" or a plain
// file path for SQLite, "postgres://..." or "postgresql://..." for
// Postgres. Its errors never contain the DSN's password.
func ParseDSN(s string) (DSN, error) {
	switch {
	case strings.TrimSpace(s) == "":
		return DSN{}, errors.New("store dsn: empty: want a file path, sqlite:///path/to/file.db or postgres://user@host/db")
	case strings.HasPrefix(s, "postgres://"), strings.HasPrefix(s, "postgresql://"):
		return parsePostgres(s)
	case strings.HasPrefix(s, "sqlite://"):
		return sqliteDSN(strings.TrimPrefix(s, "sqlite://"))
	case strings.HasPrefix(s, "file:"):
		return DSN{}, errors.New("store dsn: file: URIs are not supported: give a plain path or sqlite:///path/to/file.db")
	case strings.Contains(s, "://"):
		scheme, _, _ := strings.Cut(s, "://")
		if len(scheme) > 20 || strings.ContainsAny(scheme, "@:/") {
			scheme = "(unreadable)"
		}
		return DSN{}, fmt.Errorf("store dsn: unknown scheme %q: want sqlite:// or postgres://", scheme)
	case dsnKeywordForm.MatchString(s):
		return DSN{}, errors.New("store dsn: the key=value form is not supported: write postgres://user:password@host:port/db")
	}
	return sqliteDSN(s)
}

func sqliteDSN(path string) (DSN, error) {
	switch {
	case path == "":
		return DSN{}, errors.New("store dsn: sqlite: empty path: write sqlite:///path/to/file.db")
	case strings.ContainsAny(path, "?#"):
		return DSN{}, fmt.Errorf("store dsn: sqlite: path %q must not contain '?' or '#'", path)
	case strings.ContainsRune(path, 0):
		return DSN{}, errors.New("store dsn: sqlite: path must not contain a NUL byte")
	case path == ":memory:":
		return DSN{}, errors.New("store dsn: sqlite: in-memory databases are not supported: give a file path")
	}
	path = filepath.Clean(path)
	return DSN{Backend: BackendSQLite, Path: path, Host: path, redacted: "sqlite://" + path}, nil
}

func parsePostgres(s string) (DSN, error) {
	u, err := url.Parse(s)
	if err != nil {
		// url's errors quote the input, password included: do not wrap.
		return DSN{}, errors.New("store dsn: postgres: not a valid URL (check the user, password, host and port; a password with special characters must be percent-encoded)")
	}
	d := DSN{Backend: BackendPostgres, URL: s}
	if u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			d.secrets = append(d.secrets, pw, url.UserPassword("", pw).String()[1:], url.QueryEscape(pw), url.PathEscape(pw))
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	if raw := rawPassword(s); raw != "" {
		d.secrets = append(d.secrets, raw)
	}
	q := u.Query()
	redactedQuery := false
	for k, vs := range q {
		if strings.Contains(strings.ToLower(k), "password") {
			for i, v := range vs {
				if v != "" {
					d.secrets = append(d.secrets, v, url.QueryEscape(v))
				}
				vs[i] = "xxxxx"
			}
			redactedQuery = true
		}
	}
	if redactedQuery {
		u.RawQuery = q.Encode()
	}
	d.redacted = u.String()
	// Longest first, so no variant is left half replaced.
	slices.SortFunc(d.secrets, func(a, b string) int { return len(b) - len(a) })
	switch {
	case u.Host != "":
		d.Host = u.Host
	case q.Get("host") != "":
		d.Host = q.Get("host")
		if p := q.Get("port"); p != "" {
			d.Host += " port " + p
		}
	default:
		d.Host = "the default socket"
	}
	return d, nil
}

// rawPassword returns the password as written in the URL (percent-encoded
// or not), "" when there is none.
func rawPassword(s string) string {
	_, rest, _ := strings.Cut(s, "://")
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:at], ":")
	return pw
}

// String returns the DSN with any password replaced by "xxxxx".
func (d DSN) String() string { return d.redacted }

// GoString is String, so %#v does not print the password either.
func (d DSN) GoString() string { return "tenancy.DSN(" + d.redacted + ")" }

// Redact wraps err so that its message (on one line) never contains the
// DSN's password, however the driver worded it; errors.Is and errors.As
// still see err.
func (d DSN) Redact(err error) error {
	if err == nil {
		return nil
	}
	return &redactedError{msg: d.Scrub(err.Error()), err: err}
}

// Scrub returns s with the DSN's password replaced by "xxxxx" and line
// breaks by spaces.
func (d DSN) Scrub(s string) string {
	for _, p := range d.secrets {
		if p != "" {
			s = strings.ReplaceAll(s, p, "xxxxx")
		}
	}
	return strings.Join(strings.Fields(s), " ")
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
