package kvevents

import (
	"encoding/binary"
	"fmt"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
)

// Format selects how the events inside a batch are encoded. The batch itself
// is always the positional array [ts, events, data_parallel_rank].
type Format uint8

const (
	// FormatMap encodes each event as a map {"type": "BlockStored",
	// "block_hashes": ..., ...}: vLLM's encoding since PR #42892 (events are
	// tagged msgspec structs without array_like). It is the zero value and
	// the default because current vLLM and its consumers (Dynamo, llm-d)
	// expect it.
	FormatMap Format = iota
	// FormatArray encodes each event as a positional array with the tag
	// first, ["BlockStored", block_hashes, ...]: vLLM's encoding before PR
	// #42892, still read by older consumers.
	FormatArray
)

func (f Format) String() string {
	switch f {
	case FormatMap:
		return "map"
	case FormatArray:
		return "array"
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// ParseFormat parses "map" or "array".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "map", "":
		return FormatMap, nil
	case "array":
		return FormatArray, nil
	}
	return 0, fmt.Errorf("kvevents: unknown event format %q: use \"map\" (vLLM since PR #42892) or \"array\" (older vLLM)", s)
}

// BlockHash is one block hash as it travels on the wire. vLLM sends an int
// (the low 64 bits of the digest, big-endian) by default, or the digest bytes
// when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
type BlockHash struct {
	// V is the hash as a 64-bit integer: the int that was sent, or the last
	// 8 bytes of Raw read big-endian. Negative int64 values are kept as their
	// two's-complement bit pattern.
	V uint64
	// Raw holds the digest bytes when the hash travels as msgpack bytes; ""
	// means it travels as an int.
	Raw string
}

// IntHash is a hash sent as an unsigned 64-bit msgpack int.
func IntHash(v uint64) BlockHash { return BlockHash{V: v} }

// BytesHash is a hash sent as msgpack bytes. Its V is the last 8 bytes of b
// big-endian (fewer bytes are zero-extended on the left).
func BytesHash(b []byte) BlockHash {
	return BlockHash{V: tailUint64(b), Raw: string(b)}
}

// EngineHash is how this package sends the engine's 128-bit block hash: its
// low half, Hash.Lo, as an unsigned 64-bit int. That is what vLLM sends for a
// digest whose last 8 bytes are Lo.
func EngineHash(h kvblock.Hash) BlockHash { return IntHash(h.Lo) }

func tailUint64(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// Event is one vLLM KV cache event. Kind says which of vLLM's structs it is,
// and only that struct's fields travel:
//
//	BlockStored:      BlockHashes, ParentBlockHash, TokenIDs, BlockSize, LoRAID,
//	                  Medium, LoRAName, ExtraKeys, GroupIdx, KVCacheSpecKind,
//	                  KVCacheSpecSlidingWindow, Locality
//	BlockRemoved:     BlockHashes, Medium, GroupIdx, Locality
//	AllBlocksCleared: none
//
// Encoding an event with a field set that its kind does not carry is an
// error. A nil pointer, a nil ExtraKeys and an empty string stand for None.
type Event struct {
	Kind engine.KVEventKind
	// BlockHashes are the blocks stored or removed, in prefix order.
	BlockHashes []BlockHash
	// ParentBlockHash is the block before the first stored one; nil for a
	// prefix that starts at the first block. vLLM sends None for that, and
	// llm-d-inference-sim the int 0, so a zero hash (the int 0, or empty or
	// all-zero bytes) means no parent too: DecodeBatch reads it as nil and
	// EncodeBatch sends it as None.
	ParentBlockHash *BlockHash
	// TokenIDs are the tokens of all stored blocks concatenated (vLLM sends
	// block_size*len(block_hashes) of them). Nil encodes as an empty list.
	TokenIDs  []uint32
	BlockSize int
	// LoRAID is deprecated in vLLM in favour of LoRAName but still sent.
	LoRAID *int
	// Medium is where the blocks live: "GPU", "CPU", ...
	Medium   string
	LoRAName string
	// ExtraKeys holds, per block, the extra hash keys vLLM mixed into the
	// block's hash (LoRA name, (mm_hash, offset), cache_salt, prompt-embeds
	// digest); a nil element is None for that block. Values are nil, bool,
	// int64 (uint64 above MaxInt64), float64, string, []byte or []any.
	ExtraKeys                [][]any
	GroupIdx                 *int
	KVCacheSpecKind          string
	KVCacheSpecSlidingWindow *int
	Locality                 string
}

// Batch is vLLM's EventBatch: one engine step's events.
type Batch struct {
	// TS is the wall-clock time of the step in seconds since the Unix epoch.
	TS     float64
	Events []Event
	// DataParallelRank is the engine's data-parallel rank; nil is None.
	DataParallelRank *int
	// UnknownEvents counts events of types this package does not know,
	// which DecodeBatch skips (a newer vLLM may add some). Not encoded.
	UnknownEvents int
}

// FromEngine converts the engine's KV events into wire events, with hashes as
// EngineHash. tokens, when not nil, returns the token ids of one block; a
// BlockStored event then carries the tokens of all its blocks concatenated.
// With tokens nil, TokenIDs stays empty. Events of unknown kinds are skipped,
// and AllBlocksCleared carries no medium, as in vLLM. A parent whose low half
// is 0 becomes no parent, as it would on the wire (see
// Event.ParentBlockHash).
func FromEngine(evs []engine.KVEvent, tokens func(h kvblock.Hash) []uint32) []Event {
	out := make([]Event, 0, len(evs))
	for i := range evs {
		ev := &evs[i]
		switch ev.Kind {
		case engine.BlockStored:
			w := Event{Kind: engine.BlockStored, BlockSize: ev.BlockSize, Medium: ev.Medium, BlockHashes: engineHashes(ev.BlockHashes)}
			if p := EngineHash(ev.ParentBlockHash); ev.HasParent && !zeroHash(p) {
				w.ParentBlockHash = &p
			}
			if tokens != nil {
				for _, h := range ev.BlockHashes {
					w.TokenIDs = append(w.TokenIDs, tokens(h)...)
				}
			}
			out = append(out, w)
		case engine.BlockRemoved:
			out = append(out, Event{Kind: engine.BlockRemoved, Medium: ev.Medium, BlockHashes: engineHashes(ev.BlockHashes)})
		case engine.AllBlocksCleared:
			out = append(out, Event{Kind: engine.AllBlocksCleared})
		}
	}
	return out
}

func engineHashes(hs []kvblock.Hash) []BlockHash {
	if len(hs) == 0 {
		return nil
	}
	out := make([]BlockHash, len(hs))
	for i, h := range hs {
		out[i] = EngineHash(h)
	}
	return out
}
