package fidelity

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/inferrail/inferrail/results"
)

// The compared metrics, in the report's order.
const (
	mQueue = iota
	mTTFT
	mTPOT
	mE2E
	mHit
	nMetrics
)

// metricKeys name the metrics in fidelity.json; metricTitles in the report.
var (
	metricKeys   = [nMetrics]string{"queue_ms", "ttft_ms", "tpot_ms", "e2e_ms", "hit_rate"}
	metricTitles = [nMetrics]string{"queue", "TTFT", "TPOT", "E2E", "hit rate"}
)

// Result is the outcome of a check: what fidelity.json holds.
type Result struct {
	// Trace names the recording; set by the caller.
	Trace string `json:"trace,omitempty"`
	Model string `json:"model"`
	// Policy is the replayed policy; PolicyFrom says where it came from:
	// "records" (the policy the recorded requests name), "metadata" (the
	// recording's or the live configuration's), or "option".
	Policy     string `json:"policy"`
	PolicyFrom string `json:"policy_from"`
	// Replicas is the simulated fleet size; ReplicasFrom says where it came
	// from: "records" (the distinct replicas that served recorded
	// requests), "metadata", or "option".
	Replicas     int    `json:"replicas"`
	ReplicasFrom string `json:"replicas_from"`
	// RecordedPolicy and RecordedReplicas are what the recording says
	// ("" and 0 when it does not say), for replays that replace them.
	RecordedPolicy   string `json:"recorded_policy,omitempty"`
	RecordedReplicas int    `json:"recorded_replicas,omitempty"`
	Profile          string `json:"profile"`
	Seed             uint64 `json:"seed"`
	Gateway          string `json:"gateway"`

	Counts  Counts     `json:"counts"`
	Overall Comparison `json:"overall"`
	Mapping Mapping    `json:"replica_mapping"`
	// PerReplica compares each simulated replica with its recorded one,
	// when Mapping.Meaningful; otherwise MeasuredReplicas (by recorded
	// name) and PredictedReplicas (by simulated index) describe each side
	// alone.
	PerReplica        []ReplicaComparison `json:"per_replica,omitempty"`
	MeasuredReplicas  []ReplicaSide       `json:"measured_replicas,omitempty"`
	PredictedReplicas []ReplicaSide       `json:"predicted_replicas,omitempty"`

	rows []row
}

// Counts says which requests were compared and which were not.
type Counts struct {
	// Records counts the checked model's records; OtherModels the records
	// of other models, left out.
	Records     int `json:"records"`
	OtherModels int `json:"other_models"`
	// NotReplayed counts, by recorded outcome, the records the simulator
	// does not see: requests the tenant limiter refused before the gateway
	// core (rate_limited).
	NotReplayed map[string]int `json:"not_replayed"`
	Replayed    int            `json:"replayed"`
	// Matched counts the replayed requests that completed in the recording
	// and in the simulation: the latency comparisons' requests.
	Matched int `json:"matched"`
	// RecordedFailed and SimulatedFailed count, by outcome or reason, the
	// replayed requests that did not complete on each side.
	RecordedFailed  map[string]int `json:"recorded_failed"`
	SimulatedFailed map[string]int `json:"simulated_failed"`
	// OnlyInRecordingFailed failed in the recording and completed in the
	// simulation; OnlyInSimulationFailed the other way round; BothFailed
	// on both sides.
	OnlyInRecordingFailed  int `json:"only_in_recording_failed"`
	OnlyInSimulationFailed int `json:"only_in_simulation_failed"`
	BothFailed             int `json:"both_failed"`
	// NoCachedTokens counts matched requests whose engine did not report
	// cached tokens: they are left out of the hit rates.
	NoCachedTokens int `json:"no_cached_tokens"`
	// RecorderDropped counts the requests the recorder dropped, as its
	// metadata says (0 when it does not): they are not in the file, and
	// their load is missing from the replay.
	RecorderDropped int64 `json:"recorder_dropped"`
	// RecorderReordered counts the rows whose arrival the recorder moved
	// up to the previous row's, as its metadata says (0 when it does not).
	RecorderReordered int64 `json:"recorder_reordered"`
	// Reordered counts records written before an earlier arrival (the
	// recorder writes a request when it ends); the replay sorts them.
	Reordered int `json:"reordered"`
}

// Comparison compares the metrics of a set of requests.
type Comparison struct {
	// Measured and Predicted count the requests each side's statistics
	// are over (the same matched requests overall).
	Measured  int `json:"measured_requests"`
	Predicted int `json:"predicted_requests"`
	// Paired counts the requests compared one by one.
	Paired  int    `json:"paired_requests"`
	Queue   Metric `json:"queue_ms"`
	TTFT    Metric `json:"ttft_ms"`
	TPOT    Metric `json:"tpot_ms"`
	E2E     Metric `json:"e2e_ms"`
	HitRate Metric `json:"hit_rate"`
	// TokenHitRate is cached over prompt tokens summed over the requests
	// (the summaries' hit_rate), each side's.
	TokenHitRate HitRate `json:"token_hit_rate"`
}

func (c *Comparison) metric(k int) *Metric {
	return [nMetrics]*Metric{&c.Queue, &c.TTFT, &c.TPOT, &c.E2E, &c.HitRate}[k]
}

// Metric compares one metric's distributions and its per-request values.
// Times are in milliseconds, hit rates fractions of the prompt.
type Metric struct {
	Measured  results.Latency `json:"measured"`
	Predicted results.Latency `json:"predicted"`
	// RelError is (predicted - measured) / measured per statistic; null
	// where the measured statistic is 0.
	RelError Errors `json:"rel_error"`
	// AbsError is predicted - measured per statistic.
	AbsError results.Latency `json:"abs_error"`
	// MAPE is the mean of |predicted - measured| / measured over the
	// paired requests with a positive measured value, as a fraction, and
	// MedianRatio the median of predicted / measured over them; null
	// without such requests. MeanAbsError is the mean |predicted -
	// measured| over every paired request.
	MAPE         *float64 `json:"per_request_mape"`
	MedianRatio  *float64 `json:"per_request_median_ratio"`
	MeanAbsError float64  `json:"per_request_mean_abs_error"`
	// Requests counts the measured-side values (the metric is undefined
	// for some requests: TPOT with one output token, hit rate without
	// reported cached tokens), PairedRequests the paired ones.
	Requests       int `json:"requests"`
	PairedRequests int `json:"paired_requests"`
}

// Errors holds a relative error per statistic.
type Errors struct {
	Mean *float64 `json:"mean"`
	P50  *float64 `json:"p50"`
	P90  *float64 `json:"p90"`
	P99  *float64 `json:"p99"`
}

// HitRate is a token-weighted hit rate on both sides.
type HitRate struct {
	Measured  float64 `json:"measured"`
	Predicted float64 `json:"predicted"`
	// Diff is Predicted - Measured.
	Diff float64 `json:"diff"`
}

// Mapping says how simulated replicas are paired with recorded ones.
type Mapping struct {
	// Order is where the recorded replicas' order comes from: "metadata"
	// (the configuration's order) or "records" (natural order of the
	// names the records carry).
	Order string `json:"order"`
	// Pairs pair each simulated replica index with a recorded name, when
	// the fleets have the same size.
	Pairs []Pair `json:"pairs,omitempty"`
	// Agreement is the share of the requests dispatched on both sides that
	// went to paired replicas; Threshold the share past which the pairing
	// is meaningful: halfway from chance (1/N) to full agreement.
	Agreement  float64 `json:"agreement"`
	Threshold  float64 `json:"threshold"`
	Dispatched int     `json:"dispatched_both"`
	Meaningful bool    `json:"meaningful"`
	// Why says why the pairing is not meaningful ("" when it is).
	Why string `json:"why,omitempty"`
}

// Pair is a simulated replica and its recorded counterpart.
type Pair struct {
	Simulated int    `json:"simulated"`
	Recorded  string `json:"recorded"`
	// Shared counts the requests both served.
	Shared int `json:"shared"`
}

// ReplicaComparison compares one simulated replica with its recorded
// counterpart: measured statistics over the requests the recorded replica
// served, predicted ones over those the simulated replica served, per
// request over those both served.
type ReplicaComparison struct {
	Recorded  string `json:"recorded"`
	Simulated int    `json:"simulated"`
	Comparison
}

// ReplicaSide describes one replica of one side alone.
type ReplicaSide struct {
	// Replica is the recorded name, or the simulated index as "sim-i".
	Replica  string          `json:"replica"`
	Requests int             `json:"requests"`
	Queue    results.Latency `json:"queue_ms"`
	TTFT     results.Latency `json:"ttft_ms"`
	TPOT     results.Latency `json:"tpot_ms"`
	E2E      results.Latency `json:"e2e_ms"`
	HitRate  float64         `json:"token_hit_rate"`
}

// row is one completed-on-both-sides request: its metrics on each side.
type row struct {
	id       uint64
	arrival  time.Duration
	m, p     [nMetrics]float64
	def      [nMetrics]bool
	rec, sim int // recorded replica (index into names, -1 none) and simulated one
	// prompt and cached tokens on each side, for token-weighted hit rates
	// (meaningful when def[mHit]).
	mPrompt, mCached, pPrompt, pCached int
}

// simOutcome is the simulator's outcome in the recorder's words: "ok" or
// the failure reason.
func simOutcome(r *results.Record) string {
	switch {
	case r.Outcome == results.OutcomeOK:
		return string(results.OutcomeOK)
	case r.Outcome == results.OutcomeRejected && r.Reject == "":
		return results.RejectUnknown
	case r.Outcome == results.OutcomeRejected:
		return r.Reject
	case r.Fail != "":
		return r.Fail
	case r.Outcome == "":
		return string(results.OutcomeFailed)
	}
	return string(r.Outcome)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// compare matches the replayed records with the simulator's.
func (p *prepared) compare(sim []results.Record, o Options) *Result {
	res := &Result{
		Model: p.model, Policy: p.policy, PolicyFrom: p.policyFrom,
		Replicas: p.replicas, ReplicasFrom: p.replicasFrom,
		RecordedPolicy: p.recordedPolicy, RecordedReplicas: p.recordedReplicas,
		Profile: o.Profile, Seed: o.Seed, Gateway: gatewayText(o.Gateway),
		Counts: Counts{
			Records: len(p.all), OtherModels: p.otherModels, NotReplayed: p.skipped,
			Replayed: len(p.replay), RecordedFailed: map[string]int{}, SimulatedFailed: map[string]int{},
			Reordered: p.reordered, RecorderDropped: max(o.Dropped, 0), RecorderReordered: max(o.Reordered, 0),
		},
	}
	c := &res.Counts
	nameIdx := make(map[string]int, len(p.names))
	for j, n := range p.names {
		nameIdx[n] = j
	}
	co := newOverlap(p.replicas, len(p.names))
	for k, rec := range p.replay {
		s := &sim[k]
		meas := rec.Measured
		mOK := meas.Outcome == string(results.OutcomeOK)
		sOut := simOutcome(s)
		sOK := sOut == string(results.OutcomeOK)
		j, hasRec := nameIdx[meas.Replica]
		if !hasRec {
			j = -1
		}
		if j >= 0 && s.Replica >= 0 && s.Replica < p.replicas && s.Outcome != results.OutcomeRejected {
			co.add(s.Replica, j)
		}
		if !mOK {
			c.RecordedFailed[meas.Outcome]++
		}
		if !sOK {
			c.SimulatedFailed[sOut]++
		}
		switch {
		case !mOK && !sOK:
			c.BothFailed++
			continue
		case !mOK:
			c.OnlyInRecordingFailed++
			continue
		case !sOK:
			c.OnlyInSimulationFailed++
			continue
		}
		c.Matched++
		r := row{id: rec.ID, arrival: rec.Arrival, rec: j, sim: s.Replica}
		r.m[mQueue], r.p[mQueue], r.def[mQueue] = ms(meas.Queue), ms(s.Queue()), true
		r.m[mTTFT], r.p[mTTFT], r.def[mTTFT] = ms(meas.TTFT), ms(s.TTFT()), s.HasFirstToken
		r.m[mE2E], r.p[mE2E], r.def[mE2E] = ms(meas.E2E), ms(s.E2E()), true
		if tpot, ok := s.TPOT(); ok && meas.TPOT > 0 {
			r.m[mTPOT], r.p[mTPOT], r.def[mTPOT] = ms(meas.TPOT), ms(tpot), true
		}
		switch {
		case meas.CachedTokens < 0:
			c.NoCachedTokens++
		case s.PromptTokens > 0:
			r.mPrompt, r.mCached = rec.InputTokens, meas.CachedTokens
			r.pPrompt, r.pCached = s.PromptTokens, s.CachedTokens
			r.m[mHit] = float64(r.mCached) / float64(r.mPrompt)
			r.p[mHit] = float64(r.pCached) / float64(r.pPrompt)
			r.def[mHit] = true
		}
		res.rows = append(res.rows, r)
	}
	all := func(*row) bool { return true }
	res.Overall = comparison(res.rows, all, all)
	res.Mapping = co.mapping(p.names, p.namesFrom)
	if res.Mapping.Meaningful {
		for _, pr := range res.Mapping.Pairs {
			j, i := nameIdx[pr.Recorded], pr.Simulated
			rc := ReplicaComparison{Recorded: pr.Recorded, Simulated: i}
			rc.Comparison = comparison(res.rows, func(r *row) bool { return r.rec == j }, func(r *row) bool { return r.sim == i })
			res.PerReplica = append(res.PerReplica, rc)
		}
		slices.SortFunc(res.PerReplica, func(a, b ReplicaComparison) int { return cmp.Compare(nameIdx[a.Recorded], nameIdx[b.Recorded]) })
	} else {
		for j, n := range p.names {
			res.MeasuredReplicas = append(res.MeasuredReplicas, side(n, res.rows, func(r *row) bool { return r.rec == j }, false))
		}
		for i := range p.replicas {
			res.PredictedReplicas = append(res.PredictedReplicas, side(fmt.Sprintf("sim-%d", i), res.rows, func(r *row) bool { return r.sim == i }, true))
		}
	}
	return res
}

// comparison compares the rows inMeas selects (measured side) with those
// inPred selects (predicted side), and request by request those both select.
func comparison(rows []row, inMeas, inPred func(*row) bool) Comparison {
	var c Comparison
	var mv, pv, pm, pp [nMetrics][]float64
	var mTok, pTok [2]int // prompt, cached
	for i := range rows {
		r := &rows[i]
		a, b := inMeas(r), inPred(r)
		if a {
			c.Measured++
		}
		if b {
			c.Predicted++
		}
		if a && b {
			c.Paired++
		}
		for k := range nMetrics {
			if !r.def[k] {
				continue
			}
			if a {
				mv[k] = append(mv[k], r.m[k])
			}
			if b {
				pv[k] = append(pv[k], r.p[k])
			}
			if a && b {
				pm[k], pp[k] = append(pm[k], r.m[k]), append(pp[k], r.p[k])
			}
		}
		if r.def[mHit] {
			if a {
				mTok[0], mTok[1] = mTok[0]+r.mPrompt, mTok[1]+r.mCached
			}
			if b {
				pTok[0], pTok[1] = pTok[0]+r.pPrompt, pTok[1]+r.pCached
			}
		}
	}
	for k := range nMetrics {
		*c.metric(k) = metricOf(mv[k], pv[k], pm[k], pp[k])
	}
	c.TokenHitRate = HitRate{Measured: ratio(mTok[1], mTok[0]), Predicted: ratio(pTok[1], pTok[0])}
	c.TokenHitRate.Diff = c.TokenHitRate.Predicted - c.TokenHitRate.Measured
	return c
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// metricOf compares a measured and a predicted sample, and the paired
// values pm[i] (measured) and pp[i] (predicted) of the same requests. It
// sorts mv and pv.
func metricOf(mv, pv, pm, pp []float64) Metric {
	m := Metric{Measured: results.LatencyOf(mv), Predicted: results.LatencyOf(pv), Requests: len(mv), PairedRequests: len(pm)}
	rel := func(p, q float64) *float64 {
		if q == 0 {
			return nil
		}
		v := (p - q) / q
		return &v
	}
	a, b := m.Predicted, m.Measured
	m.RelError = Errors{Mean: rel(a.Mean, b.Mean), P50: rel(a.P50, b.P50), P90: rel(a.P90, b.P90), P99: rel(a.P99, b.P99)}
	m.AbsError = results.Latency{Mean: a.Mean - b.Mean, P50: a.P50 - b.P50, P90: a.P90 - b.P90, P99: a.P99 - b.P99}
	if len(pm) == 0 {
		return m
	}
	var abs, ape float64
	ratios := make([]float64, 0, len(pm))
	for i, x := range pm {
		d := math.Abs(pp[i] - x)
		abs += d
		if x > 0 {
			ape += d / x
			ratios = append(ratios, pp[i]/x)
		}
	}
	m.MeanAbsError = abs / float64(len(pm))
	if len(ratios) > 0 {
		mape := ape / float64(len(ratios))
		slices.Sort(ratios)
		med := results.Quantile(ratios, 0.5)
		m.MAPE, m.MedianRatio = &mape, &med
	}
	return m
}

// side describes the rows in selects on one side.
func side(name string, rows []row, in func(*row) bool, predicted bool) ReplicaSide {
	s := ReplicaSide{Replica: name}
	var v [nMetrics][]float64
	var prompt, cached int
	for i := range rows {
		r := &rows[i]
		if !in(r) {
			continue
		}
		s.Requests++
		vals := &r.m
		if predicted {
			vals = &r.p
		}
		for k := range nMetrics {
			if r.def[k] {
				v[k] = append(v[k], vals[k])
			}
		}
		if r.def[mHit] {
			if predicted {
				prompt, cached = prompt+r.pPrompt, cached+r.pCached
			} else {
				prompt, cached = prompt+r.mPrompt, cached+r.mCached
			}
		}
	}
	s.Queue, s.TTFT, s.TPOT, s.E2E = results.LatencyOf(v[mQueue]), results.LatencyOf(v[mTTFT]), results.LatencyOf(v[mTPOT]), results.LatencyOf(v[mE2E])
	s.HitRate = ratio(cached, prompt)
	return s
}

// overlap counts the requests simulated replica i and recorded replica j
// both served.
type overlap struct {
	n, m  int
	cells []int
	total int
}

func newOverlap(n, m int) *overlap {
	o := &overlap{n: n, m: m}
	if n == m {
		o.cells = make([]int, n*m)
	}
	return o
}

func (o *overlap) add(i, j int) {
	o.total++
	if o.cells != nil {
		o.cells[i*o.m+j]++
	}
}

// mapping pairs simulated replicas with recorded ones, greedily by the
// requests they share: the largest count first (ties: recorded order, then
// simulated index), each replica once; replicas that share nothing are
// paired in order.
func (o *overlap) mapping(names []string, order string) Mapping {
	mp := Mapping{Order: order, Dispatched: o.total}
	if o.n != o.m {
		mp.Why = fmt.Sprintf("the simulation ran %d replicas and the recording names %d, so no replica has a counterpart", o.n, o.m)
		return mp
	}
	type cell struct{ i, j, c int }
	var cells []cell
	for i := range o.n {
		for j := range o.m {
			if c := o.cells[i*o.m+j]; c > 0 {
				cells = append(cells, cell{i, j, c})
			}
		}
	}
	slices.SortFunc(cells, func(a, b cell) int {
		return cmp.Or(cmp.Compare(b.c, a.c), cmp.Compare(a.j, b.j), cmp.Compare(a.i, b.i))
	})
	simTo := make([]int, o.n)
	recTaken := make([]bool, o.m)
	for i := range simTo {
		simTo[i] = -1
	}
	shared := 0
	for _, c := range cells {
		if simTo[c.i] < 0 && !recTaken[c.j] {
			simTo[c.i], recTaken[c.j] = c.j, true
			shared += c.c
		}
	}
	j := 0
	for i := range simTo {
		if simTo[i] >= 0 {
			continue
		}
		for recTaken[j] {
			j++
		}
		simTo[i], recTaken[j] = j, true
	}
	for i, j := range simTo {
		mp.Pairs = append(mp.Pairs, Pair{Simulated: i, Recorded: names[j], Shared: o.cells[i*o.m+j]})
	}
	slices.SortFunc(mp.Pairs, func(a, b Pair) int { return cmp.Compare(simTo[a.Simulated], simTo[b.Simulated]) })
	mp.Threshold = (1 + 1/float64(o.n)) / 2
	if o.total == 0 {
		mp.Why = "no request was dispatched on both sides"
		return mp
	}
	mp.Agreement = float64(shared) / float64(o.total)
	if mp.Agreement+1e-12 < mp.Threshold {
		mp.Why = fmt.Sprintf("only %.1f%% of the requests went to paired replicas (at least %.1f%% needed: halfway from chance, 1/%d, to all): the simulated replicas do not stand for recorded ones", 100*mp.Agreement, 100*mp.Threshold, o.n)
		return mp
	}
	mp.Meaningful = true
	return mp
}

// gatewayText describes the replayed gateway in one line.
func gatewayText(g Gateway) string {
	q := "no queue"
	if g.QueueMax > 0 {
		q = fmt.Sprintf("queue of %d for up to %v", g.QueueMax, g.QueueTimeout)
	}
	s := fmt.Sprintf("admission %s (overcommit %g), %s, %s index, scrapes every %v", g.Admission, g.Overcommit, q, g.Index, g.ScrapeInterval)
	if g.SessionAffinity {
		s += ", session affinity"
	}
	return s
}
