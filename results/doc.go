// Package results holds what a simulation run produces and how it is reported:
// the per-request Record, the statistics computed over records, and the
// writers that put them on disk or on a terminal.
//
// Start reading at Record (record.go), then Summarize (summary.go), which
// reduces a run's records to a Summary: latency percentiles, throughput, cache
// hit rates, SLO attainment and goodput, per-replica load (busy fraction, peak
// KV-cache reservation and running requests, preemptions) and, when requests
// carry priorities, a per-priority breakdown. Requests the gateway refused
// have OutcomeRejected and a reason (Record.Reject); they count as failed but
// apart from engine failures (Summary.Rejected, Summary.EngineFailed), and
// never in dispatch statistics such as the router wait. Histogram
// (histogram.go) is the bounded-error, allocation-free sketch used for metrics
// with millions of samples such as inter-token latency; Quantile (stats.go) is
// the exact, interpolating percentile used for per-request metrics.
//
// Writers: WriteJSON and WriteSummaryFile (json.go) for summaries, Row,
// RowsFromRecords, WriteParquet and ReadParquet (parquet.go) for per-request
// tables, and FormatTable (table.go) for a human-readable comparison.
//
// Everything here is deterministic: the same input always yields
// byte-identical output. Floats in a Summary are rounded to a fixed precision
// and are never NaN or infinite, so summaries always encode as JSON.
package results
