// Package tokenize is a pure-Go reader of Hugging Face tokenizer.json files
// that produces the same token ids as the reference library (the Rust
// `tokenizers` crate) for the tokenizers the project uses: byte-level BPE
// (Qwen2.5, Qwen3, Mistral-Nemo, GPT-2) and SentencePiece-style BPE with byte
// fallback (Mistral-7B, Llama 2).
//
// Start with Parse / LoadFile / LoadDir (load.go), which build a Tokenizer
// and refuse any component they do not implement, naming it; then
// Tokenizer.EncodeTo (tokenizer.go), which runs the reference pipeline:
//
//  1. added tokens are cut out of the raw text first, leftmost-longest
//     (added.go), honouring lstrip/rstrip/single_word/normalized;
//  2. each remaining span is normalized (normalize.go) and pre-tokenized
//     (pretokenize.go; the GPT-2, Qwen/Llama-3 and Tekken split patterns have
//     hand-written matchers in split.go, any other pattern runs on regexp2);
//  3. each piece goes through the BPE model (bpe.go) behind a bounded word
//     cache, and long spans go through a bounded span cache (spancache.go),
//     so a repeated system prompt costs a hash and a copy;
//  4. the post-processor adds BOS/EOS when asked (postprocess.go).
//
// Decode (decode.go) runs the configured decoders. Load (encoder.go) picks
// a tokenizer from a directory, a tokenizer.json path or "builtin:sim".
//
// A router starts from LoadModel (model.go): a Model bundles a model's
// tokenizer, its chat template (package chat) and vLLM's special-token
// rules per endpoint: EncodeCompletion for /v1/completions (BOS/EOS as
// transformers applies tokenizer_config.json's flags), EncodeChat for
// /v1/chat/completions (render, then encode without special tokens).
//
// A Tokenizer is immutable after loading apart from its caches, which are
// bounded and safe for concurrent use; caches never change results.
package tokenize
