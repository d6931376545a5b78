package semcache

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Rule decides which requests are deterministic enough to be answered
// from a cache. The exact response cache (package respcache) owns that
// rule (temperature at most max_temperature, n and best_of 1, no sampling
// that makes answers differ), and *respcache.Cache is one (its
// Deterministic method): the proxy passes the model's exact cache here.
// There is no default: a Cache without a Rule is an error.
type Rule interface {
	// Deterministic reports whether the request to path with body may be
	// answered from a cache, and if not, why.
	Deterministic(path string, body []byte) (ok bool, reason string)
}

// Hooks are the cache's counters, for live/metrics.go to count in
// Prometheus (names in docs/semantic-cache.md). Every hook may be nil and
// must not block.
type Hooks struct {
	// Hit: a request is answered from the cache, at this similarity.
	Hit func(similarity float64)
	// Miss: a request was looked up and goes to an engine.
	Miss func()
	// Bypass: a request is not looked up, by reason (the Reason* consts).
	Bypass func(reason string)
	// EmbedError: an embeddings call failed (the request goes to an
	// engine).
	EmbedError func()
	// EmbedLatency: how long an embeddings call took, failed ones too.
	EmbedLatency func(d time.Duration)
	// StoreError: a store call failed, by op (nearest, put).
	StoreError func(op string)
	// Stored: an answer of bytes bytes was stored.
	Stored func(bytes int)
	// NotStored: a miss's answer was not stored, by reason (too_large).
	NotStored func(reason string)
}

// Deps are what a configuration cannot hold.
type Deps struct {
	// Rule is the determinism rule. Required.
	Rule Rule
	// Embedder, when set, embeds instead of a Client built from
	// cfg.Embeddings.
	Embedder Embedder
	// Store, when set, is the store, whatever cfg.Store names; Close does
	// not close it.
	Store Store
	// Now is the stores' clock (nil: time.Now).
	Now func() time.Time
	// Hooks are the counters.
	Hooks Hooks
}

// Outcome is what Lookup decided.
type Outcome uint8

// The outcomes.
const (
	// Bypass: not looked up; proxy the request as if there were no cache.
	Bypass Outcome = iota
	// Hit: answer with Result.Answer.
	Hit
	// Miss: proxy the request, and Result.Store its answer if it ends
	// well.
	Miss
)

func (o Outcome) String() string {
	switch o {
	case Bypass:
		return "bypass"
	case Hit:
		return "hit"
	case Miss:
		return "miss"
	}
	return "Outcome(?)"
}

// Query is one request to look up.
type Query struct {
	// Path is PathChatCompletions or PathCompletions.
	Path string
	// Body is the request body.
	Body []byte
	// Tenant is who the request is for: the API key id, or the trusted
	// tenant header (as the exact cache's key). Required.
	Tenant string
	// Model is the resolved engine model. Required.
	Model string
}

// Result is Lookup's answer.
type Result struct {
	Outcome Outcome
	// Reason says why a request was bypassed.
	Reason string
	// Answer is the stored answer (Hit).
	Answer []byte
	// Similarity is the hit's cosine similarity.
	Similarity float64

	c     *Cache
	scope Scope
	vec   []float32
}

// Cache is one model's semantic cache: it embeds the text of
// deterministic requests and looks it up within the request's scope.
type Cache struct {
	cfg      Config
	rule     Rule
	embedder Embedder
	store    Store
	ownStore bool
	hooks    Hooks
	storeTTL time.Duration
	storeTO  time.Duration
}

// New validates cfg and builds the cache: the embeddings client and the
// store it names (connecting to Postgres and creating the schema for
// store: pgvector, within postgres.timeout times ten).
func New(ctx context.Context, cfg Config, deps Deps) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Rule == nil {
		return nil, errors.New("semcache: no determinism rule: the semantic cache answers deterministic requests only")
	}
	c := &Cache{cfg: cfg, rule: deps.Rule, embedder: deps.Embedder, store: deps.Store, hooks: deps.Hooks, storeTTL: cfg.TTL}
	if c.embedder == nil {
		var key string
		if cfg.Embeddings.APIKeyFile != "" {
			k, err := ReadAPIKey(cfg.Embeddings.APIKeyFile)
			if err != nil {
				return nil, err
			}
			key = k
		}
		cl, err := NewClient(ClientOptions{URL: cfg.Embeddings.URL, Model: cfg.Embeddings.Model, Timeout: cfg.Embeddings.Timeout,
			Dimensions: cfg.Embeddings.Dimensions, APIKey: key})
		if err != nil {
			return nil, err
		}
		c.embedder = cl
	}
	if c.store == nil {
		switch cfg.Store {
		case StoreMemory:
			s, err := NewMemoryStore(MemoryOptions{MaxEntries: cfg.maxEntries(), MaxBytes: cfg.MaxBytes, Now: deps.Now})
			if err != nil {
				return nil, err
			}
			c.store = s
		case StorePgvector:
			c.storeTO = cfg.Postgres.Timeout
			ctx, cancel := context.WithTimeout(ctx, 10*cfg.Postgres.Timeout+5*time.Second)
			defer cancel()
			s, err := OpenPG(ctx, cfg.Postgres.DSN, cfg.Postgres.MaxConns, PGOptions{Table: cfg.Postgres.Table,
				Dim: cfg.Embeddings.Dimensions, MaxEntries: cfg.maxEntries(), Now: deps.Now})
			if err != nil {
				return nil, err
			}
			c.store = s
		}
		c.ownStore = true
	}
	return c, nil
}

// Config returns the cache's configuration.
func (c *Cache) Config() Config { return c.cfg }

// Store returns the cache's store: the proxy reads a MemoryStore's Len
// and Bytes for its gauges.
func (c *Cache) Store() Store { return c.store }

// Close closes the store New made.
func (c *Cache) Close() error {
	if c.ownStore {
		return c.store.Close()
	}
	return nil
}

// Lookup decides whether q may be answered from the cache and looks it
// up. Bypass and Miss go to the engines. An error (the embeddings call or
// the store failed) comes with a Bypass result: the cache is an
// optimisation, and a request it cannot look up is served as if it were
// off.
func (c *Cache) Lookup(ctx context.Context, q Query) (Result, error) {
	if !c.cfg.Enabled {
		return c.bypass(ReasonDisabled), nil
	}
	if q.Tenant == "" {
		return c.bypass(ReasonNoTenant), nil
	}
	if q.Model == "" {
		return c.bypass(ReasonNoModel), nil
	}
	if q.Path != PathChatCompletions && q.Path != PathCompletions {
		return c.bypass(ReasonPath), nil
	}
	if ok, why := c.rule.Deterministic(q.Path, q.Body); !ok {
		r := ReasonNotDeterministic
		if why != "" {
			r += ":" + why
		}
		return c.bypass(r), nil
	}
	text, part, why := Split(q.Path, q.Body)
	if why != "" {
		return c.bypass(why), nil
	}
	if len(text) > c.cfg.MaxTextBytes {
		return c.bypass(ReasonTooLong), nil
	}
	began := time.Now()
	vecs, err := c.embedder.Embed(ctx, text)
	if h := c.hooks.EmbedLatency; h != nil {
		h(time.Since(began))
	}
	if err == nil && len(vecs) != 1 {
		err = fmt.Errorf("semcache: the embedder returned %d vectors for one text", len(vecs))
	}
	if err != nil {
		if h := c.hooks.EmbedError; h != nil {
			h()
		}
		return Result{Outcome: Bypass, Reason: "embed_error"}, err
	}
	scope := Scope{Tenant: q.Tenant, Model: q.Model, Partition: part}
	sctx, cancel := c.storeCtx(ctx)
	defer cancel()
	h, ok, err := c.store.Nearest(sctx, scope, vecs[0], c.cfg.Threshold)
	if err != nil {
		c.storeError("nearest")
		return Result{Outcome: Bypass, Reason: "store_error"}, err
	}
	if ok {
		if f := c.hooks.Hit; f != nil {
			f(h.Similarity)
		}
		return Result{Outcome: Hit, Answer: h.Answer, Similarity: h.Similarity}, nil
	}
	if f := c.hooks.Miss; f != nil {
		f()
	}
	return Result{Outcome: Miss, c: c, scope: scope, vec: vecs[0]}, nil
}

// NotStored reasons.
const NotStoredTooLarge = "too_large"

// Store stores the answer of a miss (the engine's whole response body,
// or an exact cache entry: the bytes are the proxy's to choose), unless it
// exceeds max_entry_bytes. Only a Miss can be stored; call it only for an
// answer that ended well.
func (r *Result) Store(ctx context.Context, answer []byte) error {
	if r.Outcome != Miss || r.c == nil {
		return errors.New("semcache: only a miss's answer can be stored")
	}
	c := r.c
	if int64(len(answer)) > c.cfg.MaxEntryBytes {
		if f := c.hooks.NotStored; f != nil {
			f(NotStoredTooLarge)
		}
		return nil
	}
	sctx, cancel := c.storeCtx(ctx)
	defer cancel()
	if err := c.store.Put(sctx, r.scope, r.vec, answer, c.storeTTL); err != nil {
		if errors.Is(err, ErrTooLarge) {
			if f := c.hooks.NotStored; f != nil {
				f(NotStoredTooLarge)
			}
			return nil
		}
		c.storeError("put")
		return err
	}
	if f := c.hooks.Stored; f != nil {
		f(len(answer))
	}
	return nil
}

func (c *Cache) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.storeTO > 0 {
		return context.WithTimeout(ctx, c.storeTO)
	}
	return ctx, func() {}
}

func (c *Cache) bypass(reason string) Result {
	if f := c.hooks.Bypass; f != nil {
		f(reason)
	}
	return Result{Outcome: Bypass, Reason: reason}
}

func (c *Cache) storeError(op string) {
	if f := c.hooks.StoreError; f != nil {
		f(op)
	}
}
