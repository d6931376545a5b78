package kvevents

import (
	"bytes"
	"encoding/hex"
	"flag"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"

	"github.com/inferrail/inferrail/engine"
	"github.com/inferrail/inferrail/engine/kvblock"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func ptr[T any](v T) *T { return &v }

// h assembles msgpack bytes from hex pieces and strings: a piece starting
// with "'" is written as a fixstr, anything else is hex.
func h(t testing.TB, pieces ...string) []byte {
	t.Helper()
	var out []byte
	for _, p := range pieces {
		if s, ok := strings.CutPrefix(p, "'"); ok {
			if len(s) >= 32 {
				t.Fatalf("fixstr %q too long", s)
			}
			out = append(out, 0xa0|byte(len(s)))
			out = append(out, s...)
			continue
		}
		b, err := hex.DecodeString(strings.ReplaceAll(p, " ", ""))
		if err != nil {
			t.Fatalf("bad hex %q: %v", p, err)
		}
		out = append(out, b...)
	}
	return out
}

// TestSpecBytes checks the encoding against msgpack assembled by hand from
// the wire format in peers.md section 3 (msgspec, omit_defaults, tag=True).
func TestSpecBytes(t *testing.T) {
	stored := Event{
		Kind:        engine.BlockStored,
		BlockHashes: []BlockHash{IntHash(1), IntHash(math.MaxUint64)},
		TokenIDs:    []uint32{1, 2},
		BlockSize:   1,
		Medium:      "GPU",
	}
	ts := "cb 3ff8000000000000" // 1.5 as float64
	cases := []struct {
		name   string
		b      Batch
		f      Format
		expect []byte
	}{
		{"stored array", Batch{TS: 1.5, Events: []Event{stored}, DataParallelRank: ptr(0)}, FormatArray, h(t,
			"93", ts, "91",
			"98", "'BlockStored", // tag + 7 required fields; no trailing optionals
			"92 01 cf ffffffffffffffff", // block_hashes: uint64 for the big one
			"c0",                        // parent_block_hash None
			"92 01 02",                  // token_ids
			"01",                        // block_size
			"c0",                        // lora_id None
			"'GPU",                      // medium
			"c0",                        // lora_name None
			"00")},                      // data_parallel_rank 0
		{"stored map", Batch{TS: 1.5, Events: []Event{stored}, DataParallelRank: ptr(0)}, FormatMap, h(t,
			"93", ts, "91",
			"88", "'type", "'BlockStored",
			"'block_hashes", "92 01 cf ffffffffffffffff",
			"'parent_block_hash", "c0",
			"'token_ids", "92 01 02",
			"'block_size", "01",
			"'lora_id", "c0",
			"'medium", "'GPU",
			"'lora_name", "c0",
			"00")},
		{"removed array, interior default sent as nil", Batch{TS: 1.5, Events: []Event{{Kind: engine.BlockRemoved, BlockHashes: []BlockHash{IntHash(5)}, Locality: "x"}}}, FormatArray, h(t,
			"92", ts, "91", // rank None: omitted
			"95", "'BlockRemoved", "91 05", "c0", "c0", "'x")}, // medium None, group_idx None, locality
		{"removed map, defaults dropped", Batch{TS: 1.5, Events: []Event{{Kind: engine.BlockRemoved, BlockHashes: []BlockHash{IntHash(5)}, GroupIdx: ptr(3)}}}, FormatMap, h(t,
			"92", ts, "91",
			"84", "'type", "'BlockRemoved", "'block_hashes", "91 05", "'medium", "c0", "'group_idx", "03")},
		{"cleared array", Batch{TS: 1.5, Events: []Event{{Kind: engine.AllBlocksCleared}}}, FormatArray, h(t,
			"92", ts, "91", "91", "'AllBlocksCleared")},
		{"cleared map", Batch{TS: 1.5, Events: []Event{{Kind: engine.AllBlocksCleared}}}, FormatMap, h(t,
			"92", ts, "91", "81", "'type", "'AllBlocksCleared")},
		{"bytes hash and negative rank", Batch{TS: 1.5, Events: []Event{{Kind: engine.BlockRemoved, BlockHashes: []BlockHash{BytesHash([]byte{0xab, 0xcd})}, Medium: "CPU"}}, DataParallelRank: ptr(-1)}, FormatArray, h(t,
			"93", ts, "91", "93", "'BlockRemoved", "91 c4 02 abcd", "'CPU", "ff")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := EncodeBatch(c.b, c.f)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.expect) {
				t.Fatalf("encoding differs from the spec\n got %x\nwant %x", got, c.expect)
			}
			back, err := DecodeBatch(c.expect)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, c.b) {
				t.Fatalf("decode(spec bytes) = %+v, want %+v", back, c.b)
			}
		})
	}
}

// goldenBatches are hand-built batches whose encodings are pinned in testdata.
func goldenBatches() map[string]Batch {
	parent := IntHash(0x0123456789abcdef)
	return map[string]Batch{
		"stored_full": {TS: 1718000000.25, DataParallelRank: ptr(1), Events: []Event{{
			Kind:                     engine.BlockStored,
			BlockHashes:              []BlockHash{IntHash(0xfedcba9876543210), IntHash(42)},
			ParentBlockHash:          &parent,
			TokenIDs:                 []uint32{1, 2, 3, 4, 151643, 6, 7, 8},
			BlockSize:                4,
			LoRAID:                   ptr(7),
			Medium:                   "GPU",
			LoRAName:                 "sql-adapter",
			ExtraKeys:                [][]any{{"sql-adapter"}, nil},
			GroupIdx:                 ptr(0),
			KVCacheSpecKind:          "full_attention",
			KVCacheSpecSlidingWindow: ptr(4096),
			Locality:                 "local",
		}}},
		"mixed": {TS: 0.5, Events: []Event{
			{Kind: engine.BlockStored, BlockHashes: []BlockHash{IntHash(9)}, TokenIDs: []uint32{5, 6}, BlockSize: 2, Medium: "GPU"},
			{Kind: engine.BlockRemoved, BlockHashes: []BlockHash{IntHash(9), BytesHash(bytes.Repeat([]byte{0xab}, 32))}, Medium: "GPU"},
			{Kind: engine.AllBlocksCleared},
		}},
		"empty": {TS: 3, DataParallelRank: ptr(0)},
	}
}

func TestGolden(t *testing.T) {
	for name, b := range goldenBatches() {
		for _, f := range []Format{FormatMap, FormatArray} {
			path := filepath.Join("testdata", name+"."+f.String()+".msgpack")
			got, err := EncodeBatch(b, f)
			if err != nil {
				t.Fatal(err)
			}
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s: encoding changed\n got %x\nwant %x", path, got, want)
			}
			back, err := DecodeBatch(want)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if !reflect.DeepEqual(back, b) {
				t.Errorf("%s: decoded %+v, want %+v", path, back, b)
			}
		}
	}
}

func genAny(depth int) *rapid.Generator[any] {
	return rapid.Custom(func(t *rapid.T) any {
		k := rapid.IntRange(0, 7).Draw(t, "kind")
		if depth >= 2 && k == 7 {
			k = 0
		}
		switch k {
		case 0:
			return nil
		case 1:
			return rapid.Bool().Draw(t, "bool")
		case 2:
			return rapid.Int64().Draw(t, "int")
		case 3:
			return rapid.Uint64Range(math.MaxInt64+1, math.MaxUint64).Draw(t, "bigint")
		case 4:
			return rapid.Float64().Filter(func(f float64) bool { return !math.IsNaN(f) }).Draw(t, "float")
		case 5:
			return rapid.String().Draw(t, "str")
		case 6:
			return rapid.SliceOf(rapid.Byte()).Draw(t, "bytes")
		}
		return rapid.SliceOfN(genAny(depth+1), 0, 3).Draw(t, "list")
	})
}

func genHash() *rapid.Generator[BlockHash] {
	return rapid.Custom(func(t *rapid.T) BlockHash {
		if rapid.IntRange(0, 3).Draw(t, "bytes?") == 0 {
			return BytesHash(rapid.SliceOfN(rapid.Byte(), 1, 40).Draw(t, "raw"))
		}
		return IntHash(rapid.Uint64().Draw(t, "v"))
	})
}

func optInt(t *rapid.T, name string) *int {
	if rapid.Bool().Draw(t, name+"?") {
		return ptr(rapid.IntRange(math.MinInt32, math.MaxInt32).Draw(t, name))
	}
	return nil
}

func optStr(t *rapid.T, name string) string {
	if rapid.Bool().Draw(t, name+"?") {
		return rapid.StringN(1, 20, -1).Draw(t, name)
	}
	return ""
}

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

func genEvent() *rapid.Generator[Event] {
	return rapid.Custom(func(t *rapid.T) Event {
		hashes := nilIfEmpty(rapid.SliceOfN(genHash(), 0, 5).Draw(t, "hashes"))
		switch rapid.IntRange(0, 2).Draw(t, "kind") {
		case 0:
			ev := Event{
				Kind:                     engine.BlockStored,
				BlockHashes:              hashes,
				TokenIDs:                 nilIfEmpty(rapid.SliceOfN(rapid.Uint32(), 0, 20).Draw(t, "tokens")),
				BlockSize:                rapid.IntRange(0, 1024).Draw(t, "bs"),
				LoRAID:                   optInt(t, "lora_id"),
				Medium:                   optStr(t, "medium"),
				LoRAName:                 optStr(t, "lora_name"),
				GroupIdx:                 optInt(t, "group"),
				KVCacheSpecKind:          optStr(t, "spec"),
				KVCacheSpecSlidingWindow: optInt(t, "window"),
				Locality:                 optStr(t, "locality"),
			}
			if rapid.Bool().Draw(t, "parent?") {
				p := genHash().Draw(t, "parent")
				ev.ParentBlockHash = &p
			}
			if rapid.Bool().Draw(t, "extra?") {
				ev.ExtraKeys = rapid.SliceOfN(rapid.Custom(func(t *rapid.T) []any {
					if rapid.Bool().Draw(t, "none?") {
						return nil
					}
					return rapid.SliceOfN(genAny(1), 0, 3).Draw(t, "tuple")
				}), 0, 3).Draw(t, "extra")
			}
			return ev
		case 1:
			return Event{Kind: engine.BlockRemoved, BlockHashes: hashes, Medium: optStr(t, "medium"), GroupIdx: optInt(t, "group"), Locality: optStr(t, "locality")}
		}
		return Event{Kind: engine.AllBlocksCleared}
	})
}

func genBatch() *rapid.Generator[Batch] {
	return rapid.Custom(func(t *rapid.T) Batch {
		return Batch{
			TS:               rapid.Float64().Filter(func(f float64) bool { return !math.IsNaN(f) }).Draw(t, "ts"),
			Events:           nilIfEmpty(rapid.SliceOfN(genEvent(), 0, 6).Draw(t, "events")),
			DataParallelRank: optInt(t, "rank"),
		}
	})
}

// noZeroParents is b as it decodes: a zero parent hash means no parent.
func noZeroParents(b Batch) Batch {
	b.Events = append([]Event(nil), b.Events...)
	for i := range b.Events {
		if p := b.Events[i].ParentBlockHash; p != nil && zeroHash(*p) {
			b.Events[i].ParentBlockHash = nil
		}
	}
	if len(b.Events) == 0 {
		b.Events = nil
	}
	return b
}

// TestRoundTrip: Decode(Encode(b)) == b in both formats (but for zero
// parents, which decode as none), and both formats decode to the same batch.
func TestRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := genBatch().Draw(t, "batch")
		want := noZeroParents(b)
		for _, f := range []Format{FormatMap, FormatArray} {
			p, err := EncodeBatch(b, f)
			if err != nil {
				t.Fatalf("%v: %v", f, err)
			}
			got, err := DecodeBatch(p)
			if err != nil {
				t.Fatalf("%v: %v (payload %x)", f, err, p)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%v: round trip\n got %#v\nwant %#v", f, got, want)
			}
		}
	})
}

// mp encodes values in order for hand-built payloads: arr is a msgpack
// array, omap a map with keys in the given order.
type (
	arr  []any
	omap [][2]any
)

func mp(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	var enc func(v any)
	enc = func(v any) {
		var err error
		switch x := v.(type) {
		case arr:
			err = e.EncodeArrayLen(len(x))
			for _, y := range x {
				enc(y)
			}
		case omap:
			err = e.EncodeMapLen(len(x))
			for _, kv := range x {
				enc(kv[0])
				enc(kv[1])
			}
		case int:
			err = e.EncodeInt(int64(x))
		case int64:
			err = e.EncodeInt64(x) // always 9 bytes, as some producers do
		case uint64:
			err = e.EncodeUint64(x)
		case float32:
			err = e.EncodeFloat32(x)
		default:
			err = e.Encode(v)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	enc(v)
	return buf.Bytes()
}

func TestDecodeLenient(t *testing.T) {
	digest := bytes.Repeat([]byte{0x11}, 24)
	digest = append(digest, 1, 2, 3, 4, 5, 6, 7, 8)
	cases := []struct {
		name    string
		payload []byte
		want    Batch
	}{
		{"original five-field BlockStored and one-field BlockRemoved",
			mp(t, arr{1.0, arr{arr{"BlockStored", arr{1, 2}, nil, arr{7, 8}, 1, nil}, arr{"BlockRemoved", arr{2}}}}),
			Batch{TS: 1, Events: []Event{
				{Kind: engine.BlockStored, BlockHashes: []BlockHash{IntHash(1), IntHash(2)}, TokenIDs: []uint32{7, 8}, BlockSize: 1},
				{Kind: engine.BlockRemoved, BlockHashes: []BlockHash{IntHash(2)}}}}},
		{"negative int64 hash, uint64 hash and 32-byte digest",
			mp(t, arr{2.0, arr{arr{"BlockRemoved", arr{int64(-1), uint64(5), digest}, "GPU"}}}),
			Batch{TS: 2, Events: []Event{{Kind: engine.BlockRemoved, Medium: "GPU",
				BlockHashes: []BlockHash{IntHash(math.MaxUint64), IntHash(5), {V: 0x0102030405060708, Raw: string(digest)}}}}}},
		{"unknown map keys and a type tag that is not first",
			mp(t, arr{3.0, arr{omap{{"block_hashes", arr{4}}, {"future", omap{{"a", arr{1, 2}}}}, {"type", "BlockRemoved"}, {"medium", "CPU"}}}}),
			Batch{TS: 3, Events: []Event{{Kind: engine.BlockRemoved, BlockHashes: []BlockHash{IntHash(4)}, Medium: "CPU"}}}},
		{"extra positional fields and batch elements",
			mp(t, arr{4.0, arr{arr{"AllBlocksCleared", 1, "x"}, arr{"BlockRemoved", arr{}, nil, nil, nil, "future", arr{1}}}, 2, "extra"}),
			Batch{TS: 4, DataParallelRank: ptr(2), Events: []Event{{Kind: engine.AllBlocksCleared}, {Kind: engine.BlockRemoved}}}},
		{"unknown event types are skipped and counted",
			mp(t, arr{5.0, arr{arr{"BlockMigrated", arr{1}, "dest"}, omap{{"type", "Future"}, {"x", 1}}, arr{"AllBlocksCleared"}}}),
			Batch{TS: 5, UnknownEvents: 2, Events: []Event{{Kind: engine.AllBlocksCleared}}}},
		{"fields a kind does not carry are dropped",
			mp(t, arr{6.0, arr{omap{{"type", "BlockRemoved"}, {"block_hashes", arr{1}}, {"token_ids", arr{1}}, {"block_size", 16}}}}),
			Batch{TS: 6, Events: []Event{{Kind: engine.BlockRemoved, BlockHashes: []BlockHash{IntHash(1)}}}}},
		{"float32 and integer timestamps", mp(t, arr{float32(0.5), arr{}}), Batch{TS: 0.5}},
		{"int timestamp, nil rank", mp(t, arr{7, arr{}, nil}), Batch{TS: 7}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := DecodeBatch(c.payload)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	cases := []struct {
		name    string
		payload []byte
		errHas  string
	}{
		{"empty", nil, "truncated"},
		{"not a list", mp(t, "hello"), "want a list, got string"},
		{"short batch", mp(t, arr{1.0}), "batch has 1 elements"},
		{"ts not a number", mp(t, arr{"x", arr{}}), "ts: want a float"},
		{"events not a list", mp(t, arr{1.0, 3}), "events: want a list"},
		{"event not a list or map", mp(t, arr{1.0, arr{7}}), "event 0: want a map or a list"},
		{"empty event", mp(t, arr{1.0, arr{arr{}}}), "empty event list"},
		{"tag not a string", mp(t, arr{1.0, arr{arr{1}}}), "event type: want a string"},
		{"map without type", mp(t, arr{1.0, arr{omap{{"block_hashes", arr{1}}}}}), `no "type"`},
		{"bad hash", mp(t, arr{1.0, arr{arr{"BlockRemoved", arr{"abc"}}}}), "block_hashes: want an int or bytes hash, got string"},
		{"token too big", mp(t, arr{1.0, arr{arr{"BlockStored", arr{}, nil, arr{1 << 33}, 1}}}), "not a uint32"},
		{"negative token", mp(t, arr{1.0, arr{arr{"BlockStored", arr{}, nil, arr{-1}, 1}}}), "not a uint32"},
		{"block_size nil", mp(t, arr{1.0, arr{arr{"BlockStored", arr{}, nil, arr{}, nil}}}), "block_size: want an int, got nil"},
		{"medium not a string", mp(t, arr{1.0, arr{arr{"BlockRemoved", arr{}, 3}}}), "medium: want a string"},
		{"rank not an int", mp(t, arr{1.0, arr{}, "zero"}), "data_parallel_rank: want an int"},
		{"trailing bytes", append(mp(t, arr{1.0, arr{}}), 0x00), "bytes after the batch"},
		{"huge list header", h(t, "92 cb 3ff8000000000000 dd ffffffff"), "longer than the rest of the payload"},
		{"truncated event", h(t, "92 cb 3ff8000000000000 91 93"), "longer than the rest of the payload"},
		{"truncated string", h(t, "92 cb 3ff8000000000000 91 91 a5 41"), "event type"},
		{"deep nesting", append(h(t, "92 cb 3ff8000000000000 91 96", "'BlockRemoved", "90 c0 c0 c0"), bytes.Repeat([]byte{0x91}, 100)...), "nested deeper"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeBatch(c.payload)
			if err == nil {
				t.Fatalf("decoded garbage %x without error", c.payload)
			}
			if !strings.Contains(err.Error(), c.errHas) {
				t.Fatalf("error %q does not mention %q", err, c.errHas)
			}
		})
	}
}

func TestEncodeRejects(t *testing.T) {
	cases := []struct {
		name   string
		ev     Event
		errHas string
	}{
		{"unknown kind", Event{Kind: 9}, "unknown event kind"},
		{"removed with tokens", Event{Kind: engine.BlockRemoved, TokenIDs: []uint32{1}}, "BlockRemoved carries only"},
		{"cleared with medium", Event{Kind: engine.AllBlocksCleared, Medium: "GPU"}, "AllBlocksCleared carries no fields"},
		{"bad extra key", Event{Kind: engine.BlockStored, ExtraKeys: [][]any{{struct{}{}}}}, "extra_keys value"},
	}
	for _, c := range cases {
		_, err := EncodeBatch(Batch{Events: []Event{c.ev}}, FormatMap)
		if err == nil || !strings.Contains(err.Error(), c.errHas) {
			t.Errorf("%s: error %v, want one mentioning %q", c.name, err, c.errHas)
		}
	}
	if _, err := EncodeBatch(Batch{}, Format(7)); err == nil {
		t.Error("unknown format accepted")
	}
}

func TestFromEngine(t *testing.T) {
	a, b := kvblock.Hash{Hi: 1, Lo: 10}, kvblock.Hash{Hi: 2, Lo: 20}
	parent := kvblock.Hash{Hi: 3, Lo: 30}
	toks := map[kvblock.Hash][]uint32{a: {1, 2}, b: {3, 4}}
	evs := []engine.KVEvent{
		{Kind: engine.BlockStored, BlockHashes: []kvblock.Hash{a, b}, ParentBlockHash: parent, HasParent: true, BlockSize: 2, Medium: engine.MediumGPU},
		{Kind: engine.BlockStored, BlockHashes: []kvblock.Hash{a}, BlockSize: 2, Medium: engine.MediumGPU},
		{Kind: engine.BlockRemoved, BlockHashes: []kvblock.Hash{b}, Medium: engine.MediumGPU},
		{Kind: engine.AllBlocksCleared, Medium: engine.MediumGPU},
		{Kind: 99},
	}
	got := FromEngine(evs, func(h kvblock.Hash) []uint32 { return toks[h] })
	want := []Event{
		{Kind: engine.BlockStored, BlockHashes: []BlockHash{IntHash(10), IntHash(20)}, ParentBlockHash: ptr(IntHash(30)), TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU"},
		{Kind: engine.BlockStored, BlockHashes: []BlockHash{IntHash(10)}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU"},
		{Kind: engine.BlockRemoved, BlockHashes: []BlockHash{IntHash(20)}, Medium: "GPU"},
		{Kind: engine.AllBlocksCleared},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	// A parent whose low half is 0 is sent as 0, which reads as no parent.
	zero := engine.KVEvent{Kind: engine.BlockStored, BlockHashes: []kvblock.Hash{a}, ParentBlockHash: kvblock.Hash{Hi: 3}, HasParent: true}
	if got := FromEngine([]engine.KVEvent{zero}, nil); got[0].ParentBlockHash != nil {
		t.Fatalf("parent with Lo 0: %+v, want none", *got[0].ParentBlockHash)
	}
	if noTok := FromEngine(evs[:1], nil); noTok[0].TokenIDs != nil {
		t.Fatalf("tokens nil: TokenIDs = %v, want empty", noTok[0].TokenIDs)
	}
	// Every converted batch encodes.
	if _, err := EncodeBatch(Batch{Events: got}, FormatArray); err != nil {
		t.Fatal(err)
	}
}

func TestBytesHashTail(t *testing.T) {
	if got := BytesHash([]byte{1, 2}).V; got != 0x0102 {
		t.Fatalf("short digest: %x", got)
	}
	d := append(bytes.Repeat([]byte{0xff}, 8), 0, 0, 0, 0, 0, 0, 0, 9)
	if got := BytesHash(d).V; got != 9 {
		t.Fatalf("long digest: %x, want the last 8 bytes", got)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	for _, b := range goldenBatches() {
		for _, fm := range []Format{FormatMap, FormatArray} {
			p, err := EncodeBatch(b, fm)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(p)
		}
	}
	f.Add(mp(f, arr{1.0, arr{arr{"BlockStored", arr{int64(-1)}, nil, arr{7, 8}, 1, nil}, omap{{"type", "X"}}}, 0}))
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeBatch(payload)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes, and that encoding decodes to the same
		// batch (the first decode normalises: hashes, ints, float widths).
		for _, fm := range []Format{FormatMap, FormatArray} {
			p, err := EncodeBatch(b, fm)
			if err != nil {
				t.Fatalf("decoded batch does not encode: %v", err)
			}
			again, err := DecodeBatch(p)
			if err != nil {
				t.Fatalf("re-encoded batch does not decode: %v", err)
			}
			b.UnknownEvents, again.UnknownEvents = 0, 0
			if !reflect.DeepEqual(normNaN(again), normNaN(b)) {
				t.Fatalf("re-decode differs\n got %#v\nwant %#v", again, b)
			}
		}
	})
}

// normNaN replaces NaN timestamps so DeepEqual can compare them.
func normNaN(b Batch) Batch {
	if math.IsNaN(b.TS) {
		b.TS = -0.123
	}
	return b
}

func bench32() Batch {
	evs := make([]Event, 32)
	for i := range evs {
		hs := make([]BlockHash, 4)
		toks := make([]uint32, 4*16)
		for j := range hs {
			hs[j] = IntHash(uint64(i*4+j) * 0x9e3779b97f4a7c15)
		}
		for j := range toks {
			toks[j] = uint32(1000 + i*64 + j)
		}
		p := IntHash(uint64(i))
		evs[i] = Event{Kind: engine.BlockStored, BlockHashes: hs, ParentBlockHash: &p, TokenIDs: toks, BlockSize: 16, Medium: "GPU"}
		if i%4 == 3 {
			evs[i] = Event{Kind: engine.BlockRemoved, BlockHashes: hs, Medium: "GPU"}
		}
	}
	return Batch{TS: 1718000000.5, Events: evs, DataParallelRank: ptr(0)}
}

func BenchmarkEncodeBatch32(b *testing.B) {
	batch := bench32()
	for _, f := range []Format{FormatMap, FormatArray} {
		b.Run(f.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := EncodeBatch(batch, f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecodeBatch32(b *testing.B) {
	batch := bench32()
	for _, f := range []Format{FormatMap, FormatArray} {
		p, err := EncodeBatch(batch, f)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(f.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				if _, err := DecodeBatch(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
