package engine

import (
	"testing"

	"github.com/inferrail/inferrail/engine/kvblock"
	"pgregory.net/rapid"
)

// TestHashTableMatchesMap checks the open-addressing table against a Go map
// under random inserts and deletes, as the pool makes them: a block is in the
// table at most once, under its own hash. Few distinct low bits force long
// probe chains and wrap-around, and hashes that differ only above the low 32
// bits of Lo (the slots' tag) make tags collide.
func TestHashTableMatchesMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const nblocks = 32
		tab := newHashTable(nblocks)
		blocks := make([]block, nblocks)
		ref := map[kvblock.Hash]int32{} // hash -> block
		in := map[int32]bool{}          // blocks in the table
		for range rapid.IntRange(0, 300).Draw(t, "ops") {
			id := int32(rapid.IntRange(0, nblocks-1).Draw(t, "id"))
			if rapid.Bool().Draw(t, "insert") {
				if in[id] {
					continue // the pool never inserts a hashed block
				}
				h := kvblock.Hash{
					Hi: rapid.Uint64Range(0, 3).Draw(t, "hi"),
					Lo: rapid.Uint64Range(0, 70).Draw(t, "lo") | rapid.Uint64Range(0, 2).Draw(t, "tagged")<<32,
				}
				_, had := ref[h]
				blocks[id].hash = h
				if tab.insert(h, id, blocks) == had {
					t.Fatalf("insert %v: table and map disagree on presence", h)
				}
				if !had {
					ref[h], in[id] = id, true
				}
			} else {
				h := blocks[id].hash
				if tab.deleteIf(h, id) != in[id] {
					t.Fatalf("deleteIf %v %d: want %v", h, id, in[id])
				}
				if in[id] {
					delete(ref, h)
					delete(in, id)
				}
			}
			if tab.len() != len(ref) {
				t.Fatalf("len %d, want %d", tab.len(), len(ref))
			}
			for k, v := range ref {
				if got, ok := tab.get(k, blocks); !ok || got != v {
					t.Fatalf("get %v = %d,%v want %d", k, got, ok, v)
				}
			}
			// A hash that only shares a tag with a present one is absent.
			for k := range ref {
				miss := kvblock.Hash{Hi: k.Hi + 4, Lo: k.Lo}
				if _, ok := tab.get(miss, blocks); ok {
					t.Fatalf("get %v found a block", miss)
				}
			}
		}
	})
}

// BenchmarkHashTable replaces the entries of a table as full as a full KV
// cache keeps it: each iteration evicts one block's hash, caches a new hash
// in its place and looks up a present one and an absent one.
func BenchmarkHashTable(b *testing.B) {
	const n = 4096
	tab := newHashTable(n)
	blocks := make([]block, n)
	next := uint64(0)
	hash := func() kvblock.Hash {
		next++
		return kvblock.Hash{Hi: kvblock.Mix64(next), Lo: kvblock.Mix64(^next)}
	}
	for id := range blocks {
		blocks[id].hash = hash()
		tab.insert(blocks[id].hash, int32(id), blocks)
	}
	b.ReportAllocs()
	id := int32(0)
	for b.Loop() {
		if !tab.deleteIf(blocks[id].hash, id) {
			b.Fatal("deleteIf missed a present hash")
		}
		blocks[id].hash = hash()
		tab.insert(blocks[id].hash, id, blocks)
		tab.get(blocks[(id+n/2)%n].hash, blocks)
		tab.get(kvblock.Hash{Lo: uint64(id)}, blocks)
		id = (id + 1) % n
	}
}
