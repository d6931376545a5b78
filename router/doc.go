// Package router decides which replica serves a request. The same code runs
// in the simulator (package fleet) and, later, in the live proxy, so it
// imports neither: it sees requests and candidates, never HTTP or engines.
//
// Start with Policy and Candidate (policy.go), then the baselines in
// baseline.go, and New, which builds a policy by name from a seed.
package router
