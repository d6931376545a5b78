package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/fidelity"
	"github.com/inferrail/inferrail/traces"
)

// writeTrace writes recs as a parquet trace, with a recording's metadata
// when meta is not nil.
func writeTrace(t *testing.T, path string, recs []traces.Record, meta ...*traces.RecordingMeta) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var wo traces.ParquetWriterOptions
	if len(meta) > 0 {
		wo.Metadata = meta[0].Metadata()
	}
	w, err := traces.NewParquetWriterOptions(f, wo)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// fakeRecording is a small recording: 40 requests on two replicas, some
// sharing a prefix, one rejected.
func fakeRecording(measured bool) []traces.Record {
	var recs []traces.Record
	for i := range 40 {
		r := traces.Record{ID: uint64(i + 1), Arrival: time.Duration(i) * 50 * time.Millisecond, Model: "m",
			InputTokens: 64, OutputTokens: 8, BlockSize: 16, HashIDs: []uint64{1, 2, uint64(100 + i), uint64(200 + i)}}
		if measured {
			r.Measured = &traces.Measured{Queue: time.Millisecond, TTFT: 40 * time.Millisecond, TPOT: 15 * time.Millisecond,
				E2E: 145 * time.Millisecond, Replica: []string{"a", "b"}[i%2], Outcome: "ok", CachedTokens: 32, Policy: "round_robin"}
			if i == 7 {
				r.Measured = &traces.Measured{Outcome: "queue_full", Policy: "round_robin", CachedTokens: -1}
			}
		}
		recs = append(recs, r)
	}
	return recs
}

// Bad input exits 2 with one line that says what to change, before any
// simulation.
func TestCLIFidelityBadInput(t *testing.T) {
	dir := t.TempDir()
	load := filepath.Join(dir, "load.parquet")
	writeTrace(t, load, fakeRecording(false))
	rec := filepath.Join(dir, "rec.parquet")
	writeTrace(t, rec, fakeRecording(true))
	empty := filepath.Join(dir, "empty.parquet")
	writeTrace(t, empty, nil)
	badProfile := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badProfile, []byte("latency:\n  prefill_token_us: -1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args     []string
		mentions []string
	}{
		{[]string{"fidelity"}, []string{"--trace", "required"}},
		{[]string{"fidelity", "--trace", filepath.Join(dir, "nosuch.parquet")}, []string{"--trace", "nosuch.parquet"}},
		{[]string{"fidelity", "--trace", load}, []string{"no measured columns", "record:"}},
		{[]string{"fidelity", "--trace", sampleTrace}, []string{"no measured columns"}},
		{[]string{"fidelity", "--trace", empty}, []string{"no records"}},
		{[]string{"fidelity", "--trace", rec, "--policy", "nosuch"}, []string{"policy", `"nosuch"`, "cost_model"}},
		{[]string{"fidelity", "--trace", rec, "--replicas", "-1"}, []string{"replicas", "4096"}},
		{[]string{"fidelity", "--trace", rec, "--profile", badProfile}, []string{"--profile", "prefill_token_us"}},
		{[]string{"fidelity", "--trace", rec, "--model", "other"}, []string{`"other"`, "m (40)"}},
		{[]string{"fidelity", "--trace", rec, "extra"}, []string{"no arguments"}},
	}
	for _, c := range cases {
		code, out, errOut := runCLIWithin(t, 30*time.Second, c.args...)
		wantUsage(t, c.args, code, out, errOut, c.mentions...)
	}
}

// A recording checks: --json prints fidelity.json alone, --out writes the
// report, the JSON and the charts, and the table names the errors.
func TestCLIFidelityRuns(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "rec.parquet")
	writeTrace(t, rec, fakeRecording(true))
	code, out, errOut := runCLI("fidelity", "--trace", rec, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var res fidelity.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if res.Counts.Records != 40 || res.Counts.RecordedFailed["queue_full"] != 1 || res.Replicas != 2 || res.Policy != "round_robin" || res.Trace != "rec.parquet" {
		t.Fatalf("--json: %+v", res)
	}
	outDir := filepath.Join(dir, "report")
	code, out, errOut = runCLI("fidelity", "--trace", rec, "--out", outDir, "--policy", "p2c")
	if code != 0 {
		t.Fatalf("--out: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"p2c on 2 replicas", "TTFT ms", "token hit rate", fidelity.ReportFile} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	for _, name := range []string{fidelity.ReportFile, fidelity.JSONFile, "ttft_scatter.png", "ttft_cdf.png"} {
		if st, err := os.Stat(filepath.Join(outDir, name)); err != nil || st.Size() == 0 {
			t.Errorf("--out: %s missing or empty (%v)", name, err)
		}
	}
}

// A recording's metadata names the fleet (with an idle replica the records
// cannot show) and the policy; a sampled recording is refused.
func TestCLIFidelityReadsRecordingMetadata(t *testing.T) {
	dir := t.TempDir()
	meta := &traces.RecordingMeta{Start: time.Unix(0, 0), SaltFingerprint: "0123456789abcdef", Sample: 1, Sequence: 1,
		Fleet: map[string][]string{"m": {"b", "a", "idle"}}, Policy: map[string]string{"m": "least_request"}, BlockSize: map[string]int{"m": 16},
		Dropped: 2, Reordered: 0}
	rec := filepath.Join(dir, "rec.parquet")
	writeTrace(t, rec, fakeRecording(true), meta)
	code, out, errOut := runCLI("fidelity", "--trace", rec, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var res fidelity.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Replicas != 3 || res.ReplicasFrom != "metadata" || res.Policy != "least_request" || res.PolicyFrom != "metadata" || res.Counts.RecorderDropped != 2 {
		t.Fatalf("from the metadata: %d replicas from %s, policy %s from %s, dropped %d", res.Replicas, res.ReplicasFrom, res.Policy, res.PolicyFrom, res.Counts.RecorderDropped)
	}
	meta.Sample = 0.25
	sampled := filepath.Join(dir, "sampled.parquet")
	writeTrace(t, sampled, fakeRecording(true), meta)
	args := []string{"fidelity", "--trace", sampled}
	code, out, errOut = runCLIWithin(t, 30*time.Second, args...)
	wantUsage(t, args, code, out, errOut, "sample of 25%", "sample: 1")
}
