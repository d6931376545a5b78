// Package embed computes the mock engine's deterministic text embeddings
// (`inferrail engine` serves them at POST /v1/embeddings), so that tests of
// a semantic cache need no model.
//
// The method is feature hashing over a bag of words, the "hashing trick":
//
//  1. Normalise: Unicode NFKD, combining marks dropped (café = cafe),
//     lower case; words are maximal runs of letters and digits (an
//     apostrophe inside a word is dropped: what's = whats).
//  2. Drop a fixed list of English function words (the, a, is, do, can,
//     please, ...), unless nothing else is left. Negations (not, no,
//     never, without) are kept: they change the meaning.
//  3. Stem each word with a few suffix rules (passwords, resetting, reset
//     -> password, reset; see stem).
//  4. Features: each stem (weight 1) and the character trigrams of
//     "^stem$" (each weight 1/sqrt(trigrams of that stem), so a word's
//     trigrams weigh as much as the word whatever its length). Repeated
//     words add up.
//  5. Each feature's FNV-1a hash picks a dimension (hash mod dim) and a
//     sign (the hash's top bit), and adds its weight there; the vector is
//     then L2-normalised. The same text always gives the same vector, on
//     every machine.
//
// So two texts are close when they share their content words in any order
// and form (case, punctuation, word order, inflection, function words and
// small typos barely move them), and far when their content words differ.
//
// Limits, on purpose: no synonyms (reset and change are unrelated words
// here), no word order (a dog bit a man = a man bit a dog), no meaning
// (a long text that differs in one word stays close to the original). It
// is a stand-in with the shape of an embedding model, for tests; the
// similarity threshold a real model needs is not this one's.
package embed
