// Package sqlstore is the SQL backends of tenancy.Store: SQLite (pure Go,
// modernc.org/sqlite; the embedded default, one file) and Postgres
// (github.com/jackc/pgx/v5 with pgxpool; for several gateways sharing keys
// and usage).
//
// Start with Open (open.go), which picks the backend from the DSN, then
// sqlite.go and postgres.go, one file per backend with the same shape:
// open and migrate, then the Store methods. The SQL the two share in
// spirit differs in dialect only (types, placeholders); usage rows are
// summed with INSERT ... ON CONFLICT (key_id, model, hour) DO UPDATE on
// both.
//
// The schema is versioned (migrate.go): numbered files under
// migrations/<dialect>/, embedded, applied once each in one transaction at
// Open and recorded in schema_migrations; a database newer than the binary
// is refused. Postgres's migration 0002 adds a trigger that NOTIFYs
// inferrail_keys with a key's id when it changes; WatchKeys (watch.go)
// LISTENs for it (tenancy.KeyWatcher). The tests run tenancy/storetest against both backends, with
// a real Postgres server started by internal/testpg.
package sqlstore
