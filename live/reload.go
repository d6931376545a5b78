package live

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/inferrail/inferrail/calibrate"
	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/tokenize"
)

// This file is the hot reload: the configuration file read again on
// SIGHUP, when it changes (WatchConfig) or on POST /admin/reload. A reload
// parses and validates the whole file and loads what it names (profiles,
// tokenizers, TLS key pairs, the admin token) before anything changes;
// then each model's gateway core takes its new settings and replicas under
// one hold of the model's lock, and the name table and the loaded
// configuration are swapped. A file that fails any of it changes nothing.
//
// What a reload may change is listed in effective; everything else is
// read by the request path or the listeners straight from the
// configuration the server started with, and is reported as needing a
// restart (ReloadResult.NeedsRestart), never silently ignored. A reload
// accepts only a file the process could start with: a setting that waits
// for a restart is still checked (a tokenizer named there is loaded).

// ReloadSource says what asked for a reload.
type ReloadSource string

// The reload sources.
const (
	ReloadSignal ReloadSource = "sighup"
	ReloadFile   ReloadSource = "file"
	ReloadAdmin  ReloadSource = "admin"
)

// ErrNoConfigFile is Reload's error for a server not started from a file
// (Deps.ConfigPath).
var ErrNoConfigFile = errors.New("live: reload: the configuration was not loaded from a file (Deps.ConfigPath)")

// errClosed is Reload's error once Close has begun.
var errClosed = errors.New("live: reload: the server is closed")

// ReloadResult is what a successful reload did.
type ReloadResult struct {
	Source ReloadSource `json:"source"`
	Path   string       `json:"path"`
	// SHA256 is the hash of the file's bytes, LoadedAt when the reload
	// applied them.
	SHA256   string    `json:"sha256"`
	LoadedAt time.Time `json:"loaded_at"`
	// Changes lists what changed, one setting a line ("models[m].policy:
	// cost_model -> p2c"); empty when the file asks nothing new.
	Changes []string `json:"changes"`
	// NeedsRestart lists what the file asks that only a restart applies,
	// with what runs instead ("listen: cannot change without a restart:
	// kept 127.0.0.1:8080").
	NeedsRestart []string `json:"needs_restart"`
	TookMs       float64  `json:"took_ms"`
}

// routeTable resolves the names clients ask for: each model's name and
// aliases. A reload swaps it whole.
type routeTable struct {
	byName   map[string]*model
	aliases  map[string]bool
	adapters map[string]bool
	names    map[*model][]string // each model's name, then its aliases and adapters
}

func newRouteTable(models []*model, c *config.Config) *routeTable {
	rt := &routeTable{byName: map[string]*model{}, aliases: map[string]bool{}, adapters: map[string]bool{}, names: map[*model][]string{}}
	for _, m := range models {
		rt.byName[m.name] = m
		rt.names[m] = []string{m.name}
		if mc, ok := modelNamed(c, m.name); ok {
			for _, a := range mc.Aliases {
				rt.byName[a] = m
				rt.aliases[a] = true
				rt.names[m] = append(rt.names[m], a)
			}
			for _, a := range mc.Adapters {
				rt.byName[a] = m
				rt.adapters[a] = true
				rt.names[m] = append(rt.names[m], a)
			}
		}
	}
	return rt
}

func modelNamed(c *config.Config, name string) (*config.Model, bool) {
	for i := range c.Models {
		if c.Models[i].Name == name {
			return &c.Models[i], true
		}
	}
	return nil, false
}

// loadedConfig is the configuration that runs: the settings a reload may
// change from the last file applied, the rest as the server started.
type loadedConfig struct {
	cfg        *config.Config
	sha256     string // of the file's bytes; "" when not from a file
	at         time.Time
	restart    []string // what the file asks that waits for a restart
	adminToken string
}

// reloader holds the reload's state (Server.rl).
type reloader struct {
	// mu makes reloads one at a time, and Close wait for one running.
	mu     sync.Mutex
	closed bool
	path   string
	// given are the models whose encoder Deps gave (never loaded here).
	given map[string]bool
	cur   atomic.Pointer[loadedConfig]
	// failedSHA is the last file a reload rejected: the watch does not
	// try it again until it changes.
	failedSHA atomic.Pointer[string]
	ok, errs  atomic.Uint64
	lastErr   atomic.Pointer[reloadFailure]
	// quiet and maxWait debounce the watch: a reload waits for quiet
	// without events, never longer than maxWait after the first.
	quiet, maxWait time.Duration
	// hook, when set (tests), runs inside each reload's critical section.
	hook func()
}

type reloadFailure struct {
	at     time.Time
	source ReloadSource
	err    string
}

// Debounce of the file watch.
const (
	watchQuiet   = 200 * time.Millisecond
	watchMaxWait = 2 * time.Second
)

// init records what New loaded (adminToken: the admin_token_file's
// token) and hashes the file it came from.
func (rl *reloader) init(s *Server, deps Deps, adminToken string) error {
	rl.path, rl.quiet, rl.maxWait = deps.ConfigPath, watchQuiet, watchMaxWait
	rl.given = map[string]bool{}
	for name := range deps.Encoders {
		rl.given[name] = true
	}
	lc := &loadedConfig{cfg: &s.cfg, at: s.start, adminToken: adminToken}
	if rl.path != "" {
		b, err := os.ReadFile(rl.path)
		if err != nil {
			return fmt.Errorf("config path: %w", err)
		}
		lc.sha256 = hashOf(b)
	}
	rl.cur.Store(lc)
	s.met.reloadTime.Set(float64(s.start.UnixNano()) / 1e9)
	return nil
}

// close makes later reloads fail, after the one running (if any) ends.
func (rl *reloader) close() {
	rl.mu.Lock()
	rl.closed = true
	rl.mu.Unlock()
}

// loaded is the configuration that runs now.
func (s *Server) loaded() *loadedConfig {
	if lc := s.rl.cur.Load(); lc != nil {
		return lc
	}
	return &loadedConfig{cfg: &s.cfg, at: s.start}
}

func hashOf(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Reload reads the configuration file again and applies it, or keeps the
// running configuration and returns why not. Reloads run one at a time
// (a second waits for the first); each is logged and counted
// (inferrail_config_reloads_total).
func (s *Server) Reload(src ReloadSource) (ReloadResult, error) {
	s.rl.mu.Lock()
	defer s.rl.mu.Unlock()
	if s.rl.closed {
		return ReloadResult{}, errClosed
	}
	if s.rl.path == "" {
		return ReloadResult{}, ErrNoConfigFile
	}
	if s.rl.hook != nil {
		s.rl.hook()
	}
	began := time.Now()
	res, sha, err := s.reload(src)
	if err != nil {
		s.rl.errs.Add(1)
		s.met.reloads.WithLabelValues("error").Inc()
		s.rl.lastErr.Store(&reloadFailure{at: time.Now(), source: src, err: err.Error()})
		if sha != "" {
			s.rl.failedSHA.Store(&sha)
		}
		s.log.Error("configuration reload failed; the running configuration is kept", "source", string(src), "path", s.rl.path, "error", err.Error())
		return ReloadResult{}, err
	}
	res.TookMs = float64(time.Since(began).Microseconds()) / 1000
	s.rl.ok.Add(1)
	s.met.reloads.WithLabelValues("ok").Inc()
	s.met.reloadTime.Set(float64(res.LoadedAt.UnixNano()) / 1e9)
	for _, r := range res.NeedsRestart {
		s.log.Warn("configuration setting waits for a restart", "source", string(src), "setting", r)
	}
	s.log.Info("configuration reloaded", "source", string(src), "path", s.rl.path, "sha256", res.SHA256,
		"changes", len(res.Changes), "changed", strings.Join(res.Changes, "; "), "needs_restart", len(res.NeedsRestart), "took_ms", res.TookMs)
	return res, nil
}

// reload is Reload under its lock: prepare (nothing changes), then
// apply. sha is the file's hash once it was read.
func (s *Server) reload(src ReloadSource) (res ReloadResult, sha string, err error) {
	data, next, err := readConfig(s.rl.path)
	if data != nil {
		sha = hashOf(data)
	}
	if err != nil {
		return res, sha, err
	}
	p, err := s.prepare(next)
	if err != nil {
		return res, sha, fmt.Errorf("%s: %w", s.rl.path, err)
	}
	now := time.Now()
	if err := s.apply(p); err != nil {
		// Unreachable when prepare checked everything; what was applied
		// stays, the file counts as rejected.
		return res, sha, fmt.Errorf("%s: applied in part: %w", s.rl.path, err)
	}
	s.rl.cur.Store(&loadedConfig{cfg: p.eff, sha256: sha, at: now, restart: p.restart, adminToken: p.adminToken})
	return ReloadResult{Source: src, Path: s.rl.path, SHA256: sha, LoadedAt: now, Changes: p.changes, NeedsRestart: p.restart}, sha, nil
}

// readConfig reads and parses the file, and makes sure the bytes hashed
// are the ones parsed (an editor or a ConfigMap update may be writing it).
func readConfig(path string) ([]byte, *config.Config, error) {
	for range 3 {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, nil, fmt.Errorf("read live config: %w", err)
		}
		c, err := config.Load(path)
		if err != nil {
			return b, nil, err
		}
		again, err := os.ReadFile(path)
		if err == nil && string(again) == string(b) {
			return b, c, nil
		}
	}
	return nil, nil, fmt.Errorf("read live config: %s kept changing while it was read; write it whole (a rename) and reload again", path)
}

// reloadPlan is a reload prepared: what runs after it, and each model's
// changes.
type reloadPlan struct {
	eff        *config.Config
	changes    []string
	restart    []string
	adminToken string
	models     []modelPlan
}

type modelPlan struct {
	m *model
	p *modelReload
}

// prepare checks next and loads what it names, and works out what
// changes; nothing changes yet.
func (s *Server) prepare(next *config.Config) (*reloadPlan, error) {
	cur := s.loaded()
	eff := effective(cur.cfg, next)
	if err := eff.Validate(); err != nil {
		return nil, fmt.Errorf("the configuration that would run (this file's reloadable settings, the running ones for the rest): %w", err)
	}
	p := &reloadPlan{eff: eff, changes: []string{}, restart: []string{}}
	for _, d := range diff("", reflect.ValueOf(*next), reflect.ValueOf(*eff)) {
		p.restart = append(p.restart, d.restartLine())
	}
	for _, d := range diff("", reflect.ValueOf(*cur.cfg), reflect.ValueOf(*eff)) {
		p.changes = append(p.changes, d.changeLine())
	}
	var errs []error
	// What a restart with this file would load: a file the process could
	// not start with is refused now, not at the next restart.
	for i := range next.Models {
		nm := &next.Models[i]
		if s.rl.given[nm.Name] {
			continue
		}
		if em, ok := modelNamed(eff, nm.Name); ok && em.Tokenizer == nm.Tokenizer {
			continue // loaded at start
		}
		if _, err := tokenize.LoadModel(nm.Tokenizer, tokenize.Options{}); err != nil {
			errs = append(errs, fmt.Errorf("models[%d].tokenizer: %w", i, err))
		}
	}
	for _, t := range []struct {
		field string
		t     config.TLS
	}{{"tls", next.TLS}, {"admin_tls", next.AdminTLS}} {
		if t.t.Enabled() {
			if _, err := tls.LoadX509KeyPair(t.t.CertFile, t.t.KeyFile); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", t.field, err))
			}
		}
	}
	if eff.AdminTokenFile != "" {
		tok, err := config.ReadToken(eff.AdminTokenFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("admin_token_file: %w", err))
		}
		p.adminToken = tok
	}
	for _, m := range s.models {
		mp, err := s.prepareModel(m, cur.cfg, eff)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.models = append(p.models, modelPlan{m: m, p: mp})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// prepareModel works out model m's changes from the configuration that
// runs (cur) to eff, and checks that its core takes them.
func (s *Server) prepareModel(m *model, cur, eff *config.Config) (*modelReload, error) {
	em, ok := modelNamed(eff, m.name)
	if !ok {
		return nil, fmt.Errorf("model %s: not in the configuration", m.name) // effective keeps every model
	}
	om, _ := modelNamed(cur, m.name)
	ec := engine.DefaultConfig()
	if em.Profile != "" {
		var err error
		if ec, err = calibrate.ResolveProfile(em.Profile); err != nil {
			return nil, fmt.Errorf("model %s: profile: %w", m.name, err)
		}
	}
	ec.BlockSize = em.BlockSize
	g := gatewayConfig(eff, em, ec)
	// The index was sized by the profile the server started with.
	g.Router.DefaultCapacityBlocks = m.coreConfig().Router.DefaultCapacityBlocks
	if err := m.checkReload(g); err != nil {
		return nil, fmt.Errorf("model %s: %w", m.name, err)
	}
	auth, err := upstreamAuth(em)
	if err != nil {
		return nil, err
	}
	mp := &modelReload{core: g, policy: em.Policy, pdTimeout: em.PD.PrefillTimeout, maxN: em.MaxN, auth: auth, drained: func(r *replica) { s.dropped(m, r) }}
	running := map[string]*replica{}
	for _, r := range m.listed() {
		running[r.name] = r
	}
	want := map[string]bool{}
	for i := range em.Replicas {
		nr := &em.Replicas[i]
		want[nr.Name] = true
		conc, pending := em.Limits(nr)
		sp := replicaSpec{name: nr.Name, url: nr.URL, maxConcurrency: conc, maxPending: pending, capacity: em.KVCapacity(nr),
			kvEvents: nr.KVEvents, kvReplay: nr.KVEventsReplay, kvTopic: nr.KVEventsTopic, kvBind: nr.KVEventsBind, role: roleOf(nr.Role)}
		r, ok := running[nr.Name]
		var or *config.Replica
		if om != nil {
			for j := range om.Replicas {
				if om.Replicas[j].Name == nr.Name {
					or = &om.Replicas[j]
				}
			}
		}
		switch {
		case !ok || or == nil:
			mp.add = append(mp.add, sp)
		case or.URL != nr.URL || or.KVEvents != nr.KVEvents || or.KVEventsReplay != nr.KVEventsReplay || or.KVEventsTopic != nr.KVEventsTopic || or.KVEventsBind != nr.KVEventsBind ||
			roleOf(or.Role) != roleOf(nr.Role):
			// Another engine under the same name (or one with another
			// role): a new replica.
			mp.remove = append(mp.remove, r)
			mp.add = append(mp.add, sp)
		default:
			oc, op := om.Limits(or)
			if oc != conc || op != pending || om.KVCapacity(or) != sp.capacity {
				mp.update = append(mp.update, sp)
			}
		}
	}
	for name, r := range running {
		if !want[name] {
			mp.remove = append(mp.remove, r)
		}
	}
	slices.SortFunc(mp.remove, func(a, b *replica) int { return a.idx - b.idx })
	return mp, nil
}

// apply makes the prepared changes: each model's under its lock, then the
// name table; then the background work follows (scrapes, probes and KV
// event subscriptions of the replicas added and removed).
func (s *Server) apply(p *reloadPlan) error {
	var errs []error
	type sub struct {
		m *model
		r *replica
	}
	var added, removed []sub
	for _, mp := range p.models {
		as, err := mp.m.reconfigure(mp.p)
		if err != nil {
			errs = append(errs, err)
		}
		for _, r := range as {
			added = append(added, sub{mp.m, r})
		}
		for _, r := range mp.p.remove {
			removed = append(removed, sub{mp.m, r})
		}
	}
	s.routes.Store(newRouteTable(s.models, p.eff))
	for _, x := range removed {
		s.unsubscribe(x.r)
		s.log.Info("replica removed by a reload; its requests in flight finish there", "model", x.m.name, "replica", x.r.name, "url", x.r.base.String())
	}
	s.refreshTargets()
	for _, x := range added {
		s.maybeSubscribe(x.m, x.r)
		s.log.Info("replica added by a reload", "model", x.m.name, "replica", x.r.name, "url", x.r.base.String())
	}
	return errors.Join(errs...)
}

// unsubscribe ends a removed replica's KV event subscription.
func (s *Server) unsubscribe(r *replica) {
	s.bgMu.Lock()
	bg := s.bg
	s.bgMu.Unlock()
	if bg == nil {
		return
	}
	bg.mu.Lock()
	k, ok := bg.kv[r]
	delete(bg.kv, r)
	bg.mu.Unlock()
	if ok {
		k.close() // not under bg.mu: a central route is resolved under it
	}
}

// dropped is a removed replica's end, once its last request in flight has
// ended: its series go, unless its name serves again (another engine).
func (s *Server) dropped(m *model, r *replica) {
	s.rl.mu.Lock()
	defer s.rl.mu.Unlock()
	if m.lookup(r.name) == nil {
		s.met.forget(m.name, r.name, r)
	}
	s.log.Info("replica dropped: its requests in flight have ended", "model", m.name, "replica", r.name)
}

// effective is the configuration a reload runs: from next, the settings
// that may change at run time; from cur (what runs), every other one. A
// model next adds or leaves out waits for a restart (cur's models are
// served, as they are); so do each model's settings the edge reads on the
// request path (tokenizer, index, block_size, max_model_len,
// default_max_tokens, key_limits), what its router is built on (profile,
// session_affinity, the seed: the policy's options, which explanations
// and the shadow policy read), its dns groups, and the caps of a model
// whose replicas are discovered. With the KV reservation ledger shared
// through Redis, the replicas' indices must agree between gateways: the
// replica lists wait for a restart too.
func effective(cur, next *config.Config) *config.Config {
	eff := *cur
	eff.AdminTokenFile = next.AdminTokenFile
	eff.Health.EjectAfter, eff.Health.EjectTime, eff.Health.MaxEjectTime = next.Health.EjectAfter, next.Health.EjectTime, next.Health.MaxEjectTime
	eff.Health.MaxEjectedShare, eff.Health.ReadyWindow = next.Health.MaxEjectedShare, next.Health.ReadyWindow
	eff.Scrape.MaxAge = next.Scrape.MaxAge
	shared := cur.Tenancy.Ledger.Backend == "redis"
	eff.Models = make([]config.Model, len(cur.Models))
	for i, om := range cur.Models {
		em := om
		if nm, ok := modelNamed(next, om.Name); ok {
			em.Aliases, em.Adapters = nm.Aliases, nm.Adapters
			em.Policy, em.ShadowPolicy = nm.Policy, nm.ShadowPolicy
			em.APIKeyFile = nm.APIKeyFile
			em.Admission, em.Overcommit, em.OutputQuantile = nm.Admission, nm.Overcommit, nm.OutputQuantile
			em.MaxPriority, em.Queue, em.MaxN = nm.MaxPriority, nm.Queue, nm.MaxN
			if !discovers(cur, &om) {
				em.MaxConcurrency, em.MaxPending, em.KVCapacityBlocks = nm.MaxConcurrency, nm.MaxPending, nm.KVCapacityBlocks
			}
			if !shared {
				em.Replicas = nm.Replicas
			}
		}
		eff.Models[i] = em
	}
	return &eff
}

// discovers reports whether model m takes replicas from DNS groups or an
// InferencePool, whose replicas' caps are the model's at start.
func discovers(c *config.Config, m *config.Model) bool {
	if len(m.DNS) > 0 {
		return true
	}
	p := c.EPP.Pool
	return p.Name != "" && (p.Model == m.Name || p.Model == "" && len(c.Models) == 1)
}

// difference is one setting that differs between two configurations (a
// model or replica present in only one of them: absent).
type difference struct {
	path                 string
	old, new             string
	oldAbsent, newAbsent bool
}

// secretPaths are settings whose values are never shown.
var secretPaths = []string{"record.salt", "tracing.headers", "tenancy.store"}

// diff lists the settings that differ between a and b (config values of
// the same type), by their YAML paths; the entries of models, replicas
// and dns groups are matched by name.
func diff(path string, a, b reflect.Value) []difference {
	var out []difference
	diffInto(path, a, b, &out)
	return out
}

func diffInto(path string, a, b reflect.Value, out *[]difference) {
	t := a.Type()
	switch {
	case t.Kind() == reflect.Struct && exportedFields(t) > 0:
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "-" || !f.IsExported() || f.Type.Kind() == reflect.Func {
				continue
			}
			p := path
			switch {
			case name == "" && opts == "inline":
			case name == "":
				name = strings.ToLower(f.Name)
				fallthrough
			default:
				if p != "" {
					p += "."
				}
				p += name
			}
			diffInto(p, a.Field(i), b.Field(i), out)
		}
		return
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		if _, named := t.Elem().FieldByName("Name"); named {
			diffNamed(path, a, b, out)
			return
		}
	}
	if (t.Kind() == reflect.Slice || t.Kind() == reflect.Map) && a.Len() == 0 && b.Len() == 0 {
		return
	}
	if reflect.DeepEqual(a.Interface(), b.Interface()) {
		return
	}
	*out = append(*out, difference{path: path, old: show(path, a), new: show(path, b)})
}

// exportedFields counts t's exported fields (a struct with none, such as
// time.Time, is compared whole).
func exportedFields(t reflect.Type) int {
	n := 0
	for i := range t.NumField() {
		if t.Field(i).IsExported() {
			n++
		}
	}
	return n
}

// diffNamed compares two lists of named entries by name.
func diffNamed(path string, a, b reflect.Value, out *[]difference) {
	index := func(v reflect.Value) map[string]reflect.Value {
		m := map[string]reflect.Value{}
		for i := range v.Len() {
			m[v.Index(i).FieldByName("Name").String()] = v.Index(i)
		}
		return m
	}
	ai, bi := index(a), index(b)
	for i := range a.Len() {
		name := a.Index(i).FieldByName("Name").String()
		p := path + "[" + name + "]"
		if bv, ok := bi[name]; ok {
			diffInto(p, a.Index(i), bv, out)
		} else {
			*out = append(*out, difference{path: p, newAbsent: true})
		}
	}
	for i := range b.Len() {
		name := b.Index(i).FieldByName("Name").String()
		if _, ok := ai[name]; !ok {
			*out = append(*out, difference{path: path + "[" + name + "]", oldAbsent: true, new: show("", reflect.ValueOf(urlOf(b.Index(i))))})
		}
	}
}

// urlOf is a replica's URL ("" for another kind of entry).
func urlOf(v reflect.Value) string {
	if f := v.FieldByName("URL"); f.IsValid() {
		return f.String()
	}
	return ""
}

// show formats a setting's value as the configuration writes it.
func show(path string, v reflect.Value) string {
	for _, s := range secretPaths {
		if path == s {
			return "(secret, not shown)"
		}
	}
	switch x := v.Interface().(type) {
	case time.Duration:
		return x.String()
	case config.ByteSize:
		return x.String()
	case string:
		if x == "" {
			return `""`
		}
		return x
	case []string:
		return "[" + strings.Join(x, ", ") + "]"
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return fmt.Sprint(v.Interface())
}

// restartLine describes a setting of the file that waits for a restart
// (d: from the file to what runs).
func (d difference) restartLine() string {
	switch {
	case d.oldAbsent: // in what runs, not in the file
		return d.path + ": cannot change without a restart: still served"
	case d.newAbsent:
		return d.path + ": cannot change without a restart: not served until then"
	}
	return d.path + ": cannot change without a restart: kept " + d.new
}

// changeLine describes a setting a reload changed (d: from what ran to
// what runs).
func (d difference) changeLine() string {
	switch {
	case d.oldAbsent:
		if d.new != `""` && d.new != "" {
			return d.path + ": added (" + d.new + ")"
		}
		return d.path + ": added"
	case d.newAbsent:
		return d.path + ": removed"
	}
	return d.path + ": " + d.old + " -> " + d.new
}

// ReloadOn reloads the configuration each time sigs delivers a signal
// (SIGHUP, through signal.Notify), until ctx ends. A reload that fails is
// logged and counted; the running configuration stays.
func (s *Server) ReloadOn(ctx context.Context, sigs <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
			s.Reload(ReloadSignal)
		}
	}
}

// WatchConfig reloads the configuration whenever its file changes, until
// ctx ends: it watches the file's directory, so an editor's rename over
// the file and a Kubernetes ConfigMap's symlink swap are seen as well as a
// write in place; a burst of events is one reload (after 200ms without
// one, at most 2s after the first), and only a file whose bytes differ
// from the running (or the last rejected) one is reloaded. It returns once
// the watch is set up; done is closed when it has stopped.
func (s *Server) WatchConfig(ctx context.Context) (done <-chan struct{}, err error) {
	path := s.rl.path
	if path == "" {
		return nil, ErrNoConfigFile
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("live: watch the configuration: %w", err)
	}
	dir := filepath.Dir(path)
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, fmt.Errorf("live: watch the configuration's directory %s: %w", dir, err)
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		defer w.Close()
		s.watchLoop(ctx, w.Events, w.Errors, func() { s.reloadIfChanged() })
	}()
	return ch, nil
}

// watchLoop calls act once per burst of events (debounce), until ctx
// ends or the channels close. An error of the watch (events lost) counts
// as an event: the file is looked at again.
func (s *Server) watchLoop(ctx context.Context, events <-chan fsnotify.Event, errs <-chan error, act func()) {
	d := debounce{quiet: s.rl.quiet, maxWait: s.rl.maxWait}
	t := time.NewTimer(time.Hour)
	t.Stop()
	var fire <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case _, ok := <-events:
			if !ok {
				t.Stop()
				return
			}
			t.Reset(d.event(time.Now()))
			fire = t.C
		case err, ok := <-errs:
			if !ok {
				t.Stop()
				return
			}
			s.log.Warn("configuration watch error; looking at the file again", "error", err.Error())
			t.Reset(d.event(time.Now()))
			fire = t.C
		case <-fire:
			fire = nil
			d.fired()
			act()
		}
	}
}

// debounce turns a burst of events into one action: quiet after the last
// event, at most maxWait after the first.
type debounce struct {
	quiet, maxWait time.Duration
	first          time.Time
	pending        bool
}

// event records an event at now and returns how long to wait before
// acting.
func (d *debounce) event(now time.Time) time.Duration {
	if !d.pending {
		d.pending, d.first = true, now
	}
	return max(0, min(d.quiet, d.first.Add(d.maxWait).Sub(now)))
}

// fired records that the action ran.
func (d *debounce) fired() { d.pending = false }

// reloadIfChanged reloads the file when its bytes are neither the running
// configuration's nor the last rejected one's.
func (s *Server) reloadIfChanged() {
	if b, err := os.ReadFile(s.rl.path); err == nil {
		sha := hashOf(b)
		if sha == s.loaded().sha256 {
			return
		}
		if f := s.rl.failedSHA.Load(); f != nil && *f == sha {
			return
		}
	}
	s.Reload(ReloadFile) // logged and counted there
}

// reloadEndpoint is POST /admin/reload: Reload, answered with its result,
// or 422 reload_rejected with the error (the running configuration is
// kept).
func (s *Server) reloadEndpoint(_ *http.Request) (int, any, *adminError) {
	res, err := s.Reload(ReloadAdmin)
	switch {
	case errors.Is(err, ErrNoConfigFile), errors.Is(err, errClosed):
		return 0, nil, &adminError{status: http.StatusConflict, code: "reload_unavailable", msg: err.Error()}
	case err != nil:
		return 0, nil, &adminError{status: http.StatusUnprocessableEntity, code: "reload_rejected", msg: "the configuration was not reloaded; the running one is kept: " + err.Error()}
	}
	return http.StatusOK, res, nil
}

// configStatus is /admin/status's view of the configuration.
type configStatus struct {
	Path string `json:"path"`
	// SHA256 is the hash of the file's bytes the running configuration
	// was loaded from, LoadedAt when.
	SHA256       string    `json:"sha256"`
	LoadedAt     time.Time `json:"loaded_at"`
	ReloadsOK    uint64    `json:"reloads_ok"`
	ReloadErrors uint64    `json:"reload_errors"`
	// LastError is the last rejected reload's.
	LastError *reloadErrorView `json:"last_error"`
	// NeedsRestart is what the file last applied asks that waits for a
	// restart.
	NeedsRestart []string `json:"needs_restart"`
}

type reloadErrorView struct {
	At     time.Time    `json:"at"`
	Source ReloadSource `json:"source"`
	Error  string       `json:"error"`
}

func (s *Server) configStatus() *configStatus {
	lc := s.loaded()
	v := &configStatus{Path: s.rl.path, SHA256: lc.sha256, LoadedAt: lc.at.UTC(), ReloadsOK: s.rl.ok.Load(), ReloadErrors: s.rl.errs.Load(),
		NeedsRestart: append([]string{}, lc.restart...)}
	if f := s.rl.lastErr.Load(); f != nil {
		v.LastError = &reloadErrorView{At: f.at.UTC(), Source: f.source, Error: f.err}
	}
	return v
}
