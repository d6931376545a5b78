package gateway

import (
	"fmt"
	"testing"
	"time"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/router"
)

// testModel is the served model of every test core.
const testModel = "m"

// testConfig is DefaultConfig for testModel with policy pol.
func testConfig(pol string) Config {
	cfg := DefaultConfig()
	cfg.Model = testModel
	cfg.Router = router.Config{Policy: pol}
	return cfg
}

// newCore builds a core from cfg with n replicas r0..r(n-1), each rc.
func newCore(tb testing.TB, cfg Config, n int, rc ReplicaConfig) *Core {
	tb.Helper()
	c, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		rc := rc
		rc.Name = fmt.Sprintf("r%d", i)
		if got, err := c.AddReplica(rc); err != nil || got != i {
			tb.Fatalf("AddReplica(%s) = %d, %v", rc.Name, got, err)
		}
	}
	return c
}

// hashesOf is the full blocks of a prompt of tokens tokens whose content is
// segment id, hashed as the core hashes testModel's prompts.
func hashesOf(id uint64, tokens int) []kvblock.Hash {
	return kvblock.AppendSegmentHashes(nil, kvblock.Salt(testModel, "", ""), []kvblock.Segment{{ID: id, Len: tokens}}, 16, -1)
}

// promptReq is a tokenized request of tokens tokens (segment id) with
// max_tokens out.
func promptReq(id uint64, tokens, out int) Request {
	return Request{ID: id, PromptTokens: tokens, PromptKnown: true, BlockHashes: hashesOf(id, tokens), MaxTokens: out}
}

// prefillReq is q as an embedding: prefill only.
func prefillReq(q Request) Request {
	q.PrefillOnly = true
	return q
}

// seqReq is q with n sequences (n choices).
func seqReq(q Request, n int) Request {
	q.Sequences = n
	return q
}

// plainReq is a request without block hashes.
func plainReq(id uint64, tokens, out int) Request {
	return Request{ID: id, PromptTokens: tokens, PromptKnown: true, MaxTokens: out}
}

func mustKind(tb testing.TB, d Decision, k Kind) Decision {
	tb.Helper()
	if d.Kind != k {
		tb.Fatalf("decision %+v: want %v", d, k)
	}
	return d
}

func sec(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
