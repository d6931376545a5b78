package workload

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// sampler draws a token count from its random stream.
type sampler interface {
	sample(r *rand.Rand) int
}

// span is a token count uniform in [lo, hi].
type span struct{ lo, hi int }

func (s span) sample(r *rand.Rand) int { return uniform(r, s.lo, s.hi) }

// closedLoop is the engine of the closed-loop workloads (w2 chat, w3 agent
// loops): Next starts sessions (their first turns), Done answers a completed
// turn with the session's next one. A session's first prompt is [system,
// first message]; every later turn resends the previous prompt followed by
// the previous turn's output and a fresh follow-up message (a user message
// for w2, a tool result for w3). Only active sessions are remembered.
//
// Without plan (w2), the draws happen in a fixed order (arrival, turns,
// system choice, first message, output; on Done: delay, follow-up, output),
// and a session that would outgrow max_model_len ends there, leaving its
// remaining turns unused. With plan (w3), a session's whole script (every
// output and follow-up) is drawn when it starts and cut to the turns that
// fit max_model_len, so only failures and Config.Duration keep a run from
// creating exactly Config.Requests requests.
type closedLoop struct {
	model       string
	maxTokens   int
	maxModelLen int
	limit       int           // Config.Requests; 0 = none
	duration    time.Duration // Config.Duration; 0 = none

	created     int    // requests created
	promised    int    // turns still to come from active sessions
	lastSession uint64 // sessions number from 1
	sessions    map[uint64]*session

	arr      arrivals
	ids      idGen
	sys      []kvblock.Segment // the shared system prompts, chosen uniformly
	turnsR   *rand.Rand        // planned turns per session
	turns    span
	sysR     *rand.Rand // system prompt choice
	delayR   *rand.Rand // delay between a completion and the next turn
	delayMin time.Duration
	delayMax time.Duration
	firstR   *rand.Rand // first message lengths
	first    sampler
	followR  *rand.Rand // follow-up message lengths
	follow   sampler
	out      outputs
	mix      mixer // Config.Mix, drawn per session
	plan     bool  // draw each session's script when it starts
	finished bool
}

// session is one active conversation (w2) or agent task (w3).
type session struct {
	id      uint64
	turns   int               // planned turns, capped to the request budget
	next    int               // turns created so far = next turn's index
	pending uint64            // ID of the latest turn, the only one Done continues
	tokens  int               // tokens in hist (without plan)
	hist    []kvblock.Segment // the latest turn's prompt (owned, never handed out)
	answer  kvblock.Segment   // the latest turn's output
	tenant  string            // the session's class of Config.Mix
	prio    int
	// With plan, hist is the whole script instead: [system, first, output
	// 0, follow-up 1, output 1, ...]; turn t's prompt is hist[:2+2t] and
	// its output hist[2+2t].
}

// Next starts a session and returns its first turn. Once the requests
// created plus those promised by active sessions reach Config.Requests, no
// more sessions start (the last one started is cut to fit).
func (s *closedLoop) Next() (*Request, bool) {
	if s.finished || (s.limit > 0 && s.created+s.promised >= s.limit) {
		s.finished = true
		return nil, false
	}
	at, ok := s.arr.next()
	if !ok {
		s.finished = true
		return nil, false
	}
	turns := s.turns.sample(s.turnsR)
	if s.limit > 0 {
		turns = min(turns, s.limit-s.created-s.promised)
	}
	s.lastSession++
	hcap := 2 * min(turns, 32)
	if s.plan {
		hcap++ // the last output
	}
	sess := &session{
		id:    s.lastSession,
		turns: turns,
		hist:  make([]kvblock.Segment, 0, hcap),
	}
	sess.tenant, sess.prio = s.mix.draw()
	sys := s.sys[s.sysR.IntN(len(s.sys))]
	u := s.ids.segment(s.first.sample(s.firstR))
	// Validate guarantees system + first message + max_tokens fit
	// max_model_len.
	sess.hist = append(sess.hist, sys, u)
	sess.tokens = sys.Len + u.Len
	if s.plan {
		s.script(sess)
	}
	s.promised += sess.turns
	return s.turn(sess, at), true
}

// script draws the outputs and follow-ups of every planned turn of a new
// session, ending it at the last turn whose prompt + max_tokens fit
// max_model_len.
func (s *closedLoop) script(sess *session) {
	tokens := sess.tokens
	for t := 0; ; t++ {
		o := s.out.sample(&s.ids)
		sess.hist = append(sess.hist, o)
		if t+1 == sess.turns {
			return
		}
		f := s.ids.segment(s.follow.sample(s.followR))
		if tokens+o.Len+f.Len+s.maxTokens > s.maxModelLen {
			sess.turns = t + 1
			return
		}
		sess.hist = append(sess.hist, f)
		tokens += o.Len + f.Len
	}
}

// turn creates the session's next request from its history and books it.
func (s *closedLoop) turn(sess *session, at time.Duration) *Request {
	s.created++
	s.promised--
	n := len(sess.hist)
	if s.plan {
		n = 2 + 2*sess.next
	}
	prompt := make([]kvblock.Segment, n)
	copy(prompt, sess.hist)
	var o kvblock.Segment
	if s.plan {
		o = sess.hist[n]
	} else {
		o = s.out.sample(&s.ids)
	}
	r := &Request{
		ID:           uint64(s.created),
		Arrival:      at,
		Model:        s.model,
		Session:      sess.id,
		Turn:         sess.next,
		Tenant:       sess.tenant,
		Priority:     sess.prio,
		Prompt:       prompt,
		MaxTokens:    s.maxTokens,
		OutputTokens: o.Len,
		Output:       o,
	}
	sess.next++
	sess.pending = r.ID
	sess.answer = o
	switch {
	case sess.next == 1 && sess.turns > 1:
		s.sessions[sess.id] = sess
	case sess.next == sess.turns && sess.next > 1:
		delete(s.sessions, sess.id)
	}
	return r
}

// end forgets a session and its promised turns.
func (s *closedLoop) end(sess *session) {
	s.promised -= sess.turns - sess.next
	delete(s.sessions, sess.id)
}

// Done returns the session's next turn, arriving a delay (think time, tool
// latency) after at. The session ends instead when the turn failed, when it
// was the last, when the next arrival would be after Config.Duration, or
// (without plan) when the next prompt plus max_tokens would exceed
// max_model_len. Done for a request that is not its active session's latest
// turn returns false.
func (s *closedLoop) Done(req *Request, at time.Duration, ok bool) (*Request, bool) {
	sess := s.sessions[req.Session]
	if sess == nil || req.ID != sess.pending {
		return nil, false
	}
	if !ok || (s.limit > 0 && s.created >= s.limit) {
		s.end(sess)
		return nil, false
	}
	delay := s.delayMin
	if span := int64(s.delayMax - s.delayMin); span < math.MaxInt64 {
		delay += time.Duration(s.delayR.Int64N(span + 1))
	} else {
		delay += time.Duration(s.delayR.Int64())
	}
	if at > time.Duration(math.MaxInt64)-delay {
		s.end(sess)
		return nil, false
	}
	next := at + delay
	if s.duration > 0 && next > s.duration {
		s.end(sess)
		return nil, false
	}
	if s.plan {
		return s.turn(sess, next), true
	}
	u := s.ids.segment(s.follow.sample(s.followR))
	tokens := sess.tokens + sess.answer.Len + u.Len
	if tokens+s.maxTokens > s.maxModelLen {
		s.end(sess)
		return nil, false
	}
	sess.hist = append(sess.hist, sess.answer, u)
	sess.tokens = tokens
	return s.turn(sess, next), true
}
