//go:build unix

package netguard

import (
	"fmt"
	"syscall"
)

// DefaultMaxConns returns a cap on client connections that keeps a proxy
// clear of EMFILE: half of the process's open-file limit (RLIMIT_NOFILE,
// which Go raises from the soft to the hard limit at start-up), less a
// reserve of 128 descriptors. The other half is for the upstream
// connections: a proxy opens about one per client connection it forwards.
// It fails when the limit leaves less than one connection (below 258).
func DefaultMaxConns() (int, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("netguard: read the open-file limit: %w", err)
	}
	return maxConnsForLimit(uint64(rl.Cur))
}
