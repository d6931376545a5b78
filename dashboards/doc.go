// Package dashboards holds the Grafana dashboard of inferrail and the tests
// that keep it honest.
//
// Start with inferrail.json: a dashboard (Grafana schema 39) for the
// gateway's admin /metrics and its vLLM engines' /metrics, importable as it
// is (the data source is the DS_PROMETHEUS input, bound to the datasource
// variable; model and replica are template variables). Its rows: an
// overview, time to first token (gateway and engines, per replica and per
// policy), load and queue, engines (queues, KV usage, finishes, tokens),
// routing (traffic share, decision time), KV cache hit rate (predicted
// against engine-measured) and the index, admission (reserved against
// capacity, rejections), errors and resilience (outcomes, upstream errors,
// retries, ejections, health, tokenization, failing scrapes), and build and
// process. Engine series are expected to carry a replica label equal to the
// gateway's replica name (a static target label or a relabelling rule), as
// scripts/stack.sh configures Prometheus.
//
// dashboard_test.go parses every query with the PromQL parser and checks
// that each metric it selects, and each label it matches on, is exported:
// the gateway's from live/testdata/metrics.golden, the engines' from an
// in-process mock engine's /metrics, Go's and the process's from the same
// collectors the gateway registers. prometheus_test.go runs three
// inferrail engines (one faulty), inferrail live and Debian's Prometheus on
// loopback under about 30 s of chat and completion traffic, then evaluates
// every panel's every query through Prometheus's HTTP API and fails naming
// each panel that comes back empty.
//
// scripts/stack.sh starts the same set of processes for a person to look
// at (make stack; make stack-down stops it).
package dashboards
