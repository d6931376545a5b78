// Package compare runs the same traffic through several routing policies,
// seeds and offered loads, and answers the operator's question: how many
// GPUs does each policy need to serve this traffic within the SLO?
//
// Start with Spec and Run (compare.go): every policy x admission rule x
// ledger x P/D pool (a Variant, labelled policy+admission[+ledger] when a
// spec compares several rules or ledgers, and +P2D6 or +aggregated when it
// compares several pools, Spec.Pools, pools.go) x seed x rate is one
// cold-fleet simulation (package fleet) run in parallel, returned in a fixed
// order whatever the parallelism. Capacity (capacity.go) searches, per
// variant, the fewest replicas that meet the SLO at a rate, and with
// CapacitySpec.Split the best prefill/decode split of each size too. Write
// (output.go) stores results.json, requests.parquet and the report (package
// report), whose P/D and KV tiers tables appear when the runs' summaries
// have them (docs/pd-lab.md).
// The defaults of the commands live here too: DefaultRequests, DefaultWarmup
// and CapacityRateReplicas (capacity without a rate offers the default rate,
// fleet.Config.DefaultRate, of that many replicas).
//
// Runs that fail requests say why once (results.FailureNotes,
// CapacityReport.FailureNotes), and runs that look too short for their
// answer are listed (SteadyWarnings; a capacity answer whose runs are not
// steady carries CapacityResult.Warning: a longer run may need more
// replicas).
//
// With a tenant mix, Spec.Limits compares the workload's tenant rate limits
// on and off (variants +limits-on, +limits-off) and Spec.Isolate runs every
// variant again without one tenant (+without-TENANT); Isolation
// (tenants.go) sets every other tenant's TTFT p99 with it against without
// it, seed by seed, and Write adds the per-tenant and isolation tables to
// report.md.
//
// Sweeps past one machine (sweep.go, sweep_run.go, sweep_merge.go): Plan
// writes a spec's jobs, each fully described, to DIR/plan.json; RunShard
// runs the jobs of shard i of N, each result written atomically and skipped
// when already there, so a killed shard resumes; Merge checks that every
// job is done under the same plan and build and calls Write, giving the
// byte-identical outputs of one unsharded Run (docs/sweeps.md).
package compare
