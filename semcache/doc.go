// Package semcache is the semantic response cache of `inferrail live`: an
// opt-in second layer behind the exact cache (package respcache) that
// answers a deterministic request with the stored answer of an earlier
// request of the same tenant whose last user message means nearly the
// same, judged by the cosine similarity of their embeddings.
//
// Reading guide:
//
//   - cache.go: Cache, the one entry point. Lookup runs the determinism
//     Rule (respcache's, passed in), Split, the embeddings call and the
//     store's Nearest; a Miss's Result.Store keeps the answer. Hooks are
//     the counters.
//   - request.go: Split, which takes the last user message (or the
//     prompt) out of a request as the text to embed and digests everything
//     else into the exact partition.
//   - store.go: Scope (tenant, model, partition: part of every call) and
//     the Store interface; memory.go the in-process store, pgvector.go the
//     shared one (Postgres with pgvector, an HNSW index).
//   - embeddings.go: Client for any OpenAI-compatible /v1/embeddings.
//   - config.go: Config, the per-model semantic_cache block, and its
//     Validate.
//
// Tests run the stores through one conformance suite (conformance_test.go):
// the pgvector store against real pgvector in PGlite
// (internal/testpglite), and a fixed test set of paraphrases and unrelated
// prompts (testdata/pairs.json) against the mock engine's deterministic
// embeddings (engine/embed). docs/semantic-cache.md has the rest: the
// threshold, the risks and how live is to use it.
package semcache
