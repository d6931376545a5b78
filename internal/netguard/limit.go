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

// PerClientCap returns a per-client cap for a listener capped at maxConns
// connections in total that keeps a tenth of them (at least one) for the
// other clients: no single address can take every slot, so a readiness
// probe or another client still connects while one address floods. With a
// cap of 1 it is 1.
func PerClientCap(maxConns int) int {
	return max(maxConns-max(maxConns/10, 1), 1)
}
