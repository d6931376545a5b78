package kvindex

import (
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
// synchronisation: the index has one caller goroutine then, and takes no
// lock (the lock's shared counter moved between the two cores at every
// call, a few percent of a run).
//
// A job reads only hashes that stay put until it is done: RecordPinned's
// (the caller keeps them until Release, TakeBack or Finish, which wait for
// the job), and copies Finish takes of its answer and of its receipt's
// hashes, so that the caller may reuse those as soon as Finish returns.
type background struct {
	lane *lane.Lane // nil: no background work
	// last is the lane's ticket of the index's last job (0: none yet);
	// pinned and pinnedGen those of the last RecordPinned job.
	last, pinned, pinnedGen uint64
	// next numbers the index's jobs, whose slot is ring[next%jobRing].
	next uint64
	ring [jobRing]job
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
		x.bg.lane.Wait(x.bg.last)
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
		x.bg.lane.Wait(x.bg.last)
		return
	}
	x.mu.RLock()
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
	switch j.kind {
	case jobPinned:
		x.insert(j.p, j.r, j.hashes, kindPinned, j.gen, j.gen, j.ids)
	case jobFinish:
		x.finish(j.r, j.answer, j.receipt)
	}
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
