// Package simtok is the built-in deterministic tokenizer, "builtin:sim",
// shared by the mock engine server (engine/server), the load generator
// (bench) and the router's edge tokenization when no real tokenizer is
// configured.
//
// Its vocabulary is kvblock.SimVocabSize pronounceable words, each followed
// by a space ("bakiro "), so the synthetic token ids of the simulator's
// segments (kvblock.SegmentToken) have a text form. Text is cut into pieces
// whose boundaries depend only on the text to their left: a piece ends after
// an ASCII whitespace byte or once it reaches MaxPieceBytes. Two texts that
// share a prefix therefore share the tokens of that prefix (up to the last
// boundary inside it), and text made of vocabulary words (generated text)
// tokenizes back to exactly the ids it was made from, so multi-turn prefix
// reuse works as on a real engine. Pieces that are not vocabulary words map
// to an id by hashing, so any text has a tokenization.
//
// Start with Tokenizer.AppendEncode and Tokenizer.AppendDecode.
package simtok
