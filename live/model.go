package live

import (
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/router"
)

// Encoder turns a request's prompt into the token ids the engine will see.
type Encoder interface {
	// EncodeCompletion tokenizes a /v1/completions prompt.
	EncodeCompletion(prompt string) []uint32
	// EncodeChat renders and tokenizes a /v1/chat/completions body.
	EncodeChat(body []byte) ([]uint32, error)
}

// replica is one upstream engine. Its fields are guarded by its model's mu.
type replica struct {
	idx        int
	name       string
	base       *url.URL
	maxConc    int
	maxPending int
	kvEvents   string
	kvReplay   string
	kvTopic    string
	group      string // DNS group, "" for a static replica
	gone       bool   // removed by discovery; kept until its requests end

	load router.Load
	// engine is the last scraped load; engineAt when it was read.
	engine   router.EngineLoad
	engineAt time.Time
	capacity int // KV blocks, from the engine's cache_config_info

	// health: failed requests and failed probes both count; ejection is
	// the only way out of rotation, so the share cap always holds.
	failures     int // consecutive
	ejections    int
	ejectedUntil time.Time
}

// model is one served model: its router and replicas. The Router is not
// safe for concurrent use, so mu serialises decisions and state updates
// (a decision takes tens of microseconds).
type model struct {
	name   string
	opts   ModelOptions
	health HealthOptions
	maxAge time.Duration
	salt   kvblock.Hash

	mu     sync.Mutex
	rt     *router.Router
	reps   []*replica
	byName map[string]*replica
	view   []router.Replica
	start  time.Time
	nextID uint64
	models []string
}

func newModel(o ModelOptions, opts *Options, start time.Time) (*model, error) {
	rt, err := router.NewRouter(router.Config{
		Policy: o.Policy,
		Options: router.Options{
			Seed:                opts.Seed,
			BlockSize:           o.Engine.BlockSize,
			Profile:             o.Engine.Latency,
			MaxNumBatchedTokens: o.Engine.MaxNumBatchedTokens,
			SessionAffinity:     o.SessionAffinity,
		},
		Index:                 o.Index,
		SpeculationTTL:        2 * time.Second,
		DefaultCapacityBlocks: o.Engine.NumGPUBlocks,
	})
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", o.Name, err)
	}
	m := &model{
		name: o.Name, opts: o, health: opts.Health, maxAge: opts.Scrape.MaxAge,
		salt: kvblock.Salt(o.Name, "", ""), rt: rt, byName: map[string]*replica{}, start: start,
		models: []string{o.Name},
	}
	for _, r := range o.Replicas {
		if _, err := m.add(r, ""); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// add registers a replica (or brings a removed one back).
func (m *model) add(r ReplicaOptions, group string) (*replica, error) {
	u, err := url.Parse(r.URL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("model %s: replica %q: url %q must be an absolute http(s) URL", m.name, r.Name, r.URL)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	name := r.Name
	if name == "" {
		name = u.Host
	}
	if old, ok := m.byName[name]; ok {
		old.gone = false
		return old, nil
	}
	rep := &replica{
		idx: len(m.reps), name: name, base: u,
		maxConc: r.MaxConcurrency, maxPending: r.MaxPending,
		kvEvents: r.KVEvents, kvReplay: r.KVEventsReplay, kvTopic: r.KVEventsTopic,
		group: group,
	}
	if rep.maxConc <= 0 {
		rep.maxConc = m.opts.MaxConcurrency
	}
	if rep.maxPending <= 0 {
		rep.maxPending = m.opts.MaxPending
	}
	m.reps = append(m.reps, rep)
	m.byName[name] = rep
	m.rt.SetCapacity(rep.idx, m.opts.Engine.NumGPUBlocks)
	return rep, nil
}

// healthy reports whether r takes new requests now: it is not ejected.
func (r *replica) healthy(now time.Time) bool {
	return !r.gone && !now.Before(r.ejectedUntil)
}

// full reports whether a new request would overshoot r's caps.
func (r *replica) full() bool {
	return (r.maxConc > 0 && r.load.InFlight >= r.maxConc) || (r.maxPending > 0 && r.load.Pending >= r.maxPending)
}

// attempt is one try of a request on one replica.
type attempt struct {
	rep      *replica
	decision router.Decision
	prompt   int
	// predicted is the cached tokens the index predicted (-1 without).
	predicted int
	// released is set once the attempt's slot is given back.
	released bool
	// inFlight is the replica's requests in flight once this one was added.
	inFlight int
}

// route picks a replica among those not yet tried and takes a slot on it.
// It never overshoots a replica's caps: the check and the increment happen
// under the same lock.
func (m *model) route(req *router.Request, tried map[*replica]bool, now time.Time) (attempt, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.view = m.view[:0]
	for _, r := range m.reps {
		ok := r.healthy(now) && !r.full() && !tried[r]
		eng := r.engine
		if eng.Valid {
			eng.Age = now.Sub(r.engineAt)
			if m.maxAge > 0 && eng.Age > m.maxAge {
				eng = router.EngineLoad{} // too old: treated as missing
			}
		}
		load := r.load
		load.Engine = eng
		m.view = append(m.view, router.Replica{
			Candidate: router.Candidate{Replica: r.idx, Name: r.name, Load: load, KVCapacityBlocks: r.capacityOr(m.opts.Engine.NumGPUBlocks)},
			Healthy:   ok,
			Models:    m.models,
		})
	}
	m.nextID++
	req.ID = m.nextID
	req.Model = m.name
	d, err := m.rt.Route(now.Sub(m.start), req, m.view)
	if err != nil {
		return attempt{}, err
	}
	r := m.reps[d.Replica]
	r.load.InFlight++
	r.load.Pending++
	r.load.PendingPromptTokens += req.PromptTokens
	r.load.PendingPrefillTokens += req.PromptTokens - d.PredictedCachedTokens
	r.load.InFlightPromptTokens += req.PromptTokens
	pred := -1
	if req.BlockHashes != nil {
		pred = d.PredictedCachedTokens
	}
	return attempt{rep: r, decision: d, prompt: req.PromptTokens, predicted: pred, inFlight: r.load.InFlight}, nil
}

func (r *replica) capacityOr(def int) int {
	if r.capacity > 0 {
		return r.capacity
	}
	return def
}

// firstByte moves an attempt from pending to streaming.
func (m *model) firstByte(a *attempt) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a.rep.load.Pending--
	a.rep.load.PendingPromptTokens -= a.prompt
	a.rep.load.PendingPrefillTokens -= a.prompt - a.decision.PredictedCachedTokens
}

// release ends an attempt. ok reports whether the engine served it (its
// prompt is now cached there); pending whether it never saw a first byte.
func (m *model) release(a *attempt, ok, pending bool, held []kvblock.Hash) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := a.rep
	if pending {
		r.load.Pending--
		r.load.PendingPromptTokens -= a.prompt
		r.load.PendingPrefillTokens -= a.prompt - a.decision.PredictedCachedTokens
	}
	r.load.InFlight--
	r.load.InFlightPromptTokens -= a.prompt
	if ok {
		m.rt.Finished(a.decision, held)
	} else {
		m.rt.Abandon(a.decision) // also ends the attempt's pins
	}
}

// failed records a failure of r (a request that could not reach it, or a
// health probe). It returns true when r was ejected by it.
func (m *model) failed(r *replica, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	r.failures++
	if r.failures < m.health.EjectAfter || now.Before(r.ejectedUntil) {
		return false
	}
	// Never eject more than the allowed share of the model's replicas.
	ejected, total := 0, 0
	for _, o := range m.reps {
		if o.gone {
			continue
		}
		total++
		if now.Before(o.ejectedUntil) {
			ejected++
		}
	}
	if float64(ejected+1) > m.health.MaxEjectedShare*float64(total) {
		return false
	}
	d := m.health.EjectTime << min(r.ejections, 20)
	if d > m.health.MaxEjectTime || d <= 0 {
		d = m.health.MaxEjectTime
	}
	r.ejections++
	r.ejectedUntil = now.Add(d)
	r.failures = 0
	return true
}

// succeeded resets r's consecutive failures.
func (m *model) succeeded(r *replica) {
	m.mu.Lock()
	r.failures = 0
	m.mu.Unlock()
}
