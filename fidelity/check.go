package fidelity

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/traces"
	"github.com/inferrail/inferrail/workload"
)

// ErrNoMeasured is the error of a trace that describes only the load: a
// public trace, or one converted with trace convert.
var ErrNoMeasured = errors.New("this trace has no measured columns: record it with live's record: section")

// notReplayed are the recorded outcomes of requests that never reached the
// gateway core: the tenant limiter answers them before it, so the simulated
// fleet must not see them.
var notReplayed = []string{results.RejectRateLimited}

// CheckReader reads every record of r (at most MaxRecords) and checks them
// (see Check).
func CheckReader(r traces.Reader, o Options) (*Result, error) {
	var recs []traces.Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read the recording: %w", err)
		}
		if len(recs) == MaxRecords {
			return nil, inputf("the recording has more than %d records (every record stays in memory): cut it with trace convert's window, or check one rotated file at a time", MaxRecords)
		}
		recs = append(recs, rec)
	}
	return Check(recs, o)
}

// Check replays a recording of live traffic through the simulator, with the
// recorded fleet size, policy, arrivals, lengths, sessions and block hashes,
// and compares what the simulator predicts with what was measured, request
// by request (matched by record id) and percentile by percentile, overall
// and per replica. recs is not modified.
func Check(recs []traces.Record, o Options) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	p, err := prepare(recs, o)
	if err != nil {
		return nil, err
	}
	sim, err := p.simulate(o)
	if err != nil {
		return nil, err
	}
	return p.compare(sim, o), nil
}

// prepared is a recording ready to replay: the chosen model's records in
// arrival order, and the fleet the simulator runs.
type prepared struct {
	model string
	// all is every record of the model, in arrival order; replay the ones
	// the simulator sees (replay[k] is the simulator's request k+1).
	all    []*traces.Record
	replay []*traces.Record
	// skipped counts the records of the model left out of the replay, by
	// recorded outcome.
	skipped map[string]int
	// otherModels counts the records of other models, left out.
	otherModels int
	reordered   int

	policy, policyFrom string
	recordedPolicy     string // "" when the recording names none or several
	recordedReplicas   int
	replicas           int
	replicasFrom       string
	names              []string // recorded replica names, in the stated order
	namesFrom          string
	recordedPolicies   map[string]int
}

// prepare validates the records and derives the fleet.
func prepare(recs []traces.Record, o Options) (*prepared, error) {
	if len(recs) == 0 {
		return nil, inputf("the recording has no records")
	}
	if len(recs) > MaxRecords {
		return nil, inputf("the recording has %d records, more than %d (every record stays in memory)", len(recs), MaxRecords)
	}
	if recs[0].Measured == nil {
		return nil, &InputError{ErrNoMeasured}
	}
	models := map[string]int{}
	seen := make(map[uint64]struct{}, len(recs))
	for i := range recs {
		r := &recs[i]
		if r.Measured == nil {
			return nil, inputf("record %d (id %d) has no measured values, though the first one has: %w", i+1, r.ID, ErrNoMeasured)
		}
		if err := r.Validate(); err != nil {
			return nil, inputf("record %d (id %d): %w", i+1, r.ID, err)
		}
		if _, dup := seen[r.ID]; dup {
			return nil, inputf("record %d: id %d appears twice (requests are matched by id)", i+1, r.ID)
		}
		seen[r.ID] = struct{}{}
		models[r.Model]++
	}
	p := &prepared{model: o.Model, skipped: map[string]int{}, recordedPolicies: map[string]int{}}
	if p.model == "" {
		if len(models) > 1 {
			return nil, inputf("the recording holds %s: name the one to check (--model)", countList(models))
		}
		for m := range models {
			p.model = m
		}
	} else if models[p.model] == 0 {
		return nil, inputf("model %q: the recording holds %s", p.model, countList(models))
	}
	for i := range recs {
		r := &recs[i]
		if r.Model != p.model {
			p.otherModels++
			continue
		}
		if len(p.all) > 0 && r.Arrival < p.all[len(p.all)-1].Arrival {
			p.reordered++
		}
		p.all = append(p.all, r)
	}
	// The recorder writes a row when a request ends, so rows are not in
	// arrival order; the replay is.
	slices.SortStableFunc(p.all, func(a, b *traces.Record) int {
		return cmp.Or(cmp.Compare(a.Arrival, b.Arrival), cmp.Compare(a.ID, b.ID))
	})
	distinct := map[string]int{}
	for _, r := range p.all {
		if slices.Contains(notReplayed, r.Measured.Outcome) {
			p.skipped[r.Measured.Outcome]++
			continue
		}
		p.replay = append(p.replay, r)
		if r.Measured.Replica != "" {
			distinct[r.Measured.Replica]++
		}
		if r.Measured.Policy != "" {
			p.recordedPolicies[r.Measured.Policy]++
		}
	}
	if len(p.replay) == 0 {
		return nil, inputf("no request of the recording reached the gateway (%s): nothing to replay", countList(p.skipped))
	}
	if err := p.fleet(o, distinct); err != nil {
		return nil, err
	}
	return p, nil
}

// fleet derives the policy, the fleet size and the replicas' order.
func (p *prepared) fleet(o Options, distinct map[string]int) error {
	rm, known := o.Fleet[p.model]
	switch {
	case known && rm.Policy != "":
		p.recordedPolicy = rm.Policy
	case len(p.recordedPolicies) == 1:
		for name := range p.recordedPolicies {
			p.recordedPolicy = name
		}
	}
	switch {
	case o.Policy != "":
		p.policy, p.policyFrom = o.Policy, "option"
	case known && rm.Policy != "":
		p.policy, p.policyFrom = rm.Policy, "metadata"
	case len(p.recordedPolicies) == 1:
		for name := range p.recordedPolicies {
			p.policy = name
		}
		p.policyFrom = "records"
	case len(p.recordedPolicies) > 1:
		return inputf("the recording's requests were routed by several policies (%s): name the one to replay (--policy)", countList(p.recordedPolicies))
	default:
		return inputf("no recorded request names its policy: name the policy to replay (--policy)")
	}
	if err := (Options{Policy: p.policy}).Validate(); err != nil {
		return inputf("recorded policy %q: %w (replay another with --policy)", p.policy, errors.Unwrap(err))
	}
	if known && len(rm.Replicas) > 0 {
		p.names, p.namesFrom = slices.Clone(rm.Replicas), "metadata"
		for name := range distinct {
			if !slices.Contains(p.names, name) {
				return inputf("replica %q served recorded requests but is not among the recorded fleet's replicas (%s)", name, strings.Join(p.names, ", "))
			}
		}
	} else {
		p.names, p.namesFrom = slices.Collect(maps.Keys(distinct)), "records"
		slices.SortFunc(p.names, naturalCompare)
	}
	p.recordedReplicas = len(p.names)
	switch {
	case o.Replicas > 0:
		p.replicas, p.replicasFrom = o.Replicas, "option"
	case len(p.names) > 0:
		p.replicas, p.replicasFrom = len(p.names), p.namesFrom
	default:
		return inputf("no recorded request names a replica: give the fleet size (--replicas)")
	}
	if p.replicas > fleet.MaxReplicas {
		return inputf("the recording names %d replicas, more than the simulator's %d", p.replicas, fleet.MaxReplicas)
	}
	return nil
}

// countList renders counts as "a (3), b (1)", largest first, then by name.
func countList(m map[string]int) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	parts := make([]string, len(keys))
	for i, k := range keys {
		name := k
		if name == "" {
			name = `""`
		}
		parts[i] = fmt.Sprintf("%s (%d)", name, m[k])
	}
	return strings.Join(parts, ", ")
}

// fleetConfig is the simulation of the recording.
func (p *prepared) fleetConfig(o Options) fleet.Config {
	g := o.Gateway
	fc := fleet.DefaultConfig()
	fc.Seed, fc.Policy, fc.Replicas, fc.Engine = o.Seed, p.policy, p.replicas, o.Engine
	if g.MaxModelLen > 0 {
		fc.Engine.MaxModelLen = g.MaxModelLen
	}
	fc.MaxModelLen = g.MaxModelLen // configured, it weighs requests without max_tokens too
	fc.Admission, fc.Overcommit, fc.OutputQuantile = g.Admission, g.Overcommit, g.OutputQuantile
	fc.Index, fc.ScrapeInterval = g.Index, g.ScrapeInterval
	fc.QueueMaxRequests, fc.QueueTimeout, fc.MaxPriority = g.QueueMax, g.QueueTimeout, g.MaxPriority
	fc.SessionAffinity = g.SessionAffinity
	fc.SourceName = "recording"
	model := fc.Workload.Model
	fc.Source = func(seed uint64) (workload.Source, error) {
		// Model: a simulated fleet serves one model, the one its gateway
		// is configured with.
		return traces.NewSource(&sliceReader{recs: p.replay}, traces.ReplayOptions{Seed: seed, Model: model})
	}
	if o.Progress != nil {
		n := len(p.replay)
		fc.Progress = func(pr fleet.Progress) {
			if pr.Target == 0 {
				pr.Target = n // a replay's length is known only here
			}
			o.Progress(pr)
		}
	}
	return fc
}

// simulate runs the replay and returns the simulator's record of each
// replayed request, in replay order.
func (p *prepared) simulate(o Options) ([]results.Record, error) {
	fc := p.fleetConfig(o)
	if err := fc.Validate(); err != nil {
		return nil, &InputError{fmt.Errorf("simulation of the recording: %w", err)}
	}
	out, err := fleet.Simulate(fc)
	if err != nil {
		return nil, fmt.Errorf("simulate the recording: %w", err)
	}
	sim := make([]results.Record, len(p.replay))
	got := make([]bool, len(p.replay))
	for _, r := range out.Records {
		k := int(r.ID) - 1 // the replay numbers its requests from 1, in order
		if k < 0 || k >= len(sim) || got[k] {
			return nil, fmt.Errorf("simulate the recording: request id %d is not one of the %d replayed", r.ID, len(sim))
		}
		sim[k], got[k] = r, true
	}
	if n := len(out.Records); n != len(sim) {
		return nil, fmt.Errorf("simulate the recording: %d requests replayed, %d simulated", len(sim), n)
	}
	return sim, nil
}

// sliceReader reads records from memory.
type sliceReader struct {
	recs []*traces.Record
	i    int
}

func (s *sliceReader) Next() (traces.Record, error) {
	if s.i == len(s.recs) {
		return traces.Record{}, io.EOF
	}
	s.i++
	return *s.recs[s.i-1], nil
}

// naturalCompare orders names with their digit runs compared as numbers:
// replica-2 before replica-10; names equal that way (r01, r1) in byte order.
func naturalCompare(a, b string) int { return cmp.Or(natural(a, b), strings.Compare(a, b)) }

func natural(a, b string) int {
	for a != "" && b != "" {
		da, db := digitRun(a), digitRun(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if c := cmp.Or(cmp.Compare(len(na), len(nb)), cmp.Compare(na, nb)); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func digitRun(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}
