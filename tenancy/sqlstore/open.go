package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/inferrail/inferrail/tenancy"
)

// Open opens the store a DSN names (see tenancy.ParseDSN):
// "sqlite:///path/to/file.db" or a plain path for SQLite (the file is
// created if missing, its directory must exist), "postgres://..." or
// "postgresql://..." for Postgres. It applies the schema migrations the
// database lacks, in one transaction, and refuses a database whose schema
// is newer than this binary. Its errors are one line, name the file or
// the host, and never contain the password.
func Open(ctx context.Context, dsn string) (tenancy.Store, error) {
	d, err := tenancy.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: %w", err)
	}
	switch d.Backend {
	case tenancy.BackendSQLite:
		s, err := openSQLite(ctx, d)
		if err != nil {
			return nil, d.Redact(err)
		}
		return s, nil
	case tenancy.BackendPostgres:
		s, err := openPostgres(ctx, d)
		if err != nil {
			return nil, d.Redact(err)
		}
		return s, nil
	}
	return nil, fmt.Errorf("sqlstore: backend %q is not supported", d.Backend)
}

// prepareCreate normalizes and validates a key to create: CreatedAt is
// now when unset, UpdatedAt never before CreatedAt.
func prepareCreate(k tenancy.Key, now time.Time) (tenancy.Key, error) {
	k = k.Normalized()
	if k.CreatedAt.IsZero() {
		k.CreatedAt = tenancy.NormalizeTime(now)
	}
	if k.UpdatedAt.Before(k.CreatedAt) {
		k.UpdatedAt = k.CreatedAt
	}
	if err := k.Validate(); err != nil {
		return tenancy.Key{}, err
	}
	return k, nil
}

// preparePatch applies a patch to the stored key, sets UpdatedAt (never
// backwards) and validates the result.
func preparePatch(old tenancy.Key, p tenancy.KeyPatch, now time.Time) (tenancy.Key, error) {
	k := p.Apply(old).Normalized()
	k.UpdatedAt = tenancy.NormalizeTime(now)
	if k.UpdatedAt.Before(old.UpdatedAt) {
		k.UpdatedAt = old.UpdatedAt
	}
	if err := k.Validate(); err != nil {
		return tenancy.Key{}, err
	}
	return k, nil
}

// prepareUsage validates a batch and merges it into one row per key,
// model and hour, in a fixed order.
func prepareUsage(rows []tenancy.Usage) ([]tenancy.Usage, error) {
	for i, u := range rows {
		if err := u.Validate(); err != nil {
			return nil, fmt.Errorf("row %d: %w", i, err)
		}
	}
	return tenancy.MergeUsage(rows), nil
}
