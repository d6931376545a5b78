// Package gateway is the gateway core: the one deterministic state machine
// between "a request arrived" and "send it to replica r", shared by the
// simulator (package fleet, on virtual time) and the live proxy (package
// live, on wall-clock time, behind one lock). Like package engine it never
// reads a clock, sleeps or starts goroutines: every call is told the time.
//
// The core owns the gateway's view of each replica (its own exact counters,
// caps, health and ejection, the last engine report and its age, restart
// detection, KV-event translation into the index), eligibility, admission
// (a request's weight in KV blocks against each replica's capacity, or one of
// the peers' rules), the bounded priority queue with per-tenant fairness and
// deadlines, and the lifecycle calls that move the counters, each exactly
// once.
//
// Start with Core (core.go): Submit returns a Decision (dispatch, queued or
// rejected); FirstByte, Finished, Retry, Fail and Abort move a dispatched
// request along; Advance expires queue deadlines and NextDeadline says when
// to call it. Every call that frees capacity drains the queue at once and
// returns the queued requests it dispatched or rejected. config.go holds the
// configuration and its validation, admission.go the admission modes,
// queue.go the queue, kvsync.go the translation of engine KV events, and
// ledger.go the reservation ledger several cores may share.
package gateway
