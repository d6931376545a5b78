package fidelity

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/fleet"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/traces"
)

// MaxRecords bounds the records one check reads: every record, and its
// simulated twin, stays in memory until the comparison is done.
const MaxRecords = 10_000_000

// Options configure a check.
type Options struct {
	// Engine configures every simulated engine (the --profile). A zero
	// value (no block size) means engine.DefaultConfig(), the profile the
	// mock engine runs by default.
	Engine engine.Config
	// Profile names the engine profile in the report ("" = Engine.Name).
	Profile string
	// Policy replaces the recorded routing policy when set.
	Policy string
	// Replicas replaces the recorded fleet size when positive.
	Replicas int
	// Model selects the model to check when the recording holds several;
	// "" requires a recording of one model.
	Model string
	// Fleet is what the recording's metadata (or the live configuration it
	// was made with) says of the fleet, per model; nil when unknown, and
	// the fleet is then derived from the records (the distinct replicas
	// that served requests, the policy they name).
	Fleet map[string]RecordedModel
	// Gateway is the recorded gateway's admission, queue, index and scrape
	// settings; the zero value means DefaultGateway(), live's defaults.
	Gateway Gateway
	// Sample is the share of requests the recording holds (record.sample;
	// 0 means all). A sampled recording offers the replay only that share
	// of the load, so Check refuses one below 1.
	Sample float64
	// Dropped counts the requests the recorder dropped (-1 or 0: none
	// known); the report states it, since the replay lacks their load.
	Dropped int64
	// Reordered counts the rows whose arrival the recorder moved up to
	// the previous row's (their request outlived its reorder buffer); the
	// report states it, since their replayed arrival is late.
	Reordered int64
	// Seed seeds the simulation (random policies, the replay's segment
	// salt); 0 means 1, sim's default.
	Seed uint64
	// Progress, when set, receives the simulation's progress.
	Progress func(fleet.Progress)
}

// RecordedModel is one model's fleet as recorded.
type RecordedModel struct {
	// Replicas names the model's replicas in the configuration's order,
	// the order the gateway core (and the simulator) index them in.
	Replicas []string
	// Policy is the model's routing policy.
	Policy string
}

// Gateway is the part of live's per-model configuration the simulator
// needs to reproduce the gateway's decisions.
type Gateway struct {
	Admission      gateway.Admission
	Overcommit     float64
	OutputQuantile float64
	Index          fleet.IndexMode
	ScrapeInterval time.Duration
	QueueMax       int
	QueueTimeout   time.Duration
	MaxPriority    int
	// SessionAffinity is cost_model's session affinity.
	SessionAffinity bool
	// MaxModelLen is the gateway's max_model_len; 0 means the engine's.
	MaxModelLen int
}

// DefaultGateway is a live model's default gateway: live's defaults
// (config.DefaultModel, config.Default's scrape interval).
func DefaultGateway() Gateway {
	return GatewayOf(config.DefaultModel(), config.Default().Scrape)
}

// GatewayOf is the gateway of one model of a live configuration.
func GatewayOf(m config.Model, s config.Scrape) Gateway {
	return Gateway{
		Admission:       gateway.Admission(m.Admission),
		Overcommit:      m.Overcommit,
		OutputQuantile:  m.OutputQuantile,
		Index:           fleet.IndexMode(m.Index),
		ScrapeInterval:  s.Interval,
		QueueMax:        m.Queue.MaxRequests,
		QueueTimeout:    m.Queue.Timeout,
		MaxPriority:     m.MaxPriority,
		SessionAffinity: m.SessionAffinity,
		MaxModelLen:     m.MaxModelLen,
	}
}

// FromLiveConfig is what a live configuration says of its fleet: each
// model's replicas in order and its policy, and the gateway of model (the
// only one when model is "").
func FromLiveConfig(c *config.Config, model string) (map[string]RecordedModel, Gateway, error) {
	fl := make(map[string]RecordedModel, len(c.Models))
	var names []string
	var gw *Gateway
	for _, m := range c.Models {
		rm := RecordedModel{Policy: m.Policy}
		for _, r := range m.Replicas {
			rm.Replicas = append(rm.Replicas, r.Name)
		}
		fl[m.Name] = rm
		names = append(names, m.Name)
		if m.Name == model || (model == "" && len(c.Models) == 1) {
			g := GatewayOf(m, c.Scrape)
			gw = &g
		}
	}
	switch {
	case gw == nil && model == "":
		return nil, Gateway{}, inputf("the live configuration serves several models (%s): name the one to check (--model)", strings.Join(names, ", "))
	case gw == nil:
		return nil, Gateway{}, inputf("model %q: the live configuration serves %s", model, strings.Join(names, ", "))
	}
	return fl, *gw, nil
}

// UseRecording takes the fleet (each model's replicas and policy), the
// sample, the drops and the reordered rows from a recording's metadata.
func (o *Options) UseRecording(m traces.RecordingMeta) {
	o.Fleet = make(map[string]RecordedModel, len(m.Fleet)+len(m.Policy))
	for model, names := range m.Fleet {
		rm := o.Fleet[model]
		rm.Replicas = names
		o.Fleet[model] = rm
	}
	for model, policy := range m.Policy {
		rm := o.Fleet[model]
		rm.Policy = policy
		o.Fleet[model] = rm
	}
	o.Sample, o.Dropped, o.Reordered = m.Sample, m.Dropped, m.Reordered
}

// withDefaults fills in the zero values.
func (o Options) withDefaults() Options {
	if o.Engine.BlockSize == 0 {
		o.Engine = engine.DefaultConfig()
	}
	if o.Profile == "" {
		o.Profile = o.Engine.Name
	}
	if o.Gateway == (Gateway{}) {
		o.Gateway = DefaultGateway()
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	return o
}

// Validate checks the options once; every message names the setting.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	if o.Policy != "" {
		if _, err := router.NewPolicy(o.Policy, router.Options{}); err != nil {
			errs = append(errs, fmt.Errorf("policy: %w", err))
		}
	}
	if o.Replicas < 0 || o.Replicas > fleet.MaxReplicas {
		errs = append(errs, fmt.Errorf("replicas: must be between 0 (the recorded fleet) and %d, got %d", fleet.MaxReplicas, o.Replicas))
	}
	if err := o.Engine.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("profile: %w", err))
	}
	if o.Sample < 0 || o.Sample > 1 || math.IsNaN(o.Sample) {
		errs = append(errs, fmt.Errorf("sample: must be in (0, 1], got %v", o.Sample))
	} else if o.Sample > 0 && o.Sample < 1 {
		errs = append(errs, fmt.Errorf("the recording holds a sample of %.3g%% of the requests (record.sample %g): its replay offers the fleet only that share of the load, so its latencies and hit rates cannot match; record with sample: 1 to check fidelity", 100*o.Sample, o.Sample))
	}
	g := o.Gateway
	if g.ScrapeInterval <= 0 {
		errs = append(errs, fmt.Errorf("gateway scrape interval: must be positive, got %v", g.ScrapeInterval))
	}
	if g.Index != fleet.IndexApproximate && g.Index != fleet.IndexEvents {
		errs = append(errs, fmt.Errorf("gateway index: must be one of %s, got %q", strings.Join(fleet.IndexModes(), ", "), g.Index))
	}
	if g.MaxModelLen < 0 {
		errs = append(errs, fmt.Errorf("gateway max_model_len: must be zero (the engine's) or positive, got %d", g.MaxModelLen))
	}
	// A recorded policy is checked when its model is (prepared.fleet).
	for model, m := range o.Fleet {
		seen := make(map[string]bool, len(m.Replicas))
		for _, r := range m.Replicas {
			if r == "" || seen[r] {
				errs = append(errs, fmt.Errorf("recorded replicas of model %q: %q is empty or listed twice", model, r))
			}
			seen[r] = true
		}
	}
	if err := errors.Join(errs...); err != nil {
		return &InputError{err}
	}
	return nil
}

// InputError is bad input: a recording or options the check cannot use.
// The CLI exits with code 2 on it.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

func inputf(format string, args ...any) error { return &InputError{fmt.Errorf(format, args...)} }
