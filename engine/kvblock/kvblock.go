package kvblock

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Hash names a full KV block and, through the chain, its whole prefix.
type Hash struct {
	Hi, Lo uint64
}

// IsZero reports whether h is the zero value (never a real block hash in practice).
func (h Hash) IsZero() bool { return h.Hi == 0 && h.Lo == 0 }

// String formats the hash as 32 hex digits.
func (h Hash) String() string { return fmt.Sprintf("%016x%016x", h.Hi, h.Lo) }

// Salt returns the root of a hash chain: requests whose model, LoRA adapter
// or cache_salt differ never share blocks.
func Salt(model, lora, cacheSalt string) Hash {
	b := make([]byte, 0, len(model)+len(lora)+len(cacheSalt)+24)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(model)))
	b = append(b, model...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(lora)))
	b = append(b, lora...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(cacheSalt)))
	b = append(b, cacheSalt...)
	u := xxh3.Hash128(b)
	return Hash{Hi: u.Hi, Lo: u.Lo}
}

// littleEndian reports whether uint32s are stored little-endian in memory.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// maxStackBlock is the largest block size hashed with a stack buffer.
const maxStackBlock = 64

// HashBlock returns the hash of one block of tokens whose predecessor (or the
// salt, for block 0) is parent.
func HashBlock(parent Hash, tokens []uint32) Hash {
	if len(tokens) <= maxStackBlock {
		var buf [16 + 4*maxStackBlock]byte
		return hashInto(buf[:0], parent, tokens)
	}
	return hashInto(make([]byte, 0, 16+4*len(tokens)), parent, tokens)
}

// hashInto hashes (parent, tokens) using buf's capacity as scratch space.
func hashInto(buf []byte, parent Hash, tokens []uint32) Hash {
	buf = buf[:16+4*len(tokens)]
	binary.LittleEndian.PutUint64(buf[0:8], parent.Hi)
	binary.LittleEndian.PutUint64(buf[8:16], parent.Lo)
	b := buf[16:]
	if littleEndian && len(tokens) > 0 {
		// Tokens are hashed as little-endian uint32s: on little-endian
		// machines their memory already is that, so copy it in one go.
		copy(b, unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens)))
	} else {
		for i, t := range tokens {
			binary.LittleEndian.PutUint32(b[4*i:], t)
		}
	}
	u := xxh3.Hash128(buf)
	return Hash{Hi: u.Hi, Lo: u.Lo}
}

// AppendHashes appends the chained hashes of every full block of tokens to
// dst and returns it. blockSize must be positive.
func AppendHashes(dst []Hash, salt Hash, tokens []uint32, blockSize int) []Hash {
	if blockSize <= 0 {
		return dst
	}
	var stack [16 + 4*maxStackBlock]byte
	buf := stack[:0]
	if blockSize > maxStackBlock {
		buf = make([]byte, 0, 16+4*blockSize)
	}
	parent := salt
	for start := 0; start+blockSize <= len(tokens); start += blockSize {
		parent = hashInto(buf, parent, tokens[start:start+blockSize])
		dst = append(dst, parent)
	}
	return dst
}

// Segment is a run of Len tokens whose content is SegmentToken(ID, 0..Len-1).
// Equal IDs mean equal content, so prompts that share leading segments share
// leading blocks.
type Segment struct {
	ID  uint64
	Len int
}

// SimVocabSize is the vocabulary of the simulator's synthetic tokens.
const SimVocabSize = 32000

// SegmentToken is the token at position pos of segment id: a pure function,
// so block hashes can be derived without storing token arrays.
func SegmentToken(id uint64, pos int) uint32 {
	return uint32(Mix64(segmentBase(id)+uint64(pos)*segmentStep) % SimVocabSize)
}

// The constants of SegmentToken: the token at pos is
// Mix64(segmentBase(id) + pos*segmentStep) % SimVocabSize, so consecutive
// tokens of a segment step the argument by segmentStep.
const (
	segmentMul  = 0x9E3779B97F4A7C15
	segmentStep = 0xBF58476D1CE4E5B9
	segmentAdd  = 0x94D049BB133111EB
)

func segmentBase(id uint64) uint64 { return id*segmentMul + segmentAdd }

// Mix64 is the SplitMix64 finalizer: a bijection on uint64 that spreads
// every input bit over the output. Segment ids, ring positions and the like
// are derived with it.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}

// TotalLen returns the number of tokens in a segment chain.
func TotalLen(segs []Segment) int {
	n := 0
	for _, s := range segs {
		n += s.Len
	}
	return n
}

// AppendSegmentTokens appends the tokens of a segment chain to dst.
func AppendSegmentTokens(dst []uint32, segs []Segment) []uint32 {
	for _, s := range segs {
		for p := 0; p < s.Len; p++ {
			dst = append(dst, SegmentToken(s.ID, p))
		}
	}
	return dst
}

// AppendSegmentHashes appends the chained hashes of every full block of the
// token sequence described by segs; the result equals
// AppendHashes(dst, salt, AppendSegmentTokens(nil, segs), blockSize) without
// materialising the tokens. At most maxBlocks hashes are appended when
// maxBlocks >= 0.
func AppendSegmentHashes(dst []Hash, salt Hash, segs []Segment, blockSize, maxBlocks int) []Hash {
	return AppendSegmentHashesFrom(dst, salt, segs, blockSize, 0, maxBlocks)
}

// AppendSegmentHashesFrom continues a chain: it skips the first skipBlocks
// full blocks of segs (whose last hash is parent, or the salt when
// skipBlocks is 0) and appends the hashes of the blocks after them, at most
// maxBlocks when maxBlocks >= 0. Callers that memoise the hashes of a shared
// prefix use it to hash only the rest.
func AppendSegmentHashesFrom(dst []Hash, parent Hash, segs []Segment, blockSize, skipBlocks, maxBlocks int) []Hash {
	if blockSize <= 0 {
		return dst
	}
	// The tokens are written straight into the hashed bytes (parent, then
	// the block's tokens as little-endian uint32s), as hashInto lays them out.
	var stack [16 + 4*maxStackBlock]byte
	var buf []byte
	if blockSize <= maxStackBlock {
		buf = stack[:16+4*blockSize]
	} else {
		buf = make([]byte, 16+4*blockSize)
	}
	toks := buf[16:]
	skip := skipBlocks * blockSize
	fill, n := 0, 0 // tokens of the current block written; hashes appended
	for _, s := range segs {
		p := 0
		if skip > 0 {
			if skip >= s.Len {
				skip -= s.Len
				continue
			}
			p, skip = skip, 0
		}
		x := segmentBase(s.ID) + uint64(p)*segmentStep
		for p < s.Len {
			k := min(s.Len-p, blockSize-fill)
			x = putSegmentTokens(toks[4*fill:4*(fill+k)], x)
			p += k
			if fill += k; fill == blockSize {
				if maxBlocks >= 0 && n >= maxBlocks {
					return dst
				}
				binary.LittleEndian.PutUint64(buf[0:8], parent.Hi)
				binary.LittleEndian.PutUint64(buf[8:16], parent.Lo)
				u := xxh3.Hash128(buf)
				parent = Hash{Hi: u.Hi, Lo: u.Lo}
				dst = append(dst, parent)
				n++
				fill = 0
			}
		}
	}
	return dst
}

// putSegmentTokens writes the tokens of SegmentToken's arguments x,
// x+segmentStep, ... into dst as little-endian uint32s, len(dst)/4 of them,
// and returns the argument after the last. Four tokens at a time, two to an
// 8-byte store (the low one first, as little-endian order puts it), so that
// their chains of arithmetic interleave. It is kept out of line: inlined
// into its caller's loop it runs out of registers.
//
//go:noinline
func putSegmentTokens(dst []byte, x uint64) uint64 {
	const (
		step2 = (2 * segmentStep) & (1<<64 - 1) // modulo 2^64
		step3 = (3 * segmentStep) & (1<<64 - 1)
		step4 = (4 * segmentStep) & (1<<64 - 1)
	)
	for len(dst) >= 16 {
		t0 := Mix64(x) % SimVocabSize
		t1 := Mix64(x+segmentStep) % SimVocabSize
		t2 := Mix64(x+step2) % SimVocabSize
		t3 := Mix64(x+step3) % SimVocabSize
		binary.LittleEndian.PutUint64(dst, t0|t1<<32)
		binary.LittleEndian.PutUint64(dst[8:], t2|t3<<32)
		x += step4
		dst = dst[16:]
	}
	for len(dst) >= 4 {
		binary.LittleEndian.PutUint32(dst, uint32(Mix64(x)%SimVocabSize))
		x += segmentStep
		dst = dst[4:]
	}
	return x
}
