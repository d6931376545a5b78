package respcache

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Entry is one stored answer. Entries are shared between the store and
// every hit that replays them: nobody modifies one once it is stored.
type Entry struct {
	// Kind is KindJSON or KindSSE.
	Kind Kind
	// ContentType is the engine's Content-Type, replayed as is.
	ContentType string
	// Body is the answer's bytes exactly as the engine sent them: the
	// JSON body, or the whole event stream up to and with data: [DONE].
	Body []byte
	// Events are the end offsets in Body of the stream's events (KindSSE),
	// each just past the blank line that ended it; the last is len(Body)
	// unless the stream ended without a blank line. Replay writes and
	// flushes Body event by event at these boundaries.
	Events []int
	// Usage is the usage the answer carried (the client sees these counts
	// again on a hit; the engines computed none of them).
	Usage Usage
}

// Usage is an answer's token counts, as its usage object said.
type Usage struct {
	// Known: the answer carried a usage object (a stream only with
	// stream_options.include_usage or vLLM's continuous_usage_stats).
	Known            bool
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is prompt_tokens_details.cached_tokens, -1 when absent.
	CachedTokens int
}

// validate checks what a store relies on: a known kind, and events that
// end in order inside the body (none in a JSON entry).
func (e *Entry) validate() error {
	if e.Kind != KindJSON && e.Kind != KindSSE {
		return fmt.Errorf("respcache: entry of kind %d", e.Kind)
	}
	if e.Kind == KindJSON && len(e.Events) > 0 {
		return errors.New("respcache: a JSON entry has no events")
	}
	prev := 0
	for _, end := range e.Events {
		if end <= prev || end > len(e.Body) {
			return fmt.Errorf("respcache: event end %d after %d in a body of %d bytes", end, prev, len(e.Body))
		}
		prev = end
	}
	return nil
}

// entryOverhead is what an entry costs the memory store beyond its bytes:
// the map slot, the list node, the Entry and its slices' headers.
const entryOverhead = 192

// Size is what e costs the memory store's byte bound.
func (e *Entry) Size() int64 {
	return int64(len(e.Body)) + int64(len(e.ContentType)) + 8*int64(len(e.Events)) + entryOverhead
}

// Encoding of an entry in one binary blob (the Redis value), version 1:
//
//	byte     version (1)
//	[32]byte the key (an entry read under another key is refused)
//	byte     kind (1 JSON, 2 SSE)
//	uvarint  len(content type), content type
//	byte     usage known (0 or 1)
//	uvarint  prompt tokens, uvarint completion tokens, varint cached tokens
//	uvarint  number of events, then uvarint each event's length
//	         (the difference between consecutive end offsets)
//	rest     the body
const encodingVersion = 1

// ErrCorrupt marks a stored value that cannot be an entry of this version.
var ErrCorrupt = errors.New("respcache: corrupt entry")

// appendEntry appends e's encoding under key k to dst.
func appendEntry(dst []byte, k Key, e *Entry) []byte {
	dst = append(dst, encodingVersion)
	dst = append(dst, k[:]...)
	dst = append(dst, byte(e.Kind))
	dst = binary.AppendUvarint(dst, uint64(len(e.ContentType)))
	dst = append(dst, e.ContentType...)
	known := byte(0)
	if e.Usage.Known {
		known = 1
	}
	dst = append(dst, known)
	dst = binary.AppendUvarint(dst, uint64(max(e.Usage.PromptTokens, 0)))
	dst = binary.AppendUvarint(dst, uint64(max(e.Usage.CompletionTokens, 0)))
	dst = binary.AppendVarint(dst, int64(e.Usage.CachedTokens))
	dst = binary.AppendUvarint(dst, uint64(len(e.Events)))
	prev := 0
	for _, end := range e.Events {
		dst = binary.AppendUvarint(dst, uint64(end-prev))
		prev = end
	}
	return append(dst, e.Body...)
}

// EncodeEntry encodes e on its own, under no key (the zero Key): the form
// in which the semantic cache keeps an answer (package semcache stores
// bytes), read back by DecodeEntry.
func EncodeEntry(e *Entry) []byte {
	return appendEntry(make([]byte, 0, encodedSize(e)), Key{}, e)
}

// DecodeEntry reads an entry EncodeEntry wrote and checks it as a store
// does (kind, event offsets). The entry's Body is b's tail (not copied).
func DecodeEntry(b []byte) (*Entry, error) {
	e, err := decodeEntry(Key{}, b)
	if err != nil {
		return nil, err
	}
	if err := e.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return e, nil
}

// encodedSize bounds the length of e's encoding.
func encodedSize(e *Entry) int {
	return 1 + 32 + 1 + binary.MaxVarintLen64*(5+len(e.Events)) + len(e.ContentType) + len(e.Body)
}

// decodeEntry reads an entry stored under key k. The entry's Body is b's
// tail (not copied).
func decodeEntry(k Key, b []byte) (*Entry, error) {
	d := blob{b: b}
	if v := d.byte(); v != encodingVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrCorrupt, v, encodingVersion)
	}
	if len(d.b) < 32 || Key(d.b[:32]) != k {
		return nil, fmt.Errorf("%w: stored under another key", ErrCorrupt)
	}
	d.b = d.b[32:]
	e := &Entry{Kind: Kind(d.byte())}
	if d.err == nil && e.Kind != KindJSON && e.Kind != KindSSE {
		return nil, fmt.Errorf("%w: kind %d", ErrCorrupt, e.Kind)
	}
	e.ContentType = string(d.bytes(d.uvarint()))
	e.Usage.Known = d.byte() == 1
	e.Usage.PromptTokens = int(d.uvarint())
	e.Usage.CompletionTokens = int(d.uvarint())
	e.Usage.CachedTokens = int(d.varint())
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) { // each length is one byte at least
		return nil, fmt.Errorf("%w: %d events in %d bytes", ErrCorrupt, n, len(d.b))
	}
	if n > 0 {
		e.Events = make([]int, 0, n)
	}
	var lens uint64
	for range n {
		l := d.uvarint()
		lens += l
		if d.err != nil || l == 0 || lens > uint64(len(b)) {
			return nil, fmt.Errorf("%w: event lengths", ErrCorrupt)
		}
		e.Events = append(e.Events, int(lens))
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, d.err)
	}
	if lens > uint64(len(d.b)) {
		return nil, fmt.Errorf("%w: events end past the body", ErrCorrupt)
	}
	e.Body = d.b
	if e.Kind == KindJSON && len(e.Events) != 0 {
		return nil, fmt.Errorf("%w: events in a JSON entry", ErrCorrupt)
	}
	return e, nil
}

// blob reads an encoding; the first short read sets err.
type blob struct {
	b   []byte
	err error
}

var errShort = errors.New("truncated")

func (d *blob) byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = errShort
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *blob) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > 1<<40 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *blob) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 || v > 1<<40 || v < -1<<40 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *blob) bytes(n uint64) []byte {
	if d.err != nil || n > uint64(len(d.b)) {
		d.err = errShort
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}
