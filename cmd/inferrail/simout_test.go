package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/workload"
)

// sim --out streams requests.parquet as requests end: the file holds the
// rows of the same run with its records held, in arrival order, byte for
// byte the same on a second run, and no temporary file is left.
func TestSimOutStreamsRequests(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	args := []string{"sim", "--workload", "w1", "--replicas", "3", "--requests", "400", "--policy", "cost_model", "--out", dir, "--json"}
	code, out, errOut := runCLI(args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var sum results.Summary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "requests.parquet")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := results.ReadParquet(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}

	c := fleet.DefaultConfig()
	w, err := workload.DefaultConfig("w1")
	if err != nil {
		t.Fatal(err)
	}
	w.Requests = 400
	c.Workload, c.Replicas, c.Policy = w, 3, "cost_model"
	c.Workload.Rate = c.DefaultRate()
	held, err := fleet.Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	if want := results.RowsFromRecords(held.Records, "w1", "cost_model", 1); !reflect.DeepEqual(rows, want) {
		t.Fatalf("requests.parquet has %d rows unlike the %d of the run with its records held", len(rows), len(want))
	}
	sum.SimWallS, held.Summary.SimWallS = 0, 0
	if !reflect.DeepEqual(sum, held.Summary) {
		t.Errorf("sim's summary differs from the run with its records held:\n%+v\n%+v", sum, held.Summary)
	}

	if code, _, errOut := runCLI(args...); code != 0 {
		t.Fatalf("second run: exit %d: %s", code, errOut)
	}
	again, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, again) {
		t.Error("the same run wrote different requests.parquet bytes")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "requests.parquet" && e.Name() != "summary.json" {
			t.Errorf("left %s in the output directory", e.Name())
		}
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("requests.parquet mode %v, %v; want 0644", st.Mode().Perm(), err)
	}
}

// A run that fails leaves no partial requests.parquet behind.
func TestRequestsFileAbortLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	rf, err := createRequestsFile(dir, fleet.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := rf.add(&results.Record{ID: 1, Replica: -1, Outcome: results.OutcomeFailed}); err != nil {
		t.Fatal(err)
	}
	rf.abort()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("an aborted run left %d files, the first %s", len(entries), entries[0].Name())
	}
}
