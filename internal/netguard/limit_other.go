//go:build !unix

package netguard

import "errors"

// DefaultMaxConns returns a cap on client connections derived from the
// open-file limit, which exists on Unix only: elsewhere it fails, and
// Config.MaxConns must be set.
func DefaultMaxConns() (int, error) {
	return 0, errors.New("netguard: no open-file limit on this system: set MaxConns")
}
