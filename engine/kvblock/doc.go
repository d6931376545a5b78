// Package kvblock derives the chained block hashes that name KV-cache blocks.
//
// A prompt is cut into full blocks of BlockSize tokens; block i is named by
// XXH3-128 over (hash of block i-1, the block's tokens), and block 0's parent
// is a salt derived from the model, the LoRA adapter and the request's
// cache_salt. A block's hash therefore names its whole prefix, and a trailing
// partial block is never hashed. The engine (prefix cache) and the router (KV
// index) both use this package, so they always agree on block identity.
//
// Simulation never materialises prompts: a prompt is a chain of Segments
// whose token content is the pure function SegmentToken(id, pos), and
// AppendSegmentHashes hashes such a chain without building a token array.
//
// Start with AppendHashes and AppendSegmentHashes.
package kvblock
