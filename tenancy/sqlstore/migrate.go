package sqlstore

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// Migrations are numbered files, migrations/<dialect>/NNNN_name.sql,
// applied in order, each once, in one transaction at Open; the versions
// applied are rows of schema_migrations. A migration is never edited once
// released: a change is a new file.
//
//go:embed migrations
var migrationsFS embed.FS

// migration is one schema version.
type migration struct {
	Version int
	Name    string
	SQL     string
}

// migrations returns the dialect's migrations in version order, checking
// that they are numbered 1, 2, 3, ... with no gap.
func migrations(dialect string) ([]migration, error) {
	dir := path.Join("migrations", dialect)
	entries, err := fs.ReadDir(migrationsFS, dir)
	if err != nil {
		return nil, fmt.Errorf("migrations %s: %w", dialect, err)
	}
	var out []migration
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		num, rest, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migrations %s: %s: want NNNN_name.sql", dialect, name)
		}
		b, err := fs.ReadFile(migrationsFS, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("migrations %s: %w", dialect, err)
		}
		out = append(out, migration{Version: v, Name: rest, SQL: string(b)})
	}
	// ReadDir sorts by name and the numbers are zero-padded.
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migrations %s: version %d where %d was expected", dialect, m.Version, i+1)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("migrations %s: none", dialect)
	}
	return out, nil
}

// pending returns the migrations to apply to a database whose applied
// versions are applied (sorted): those past the last one. A database at a
// version newer than this binary knows, or with a gap, is refused.
func pending(known []migration, applied []int) ([]migration, error) {
	for i, v := range applied {
		if v != i+1 {
			return nil, fmt.Errorf("schema_migrations holds versions %v: want 1 to %d without gaps; the database was changed by hand or by another tool", applied, len(applied))
		}
	}
	if n := len(applied); n > len(known) {
		return nil, fmt.Errorf("the database schema is at version %d, newer than this binary knows (%d): upgrade inferrail, or point it at another database", n, len(known))
	}
	return known[len(applied):], nil
}
