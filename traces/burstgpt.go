package traces

import (
	"io"
	"strings"
	"time"
)

// NewBurstGPT reads a BurstGPT trace: CSV whose header names, in either of
// the published schemas,
//
//	Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
//	Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
//
// Columns are found by name (case, spaces and underscores ignored); only
// Timestamp, Request tokens and Response tokens are required. Timestamp is in
// seconds; Arrival is relative to the first row's. Session is the FNV-1a
// hash of Session ID (0 when absent or empty); Model is the row's model, or
// Options.Model when the row names none. ID is the row's line number (the
// header is line 1). Elapsed time, Total tokens and Log Type are ignored.
//
// Rows whose response failed (Response tokens 0) are kept with
// OutputTokens 0: they still cost a prefill. Rows with Request tokens 0 are
// bad records (Record.Validate wants a prompt).
func NewBurstGPT(r io.Reader, name string, opts Options) Reader {
	const (
		colTime    = "timestamp"
		colInput   = "requesttokens"
		colOutput  = "responsetokens"
		colSession = "sessionid"
		colModel   = "model"
	)
	clk := &clock{unit: time.Second}
	c := newCSVReader(r, name, opts, colTime, colInput, colOutput)
	c.parse = func(row []string, line int) (Record, error) {
		ts, err := parseSeconds("Timestamp", c.col(row, colTime))
		if err != nil {
			return Record{}, err
		}
		rec := Record{ID: uint64(line), Model: strings.TrimSpace(c.col(row, colModel))}
		if rec.Model == "" {
			rec.Model = opts.Model
		}
		if s := strings.TrimSpace(c.col(row, colSession)); s != "" {
			rec.Session = hashString(s)
		}
		if rec.InputTokens, err = parseCount("Request tokens", c.col(row, colInput)); err != nil {
			return Record{}, err
		}
		if rec.OutputTokens, err = parseCount("Response tokens", c.col(row, colOutput)); err != nil {
			return Record{}, err
		}
		if rec.Arrival, err = clk.arrival("Timestamp", &ts); err != nil {
			return Record{}, err
		}
		if err := rec.Validate(); err != nil {
			return Record{}, err
		}
		clk.accept(ts)
		return rec, nil
	}
	return c
}
