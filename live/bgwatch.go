package live

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/tenancy"
)

// A background response (a Responses API request with background: true)
// is answered "queued" and generated after, where the proxy sees none of
// it: its answer carries no usage. The proxy watches it to its end: it
// reads it at the replica that holds it (GET /v1/responses/{id}) every
// bgPoll until its status is final (completed, incomplete, failed,
// cancelled). Until then the request stays in the gateway core on that
// replica, holding its slot as the engine's work does (so background mode
// never escapes max_concurrency and the queue in front of it), and its
// rate-limiter reservation stays too (bgLimit: a key's max_concurrency,
// its lease renewed). When it ends, the core learns its usage, TPM is
// reconciled with the tokens it used and its output tokens are metered.
// Bounds: at most max_background_responses at once (one more is refused
// before it reaches an engine: holdBackground); each read within
// bgReadTimeout and bgMaxBody; a watch ends at request_timeout after it
// began (expired), when the gateway closes (shutdown), or when the engine
// no longer has it (lost: 404, as a restarted engine answers, or
// bgMaxFailures failed reads in a row). A response whose end the proxy
// does not see (expired, shutdown, lost) is metered at its output bound
// (max_output_tokens, else the model's default) and keeps the limiter's
// estimate, as the rate limiter charges what it does not know.

const (
	bgPoll = time.Second
	// bgPollQueued is the poll while requests wait in the model's queue:
	// a slot a background response no longer uses is freed sooner.
	bgPollQueued  = 200 * time.Millisecond
	bgReadTimeout = 5 * time.Second
	bgMaxBody     = 4 << 20
	// bgMaxFailures failed reads in a row end a watch (lost): its engine
	// is gone, and holds the slot and the limits of nothing.
	bgMaxFailures = 10
)

// holdBackground takes a background request's place among
// max_background_responses before it goes to an engine, or refuses it
// (429): a response the proxy could not watch would leave the core's slot
// and the limits with its "queued" answer.
func (s *Server) holdBackground(in *inbound) *apiError {
	select {
	case s.bgSlots <- struct{}{}:
		in.bgSlot = true
		return nil
	default:
		return &apiError{status: http.StatusTooManyRequests, typ: "requests", code: "too_many_background_responses", outcome: "background_full",
			model: in.m.name, retryAfter: time.Second,
			msg: fmt.Sprintf("%d background responses are in flight through this gateway (max_background_responses); retry when one has ended", cap(s.bgSlots))}
	}
}

// dropBackground gives back a request's place when no watch took it (its
// answer was not a background one, or failed).
func (s *Server) dropBackground(in *inbound) {
	if in.bgSlot {
		in.bgSlot = false
		<-s.bgSlots
	}
}

// watchBackground starts the watch of a background response answered by
// rep as id, and reports whether it did. With a (nil: none) the watch
// ends it in the core when the response ends, its blocks held; the caller
// leaves it to the watch. The caller has checked that the answer carried
// no usage: an engine that generated it at once (one that ignores
// background) was learned and metered from its answer.
func (s *Server) watchBackground(in *inbound, a *attempt, rep *replica, id string, held []kvblock.Hash) bool {
	if !in.f.Background || in.bg != nil || !in.bgSlot {
		return false // not background, or watched already
	}
	in.bgSlot = false // the watch's now (holdBackground took it)
	meter := func(int) {}
	bound := 0
	if t := s.ten; t != nil && t.meter != nil {
		key := in.owner
		if key == "" {
			key = anonymousKey
		}
		model := in.engineModel()
		bound = t.estimate(in) - max(in.req.PromptTokens, 0) // the output the request may make
		meter = func(output int) {
			if output > 0 {
				t.meter.add(tenancy.Usage{KeyID: key, Model: model, Hour: time.Now(), OutputTokens: int64(output)})
			}
		}
	}
	bg := &bgLimit{}
	in.bg = bg
	if a != nil {
		in.m.watched(a)
	}
	entry := &bgEntry{ID: id, Model: in.m.name, Replica: rep.name, Key: in.owner, Since: time.Now().UTC(), Status: "queued"}
	s.watchMu.Lock()
	s.bgWatched[id] = entry
	s.watchMu.Unlock()
	s.wg.Go(func() {
		defer func() { <-s.bgSlots }()
		output, cached, how := s.watch(in.m, rep, id, entry)
		s.watchMu.Lock()
		delete(s.bgWatched, id)
		s.watchMu.Unlock()
		if how != "metered" {
			output, cached = -1, -1
		}
		if a != nil {
			u := gateway.Usage{Known: output >= 0, CompletionTokens: max(output, 0), CachedTokens: max(cached, 0)}
			in.m.endWatched(a, held, u)
		}
		bg.ended(output)
		if output < 0 {
			output = bound
		}
		meter(output)
		s.met.backgroundWatch(how)
	})
	return true
}

// bgLimit hands a background request's rate-limiter reservation from the
// request, which ends first as a rule, to the watch of its response:
// whichever of the two comes second ends it.
type bgLimit struct {
	mu     sync.Mutex
	done   bool
	output int // the response's output tokens, -1 unknown (once done)
	finish func(output int)
}

// ended is the watch's end: the response's output tokens, -1 when its end
// was not seen.
func (b *bgLimit) ended(output int) {
	b.mu.Lock()
	f := b.finish
	b.done, b.output = true, output
	b.mu.Unlock()
	if f != nil {
		f(output)
	}
}

// handOver gives the watch finish, to call with the response's output
// tokens when it ends (at once when it has).
func (b *bgLimit) handOver(finish func(output int)) {
	b.mu.Lock()
	if !b.done {
		b.finish = finish
		b.mu.Unlock()
		return
	}
	output := b.output
	b.mu.Unlock()
	finish(output)
}

// watch polls the response until it ends, and returns its output and
// cached tokens and how the watch ended. It reads it first after
// bgPollQueued (a short one ends soon), then every bgPoll, or every
// bgPollQueued while m's queue holds requests.
func (s *Server) watch(m *model, rep *replica, id string, entry *bgEntry) (output, cached int, how string) {
	deadline := time.Now().Add(s.cfg.RequestTimeout)
	t := time.NewTimer(bgPollQueued)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-s.stop:
			return 0, 0, "shutdown"
		case <-t.C:
		}
		status, output, cached, code := s.readStored(rep, id)
		if status != "" {
			s.watchMu.Lock()
			entry.Status = status
			s.watchMu.Unlock()
		}
		switch {
		case status == "completed" || status == "incomplete" || status == "failed" || status == "cancelled":
			return output, cached, "metered"
		case code == http.StatusNotFound:
			return 0, 0, "lost" // the engine no longer has it (restarted)
		case status == "":
			if failures++; failures >= bgMaxFailures {
				return 0, 0, "lost"
			}
		default:
			failures = 0
		}
		if time.Now().After(deadline) {
			return 0, 0, "expired"
		}
		poll := bgPoll
		if m.hasQueued() {
			poll = bgPollQueued
		}
		t.Reset(poll)
	}
}

// readStored reads a stored response's status, output and cached tokens at
// rep, and the HTTP status of the read (0: no answer); status is "" when
// the read failed (an error, a status other than 200, a body that is not a
// response).
func (s *Server) readStored(rep *replica, id string) (status string, output, cached, code int) {
	ctx, cancel := context.WithTimeout(context.Background(), bgReadTimeout)
	defer cancel()
	u := *rep.base
	u.Path += "/v1/responses/" + id
	req := &http.Request{Method: http.MethodGet, URL: &u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Accept": {"application/json"}}, Body: http.NoBody, Host: u.Host}
	if a := rep.authorization(); a != "" {
		req.Header.Set("Authorization", a)
	}
	resp, err := s.upstream.Transport.RoundTrip(req.WithContext(ctx))
	if err != nil {
		return "", 0, 0, 0
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", 0, 0, resp.StatusCode
	}
	var r struct {
		Status string `json:"status"`
		Usage  *struct {
			OutputTokens       int `json:"output_tokens"`
			InputTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, bgMaxBody)).Decode(&r) != nil || r.Status == "" {
		return "", 0, 0, resp.StatusCode
	}
	if r.Usage != nil {
		output = max(r.Usage.OutputTokens, 0)
		if d := r.Usage.InputTokensDetails; d != nil {
			cached = max(d.CachedTokens, 0)
		}
	}
	return r.Status, output, cached, resp.StatusCode
}

// bgEntry is a watched background response as GET /admin/background lists
// it: its replica, its key's id ("" without auth: keys), when it was
// answered and its status at the last read.
type bgEntry struct {
	ID      string    `json:"id"`
	Model   string    `json:"model"`
	Replica string    `json:"replica"`
	Key     string    `json:"key,omitempty"`
	Since   time.Time `json:"since"`
	Status  string    `json:"status"`
}

// backgroundList is GET /admin/background: the background responses in
// flight (those admitted and not answered yet are counted, not listed) and
// those watched, oldest first.
func (s *Server) backgroundList(_ *http.Request) (int, any, *adminError) {
	s.watchMu.Lock()
	watched := make([]bgEntry, 0, len(s.bgWatched))
	for _, e := range s.bgWatched {
		watched = append(watched, *e)
	}
	s.watchMu.Unlock()
	slices.SortFunc(watched, func(a, b bgEntry) int { return cmp.Or(a.Since.Compare(b.Since), strings.Compare(a.ID, b.ID)) })
	return http.StatusOK, struct {
		Max      int       `json:"max_background_responses"`
		InFlight int       `json:"in_flight"`
		Watched  []bgEntry `json:"watched"`
	}{cap(s.bgSlots), len(s.bgSlots), watched}, nil
}
