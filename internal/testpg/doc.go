// Package testpg starts a throwaway Postgres server for tests: Debian's
// postgresql binaries (/usr/lib/postgresql/<version>/bin), a fresh cluster
// made by initdb in a temporary directory, listening on a unix socket only
// (no TCP port, so tests never collide), stopped and removed when the test
// ends.
//
// Start with Start, which gives a DSN for a fresh database; StartServer
// and Server.Database when a test wants several databases on one server
// (a server takes about a second to make; a database a few tens of
// milliseconds).
//
// Postgres refuses to run as root: when the test runs as root, the server
// runs as the postgres OS user (the postgresql package creates it) in a
// directory it owns. When the binaries are missing the test is skipped
// under -short and fails otherwise: `make test` installs postgresql.
package testpg
