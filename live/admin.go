package live

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inferrail/inferrail/internal/openai"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/tenancy"
)

// This file is the tenancy admin API, served on the admin listener behind
// its bearer token (admin_token_file), in JSON:
//
//	POST   /admin/keys          create a key; the answer holds its plaintext, once
//	GET    /admin/keys          list the keys
//	GET    /admin/keys/{id}     one key
//	PATCH  /admin/keys/{id}     change some fields
//	DELETE /admin/keys/{id}     revoke it (at once on this gateway; within
//	                            tenancy.auth_cache_ttl on the others)
//	GET    /admin/usage         usage rows, ?since=&until= (RFC 3339), &key=, &model=
//	GET    /admin/status        queues, reservations, limiter, store, auth cache, meter, config
//	POST   /admin/reload        reload the configuration file (reload.go), as SIGHUP does
//	POST   /admin/explain       what the router would decide for a generation body, and why,
//	                            deciding nothing (explain, below; docs/explain-shadow.md)
//
// Bodies are JSON objects of at most 64 KiB; an unknown field, a value of
// the wrong type or out of range is a 400 in OpenAI's error shape whose
// param names the field. Limits (rpm, tpm, max_concurrency) are positive
// integers, null or absent for unlimited: an explicit 0 is refused, so a 0
// meant as "block" never means "unlimited" (block a key with disabled).

// maxAdminBody bounds an admin request's body.
const maxAdminBody = 64 << 10

// adminTimeout bounds one admin call's store operations.
const adminTimeout = 10 * time.Second

// adminError is an admin API error: status, code, the field at fault
// (param, "" for none) and the message.
type adminError struct {
	status      int
	code, param string
	msg         string
	allow       string // the Allow header of a 405
}

func badField(field, format string, args ...any) *adminError {
	return &adminError{status: http.StatusBadRequest, code: "invalid_field", param: field, msg: field + ": " + fmt.Sprintf(format, args...)}
}

// adminFunc handles one admin call: the status and the JSON body of its
// answer, or its error.
type adminFunc func(r *http.Request) (int, any, *adminError)

// adminRoutes adds the admin API to the admin mux.
func (s *Server) adminRoutes(mux *http.ServeMux) {
	routes := map[string]adminFunc{
		"POST /admin/keys":        s.createKey,
		"GET /admin/keys":         s.listKeys,
		"GET /admin/keys/{id}":    s.getKey,
		"PATCH /admin/keys/{id}":  s.updateKey,
		"DELETE /admin/keys/{id}": s.revokeKey,
		"GET /admin/usage":        s.usage,
		"GET /admin/status":       s.status,
		"GET /admin/background":   s.backgroundList,
		"POST /admin/reload":      s.reloadEndpoint,
		"POST /admin/explain":     s.explainEndpoint,
		"/admin/":                 s.adminNotFound,
	}
	// The other methods of each path: a 405 naming those it has.
	for path, allowed := range map[string][]string{
		"/admin/keys": {"GET", "POST"}, "/admin/keys/{id}": {"GET", "PATCH", "DELETE"}, "/admin/usage": {"GET"}, "/admin/status": {"GET"}, "/admin/background": {"GET"}, "/admin/reload": {"POST"}, "/admin/explain": {"POST"},
	} {
		for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
			if !slices.Contains(allowed, m) {
				routes[m+" "+path] = s.adminMethod(strings.Join(allowed, ", "))
			}
		}
	}
	for pattern, f := range routes {
		mux.Handle(pattern, s.authorized(s.adminHandler(f)))
	}
}

// adminHandler writes what f answers.
func (s *Server) adminHandler(f adminFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, body, e := f(r)
		if e != nil {
			s.writeAdminError(w, e)
			return
		}
		b, err := json.MarshalIndent(body, "", "  ")
		if err != nil {
			s.writeAdminError(w, &adminError{status: http.StatusInternalServerError, code: "internal_error", msg: "the answer could not be encoded"})
			return
		}
		b = append(b, '\n')
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(status)
		w.Write(b)
	})
}

func (s *Server) writeAdminError(w http.ResponseWriter, e *adminError) {
	typ := "invalid_request_error"
	switch {
	case e.status == http.StatusServiceUnavailable:
		typ = "service_unavailable"
	case e.status >= 500:
		typ = "internal_error"
	}
	body := openai.ErrorBody{Error: openai.ErrorInfo{Message: e.msg, Type: typ, Code: openai.StringCode(e.code)}}
	if e.param != "" {
		p := e.param
		body.Error.Param = &p
	}
	b, _ := json.Marshal(body)
	if e.allow != "" {
		w.Header().Set("Allow", e.allow)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(e.status)
	w.Write(b)
}

func (s *Server) adminNotFound(r *http.Request) (int, any, *adminError) {
	return 0, nil, &adminError{status: http.StatusNotFound, code: "not_found",
		msg: fmt.Sprintf("unknown admin path %.200s: the admin API serves /admin/keys, /admin/keys/{id}, /admin/usage, /admin/status, /admin/reload and /admin/explain", r.URL.Path)}
}

func (s *Server) adminMethod(allowed string) adminFunc {
	return func(r *http.Request) (int, any, *adminError) {
		return 0, nil, &adminError{status: http.StatusMethodNotAllowed, code: "method_not_allowed", allow: allowed, msg: fmt.Sprintf("%s %.200s: use %s", r.Method, r.URL.Path, allowed)}
	}
}

// keyStore returns the store, or the error of a gateway without one.
func (s *Server) keyStore() (tenancy.Store, *adminError) {
	if s.ten == nil || s.ten.store == nil {
		return nil, &adminError{status: http.StatusNotFound, code: "tenancy_disabled",
			msg: "this gateway has no key store: set tenancy.store (and auth: keys) in its configuration"}
	}
	return s.ten.store, nil
}

// storeError maps a store error to an admin answer; its message never holds
// the store's password.
func (s *Server) storeError(err error, id string) *adminError {
	switch tenancy.HTTPStatus(err) {
	case http.StatusBadRequest:
		return fieldProblems(err)
	case http.StatusNotFound:
		return &adminError{status: http.StatusNotFound, code: "key_not_found", msg: fmt.Sprintf("no key with id %.40q (it may have been revoked)", id)}
	case http.StatusConflict:
		return &adminError{status: http.StatusConflict, code: "key_exists", msg: fmt.Sprintf("a key with id %.40q exists or existed; retry", id)}
	}
	s.met.storeErrors.WithLabelValues("admin").Inc()
	msg := s.ten.dsn.Scrub(err.Error())
	s.log.Warn("admin: key store operation failed", "store", s.ten.dsn.String(), "error", msg)
	return &adminError{status: http.StatusServiceUnavailable, code: "store_unavailable", msg: "the key store failed: " + msg}
}

// fieldProblems is the 400 of a key that fails tenancy's Validate: every
// problem, the first one's field as param.
func fieldProblems(err error) *adminError {
	fes := tenancy.FieldErrors(err)
	if len(fes) == 0 {
		return &adminError{status: http.StatusBadRequest, code: "invalid_field", msg: err.Error()}
	}
	msgs := make([]string, len(fes))
	for i, fe := range fes {
		msgs[i] = fe.Error()
	}
	return &adminError{status: http.StatusBadRequest, code: "invalid_field", param: fes[0].Field, msg: strings.Join(msgs, "; ")}
}

// readObject reads a JSON object body of at most maxAdminBody bytes whose
// fields are all in known.
func readObject(r *http.Request, known []string) (map[string]json.RawMessage, *adminError) {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxAdminBody+1))
	if err != nil {
		return nil, &adminError{status: http.StatusBadRequest, code: "malformed_body", msg: "the request body could not be read"}
	}
	if len(b) > maxAdminBody {
		return nil, &adminError{status: http.StatusRequestEntityTooLarge, code: "body_too_large", msg: fmt.Sprintf("the request body exceeds %d bytes", maxAdminBody)}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil || obj == nil {
		return nil, &adminError{status: http.StatusBadRequest, code: "invalid_json", msg: "the request body must be one JSON object, such as {\"name\": \"team-a\", \"rpm\": 600}"}
	}
	for f := range obj {
		if !slices.Contains(known, f) {
			return nil, badField(f, "unknown field; known fields: %s", strings.Join(known, ", "))
		}
	}
	return obj, nil
}

func isNull(raw json.RawMessage) bool { return string(raw) == "null" }

// intField reads an integer from lo to hi.
func intField(raw json.RawMessage, field string, lo, hi int64) (int64, *adminError) {
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, badField(field, "must be an integer from %d to %d, got %.40s", lo, hi, raw)
	}
	return n, nil
}

// limitField reads a limit: a positive integer up to hi, or null for
// unlimited (0).
func limitField(raw json.RawMessage, field string, hi int64) (int64, *adminError) {
	if isNull(raw) {
		return 0, nil
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	switch {
	case err != nil:
		return 0, badField(field, "must be a positive integer, or null for unlimited, got %.40s", raw)
	case n <= 0:
		return 0, badField(field, "must be a positive integer, or null for unlimited, got %d", n)
	case n > hi:
		return 0, badField(field, "must be at most %d, got %d", hi, n)
	}
	return n, nil
}

// keyFields is what a key's create or update body may hold, parsed.
type keyFields struct {
	name           *string
	priority       *int
	rpm, tpm, conc *int64
	models         *[]string
	expires        *time.Time // zero: never
	disabled       *bool
}

var keyFieldNames = []string{"name", "priority", "rpm", "tpm", "max_concurrency", "models", "expires_at", "disabled"}

// parseKeyFields reads a key's fields from a body.
func parseKeyFields(r *http.Request, now time.Time) (keyFields, *adminError) {
	var kf keyFields
	obj, e := readObject(r, keyFieldNames)
	if e != nil {
		return kf, e
	}
	for _, f := range keyFieldNames {
		raw, ok := obj[f]
		if !ok {
			continue
		}
		switch f {
		case "name":
			var v string
			if isNull(raw) || json.Unmarshal(raw, &v) != nil {
				return kf, badField(f, "must be a string naming whose key it is, such as \"team-a\"")
			}
			kf.name = &v
		case "priority":
			n, e := intField(raw, f, 0, tenancy.MaxPriority)
			if e != nil {
				return kf, e
			}
			p := int(n)
			kf.priority = &p
		case "rpm", "tpm", "max_concurrency":
			hi := map[string]int64{"rpm": tenancy.MaxRPM, "tpm": tenancy.MaxTPM, "max_concurrency": tenancy.MaxConcurrencyLimit}[f]
			n, e := limitField(raw, f, hi)
			if e != nil {
				return kf, e
			}
			switch f {
			case "rpm":
				kf.rpm = &n
			case "tpm":
				kf.tpm = &n
			default:
				kf.conc = &n
			}
		case "models":
			var v []string
			if !isNull(raw) && json.Unmarshal(raw, &v) != nil {
				return kf, badField(f, "must be a list of model names, or null for every model")
			}
			kf.models = &v
		case "expires_at":
			var t time.Time
			if !isNull(raw) {
				var str string
				if json.Unmarshal(raw, &str) != nil {
					return kf, badField(f, "must be an RFC 3339 time such as \"2030-01-02T15:04:05Z\", or null for never")
				}
				var err error
				if t, err = time.Parse(time.RFC3339, str); err != nil {
					return kf, badField(f, "must be an RFC 3339 time such as \"2030-01-02T15:04:05Z\", or null for never, got %.60q", str)
				}
				if !t.After(now) {
					return kf, badField(f, "must be in the future, got %s (to stop a key, revoke or disable it)", t.UTC().Format(time.RFC3339))
				}
			}
			kf.expires = &t
		case "disabled":
			var v bool
			if json.Unmarshal(raw, &v) != nil {
				return kf, badField(f, "must be true or false")
			}
			kf.disabled = &v
		}
	}
	return kf, nil
}

// patch is the KeyPatch of kf.
func (kf keyFields) patch() tenancy.KeyPatch {
	p := tenancy.KeyPatch{Name: kf.name, Priority: kf.priority, RPM: kf.rpm, TPM: kf.tpm, Models: kf.models, ExpiresAt: kf.expires, Disabled: kf.disabled}
	if kf.conc != nil {
		c := int(*kf.conc)
		p.MaxConcurrency = &c
	}
	return p
}

// keyView is a key as the admin API shows it: never its secret or hash
// (only the answer to its creation holds the plaintext key); null for an
// unlimited limit, every model or no expiry.
type keyView struct {
	ID             string     `json:"id"`
	Object         string     `json:"object"`
	Key            string     `json:"key,omitempty"`
	Name           string     `json:"name"`
	Priority       int        `json:"priority"`
	RPM            *int64     `json:"rpm"`
	TPM            *int64     `json:"tpm"`
	MaxConcurrency *int       `json:"max_concurrency"`
	Models         []string   `json:"models"`
	ExpiresAt      *time.Time `json:"expires_at"`
	Disabled       bool       `json:"disabled"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
}

func viewOf(k tenancy.Key) keyView {
	v := keyView{ID: k.ID, Object: "api_key", Name: k.Name, Priority: k.Priority, Models: k.Models, Disabled: k.Disabled, CreatedAt: k.CreatedAt, UpdatedAt: k.UpdatedAt}
	if k.RPM > 0 {
		v.RPM = &k.RPM
	}
	if k.TPM > 0 {
		v.TPM = &k.TPM
	}
	if k.MaxConcurrency > 0 {
		v.MaxConcurrency = &k.MaxConcurrency
	}
	if !k.ExpiresAt.IsZero() {
		v.ExpiresAt = &k.ExpiresAt
	}
	return v
}

// createKey is POST /admin/keys.
func (s *Server) createKey(r *http.Request) (int, any, *adminError) {
	st, e := s.keyStore()
	if e != nil {
		return 0, nil, e
	}
	now := time.Now()
	kf, e := parseKeyFields(r, now)
	if e != nil {
		return 0, nil, e
	}
	if kf.name == nil {
		return 0, nil, badField("name", "required: whose key it is, such as \"team-a\"")
	}
	k, plain, err := tenancy.NewKey(*kf.name, now)
	if len(tenancy.FieldErrors(err)) > 0 {
		return 0, nil, fieldProblems(err)
	}
	if err != nil {
		return 0, nil, &adminError{status: http.StatusInternalServerError, code: "internal_error", msg: "no key could be made: " + err.Error()}
	}
	k = kf.patch().Apply(k)
	if err := k.Validate(); err != nil {
		return 0, nil, fieldProblems(err)
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	stored, err := st.CreateKey(ctx, k)
	if err != nil {
		return 0, nil, s.storeError(err, k.ID)
	}
	s.log.Info("admin: key created", "id", stored.ID, "name", stored.Name)
	v := viewOf(stored)
	v.Key = plain
	return http.StatusCreated, v, nil
}

// listKeys is GET /admin/keys.
func (s *Server) listKeys(r *http.Request) (int, any, *adminError) {
	st, e := s.keyStore()
	if e != nil {
		return 0, nil, e
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	keys, err := st.ListKeys(ctx)
	if err != nil {
		return 0, nil, s.storeError(err, "")
	}
	out := make([]keyView, len(keys))
	for i, k := range keys {
		out[i] = viewOf(k)
	}
	return http.StatusOK, map[string]any{"object": "list", "data": out}, nil
}

// keyID reads the {id} of the path.
func keyID(r *http.Request) (string, *adminError) {
	id := r.PathValue("id")
	if !tenancy.ValidID(id) {
		return "", &adminError{status: http.StatusNotFound, code: "key_not_found", msg: fmt.Sprintf("no key with id %.40q: an id is %d letters or digits", id, tenancy.IDLen)}
	}
	return id, nil
}

// getKey is GET /admin/keys/{id}.
func (s *Server) getKey(r *http.Request) (int, any, *adminError) {
	st, e := s.keyStore()
	if e != nil {
		return 0, nil, e
	}
	id, e := keyID(r)
	if e != nil {
		return 0, nil, e
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	k, err := st.GetKey(ctx, id)
	if err != nil {
		return 0, nil, s.storeError(err, id)
	}
	return http.StatusOK, viewOf(k), nil
}

// updateKey is PATCH /admin/keys/{id}; this gateway's cache forgets the
// key at once.
func (s *Server) updateKey(r *http.Request) (int, any, *adminError) {
	st, e := s.keyStore()
	if e != nil {
		return 0, nil, e
	}
	id, e := keyID(r)
	if e != nil {
		return 0, nil, e
	}
	kf, e := parseKeyFields(r, time.Now())
	if e != nil {
		return 0, nil, e
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	k, err := st.UpdateKey(ctx, id, kf.patch())
	s.ten.cache.Invalidate(id)
	if err != nil {
		return 0, nil, s.storeError(err, id)
	}
	s.log.Info("admin: key updated", "id", id)
	return http.StatusOK, viewOf(k), nil
}

// revokeKey is DELETE /admin/keys/{id}; this gateway's cache forgets the
// key at once.
func (s *Server) revokeKey(r *http.Request) (int, any, *adminError) {
	st, e := s.keyStore()
	if e != nil {
		return 0, nil, e
	}
	id, e := keyID(r)
	if e != nil {
		return 0, nil, e
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	err := st.DeleteKey(ctx, id)
	s.ten.cache.Invalidate(id)
	if err != nil {
		return 0, nil, s.storeError(err, id)
	}
	s.log.Info("admin: key revoked", "id", id)
	return http.StatusOK, map[string]any{"id": id, "object": "api_key", "deleted": true}, nil
}

// usage is GET /admin/usage: this gateway's pending rows are written
// first (within a bound), so what it served shows at once; other
// gateways' show after their usage_flush_interval.
func (s *Server) usage(r *http.Request) (int, any, *adminError) {
	st, e := s.keyStore()
	if e != nil {
		return 0, nil, e
	}
	var q tenancy.UsageQuery
	for name, vs := range r.URL.Query() {
		v := vs[0]
		if len(vs) > 1 {
			return 0, nil, badField(name, "given %d times; give it once", len(vs))
		}
		switch name {
		case "since", "until":
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return 0, nil, badField(name, "must be an RFC 3339 time such as 2030-01-02T15:04:05Z, got %.60q", v)
			}
			if name == "since" {
				q.Since = t
			} else {
				q.Until = t
			}
		case "key":
			if v == "" || len(v) > tenancy.MaxUsageKeyID {
				return 0, nil, badField(name, "must be a key id (or anonymous), got %.60q", v)
			}
			q.KeyID = v
		case "model":
			if v == "" || len(v) > tenancy.MaxModelLen {
				return 0, nil, badField(name, "must be a model name, got %.60q", v)
			}
			q.Model = v
		default:
			return 0, nil, badField(name, "unknown parameter; known: since, until, key, model")
		}
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Until.After(q.Since) {
		return 0, nil, badField("until", "must be after since")
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	if m := s.ten.meter; m != nil {
		fctx, fcancel := context.WithTimeout(ctx, closeFlushTimeout)
		m.flush(fctx)
		fcancel()
	}
	rows, err := st.Usage(ctx, q)
	if err != nil {
		return 0, nil, s.storeError(err, "")
	}
	if rows == nil {
		rows = []tenancy.Usage{}
	}
	return http.StatusOK, map[string]any{"object": "list", "data": rows}, nil
}

// statusView is GET /admin/status.
type statusView struct {
	Auth     string        `json:"auth"`
	Models   []modelStatus `json:"models"`
	Replicas []replicaLoad `json:"replicas"`
	Limiter  limiterStatus `json:"limiter"`
	Store    *storeStatus  `json:"store"`
	Cache    *cacheStatus  `json:"auth_cache"`
	Usage    *usageStatus  `json:"usage"`
	Config   *configStatus `json:"config"`
}

// modelStatus is a model's queue, in all and per priority class.
type modelStatus struct {
	Model       string               `json:"model"`
	Queued      int                  `json:"queued"`
	QueuedBytes int64                `json:"queued_bytes"`
	ByPriority  []gateway.ClassDepth `json:"queued_by_priority"`
}

// replicaLoad is what admission holds on a replica.
type replicaLoad struct {
	Model          string `json:"model"`
	Replica        string `json:"replica"`
	Healthy        bool   `json:"healthy"`
	InFlight       int    `json:"in_flight"`
	Pending        int    `json:"pending"`
	ReservedBlocks int    `json:"reserved_blocks"`
	CapacityBlocks int    `json:"capacity_blocks"`
}

type limiterStatus struct {
	// Mode is none (nothing is limited), local (in process) or redis.
	Mode     string `json:"mode"`
	Window   string `json:"window"`
	LeaseTTL string `json:"lease_ttl"`
	// Reservations is the requests this gateway holds a reservation for.
	Reservations int64             `json:"reservations"`
	Global       map[string]int    `json:"global"`
	KeyLimits    map[string]limits `json:"key_limits,omitempty"`
	Redis        *redisStatus      `json:"redis,omitempty"`
}

type limits struct {
	RPM            int `json:"rpm"`
	TPM            int `json:"tpm"`
	MaxConcurrency int `json:"max_concurrency"`
}

type redisStatus struct {
	Address      string `json:"address"`
	OnRedisError string `json:"on_redis_error"`
	Gateways     int    `json:"gateways"`
	Failing      bool   `json:"failing"`
	Errors       uint64 `json:"errors"`
	Closed       uint64 `json:"closed"`
	Open         uint64 `json:"open"`
	Local        uint64 `json:"local"`
}

type storeStatus struct {
	Backend string `json:"backend"`
	DSN     string `json:"dsn"` // the password replaced by xxxxx
	// Watch is "listening" while the store's key changes are followed
	// (Postgres LISTEN), "connecting" before, "lost" while it is being
	// retried; absent for a store that announces nothing (SQLite).
	Watch string `json:"watch,omitempty"`
}

type cacheStatus struct {
	TTL     string `json:"ttl"`
	Keys    int    `json:"keys"`
	Unknown int    `json:"unknown"`
	tenancy.CacheStats
}

type usageStatus struct {
	PendingRows   int        `json:"pending_rows"`
	Dropped       uint64     `json:"dropped"`
	Flushes       uint64     `json:"flushes"`
	FlushErrors   uint64     `json:"flush_errors"`
	LastFlush     *time.Time `json:"last_flush"`
	FlushInterval string     `json:"flush_interval"`
}

// status is GET /admin/status.
func (s *Server) status(_ *http.Request) (int, any, *adminError) {
	v := statusView{Auth: s.cfg.Auth, Models: []modelStatus{}, Replicas: []replicaLoad{}, Limiter: limiterStatus{Mode: "none"}, Config: s.configStatus()}
	for _, m := range s.models {
		snap := m.snapshot()
		v.Models = append(v.Models, modelStatus{Model: m.name, Queued: snap.queued, QueuedBytes: snap.queuedBytes, ByPriority: append([]gateway.ClassDepth{}, snap.byClass...)})
		for _, rs := range snap.reps {
			v.Replicas = append(v.Replicas, replicaLoad{Model: m.name, Replica: rs.rep.name, Healthy: rs.st.Healthy, InFlight: rs.st.Load.InFlight,
				Pending: rs.st.Load.Pending, ReservedBlocks: rs.st.ReservedBlocks, CapacityBlocks: rs.st.CapacityBlocks})
		}
	}
	t := s.ten
	if t == nil {
		return http.StatusOK, v, nil
	}
	l := &v.Limiter
	l.Mode, l.Window, l.LeaseTTL, l.Reservations = t.mode, t.cfg.Window.String(), t.cfg.LeaseTTL.String(), t.active.Load()
	l.Global = map[string]int{"rpm": t.global.RPM, "tpm": t.global.TPM, "max_concurrency": t.global.MaxConcurrency}
	for name, mt := range t.perModel {
		if !mt.keyLimits.Zero() {
			if l.KeyLimits == nil {
				l.KeyLimits = map[string]limits{}
			}
			l.KeyLimits[name] = limits{mt.keyLimits.RPM, mt.keyLimits.TPM, mt.keyLimits.MaxConcurrency}
		}
	}
	if t.redis != nil {
		rs := t.redis.Stats()
		rc := t.cfg.Redis
		l.Redis = &redisStatus{Address: rc.Address, OnRedisError: rc.OnRedisError, Gateways: rc.Gateways, Failing: t.redisFailing.Load(),
			Errors: rs.Errors, Closed: rs.Closed, Open: rs.Open, Local: rs.Local}
	}
	if t.store != nil {
		v.Store = &storeStatus{Backend: t.dsn.Backend, DSN: t.dsn.String()}
		if t.stopWatch != nil {
			v.Store.Watch = watchStates[t.watchState.Load()]
		}
		keys, unknown := t.cache.Len()
		v.Cache = &cacheStatus{TTL: t.cfg.AuthCacheTTL.String(), Keys: keys, Unknown: unknown, CacheStats: t.cache.Stats()}
	}
	if m := t.meter; m != nil {
		u := &usageStatus{PendingRows: m.pending(), Dropped: m.dropped.Load(), Flushes: m.flushes.Load(), FlushErrors: m.flushErrors.Load(), FlushInterval: t.cfg.UsageFlushInterval.String()}
		if ns := m.lastFlush.Load(); ns != 0 {
			at := time.Unix(0, ns).UTC()
			u.LastFlush = &at
		}
		v.Usage = u
	}
	return http.StatusOK, v, nil
}

// explainEndpoint is POST /admin/explain: the body is a generation request
// as a client would send it (an OpenAI chat, completions, Responses API or
// embeddings body; ?endpoint=chat, completions, responses or embeddings
// says which, else a body
// with a prompt is a completion, one with an input an embedding), with the headers the proxy reads (x-inferrail-tenant,
// x-inferrail-priority). It is read, resolved and tokenized as the proxy
// does (the tokenization is counted in inferrail_tokenize_total) and the
// model's gateway core explains what it would decide now, and why, without
// dispatching, reserving or recording anything (gateway.Core.Explain). The
// answer is a gateway.Explanation, the schema of sim --explain-out. A body
// that does not parse is a 400 in OpenAI's error shape; an unknown model a
// 404.
func (s *Server) explainEndpoint(r *http.Request) (int, any, *adminError) {
	op := opChat
	switch ep := r.URL.Query().Get("endpoint"); ep {
	case "", "chat":
	case "completions":
		op = opCompletion
	case "embeddings":
		op = opEmbedding
	case "responses":
		op = opResponses
	default:
		return 0, nil, badField("endpoint", "must be chat, completions, responses or embeddings, got %.40q", ep)
	}
	limit := int64(s.cfg.MaxBodyBytes)
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return 0, nil, &adminError{status: http.StatusBadRequest, code: "malformed_body", msg: "the request body could not be read"}
	}
	if int64(len(body)) > limit {
		return 0, nil, &adminError{status: http.StatusRequestEntityTooLarge, code: "body_too_large", msg: fmt.Sprintf("the request body exceeds max_body_bytes (%d)", limit)}
	}
	if r.URL.Query().Get("endpoint") == "" {
		if f, err := readFields(body); err == nil {
			switch {
			case f.Prompt != nil:
				op = opCompletion
			case f.Input != nil:
				op = opEmbedding
			}
		}
	}
	in, perr := s.parse(r.Header, body, op)
	if perr != nil {
		code := perr.code
		if code == "" {
			code = "invalid_body"
		}
		return 0, nil, &adminError{status: perr.status, code: code, msg: perr.msg}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	s.weigh(ctx, in, r.Header)
	return http.StatusOK, in.m.explain(in.req), nil
}
