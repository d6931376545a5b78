package report

import (
	"bytes"
	"flag"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/results"
)

var (
	update = flag.Bool("update", false, "rewrite the golden files under testdata/")
	outDir = flag.String("out", "", "also write the synthetic reports under this directory, for a look at the charts")
)

// policyShape is a synthetic policy's behaviour.
type policyShape struct {
	name        string
	p50, p99    float64 // TTFT in ms
	tpot99      float64
	hit, pred   float64
	seedSpread  float64 // relative change of TTFT between seeds
	attainment  float64
	preemptions int
	exact       float64 // share of exact predictions
	need        int     // replicas needed in the capacity search; 0 never
}

// round6 rounds like results.Summary does.
func round6(x float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'g', 6, 64), 64)
	return v
}

// synthRun makes one run of a policy shape: TTFT samples from a log-normal
// distribution with the shape's p50 and p99, and a summary computed from
// them.
func synthRun(sh policyShape, seed uint64, rate float64, replicas, requests int, withSamples bool) Run {
	mult := 1.0
	if seed%2 == 0 {
		mult += sh.seedSpread
	} else {
		mult -= sh.seedSpread
	}
	load := rate / 10 // TTFT grows with the offered rate
	p50 := sh.p50 * mult * load
	p99 := sh.p99 * mult * load * load
	sigma := math.Log(p99/p50) / 2.326
	// Quantiles of the log-normal distribution, in a scrambled order.
	ttft := make([]float64, requests)
	for i := range ttft {
		q := (float64((i*7919)%requests) + 0.5) / float64(requests)
		z := math.Sqrt2 * math.Erfinv(2*q-1)
		ttft[i] = round6(math.Exp(math.Log(p50) + sigma*z))
	}
	lat := results.LatencyOf(slices.Clone(ttft))
	slo := results.DefaultSLO()
	s := results.Summary{
		Workload:         "w1",
		Policy:           sh.name,
		Replicas:         replicas,
		Seed:             seed,
		RateRPS:          rate,
		Requests:         requests,
		Completed:        requests,
		TTFT:             results.Latency{Mean: round6(lat.Mean), P50: round6(lat.P50), P90: round6(lat.P90), P99: round6(lat.P99)},
		TPOT:             results.Latency{P50: sh.tpot99 / 2, P99: sh.tpot99},
		HitRate:          sh.hit,
		PredictedHitRate: sh.pred,
		Prediction:       results.Prediction{Exact: sh.exact},
		SLOTTFTP99Ms:     2000,
		SLOTPOTP99Ms:     100,
		SLOAttainment:    sh.attainment,
		Preemptions:      sh.preemptions,
		ThroughputRPS:    rate,
	}
	s.SLOMet = s.TTFT.P99 <= float64(slo.TTFTP99/time.Millisecond) && s.TPOT.P99 <= float64(slo.TPOTP99/time.Millisecond)
	s.GoodputRPS = round6(rate * sh.attainment / math.Max(1, load*load*p99/2000))
	for r := range replicas {
		share := 1.0
		if sh.hit > 0.5 { // cache-aware: skewed load
			share = 1.6 - 0.4*float64(r)
		}
		s.PerReplica = append(s.PerReplica, results.ReplicaSummary{
			Replica:      "replica-" + strconv.Itoa(r),
			Requests:     int(math.Round(float64(requests) / float64(replicas) * share)),
			HitRate:      sh.hit,
			BusyFraction: math.Min(1, 0.55*share*load),
		})
	}
	run := Run{Policy: sh.name, Seed: seed, RateRPS: rate, Replicas: replicas, Summary: s}
	if withSamples {
		run.TTFTms = ttft
	}
	return run
}

// synthetic builds an input with shapes x seeds {1, 2}, a sweep over three
// rates and a capacity search.
func synthetic(shapes []policyShape) Input {
	const replicas, requests = 4, 400
	seeds := []uint64{1, 2}
	in := Input{Setup: Setup{
		Title:          "W1: shared system prompts",
		Workload:       "w1",
		WorkloadYAML:   "name: w1\nsessions: 200\nsystem_prompt_tokens: 2048\n",
		ProfileYAML:    "name: h100-llama3-8b\nprefill_ms_per_token: 0.05\ndecode_ms: 12\n",
		Replicas:       replicas,
		Seeds:          seeds,
		Requests:       requests,
		Warmup:         30 * time.Second,
		ScrapeInterval: 100 * time.Millisecond,
		Index:          "approximate",
		Version:        "dev",
		Command:        "inferrail compare --workload w1 --policies round_robin,least_request,kv_aware --seeds 1,2 --out report/",
	}}
	for _, sh := range shapes {
		for _, seed := range seeds {
			in.Runs = append(in.Runs, synthRun(sh, seed, 10, replicas, requests, true))
		}
	}
	for _, sh := range shapes {
		for _, rate := range []float64{5, 10, 15} {
			for _, seed := range seeds {
				in.Sweep = append(in.Sweep, synthRun(sh, seed, rate, replicas, 50, false))
			}
		}
	}
	capRow := func(policy string, need int) CapacityRow {
		row := CapacityRow{Policy: policy, Replicas: need}
		for n := 1; n <= 8; n++ {
			met := need > 0 && n >= need
			ttft := 6000 / float64(n)
			if need > 0 {
				ttft = 1900 * float64(need) / float64(n)
			}
			row.Points = append(row.Points, CapacityPoint{Replicas: n, TTFTP99Ms: ttft, TPOTP99Ms: 40, Met: met})
		}
		return row
	}
	in.Capacity = &Capacity{Workload: "w1", RateRPS: 10, MaxReplicas: 8}
	for _, sh := range shapes {
		in.Capacity.Rows = append(in.Capacity.Rows, capRow(sh.name, sh.need))
	}
	if !slices.ContainsFunc(shapes, func(sh policyShape) bool { return sh.name == "random" }) {
		in.Capacity.Rows = append(in.Capacity.Rows, capRow("random", 0))
	}
	return in
}

// clearShapes: kv_aware is clearly best.
func clearShapes() []policyShape {
	return []policyShape{
		{name: "round_robin", p50: 320, p99: 9000, tpot99: 60, hit: 0.21, seedSpread: 0.04, attainment: 0.962, preemptions: 12, need: 6},
		{name: "least_request", p50: 260, p99: 6500, tpot99: 55, hit: 0.23, seedSpread: 0.05, attainment: 0.975, preemptions: 7, need: 5},
		{name: "kv_aware", p50: 45, p99: 700, tpot99: 48, hit: 0.68, pred: 0.74, exact: 0.81, seedSpread: 0.03, attainment: 0.998, need: 3},
	}
}

// noisyShapes: prefix_hash and kv_aware differ by less than the seed spread.
func noisyShapes() []policyShape {
	return []policyShape{
		{name: "round_robin", p50: 320, p99: 9000, tpot99: 60, hit: 0.21, seedSpread: 0.04, attainment: 0.962, need: 6},
		{name: "prefix_hash", p50: 50, p99: 760, tpot99: 48, hit: 0.66, pred: 0.66, exact: 0.93, seedSpread: 0.25, attainment: 0.997, need: 3},
		{name: "kv_aware", p50: 45, p99: 720, tpot99: 48, hit: 0.68, pred: 0.74, exact: 0.81, seedSpread: 0.25, attainment: 0.998, need: 3},
	}
}

// twelveShapes has every policy of the router, to check legends and labels.
func twelveShapes() []policyShape {
	names := []string{"round_robin", "random", "least_request", "p2c", "prefix_hash", "kv_aware",
		"cost_model", "llmd", "dynamo", "sglang", "aibrix", "preble"}
	var shapes []policyShape
	for i, n := range names {
		sh := policyShape{name: n, p50: 300 - 20*float64(i), p99: 9000 / float64(i+1), tpot99: 50, hit: 0.2 + 0.04*float64(i),
			seedSpread: 0.05, attainment: 0.95 + 0.004*float64(i), need: max(0, 8-i/2)}
		if i == 2 {
			sh.need = 0
		}
		if i >= 4 {
			sh.pred = sh.hit + 0.02
			sh.exact = 0.9
		}
		shapes = append(shapes, sh)
	}
	return shapes
}

func allCharts() []string {
	return []string{chartTTFTCDF, chartTTFTBars, chartHitRate, chartReplicaRequests, chartReplicaBusy,
		chartSweepTTFT, chartSweepGoodput, chartCapacity}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	charts, err := Write(dir, synthetic(clearShapes()))
	if err != nil {
		t.Fatal(err)
	}
	if want := allCharts(); !slices.Equal(charts, want) {
		t.Fatalf("charts = %v, want %v", charts, want)
	}
	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range charts {
		if !bytes.Contains(md, []byte("]("+name+")")) {
			t.Errorf("report.md does not embed %s", name)
		}
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if b := img.Bounds(); b.Dx() < 600 || b.Dy() < 400 {
			t.Errorf("%s is %dx%d, want at least 600x400", name, b.Dx(), b.Dy())
		}
	}
	if *outDir != "" {
		for _, set := range []struct {
			dir    string
			shapes []policyShape
		}{{"clear", clearShapes()}, {"noisy", noisyShapes()}, {"twelve", twelveShapes()}} {
			d := filepath.Join(*outDir, set.dir)
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if _, err := Write(d, synthetic(set.shapes)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestWriteOptionalCharts(t *testing.T) {
	in := synthetic(clearShapes())
	in.Sweep = nil
	in.Capacity = nil
	for i := range in.Runs {
		in.Runs[i].TTFTms = nil
	}
	charts, err := Write(t.TempDir(), in)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{chartTTFTBars, chartHitRate, chartReplicaRequests, chartReplicaBusy}
	if !slices.Equal(charts, want) {
		t.Fatalf("charts = %v, want %v", charts, want)
	}
}

func TestWriteErrors(t *testing.T) {
	if _, err := Write(t.TempDir(), Input{}); err == nil {
		t.Error("Write with no runs: no error")
	}
	if _, err := Write(filepath.Join(t.TempDir(), "missing"), synthetic(clearShapes())); err == nil {
		t.Error("Write into a missing directory: no error")
	}
}

func markdown(t *testing.T, in Input) string {
	t.Helper()
	var b strings.Builder
	if err := Markdown(&b, in, allCharts()); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// section returns the text of the "## name" section.
func section(md, name string) string {
	_, rest, ok := strings.Cut(md, "## "+name+"\n")
	if !ok {
		return ""
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

func TestMarkdownResults(t *testing.T) {
	md := markdown(t, synthetic(clearShapes()))
	res := section(md, "Results")
	for _, p := range []string{"round_robin", "least_request", "kv_aware"} {
		if !strings.Contains(res, "\n| "+p+" | ") {
			t.Errorf("results table has no row for %s:\n%s", p, res)
		}
	}
	read := section(md, "Reading")
	if !strings.Contains(read, "`kv_aware` has the lowest TTFT p99") {
		t.Errorf("reading does not name kv_aware as best:\n%s", read)
	}
	if !strings.Contains(read, "lower than `round_robin`") || !strings.Contains(read, "`least_request`, the best cache-blind policy") {
		t.Errorf("reading does not compare with round_robin and the best cache-blind policy:\n%s", read)
	}
	if strings.Contains(read, noisePhrase) {
		t.Errorf("reading calls a clear lead seed noise:\n%s", read)
	}
	if !strings.Contains(read, "missed by `round_robin` (2 of 2 seeds) and `least_request` (2 of 2 seeds)") {
		t.Errorf("reading does not list the SLO failures:\n%s", read)
	}
	if !strings.Contains(read, "a saving of 2 GPUs, 1.60 per four") {
		t.Errorf("reading does not state the capacity saving:\n%s", read)
	}
	for _, s := range []string{"## Setup", "## Load sweep", "## Capacity", "```yaml\nname: h100-llama3-8b", "`h100-llama3-8b`",
		"TTFT p99 ≤ 2,000 ms and TPOT p99 ≤ 100 ms", "not met ≤ 8"} {
		if !strings.Contains(md, s) {
			t.Errorf("report.md lacks %q", s)
		}
	}
}

func TestReadingSeedNoise(t *testing.T) {
	read := section(markdown(t, synthetic(noisyShapes())), "Reading")
	if !strings.Contains(read, noisePhrase) {
		t.Errorf("reading does not say %q:\n%s", noisePhrase, read)
	}
}

func TestMarkdownSingleSeed(t *testing.T) {
	in := synthetic(clearShapes())
	in.Runs = slices.DeleteFunc(in.Runs, func(r Run) bool { return r.Seed != 1 })
	in.Sweep, in.Capacity = nil, nil
	in.Setup.Seeds = []uint64{1}
	md := markdown(t, in)
	for _, s := range []string{"## Load sweep", "## Capacity", noisePhrase} {
		if strings.Contains(md, s) {
			t.Errorf("report.md has %q", s)
		}
	}
	if !strings.Contains(md, "ran one seed each, so the seed-to-seed spread is unknown") {
		t.Errorf("reading does not say the spread is unknown:\n%s", section(md, "Reading"))
	}
	if !strings.Contains(md, "| kv_aware | 43.7 | ") {
		t.Errorf("results table lacks the kv_aware row:\n%s", section(md, "Results"))
	}
	var b strings.Builder
	if err := Markdown(&b, Input{}, nil); err == nil {
		t.Error("Markdown with no runs: no error")
	}
}

func TestDeterministic(t *testing.T) {
	in := synthetic(twelveShapes())
	d1, d2 := t.TempDir(), t.TempDir()
	c1, err := Write(d1, in)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Write(d2, in)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c1, c2) {
		t.Fatalf("chart lists differ: %v vs %v", c1, c2)
	}
	for _, name := range append([]string{ReportFile}, c1...) {
		a, err := os.ReadFile(filepath.Join(d1, name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(d2, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two runs", name)
		}
	}
}

func TestGolden(t *testing.T) {
	got := []byte(markdown(t, synthetic(clearShapes())))
	path := filepath.Join("testdata", "report.md")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./report -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("report.md differs from %s (run go test ./report -update after checking the change):\n%s", path, got)
	}
}

func TestGPUsSaved(t *testing.T) {
	c := &Capacity{MaxReplicas: 8, Rows: []CapacityRow{
		{Policy: "round_robin", Replicas: 6},
		{Policy: "least_request", Replicas: 5},
		{Policy: "kv_aware", Replicas: 3},
		{Policy: "random", Replicas: 0},
		{Policy: "bad", Replicas: 7},
	}}
	if got := c.BaselinePolicy(); got != "least_request" {
		t.Fatalf("baseline = %q, want least_request", got)
	}
	tests := []struct {
		policy  string
		saved   int
		perFour float64
		ok      bool
	}{
		{"kv_aware", 2, 1.6, true},
		{"least_request", 0, 0, true},
		{"round_robin", -1, -0.8, true},
		{"bad", -2, -1.6, true},
		{"random", 0, 0, false},
		{"missing", 0, 0, false},
	}
	for _, tc := range tests {
		saved, perFour, ok := c.GPUsSaved(tc.policy)
		if saved != tc.saved || math.Abs(perFour-tc.perFour) > 1e-12 || ok != tc.ok {
			t.Errorf("GPUsSaved(%s) = %d, %v, %v; want %d, %v, %v", tc.policy, saved, perFour, ok, tc.saved, tc.perFour, tc.ok)
		}
	}

	// An explicit baseline wins; a baseline that never meets the SLO gives no saving.
	c.Baseline = "round_robin"
	if saved, perFour, ok := c.GPUsSaved("kv_aware"); saved != 3 || perFour != 2 || !ok {
		t.Errorf("with baseline round_robin: %d, %v, %v; want 3, 2, true", saved, perFour, ok)
	}
	c.Baseline = "random"
	if _, _, ok := c.GPUsSaved("kv_aware"); ok {
		t.Error("baseline that never meets the SLO: ok")
	}
	var nilCap *Capacity
	if _, _, ok := nilCap.GPUsSaved("kv_aware"); ok {
		t.Error("nil capacity: ok")
	}
	if got := (&Capacity{Rows: []CapacityRow{{Policy: "kv_aware", Replicas: 2}}}).BaselinePolicy(); got != "" {
		t.Errorf("baseline without cache-blind rows = %q, want empty", got)
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{fmtMs(123456.7), "123,457"},
		{fmtMs(1234), "1,234"},
		{fmtMs(123.4), "123"},
		{fmtMs(12.34), "12.3"},
		{fmtMs(1.234), "1.23"},
		{fmtMs(0.1234), "0.123"},
		{fmtMs(0), "0"},
		{fmtRate(1234.5), "1,234.50"},
		{fmtPct(0.4567), "45.7%"},
		{fmtCount(2.5), "2.5"},
		{fmtCount(12000), "12,000"},
		{group("-1234567.25"), "-1,234,567.25"},
		{fmtDuration(30 * time.Second), "30 s"},
		{fmtDuration(100 * time.Millisecond), "100 ms"},
		{joinAnd([]string{"a", "b", "c"}), "a, b and c"},
		{fence("a ``` b"), "````"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestPolicyOrder(t *testing.T) {
	in := synthetic(clearShapes())
	// Interleave the runs: order is still that of first appearance.
	slices.Reverse(in.Runs)
	got := policyNames(aggregate(in.Runs, policyOrder(in.Runs)))
	want := []string{"kv_aware", "least_request", "round_robin"}
	if !slices.Equal(got, want) {
		t.Errorf("order = %v, want %v", got, want)
	}
	if got := allPolicies(in); got[len(got)-1] != "random" {
		t.Errorf("allPolicies does not end with the capacity-only policy: %v", got)
	}
}

func TestSpreadOf(t *testing.T) {
	s := spreadOf([]float64{3, 1, 10, 2})
	if s != (spread{Med: 2.5, Min: 1, Max: 10}) {
		t.Errorf("spreadOf = %+v", s)
	}
}
