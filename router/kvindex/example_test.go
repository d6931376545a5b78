package kvindex_test

import (
	"fmt"

	"github.com/inferrail/inferrail/engine/kvblock"
	"github.com/inferrail/inferrail/router/kvindex"
)

func Example() {
	x := kvindex.New(kvindex.Config{})
	salt := kvblock.Salt("model", "", "")
	tokens := make([]uint32, 64)
	prompt := kvblock.AppendHashes(nil, salt, tokens, 16) // 4 blocks

	x.Record(0, prompt)     // routed the whole prompt to replica 0
	x.Record(1, prompt[:2]) // and an earlier, shorter one to replica 1
	r := x.Record(2, prompt)
	x.TakeBack(r) // the attempt on replica 2 failed before prefill

	replicas := []int{0, 1, 2}
	depths := make([]int, len(replicas))
	x.Lookup(prompt, replicas, depths)
	fmt.Println(depths)
	// Output: [4 2 0]
}

func ExampleIndex_RecordPinned() {
	x := kvindex.New(kvindex.Config{DefaultCapacityBlocks: 4})
	salt := kvblock.Salt("model", "", "")
	long := kvblock.AppendHashes(nil, salt, make([]uint32, 64), 16) // 4 blocks
	other := kvblock.AppendHashes(nil, salt, []uint32{1: 1, 63: 0}, 16)

	r := x.RecordPinned(0, long) // a long request starts on replica 0
	x.Record(0, other)           // nothing to evict: every block is pinned

	d := make([]int, 1)
	x.Lookup(long, []int{0}, d)
	fmt.Println(d[0], x.Blocks(0))

	x.Release(r) // it finished: its blocks are the most recent, block 0 first
	x.Record(0, other[:1])
	x.Lookup(long, []int{0}, d)
	fmt.Println(d[0], x.Blocks(0))
	// Output:
	// 4 4
	// 3 4
}
