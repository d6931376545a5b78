package sqlstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inferrail/inferrail/internal/testpg"
	"github.com/inferrail/inferrail/tenancy"
)

var _ tenancy.KeyWatcher = (*pgStore)(nil)

// Every change to a key, through any store on the database or by hand in
// SQL, reaches a watch as it commits; a watch whose connection is killed
// says so, comes back by itself and asks for everything to be read again;
// its end is prompt.
func TestPostgresWatchKeys(t *testing.T) {
	srv := testpg.StartServer(t)
	dsn := srv.Database(t, dbName(t))
	watched, err := Open(openCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer watched.Close()
	other, err := Open(openCtx(t), dsn) // another gateway's
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	ids := make(chan string, 64)
	states := make(chan error, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- watched.(tenancy.KeyWatcher).WatchKeys(ctx, func(id string) { ids <- id }, func(err error) { states <- err })
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("WatchKeys returned %v at its end, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("WatchKeys did not return within 5 s of its context's end")
		}
	}()
	const bound = 5 * time.Second
	nextID := func(what string) string {
		t.Helper()
		select {
		case id := <-ids:
			return id
		case <-time.After(bound):
			t.Fatalf("%s: no announcement within %v", what, bound)
			return ""
		}
	}
	nextState := func(what string) error {
		t.Helper()
		select {
		case err := <-states:
			return err
		case <-time.After(bound):
			t.Fatalf("%s: no state within %v", what, bound)
			return nil
		}
	}
	if err := nextState("start"); err != nil {
		t.Fatalf("start: state %v, want nil", err)
	}
	if id := nextID("start"); id != "" {
		t.Fatalf("start: %q, want \"\" (read everything again)", id)
	}

	k, _, err := tenancy.NewKey("team-a", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.CreateKey(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	if id := nextID("create"); id != k.ID {
		t.Fatalf("create: %q, want %q", id, k.ID)
	}
	rpm := int64(7)
	if _, err := other.UpdateKey(t.Context(), k.ID, tenancy.KeyPatch{RPM: &rpm}); err != nil {
		t.Fatal(err)
	}
	if id := nextID("update"); id != k.ID {
		t.Fatalf("update: %q, want %q", id, k.ID)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), `UPDATE api_keys SET disabled = TRUE WHERE id = $1`, k.ID); err != nil {
		t.Fatal(err)
	}
	if id := nextID("SQL by hand"); id != k.ID {
		t.Fatalf("SQL by hand: %q, want %q", id, k.ID)
	}
	if err := other.DeleteKey(t.Context(), k.ID); err != nil {
		t.Fatal(err)
	}
	if id := nextID("revoke"); id != k.ID {
		t.Fatalf("revoke: %q, want %q", id, k.ID)
	}

	// The watch's connection killed: it says so and comes back.
	tag, err := conn.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN `+keysChannel+`'`)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("terminating the watch's connection: %v, %d rows", err, tag.RowsAffected())
	}
	if err := nextState("killed"); err == nil {
		t.Fatal("killed: state nil, want the error")
	}
	if err := nextState("back"); err != nil {
		t.Fatalf("back: state %v, want nil", err)
	}
	if id := nextID("back"); id != "" {
		t.Fatalf("back: %q, want \"\"", id)
	}
	k2, _, err := tenancy.NewKey("team-b", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.CreateKey(t.Context(), k2); err != nil {
		t.Fatal(err)
	}
	if id := nextID("after the reconnection"); id != k2.ID {
		t.Fatalf("after the reconnection: %q, want %q", id, k2.ID)
	}
}
