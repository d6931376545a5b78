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
