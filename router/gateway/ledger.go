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

// Reserver is a Ledger that can check and reserve in one step. A core whose
// ledger is a Reserver, under kv or tokenflow admission with the replica's
// capacity known, reserves the chosen replica's weight with TryAdd instead
// of Add: the ledger part of admission (admit reads Reserved before the
// policy picks) is then only a pre-filter, and TryAdd, atomic where the
// ledger is shared (one Lua script in Redis), is the decision. When TryAdd
// refuses (another gateway took the room since the core read Reserved), the
// replica does not admit the request in this attempt: the core routes again
// among the others, each refused at most once, and the request queues when
// none takes it, as when nothing admits.
//
// Only the reservation at dispatch goes through TryAdd; releases and the
// first byte's resize stay Add, which is never refused.
type Reserver interface {
	Ledger
	// TryAdd adds weight blocks to replica's reservation and returns
	// true if the total reserved on replica (every gateway's) is 0 before
	// it (an empty replica always takes its next request) or at most
	// limit after it; otherwise it changes nothing and returns false.
	TryAdd(replica, weight, limit int) bool
}
