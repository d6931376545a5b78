package live

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/inferrail/inferrail/fleet/remote"
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
	ctx     context.Context
}

// targetName names a replica across models for the scraper and prober.
func targetName(m *model, r *replica) string { return m.name + "/" + r.name }

// Run starts the background work and blocks until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	bg := &background{kv: map[*replica]*kvSync{}, ctx: ctx}
	client := &http.Client{Transport: s.upstream.Transport}
	var err error
	bg.scraper, err = remote.NewScraper(remote.ScraperConfig{
		Interval: s.opts.Scrape.Interval, Timeout: s.opts.Scrape.Timeout, MaxBytes: s.opts.Scrape.MaxBytes,
		Client: client, OnReport: s.onScrape,
	})
	if err != nil {
		return fmt.Errorf("live: scraper: %w", err)
	}
	bg.prober, err = remote.NewProber(remote.ProberConfig{
		Interval: s.opts.Health.Interval, Timeout: s.opts.Health.Timeout, Path: s.opts.Health.Path,
		Client: client, OnResult: s.onProbe,
	})
	if err != nil {
		return fmt.Errorf("live: prober: %w", err)
	}
	var groups []remote.Group
	for _, m := range s.models {
		for _, g := range m.opts.DNS {
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
		bg.disco, err = remote.NewDiscovery(remote.DiscoveryConfig{Resolver: s.opts.Resolver, Refresh: s.opts.DNSRefresh, Groups: groups}, s.onDiscovery)
		if err != nil {
			return fmt.Errorf("live: discovery: %w", err)
		}
		run(bg.disco.Run)
	}
	for _, m := range s.models {
		for _, r := range m.reps {
			s.maybeSubscribe(m, r)
		}
	}
	<-ctx.Done()
	wg.Wait()
	bg.mu.Lock()
	for _, k := range bg.kv {
		k.close()
	}
	bg.mu.Unlock()
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
		m.mu.Lock()
		for _, r := range m.reps {
			if !r.gone {
				targets[targetName(m, r)] = r.base.String()
			}
		}
		m.mu.Unlock()
	}
	bg.scraper.SetTargets(targets)
	bg.prober.SetTargets(targets)
}

// find resolves a target name.
func (s *Server) find(target string) (*model, *replica) {
	for _, m := range s.models {
		if len(target) > len(m.name) && target[:len(m.name)] == m.name && target[len(m.name)] == '/' {
			m.mu.Lock()
			r := m.byName[target[len(m.name)+1:]]
			m.mu.Unlock()
			return m, r
		}
	}
	return nil, nil
}

// onScrape applies a metrics report: the engine's load, its KV capacity,
// and a restart (prefix-cache counters going backwards: its cache is empty).
func (s *Server) onScrape(target string, rep remote.Report) {
	m, r := s.find(target)
	if r == nil || rep.Err != nil {
		// An unreadable page is not an idle engine: keep the last good
		// load, which ages out after max_age.
		return
	}
	l := rep.Load
	m.mu.Lock()
	defer m.mu.Unlock()
	if rep.Restarted {
		m.rt.Restarted(r.idx)
	}
	r.engine = router.EngineLoad{Valid: true, Running: l.Running, Waiting: l.Waiting, KVCacheUsage: l.KVUsage}
	r.engineAt = rep.At
	if l.NumGPUBlocks > 0 && l.NumGPUBlocks != r.capacity {
		r.capacity = l.NumGPUBlocks
		m.rt.SetCapacity(r.idx, l.NumGPUBlocks)
	}
}

// onProbe applies an active health check: a failed probe counts as a
// failure toward ejection (within the share cap), a passing one resets the
// count. An ejected replica comes back when its ejection ends; if it still
// fails, it is ejected again for twice as long.
func (s *Server) onProbe(target string, ok bool, _ error) {
	m, r := s.find(target)
	if r == nil {
		return
	}
	if ok {
		m.succeeded(r)
		return
	}
	if m.failed(r, time.Now()) {
		s.met.ejected(m.name, r.name)
	}
}

// onDiscovery adds the replicas a DNS group resolves to and marks those it
// no longer lists as gone (kept until their requests end, never reused by
// the router).
func (s *Server) onDiscovery(group string, eps []remote.Endpoint) {
	var m *model
	var g DNSGroup
	for _, mm := range s.models {
		for _, gg := range mm.opts.DNS {
			if mm.name+"/"+gg.Name == group {
				m, g = mm, gg
			}
		}
	}
	if m == nil {
		return
	}
	want := map[string]bool{}
	var added []*replica
	m.mu.Lock()
	for _, ep := range eps {
		name := g.Name + "-" + ep.Addr
		want[name] = true
		ro := ReplicaOptions{Name: name, URL: ep.URL}
		host, _, _ := net.SplitHostPort(ep.Addr)
		if g.KVEventsPort > 0 {
			ro.KVEvents = fmt.Sprintf("tcp://%s", net.JoinHostPort(host, fmt.Sprint(g.KVEventsPort)))
			ro.KVEventsTopic = g.KVEventsTopic
		}
		if g.KVEventsReplayPort > 0 {
			ro.KVEventsReplay = fmt.Sprintf("tcp://%s", net.JoinHostPort(host, fmt.Sprint(g.KVEventsReplayPort)))
		}
		r, err := m.add(ro, g.Name)
		if err == nil {
			added = append(added, r)
		}
	}
	for _, r := range m.reps {
		if r.group == g.Name && !want[r.name] && !r.gone {
			r.gone = true
			m.rt.Forget(r.idx)
		}
	}
	m.mu.Unlock()
	s.refreshTargets()
	for _, r := range added {
		s.maybeSubscribe(m, r)
	}
}

// maybeSubscribe starts the replica's KV event subscription in events mode.
func (s *Server) maybeSubscribe(m *model, r *replica) {
	if m.opts.Index != router.IndexEvents || r.kvEvents == "" {
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
