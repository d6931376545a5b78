package traces

import (
	"encoding/json"
	"io"
	"strconv"
	"time"
)

// MooncakeBlockSize is the number of tokens each Mooncake hash id covers.
const MooncakeBlockSize = 512

// mooncakeLine is one line of a Mooncake trace.
type mooncakeLine struct {
	ID           json.RawMessage `json:"id"`
	Timestamp    *float64        `json:"timestamp"`
	InputLength  *float64        `json:"input_length"`
	OutputLength *float64        `json:"output_length"`
	HashIDs      []uint64        `json:"hash_ids"`
}

// NewMooncake reads a Mooncake trace (FAST'25: the conversation, tool&agent
// and arXiv traces share the schema): JSON lines of
//
//	{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}
//
// Arrival is the timestamp relative to the first record's; records must not
// arrive before it. HashIDs are taken as given, one per 512-token block
// (BlockSize 512), and must number ceil(input_length/512); a line without
// hash_ids has no block identity (BlockSize 0). ID is the line number, or the
// line's "id" when it has one (a non-negative integer, or a string, which is
// hashed with FNV-1a). Blank lines are ignored.
func NewMooncake(r io.Reader, name string, opts Options) Reader {
	c := &clock{unit: time.Millisecond}
	return newLineReader(r, name, opts, func(b []byte, n int) (Record, error) {
		var l mooncakeLine
		if err := json.Unmarshal(b, &l); err != nil {
			return Record{}, jsonBad(err)
		}
		rec := Record{ID: uint64(n), Model: opts.Model}
		if len(l.ID) > 0 && string(l.ID) != "null" {
			id, err := parseAnyID("id", l.ID)
			if err != nil {
				return Record{}, err
			}
			rec.ID = id
		}
		var err error
		if rec.InputTokens, err = tokenCount("input_length", l.InputLength); err != nil {
			return Record{}, err
		}
		if rec.OutputTokens, err = tokenCount("output_length", l.OutputLength); err != nil {
			return Record{}, err
		}
		if rec.Arrival, err = c.arrival("timestamp", l.Timestamp); err != nil {
			return Record{}, err
		}
		if l.HashIDs != nil {
			rec.BlockSize, rec.HashIDs = MooncakeBlockSize, l.HashIDs
			if err := checkBlocks(l.HashIDs, rec.InputTokens, MooncakeBlockSize); err != nil {
				return Record{}, err
			}
		}
		if err := rec.Validate(); err != nil {
			return Record{}, err
		}
		c.accept(*l.Timestamp)
		return rec, nil
	})
}

// parseAnyID reads an id that is a non-negative JSON integer or a string:
// a string of digits is that number, any other string its FNV-1a hash.
func parseAnyID(field string, raw json.RawMessage) (uint64, error) {
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, jsonBad(err)
		}
		if n, err := strconv.ParseUint(s, 10, 64); err == nil {
			return n, nil
		}
		return hashString(s), nil
	}
	return parseJSONUint(field, raw)
}
