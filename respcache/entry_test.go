package respcache

import (
	"testing"
)

// FuzzDecodeEntry: any stored bytes either decode to a valid entry that
// encodes and decodes to itself, or fail with ErrCorrupt; never a panic.
func FuzzDecodeEntry(f *testing.F) {
	k := testKey("fuzz")
	for _, e := range []*Entry{sseEntry("a"), jsonEntry("b"), {Kind: KindSSE, ContentType: "text/event-stream", Body: []byte("data: x\n\n"), Events: []int{9}}} {
		f.Add(appendEntry(nil, k, e))
	}
	f.Add([]byte{})
	f.Add([]byte{encodingVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEntry(k, b)
		if err != nil {
			return
		}
		if err := e.validate(); err != nil {
			t.Fatalf("decoded an invalid entry %+v: %v", e, err)
		}
		again, err := decodeEntry(k, appendEntry(nil, k, e))
		if err != nil || !sameEntry(again, e) {
			t.Fatalf("re-encoding changed %+v into %+v (%v)", e, again, err)
		}
	})
}
