// Package fidelity checks the simulator against what really happened: it
// replays a recording of live traffic (the project's parquet trace, written
// by live's record: section, with traces.Record.Measured filled in) through
// the simulator with the recorded fleet size and policy, and compares the
// prediction with the measurement, request by request (matched by record
// id) and percentile by percentile (p50, p90, p99, mean) of queue time,
// TTFT, TPOT, E2E and hit rate, overall and per replica. This is `inferrail
// fidelity --trace`.
//
// Start with Check (check.go): it validates the records (every one must
// carry Measured, ErrNoMeasured otherwise), takes the chosen model's records
// in arrival order, leaves out the ones the tenant limiter answered before
// the gateway core (rate_limited), derives the fleet (Options.Fleet, from
// the recording's metadata or the live configuration, else the distinct
// replicas and the policy the records name), and runs fleet.Simulate on a
// traces.Source of them with live's gateway settings (Options.Gateway).
// compare.go pairs each replayed record with its simulated twin and builds
// the Result: counts by outcome (a request that failed on either side is
// counted and left out of the comparisons), a Comparison per metric, and the
// replica mapping: simulated replica i is paired with the recorded replica
// that served most of the same requests (greedy on the overlap, ties by the
// recorded order), and the pairing is called meaningful only when at least
// halfway from chance (1/N) to full agreement; otherwise each side is
// described alone. report.go renders fidelity.md and fidelity.json,
// charts.go the PNG charts (predicted against measured TTFT, and a CDF per
// metric with both sides).
//
// Bad input (no measured columns, an empty recording, duplicate ids, an
// unknown or ambiguous policy, several models without a choice) is an
// *InputError. The same records and options give the same bytes.
package fidelity
