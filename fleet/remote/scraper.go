package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// ErrTooLarge marks a /metrics page longer than ScraperConfig.MaxBytes.
var ErrTooLarge = errors.New("metrics page too large")

// ScraperConfig configures a Scraper. Zero fields take their defaults.
type ScraperConfig struct {
	// Interval between two scrapes of a target (default 100ms).
	Interval time.Duration
	// Timeout bounds one scrape's request: connecting and reading the page
	// (default 80ms; parsing, some 100µs, is not interrupted). It may
	// exceed Interval: a target whose scrape is still in flight skips its
	// ticks.
	Timeout time.Duration
	// MaxBytes caps a page, enforced while reading (default 4 MiB).
	MaxBytes int64
	// Path is appended to each target's base URL (default "/metrics").
	Path string
	// Client does the requests (default: a client of the scraper's own).
	Client *http.Client
	// Now is the clock for Report.At and Duration (default time.Now).
	Now func() time.Time
	// OnReport, if set, is called after every scrape of a current target
	// with the target's updated report, from the scrape's goroutine: calls
	// for one target never overlap, calls for different targets may. It
	// delays that target's next scrape while it runs, no other.
	OnReport func(name string, r Report)
}

// Scraper defaults.
const (
	DefaultScrapeInterval = 100 * time.Millisecond
	DefaultScrapeTimeout  = 80 * time.Millisecond
	DefaultMaxBytes       = 4 << 20
	DefaultMetricsPath    = "/metrics"
)

func (c *ScraperConfig) setDefaults() {
	if c.Interval == 0 {
		c.Interval = DefaultScrapeInterval
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultScrapeTimeout
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.Path == "" {
		c.Path = DefaultMetricsPath
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every problem with the configuration (after defaults).
func (c ScraperConfig) Validate() error {
	var errs []error
	if c.Interval < 0 {
		errs = append(errs, fmt.Errorf("scrape interval %v: must be positive", c.Interval))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("scrape timeout %v: must be positive", c.Timeout))
	}
	if c.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("max bytes %d: must be positive", c.MaxBytes))
	}
	if c.Path != "" && c.Path[0] != '/' {
		errs = append(errs, fmt.Errorf("metrics path %q: must start with /", c.Path))
	}
	return errors.Join(errs...)
}

// Report is what a Scraper knows of one target: the last good Load and,
// apart from it, how the latest scrape went.
type Report struct {
	// Load is the last load read; zero until one is.
	Load Load
	// At is when Load's page was read; zero until one is.
	At time.Time
	// Err is the latest scrape's failure, nil if it succeeded. Load and At
	// still hold the last good read. errors.Is(Err, ErrUnreadable) or
	// ErrTooLarge: the engine answered with a page that cannot be used.
	Err error
	// ErrAt is when Err happened.
	ErrAt time.Time
	// Duration is how long the latest scrape took.
	Duration time.Duration
	// Restarted is set when the latest good read's counters went backwards
	// from the one before (Load.CountersReset): the engine restarted and
	// its prefix cache is empty.
	Restarted bool
	// Scrapes and Failures count scrapes of this target; Consecutive counts
	// failures since the last success.
	Scrapes, Failures, Consecutive int64
}

// State is how usable a target's Report is.
type State uint8

const (
	// StateUnknown: no page has been read yet.
	StateUnknown State = iota
	// StateFresh: the last good Load was read within maxAge.
	StateFresh
	// StateStale: the last good Load is older than maxAge (the target is
	// slow, down, or not scraped since).
	StateStale
	// StateUnreadable: the latest scrape got an answer that is not a usable
	// metrics page; the engine's load is unknown, not zero.
	StateUnreadable
)

func (s State) String() string {
	switch s {
	case StateFresh:
		return "fresh"
	case StateStale:
		return "stale"
	case StateUnreadable:
		return "unreadable"
	}
	return "unknown"
}

// State classifies r at now: an unreadable latest page first, then by the
// age of the last good Load. A scrape that failed to connect or timed out
// leaves the previous Load fresh until it ages past maxAge.
func (r Report) State(maxAge time.Duration, now time.Time) State {
	switch {
	case r.Err != nil && (errors.Is(r.Err, ErrUnreadable) || errors.Is(r.Err, ErrTooLarge)):
		return StateUnreadable
	case r.At.IsZero():
		return StateUnknown
	case now.Sub(r.At) <= maxAge:
		return StateFresh
	}
	return StateStale
}

// Scraper reads the /metrics pages of a changing set of engines. Create it
// with NewScraper, give it targets with SetTargets (at any time), drive it
// with Run, and read it with Report or Fresh from any goroutine.
type Scraper struct {
	cfg    ScraperConfig
	client *http.Client
	ownCl  bool
	p      *poller[Report]
}

// NewScraper validates cfg and returns a scraper with no targets.
func NewScraper(cfg ScraperConfig) (*Scraper, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("scraper: %w", err)
	}
	s := &Scraper{cfg: cfg, client: cfg.Client}
	if s.client == nil {
		s.client, s.ownCl = defaultClient(), true
	}
	s.p = newPoller(cfg.Interval, cfg.Path, s.scrape)
	return s, nil
}

// SetTargets replaces the set of engines scraped: target name to base URL
// (Path is appended). New targets are scraped at once, removed ones no
// longer (their reports are dropped), and a target whose URL changed starts
// afresh. An invalid URL changes nothing and returns an error.
func (s *Scraper) SetTargets(targets map[string]string) error {
	if err := s.p.setTargets(targets); err != nil {
		return fmt.Errorf("scraper: %w", err)
	}
	return nil
}

// Run scrapes every target every Interval until ctx ends, then waits for
// the scrapes in flight and returns nil. It may be called once.
func (s *Scraper) Run(ctx context.Context) error {
	if err := s.p.run(ctx); err != nil {
		return fmt.Errorf("scraper: %w", err)
	}
	if s.ownCl {
		s.client.CloseIdleConnections()
	}
	return nil
}

// Report returns name's report, false if name is not a target.
func (s *Scraper) Report(name string) (Report, bool) { return s.p.get(name) }

// Reports returns every target's report.
func (s *Scraper) Reports() map[string]Report { return s.p.all() }

// Fresh returns name's last good Load if its Report is StateFresh at now.
func (s *Scraper) Fresh(name string, maxAge time.Duration, now time.Time) (Load, bool) {
	r, ok := s.p.get(name)
	if !ok || r.State(maxAge, now) != StateFresh {
		return Load{}, false
	}
	return r.Load, true
}

// maxKeptBuffer is the largest page buffer kept for a target's next scrape.
const maxKeptBuffer = 1 << 20

// acceptHeader prefers the text format: expfmt's OpenMetrics decoder is
// slower, and vLLM and SGLang serve text by default.
const acceptHeader = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"

func (s *Scraper) scrape(ctx context.Context, t *target[Report]) {
	start := s.cfg.Now()
	load, err := s.fetch(ctx, t)
	end := s.cfg.Now()
	if ctx.Err() != nil {
		s.p.abandon(t) // Run is returning: no fault of the target's
		return
	}
	r, ok := s.p.finish(t, func(r *Report) {
		r.Duration = end.Sub(start)
		r.Scrapes++
		if err != nil {
			r.Err, r.ErrAt = err, end
			r.Failures++
			r.Consecutive++
			return
		}
		r.Restarted = load.CountersReset(r.Load)
		r.Load, r.At = load, end
		r.Err, r.Consecutive = nil, 0
	})
	if ok && s.cfg.OnReport != nil {
		s.cfg.OnReport(t.name, r)
	}
}

// fetch reads and parses t's page within Timeout and MaxBytes.
func (s *Scraper) fetch(ctx context.Context, t *target[Report]) (Load, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return Load{}, fmt.Errorf("scrape %s: %w", t.url, err)
	}
	req.Header.Set("Accept", acceptHeader)
	resp, err := s.client.Do(req)
	if err != nil {
		return Load{}, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return Load{}, fmt.Errorf("scrape %s: status %d; is this the engine's metrics path?", t.url, resp.StatusCode)
	}
	buf := bytes.NewBuffer(t.buf[:0])
	_, err = buf.ReadFrom(io.LimitReader(resp.Body, s.cfg.MaxBytes+1))
	if buf.Cap() <= maxKeptBuffer {
		t.buf = buf.Bytes()[:0] // reused by the next scrape of t
	} else {
		t.buf = nil
	}
	if err != nil {
		return Load{}, fmt.Errorf("scrape %s: read page: %w", t.url, err)
	}
	if int64(buf.Len()) > s.cfg.MaxBytes {
		return Load{}, fmt.Errorf("scrape %s: page exceeds %d bytes; raise the scraper's MaxBytes: %w", t.url, s.cfg.MaxBytes, ErrTooLarge)
	}
	load, err := parsePage(buf.Bytes(), resp.Header.Get("Content-Type"))
	if err != nil {
		return Load{}, fmt.Errorf("scrape %s: %w", t.url, err)
	}
	return load, nil
}
