package netguard

import "fmt"

// fdReserve is the number of descriptors DefaultMaxConns keeps for
// everything but client and upstream connections: the listeners and the
// admin listener's connections, log, configuration and tokenizer files,
// DNS lookups, and the engines' metrics scrapes and KV event sockets.
const fdReserve = 128

// maxConnsForLimit is the rule of DefaultMaxConns for an open-file limit.
func maxConnsForLimit(limit uint64) (int, error) {
	const ceiling = 1 << 30 // RLIM_INFINITY and the like: no real bound
	limit = min(limit, ceiling)
	n := int(limit/2) - fdReserve
	if n < 1 {
		return 0, fmt.Errorf("netguard: the open-file limit %d leaves no descriptor for clients: raise it to at least %d (ulimit -n), or set MaxConns", limit, 2*(fdReserve+1))
	}
	return n, nil
}
