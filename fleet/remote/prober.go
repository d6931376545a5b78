package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// ProberConfig configures a Prober. Zero fields take their defaults.
type ProberConfig struct {
	// Interval between two probes of a target (default 1s).
	Interval time.Duration
	// Timeout bounds one probe (default 500ms).
	Timeout time.Duration
	// Path is appended to each target's base URL (default "/health", which
	// vLLM and SGLang both serve).
	Path string
	// Client does the requests (default: a client of the prober's own).
	Client *http.Client
	// Now is the clock for ProbeResult.At (default time.Now).
	Now func() time.Time
	// OnResult, if set, is called after every probe of a current target,
	// from the probe's goroutine: calls for one target never overlap, calls
	// for different targets may. ok is err == nil.
	OnResult func(name string, ok bool, err error)
}

// Prober defaults.
const (
	DefaultProbeInterval = time.Second
	DefaultProbeTimeout  = 500 * time.Millisecond
	DefaultHealthPath    = "/health"
)

func (c *ProberConfig) setDefaults() {
	if c.Interval == 0 {
		c.Interval = DefaultProbeInterval
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultProbeTimeout
	}
	if c.Path == "" {
		c.Path = DefaultHealthPath
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every problem with the configuration (after defaults).
func (c ProberConfig) Validate() error {
	var errs []error
	if c.Interval < 0 {
		errs = append(errs, fmt.Errorf("probe interval %v: must be positive", c.Interval))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("probe timeout %v: must be positive", c.Timeout))
	}
	if c.Path != "" && c.Path[0] != '/' {
		errs = append(errs, fmt.Errorf("health path %q: must start with /", c.Path))
	}
	return errors.Join(errs...)
}

// ProbeResult is how a target's latest probe went.
type ProbeResult struct {
	// Probed is false until the first probe of the target ends.
	Probed bool
	// OK is true when the latest probe got a 2xx answer within Timeout.
	OK bool
	// Err is why the latest probe failed.
	Err error
	// At is when the latest probe ended; Duration how long it took.
	At       time.Time
	Duration time.Duration
	// Consecutive counts the latest run of equal outcomes (successes while
	// OK, failures otherwise), for thresholds such as "3 failures eject".
	Consecutive int
}

// Prober checks the health of a changing set of engines. Create it with
// NewProber, give it targets with SetTargets (at any time), drive it with
// Run, and read it with Result or through OnResult.
type Prober struct {
	cfg    ProberConfig
	client *http.Client
	ownCl  bool
	p      *poller[ProbeResult]
}

// NewProber validates cfg and returns a prober with no targets.
func NewProber(cfg ProberConfig) (*Prober, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("prober: %w", err)
	}
	p := &Prober{cfg: cfg, client: cfg.Client}
	if p.client == nil {
		p.client, p.ownCl = defaultClient(), true
	}
	p.p = newPoller(cfg.Interval, cfg.Path, p.probe)
	return p, nil
}

// SetTargets replaces the set of engines probed: target name to base URL
// (Path is appended). New targets are probed at once, removed ones no
// longer. An invalid URL changes nothing and returns an error.
func (p *Prober) SetTargets(targets map[string]string) error {
	if err := p.p.setTargets(targets); err != nil {
		return fmt.Errorf("prober: %w", err)
	}
	return nil
}

// Run probes every target every Interval until ctx ends, then waits for
// the probes in flight and returns nil. It may be called once.
func (p *Prober) Run(ctx context.Context) error {
	if err := p.p.run(ctx); err != nil {
		return fmt.Errorf("prober: %w", err)
	}
	if p.ownCl {
		p.client.CloseIdleConnections()
	}
	return nil
}

// Result returns name's latest result, false if name is not a target.
func (p *Prober) Result(name string) (ProbeResult, bool) { return p.p.get(name) }

// maxHealthBody is how much of a health answer is read (so that the
// connection can be reused); the rest is dropped with the connection.
const maxHealthBody = 64 << 10

func (p *Prober) probe(ctx context.Context, t *target[ProbeResult]) {
	start := p.cfg.Now()
	err := p.check(ctx, t.url)
	end := p.cfg.Now()
	if ctx.Err() != nil {
		p.p.abandon(t) // Run is returning: no fault of the target's
		return
	}
	ok := err == nil
	_, current := p.p.finish(t, func(r *ProbeResult) {
		if r.Probed && r.OK == ok {
			r.Consecutive++
		} else {
			r.Consecutive = 1
		}
		*r = ProbeResult{Probed: true, OK: ok, Err: err, At: end, Duration: end.Sub(start), Consecutive: r.Consecutive}
	})
	if current && p.cfg.OnResult != nil {
		p.cfg.OnResult(t.name, ok, err)
	}
}

func (p *Prober) check(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	_, rerr := io.Copy(io.Discard, io.LimitReader(resp.Body, maxHealthBody))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("probe %s: status %d", url, resp.StatusCode)
	}
	if rerr != nil {
		return fmt.Errorf("probe %s: read answer: %w", url, rerr)
	}
	return nil
}
