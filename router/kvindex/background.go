package kvindex

import (
	"runtime"
	"sync/atomic"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/lane"
)

// Background work (Config.Lane). RecordPinned and Finish are most of the
// index's cost in a simulation, and their callers need nothing from them
// but RecordPinned's receipt, which is known before the work is done (its
// generation and pin slot). So with a lane they set the work aside as a job
// for the lane's worker (internal/lane) and return: the caller steps its
// engines while the index updates on another core. Every other method
// first waits for the index's jobs in hand (settle), and so does
// RecordPinned, so calls still take effect one at a time, in the order they
// were made, with the same results as without a lane. Finish alone queues
// behind the jobs in hand (up to jobRing of them) without waiting: an engine
// step often ends several requests at once. Waiting for the jobs is the only
// synchronisation but one: the index has one caller goroutine then, and
// takes no lock (the lock's shared counter moved between the two cores at
// every call, a few percent of a run). The one: while the caller waits for
// a long job, the job's changes to the shared table go through a queue
// that the caller applies (opQueue, settle), whoever holds its busy flag
// changing the shared table.
//
// A job reads only hashes that stay put until it is done: RecordPinned's
// (the caller keeps them until Release, TakeBack or Finish, which wait for
// the job), and copies Finish takes of its answer and of its receipt's
// hashes, so that the caller may reuse those as soon as Finish returns.
type background struct {
	lane *lane.Lane // nil: no background work
	// ops holds the shared table's changes that jobs made (allocated with
	// the lane). inJob is set while the worker runs a job, and direct while
	// that job applies its changes itself (holding ops.busy).
	ops           *opQueue
	inJob, direct bool
	// tail counts the ops pushed, published to ops.tail every pushBatch
	// (a store the caller's polling would see each time) and at the end of
	// a job; headSeen is the last ops.head read (the worker's).
	tail, headSeen uint64
	// left is the blocks the job in progress has left to insert.
	left int
	// last is the lane's ticket of the index's last job (0: none yet);
	// pinned and pinnedGen those of the last RecordPinned job.
	last, pinned, pinnedGen uint64
	// next numbers the index's jobs, whose slot is ring[next%jobRing].
	next uint64
	ring [jobRing]job
	// perReplica is set while the index keeps no shared table: Lookup
	// walks each candidate's own table instead (adapt decides which).
	perReplica bool
	// The current window of adapt: Lookups so far, changes the shared
	// table had (or would have had) to make, and the probes that walking
	// each candidate's table costs beyond one walk of the shared table.
	// changes is counted by the worker during a job, on a cache line of its
	// own: the caller polls the fields around it meanwhile.
	lookups   int
	extra     int64
	window    int  // Lookups per decision (adaptWindow; tests change it)
	alternate bool // tests: switch at every window, whatever the counts
	_         [64]byte
	changes   int64
	_         [56]byte
}

// adaptWindow is the Lookups over which adapt weighs the two ways.
const adaptWindow = 1024

// adapt chooses, every window of Lookups, between keeping the shared table
// and walking each candidate replica's own table, whichever costs less on
// the caller's core; the answers are the same either way. The shared table
// costs a change for every block a replica gains or loses (most of a
// long-prompt replay's index work, on the caller's core while it waits for
// a job); walking the candidates' tables costs a probe for every block each
// candidate holds where one walk of the shared table stops at the deepest
// (most of a fleet's Lookups where many replicas hold the same long
// prefix). Measured on this machine with every Lookup walking the
// candidates' tables: the Mooncake replay on 16 replicas (0.5 probes per
// change) ran 15-19% faster, W2 on 64 replicas (12 per change) 45% slower,
// W1 on 8 (1.4) about the same. The band between 1 and 2 keeps the index
// from switching back and forth, and going back to the shared table, which
// rebuilds it from every replica's blocks, waits until a window's saving
// would pay for an eighth of that rebuild. Called with the jobs settled.
func (x *Index) adapt() {
	b := &x.bg
	b.lookups++
	if b.lookups < b.window {
		return
	}
	ops, extra := b.changes, b.extra
	b.lookups, b.changes, b.extra = 0, 0, 0
	if !b.perReplica {
		if b.alternate || extra < ops {
			b.perReplica = true
			x.shared = newTable()
		}
		return
	}
	if b.alternate || (extra > 2*ops && extra-ops > int64(x.nodes()/8)) {
		x.rebuildShared()
		b.perReplica = false
	}
}

// nodes returns the blocks the replicas hold, counted once per replica.
func (x *Index) nodes() int {
	n := 0
	for _, p := range x.reps {
		if p != nil {
			n += p.n
		}
	}
	return n
}

// rebuildShared fills the shared table from the replicas' blocks.
func (x *Index) rebuildShared() {
	x.shared = newTable()
	for r, p := range x.reps {
		if p == nil {
			continue
		}
		for id := range p.nodes {
			if nd := &p.nodes[id]; nd.prev != freeNode {
				x.shared.add(nd.h, r)
			}
		}
	}
}

// jobRing bounds the index's jobs in hand.
const jobRing = 16

type jobKind uint8

const (
	jobPinned jobKind = iota // RecordPinned's insertions
	jobFinish                // Finish: Record of the answer, then Release
)

// job is one piece of work set aside for the lane.
type job struct {
	x       *Index
	ticket  uint64 // the lane's, once handed over
	kind    jobKind
	r       int
	p       *replica
	hashes  []kvblock.Hash
	gen     uint64
	ids     []int32
	receipt Receipt
	// answer and prompt hold a Finish's copies of its hashes (kept, with
	// their capacity, for the next job in this slot).
	answer, prompt []kvblock.Hash
}

// lock takes the write lock, or with a lane waits for the jobs in hand
// (the caller is the index's only goroutine).
func (x *Index) lock() {
	if x.bg.lane != nil {
		x.settle()
		return
	}
	x.mu.Lock()
}

func (x *Index) unlock() {
	if x.bg.lane == nil {
		x.mu.Unlock()
	}
}

// rlock and runlock are lock and unlock for reading.
func (x *Index) rlock() {
	if x.bg.lane != nil {
		x.settle()
		return
	}
	x.mu.RLock()
}

// settle waits for the jobs in hand and their changes to the shared table.
// Meanwhile it applies those changes itself, as the worker makes them: a
// job's work on its replica (the LRU, the replica's table, the pins) and
// on the shared table are about half each, and only the shared table is
// what the next Lookup reads. So when the loop would wait for a job (an
// arrival right after another), the two halves run on both cores at once.
// With nothing to apply, it does the lane's spare work.
//
// A job applies its changes itself as it makes them, unless the caller is
// waiting (ops.want): then it queues the rest for the caller to apply.
func (x *Index) settle() {
	b := &x.bg
	if b.lane.Done(b.last) && b.ops.empty() {
		return
	}
	b.ops.want.Store(true)
	for i := 1; ; i++ {
		if x.applyOps() {
			continue
		}
		if b.lane.Done(b.last) && b.ops.empty() {
			break
		}
		if !b.lane.Spare() && i%1024 == 0 {
			runtime.Gosched()
		}
	}
	b.ops.want.Store(false)
}

// opQueue holds, in order, the changes to the shared table that the
// worker's jobs queued (while the caller waited): the worker produces them,
// and whoever holds busy applies them (the caller while it settles, the
// worker when the queue is full and at the end of its job).
type opQueue struct {
	tail atomic.Uint64 // ops pushed (the worker's)
	_    [56]byte      // tail and head on cache lines of their own
	head atomic.Uint64 // ops applied (busy's holder's)
	busy atomic.Bool   // held by whoever changes the shared table
	want atomic.Bool   // the caller is waiting: queue the changes for it
	ring [opRing]sharedOp
}

// sharedOp is one change to the shared table: replica r holds h (add) or
// no longer does.
type sharedOp struct {
	h   kvblock.Hash
	r   int32
	add bool
}

// opRing bounds the changes not yet applied (a power of two).
const opRing = 4096

func (q *opQueue) empty() bool { return q.head.Load() == q.tail.Load() }

// sharedAdd records that replica r now holds h: at once, or in a job as a
// change to apply.
func (x *Index) sharedAdd(h kvblock.Hash, r int) {
	x.bg.changes++
	if x.bg.perReplica {
		return
	}
	if x.bg.inJob && !x.applyingDirectly() {
		x.pushOp(sharedOp{h: h, r: int32(r), add: true})
		return
	}
	x.shared.add(h, r)
}

// sharedRemove records that replica r no longer holds h.
func (x *Index) sharedRemove(h kvblock.Hash, r int) {
	x.bg.changes++
	if x.bg.perReplica {
		return
	}
	if x.bg.inJob && !x.applyingDirectly() {
		x.pushOp(sharedOp{h: h, r: int32(r)})
		return
	}
	x.shared.remove(h, r)
}

// applyingDirectly reports whether the job in progress still applies its
// changes itself; once the caller waits, and the job has at least
// handOver blocks left, it stops, for the rest of the job. (The caller
// helping with a few blocks only moved the table's cache lines between the
// cores.)
func (x *Index) applyingDirectly() bool {
	b := &x.bg
	if b.direct && b.left >= handOver && b.ops.want.Load() {
		b.direct = false
		b.ops.busy.Store(false)
	}
	return b.direct
}

// pushOp queues op (the worker's), applying the queue itself while it is
// full.
func (x *Index) pushOp(op sharedOp) {
	b := &x.bg
	q := b.ops
	t := b.tail
	if t-b.headSeen >= opRing {
		q.tail.Store(t)
		for b.headSeen = q.head.Load(); t-b.headSeen >= opRing; b.headSeen = q.head.Load() {
			x.applyOps()
		}
	}
	q.ring[t%opRing] = op
	b.tail = t + 1
	if b.tail%pushBatch == 0 {
		q.tail.Store(b.tail)
	}
}

// handOver is the fewest blocks left in a job for which the worker hands
// its shared-table changes to a waiting caller.
const handOver = 64

// pushBatch is how many ops the worker queues before it publishes them.
const pushBatch = 32

// applyOps applies the queued changes, unless another goroutine is, and
// reports whether it applied any.
func (x *Index) applyOps() bool {
	q := x.bg.ops
	if q.empty() || !q.busy.CompareAndSwap(false, true) {
		return false
	}
	any := x.applyHeld()
	q.busy.Store(false)
	return any
}

// applyHeld applies the queued changes; the caller holds busy.
func (x *Index) applyHeld() bool {
	q := x.bg.ops
	h, t := q.head.Load(), q.tail.Load()
	any := h < t
	for ; h < t; h++ {
		op := &q.ring[h%opRing]
		if op.add {
			x.shared.add(op.h, int(op.r))
		} else {
			x.shared.remove(op.h, int(op.r))
		}
		if h%256 == 255 {
			q.head.Store(h + 1) // room for the worker
		}
	}
	q.head.Store(h)
	return any
}

func (x *Index) runlock() {
	if x.bg.lane == nil {
		x.mu.RUnlock()
	}
}

// slot returns the next job's slot, once the job that used it is done.
func (b *background) slot() *job {
	j := &b.ring[b.next%jobRing]
	b.lane.Wait(j.ticket)
	return j
}

// hand hands job j, just filled in, to the lane.
func (b *background) hand(j *job) {
	b.next++
	j.ticket = b.lane.Do(j)
	b.last = j.ticket
}

// Run does the job (lane.Job).
func (j *job) Run() { j.x.runJob(j) }

func (x *Index) runJob(j *job) {
	b := &x.bg
	b.inJob = true
	if b.ops.busy.CompareAndSwap(false, true) {
		// Changes of an earlier job still queued go first.
		x.applyHeld()
		b.direct = true
	}
	switch j.kind {
	case jobPinned:
		x.insert(j.p, j.r, j.hashes, kindPinned, j.gen, j.gen, j.ids)
	case jobFinish:
		x.finish(j.r, j.answer, j.receipt)
	}
	if b.direct {
		b.direct = false
		b.ops.busy.Store(false)
	}
	b.inJob = false
	b.ops.tail.Store(b.tail)
	// What the caller has not applied of the queued changes.
	x.applyOps()
	j.p, j.hashes, j.ids, j.receipt = nil, nil, nil, Receipt{}
}

// handPinned hands RecordPinned's insertions to the lane (the receipt's
// generation gen, the pinned nodes going in ids).
func (x *Index) handPinned(p *replica, replica int, hashes []kvblock.Hash, gen uint64, ids []int32) {
	j := x.bg.slot()
	j.x, j.kind, j.r, j.p, j.hashes, j.gen, j.ids = x, jobPinned, replica, p, hashes, gen, ids
	x.bg.hand(j)
	x.bg.pinned, x.bg.pinnedGen = j.ticket, gen
}

// Finish is Record(replica, answer) and then Release(r), in one call: the
// request RecordPinned gave r for has finished, and replica now holds its
// answer's full blocks too (answer, which may be empty). It keeps no
// reference to answer or to r's hashes once it returns.
func (x *Index) Finish(replica int, answer []kvblock.Hash, r Receipt) {
	if len(answer) == 0 && r.pin == 0 {
		return
	}
	if len(answer) > 0 {
		checkReplica(replica)
	}
	if x.bg.lane == nil {
		x.lock()
		defer x.unlock()
		x.finish(replica, answer, r)
		return
	}
	// The caller may reuse the hashes of the request's RecordPinned once
	// it has finished: that job, if still in hand, must be done.
	if r.pin != 0 && r.gen == x.bg.pinnedGen {
		x.bg.lane.Wait(x.bg.pinned)
	}
	j := x.bg.slot()
	j.answer = append(j.answer[:0], answer...)
	j.prompt = append(j.prompt[:0], r.hashes...)
	r.hashes = j.prompt
	j.x, j.kind, j.r, j.receipt = x, jobFinish, replica, r
	x.bg.hand(j)
}

func (x *Index) finish(replica int, answer []kvblock.Hash, r Receipt) {
	if len(answer) > 0 {
		x.record(replica, answer, kindRecord)
	}
	x.release(r)
}
