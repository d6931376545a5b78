// Package testfleet runs, for a test, the loop the lab checks itself
// against: inferrail bench sending a workload to a gateway in front of
// inferrail engine servers, all on one in-memory network
// (internal/pipenet), so that inside the caller's testing/synctest bubble
// the whole loop runs on virtual time, as the simulator does. The caller
// builds the gateway (Config.Gateway, from the engines as replicas), so that
// live's own tests use the package without an import cycle; its users are
// live's fidelity and recording tests and fidelity's end-to-end loop.
//
// Start with Run.
package testfleet
