package gateway

// Ledger holds the KV blocks reserved on each replica. A core reserves a
// dispatched request's weight and releases it exactly once when the request
// ends; several cores (gateways) that share one Ledger each see the others'
// reservations, and cores with their own Ledgers see only their own. Replica
// ids are the cores' replica indices, which must agree between cores that
// share a ledger.
type Ledger interface {
	// Reserved returns the blocks reserved on replica.
	Reserved(replica int) int
	// Add changes replica's reservation by delta blocks (negative to
	// release); the result never goes below zero.
	Add(replica, delta int)
}

// LocalLedger is a Ledger in memory, for one process. It is not safe for
// concurrent use: its cores are driven from one goroutine or one lock.
type LocalLedger struct {
	blocks []int
}

// NewLocalLedger returns an empty ledger.
func NewLocalLedger() *LocalLedger { return &LocalLedger{} }

// Reserved implements Ledger.
func (l *LocalLedger) Reserved(replica int) int {
	if replica < 0 || replica >= len(l.blocks) {
		return 0
	}
	return l.blocks[replica]
}

// Add implements Ledger.
func (l *LocalLedger) Add(replica, delta int) {
	if replica < 0 {
		return
	}
	for replica >= len(l.blocks) {
		l.blocks = append(l.blocks, 0)
	}
	l.blocks[replica] = max(0, l.blocks[replica]+delta)
}
