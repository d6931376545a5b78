package traces

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/internal/seed"
	"github.com/inferrail/inferrail/workload"
)

// ReplayOptions shape how a trace is replayed.
type ReplayOptions struct {
	// Speedup plays the trace this many times faster (arrival times are
	// divided by it); 0 means 1.
	Speedup float64
	// RateScale keeps a seeded random share of the requests (thinning) when
	// below 1; 0 means 1. Above 1 is refused: use Speedup to raise the rate.
	RateScale float64
	// Start and End select a window of the trace's own clock (before
	// Speedup); End 0 means the end of the trace. Kept arrivals are shifted
	// so the window starts at 0.
	Start, End time.Duration
	// Limit stops after this many requests (0: no limit).
	Limit int
	// Model, when set, is the model every request asks for (a simulated
	// fleet serves one model); empty keeps each record's own.
	Model string
	// MaxTokens is every request's max_tokens; 0 means each record's output
	// length (at least 1).
	MaxTokens int
	// Seed drives thinning and salts the segment ids of this replay.
	Seed uint64
}

// Validate checks the options once.
func (o *ReplayOptions) Validate() error {
	var errs []error
	if o.Speedup < 0 || math.IsNaN(o.Speedup) || math.IsInf(o.Speedup, 0) {
		errs = append(errs, fmt.Errorf("speedup: must be a positive factor, got %v", o.Speedup))
	}
	if o.RateScale < 0 || o.RateScale > 1 || math.IsNaN(o.RateScale) {
		errs = append(errs, fmt.Errorf("rate-scale: must be in (0, 1] (it keeps that share of the requests; use --speedup to raise the rate), got %v", o.RateScale))
	}
	if o.Start < 0 || (o.End != 0 && o.End <= o.Start) {
		errs = append(errs, fmt.Errorf("start/end: want 0 <= start < end, got %v and %v", o.Start, o.End))
	}
	if o.Limit < 0 || o.MaxTokens < 0 {
		errs = append(errs, fmt.Errorf("limit and max tokens: must not be negative, got %d and %d", o.Limit, o.MaxTokens))
	}
	return errors.Join(errs...)
}

// Source replays a trace as the simulator's open-loop request stream: it
// implements workload.Source. Block identity becomes segment chains (one
// segment per hash id, the last one as long as the prompt's remainder), so
// equal ids share KV blocks at any engine block size; prompts without block
// identity are one fresh segment; every output is a fresh segment.
type Source struct {
	r       Reader
	o       ReplayOptions
	rng     *rand.Rand
	nextID  uint64
	last    time.Duration
	salt    uint64
	err     error
	done    bool
	clamped int
	// rateLimited counts the recorded requests left out (OutcomeRateLimited).
	rateLimited int
	closer      io.Closer
}

// CloseAtEnd makes the source close c (the trace file) once it has read its
// last record.
func (s *Source) CloseAtEnd(c io.Closer) { s.closer = c }

func (s *Source) finish() {
	s.done = true
	if s.closer != nil {
		if err := s.closer.Close(); err != nil && s.err == nil {
			s.err = err
		}
		s.closer = nil
	}
}

var _ workload.Source = (*Source)(nil)

// NewSource replays r with o (validated).
func NewSource(r Reader, o ReplayOptions) (*Source, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Speedup == 0 {
		o.Speedup = 1
	}
	if o.RateScale == 0 {
		o.RateScale = 1
	}
	return &Source{
		r:    r,
		o:    o,
		rng:  seed.Rand(o.Seed, "traces/sample"),
		salt: o.Seed*0x9E3779B97F4A7C15 + 0x5EED,
	}, nil
}

// Err returns the error that ended the replay early, if any (a malformed
// record without SkipBad, an I/O error).
func (s *Source) Err() error { return s.err }

// OutcomeRateLimited is the Measured.Outcome of a recorded request that
// its tenant's rate limit refused at once (results.RejectRateLimited): live
// answers it with 429 before the gateway core, so a replay leaves it out.
const OutcomeRateLimited = "rate_limited"

// RateLimited counts the recorded requests left out because their tenant's
// rate limit refused them (OutcomeRateLimited).
func (s *Source) RateLimited() int { return s.rateLimited }

// Reordered counts records whose timestamp went backwards; they were
// replayed at the previous arrival time.
func (s *Source) Reordered() int { return s.clamped }

// Next returns the next request of the window, in arrival order.
func (s *Source) Next() (*workload.Request, bool) {
	for !s.done {
		if s.o.Limit > 0 && int(s.nextID) >= s.o.Limit {
			s.finish()
			break
		}
		rec, err := s.r.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.err = err
			}
			s.finish()
			break
		}
		if rec.Arrival < s.o.Start {
			continue
		}
		if s.o.End > 0 && rec.Arrival >= s.o.End {
			s.finish()
			break
		}
		if rec.Measured != nil && rec.Measured.Outcome == OutcomeRateLimited {
			s.rateLimited++ // refused before the gateway core: no load to replay
			continue
		}
		if s.o.RateScale < 1 && s.rng.Float64() >= s.o.RateScale {
			continue
		}
		return s.request(&rec), true
	}
	return nil, false
}

func (s *Source) request(rec *Record) *workload.Request {
	s.nextID++
	at := time.Duration(float64(rec.Arrival-s.o.Start) / s.o.Speedup)
	if at < s.last {
		at = s.last
		s.clamped++
	}
	s.last = at
	out := max(rec.OutputTokens, 1)
	req := &workload.Request{
		ID:           s.nextID,
		Arrival:      at,
		Model:        rec.Model,
		Session:      rec.Session,
		Turn:         rec.Turn,
		Priority:     rec.Priority,
		MaxTokens:    max(s.o.MaxTokens, out),
		OutputTokens: out,
		Output:       kvblock.Segment{ID: kvblock.Mix64(s.salt ^ (s.nextID<<1 | 1)), Len: out},
	}
	if s.o.Model != "" {
		req.Model = s.o.Model
	}
	if rec.BlockSize > 0 && len(rec.HashIDs) > 0 {
		req.Prompt = make([]kvblock.Segment, len(rec.HashIDs))
		left := rec.InputTokens
		for i, h := range rec.HashIDs {
			n := min(rec.BlockSize, left)
			req.Prompt[i] = kvblock.Segment{ID: kvblock.Mix64(s.salt + h*2), Len: n}
			left -= n
		}
	} else {
		req.Prompt = []kvblock.Segment{{ID: kvblock.Mix64(s.salt ^ (s.nextID << 1)), Len: rec.InputTokens}}
	}
	return req
}

// Done is part of workload.Source; a replay is open loop and causes nothing.
func (s *Source) Done(*workload.Request, time.Duration, bool) (*workload.Request, bool) {
	return nil, false
}

// TakesAhead is true: a replay's arrivals are the trace's, whatever happens
// to them (workload.TakesAhead).
func (s *Source) TakesAhead() bool { return true }
