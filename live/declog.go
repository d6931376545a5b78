package live

import (
	"encoding/json"
	"io"
	"sync"
	"time"

	"github.com/inferrail/inferrail/router/gateway"
)

// DecisionSink receives the decision log, one JSON object per line.
type DecisionSink = io.Writer

// decisionEntry is one logged decision. Prompts are never logged.
type decisionEntry struct {
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id"`
	Model     string    `json:"model"`
	Policy    string    `json:"policy"`
	Replica   string    `json:"replica"`
	Tokenized bool      `json:"tokenized"`
	Prompt    int       `json:"prompt_tokens"`
	Predicted int       `json:"predicted_cached_tokens"`
	InFlight  int       `json:"replica_in_flight"`
	// QueuedMs is the time the request waited in the queue so far;
	// ReservedBlocks the KV blocks admission reserved for it.
	QueuedMs       float64 `json:"queued_ms"`
	ReservedBlocks int     `json:"reserved_blocks"`
	DecisionUs     float64 `json:"decision_us"`
	// PrefillReplica is the prefill replica of a request disaggregated
	// (P/D): Replica decodes it.
	PrefillReplica string `json:"prefill_replica,omitempty"`
	// With a shadow policy (shadow_policy): its name, its pick, whether it
	// is the replica the request went to, and cost_model's estimates of
	// the time to first token on the real pick and on the shadow's.
	ShadowPolicy          string   `json:"shadow_policy,omitempty"`
	ShadowReplica         string   `json:"shadow_replica,omitempty"`
	ShadowAgree           *bool    `json:"shadow_agree,omitempty"`
	EstimatedTTFTMs       *float64 `json:"estimated_ttft_ms,omitempty"`
	ShadowEstimatedTTFTMs *float64 `json:"shadow_estimated_ttft_ms,omitempty"`
}

// decisionLog writes sampled decisions off the request path: entries go to
// a bounded queue and are dropped (and counted) when the writer is behind.
type decisionLog struct {
	sink   DecisionSink
	sample uint64 // decisions with hash < sample are logged
	queue  chan decisionEntry
	wg     sync.WaitGroup
	onDrop func()
}

func newDecisionLog(sink DecisionSink, sample float64, buffer int, onDrop func()) *decisionLog {
	if sink == nil || sample <= 0 {
		return nil
	}
	l := &decisionLog{sink: sink, queue: make(chan decisionEntry, max(buffer, 1)), onDrop: onDrop}
	if sample >= 1 {
		l.sample = ^uint64(0)
	} else {
		l.sample = uint64(sample * float64(^uint64(0)))
	}
	l.wg.Add(1)
	go l.write()
	return l
}

func (l *decisionLog) write() {
	defer l.wg.Done()
	enc := json.NewEncoder(l.sink)
	for e := range l.queue {
		enc.Encode(e) // a failing sink loses entries, never requests
	}
}

func (l *decisionLog) close() {
	close(l.queue)
	l.wg.Wait()
}

// logDecision samples by request id, so a request's retries are all logged
// or all not.
func (s *Server) logDecision(reqID string, m *model, req *gateway.Request, a *attempt, took time.Duration) {
	l := s.declog
	if l == nil || sessionOf(reqID) > l.sample {
		return
	}
	e := decisionEntry{
		Time: time.Now().UTC(), RequestID: reqID, Model: m.name, Policy: m.policyName(), Replica: a.rep.name,
		Tokenized: req.BlockHashes != nil, Prompt: req.PromptTokens, Predicted: a.dec.PredictedCachedTokens,
		InFlight: m.inFlight(a.rep), QueuedMs: float64(a.queued) / 1e6, ReservedBlocks: a.dec.Weight, DecisionUs: float64(took) / 1e3,
	}
	if a.pre != nil {
		e.PrefillReplica = a.pre.name
	}
	if sh := a.dec.Shadow; sh.Policy != "" {
		agree, est, shEst := sh.Agree, sh.EstimatedTTFTMs, sh.ShadowEstimatedTTFTMs
		e.ShadowPolicy, e.ShadowReplica, e.ShadowAgree = sh.Policy, sh.Name, &agree
		e.EstimatedTTFTMs, e.ShadowEstimatedTTFTMs = &est, &shEst
	}
	select {
	case l.queue <- e:
	default:
		l.onDrop()
	}
}
