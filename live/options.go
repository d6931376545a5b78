package live

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/router"
)

// Options configure a Server. The CLI builds them from the YAML
// configuration (package live/config); tests build them directly.
type Options struct {
	// RequestTimeout is one overall deadline per request, retries included.
	RequestTimeout time.Duration
	// MaxBodyBytes caps request bodies.
	MaxBodyBytes int64
	// Retry: attempts before the first response byte, with exponential
	// backoff between them.
	Attempts   int
	Backoff    time.Duration
	MaxBackoff time.Duration
	Health     HealthOptions
	Scrape     ScrapeOptions
	Tokenize   TokenizeOptions
	// DecisionLog receives sampled decisions as JSON lines (nil: off).
	DecisionLog       DecisionSink
	DecisionLogSample float64
	DecisionLogBuffer int
	// DNSRefresh is how often DNS groups are resolved again.
	DNSRefresh time.Duration
	// Resolver resolves DNS groups (default net.DefaultResolver).
	Resolver Resolver
	Models   []ModelOptions
	// Seed seeds the policies.
	Seed uint64
	// Transport carries every request to the engines (proxied requests,
	// scrapes, probes); nil: a pooled keep-alive transport.
	Transport http.RoundTripper
}

// HealthOptions configure active health checks and passive ejection.
type HealthOptions struct {
	Interval, Timeout       time.Duration
	Path                    string
	EjectAfter              int
	EjectTime, MaxEjectTime time.Duration
	MaxEjectedShare         float64
}

// ScrapeOptions configure the engines' /metrics scraping.
type ScrapeOptions struct {
	Interval, Timeout time.Duration
	MaxBytes          int64
	MaxAge            time.Duration
}

// TokenizeOptions configure the edge tokenizer pool.
type TokenizeOptions struct {
	Workers int
	Queue   int
	Timeout time.Duration
}

// ModelOptions is one served model.
type ModelOptions struct {
	Name    string
	Aliases []string
	Policy  string
	// Encoder tokenizes prompts for predictions (nil: no predictions).
	Encoder Encoder
	Index   router.IndexMode
	// Engine is the engines' configuration as far as the router needs it:
	// block size, KV capacity, step budget and latency profile.
	Engine          engine.Config
	SessionAffinity bool
	MaxConcurrency  int
	MaxPending      int
	Replicas        []ReplicaOptions
	DNS             []DNSGroup
}

// ReplicaOptions is one static replica.
type ReplicaOptions struct {
	Name           string
	URL            string
	MaxConcurrency int // 0: the model's
	MaxPending     int // 0: the model's
	KVEvents       string
	KVEventsReplay string
	KVEventsTopic  string
}

// DNSGroup is a DNS name whose every address is a replica.
type DNSGroup struct {
	Name, Host, Scheme string
	Port               int
	KVEventsPort       int
	KVEventsReplayPort int
	KVEventsTopic      string
}

// DefaultOptions returns the defaults of every field but Models.
func DefaultOptions() Options {
	return Options{
		RequestTimeout: 10 * time.Minute,
		MaxBodyBytes:   32 << 20,
		Attempts:       3,
		Backoff:        10 * time.Millisecond,
		MaxBackoff:     200 * time.Millisecond,
		Health: HealthOptions{
			Interval: time.Second, Timeout: 500 * time.Millisecond, Path: "/health",
			EjectAfter: 3, EjectTime: time.Second, MaxEjectTime: 30 * time.Second, MaxEjectedShare: 0.5,
		},
		Scrape:            ScrapeOptions{Interval: 100 * time.Millisecond, Timeout: 80 * time.Millisecond, MaxBytes: 4 << 20, MaxAge: 500 * time.Millisecond},
		Tokenize:          TokenizeOptions{Queue: 1024, Timeout: 20 * time.Millisecond},
		DecisionLogSample: 0.01,
		DecisionLogBuffer: 4096,
		DNSRefresh:        10 * time.Second,
	}
}

func (o *Options) validate() error {
	var errs []error
	if o.Attempts < 1 {
		errs = append(errs, fmt.Errorf("retry attempts %d: must be at least 1", o.Attempts))
	}
	if o.RequestTimeout <= 0 || o.MaxBodyBytes <= 0 {
		errs = append(errs, errors.New("request timeout and max body bytes must be positive"))
	}
	if len(o.Models) == 0 {
		errs = append(errs, errors.New("no models"))
	}
	seen := map[string]bool{}
	for i, m := range o.Models {
		for _, n := range append([]string{m.Name}, m.Aliases...) {
			if n == "" || seen[n] {
				errs = append(errs, fmt.Errorf("models[%d]: name or alias %q empty or used twice", i, n))
			}
			seen[n] = true
		}
		if len(m.Replicas) == 0 && len(m.DNS) == 0 {
			errs = append(errs, fmt.Errorf("models[%d] (%s): no replicas and no DNS groups", i, m.Name))
		}
		if _, err := router.New(m.Policy, router.Options{}); err != nil {
			errs = append(errs, fmt.Errorf("models[%d] (%s): %w", i, m.Name, err))
		}
	}
	return errors.Join(errs...)
}
