// Package router decides which replica serves a request. The same code runs
// in the simulator (package fleet) and the live proxy (package live), so it
// imports neither: it sees requests and candidates, never HTTP or engines.
//
// Start with Policy and Candidate (policy.go), then the baselines in
// baseline.go, our cache-aware policies in cacheaware.go, and NewPolicy,
// which builds a policy by name from a seed. New builds a Router
// (router.go), which puts a policy and the KV index (router/kvindex) together:
// RouteAdmitted filters the eligible replicas (eligible.go), predicts what
// each holds, lets an admission filter drop those that cannot take the
// request, and lets the policy choose among the rest.
//
// Everything around a routing decision (the gateway's view of each replica,
// admission, the queue, the lifecycle of a request) is the gateway core,
// router/gateway, which both the simulator and the proxy drive.
package router
