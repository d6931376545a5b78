package fidelity

import (
	"bytes"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/traces"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const (
	testN    = 600
	testRate = 12.0
)

// A recording the simulator itself produced replays to itself: every
// error is zero, every request matched, every replica paired with its own
// name, though the rows come in completion order.
func TestSelfRecordingHasNoError(t *testing.T) {
	rec := completionOrder(recordOf(t, synthRecords(testN, testRate, 1), "cost_model", 3, replicaName))
	res, err := Check(rec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := res.Counts
	if c.Replayed != testN || c.Matched != testN || c.Records != testN || c.Reordered == 0 {
		t.Fatalf("counts %+v: want all %d replayed and matched, some reordered", c, testN)
	}
	if res.Policy != "cost_model" || res.PolicyFrom != "records" || res.Replicas != 3 || res.ReplicasFrom != "records" {
		t.Fatalf("fleet: policy %s (%s), %d replicas (%s)", res.Policy, res.PolicyFrom, res.Replicas, res.ReplicasFrom)
	}
	for _, cmp := range []*Comparison{&res.Overall} {
		for k := range nMetrics {
			m := cmp.metric(k)
			for _, e := range []*float64{m.RelError.Mean, m.RelError.P50, m.RelError.P90, m.RelError.P99} {
				if e != nil && !approx(*e, 0, 1e-9) {
					t.Errorf("%s: relative error %v, want 0", metricKeys[k], *e)
				}
			}
			if m.MAPE != nil && !approx(*m.MAPE, 0, 1e-9) || m.MeanAbsError > 1e-9 {
				t.Errorf("%s: per request MAPE %v, mean abs %v, want 0", metricKeys[k], *m.MAPE, m.MeanAbsError)
			}
		}
	}
	if res.Overall.TTFT.RelError.P99 == nil || res.Overall.TokenHitRate.Measured < 0.3 {
		t.Fatalf("the test load has no TTFT or too little reuse: hit rate %v", res.Overall.TokenHitRate.Measured)
	}
	if !res.Mapping.Meaningful || res.Mapping.Agreement != 1 {
		t.Fatalf("mapping %+v: want every request on its own replica", res.Mapping)
	}
	for _, p := range res.Mapping.Pairs {
		if p.Recorded != replicaName(p.Simulated) {
			t.Errorf("simulated %d paired with %s", p.Simulated, p.Recorded)
		}
	}
	if len(res.PerReplica) != 3 {
		t.Fatalf("%d per-replica comparisons", len(res.PerReplica))
	}
	for _, r := range res.PerReplica {
		if e := r.TTFT.RelError.P99; e == nil || *e != 0 || r.Measured != r.Predicted || r.Paired != r.Measured {
			t.Errorf("replica %s: TTFT p99 error %v, requests %d/%d/%d", r.Recorded, e, r.Measured, r.Predicted, r.Paired)
		}
	}
}

// A recording whose TTFTs were 25% longer and whose engines found nothing
// cached: the predicted TTFT is 20% short at every percentile, and the hit
// rate difference is the predicted hit rate.
func TestPerturbedRecordingGivesItsError(t *testing.T) {
	rec := recordOf(t, synthRecords(testN, testRate, 2), "cost_model", 3, replicaName)
	clean, err := Check(rec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range rec {
		m := *rec[i].Measured
		m.TTFT = m.TTFT * 5 / 4
		m.CachedTokens = 0
		rec[i].Measured = &m
	}
	res, err := Check(rec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tt := res.Overall.TTFT
	for name, e := range map[string]*float64{"mean": tt.RelError.Mean, "p50": tt.RelError.P50, "p90": tt.RelError.P90, "p99": tt.RelError.P99} {
		if e == nil || !approx(*e, -0.2, 1e-6) {
			t.Errorf("TTFT %s error %v, want -0.2", name, e)
		}
	}
	if *tt.MAPE < 0.19 || *tt.MAPE > 0.21 || !approx(*tt.MedianRatio, 0.8, 1e-6) {
		t.Errorf("per request: MAPE %v, median ratio %v; want about 0.2 and 0.8", *tt.MAPE, *tt.MedianRatio)
	}
	if e := res.Overall.E2E.RelError.P99; e == nil || *e != 0 {
		t.Errorf("E2E p99 error %v, want 0 (only TTFT was perturbed)", e)
	}
	hr := res.Overall.TokenHitRate
	if hr.Measured != 0 || hr.Predicted != clean.Overall.TokenHitRate.Predicted || hr.Diff != hr.Predicted {
		t.Errorf("hit rate %+v, want measured 0 and the diff the predicted %v", hr, clean.Overall.TokenHitRate.Predicted)
	}
	if !strings.Contains(strings.Join(res.reading(), " "), "TTFT") {
		t.Errorf("the reading does not name the TTFT error: %q", res.reading())
	}
}

// Failed and rejected recorded requests are counted by outcome and left out
// of the comparisons; rate_limited ones are not even replayed (the limiter
// answers them before the gateway core), so the rest still replays exactly.
func TestFailuresAreCountedAndExcluded(t *testing.T) {
	rec := recordOf(t, synthRecords(300, testRate, 3), "cost_model", 3, replicaName)
	for i := range 5 {
		m := *rec[10*i].Measured
		m.Outcome, m.TTFT, m.E2E, m.TPOT = results.RejectQueueTimeout, 0, 0, 0
		rec[10*i].Measured = &m
	}
	for i := range 7 {
		r := rec[i]
		r.ID = uint64(90000 + i)
		r.Measured = &traces.Measured{Outcome: results.RejectRateLimited, Policy: "cost_model", CachedTokens: -1}
		rec = append(rec, r)
	}
	res, err := Check(rec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := res.Counts
	if c.Records != 307 || c.NotReplayed[results.RejectRateLimited] != 7 || c.Replayed != 300 || c.Matched != 295 ||
		c.OnlyInRecordingFailed != 5 || c.RecordedFailed[results.RejectQueueTimeout] != 5 || c.BothFailed != 0 {
		t.Fatalf("counts %+v", c)
	}
	if e := res.Overall.TTFT.RelError.P99; e == nil || *e != 0 {
		t.Fatalf("TTFT p99 error %v: the excluded requests changed the replay", e)
	}
	var md bytes.Buffer
	if err := res.Markdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| queue_timeout | waited in the gateway's queue past its timeout | 5 | 0 |", "not replayed: rate_limited", "left out of every latency"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("fidelity.md lacks %q", want)
		}
	}
}

// The recorded names in the metadata's order, served by permuted replicas:
// the mapping follows the requests, not the order. Scrambled replica names
// give a mapping that is not meaningful, and each side alone.
func TestReplicaMapping(t *testing.T) {
	names := []string{"gpu-a", "gpu-b", "gpu-c"}
	perm := []int{2, 0, 1}
	rec := recordOf(t, synthRecords(testN, testRate, 4), "cost_model", 3, func(i int) string { return names[perm[i]] })
	fl := map[string]RecordedModel{"m": {Replicas: names}}
	res, err := Check(rec, Options{Fleet: fl})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Mapping.Meaningful || res.Mapping.Order != "metadata" || res.ReplicasFrom != "metadata" {
		t.Fatalf("mapping %+v", res.Mapping)
	}
	for k, p := range res.Mapping.Pairs {
		if p.Recorded != names[k] || perm[p.Simulated] != k {
			t.Errorf("pair %d: simulated %d with %s, want %s", k, p.Simulated, p.Recorded, names[perm[p.Simulated]])
		}
	}
	for _, r := range res.PerReplica {
		if e := r.TTFT.RelError.P50; e == nil || *e != 0 {
			t.Errorf("replica %s: TTFT p50 error %v", r.Recorded, e)
		}
	}

	// A replica of the metadata that served nothing is still in the fleet.
	res, err = Check(rec, Options{Fleet: map[string]RecordedModel{"m": {Replicas: append(names, "gpu-idle")}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replicas != 4 || res.Mapping.Meaningful {
		t.Fatalf("4 recorded replicas: simulated %d, mapping %+v", res.Replicas, res.Mapping)
	}

	rng := rand.New(rand.NewPCG(9, 9))
	for i := range rec {
		m := *rec[i].Measured
		m.Replica = names[rng.IntN(3)]
		rec[i].Measured = &m
	}
	res, err = Check(rec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Mapping.Meaningful || res.Mapping.Agreement > 0.5 || len(res.PerReplica) != 0 ||
		len(res.MeasuredReplicas) != 3 || len(res.PredictedReplicas) != 3 || res.MeasuredReplicas[0].Replica != "gpu-a" || res.PredictedReplicas[2].Replica != "sim-2" {
		t.Fatalf("scrambled: mapping %+v, %d per replica, sides %d and %d", res.Mapping, len(res.PerReplica), len(res.MeasuredReplicas), len(res.PredictedReplicas))
	}
	if !strings.Contains(res.Mapping.Why, "halfway from chance") {
		t.Errorf("why: %q", res.Mapping.Why)
	}

	// A fleet size that differs from the recorded one has no mapping.
	res, err = Check(rec, Options{Replicas: 4, Policy: "round_robin"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Mapping.Meaningful || !strings.Contains(res.Mapping.Why, "ran 4 replicas and the recording names 3") || res.PolicyFrom != "option" {
		t.Fatalf("4 replicas: mapping %+v", res.Mapping)
	}
	if r := strings.Join(res.reading(), " "); !strings.Contains(r, "routed with round_robin, the recording with cost_model") || !strings.Contains(r, "ran 4 replicas, the recording 3") {
		t.Errorf("the reading does not say the replay changed the policy and the fleet: %q", r)
	}
}

// Bad input is an *InputError that says what is wrong and what to do.
func TestBadInput(t *testing.T) {
	load := synthRecords(20, testRate, 5)
	good := recordOf(t, load, "cost_model", 2, replicaName)
	with := func(f func([]traces.Record) []traces.Record) []traces.Record {
		c := append([]traces.Record(nil), good...)
		for i := range c {
			m := *c[i].Measured
			c[i].Measured = &m
		}
		return f(c)
	}
	cases := []struct {
		name     string
		recs     []traces.Record
		o        Options
		mentions []string
	}{
		{"no measured columns", load, Options{}, []string{"no measured columns", "record:"}},
		{"empty", nil, Options{}, []string{"no records"}},
		{"some unmeasured", with(func(c []traces.Record) []traces.Record { c[3].Measured = nil; return c }), Options{}, []string{"record 4", "no measured"}},
		{"unknown recorded policy", with(func(c []traces.Record) []traces.Record {
			for i := range c {
				c[i].Measured.Policy = "nosuch"
			}
			return c
		}), Options{}, []string{`"nosuch"`, "unknown policy", "cost_model"}},
		{"unknown policy option", good, Options{Policy: "nosuch"}, []string{"policy", `"nosuch"`}},
		{"two policies", with(func(c []traces.Record) []traces.Record { c[0].Measured.Policy = "p2c"; return c }), Options{}, []string{"several policies", "cost_model (19)", "p2c (1)"}},
		{"no policy", with(func(c []traces.Record) []traces.Record {
			for i := range c {
				c[i].Measured.Policy = ""
			}
			return c
		}), Options{}, []string{"names its policy"}},
		{"duplicate id", with(func(c []traces.Record) []traces.Record { c[5].ID = c[2].ID; return c }), Options{}, []string{"appears twice"}},
		{"two models", with(func(c []traces.Record) []traces.Record { c[1].Model = "other"; return c }), Options{}, []string{"m (19)", "other (1)"}},
		{"unknown model", good, Options{Model: "other"}, []string{`"other"`, "m (20)"}},
		{"bad record", with(func(c []traces.Record) []traces.Record { c[2].InputTokens = 0; return c }), Options{}, []string{"record 3", "input length 0"}},
		{"replica not in the fleet", good, Options{Fleet: map[string]RecordedModel{"m": {Replicas: []string{"replica-0"}}}}, []string{`"replica-1"`, "not among"}},
		{"only rate limited", with(func(c []traces.Record) []traces.Record {
			for i := range c {
				c[i].Measured.Outcome = results.RejectRateLimited
			}
			return c
		}), Options{}, []string{"nothing to replay", "rate_limited (20)"}},
		{"replicas out of range", good, Options{Replicas: 100000}, []string{"replicas", "4096"}},
	}
	for _, c := range cases {
		_, err := Check(c.recs, c.o)
		var ie *InputError
		if !errors.As(err, &ie) {
			t.Errorf("%s: error %v, want an *InputError", c.name, err)
			continue
		}
		for _, m := range c.mentions {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: %q does not mention %q", c.name, err, m)
			}
		}
	}
	if _, err := Check(load, Options{}); !errors.Is(err, ErrNoMeasured) {
		t.Errorf("no measured columns: %v is not ErrNoMeasured", err)
	}
}

// fidelity.md of a small recording is golden (go test ./fidelity -update
// rewrites it), and Write gives the same bytes twice.
func TestReportGoldenAndDeterministic(t *testing.T) {
	rec := recordOf(t, synthRecords(200, testRate, 6), "cost_model", 2, replicaName)
	for i := range rec {
		m := *rec[i].Measured
		m.TTFT += m.TTFT / time.Duration(3+i%5)
		if i%40 == 0 {
			m.Outcome = results.FailEngine
		}
		rec[i].Measured = &m
	}
	res, err := Check(rec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	res.Trace = "recorded.parquet"
	dirs := []string{t.TempDir(), t.TempDir()}
	var files [][]string
	for _, d := range dirs {
		fs, err := res.Write(d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, fs)
	}
	if len(files[0]) < 5 {
		t.Fatalf("wrote %v: want the report, the JSON and charts", files[0])
	}
	for i := range files[0] {
		a, _ := os.ReadFile(files[0][i])
		b, _ := os.ReadFile(files[1][i])
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Errorf("%s: %d and %d bytes, not identical", filepath.Base(files[0][i]), len(a), len(b))
		}
	}
	for _, name := range []string{ReportFile, JSONFile} {
		got, err := os.ReadFile(filepath.Join(dirs[0], name))
		if err != nil {
			t.Fatal(err)
		}
		golden := filepath.Join("testdata", name)
		if *update {
			if err := os.WriteFile(golden, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (run go test ./fidelity -run Golden -update)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s (go test ./fidelity -run Golden -update rewrites it):\n%s", name, golden, got)
		}
	}
	if out := *flagOut; out != "" {
		if _, err := res.Write(out); err != nil {
			t.Fatal(err)
		}
	}
}

var flagOut = flag.String("out", "", "also write the golden test's report into this directory, for a look")

// A recording's metadata names the fleet and the policy (they win over what
// the records say), its sample (a sampled recording is refused) and its
// drops (reported).
func TestRecordingMetadata(t *testing.T) {
	rec := recordOf(t, synthRecords(200, testRate, 7), "cost_model", 2, replicaName)
	var o Options
	o.UseRecording(traces.RecordingMeta{Fleet: map[string][]string{"m": {"replica-1", "replica-0"}}, Policy: map[string]string{"m": "cost_model"}, Sample: 1, Dropped: 3})
	res, err := Check(rec, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.PolicyFrom != "metadata" || res.ReplicasFrom != "metadata" || res.Mapping.Order != "metadata" || res.Counts.RecorderDropped != 3 {
		t.Fatalf("policy from %s, replicas from %s, order %s, dropped %d", res.PolicyFrom, res.ReplicasFrom, res.Mapping.Order, res.Counts.RecorderDropped)
	}
	if res.PerReplica[0].Recorded != "replica-1" || res.PerReplica[0].Simulated != 1 {
		t.Errorf("per replica in the metadata's order: %+v", res.PerReplica[0])
	}
	if !strings.Contains(strings.Join(res.reading(), " "), "dropped 3 requests") {
		t.Errorf("the reading does not state the drops: %q", res.reading())
	}
	o.Sample = 0.1
	_, err = Check(rec, o)
	var ie *InputError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "sample of 10%") || !strings.Contains(err.Error(), "sample: 1") {
		t.Errorf("a 10%% sample: %v", err)
	}
}

// A live configuration gives each model's replicas in order, its policy and
// its gateway settings.
func TestFromLiveConfig(t *testing.T) {
	c := config.Default()
	m := config.DefaultModel()
	m.Name, m.Policy, m.Admission = "m", "prefix_hash", "none"
	m.Queue.MaxRequests = 7
	m.Replicas = []config.Replica{{Name: "z", URL: "http://z:80"}, {Name: "a", URL: "http://a:80"}}
	c.Models = []config.Model{m}
	fl, g, err := FromLiveConfig(&c, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := fl["m"]; got.Policy != "prefix_hash" || len(got.Replicas) != 2 || got.Replicas[0] != "z" {
		t.Errorf("fleet %+v", got)
	}
	if g.Admission != "none" || g.QueueMax != 7 || g.ScrapeInterval != c.Scrape.Interval || g.Index != fleet.IndexApproximate {
		t.Errorf("gateway %+v", g)
	}
	if _, _, err := FromLiveConfig(&c, "other"); err == nil || !strings.Contains(err.Error(), `"other"`) {
		t.Errorf("an unknown model: %v", err)
	}
}
