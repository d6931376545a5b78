// Package tenancy holds API keys and usage metering: what a key is, how
// its plaintext form is made and checked, the Store interface the
// backends implement, and the authentication cache in front of a store.
//
// Start with Key (key.go): NewKey makes a key and its plaintext
// "ir-<id>-<secret>", shown once; only SHA-256 of the secret is kept.
// ParseAPIKey, Key.Verify and Key.Allows are the checks a request goes
// through, and HTTPStatus maps their errors to 401 and 403. Key.Validate
// and KeyPatch are what the admin API validates and applies (errors name
// the field, see FieldError).
//
// Then Store and Usage (store.go): keys CRUD and usage rows per key x
// model x hour, summed by AddUsage. The backends, SQLite and Postgres, are
// in tenancy/sqlstore (sqlstore.Open picks one from a DSN, see ParseDSN in
// dsn.go, whose String and Redact never show a password), and
// tenancy/storetest is the conformance suite both pass.
//
// Cache (cache.go) is what the proxy calls per request: Authenticate
// parses, looks up (a fresh entry, or one shared store lookup per burst)
// and verifies. A store shared by gateways that announces key changes
// (KeyWatcher, watch.go: Postgres) is followed with Cache.Follow, so a
// change made anywhere applies at once rather than within the TTL.
//
// This package neither limits nor meters by itself: the limiter and the
// metering writer sit on top of it.
package tenancy
