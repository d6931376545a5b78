package kvindex

import (
	"github.com/inferrail/inferrail/engine/kvblock"
)

// expiry is a speculative record waiting to expire. The index keeps them in
// a timeheap.Heap by expiry time, then push order, which is gen order: a
// record's gen is handed out and pushed under the same lock.
type expiry struct {
	gen     uint64
	replica int
	hashes  []kvblock.Hash
}
