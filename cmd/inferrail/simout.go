package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
)

// requestsFile is DIR/requests.parquet of sim --out, written row by row as
// the run's requests end (fleet.Config.Record, in arrival order) into a
// temporary file that close renames into place: a run that fails leaves no
// partial table, and no record is held (docs/sim-memory.md).
type requestsFile struct {
	path, tmp string
	f         *os.File
	pw        *results.ParquetWriter
	workload  string
	policy    string
	seed      uint64
	done      bool
}

// createRequestsFile creates dir and the temporary file of its
// requests.parquet for a run of cfg.
func createRequestsFile(dir string, cfg fleet.Config) (*requestsFile, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	f, err := os.CreateTemp(dir, ".requests-*.parquet")
	if err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	return &requestsFile{path: filepath.Join(dir, "requests.parquet"), tmp: f.Name(), f: f, pw: results.NewParquetWriter(f),
		workload: cfg.Workload.Workload, policy: cfg.Policy, seed: cfg.Seed}, nil
}

// add writes one request's row.
func (r *requestsFile) add(rec *results.Record) error {
	if err := r.pw.Write(results.RowFromRecord(rec, r.workload, r.policy, r.seed)); err != nil {
		return fmt.Errorf("write requests: %w", err)
	}
	return nil
}

// close finishes the file and moves it into place.
func (r *requestsFile) close() error {
	r.done = true
	err := r.pw.Close()
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(r.tmp, 0o644) // as os.Create makes it, not CreateTemp's 0600
	}
	if err == nil {
		err = os.Rename(r.tmp, r.path)
	}
	if err != nil {
		os.Remove(r.tmp)
		return fmt.Errorf("write requests: %w", err)
	}
	return nil
}

// abort removes the temporary file of a run that did not reach close.
func (r *requestsFile) abort() {
	if r == nil || r.done {
		return
	}
	r.done = true
	r.f.Close()
	os.Remove(r.tmp)
}
