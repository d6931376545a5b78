package remote

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// poller calls work for every target every interval, all targets in
// parallel, with at most one call in flight per target: a slow target skips
// its ticks while its call lasts and delays no other. It is the loop under
// Scraper and Prober; S is what they keep per target (guarded by mu).
type poller[S any] struct {
	interval time.Duration
	path     string
	work     func(ctx context.Context, t *target[S])

	mu      sync.Mutex
	targets map[string]*target[S]
	kick    chan struct{} // new targets to start now rather than at the next tick
	running atomic.Bool
}

// target is one polled address. name and url never change; a target whose
// URL changes is replaced.
type target[S any] struct {
	name, url string

	// Guarded by poller.mu.
	inflight, started, gone bool
	state                   S

	// buf is owned by the call in flight.
	buf []byte
}

func newPoller[S any](interval time.Duration, path string, work func(context.Context, *target[S])) *poller[S] {
	return &poller[S]{
		interval: interval,
		path:     path,
		work:     work,
		targets:  make(map[string]*target[S]),
		kick:     make(chan struct{}, 1),
	}
}

// targetURL joins an engine's base URL and the polled path.
func targetURL(base, path string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("base URL %q: %w", base, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("base URL %q: scheme must be http or https", base)
	}
	if u.Host == "" {
		return "", fmt.Errorf("base URL %q has no host; write it as http://host:port", base)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("base URL %q: drop the query or fragment", base)
	}
	return strings.TrimSuffix(base, "/") + path, nil
}

// setTargets replaces the target set (name to base URL). Targets keep their
// state when their URL is unchanged; removed ones stop being polled and
// results still in flight for them are dropped. An invalid URL changes
// nothing and returns an error.
func (p *poller[S]) setTargets(m map[string]string) error {
	urls := make(map[string]string, len(m))
	var errs []error
	for name, base := range m {
		if name == "" {
			errs = append(errs, fmt.Errorf("target with base URL %q has an empty name", base))
			continue
		}
		u, err := targetURL(base, p.path)
		if err != nil {
			errs = append(errs, fmt.Errorf("target %q: %w", name, err))
			continue
		}
		urls[name] = u
	}
	if len(errs) > 0 {
		sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
		return errors.Join(errs...)
	}
	added := false
	p.mu.Lock()
	for name, t := range p.targets {
		if u, ok := urls[name]; !ok || u != t.url {
			t.gone = true
			delete(p.targets, name)
		}
	}
	for name, u := range urls {
		if _, ok := p.targets[name]; !ok {
			p.targets[name] = &target[S]{name: name, url: u}
			added = true
		}
	}
	p.mu.Unlock()
	if added {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// run polls until ctx ends, then waits for the calls in flight (which see
// ctx cancelled) and returns nil.
func (p *poller[S]) run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("Run called twice; create another instance")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	tk := time.NewTicker(p.interval)
	defer tk.Stop()
	p.dispatch(ctx, &wg, false)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C:
			p.dispatch(ctx, &wg, false)
		case <-p.kick:
			p.dispatch(ctx, &wg, true)
		}
	}
}

// dispatch starts a call for every target with none in flight (onlyNew:
// for targets never polled).
func (p *poller[S]) dispatch(ctx context.Context, wg *sync.WaitGroup, onlyNew bool) {
	if ctx.Err() != nil {
		return // a tick that raced with the end of Run
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.targets {
		if t.inflight || (onlyNew && t.started) {
			continue
		}
		t.inflight, t.started = true, true
		wg.Go(func() { p.work(ctx, t) })
	}
}

// finish ends t's call: update applies its result unless t was removed
// meanwhile. It returns t's state after the update and whether t is still
// a target.
func (p *poller[S]) finish(t *target[S], update func(*S)) (S, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t.inflight = false
	if t.gone {
		var zero S
		return zero, false
	}
	update(&t.state)
	return t.state, true
}

// abandon ends t's call without a result.
func (p *poller[S]) abandon(t *target[S]) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t.inflight = false
}

// get returns name's state.
func (p *poller[S]) get(name string) (S, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.targets[name]
	if !ok {
		var zero S
		return zero, false
	}
	return t.state, true
}

// all returns every target's state.
func (p *poller[S]) all() map[string]S {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]S, len(p.targets))
	for name, t := range p.targets {
		out[name] = t.state
	}
	return out
}

// defaultClient is a client of its own (not http.DefaultClient, whose
// transport other code may change).
func defaultClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 4
	return &http.Client{Transport: tr}
}
