package engine

import (
	"testing"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

// TestHashTableMatchesMap checks the open-addressing table against a Go map
// under random inserts and deletes, with colliding low bits.
func TestHashTableMatchesMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		tab := newHashTable(32)
		ref := map[kvblock.Hash]int32{}
		for range rapid.IntRange(0, 300).Draw(t, "ops") {
			// Few distinct low bits force long probe chains and wrap-around.
			h := kvblock.Hash{Hi: rapid.Uint64Range(0, 3).Draw(t, "hi"), Lo: rapid.Uint64Range(0, 70).Draw(t, "lo")}
			id := int32(rapid.IntRange(0, 5).Draw(t, "id"))
			if rapid.Bool().Draw(t, "insert") {
				if len(ref) >= 32 {
					continue
				}
				_, had := ref[h]
				if tab.insert(h, id) == had {
					t.Fatalf("insert %v: table and map disagree on presence", h)
				}
				if !had {
					ref[h] = id
				}
			} else {
				cur, had := ref[h]
				want := had && cur == id
				if tab.deleteIf(h, id) != want {
					t.Fatalf("deleteIf %v %d: want %v", h, id, want)
				}
				if want {
					delete(ref, h)
				}
			}
			if tab.len() != len(ref) {
				t.Fatalf("len %d, want %d", tab.len(), len(ref))
			}
			for k, v := range ref {
				if got, ok := tab.get(k); !ok || got != v {
					t.Fatalf("get %v = %d,%v want %d", k, got, ok, v)
				}
			}
		}
	})
}
