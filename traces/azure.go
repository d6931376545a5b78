package traces

import (
	"io"
	"strings"
	"time"
)

// azureLayouts are the timestamp layouts the Azure reader tries. Parsing
// accepts any number of fractional second digits after the seconds.
var azureLayouts = [...]string{
	"2006-01-02 15:04:05",
	"2006-01-02T15:04:05",
	"2006-01-02 15:04:05Z07:00",
	"2006-01-02T15:04:05Z07:00",
	"2006-01-02 15:04:05 Z07:00",
	"2006-01-02 15:04:05 -0700",
}

// parseAzureTime reads a timestamp such as "2023-11-16 18:17:03.9799600"
// (UTC unless it names a zone).
func parseAzureTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	for _, layout := range azureLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, badf("timestamp %q is not a date and time like 2023-11-16 18:17:03.9799600", s)
}

// NewAzure reads an Azure LLM inference trace (the 2023 and 2024 releases):
// CSV with a header naming TIMESTAMP, ContextTokens and GeneratedTokens
// (found by name, case-insensitively, in any order). Arrival is the timestamp
// relative to the first row's; rows must not arrive before it. ID is the
// row's line number (the header is line 1). The traces carry no prefix
// information: BlockSize 0, Session 0.
func NewAzure(r io.Reader, name string, opts Options) Reader {
	const (
		colTime   = "timestamp"
		colInput  = "contexttokens"
		colOutput = "generatedtokens"
	)
	var (
		base    time.Time
		baseSet bool
	)
	c := newCSVReader(r, name, opts, colTime, colInput, colOutput)
	c.parse = func(row []string, line int) (Record, error) {
		t, err := parseAzureTime(c.col(row, colTime))
		if err != nil {
			return Record{}, err
		}
		rec := Record{ID: uint64(line), Model: opts.Model}
		if rec.InputTokens, err = parseCount("ContextTokens", c.col(row, colInput)); err != nil {
			return Record{}, err
		}
		if rec.OutputTokens, err = parseCount("GeneratedTokens", c.col(row, colOutput)); err != nil {
			return Record{}, err
		}
		if baseSet {
			d := t.Sub(base)
			if d.Seconds() > maxArrivalSeconds || d.Seconds() < -maxArrivalSeconds {
				return Record{}, badf("timestamp %v is absurdly far from the first row's (%v)", t, base)
			}
			rec.Arrival = d
		}
		if err := rec.Validate(); err != nil {
			return Record{}, err
		}
		if !baseSet {
			base, baseSet = t, true
		}
		return rec, nil
	}
	return c
}
