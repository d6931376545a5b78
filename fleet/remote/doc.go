// Package remote is what the live proxy knows of real engines (vLLM,
// SGLang) behind it: their load, read by scraping their Prometheus
// /metrics pages; their health, from active probes; and their addresses,
// from DNS.
//
// Start with metrics.go: ParseMetrics turns one /metrics page, vLLM's or
// SGLang's, in the Prometheus text format or OpenMetrics, into a Load
// (running and waiting requests, KV cache usage, prefix cache counters,
// capacity), summing data-parallel ranks. A page that lacks the running and
// waiting families is an error wrapping ErrUnreadable, never an idle engine.
//
// Then the three loops, each configured by a struct that is validated once
// by its constructor, each driven by Run(ctx) until ctx ends, each with a
// SetTargets that may be called at any time:
//
//   - Scraper (scraper.go) reads every target's page every Interval, all
//     targets in parallel, at most one scrape in flight per target, each
//     bounded by Timeout and MaxBytes. Report keeps the last good Load apart
//     from the latest error, so that a caller can tell a fresh load from a
//     stale one and from an engine whose page cannot be read (Report.State).
//   - Prober (prober.go) asks every target's health path every Interval;
//     a 2xx answer within Timeout is healthy.
//   - Discovery (discovery.go) resolves DNS names into endpoints every
//     Refresh and reports a group's set only when it changes; a failed
//     lookup keeps the last known set.
//
// Scraper and Prober share the per-target dispatch loop in poll.go. Nothing
// here reads a clock directly except through time.Now (or ScraperConfig.Now)
// and timers, so tests drive everything under testing/synctest with an
// in-memory transport.
package remote
