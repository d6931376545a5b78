package live

import (
	"context"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
)

// This file finds the replica that holds a stored response this gateway
// did not see answered: one made through another gateway (the chart runs
// two), or before this one started. homes knows only the responses this
// gateway passed on, and the homes shared through tenancy.redis
// (sharedhomes.go) those of every gateway that has it; for any other id
// named by previous_response_id or GET /v1/responses/{id} (and .../cancel)
// the candidate replicas are asked GET /v1/responses/{id} at once, and the
// first to answer 200 holds it (vLLM answers 404 for an id its store
// lacks). What is found is remembered, and shared, as any home is.
//
// Bounds, as a request that names a made-up id costs a request to every
// replica: at most searchRate searches a second gateway-wide (bursts of
// searchBurst), at most maxLocating at once (a search that cannot start
// within locateTimeout is given up, and the request goes by the usual
// rule); concurrent requests for one id share one search; an id no replica holds is not searched for again for missTTL
// (at most maxMissed such ids are kept); each search ends within
// locateTimeout, and reads no answer's body.
//
// With auth: keys a response belongs to the key it was made with, which
// only the gateway that passed it on (and the shared homes) know: there is
// no search, and an id known to neither goes by the usual rule (the engine
// that gets it answers 404 unless it holds it).

const (
	locateTimeout = 2 * time.Second
	searchRate    = 32
	searchBurst   = 64
	maxLocating   = 8
	missTTL       = 10 * time.Second
	maxMissed     = 4096
)

// locator runs the searches; its zero value is ready.
type locator struct {
	once  sync.Once
	slots chan struct{}
	rate  *rate.Limiter
	group singleflight.Group

	mu     sync.Mutex
	missed map[string]time.Time // id -> when no replica held it
}

// candidate is a replica a search asks, with its model.
type candidate struct {
	m   *model
	rep *replica
}

// Answers of a probe.
const (
	probeUnknown = iota // no answer, or one that says nothing (5xx, a timeout)
	probeAbsent         // 404: the replica does not hold it
	probeHeld           // 200
)

// Results of a search, as inferrail_response_searches_total counts them.
const (
	searchFound   = "found"   // a replica answered 200
	searchMissing = "missing" // every replica answered 404
	searchUnknown = "unknown" // no 200, and some replica did not say (an error, a timeout)
	searchBusy    = "busy"    // not started: searchRate a second, or maxLocating at once, were running
	searchRecent  = "recent"  // not searched: every replica said it lacks it within missTTL
	searchInvalid = "invalid" // not searched: not an id as vLLM makes them (locatable)
)

// find returns the candidate that holds response id, and how the search
// went (found, or why not). probe asks one candidate.
func (l *locator) find(ctx context.Context, id string, cands []candidate, probe func(context.Context, candidate) int) (candidate, string) {
	switch {
	case !locatable(id):
		return candidate{}, searchInvalid
	case len(cands) == 0:
		return candidate{}, searchMissing
	case l.recentlyMissed(id):
		return candidate{}, searchRecent
	}
	l.once.Do(func() {
		l.slots = make(chan struct{}, maxLocating)
		l.rate = rate.NewLimiter(searchRate, searchBurst)
	})
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, locateTimeout)
	defer cancel()
	// The search is shared by concurrent requests for id, asks the first
	// one's candidates and ends within locateTimeout of its start (its
	// context's end): a later request waits for it, or for its own
	// context's end if that comes first.
	type result struct {
		c   candidate
		how string
	}
	ch := l.group.DoChan(id, func() (any, error) {
		if !l.rate.Allow() {
			return result{how: searchBusy}, nil
		}
		select {
		case l.slots <- struct{}{}:
		case <-ctx.Done():
			return result{how: searchBusy}, nil
		}
		defer func() { <-l.slots }()
		if ctx.Err() != nil { // a slot freed as the wait ended
			return result{how: searchBusy}, nil
		}
		pctx, pcancel := context.WithCancel(ctx)
		defer pcancel() // a probe still running is not needed once one holds it
		answers := make(chan struct {
			i, a int
		}, len(cands))
		for i, c := range cands {
			go func() {
				answers <- struct{ i, a int }{i, probe(pctx, c)}
			}()
		}
		absent := 0
		for range cands {
			ans := <-answers
			switch ans.a {
			case probeHeld:
				return result{c: cands[ans.i], how: searchFound}, nil
			case probeAbsent:
				absent++
			}
		}
		if absent < len(cands) {
			return result{how: searchUnknown}, nil
		}
		l.miss(id)
		return result{how: searchMissing}, nil
	})
	select {
	case res := <-ch:
		r, _ := res.Val.(result)
		return r.c, r.how
	case <-parent.Done():
		return candidate{}, searchUnknown
	}
}

// locatable reports whether id may be searched for: an id as vLLM makes
// them (resp_ and hex digits), letters, digits, '_' and '-', at most
// maxResponseID bytes; anything else goes into no upstream path.
func locatable(id string) bool {
	if id == "" || len(id) > maxResponseID {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (l *locator) recentlyMissed(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.missed[id]
	if ok && time.Since(at) >= missTTL {
		delete(l.missed, id)
		ok = false
	}
	return ok
}

func (l *locator) miss(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.missed == nil || len(l.missed) >= maxMissed {
		l.missed = make(map[string]time.Time) // dropped whole: bounded
	}
	l.missed[id] = time.Now()
}

// probeStored asks c's replica whether it holds response id (locatable):
// GET /v1/responses/{id} with r's headers under the header policy. The
// answer's body is not read.
func (s *Server) probeStored(r *http.Request, reqID, id string) func(context.Context, candidate) int {
	return func(ctx context.Context, c candidate) int {
		u := *c.rep.base
		u.Path += "/v1/responses/" + id
		hdr := s.upstreamHeaders(r, reqID, c.rep).header()
		delete(hdr, "Content-Type")
		out := &http.Request{
			Method: http.MethodGet, URL: &u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: hdr, Body: http.NoBody, Host: u.Host,
		}
		resp, err := s.upstream.Transport.RoundTrip(out.WithContext(ctx))
		if err != nil {
			return probeUnknown
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return probeHeld
		case http.StatusNotFound:
			return probeAbsent
		}
		return probeUnknown
	}
}

// locateHome finds the replica that holds the response a Responses API
// request continues, when this gateway does not know it (in.home is ""):
// shared by another gateway through tenancy.redis (sharedhomes.go), else,
// unless keyed (auth: keys: only the shared home knows the response's
// key), searched for among the model's replicas when it has more than one.
// Found, it is remembered and the request pinned to it (pinResponse); a
// response another key made is answered 404, as if it did not exist.
func (s *Server) locateHome(ctx context.Context, r *http.Request, reqID string, in *inbound, keyed bool) *apiError {
	if in.op != opResponses || in.f.PreviousResponseID == nil || in.home != "" {
		return nil
	}
	id := *in.f.PreviousResponseID
	if at, ok := s.shared.get(ctx, id); ok && at.model == in.m.name {
		s.homes.put(id, at)
		s.pinResponse(in)
		if keyed && in.home != "" && in.homeOwner != in.owner {
			return responseNotFoundErr(in.m.name, id)
		}
		return nil
	}
	reps := in.m.live()
	if keyed || len(reps) < 2 {
		return nil // the usual rule: it has one replica to pick, or the key is unknown here
	}
	cands := make([]candidate, len(reps))
	for i, rep := range reps {
		cands[i] = candidate{m: in.m, rep: rep}
	}
	if _, ok := s.search(ctx, r, reqID, id, cands); ok {
		s.pinResponse(in)
	}
	return nil
}

// findStored finds the replica that holds the response a stored response's
// request names (GET /v1/responses/{id}, POST .../cancel), with its model
// and owner (the key it was made with): this gateway's own homes, else the
// shared ones (tenancy.redis), else, unless keyed, a search of every
// model's replicas. Nil when none is found.
func (s *Server) findStored(ctx context.Context, r *http.Request, reqID, id string, keyed bool) (*model, *replica, string) {
	if at, ok := s.homes.get(id); ok {
		if m, rep := s.homeOf(at); rep != nil {
			return m, rep, at.owner
		}
	}
	if at, ok := s.shared.get(ctx, id); ok {
		if m, rep := s.homeOf(at); rep != nil {
			s.homes.put(id, at)
			return m, rep, at.owner
		}
	}
	if keyed {
		return nil, nil, ""
	}
	rt := s.routes.Load()
	seen := map[string]bool{}
	var cands []candidate
	for m := range rt.names {
		for _, rep := range m.live() {
			if u := rep.base.String(); !seen[u] {
				seen[u] = true
				cands = append(cands, candidate{m: m, rep: rep})
			}
		}
	}
	if c, ok := s.search(ctx, r, reqID, id, cands); ok {
		return c.m, c.rep, ""
	}
	return nil, nil, ""
}

// search asks cands for response id (locator.find), counts how it went,
// and remembers and shares the home it finds.
func (s *Server) search(ctx context.Context, r *http.Request, reqID, id string, cands []candidate) (candidate, bool) {
	c, how := s.loc.find(ctx, id, cands, s.probeStored(r, reqID, id))
	s.met.responseSearch(how)
	if how != searchFound {
		return candidate{}, false
	}
	at := home{model: c.m.name, replica: c.rep.name}
	s.homes.put(id, at)
	s.shared.put(id, at)
	return c, true
}
