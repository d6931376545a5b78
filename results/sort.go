package results

import (
	"slices"
	"time"
)

// radixMin is the length below which sortDurations defers to slices.Sort.
const radixMin = 256

// sortDurations sorts d in ascending order. It is a least-significant-digit
// radix sort over the bytes of the values (sign bit flipped so negative
// durations order first), skipping bytes that all values share; per-request
// latencies span only a few bytes, so this is several times faster than a
// comparison sort. scratch must be at least as long as d; its contents are
// overwritten.
func sortDurations(d, scratch []time.Duration) {
	if len(d) < radixMin {
		slices.Sort(d)
		return
	}
	const signBit = 1 << 63
	// One counting pass for all eight digits.
	var counts [8][256]int
	for _, v := range d {
		k := uint64(v) ^ signBit
		for digit := range counts {
			counts[digit][byte(k>>(8*digit))]++
		}
	}
	src, dst := d, scratch[:len(d)]
	first := uint64(d[0]) ^ signBit
	for digit := range counts {
		shift := uint(8 * digit)
		c := &counts[digit]
		if c[byte(first>>shift)] == len(d) {
			continue // every value has the same byte here
		}
		pos := 0
		for i, n := range c {
			c[i] = pos
			pos += n
		}
		for _, v := range src {
			b := byte((uint64(v) ^ signBit) >> shift)
			dst[c[b]] = v
			c[b]++
		}
		src, dst = dst, src
	}
	if &src[0] != &d[0] {
		copy(d, src)
	}
}
