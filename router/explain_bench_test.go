package router

import (
	"strconv"
	"testing"

	"github.com/inferrail/inferrail/engine/kvblock"
)

// benchRequest is a 2,000-token prompt with its block hashes.
func benchRequest() *Request {
	hs := make([]kvblock.Hash, 2000/16)
	for i := range hs {
		hs[i] = kvblock.Hash{Lo: kvblock.Mix64(uint64(i + 1)), Hi: uint64(i)}
	}
	return &Request{ID: 7, Session: 3, PromptTokens: 2000, BlockHashes: hs}
}

// BenchmarkPickAll measures every registered policy's Pick on candidates
// with a spread of caches and loads (benchPeerCands): the hot path the
// explain refactor must not slow down or make allocate.
func BenchmarkPickAll(b *testing.B) {
	for _, name := range Ordered() {
		for _, n := range []int{8, 64} {
			b.Run(name+"/"+strconv.Itoa(n), func(b *testing.B) {
				p, err := NewPolicy(name, Options{Seed: 1, SessionAffinity: true})
				if err != nil {
					b.Fatal(err)
				}
				cands := benchPeerCands(n)
				req := benchRequest()
				b.ReportAllocs()
				for b.Loop() {
					p.Pick(req, cands)
				}
			})
		}
	}
}
