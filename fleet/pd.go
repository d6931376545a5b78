package fleet

import (
	"fmt"
	"time"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/router/gateway"
)

// Disaggregated prefill/decode (P/D) in the virtual fleet.
//
// The first Config.PrefillReplicas replicas are prefill-only, the next
// Config.DecodeReplicas decode-only, the rest serve both. A request the
// gateway dispatches with a remote prefill (gateway.Decision.Prefill) is
// sent to its prefill replica as a one-token request (vLLM's P/D: the
// prefill request has max_tokens 1); when that token is out, the gateway
// is told (PrefillDone) and the prompt's KV the decode replica lacks (the
// prompt less what the index predicts cached there) moves over the prefill
// replica's link: its base latency, then the bytes at the link's fair share
// of bandwidth among the transfers leaving that replica at once. When the
// KV has arrived the request is added to the decode replica as a remote
// prefill (engine.Request.RemotePrefill): its first step computes the
// prompt's last token and streams the first token, as vLLM's decode worker
// does; nothing waits for a reply the protocol does not need. A prefill
// the prefill engine refuses falls back to a local prefill on the decode
// replica (PrefillFailed).

// prefillBit marks a prefill replica's engine request ids: a request's
// prefill and its decode have the same workload id.
const prefillBit = 1 << 63

// role is replica i's role.
func (c *Config) role(i int) gateway.Role {
	switch {
	case i < c.PrefillReplicas:
		return gateway.RolePrefill
	case i < c.PrefillReplicas+c.DecodeReplicas:
		return gateway.RoleDecode
	}
	return gateway.RoleBoth
}

// validatePD checks the pools.
func (c *Config) validatePD() error {
	if c.PrefillReplicas < 0 || c.DecodeReplicas < 0 {
		return fmt.Errorf("prefill_replicas %d and decode_replicas %d: must be zero or positive", c.PrefillReplicas, c.DecodeReplicas)
	}
	if c.PrefillReplicas+c.DecodeReplicas > c.Replicas {
		return fmt.Errorf("replicas: %d prefill and %d decode replicas are more than the fleet's %d replicas (replicas counts every pool)",
			c.PrefillReplicas, c.DecodeReplicas, c.Replicas)
	}
	if c.PrefillReplicas > 0 && c.PrefillReplicas == c.Replicas {
		return fmt.Errorf("decode_replicas: a fleet of %d prefill replicas has no replica to decode on: set decode_replicas, or fewer prefill_replicas than replicas", c.PrefillReplicas)
	}
	return nil
}

// link is a prefill replica's outgoing KV link: its transfers share its
// bandwidth equally (processor sharing).
type link struct {
	bw     float64 // bytes per second
	active []*transfer
	at     time.Duration // when remaining was last brought up to date
	next   time.Duration // the pending evTransfer event's time, -1 if none
}

type transfer struct {
	rs        *reqState
	remaining float64 // bytes
}

// startTransfer sends rs's KV over its prefill replica's link.
func (s *sim) startTransfer(rs *reqState, bytes float64) {
	l := s.links[rs.prefill]
	s.advanceLink(l)
	l.active = append(l.active, &transfer{rs: rs, remaining: bytes})
	s.scheduleLink(rs.prefill, l)
}

// advanceLink brings the transfers' remaining bytes up to now.
func (s *sim) advanceLink(l *link) {
	if n := len(l.active); n > 0 && s.now > l.at {
		sent := float64(s.now-l.at) / float64(time.Second) * l.bw / float64(n)
		for _, t := range l.active {
			t.remaining -= sent
		}
	}
	l.at = s.now
}

// scheduleLink asks to be woken when the link's next transfer completes.
func (s *sim) scheduleLink(i int, l *link) {
	if len(l.active) == 0 {
		l.next = -1
		return
	}
	least := l.active[0].remaining
	for _, t := range l.active[1:] {
		least = min(least, t.remaining)
	}
	d := time.Duration(max(0, least) * float64(len(l.active)) / l.bw * float64(time.Second))
	// Round up, so that the transfer is done when the event comes.
	at := s.now + d + 1
	l.next = at
	s.heap.push(event{at: at, kind: evTransfer, replica: int32(i), gateway: -1})
}

// linkEvent completes the transfers of prefill replica i's link that are
// done by now.
func (s *sim) linkEvent(i int, at time.Duration) {
	l := s.links[i]
	if l.next != at {
		return // superseded by a later schedule
	}
	s.advanceLink(l)
	kept := l.active[:0]
	for _, t := range l.active {
		if t.remaining <= 1e-6 {
			s.heap.push(event{at: s.now + s.linkBase, kind: evDecodeAdd, replica: -4, req: t.rs})
			continue
		}
		kept = append(kept, t)
	}
	clear(l.active[len(kept):])
	l.active = kept
	s.scheduleLink(i, l)
}

// dispatchPrefill sends rs's prefill to its prefill replica; false when
// the engine refused it (the request then prefills locally).
func (s *sim) dispatchPrefill(g int, rs *reqState, d gateway.Decision) bool {
	rec := s.records.at(rs.rec)
	rep := s.reps[d.Prefill]
	err := rep.eng.Add(s.now, engine.Request{
		ID:           engine.RequestID(rs.w.ID | prefillBit),
		PromptTokens: rec.PromptTokens,
		OutputTokens: 1,
		MaxTokens:    1,
		BlockHashes:  rs.hashes[:min(len(rs.hashes), rec.PromptTokens/s.cfg.Engine.BlockSize)],
	})
	if err != nil {
		s.decided(g, s.gws[g].core.PrefillFailed(s.now, d.Ticket, false))
		return false
	}
	rs.prefill = d.Prefill
	rs.decode = d.Replica
	rs.transferTokens = rec.PromptTokens - d.PredictedCachedTokens
	rec.Remote, rec.PrefillReplica = true, d.Prefill
	// The prompt is computed there: the prediction to check is that replica's.
	rec.PredictedCachedTokens = d.PrefillCachedTokens
	s.kick(d.Prefill)
	return true
}

// prefilled handles the end of rs's prefill: its first (and only) token.
func (s *sim) prefilled(rs *reqState, em *engine.Emission) {
	rec := s.records.at(rs.rec)
	// The compute the cache saved was on the prefill replica.
	rec.CachedTokens = em.CachedTokens
	s.decided(rs.gateway, s.gws[rs.gateway].core.PrefillDone(s.now, rs.ticket))
	rs.xferStart = s.now
	bytes := float64(rs.transferTokens) * s.cfg.Engine.KVBytesPerToken
	s.transferredBytes += bytes
	s.startTransfer(rs, bytes)
}

// decodeAdd adds rs, whose KV has arrived, to its decode replica.
func (s *sim) decodeAdd(rs *reqState) {
	rec := s.records.at(rs.rec)
	if rs.measured {
		s.xfer.Add(s.now - rs.xferStart)
	}
	rec.Transfer = s.now - rs.xferStart
	s.addDecode(rs, rs.decode, true)
}

// pdSummary is the run's P/D summary (nil without prefill replicas).
func (s *sim) pdSummary(sum *results.Summary) *results.PDSummary {
	c := &s.cfg
	if c.PrefillReplicas == 0 {
		return nil
	}
	p := &results.PDSummary{
		PrefillReplicas: c.PrefillReplicas, DecodeReplicas: c.DecodeReplicas,
		BothReplicas: c.Replicas - c.PrefillReplicas - c.DecodeReplicas,
		TransferMs:   results.LatencyOfHistogram(s.xfer),
	}
	for _, g := range s.gws {
		st := g.core.PDStats()
		p.Remote += st.Remote
		p.Local += st.Local
		p.Fallbacks += st.Failed
	}
	p.TransferredGB = float64(int64(s.transferredBytes/1e6)) / 1e3
	p.PrefillBusy = results.PoolBusy(sum, func(i int) bool { return c.role(i) == gateway.RolePrefill })
	p.DecodeBusy = results.PoolBusy(sum, func(i int) bool { return c.role(i) == gateway.RoleDecode })
	p.BothBusy = results.PoolBusy(sum, func(i int) bool { return c.role(i) == gateway.RoleBoth })
	return p
}

// tierSummary splits the engines' hits by tier (nil without lower tiers).
func tierSummary(e engine.Config, ms []engine.Metrics) *results.TierSummary {
	if !e.KVTiers.Enabled() {
		return nil
	}
	var prompt, gpu, cpu, disk int64
	var load time.Duration
	for _, m := range ms {
		prompt += m.PromptTokens
		gpu += m.PrefixCacheHits
		cpu += m.CPUHitTokens
		disk += m.DiskHitTokens
		load += m.KVLoadTime
	}
	return results.NewTierSummary(prompt, gpu, cpu, disk, load)
}
