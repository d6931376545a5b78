package kvindex

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// Background work (Config.Background). RecordPinned and Finish are most of
// the index's cost in a simulation, and their callers need nothing from
// them but RecordPinned's receipt, which is known before the work is done
// (its generation and pin slot). So with Background they set the receipt
// and the work aside for a worker goroutine and return: the caller steps
// its engines while the index updates on another core. Every other method
// first waits for the jobs in hand (settle), and so does RecordPinned, so
// calls still take effect one at a time, in the order they were made, with
// the same results as without Background. Finish alone queues behind the
// jobs in hand (up to jobRing of them) without waiting: an engine step often
// ends several requests at once. Waiting for the jobs is the only
// synchronisation: the index has one caller goroutine then, and takes no
// lock (the lock's shared counter moved between the two cores at every
// call, a few percent of a run).
//
// Starting a goroutine per job would cost more than the job: a new
// goroutine waits tens of microseconds for an idle core to wake and take
// it. The worker instead polls for the next job, and leaves once none has
// come for workerIdle, so that an index nobody calls holds no goroutine; the
// next job starts another. The caller polls for the jobs in hand too (they
// are microseconds of work), yielding now and then in case the worker shares
// its core.
//
// A job reads only hashes that stay put until it is done: RecordPinned's
// (the caller keeps them until Release, TakeBack or Finish, which wait for
// the job), and copies Finish takes of its answer and of its receipt's
// hashes, so that the caller may reuse those as soon as Finish returns.
type background struct {
	on bool
	// issued and done count the jobs handed to the worker and those it
	// finished; job i lives in ring[i%jobRing] until done passes it.
	issued, done atomic.Uint64
	// pinned is one plus the number of the last RecordPinned job, 0 before
	// the first, and pinnedGen its generation.
	pinned, pinnedGen uint64
	worker            atomic.Bool // a worker goroutine is running
	ring              [jobRing]job
}

// jobRing bounds the jobs in hand.
const jobRing = 16

// workerIdle is how long the worker polls for a job before it leaves.
const workerIdle = 500 * time.Microsecond

type jobKind uint8

const (
	jobPinned jobKind = iota // RecordPinned's insertions
	jobFinish                // Finish: Record of the answer, then Release
)

// job is one piece of work set aside for the worker.
type job struct {
	kind       jobKind
	r          int
	p          *replica
	hashes     []kvblock.Hash
	gen, stamp uint64
	ids        []int32
	receipt    Receipt
	// answer and prompt hold a Finish's copies of its hashes (kept, with
	// their capacity, for the next job in this slot).
	answer, prompt []kvblock.Hash
}

// lock takes the write lock, or with Background waits for the jobs in hand
// (the caller is the index's only goroutine, and the worker's).
func (x *Index) lock() {
	if x.bg.on {
		x.bg.settle(0)
		return
	}
	x.mu.Lock()
}

func (x *Index) unlock() {
	if !x.bg.on {
		x.mu.Unlock()
	}
}

// rlock and runlock are lock and unlock for reading.
func (x *Index) rlock() {
	if x.bg.on {
		x.bg.settle(0)
		return
	}
	x.mu.RLock()
}

func (x *Index) runlock() {
	if !x.bg.on {
		x.mu.RUnlock()
	}
}

// settle waits until at most keep jobs are in hand.
func (b *background) settle(keep uint64) {
	if n := b.issued.Load(); n > keep {
		b.await(n - keep)
	}
}

// await waits until the worker has done n jobs.
func (b *background) await(n uint64) {
	for i := 1; b.done.Load() < n; i++ {
		if i%1024 == 0 {
			runtime.Gosched()
		}
	}
}

// next returns the slot of the next job, once one is free.
func (b *background) next() *job {
	b.settle(jobRing - 1)
	return &b.ring[b.issued.Load()%jobRing]
}

// start hands the job just filled in to the worker, starting one if none
// runs.
func (x *Index) start() {
	b := &x.bg
	b.issued.Add(1)
	if !b.worker.Load() && b.worker.CompareAndSwap(false, true) {
		go x.work()
	}
}

// work is the worker: it does each job in turn, and leaves after
// workerIdle without one.
func (x *Index) work() {
	b := &x.bg
	last := time.Now()
	for i := 1; ; i++ {
		if d := b.done.Load(); d < b.issued.Load() {
			x.runJob(&b.ring[d%jobRing])
			b.done.Store(d + 1)
			last = time.Now()
			continue
		}
		if i%64 != 0 {
			continue
		}
		if time.Since(last) < workerIdle {
			if i%4096 == 0 {
				// Let the other goroutines of the process have this
				// core if they need it (simulations side by side).
				runtime.Gosched()
			}
			continue
		}
		b.worker.Store(false)
		// A job handed over just before the store above found the worker
		// still running: take it, unless its caller started another.
		if b.done.Load() == b.issued.Load() || !b.worker.CompareAndSwap(false, true) {
			return
		}
	}
}

// runJob does job j.
func (x *Index) runJob(j *job) {
	switch j.kind {
	case jobPinned:
		x.insert(j.p, j.r, j.hashes, kindPinned, j.gen, j.stamp, j.ids)
	case jobFinish:
		x.finish(j.r, j.answer, j.receipt)
	}
	j.p, j.hashes, j.ids, j.receipt = nil, nil, nil, Receipt{}
}

// recordPinnedBackground is RecordPinned with Background, once the jobs in
// hand are done.
func (x *Index) recordPinnedBackground(replica int, hashes []kvblock.Hash) Receipt {
	p, gen, stamp := x.begin(replica, kindPinned)
	slot, ids := p.newPins(gen, len(hashes))
	j := x.bg.next()
	j.kind, j.r, j.p, j.hashes, j.gen, j.stamp, j.ids = jobPinned, replica, p, hashes, gen, stamp, ids
	x.bg.pinned, x.bg.pinnedGen = x.bg.issued.Load()+1, gen
	x.start()
	return Receipt{hashes: hashes, gen: gen, replica: int32(replica), pin: slot}
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
	if !x.bg.on {
		x.lock()
		defer x.unlock()
		x.finish(replica, answer, r)
		return
	}
	// The caller may reuse the hashes of the request's RecordPinned once
	// it has finished: that job, if still in hand, must be done.
	if r.pin != 0 && r.gen == x.bg.pinnedGen {
		x.bg.await(x.bg.pinned)
	}
	j := x.bg.next()
	j.answer = append(j.answer[:0], answer...)
	j.prompt = append(j.prompt[:0], r.hashes...)
	r.hashes = j.prompt
	j.kind, j.r, j.receipt = jobFinish, replica, r
	x.start()
}

func (x *Index) finish(replica int, answer []kvblock.Hash, r Receipt) {
	if len(answer) > 0 {
		x.record(replica, answer, kindRecord)
	}
	x.release(r)
}
