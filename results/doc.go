// Package results holds what a simulation run produces and how it is reported:
// the per-request Record, the statistics computed over records, and the
// writers that put them on disk or on a terminal.
//
// Start reading at Record (record.go), then Summarize (summary.go), which
// reduces a run's records to a Summary through an Accumulator
// (accumulator.go), the streaming form a simulation feeds one record at a
// time as requests end, so that a run's memory does not grow with its
// length: counts, sums and means are exact; percentiles are exact up to
// SummaryOptions.ExactLimit records (DefaultExactLimit, 1,048,576) and past
// it come from sketches (sketch.go) within PercentileError, which the
// summary reports (Summary.PercentileError). The summary has latency
// percentiles, throughput, cache hit rates, SLO attainment and goodput,
// per-replica load (busy fraction, token-budget use, peak KV-cache
// reservation and running requests, preemptions) and, when requests carry
// priorities, a per-priority breakdown.
// Requests the gateway refused have OutcomeRejected and a reason
// (Record.Reject); they count as failed but apart from engine failures
// (Summary.Rejected, Summary.EngineFailed), and never in dispatch statistics
// such as the router wait. Every failure is counted by reason
// (Summary.FailedBy, with what each reason means in the run in
// Summary.FailureReasons; failures.go): FailureText says it in one line for
// a run, FailureNotes once per reason for a comparison's runs.
//
// The measured window is the span of the measured arrivals, from the first
// to the last (measured requests arrive at or after the warmup); goodput is
// counted over it, so the drain after the last arrival does not dilute it.
// Throughput is over the window and its drain (DurationS). A replica's busy
// fraction is the share of the run it spent running a step, any step, so it
// nears 1 whenever requests are in flight; its token-budget use is the share
// of its step token budget its steps filled, the load it carried.
//
// The steady-state check (steady.go) compares the two halves of the
// measured window (TTFT p99, requests in flight) and the arrival rate with
// the configured one, and warns when a run looks too short for its answer. Histogram
// (histogram.go) is the bounded-error, allocation-free sketch used for metrics
// with millions of samples such as inter-token latency; Quantile (stats.go) is
// the exact, interpolating percentile used for per-request metrics.
//
// Writers: WriteJSON and WriteSummaryFile (json.go) for summaries, Row,
// RowsFromRecords, ParquetWriter (which streams a table one row group at a
// time), WriteParquet and ReadParquet (parquet.go) for per-request tables,
// and FormatTable (table.go) for a human-readable comparison.
//
// Everything here is deterministic: the same input always yields
// byte-identical output. Floats in a Summary are rounded to a fixed precision
// and are never NaN or infinite, so summaries always encode as JSON.
package results
