package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/inferrail/inferrail/engine"
)

// Wire layout, as msgspec writes vLLM's structs (omit_defaults=True, tagged
// union with the class name as tag, "type" as the tag field in map form):
//
//	batch:            [ts float64, events, data_parallel_rank]  (rank omitted when None)
//	BlockStored:      block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//	                  medium, lora_name (always sent, None as nil), then extra_keys,
//	                  group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window,
//	                  locality (default None: omitted)
//	BlockRemoved:     block_hashes, medium (always), group_idx, locality (default None)
//	AllBlocksCleared: no fields
//
// In FormatArray an event is [tag, fields...] and only trailing default fields
// are dropped (a default field before a set one is sent as nil); in FormatMap
// it is {"type": tag, name: value...} in declaration order, every default
// field dropped. Ints take msgpack's smallest encoding with non-negative
// values as unsigned (positive fixint, uint8..uint64), floats are float64,
// strings str (fixstr/str8/16/32), bytes bin; that is msgspec's choice too.

// Field names in vLLM's declaration order; the first required ones are
// always encoded.
var (
	storedFields  = [...]string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality"}
	removedFields = [...]string{"block_hashes", "medium", "group_idx", "locality"}
	allFields     = [...]string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality"}
	tags          = [...]string{"BlockStored", "BlockRemoved", "AllBlocksCleared"}
)

const (
	storedRequired  = 7
	removedRequired = 2
	maxAnyDepth     = 16
)

// EncodeBatch encodes b as vLLM's msgpack EventBatch with events in format f.
// It fails on an event of unknown kind or with a field its kind does not
// carry, and on an unknown format.
func EncodeBatch(b Batch, f Format) ([]byte, error) {
	if f != FormatMap && f != FormatArray {
		return nil, fmt.Errorf("kvevents: unknown event format %d: use FormatMap or FormatArray", f)
	}
	var buf bytes.Buffer
	buf.Grow(64 + 48*len(b.Events))
	w := writer{e: msgpack.NewEncoder(&buf)}
	n := 2
	if b.DataParallelRank != nil {
		n = 3
	}
	w.arrayLen(n)
	w.check(w.e.EncodeFloat64(b.TS))
	w.arrayLen(len(b.Events))
	for i := range b.Events {
		if err := w.event(&b.Events[i], f); err != nil {
			return nil, fmt.Errorf("kvevents: encode event %d: %w", i, err)
		}
	}
	if b.DataParallelRank != nil {
		w.int(int64(*b.DataParallelRank))
	}
	if w.err != nil {
		return nil, fmt.Errorf("kvevents: encode batch: %w", w.err)
	}
	return buf.Bytes(), nil
}

// writer wraps a msgpack encoder and keeps its first error.
type writer struct {
	e   *msgpack.Encoder
	err error
}

func (w *writer) check(err error) {
	if w.err == nil && err != nil {
		w.err = err
	}
}

func (w *writer) arrayLen(n int)  { w.check(w.e.EncodeArrayLen(n)) }
func (w *writer) str(s string)    { w.check(w.e.EncodeString(s)) }
func (w *writer) int(v int64)     { w.check(w.e.EncodeInt(v)) }
func (w *writer) nil()            { w.check(w.e.EncodeNil()) }
func (w *writer) optStr(s string) { w.optional(s != "", func() { w.str(s) }) }
func (w *writer) optInt(p *int) {
	w.optional(p != nil, func() { w.int(int64(*p)) })
}

func (w *writer) optional(set bool, enc func()) {
	if set {
		enc()
		return
	}
	w.nil()
}

func (w *writer) hash(h BlockHash) {
	if h.Raw != "" {
		w.check(w.e.EncodeBytesLen(len(h.Raw)))
		_, err := io.WriteString(w.e.Writer(), h.Raw)
		w.check(err)
		return
	}
	w.check(w.e.EncodeUint(h.V))
}

func (w *writer) hashes(hs []BlockHash) {
	w.arrayLen(len(hs))
	for _, h := range hs {
		w.hash(h)
	}
}

func (w *writer) event(ev *Event, f Format) error {
	var names []string
	var set []bool
	switch ev.Kind {
	case engine.BlockStored:
		names = storedFields[:]
		set = []bool{true, true, true, true, true, true, true,
			ev.ExtraKeys != nil, ev.GroupIdx != nil, ev.KVCacheSpecKind != "", ev.KVCacheSpecSlidingWindow != nil, ev.Locality != ""}
	case engine.BlockRemoved:
		if ev.ParentBlockHash != nil || len(ev.TokenIDs) > 0 || ev.BlockSize != 0 || ev.LoRAID != nil || ev.LoRAName != "" ||
			ev.ExtraKeys != nil || ev.KVCacheSpecKind != "" || ev.KVCacheSpecSlidingWindow != nil {
			return errors.New("BlockRemoved carries only block_hashes, medium, group_idx and locality: clear the other fields")
		}
		names = removedFields[:]
		set = []bool{true, true, ev.GroupIdx != nil, ev.Locality != ""}
	case engine.AllBlocksCleared:
		if !isBare(ev) {
			return errors.New("AllBlocksCleared carries no fields: clear them")
		}
	default:
		return fmt.Errorf("unknown event kind %d: use BlockStored, BlockRemoved or AllBlocksCleared", ev.Kind)
	}
	n := 0 // fields to write
	switch f {
	case FormatArray:
		for i, s := range set {
			if s {
				n = i + 1
			}
		}
		w.arrayLen(1 + n)
		w.str(ev.Kind.String())
		for i := range n {
			w.field(ev, names[i])
		}
	case FormatMap:
		for _, s := range set {
			if s {
				n++
			}
		}
		w.check(w.e.EncodeMapLen(1 + n))
		w.str("type")
		w.str(ev.Kind.String())
		for i, s := range set {
			if s {
				w.str(names[i])
				w.field(ev, names[i])
			}
		}
	}
	return w.err
}

func isBare(ev *Event) bool {
	return len(ev.BlockHashes) == 0 && ev.ParentBlockHash == nil && len(ev.TokenIDs) == 0 && ev.BlockSize == 0 &&
		ev.LoRAID == nil && ev.Medium == "" && ev.LoRAName == "" && ev.ExtraKeys == nil && ev.GroupIdx == nil &&
		ev.KVCacheSpecKind == "" && ev.KVCacheSpecSlidingWindow == nil && ev.Locality == ""
}

func (w *writer) field(ev *Event, name string) {
	switch name {
	case "block_hashes":
		w.hashes(ev.BlockHashes)
	case "parent_block_hash":
		w.optional(ev.ParentBlockHash != nil && !zeroHash(*ev.ParentBlockHash), func() { w.hash(*ev.ParentBlockHash) })
	case "token_ids":
		w.arrayLen(len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			w.check(w.e.EncodeUint(uint64(t)))
		}
	case "block_size":
		w.int(int64(ev.BlockSize))
	case "lora_id":
		w.optInt(ev.LoRAID)
	case "medium":
		w.optStr(ev.Medium)
	case "lora_name":
		w.optStr(ev.LoRAName)
	case "extra_keys":
		w.optional(ev.ExtraKeys != nil, func() {
			w.arrayLen(len(ev.ExtraKeys))
			for _, k := range ev.ExtraKeys {
				w.optional(k != nil, func() { w.anyValue(k, 0) })
			}
		})
	case "group_idx":
		w.optInt(ev.GroupIdx)
	case "kv_cache_spec_kind":
		w.optStr(ev.KVCacheSpecKind)
	case "kv_cache_spec_sliding_window":
		w.optInt(ev.KVCacheSpecSlidingWindow)
	case "locality":
		w.optStr(ev.Locality)
	}
}

func (w *writer) anyValue(v any, depth int) {
	if depth > maxAnyDepth {
		w.check(fmt.Errorf("extra_keys nested deeper than %d", maxAnyDepth))
		return
	}
	switch x := v.(type) {
	case nil:
		w.nil()
	case bool:
		w.check(w.e.EncodeBool(x))
	case int:
		w.int(int64(x))
	case int64:
		w.int(x)
	case uint64:
		w.check(w.e.EncodeUint(x))
	case float64:
		w.check(w.e.EncodeFloat64(x))
	case string:
		w.str(x)
	case []byte:
		w.check(w.e.EncodeBytes(x))
	case []any:
		w.arrayLen(len(x))
		for _, y := range x {
			w.anyValue(y, depth+1)
		}
	default:
		w.check(fmt.Errorf("extra_keys value of type %T: use nil, bool, int, int64, uint64, float64, string, []byte or []any", v))
	}
}

// DecodeBatch decodes a vLLM EventBatch payload. It accepts events as maps or
// as positional arrays (even mixed), hashes as int64, uint64 or bytes,
// missing trailing fields (older vLLM sent fewer), and unknown extra fields
// and batch elements, which it ignores. Events of unknown type are skipped and
// counted in Batch.UnknownEvents. Anything else that does not fit the schema,
// and trailing bytes, is an error naming the event and field.
func DecodeBatch(payload []byte) (Batch, error) {
	r := bytes.NewReader(payload)
	d := reader{d: msgpack.NewDecoder(r), r: r, payload: payload}
	var b Batch
	n, err := d.listLen("batch")
	if err != nil {
		return Batch{}, err
	}
	if n < 2 {
		return Batch{}, fmt.Errorf("kvevents: batch has %d elements, want [ts, events, data_parallel_rank]", n)
	}
	if b.TS, err = d.float("batch ts"); err != nil {
		return Batch{}, err
	}
	ne, err := d.listLen("batch events")
	if err != nil {
		return Batch{}, err
	}
	if ne > 0 {
		b.Events = make([]Event, 0, ne)
	}
	for i := range ne {
		ev, known, err := d.event()
		if err != nil {
			return Batch{}, fmt.Errorf("kvevents: event %d: %w", i, err)
		}
		if !known {
			b.UnknownEvents++
			continue
		}
		b.Events = append(b.Events, ev)
	}
	if len(b.Events) == 0 {
		b.Events = nil
	}
	if n >= 3 {
		if b.DataParallelRank, err = d.optInt("data_parallel_rank"); err != nil {
			return Batch{}, fmt.Errorf("kvevents: %w", err)
		}
	}
	for range n - 3 {
		if err := d.skip(0); err != nil {
			return Batch{}, fmt.Errorf("kvevents: batch element: %w", err)
		}
	}
	if r.Len() != 0 {
		return Batch{}, fmt.Errorf("kvevents: %d bytes after the batch: the payload must be exactly one msgpack EventBatch", r.Len())
	}
	return b, nil
}

// reader decodes with limits: lengths never exceed what is left of the
// payload and nesting is bounded, so garbage cannot allocate or recurse much.
type reader struct {
	d       *msgpack.Decoder
	r       *bytes.Reader
	payload []byte
}

func (d reader) peek() (byte, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, fmt.Errorf("payload truncated: %w", err)
	}
	return c, nil
}

func codeName(c byte) string {
	switch {
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.True || c == msgpcode.False:
		return "bool"
	case msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64):
		return "int"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "float"
	case msgpcode.IsString(c):
		return "string"
	case msgpcode.IsBin(c):
		return "bytes"
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		return "list"
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		return "map"
	case msgpcode.IsExt(c):
		return "ext"
	}
	return fmt.Sprintf("invalid msgpack code 0x%02x", c)
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

func isUnsigned(c byte) bool {
	return c <= msgpcode.PosFixedNumHigh || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64)
}

// listLen reads an array header at batch level.
func (d reader) listLen(what string) (int, error) {
	n, err := d.list(what)
	if err != nil {
		return 0, fmt.Errorf("kvevents: %w", err)
	}
	return n, nil
}

func (d reader) mapLen() (int, error) {
	n, err := d.d.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if 2*n > d.r.Len() {
		return 0, fmt.Errorf("map of %d entries is longer than the rest of the payload", n)
	}
	return n, nil
}

// name reads a string and returns it as the matching constant from names
// (no allocation), or as a new string when none matches.
func (d reader) name(what string, names []string) (string, error) {
	c, err := d.peek()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("%s: want a string, got %s", what, codeName(c))
	}
	_, _ = d.r.ReadByte()
	n := 0
	switch c {
	case msgpcode.Str8, msgpcode.Str16, msgpcode.Str32:
		v, err := d.be(1 << (c - msgpcode.Str8))
		if err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
		n = int(v)
	default:
		n = int(c & msgpcode.FixedStrMask)
	}
	off := len(d.payload) - d.r.Len()
	if n > d.r.Len() {
		return "", fmt.Errorf("%s: payload truncated", what)
	}
	b := d.payload[off : off+n]
	_, _ = d.r.Seek(int64(n), io.SeekCurrent)
	for _, s := range names {
		if string(b) == s {
			return s, nil
		}
	}
	return string(b), nil
}

// be reads a size-byte big-endian unsigned int.
func (d reader) be(size int) (uint64, error) {
	var v uint64
	for range size {
		b, err := d.r.ReadByte()
		if err != nil {
			return 0, fmt.Errorf("payload truncated: %w", err)
		}
		v = v<<8 | uint64(b)
	}
	return v, nil
}

// num reads a msgpack int straight from the payload, which is much faster
// than the decoder's general path (the decoder buffers nothing, so both stay
// in step). v holds the value's bits; neg is set for a negative value. A
// value that is not an int is left unread and reported with its type.
func (d reader) num() (v uint64, neg bool, err error) {
	c, err := d.r.ReadByte()
	if err != nil {
		return 0, false, fmt.Errorf("payload truncated: %w", err)
	}
	size := 0
	signed := false
	switch {
	case c <= msgpcode.PosFixedNumHigh:
		return uint64(c), false, nil
	case c >= msgpcode.NegFixedNumLow:
		return uint64(int64(int8(c))), true, nil
	case c >= msgpcode.Uint8 && c <= msgpcode.Uint64:
		size = 1 << (c - msgpcode.Uint8)
	case c >= msgpcode.Int8 && c <= msgpcode.Int64:
		size, signed = 1<<(c-msgpcode.Int8), true
	default:
		_ = d.r.UnreadByte()
		return 0, false, fmt.Errorf("want an int, got %s", codeName(c))
	}
	if v, err = d.be(size); err != nil {
		return 0, false, err
	}
	if signed {
		shift := 64 - 8*size
		x := int64(v<<shift) >> shift // sign-extend
		return uint64(x), x < 0, nil
	}
	return v, false, nil
}

func (d reader) float(what string) (float64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, fmt.Errorf("kvevents: %s: %w", what, err)
	}
	switch {
	case c == msgpcode.Float || c == msgpcode.Double:
		return d.d.DecodeFloat64()
	case isUnsigned(c):
		v, err := d.d.DecodeUint64()
		return float64(v), err
	case isInt(c):
		v, err := d.d.DecodeInt64()
		return float64(v), err
	}
	return 0, fmt.Errorf("kvevents: %s: want a float, got %s", what, codeName(c))
}

func (d reader) int(what string) (int, error) {
	v, neg, err := d.num()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if neg {
		if int64(v) < math.MinInt {
			return 0, fmt.Errorf("%s: %d does not fit an int", what, int64(v))
		}
		return int(int64(v)), nil
	}
	if v > math.MaxInt {
		return 0, fmt.Errorf("%s: %d does not fit an int", what, v)
	}
	return int(v), nil
}

func (d reader) isNil() (bool, error) {
	c, err := d.peek()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, d.d.DecodeNil()
	}
	return false, nil
}

func (d reader) optInt(what string) (*int, error) {
	null, err := d.isNil()
	if err != nil || null {
		return nil, wrapField(what, err)
	}
	v, err := d.int(what)
	if err != nil {
		return nil, err
	}
	return &v, nil
}

func wrapField(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (d reader) str(what string) (string, error) {
	c, err := d.peek()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("%s: want a string, got %s", what, codeName(c))
	}
	s, err := d.d.DecodeString()
	return s, wrapField(what, err)
}

func (d reader) optStr(what string) (string, error) {
	null, err := d.isNil()
	if err != nil || null {
		return "", wrapField(what, err)
	}
	return d.str(what)
}

func (d reader) hash(what string) (BlockHash, error) {
	c, err := d.peek()
	if err != nil {
		return BlockHash{}, fmt.Errorf("%s: %w", what, err)
	}
	switch {
	case isInt(c):
		v, _, err := d.num()
		return IntHash(v), wrapField(what, err)
	case msgpcode.IsBin(c):
		b, err := d.d.DecodeBytes()
		if err != nil {
			return BlockHash{}, fmt.Errorf("%s: %w", what, err)
		}
		if len(b) == 0 {
			return BlockHash{}, fmt.Errorf("%s: empty bytes hash", what)
		}
		return BytesHash(b), nil
	}
	return BlockHash{}, fmt.Errorf("%s: want an int or bytes hash, got %s", what, codeName(c))
}

func (d reader) list(what string) (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if !isArray(c) {
		return 0, fmt.Errorf("%s: want a list, got %s", what, codeName(c))
	}
	n, err := d.d.DecodeArrayLen()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if n > d.r.Len() {
		return 0, fmt.Errorf("%s: list of %d items is longer than the rest of the payload", what, n)
	}
	return n, nil
}

// event decodes one event; known is false for an event type this package
// does not know (skipped whole).
func (d reader) event() (ev Event, known bool, err error) {
	c, err := d.peek()
	if err != nil {
		return Event{}, false, err
	}
	switch {
	case isArray(c):
		n, err := d.list("event")
		if err != nil {
			return Event{}, false, err
		}
		if n == 0 {
			return Event{}, false, errors.New("empty event list: want the type tag first")
		}
		tag, err := d.name("event type", tags[:])
		if err != nil {
			return Event{}, false, err
		}
		kind, names := kindOf(tag)
		for i := 1; i < n; i++ {
			if kind == 0 || i-1 >= len(names) {
				if err := d.skip(0); err != nil {
					return Event{}, false, err
				}
				continue
			}
			if err := d.field(&ev, names[i-1]); err != nil {
				return Event{}, false, fmt.Errorf("%s: %w", tag, err)
			}
		}
		ev.Kind = kind
	case isMap(c):
		n, err := d.mapLen()
		if err != nil {
			return Event{}, false, err
		}
		tag := ""
		for range n {
			key, err := d.name("event key", allFields[:])
			if err != nil {
				return Event{}, false, err
			}
			if key == "type" {
				if tag, err = d.name("event type", tags[:]); err != nil {
					return Event{}, false, err
				}
				continue
			}
			if err := d.field(&ev, key); err != nil {
				return Event{}, false, err
			}
		}
		if tag == "" {
			return Event{}, false, errors.New(`event map has no "type"`)
		}
		kind, _ := kindOf(tag)
		ev.Kind = kind
		trim(&ev)
	default:
		return Event{}, false, fmt.Errorf("want a map or a list, got %s", codeName(c))
	}
	if ev.Kind == 0 {
		return Event{}, false, nil
	}
	return ev, true, nil
}

func kindOf(tag string) (engine.KVEventKind, []string) {
	switch tag {
	case "BlockStored":
		return engine.BlockStored, storedFields[:]
	case "BlockRemoved":
		return engine.BlockRemoved, removedFields[:]
	case "AllBlocksCleared":
		return engine.AllBlocksCleared, nil
	}
	return 0, nil
}

// trim clears the fields a map event set that its kind does not carry
// (msgspec ignores unknown keys the same way).
func trim(ev *Event) {
	switch ev.Kind {
	case engine.BlockRemoved:
		*ev = Event{Kind: ev.Kind, BlockHashes: ev.BlockHashes, Medium: ev.Medium, GroupIdx: ev.GroupIdx, Locality: ev.Locality}
	case engine.AllBlocksCleared:
		*ev = Event{Kind: ev.Kind}
	}
}

// field decodes the named field into ev; unknown names are skipped.
func (d reader) field(ev *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.BlockHashes, err = d.hashList(name)
	case "parent_block_hash":
		ev.ParentBlockHash, err = d.parent(name)
	case "token_ids":
		ev.TokenIDs, err = d.tokens(name)
	case "block_size":
		ev.BlockSize, err = d.int(name)
	case "lora_id":
		ev.LoRAID, err = d.optInt(name)
	case "medium":
		ev.Medium, err = d.optStr(name)
	case "lora_name":
		ev.LoRAName, err = d.optStr(name)
	case "extra_keys":
		ev.ExtraKeys, err = d.extraKeys(name)
	case "group_idx":
		ev.GroupIdx, err = d.optInt(name)
	case "kv_cache_spec_kind":
		ev.KVCacheSpecKind, err = d.optStr(name)
	case "kv_cache_spec_sliding_window":
		ev.KVCacheSpecSlidingWindow, err = d.optInt(name)
	case "locality":
		ev.Locality, err = d.optStr(name)
	default:
		err = wrapField(name, d.skip(0))
	}
	return err
}

// parent reads parent_block_hash. None means no parent, and so does a zero
// hash (see zeroHash): llm-d-inference-sim sends the int 0 for none.
func (d reader) parent(what string) (*BlockHash, error) {
	null, err := d.isNil()
	if err != nil || null {
		return nil, wrapField(what, err)
	}
	c, err := d.peek()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var h BlockHash
	if msgpcode.IsBin(c) {
		b, err := d.d.DecodeBytes()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		h = BytesHash(b) // may be empty, unlike a block hash
	} else if h, err = d.hash(what); err != nil {
		return nil, err
	}
	if zeroHash(h) {
		return nil, nil
	}
	return &h, nil
}

// zeroHash reports whether h is the int 0 or empty or all-zero bytes, which
// as a parent hash mean no parent.
func zeroHash(h BlockHash) bool {
	return h.V == 0 && strings.Trim(h.Raw, "\x00") == ""
}

func (d reader) hashList(what string) ([]BlockHash, error) {
	if null, err := d.isNil(); err != nil || null {
		return nil, wrapField(what, err)
	}
	n, err := d.list(what)
	if err != nil || n == 0 {
		return nil, err
	}
	out := make([]BlockHash, n)
	for i := range out {
		if out[i], err = d.hash(what); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (d reader) tokens(what string) ([]uint32, error) {
	if null, err := d.isNil(); err != nil || null {
		return nil, wrapField(what, err)
	}
	n, err := d.list(what)
	if err != nil || n == 0 {
		return nil, err
	}
	out := make([]uint32, n)
	for i := range out {
		v, neg, err := d.num()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if neg {
			return nil, fmt.Errorf("%s: token id %d is not a uint32", what, int64(v))
		}
		if v > math.MaxUint32 {
			return nil, fmt.Errorf("%s: token id %d is not a uint32", what, v)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

func (d reader) extraKeys(what string) ([][]any, error) {
	if null, err := d.isNil(); err != nil || null {
		return nil, wrapField(what, err)
	}
	n, err := d.list(what)
	if err != nil {
		return nil, err
	}
	out := make([][]any, n)
	for i := range out {
		null, err := d.isNil()
		if err != nil {
			return nil, wrapField(what, err)
		}
		if null {
			continue
		}
		v, err := d.anyValue(0)
		if err != nil {
			return nil, wrapField(what, err)
		}
		t, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("%s: want a tuple or None per block, got %T", what, v)
		}
		out[i] = t
	}
	return out, nil
}

// anyValue decodes an extra_keys value into nil, bool, int64, uint64 (above
// MaxInt64 only), float64, string, []byte or []any.
func (d reader) anyValue(depth int) (any, error) {
	if depth > maxAnyDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxAnyDepth)
	}
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		return nil, d.d.DecodeNil()
	case c == msgpcode.True || c == msgpcode.False:
		return d.d.DecodeBool()
	case isUnsigned(c):
		v, err := d.d.DecodeUint64()
		if v > math.MaxInt64 {
			return v, err
		}
		return int64(v), err
	case isInt(c):
		return d.d.DecodeInt64()
	case c == msgpcode.Float || c == msgpcode.Double:
		return d.d.DecodeFloat64()
	case msgpcode.IsString(c):
		return d.d.DecodeString()
	case msgpcode.IsBin(c):
		return d.d.DecodeBytes()
	case isArray(c):
		n, err := d.list("value")
		if err != nil {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = d.anyValue(depth + 1); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported %s value", codeName(c))
}

// skip skips one value of any type, with bounded nesting.
func (d reader) skip(depth int) error {
	if depth > maxAnyDepth {
		return fmt.Errorf("nested deeper than %d", maxAnyDepth)
	}
	c, err := d.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := d.list("value")
		if err != nil {
			return err
		}
		for range n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := d.mapLen()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c == 0xc1:
		return errors.New("invalid msgpack code 0xc1")
	}
	return d.d.Skip()
}
