package live

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/inferrail/inferrail/engine/kvevents"
	"github.com/inferrail/inferrail/fleet/remote"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router"
)

// Resolver resolves DNS groups (net.DefaultResolver is one).
type Resolver = remote.Resolver

// background is what Run starts: scraping, health probes, discovery and
// KV event subscriptions.
type background struct {
	scraper *remote.Scraper
	prober  *remote.Prober
	disco   *remote.Discovery
	mu      sync.Mutex
	kv      map[*replica]*kvSync
	// muxes are the models' kv_events_listen (kvmux.go).
	muxes []*kvevents.Mux
	ctx   context.Context
	// client reaches the engines' own endpoints; wg counts the questions
	// to their /v1/models still out (maxlen.go).
	client *http.Client
	wg     sync.WaitGroup
}

// targetName names a replica across models for the scraper and prober.
func targetName(m *model, r *replica) string { return m.name + "/" + r.name }

// Run starts the background work and blocks until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	client := &http.Client{Transport: s.upstream.Transport}
	bg := &background{kv: map[*replica]*kvSync{}, ctx: ctx, client: client}
	var err error
	bg.scraper, err = remote.NewScraper(remote.ScraperConfig{
		Interval: s.cfg.Scrape.Interval, Timeout: s.cfg.Scrape.Timeout, MaxBytes: int64(s.cfg.Scrape.MaxBytes),
		Client: client, OnReport: s.onScrape,
	})
	if err != nil {
		return fmt.Errorf("live: scraper: %w", err)
	}
	bg.prober, err = remote.NewProber(remote.ProberConfig{
		Interval: s.cfg.Health.Interval, Timeout: s.cfg.Health.Timeout, Path: s.cfg.Health.Path,
		Client: client, OnResult: s.onProbe,
	})
	if err != nil {
		return fmt.Errorf("live: prober: %w", err)
	}
	var groups []remote.Group
	for _, m := range s.models {
		for _, g := range m.dns {
			groups = append(groups, remote.Group{Name: m.name + "/" + g.Name, Host: g.Host, Port: g.Port, Scheme: g.Scheme})
		}
	}
	s.bgMu.Lock()
	s.bg = bg
	s.bgMu.Unlock()
	s.refreshTargets()
	var wg sync.WaitGroup
	run := func(f func(context.Context) error) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	run(bg.scraper.Run)
	run(bg.prober.Run)
	if len(groups) > 0 {
		bg.disco, err = remote.NewDiscovery(remote.DiscoveryConfig{Resolver: s.resolver, Refresh: s.cfg.DNSRefresh, Groups: groups}, s.onDiscovery)
		if err != nil {
			return fmt.Errorf("live: discovery: %w", err)
		}
		run(bg.disco.Run)
	}
	for _, m := range s.models {
		if err := s.startKVMux(ctx, bg, m); err != nil {
			s.log.Error("cannot bind kv_events_listen: the model's index gets no KV events", "model", m.name, "endpoint", m.kvListen, "error", err)
			s.met.kvBatch(m.name, "", "subscribe_failed")
		}
		for _, r := range m.live() {
			s.maybeSubscribe(m, r)
		}
	}
	<-ctx.Done()
	wg.Wait()
	bg.wg.Wait()
	bg.mu.Lock()
	kvs, muxes := bg.kv, bg.muxes
	bg.kv, bg.muxes = map[*replica]*kvSync{}, nil
	bg.mu.Unlock()
	for _, mux := range muxes {
		mux.Close()
	}
	for _, k := range kvs {
		k.close()
	}
	return nil
}

// refreshTargets tells the scraper and prober the current replicas.
func (s *Server) refreshTargets() {
	s.bgMu.Lock()
	bg := s.bg
	s.bgMu.Unlock()
	if bg == nil {
		return
	}
	targets := map[string]string{}
	for _, m := range s.models {
		for _, r := range m.live() {
			targets[targetName(m, r)] = r.base.String()
		}
	}
	bg.scraper.SetTargets(targets)
	bg.prober.SetTargets(targets)
}

// find resolves a target name.
func (s *Server) find(target string) (*model, *replica) {
	for _, m := range s.models {
		if len(target) > len(m.name) && target[:len(m.name)] == m.name && target[len(m.name)] == '/' {
			return m, m.lookup(target[len(m.name)+1:])
		}
	}
	return nil, nil
}

// onScrape applies a metrics report to the replica's view in the core: the
// engine's load, its KV capacity, and a restart (the core sees cumulative
// counters go backwards: the engine's cache is empty).
func (s *Server) onScrape(target string, rep remote.Report) {
	m, r := s.find(target)
	if r == nil {
		return
	}
	m.scraped(r, rep.Err, rep.Load.Model)
	if rep.Err != nil {
		s.met.scrapeErrors.WithLabelValues(m.name, r.name).Inc()
		// An unreadable page is not an idle engine: keep the last good
		// load, which ages out after max_age.
		return
	}
	m.report(r, rep.Load)
}

// onProbe applies an active health check: a failed probe counts as a
// failure toward ejection (within the share cap), a passing one resets the
// count. An ejected replica comes back when its ejection ends; if it still
// fails, it is ejected again for twice as long.
func (s *Server) onProbe(target string, ok bool, err error) {
	m, r := s.find(target)
	if r == nil {
		return
	}
	m.probe(r, ok, err)
	if ok {
		s.learnContextLen(m, r)
	}
}

// onDiscovery adds the replicas a DNS group resolves to and takes those it
// no longer lists out of rotation (their requests in flight end normally).
func (s *Server) onDiscovery(group string, eps []remote.Endpoint) {
	var m *model
	var g config.DNSGroup
	for _, mm := range s.models {
		for _, gg := range mm.dns {
			if mm.name+"/"+gg.Name == group {
				m, g = mm, gg
			}
		}
	}
	if m == nil {
		return
	}
	s.discovered(m, g, eps)
}

// discovered adds the replicas group g of model m lists now (eps) and takes
// those it no longer lists out of rotation: DNS groups, and the
// InferencePool `inferrail epp` watches.
func (s *Server) discovered(m *model, g config.DNSGroup, eps []remote.Endpoint) {
	want := map[string]bool{}
	var added []*replica
	for _, ep := range eps {
		name := g.Name + "-" + ep.Addr
		want[name] = true
		sp := replicaSpec{name: name, url: ep.URL, maxConcurrency: m.maxConcurrency, maxPending: m.maxPending, capacity: m.capacity, group: g.Name, role: roleOf(g.Role)}
		host, _, _ := net.SplitHostPort(ep.Addr)
		if g.KVEventsPort > 0 {
			sp.kvEvents = fmt.Sprintf("tcp://%s", net.JoinHostPort(host, fmt.Sprint(g.KVEventsPort)))
			sp.kvTopic = g.KVEventsTopic
		}
		if g.KVEventsReplayPort > 0 {
			sp.kvReplay = fmt.Sprintf("tcp://%s", net.JoinHostPort(host, fmt.Sprint(g.KVEventsReplayPort)))
		}
		r, err := m.add(sp)
		if err == nil {
			added = append(added, r)
		}
	}
	for _, name := range m.dropMissing(g.Name, want) {
		s.met.forget(m.name, name, nil)
	}
	s.refreshTargets()
	for _, r := range added {
		s.maybeSubscribe(m, r)
	}
}

// maybeSubscribe starts the replica's KV event subscription in events mode.
func (s *Server) maybeSubscribe(m *model, r *replica) {
	if m.index != router.IndexEvents || r.kvEvents == "" {
		return
	}
	s.bgMu.Lock()
	bg := s.bg
	s.bgMu.Unlock()
	if bg == nil {
		return
	}
	bg.mu.Lock()
	defer bg.mu.Unlock()
	if _, ok := bg.kv[r]; ok {
		return
	}
	k, err := s.startKVSync(bg.ctx, m, r)
	if err != nil {
		s.met.kvBatch(m.name, r.name, "subscribe_failed")
		return
	}
	bg.kv[r] = k
}
