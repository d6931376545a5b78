package gateway

import (
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// TraceEvent is one call into a core, with its inputs and what it decided:
// the sequence of a run's events is enough to replay it into another core
// (or another adapter) and check that it decides the same.
type TraceEvent struct {
	// Op names the call: submit, first_byte, finished, retry, fail,
	// abort, advance, report, remove_replica, poke, kv_events, prefill_done,
	// prefill_failed.
	Op string
	At time.Duration
	// Ticket is the request's (first_byte, finished, retry, fail, abort).
	Ticket Ticket
	// Request is a submit's request.
	Request Request
	// Replica is the replica of report, remove_replica and kv_events.
	Replica int
	Cached  int
	Usage   Usage
	Held    []kvblock.Hash
	Report  Report
	Fault   bool
	// Decision is submit's and retry's own decision; Others what the call
	// decided for queued requests (a copy).
	Decision Decision
	Others   []Decision
	// KV is a kv_events call's events (a copy of the slice). Request's
	// block hashes and allowed replicas, and Held, are copies too.
	KV []KVEvent
}

func (c *Core) trace(ev TraceEvent, others []Decision) {
	// The caller may reuse its slices once the call returns: the event
	// keeps copies.
	if ev.Request.BlockHashes != nil {
		ev.Request.BlockHashes = append([]kvblock.Hash(nil), ev.Request.BlockHashes...)
	}
	if ev.Request.Allowed != nil {
		ev.Request.Allowed = append([]int{}, ev.Request.Allowed...)
	}
	if ev.Held != nil {
		ev.Held = append([]kvblock.Hash(nil), ev.Held...)
	}
	if len(others) > 0 {
		ev.Others = append([]Decision(nil), others...)
	}
	c.cfg.Trace(ev)
}

// Submit takes a new request at time now. A Dispatched or Queued decision
// names the request's Ticket; a Rejected one ends it. The returned slice
// holds the decisions of other queued requests this call dispatched or
// rejected (valid until the next call).
func (c *Core) Submit(now time.Duration, req Request) (Decision, []Decision) {
	d, o := c.submit(now, req)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "submit", At: now, Request: req, Decision: d}, o)
	}
	return d, o
}

// FirstByte records a dispatched request's first response byte; cached is
// the engine's count of prompt tokens it found cached (-1: not known yet),
// which the reservation is reconciled with.
func (c *Core) FirstByte(now time.Duration, t Ticket, cached int) []Decision {
	o := c.firstByte(now, t, cached)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "first_byte", At: now, Ticket: t, Cached: cached}, o)
	}
	return o
}

// Finished ends a served request: its reservation is released, the output
// estimate learns its usage, and the index learns the blocks the engine now
// holds (held: prompt and answer, full blocks). It returns the queued
// requests the freed capacity dispatched.
func (c *Core) Finished(now time.Duration, t Ticket, u Usage, held []kvblock.Hash) []Decision {
	o := c.finished(now, t, u, held)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "finished", At: now, Ticket: t, Usage: u, Held: held}, o)
	}
	return o
}

// Retry takes back a dispatched attempt that failed before its first byte
// (fault: the replica is to blame, and it counts toward its ejection) and
// routes the request again among the replicas it has not tried: dispatched,
// queued at the head of its line, or rejected (no_replica) when none is
// left. A stream that had started is never replayed: it ends as with Fail.
func (c *Core) Retry(now time.Duration, t Ticket, fault bool) (Decision, []Decision) {
	d, o := c.retry(now, t, fault)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "retry", At: now, Ticket: t, Fault: fault, Decision: d}, o)
	}
	return d, o
}

// Fail ends a dispatched request that failed and is not retried (fault: the
// replica is to blame). Before its first byte the index forgets the
// decision; after it, the engine computed the prompt, which stays indexed.
func (c *Core) Fail(now time.Duration, t Ticket, fault bool) []Decision {
	o := c.fail(now, t, fault)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "fail", At: now, Ticket: t, Fault: fault}, o)
	}
	return o
}

// Abort ends a request whose client went away, queued or in flight.
func (c *Core) Abort(now time.Duration, t Ticket) []Decision {
	o := c.abort(now, t)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "abort", At: now, Ticket: t}, o)
	}
	return o
}

// Advance rejects the queued requests whose deadline passed (429
// queue_timeout, 503 when no replica is healthy) and dispatches what a
// replica back from ejection can take.
func (c *Core) Advance(now time.Duration) []Decision {
	o := c.advance(now)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "advance", At: now}, o)
	}
	return o
}

// Report applies a scrape of replica i's engine metrics: its load, its KV
// capacity, and a restart (counters going backwards or the capacity
// changing: the engine's cache is empty, the index forgets it).
func (c *Core) Report(now time.Duration, i int, rep Report) []Decision {
	o := c.report(now, i, rep)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "report", At: now, Replica: i, Report: rep}, o)
	}
	return o
}

// RemoveReplica takes a replica out of rotation for good (discovery no
// longer lists it); its requests in flight end normally, and queued
// requests no other replica can take are refused.
func (c *Core) RemoveReplica(now time.Duration, i int) []Decision {
	o := c.removeReplica(now, i)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "remove_replica", At: now, Replica: i}, o)
	}
	return o
}

// Poke dispatches what the queue's head can take now, after a change the
// core was not told the time of (AddReplica, Failure, Success).
func (c *Core) Poke(now time.Duration) []Decision {
	o := c.poke(now)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "poke", At: now}, o)
	}
	return o
}

// KVEvents feeds replica i's KV events, translated to the core's hashes, to
// the index (events mode; ignored otherwise).
func (c *Core) KVEvents(now time.Duration, i int, evs []KVEvent) {
	c.kvEvents(now, i, evs)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "kv_events", At: now, Replica: i, KV: append([]KVEvent(nil), evs...)}, nil)
	}
}

// PrefillDone records that a dispatched request's remote prefill (Decision.
// Prefill) answered: the prefill replica's part ends (it keeps the prompt
// cached) and the request, pending on its decode replica, goes on there.
func (c *Core) PrefillDone(now time.Duration, t Ticket) []Decision {
	o := c.prefillDone(now, t)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "prefill_done", At: now, Ticket: t}, o)
	}
	return o
}

// PrefillFailed records that a remote prefill failed (an error, a refusal,
// an answer without the KV's transfer parameters): the prefill replica's
// part ends, a failure counts against it when fault, and the request, with
// the same ticket, prefills on its decode replica instead.
func (c *Core) PrefillFailed(now time.Duration, t Ticket, fault bool) []Decision {
	o := c.prefillFailed(now, t, fault)
	if c.cfg.Trace != nil {
		c.trace(TraceEvent{Op: "prefill_failed", At: now, Ticket: t, Fault: fault}, o)
	}
	return o
}
