// Package fleet holds the replicas and what the router knows of them. Today
// it is the virtual fleet: N engines (package engine) driven from one event
// heap on virtual time, fed by a workload source, with every request routed
// by the real router code (package router).
//
// The router sees only what a real gateway sees: its own counters (requests
// in flight, waiting for a first token, their prompt tokens) exact and
// current; the engines' own numbers (running, waiting, KV usage) only as of
// the last scrape, every ScrapeInterval.
//
// Start with Simulate (sim.go); events.go holds the event heap.
package fleet
