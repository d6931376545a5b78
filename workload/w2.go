package workload

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// w2 generates closed-loop multi-turn chat: Next starts sessions (their first
// turns), Done answers a completed turn with the session's next one. Only
// active sessions are remembered.
type w2 struct {
	model       string
	maxTokens   int
	maxModelLen int
	limit       int           // Config.Requests; 0 = none
	duration    time.Duration // Config.Duration; 0 = none
	p           W2Params

	created     int    // requests created
	promised    int    // turns still to come from active sessions
	lastSession uint64 // sessions number from 1
	sessions    map[uint64]*session

	arr      poisson
	ids      idGen
	sys      []kvblock.Segment
	turnsR   *rand.Rand
	sysR     *rand.Rand
	userR    *rand.Rand
	thinkR   *rand.Rand
	user     lengthDist
	out      outputs
	finished bool
}

// session is one active conversation.
type session struct {
	id      uint64
	turns   int               // planned turns, capped to the request budget
	next    int               // turns created so far = next turn's index
	pending uint64            // ID of the latest turn, the only one Done continues
	tokens  int               // tokens in hist
	hist    []kvblock.Segment // the latest turn's prompt (owned, never handed out)
	answer  kvblock.Segment   // the latest turn's output
}

func newW2(c *Config) *w2 {
	p := c.W2
	meanTurns := float64(p.TurnsMin+p.TurnsMax) / 2
	s := &w2{
		model:       c.Model,
		maxTokens:   c.Output.MaxTokens,
		maxModelLen: c.MaxModelLen,
		limit:       c.Requests,
		duration:    c.Duration,
		p:           p,
		sessions:    make(map[uint64]*session),
		arr:         poisson{r: newRand(c.Seed, "w2/arrivals"), rate: c.Rate / meanTurns, limit: c.Duration},
		ids:         newIDGen(c.Seed, "w2/segment-ids"),
		turnsR:      newRand(c.Seed, "w2/turns"),
		sysR:        newRand(c.Seed, "w2/system-choice"),
		userR:       newRand(c.Seed, "w2/user-lengths"),
		thinkR:      newRand(c.Seed, "w2/think"),
		user:        newLengthDist(p.UserMedianTokens, p.UserSigma, p.UserMinTokens, p.UserMaxTokens),
		out:         newOutputs(c, "w2/outputs"),
	}
	lr := newRand(c.Seed, "w2/system-lengths")
	s.sys = make([]kvblock.Segment, p.SystemPrompts)
	for i := range s.sys {
		s.sys[i] = s.ids.segment(uniform(lr, p.SystemMinTokens, p.SystemMaxTokens))
	}
	return s
}

// Next starts a session and returns its first turn. Once the requests
// created plus those promised by active sessions reach Config.Requests, no
// more sessions start (the last one started is cut to fit).
func (s *w2) Next() (*Request, bool) {
	if s.finished || (s.limit > 0 && s.created+s.promised >= s.limit) {
		s.finished = true
		return nil, false
	}
	at, ok := s.arr.next()
	if !ok {
		s.finished = true
		return nil, false
	}
	turns := uniform(s.turnsR, s.p.TurnsMin, s.p.TurnsMax)
	if s.limit > 0 {
		turns = min(turns, s.limit-s.created-s.promised)
	}
	s.lastSession++
	sess := &session{
		id:    s.lastSession,
		turns: turns,
		hist:  make([]kvblock.Segment, 0, 2*min(turns, 32)),
	}
	sys := s.sys[s.sysR.IntN(len(s.sys))]
	u := s.ids.segment(s.user.sample(s.userR))
	// Validate guarantees system + user + max_tokens fit max_model_len.
	sess.hist = append(sess.hist, sys, u)
	sess.tokens = sys.Len + u.Len
	s.promised += turns
	return s.turn(sess, at), true
}

// turn creates the session's next request from its history and books it.
func (s *w2) turn(sess *session, at time.Duration) *Request {
	s.created++
	s.promised--
	prompt := make([]kvblock.Segment, len(sess.hist))
	copy(prompt, sess.hist)
	o := s.out.sample(&s.ids)
	r := &Request{
		ID:           uint64(s.created),
		Arrival:      at,
		Model:        s.model,
		Session:      sess.id,
		Turn:         sess.next,
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
func (s *w2) end(sess *session) {
	s.promised -= sess.turns - sess.next
	delete(s.sessions, sess.id)
}

// Done returns the session's next turn, arriving a think time after at. The
// session ends instead when the turn failed, when it was the last, when
// the next arrival would be after Config.Duration, or when the next prompt
// plus max_tokens would exceed max_model_len. Done for a request that is not
// its active session's latest turn returns false.
func (s *w2) Done(req *Request, at time.Duration, ok bool) (*Request, bool) {
	sess := s.sessions[req.Session]
	if sess == nil || req.ID != sess.pending {
		return nil, false
	}
	if !ok || (s.limit > 0 && s.created >= s.limit) {
		s.end(sess)
		return nil, false
	}
	think := s.p.ThinkMin
	if span := int64(s.p.ThinkMax - s.p.ThinkMin); span < math.MaxInt64 {
		think += time.Duration(s.thinkR.Int64N(span + 1))
	} else {
		think += time.Duration(s.thinkR.Int64())
	}
	if at > time.Duration(math.MaxInt64)-think {
		s.end(sess)
		return nil, false
	}
	next := at + think
	if s.duration > 0 && next > s.duration {
		s.end(sess)
		return nil, false
	}
	u := s.ids.segment(s.user.sample(s.userR))
	tokens := sess.tokens + sess.answer.Len + u.Len
	if tokens+s.maxTokens > s.maxModelLen {
		s.end(sess)
		return nil, false
	}
	sess.hist = append(sess.hist, sess.answer, u)
	sess.tokens = tokens
	return s.turn(sess, next), true
}
