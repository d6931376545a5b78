package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferrail/inferrail/engine/simtok"
	"github.com/inferrail/inferrail/internal/openai"
	"github.com/inferrail/inferrail/internal/timeheap"
	"github.com/inferrail/inferrail/results"
	"github.com/inferrail/inferrail/workload"
)

// Endpoint selects the API the requests use.
type Endpoint string

// The endpoints.
const (
	Completions     Endpoint = "completions"
	ChatCompletions Endpoint = "chat"
)

// Config is one benchmark run.
type Config struct {
	// BaseURL is the server, e.g. http://127.0.0.1:8000, or several
	// separated by commas, taken in turn by request id (to load a fleet
	// directly, without a gateway).
	BaseURL string
	// Model is the model field of every request ("" leaves it out: the
	// server's default).
	Model string
	// APIKey, when set, is sent as Authorization: Bearer (an inferrail
	// gateway with auth: keys, or any OpenAI-compatible server).
	APIKey string
	// Header is sent with every request, after bench's own headers, which a
	// name here replaces (X-Request-Id, say); ParseHeader reads one from
	// "Name: value". Content-Type, Content-Length, Host and
	// Transfer-Encoding are bench's and refused, as is Authorization when
	// APIKey is set (two keys).
	Header http.Header
	// Endpoint is completions (prompt text) or chat (one user message).
	Endpoint Endpoint
	// Source yields the requests and their arrival times.
	Source workload.Source
	// Warmup leaves requests scheduled before it out of the summary.
	Warmup time.Duration
	// SLO for attainment and goodput.
	SLO results.SLO
	// Timeout bounds each request (default 10 minutes).
	Timeout time.Duration
	// Client sends the requests (default: a pooled keep-alive client).
	Client *http.Client
	// Progress, if set, is called after each request ends.
	Progress func(done int)
	// Lookahead is how many upcoming requests are rendered ahead of their
	// time (default 64), so rendering never delays a send.
	Lookahead int
	// PreciseWindow is how long before each send the dispatcher stops
	// waiting on Go's timers, which wake up to a millisecond late when
	// nothing else wakes the process, and sleeps in the kernel to the send
	// time instead: on Linux within about 60 µs (median) of it, with no CPU
	// spent meanwhile (default 1 ms; negative: never, as under
	// testing/synctest, where time only moves while all goroutines sleep).
	// It once yielded in a loop instead, which sent on time to within
	// microseconds but took a core from the server under test when both
	// share a machine.
	PreciseWindow time.Duration
	// CloseAtDone closes a stream's response as soon as data: [DONE]
	// arrives, as the OpenAI SDKs do: a server that sends the chunked
	// encoding's end in a later write (vLLM's, nginx relaying a stream)
	// then loses the connection, and the next request opens another. By
	// default a response is read past [DONE] to its end (openai.ReadEnd:
	// 64 KiB and openai.DoneGrace at most), so the connection is kept, as
	// clients that read a stream to its end do (vLLM's benchmark client
	// among them), and no request's time to first token includes a
	// connection's set-up that the simulator does not model.
	CloseAtDone bool
}

// Output is what a run measured.
type Output struct {
	// Summary is the simulator's summary of Records, but for the
	// predictions: Summary.PredictedHitRate and Summary.Prediction cover
	// only the requests whose answer carried a prediction (Predictions), and
	// are zero when none did. Summary.HitRate is 0 when the server reported
	// no cached tokens at all (HitRateKnown says which).
	Summary results.Summary
	Records []results.Record
	// Predictions is the router's cached-token predictions
	// (x-inferrail-predicted-cached-tokens, which inferrail live sends with
	// predicted_cached_header or to a request with its own cache_salt)
	// against what the engines found, over the measured completed requests
	// whose answer carried one.
	Predictions Predictions
	// CachedReported counts the measured completed requests whose usage
	// carried prompt_tokens_details.cached_tokens (vLLM sends it only with
	// --enable-prompt-tokens-details), of Summary.Completed.
	CachedReported int
	// SendLag is the delay from each request's schedule to the moment its
	// body was written, over every request, in milliseconds.
	SendLag results.Latency
	// Errors counts failed requests by reason (never nil): "http 500",
	// "timeout", "connection closed", "stream error: TYPE", ... Like the
	// send lag it covers every request, warmup included; ErrorExamples holds
	// the first message seen for each reason that came with one (the
	// server's error message, the transport's error).
	Errors        map[string]int
	ErrorExamples map[string]string
	WallS         float64
}

// Predictions compares predicted with found cached tokens over the measured
// completed requests whose answer carried a prediction.
type Predictions struct {
	// Requests is how many answers carried the header (0: no predictions,
	// and every other field is zero).
	Requests int `json:"requests"`
	// PredictedHitRate and HitRate are the predicted and the found cached
	// tokens over the prompt tokens of these requests.
	PredictedHitRate float64 `json:"predicted_hit_rate"`
	HitRate          float64 `json:"hit_rate"`
	results.Prediction
}

// HitRateKnown reports whether the server said what it found cached: at
// least one answer's usage carried prompt_tokens_details.cached_tokens.
func (o *Output) HitRateKnown() bool { return o.CachedReported > 0 }

func (c *Config) validate() error {
	var errs []error
	for _, u := range strings.Split(c.BaseURL, ",") {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			errs = append(errs, fmt.Errorf("base URL %q: must start with http:// or https://", u))
		}
	}
	switch c.Endpoint {
	case "":
		c.Endpoint = Completions
	case Completions, ChatCompletions:
	default:
		errs = append(errs, fmt.Errorf("endpoint %q: must be %s or %s", c.Endpoint, Completions, ChatCompletions))
	}
	if c.Source == nil {
		errs = append(errs, errors.New("no request source"))
	}
	if c.Timeout < 0 || c.Warmup < 0 || c.Lookahead < 0 {
		errs = append(errs, errors.New("timeout, warmup and lookahead must not be negative"))
	}
	if err := checkHeader(c.Header, c.APIKey != ""); err != nil {
		errs = append(errs, err)
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Minute
	}
	if c.Lookahead == 0 {
		c.Lookahead = 64
	}
	if c.PreciseWindow == 0 {
		c.PreciseWindow = time.Millisecond
	}
	if c.PreciseWindow < 0 {
		c.PreciseWindow = 0
	}
	if c.Client == nil {
		c.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConns: 0, MaxIdleConnsPerHost: 10000, IdleConnTimeout: 90 * time.Second,
			DisableCompression: true,
		}}
	}
	return errors.Join(errs...)
}

// pending is a request waiting for its time.
type pending struct {
	w    *workload.Request
	body []byte // rendered when it enters the lookahead window
}

// queue is the send schedule: pending requests by arrival, then by the
// order they were queued.
type queue = timeheap.Heap[*pending]

// result is one finished request, reported to the dispatcher.
type result struct {
	w    *workload.Request
	rec  results.Record
	text []byte // generated text, for later turns that quote it
	lag  time.Duration
	itl  []time.Duration
	err  string
	// detail is what the server or the transport said about err, if
	// anything.
	detail string
	// predicted: the answer carried x-inferrail-predicted-cached-tokens
	// (in rec.PredictedCachedTokens).
	predicted bool
	// cachedReported: the answer's usage carried
	// prompt_tokens_details.cached_tokens.
	cachedReported bool
}

// runner owns the schedule. Only its dispatch goroutine touches the source
// and the text store.
type runner struct {
	cfg   Config
	tok   *simtok.Tokenizer
	start time.Time
	// answers holds generated text by the output segment it stands for, so
	// a follow-up turn quotes what the server really wrote.
	answers map[uint64][]byte
	bases   []string
}

// ErrConfig marks Run's refusals of its Config (a base URL that is not
// http or https, an unknown endpoint, a bad header): the caller's input,
// found before any request is sent.
var ErrConfig = errors.New("bench: invalid configuration")

// configError is a refusal of the Config: its message is the reasons alone,
// and it is ErrConfig.
type configError struct{ err error }

func (e configError) Error() string   { return "bench: " + e.err.Error() }
func (e configError) Unwrap() []error { return []error{ErrConfig, e.err} }

// Run sends every request of cfg.Source on its schedule and measures them.
func Run(ctx context.Context, cfg Config) (*Output, error) {
	if err := cfg.validate(); err != nil {
		return nil, configError{err}
	}
	r := &runner{cfg: cfg, tok: simtok.New(), answers: make(map[uint64][]byte)}
	for _, u := range strings.Split(cfg.BaseURL, ",") {
		r.bases = append(r.bases, strings.TrimRight(u, "/"))
	}
	return r.run(ctx)
}

func (r *runner) run(ctx context.Context) (*Output, error) {
	var q queue
	sourceDone := false
	pull := func() {
		for !sourceDone && q.Len() < r.cfg.Lookahead {
			w, ok := r.cfg.Source.Next()
			if !ok {
				sourceDone = true
				return
			}
			r.push(&q, w)
		}
	}
	finished := make(chan result, 1024)
	var wg sync.WaitGroup
	inFlight := 0
	var recs, predicted []results.Record // predicted: answers with a prediction
	var lags []time.Duration
	itl := results.NewHistogram()
	errs := map[string]int{}
	examples := map[string]string{}
	cachedReported := 0
	done := 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	r.start = time.Now()
	finish := func(res result) {
		inFlight--
		done++
		if res.err != "" {
			errs[res.err]++
			if _, seen := examples[res.err]; !seen && res.detail != "" {
				examples[res.err] = res.detail
			}
		}
		lags = append(lags, res.lag)
		if res.w.Arrival >= r.cfg.Warmup {
			for _, d := range res.itl {
				itl.Add(d)
			}
		}
		recs = append(recs, res.rec)
		ok := res.rec.Outcome == results.OutcomeOK
		if ok && res.predicted {
			predicted = append(predicted, res.rec)
		}
		if ok && res.cachedReported && res.w.Arrival >= r.cfg.Warmup {
			cachedReported++
		}
		if ok && res.text != nil && res.w.Output.Len > 0 {
			r.answers[res.w.Output.ID] = res.text
		}
		if next, more := r.cfg.Source.Done(res.w, time.Since(r.start), ok); more {
			r.push(&q, next)
		}
		if r.cfg.Progress != nil {
			r.cfg.Progress(done)
		}
	}
	for {
		pull()
		if q.Len() == 0 {
			if inFlight == 0 {
				break
			}
			select {
			case res := <-finished:
				finish(res)
			case <-ctx.Done():
				wg.Wait()
				return nil, ctx.Err()
			}
			continue
		}
		p := q.Peek(0)
		if p.body == nil {
			p.body = r.render(p.w)
		}
		// Wait on a timer until just before the send time, processing
		// answers meanwhile, then sleep in the kernel to it: Go's timer
		// wake-ups are late by up to a millisecond.
		wait := p.w.Arrival - time.Since(r.start) - r.cfg.PreciseWindow
		if wait > 0 {
			timer.Reset(wait)
			select {
			case res := <-finished:
				timer.Stop()
				finish(res)
				continue
			case <-timer.C:
			case <-ctx.Done():
				wg.Wait()
				return nil, ctx.Err()
			}
		}
		if r.cfg.PreciseWindow > 0 {
			sleepFor(func() time.Duration { return p.w.Arrival - time.Since(r.start) })
		}
		q.Pop()
		inFlight++
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := r.send(ctx, p)
			if res.rec.Outcome == results.OutcomeFailed && res.rec.Fail == "" {
				res.rec.Fail = res.err // the summary's failures by reason say what bench saw
			}
			finished <- res
		}()
		runtime.Gosched() // let the sender go before rendering more
		// Render the next few now, while there is time.
		for i := 0; i < min(q.Len(), 4); i++ {
			if n := q.Peek(i); n.body == nil {
				n.body = r.render(n.w)
			}
		}
	}
	wg.Wait()
	wall := time.Since(r.start)
	slices.SortFunc(recs, func(a, b results.Record) int { return int(a.ID) - int(b.ID) })
	sum := results.Summarize(recs, results.SummaryOptions{
		Warmup:       r.cfg.Warmup,
		SLO:          r.cfg.SLO,
		Replicas:     []results.ReplicaInfo{{Name: r.cfg.BaseURL}},
		ITL:          itl,
		SimulatedEnd: wall,
	})
	sum.SimWallS = wall.Seconds()
	// A request without a prediction has PredictedCachedTokens 0, which is
	// no prediction of 0: the predictions are summarised over the requests
	// that carried one, and nothing stands in for the others.
	pred := results.Summarize(predicted, results.SummaryOptions{Warmup: r.cfg.Warmup, SLO: r.cfg.SLO})
	sum.PredictedHitRate, sum.Prediction = pred.PredictedHitRate, pred.Prediction
	return &Output{
		Summary: sum, Records: recs,
		Predictions: Predictions{
			Requests: pred.Completed, PredictedHitRate: pred.PredictedHitRate,
			HitRate: pred.HitRate, Prediction: pred.Prediction,
		},
		CachedReported: cachedReported,
		SendLag:        lagLatency(lags), Errors: errs, ErrorExamples: examples, WallS: wall.Seconds(),
	}, nil
}

func (r *runner) push(q *queue, w *workload.Request) { q.Push(w.Arrival, &pending{w: w}) }

// The headers of inferrail live (package live) that bench speaks.
const (
	headerPriority = "X-Inferrail-Priority"
	headerQueuedMs = "X-Inferrail-Queued-Ms"
	// HeaderPredicted is live.HeaderPredicted: the prompt tokens the router
	// expected the engine to find cached.
	HeaderPredicted = "X-Inferrail-Predicted-Cached-Tokens"
)

// gatewayReject returns the reason a gateway refused a request (429 or 503
// with OpenAI's error shape and a known code), or "".
func gatewayReject(status int, body []byte) string {
	if status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable {
		return ""
	}
	e, err := openai.ParseResponse(body)
	if err != nil || e.Kind != openai.KindError {
		return ""
	}
	code, _ := e.Error.Code.Text()
	switch code {
	case results.RejectQueueFull, results.RejectQueueTimeout, results.RejectSLOShed, "no_capacity":
		return code
	case "no_replica_available":
		return results.RejectNoReplica
	}
	return ""
}

// render builds the request body: the prompt's segments as text (answers
// the server already wrote stand in for their segments).
func (r *runner) render(w *workload.Request) []byte {
	var text []byte
	for _, s := range w.Prompt {
		if a, ok := r.answers[s.ID]; ok {
			text = append(text, a...)
			continue
		}
		text = r.tok.AppendSegmentText(text, s)
	}
	body := map[string]any{
		"max_tokens":     w.OutputTokens,
		"ignore_eos":     true,
		"temperature":    0,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if r.cfg.Model != "" {
		body["model"] = r.cfg.Model
	}
	if w.Tenant != "" {
		body["user"] = w.Tenant // a gateway's fairness flow
	}
	if r.cfg.Endpoint == ChatCompletions {
		body["messages"] = []map[string]any{{"role": "user", "content": string(text)}}
	} else {
		body["prompt"] = string(text)
	}
	b, _ := json.Marshal(body)
	return b
}

// readStream reads a response stream, timing every event that carried
// generated text (visible or reasoning) from the request's schedule, and
// fills rec's first token, token counts and res's inter-token gaps. It
// returns the visible text, when the last token came, and why the stream
// failed ("" if it did not): an error event, an unreadable event, the
// connection's end before data: [DONE].
func (r *runner) readStream(body io.Reader, scheduled time.Time, rec *results.Record, res *result) (text []byte, last time.Time, reason string) {
	var sr openai.Reader
	buf := make([]byte, 16<<10)
	done := false
	var doneAt time.Time
	take := func(evs []openai.Event, now time.Time) {
		for i := range evs {
			e := &evs[i]
			switch e.Kind {
			case openai.KindDone:
				done, doneAt = true, now
				continue
			case openai.KindError:
				if reason == "" {
					reason = "stream error"
					if e.Error.Type != "" {
						reason += ": " + e.Error.Type
					}
					res.detail = excerpt(e.Error.Message)
				}
				continue
			}
			if e.HasUsage {
				rec.PromptTokens = e.Usage.PromptTokens
				rec.OutputTokens = e.Usage.CompletionTokens
				rec.CachedTokens = max(e.Usage.CachedTokens, 0)
				res.cachedReported = e.Usage.CachedTokens >= 0
			}
			if !e.Generated() {
				continue // a role-only, finish-only or usage-only chunk
			}
			if !rec.HasFirstToken {
				rec.HasFirstToken = true
				rec.FirstToken = rec.Arrival + now.Sub(scheduled)
			} else {
				res.itl = append(res.itl, now.Sub(last))
			}
			last = now
			text = append(text, e.Text...)
		}
	}
	for !done && reason == "" {
		n, err := body.Read(buf)
		now := time.Now()
		if n > 0 {
			evs, perr := sr.Feed(buf[:n], now.Sub(scheduled))
			take(evs, now)
			if perr != nil && reason == "" {
				reason = streamFault(perr)
			}
		}
		if err == io.EOF {
			evs, perr := sr.End(now.Sub(scheduled))
			take(evs, now)
			if perr != nil && reason == "" {
				reason = streamFault(perr)
			}
			break
		}
		if err != nil {
			if reason == "" {
				reason = classify(err)
				res.detail = r.transportDetail(reason, err)
			}
			break
		}
	}
	if reason == "" && !done {
		reason = "stream ended early"
	}
	if last.IsZero() {
		last = doneAt // no token at all: the request ended with the stream
	}
	return text, last, reason
}

// streamFault names what was wrong with an event.
func streamFault(err error) string {
	if errors.Is(err, openai.ErrTooLong) {
		return "stream event too long"
	}
	return "bad stream event"
}

// send runs one request; every time is measured from its schedule.
func (r *runner) send(ctx context.Context, p *pending) result {
	w := p.w
	rec := results.Record{
		ID: w.ID, Session: w.Session, Turn: w.Turn, Replica: 0,
		Arrival: w.Arrival, PromptTokens: promptLen(w), Outcome: results.OutcomeFailed,
	}
	res := result{w: w}
	scheduled := r.start.Add(w.Arrival)
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	path := "/v1/completions"
	if r.cfg.Endpoint == ChatCompletions {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.bases[w.ID%uint64(len(r.bases))]+path, bytes.NewReader(p.body))
	if err != nil {
		res.err = "request: " + err.Error()
		res.rec = rec
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", fmt.Sprintf("bench-%d", w.ID))
	if r.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.APIKey)
	}
	if w.Priority > 0 {
		req.Header.Set(headerPriority, strconv.Itoa(w.Priority))
	}
	for name, vs := range r.cfg.Header {
		req.Header[name] = vs // canonical names, checked by validate
	}
	sent := time.Now()
	res.lag = sent.Sub(scheduled)
	resp, err := r.cfg.Client.Do(req)
	rec.Dispatch = w.Arrival + sent.Sub(scheduled)
	if err != nil {
		res.err = classify(err)
		res.detail = r.transportDetail(res.err, err)
		res.rec = rec
		return res
	}
	defer resp.Body.Close()
	// A gateway that queued the request says for how long: the request was
	// dispatched that much later than it was sent.
	if q, err := strconv.ParseFloat(resp.Header.Get(headerQueuedMs), 64); err == nil && q > 0 {
		rec.Dispatch += time.Duration(q * float64(time.Millisecond))
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		res.err = fmt.Sprintf("http %d", resp.StatusCode)
		res.detail = errorMessage(b)
		if reason := gatewayReject(resp.StatusCode, b); reason != "" {
			rec.Outcome, rec.Reject, rec.Replica = results.OutcomeRejected, reason, -1
		}
		res.rec = rec
		return res
	}
	// The router's prediction, if the gateway names it; a value that is no
	// count is no prediction.
	if v, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get(HeaderPredicted))); err == nil && v >= 0 {
		rec.PredictedCachedTokens, res.predicted = v, true
	}
	text, last, reason := r.readStream(resp.Body, scheduled, &rec, &res)
	if res.err == "" {
		res.err = reason
	}
	if !r.cfg.CloseAtDone && reason == "" {
		// The answer is whole; what follows [DONE] is only the response's
		// end, and a failure to read it fails nothing.
		openai.ReadEnd(resp.Body, cancel)
	}
	if res.err == "" {
		rec.Outcome = results.OutcomeOK
		rec.End = w.Arrival + last.Sub(scheduled)
		if rec.OutputTokens == 0 {
			rec.OutputTokens = r.tok.CountTokens(string(text))
		}
		res.text = text
	}
	res.rec = rec
	return res
}

func promptLen(w *workload.Request) int {
	n := 0
	for _, s := range w.Prompt {
		n += s.Len
	}
	return n
}

func classify(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "connection closed"
	}
	s := err.Error()
	switch {
	case strings.Contains(s, "connection refused"):
		return "connection refused"
	case strings.Contains(s, "connection reset"):
		return "connection reset"
	}
	return "transport error"
}

// transportDetail says what went wrong with a request that failed for
// reason, err.
func (r *runner) transportDetail(reason string, err error) string {
	if reason == "timeout" {
		return fmt.Sprintf("no whole answer within the timeout (%v)", r.cfg.Timeout)
	}
	return excerpt(err.Error())
}

// errorMessage is an error response's message: OpenAI's error body's, else
// the body's text.
func errorMessage(body []byte) string {
	if e, err := openai.ParseResponse(body); err == nil && e.Kind == openai.KindError && e.Error != nil && e.Error.Message != "" {
		return excerpt(e.Error.Message)
	}
	return excerpt(string(body))
}

// excerpt is s on one line, at most 200 bytes of it.
func excerpt(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "..."
	}
	return s
}

// lagLatency summarises send lags in milliseconds.
func lagLatency(ds []time.Duration) results.Latency {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = float64(d) / 1e6
	}
	return results.LatencyOf(ms)
}
