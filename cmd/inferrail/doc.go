// Command inferrail is one binary for the router and its lab. Today it has
// `inferrail sim`: a discrete-event simulation of a vLLM fleet behind the
// real router (packages fleet, router, engine, workload, results).
//
// The CLI is thin: main.go builds the cobra tree and maps errors to exit
// codes (2 for bad input, 1 for failures); sim.go turns flags into a
// validated fleet.Config and prints what fleet.Simulate returns.
package main
