package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Resolver looks up a host's addresses; *net.Resolver satisfies it.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// Group is one DNS name whose addresses are engines of the same kind, for
// example a Kubernetes headless service.
type Group struct {
	// Name names the group and prefixes its endpoints' names.
	Name string
	// Host is the DNS name to resolve.
	Host string
	// Port is the engines' port.
	Port int
	// Scheme is "http" (default) or "https".
	Scheme string
	// Path is an optional prefix of the engines' API ("" or starting with /).
	Path string
}

// Endpoint is one discovered engine.
type Endpoint struct {
	// Name is "group-addr", e.g. "vllm-10.0.0.5:8000"; stable while the
	// address is.
	Name string
	// URL is the engine's base URL, e.g. "http://10.0.0.5:8000" or
	// "http://[2001:db8::1]:8000/prefix".
	URL string
	// Addr is host:port, IPv6 hosts bracketed.
	Addr string
}

// DiscoveryConfig configures a Discovery. Zero fields take their defaults.
type DiscoveryConfig struct {
	// Resolver looks names up (default net.DefaultResolver).
	Resolver Resolver
	// Refresh is the time between two lookups of a group (default 10s).
	Refresh time.Duration
	// Timeout bounds one lookup (default 2s).
	Timeout time.Duration
	// Groups are the names to resolve; at least one.
	Groups []Group
	// OnError, if set, is called with every failed lookup (the group keeps
	// its last known endpoints), from Run's goroutine.
	OnError func(group string, err error)
}

// Discovery defaults.
const (
	DefaultRefresh       = 10 * time.Second
	DefaultLookupTimeout = 2 * time.Second
)

func (c *DiscoveryConfig) setDefaults() {
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	if c.Refresh == 0 {
		c.Refresh = DefaultRefresh
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultLookupTimeout
	}
	c.Groups = slices.Clone(c.Groups)
	for i := range c.Groups {
		if c.Groups[i].Scheme == "" {
			c.Groups[i].Scheme = "http"
		}
	}
}

// Validate reports every problem with the configuration (after defaults).
func (c DiscoveryConfig) Validate() error {
	var errs []error
	if c.Refresh < 0 {
		errs = append(errs, fmt.Errorf("refresh %v: must be positive", c.Refresh))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("lookup timeout %v: must be positive", c.Timeout))
	}
	if len(c.Groups) == 0 {
		errs = append(errs, errors.New("no groups: give at least one DNS name to resolve"))
	}
	seen := make(map[string]bool, len(c.Groups))
	for i, g := range c.Groups {
		switch {
		case g.Name == "":
			errs = append(errs, fmt.Errorf("group %d: name is empty", i))
		case seen[g.Name]:
			errs = append(errs, fmt.Errorf("group %q: name used twice", g.Name))
		}
		seen[g.Name] = true
		if g.Host == "" {
			errs = append(errs, fmt.Errorf("group %q: host is empty", g.Name))
		}
		if g.Port < 1 || g.Port > 65535 {
			errs = append(errs, fmt.Errorf("group %q: port %d: must be within [1, 65535]", g.Name, g.Port))
		}
		if g.Scheme != "http" && g.Scheme != "https" {
			errs = append(errs, fmt.Errorf("group %q: scheme %q: must be http or https", g.Name, g.Scheme))
		}
		if g.Path != "" && g.Path[0] != '/' {
			errs = append(errs, fmt.Errorf("group %q: path %q: must start with /", g.Name, g.Path))
		}
	}
	return errors.Join(errs...)
}

// DiscoveryStats count a Discovery's work.
type DiscoveryStats struct {
	// Lookups and Failures count DNS lookups and the failed ones; Changes
	// counts onChange calls.
	Lookups, Failures, Changes int64
}

// Discovery resolves groups of engines by DNS. Create it with
// NewDiscovery and drive it with Run.
type Discovery struct {
	cfg      DiscoveryConfig
	onChange func(group string, eps []Endpoint)

	lookups, failures, changes atomic.Int64
	running                    atomic.Bool

	mu    sync.Mutex
	known map[string][]Endpoint // by group; absent until a lookup succeeds
}

// NewDiscovery validates cfg and returns a Discovery that calls onChange
// (from Run's goroutine, one call at a time) with a group's sorted,
// deduplicated endpoints after its first successful lookup and whenever
// the set changes.
func NewDiscovery(cfg DiscoveryConfig, onChange func(group string, eps []Endpoint)) (*Discovery, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	if onChange == nil {
		return nil, errors.New("discovery: onChange is nil; pass a function that applies the endpoints")
	}
	return &Discovery{cfg: cfg, onChange: onChange, known: make(map[string][]Endpoint)}, nil
}

// Run resolves every group at once and then every Refresh until ctx ends;
// it returns nil then. A failed lookup keeps the group's last known set
// (it is counted in Stats and passed to OnError). A lookup that succeeds
// with no addresses empties the group. Groups are looked up one after the
// other, each within Timeout. Run may be called once.
func (d *Discovery) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("discovery: Run called twice; create another Discovery")
	}
	tk := time.NewTicker(d.cfg.Refresh)
	defer tk.Stop()
	for {
		for _, g := range d.cfg.Groups {
			if ctx.Err() != nil {
				return nil
			}
			d.refresh(ctx, g)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C:
		}
	}
}

// Endpoints returns group's last known endpoints, false before its first
// successful lookup.
func (d *Discovery) Endpoints(group string) ([]Endpoint, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	eps, ok := d.known[group]
	return slices.Clone(eps), ok
}

// Stats returns the counts so far.
func (d *Discovery) Stats() DiscoveryStats {
	return DiscoveryStats{Lookups: d.lookups.Load(), Failures: d.failures.Load(), Changes: d.changes.Load()}
}

func (d *Discovery) refresh(ctx context.Context, g Group) {
	lctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	addrs, err := d.cfg.Resolver.LookupHost(lctx, g.Host)
	cancel()
	d.lookups.Add(1)
	if err == nil && ctx.Err() != nil {
		return // shutting down
	}
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		d.failures.Add(1)
		if d.cfg.OnError != nil {
			d.cfg.OnError(g.Name, fmt.Errorf("discovery: look up %s for group %q: %w", g.Host, g.Name, err))
		}
		return
	}
	eps, bad := GroupEndpoints(g, addrs)
	if bad != nil && d.cfg.OnError != nil {
		d.cfg.OnError(g.Name, fmt.Errorf("discovery: group %q: %w", g.Name, bad))
	}
	d.mu.Lock()
	old, known := d.known[g.Name]
	same := known && slices.Equal(old, eps)
	if !same {
		d.known[g.Name] = eps
	}
	d.mu.Unlock()
	if same {
		return
	}
	d.changes.Add(1)
	d.onChange(g.Name, slices.Clone(eps))
}

// GroupEndpoints turns a group's looked-up addresses into its endpoints, sorted
// by address and deduplicated (IPv4-mapped IPv6 addresses count as IPv4).
// Strings that are not IP addresses are left out and reported in err.
func GroupEndpoints(g Group, addrs []string) ([]Endpoint, error) {
	ips := make([]netip.Addr, 0, len(addrs))
	var bad []string
	for _, a := range addrs {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			bad = append(bad, a)
			continue
		}
		ips = append(ips, ip.Unmap())
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	ips = slices.Compact(ips)
	scheme := g.Scheme
	if scheme == "" {
		scheme = "http"
	}
	port := strconv.Itoa(g.Port)
	eps := make([]Endpoint, len(ips))
	for i, ip := range ips {
		addr := net.JoinHostPort(ip.String(), port)
		u := url.URL{Scheme: scheme, Host: addr, Path: g.Path}
		eps[i] = Endpoint{Name: g.Name + "-" + addr, URL: u.String(), Addr: addr}
	}
	var err error
	if len(bad) > 0 {
		err = fmt.Errorf("resolver returned %q, which are not IP addresses; they were left out", bad)
	}
	return eps, err
}
