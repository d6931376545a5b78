package traces

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"time"
)

// BailianBlockSize is the number of tokens each Qwen-Bailian hash id covers.
const BailianBlockSize = 16

// bailianLine is one line of a Qwen-Bailian trace.
type bailianLine struct {
	ChatID       json.RawMessage `json:"chat_id"`
	ParentChatID json.RawMessage `json:"parent_chat_id"`
	Timestamp    *float64        `json:"timestamp"`
	InputLength  *float64        `json:"input_length"`
	OutputLength *float64        `json:"output_length"`
	Turn         *float64        `json:"turn"`
	HashIDs      []uint64        `json:"hash_ids"`
}

// bailianChain is what the reader remembers of a chat: its chain's root and
// its depth below it.
type bailianChain struct {
	root  uint64
	depth int
}

// NewBailian reads a Qwen-Bailian trace (Alibaba's "KVCache in the wild"
// traces): JSON lines of chat_id, parent_chat_id (-1, null or absent for a
// first turn), timestamp (seconds), input_length, output_length, type, turn
// (1-based) and hash_ids (one per 16-token block, BlockSize 16; optional).
//
// Bailian's chat ids start at 0, which Record reserves for "none", so ids are
// shifted by one: ID is chat_id+1, Parent is parent_chat_id+1 (0 for a first
// turn), and Session is the chain's root chat_id+1, found by following the
// parent links seen so far; when a parent was not seen (a trace cut out of a
// longer one) the parent stands for the root. Turn is turn-1 (Record's turns
// count from 0), or the depth in the chain when the line has no turn. Arrival
// is the timestamp relative to the first record's. The type field is ignored.
//
// The reader remembers each chat's root: memory grows by a few tens of bytes
// per record (a few tens of MB for a million records).
func NewBailian(r io.Reader, name string, opts Options) Reader {
	c := &clock{unit: time.Second}
	chains := make(map[uint64]bailianChain)
	return newLineReader(r, name, opts, func(b []byte, n int) (Record, error) {
		var l bailianLine
		if err := json.Unmarshal(b, &l); err != nil {
			return Record{}, jsonBad(err)
		}
		if len(l.ChatID) == 0 || string(l.ChatID) == "null" {
			return Record{}, badf("missing chat_id")
		}
		chat, err := parseJSONUint("chat_id", l.ChatID)
		if err != nil {
			return Record{}, err
		}
		if chat == math.MaxUint64 {
			return Record{}, badf("chat_id %d too large", chat)
		}
		rec := Record{ID: chat + 1, Model: opts.Model}
		chain := bailianChain{root: chat}
		if p := bytes.TrimSpace(l.ParentChatID); len(p) > 0 && string(p) != "null" && string(p) != "-1" {
			parent, err := parseJSONUint("parent_chat_id", p)
			if err != nil {
				return Record{}, err
			}
			if parent == math.MaxUint64 {
				return Record{}, badf("parent_chat_id %d too large", parent)
			}
			rec.Parent = parent + 1
			chain = bailianChain{root: parent, depth: 1}
			if pc, ok := chains[parent]; ok {
				chain = bailianChain{root: pc.root, depth: pc.depth + 1}
			}
		}
		rec.Session = chain.root + 1
		rec.Turn = chain.depth
		if l.Turn != nil {
			t := *l.Turn
			if t < 1 || t > maxTokens || t != math.Trunc(t) {
				return Record{}, badf("turn %v is not a positive whole number", t)
			}
			rec.Turn = int(t) - 1
		}
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
			rec.BlockSize, rec.HashIDs = BailianBlockSize, l.HashIDs
			if err := checkBlocks(l.HashIDs, rec.InputTokens, BailianBlockSize); err != nil {
				return Record{}, err
			}
		}
		if err := rec.Validate(); err != nil {
			return Record{}, err
		}
		c.accept(*l.Timestamp)
		if _, seen := chains[chat]; !seen {
			chains[chat] = chain
		}
		return rec, nil
	})
}
